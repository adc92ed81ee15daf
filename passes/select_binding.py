"""Selection binding: replace each model-facing ``tpflare.select`` node with its composition.

Runs in the backend on a copy of Dynamo's graph, before AOTAutograd and Inductor,
so the bound op is part of the graph Inductor's FX-graph cache keys on: a graph
compiled under one winner is never served when the cache or knobs now say
another.  The node keeps its leading arguments; the composition appends its child
plans: the owner composition's id replication, and every composition's ordered-selection
kernel (``TPFLARE_SELECT_KERNEL`` resolved for the site at preparation).  Replay reads no
knob; it runs no Python decision except at a site whose shape is not static here, which
gets the knob's value itself (``auto``/``triton``: the op picks the Triton kernel where it
supports the call's row length, a per-shape rule).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

from tpflare import race, reporting
from tpflare.config import Settings
from tpflare.distributed import device_of_backend

log = logging.getLogger("tpflare.passes.select_binding")

_SELECT = {torch.ops.tpflare.select, torch.ops.tpflare.select.default}


def _static_shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None
    if val is None:
        return None
    shape = []
    for d in val.shape:
        if not isinstance(d, int):
            return None
        shape.append(d)
    return tuple(shape)


_warned_symbolic = False


def _warn_symbolic_rows(site: str) -> None:
    """Once a process: a site whose shape is symbolic gets no race (the report has every site)."""
    global _warned_symbolic
    if _warned_symbolic:
        return
    _warned_symbolic = True
    log.warning("tpflare: selection site %s has a symbolic shape (dynamic=True, or a second shape "
                "under Dynamo's automatic dynamic shapes), so it runs the default composition (%s) "
                "with no race. To race each capacity, compile with dynamic=False (one graph a "
                "capacity, as examples/serve.py does) or torch._dynamo.mark_static on its row "
                "dimension. Logged once; tpflare.format_report() lists every site.", site, race.DEFAULT)


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def bind_select_sites(gm: fx.GraphModule, example_inputs: list, settings: Settings,
                      graph_id: str = "", recompile: bool = True) -> list[race.Decision]:
    """Bind every selection site in ``gm`` (edited in place); one decision per site.

    Sites with the same (Q, C, k, group, with_scores) -- one per layer in a model --
    share one decision: ``race.decide`` (cache lookup, hit agreement collective,
    race on a miss) runs once per distinct site in the graph, in graph order, so
    every rank makes the same collectives.  ``recompile=False`` leaves regenerating
    ``gm``'s code to the caller.
    """
    decisions = []
    decided: dict[tuple, tuple[str, race.Decision]] = {}  # site signature -> (first site, decision)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SELECT:
            continue
        site = f"{graph_id}:{node.name}"
        scores, k, group_name = _arg(node, 0, "scores"), _arg(node, 2, "k"), _arg(node, 3, "group_name")
        with_scores = bool(_arg(node, 4, "with_scores", False))
        shape = _static_shape(scores)
        if shape is None or len(shape) != 2 or not isinstance(k, int) or not isinstance(group_name, str):
            # the row length is not known here: the knob's value goes in ("auto"/"triton": the
            # Triton kernel where it supports the shape of the call, a per-shape rule, no global read)
            kernel = settings.select_kernel
            reporting.record("select", "bound", site=site, composition=race.DEFAULT, source="default",
                             reason="dynamic shape or non-constant k/group: default composition, no race",
                             kernel=kernel)
            if shape is None:
                _warn_symbolic_rows(site)
            node.target = torch.ops.tpflare.select_replicated.default
            node.args = tuple(node.args[:4]) + (with_scores, kernel)
            node.kwargs = {}
            continue
        q, c = shape
        sig = (q, c, k, group_name, with_scores)
        if sig in decided:
            first, d = decided[sig]
            reporting.record("select", "bound", site=site, composition=d.composition.name, source=d.source,
                             reason=f"same (Q, C, k, group, with_scores) as {first}: its decision", Q=q, C=c, k=k,
                             key=(d.key or "")[:16])
        else:
            d = race.decide(q, c, k, group_name, with_scores, device_of_backend(group_name), settings, site=site)
            decided[sig] = (site, d)
        node.target = getattr(torch.ops.tpflare, d.composition.op).default
        node.args = tuple(node.args[:4]) + (with_scores,) + tuple(d.composition.extra_args)
        node.kwargs = {}
        decisions.append(d)
    if decisions and recompile:
        gm.recompile()
    return decisions
