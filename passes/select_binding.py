"""Selection binding: replace each model-facing ``tpflare.select`` node with its composition.

Runs in the backend on a copy of Dynamo's graph, before AOTAutograd and Inductor,
so the bound op is part of the graph Inductor's FX-graph cache keys on: a graph
compiled under one winner is never served when the cache or knobs now say
another.  The node keeps its leading arguments; the composition appends its child
plans: the owner composition's id replication, and every composition's ordered-selection
kernel (``TPFLARE_SELECT_KERNEL`` resolved for the site at preparation).  Replay reads no
knob. A site whose row count is symbolic (``dynamic=True``, or Dynamo's automatic dynamic
shapes from a frame's second shape) is decided at each row count of ``TPFLARE_SELECT_ROWS``
and bound as ``tpflare::select_by_rows`` with that table as arguments: the op picks by the
call's rows, so every capacity later captured runs a raced winner. A site whose candidates a
rank are symbolic gets the default composition and the knob's value as its kernel (``auto``/
``triton``: the op picks the Triton kernel where it supports the call's row length, a
per-shape rule), and the first such site of a process logs a warning naming the fix.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

from tpflare import race, reporting
from tpflare.config import Settings
from tpflare.distributed import device_of_backend
from tpflare.errors import NoValidComposition

log = logging.getLogger("tpflare.passes.select_binding")

_SELECT = {torch.ops.tpflare.select, torch.ops.tpflare.select.default}


_warned_symbolic = False


def _warn_symbolic(site: str) -> None:
    """Once a process: a site bound to the default with no race (the report has every site)."""
    global _warned_symbolic
    if _warned_symbolic:
        return
    _warned_symbolic = True
    log.warning("tpflare: selection site %s runs the default composition (%s) with no race: its "
                "shape is not known at preparation (or TPFLARE_SELECT_ROWS is empty for a symbolic "
                "row count), or k / the group is not a constant. Compile with dynamic=False (one "
                "graph a capacity, as examples/serve.py does) to race each capacity. Logged once; "
                "tpflare.format_report() lists every site.", site, race.DEFAULT)


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _meta_value(node: fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _dims(node: Any) -> tuple[Any, ...] | None:
    val = _meta_value(node) if isinstance(node, fx.Node) else None
    return None if val is None else tuple(val.shape)


def _default(settings: Settings, kernel: str) -> race.Composition:
    return next(cm for cm in race.compositions(settings, kernel) if cm.name == race.DEFAULT)


def bind_select_sites(gm: fx.GraphModule, example_inputs: list, settings: Settings,
                      graph_id: str = "") -> list[race.Decision]:
    """Bind every selection site in ``gm`` (edited in place, its code regenerated where a site
    was bound); the decisions made.

    Sites with the same (Q, C, k, group, with_scores) -- one per layer in a model --
    share one decision: ``race.decide`` (cache lookup, hit agreement collective,
    race on a miss) runs once per distinct site in the graph, in graph order, so
    every rank makes the same collectives.  A site whose row count is symbolic gets a
    table: one decision at each row count of ``TPFLARE_SELECT_ROWS``, bound as
    ``tpflare::select_by_rows``; its candidates a rank, if symbolic, are specialised to
    the example's (a shape guard: a graph for other C recompiles).
    """
    decisions: list[race.Decision] = []
    decided: dict[tuple, tuple[str, Any]] = {}  # site signature -> (first site, its decision or table)
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SELECT:
            continue
        changed = True
        site = f"{graph_id}:{node.name}"
        scores, k, group_name = _arg(node, 0, "scores"), _arg(node, 2, "k"), _arg(node, 3, "group_name")
        with_scores = bool(_arg(node, 4, "with_scores", False))
        dims = _dims(scores)
        k = _value(k)
        if dims is None or len(dims) != 2 or k is None or not isinstance(group_name, str):
            _bind(node, _default(settings, settings.select_kernel), with_scores, site, "default",
                  "shape not known here, or non-constant k/group: default composition, no race",
                  kernel=settings.select_kernel)
            continue
        q, c = dims
        pinned = race.forced(settings)
        if pinned is None and (isinstance(q, int) or settings.select_rows):
            # specialised (shape guards: another value recompiles) so the site can be raced: C (the
            # model's top-C a rank) and k are the model's constants, which dynamic=True makes symbolic
            c, k = int(c), int(k)
        if not isinstance(c, int) or not isinstance(k, int) or not isinstance(q, int):
            decisions += _bind_symbolic(node, site, q, c, k, group_name, with_scores, settings, decided)
            continue
        sig = (q, c, k, group_name, with_scores)
        if sig in decided:
            first, d = decided[sig]
            reporting.record("select", "bound", site=site, composition=d.composition.name, source=d.source,
                             reason=f"same (Q, C, k, group, with_scores) as {first}: its decision", Q=q, C=c, k=k,
                             key=(d.key or "")[:16])
        else:
            d = race.decide(q, c, k, group_name, with_scores, device_of_backend(group_name), settings, site=site)
            decided[sig] = (site, d)
            decisions.append(d)
        _put(node, d.composition.op, with_scores, d.composition.extra_args)
    if changed:
        gm.recompile()
    return decisions


def _value(v: Any) -> Any:
    """An int argument's value here: an int, a SymInt (a graph input under dynamic shapes), or
    None where unknown."""
    if isinstance(v, fx.Node):
        v = _meta_value(v)
    return v if isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) else None


def _put(node: fx.Node, op: str, with_scores: bool, extra_args: tuple) -> None:
    """The node calls ``tpflare::<op>`` with its leading arguments, then ``extra_args``."""
    node.target = getattr(torch.ops.tpflare, op).default
    node.args = tuple(node.args[:4]) + (with_scores,) + tuple(extra_args)
    node.kwargs = {}


def _bind(node: fx.Node, comp: race.Composition, with_scores: bool, site: str, source: str, why: str,
          **fields: Any) -> None:
    """Bind one composition without a race (forced, or the default), and report it."""
    reporting.record("select", "bound", site=site, composition=comp.name, source=source, reason=why, **fields)
    if source == "default":
        _warn_symbolic(site)
    _put(node, comp.op, with_scores, comp.extra_args)


def _bind_symbolic(node: fx.Node, site: str, q: Any, c: Any, k: int, group_name: str, with_scores: bool,
                   settings: Settings, decided: dict) -> list[race.Decision]:
    """A site of symbolic shape: a forced composition as such; with no row counts to race at
    (``TPFLARE_SELECT_ROWS`` empty), the default; else (``c`` static by now) one decision at each
    listed row count (races or cache hits, shared by the sites of the same C, k, group and
    with_scores), bound as a table the op reads by the call's rows."""
    device = device_of_backend(group_name)
    # the kernel: resolved for the site where C is known, else the knob's value (a per-call rule)
    static = isinstance(c, int) and isinstance(k, int)
    kernel = race.site_kernel(settings, c, k, group_name, device) if static else settings.select_kernel
    shape = {n: v if isinstance(v, int) else "symbolic" for n, v in (("Q", q), ("C", c), ("k", k))}
    shape["kernel"] = kernel
    pinned = race.forced(settings, kernel)
    if pinned is not None:
        _bind(node, pinned, with_scores, site, "forced", f"TPFLARE_SELECT={settings.select}", **shape)
        return []
    rows = tuple(settings.select_rows)
    if not rows:
        _bind(node, _default(settings, kernel), with_scores, site, "default",
              "symbolic row count and TPFLARE_SELECT_ROWS empty: default composition, no race", **shape)
        return []
    sig = ("rows", rows, c, k, group_name, with_scores)
    if sig in decided:
        first, table = decided[sig]
        fresh: list[race.Decision] = []
        why = f"same (C, k, group, with_scores) as {first}: its table"
    else:
        table, dropped = {}, {}
        for r in rows:
            try:
                table[r] = race.decide(r, c, k, group_name, with_scores, device, settings, site=f"{site}@rows={r}")
            except NoValidComposition as e:  # agreed on every rank: a row count the table goes without
                dropped[r] = str(e)[:300]  # (a timeout or another rank's failure still fails the compile)
        decided[sig] = (site, table)
        fresh = list(table.values())
        why = f"symbolic row count: a decision at each of TPFLARE_SELECT_ROWS={','.join(map(str, rows))}"
        if dropped:
            why += f"; dropped (no composition valid there, on every rank): {dropped}"
    if not table:
        _bind(node, _default(settings, kernel), with_scores, site, "default",
              f"{why}: no row count left, default composition", **shape)
        return fresh
    names = [d.composition.name for d in table.values()]
    reporting.record("select", "bound", site=site, composition="by rows", source="table", reason=why,
                     table=dict(zip(table, names)), sources=[d.source for d in table.values()], **shape)
    _put(node, "select_by_rows", with_scores, (list(table), ",".join(names), kernel))
    return fresh
