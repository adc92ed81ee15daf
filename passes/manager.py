"""tpflare's ``CustomGraphPass``: keys Inductor's caches on tpflare's own code and decisions.

tpflare's graph edits happen before Inductor sees the graph (selection binding on
Dynamo's graph, the latent gather in the inner compiler), so Inductor's FX-graph
cache already keys on the edited graph.  What that key does not cover is the code
*behind* tpflare's custom ops: a graph calling ``tpflare.select_replicated`` looks the
same to the cache whatever that op's schema or implementation is, so an upgraded
tpflare could be served code compiled against the old one.  Installed as Inductor's
``post_grad_custom_post_pass``, this pass does nothing to the graph (it runs a pass it
wraps, if any) and its ``uuid()`` hashes the source of every tpflare module plus the
decision knobs, so such entries are never served (AOTAutograd's cache keys on it too).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import fx

try:  # torch >= 2.6
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover
    CustomGraphPass = object  # type: ignore[misc,assignment]

def _source_files() -> list[Path]:
    """Every module of the installed package: tpflare (plugin/), ops, passes, cache."""
    import importlib

    dirs = [Path(importlib.import_module(m).__file__).resolve().parent
            for m in ("tpflare", "tpflare.ops", "tpflare.passes", "tpflare.cache")]
    return sorted({p for d in dirs for p in d.glob("*.py")})


def source_hash() -> str:
    from tpflare.cache.identity import code_identity

    return code_identity(*(p.name.encode() + b"\n" + p.read_bytes() for p in _source_files()))


class TpflarePostGradPass(CustomGraphPass):  # type: ignore[misc]
    """No graph edit of its own; runs ``chained`` (a pass it replaces in Inductor's config)."""

    _source: str | None = None

    def __init__(self, decision_hash: str, chained: Any = None) -> None:
        self.decision_hash = decision_hash
        self.chained = chained

    def __call__(self, graph: fx.Graph) -> None:
        if self.chained is not None:
            self.chained(graph)

    def uuid(self) -> Any:
        chained = None
        if self.chained is not None:
            chained = self.chained.uuid() if hasattr(self.chained, "uuid") else None
            if chained is None:
                return None  # an unhashable wrapped pass: Inductor bypasses its cache
        if TpflarePostGradPass._source is None:
            TpflarePostGradPass._source = source_hash()
        blob = repr((TpflarePostGradPass._source, self.decision_hash, chained, torch.__version__))
        return hashlib.sha256(blob.encode()).hexdigest()


__all__ = ["TpflarePostGradPass", "source_hash"]
