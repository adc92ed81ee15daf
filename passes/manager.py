"""tpflare's post-grad pass: a ``CustomGraphPass`` whose uuid covers every decision.

Inductor's FX-graph cache keys on ``uuid()`` *before* the pass runs and skips
the pass on a hit, so the uuid hashes (a) the source of every tpflare pass
module, (b) the decision knobs, and (c) the per-graph plan the backend prepared
(row-shard inputs, rank, group sizes).  A graph compiled under other knobs or
another plan is never served from the cache.

Stacks that own their backend (vLLM-style) can install it themselves::

    torch._inductor.config.post_grad_custom_post_pass = tpflare.passes.manager.TpflarePostGradPass(plan)
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch
from torch import fx

from . import latent_gather

log = logging.getLogger("tpflare.passes")

try:  # torch >= 2.6
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover
    CustomGraphPass = object  # type: ignore[misc,assignment]

_PASS_FILES = sorted(Path(__file__).parent.glob("*.py"))


def _source_hash() -> str:
    h = hashlib.sha256()
    for p in _PASS_FILES:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


_SOURCE_HASH = _source_hash()


class TpflarePostGradPass(CustomGraphPass):  # type: ignore[misc]
    """Runs tpflare's post-grad passes in order, then any pass it wraps."""

    def __init__(self, latent_plan: latent_gather.LatentGatherPlan | None,
                 decision_hash: str = "", chained: Any = None) -> None:
        self.latent_plan = latent_plan
        self.decision_hash = decision_hash
        self.chained = chained

    def __call__(self, graph: fx.Graph) -> None:
        if self.latent_plan is not None:
            latent_gather.run(graph, self.latent_plan)  # records every site in tpflare.report()
        if self.chained is not None:
            self.chained(graph)

    def uuid(self) -> Any:
        chained = None
        if self.chained is not None:
            chained = self.chained.uuid() if hasattr(self.chained, "uuid") else None
            if chained is None:
                return None  # an unhashable wrapped pass: bypass the FX cache
        plan = self.latent_plan.fingerprint() if self.latent_plan is not None else None
        blob = repr((_SOURCE_HASH, self.decision_hash, plan, chained, torch.__version__))
        return hashlib.sha256(blob.encode()).hexdigest()
