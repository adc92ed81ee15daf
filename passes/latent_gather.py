"""Latent gather: rewrite a down_reduce into a row-shard GEMM + column all-gather.

Post-grad (ATen) graph, one site::

    x_full [.., K]  (replicated on every rank)
      -> slice(dim=-1, r*K/W : (r+1)*K/W)  [-> expand / view / clone]*
      -> mm | bmm (with permute(w_col) [-> expand]) ,  w_col = graph input [N, K/W]
      [-> view]*
      -> _c10d_functional.all_reduce(sum, group) -> wait_tensor           (BF16 partials)

becomes::

    x2 = view(x_full, [M, K])
    yt = mm(w_rows, permute(x2))              # [N/W, M]: full-K dot products, rounded once
    g  = wait(all_gather_into_tensor(yt, W))  # [N, M]: rank r's rows at r*N/W (a copy)
    y  = view(permute(g), shape of the reduced tensor)   # column-major [M, N], no layout copy

``w_rows`` (this rank's row shard ``[N/W, K]``) is a graph input that the
backend appended (see ``tpflare.row_shards``); the pass is told which input
holds the row shard of which column-shard input by a ``LatentGatherPlan``.
Every candidate site is reported: rewritten, or skipped with its reason.
"""
from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any

import torch
from torch import fx

from tpflare import reporting as report

log = logging.getLogger("tpflare.passes.latent_gather")

aten = torch.ops.aten
c10d = torch.ops._c10d_functional

_X_CHAIN = {aten.expand.default, aten.view.default, aten._unsafe_view.default,
            aten.reshape.default, aten.clone.default, aten.alias.default}
_OUT_CHAIN = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_W_CHAIN = {aten.expand.default, aten.view.default, aten._unsafe_view.default}
_GEMMS = {aten.mm.default, aten.bmm.default}
_BIASED_GEMMS = {aten.addmm.default, aten.baddbmm.default}


@dataclasses.dataclass(frozen=True)
class RowSource:
    """Where the row shard of one column-shard input comes from."""

    row_input: int | None  # placeholder index of the row shard, None = unavailable
    reason: str = ""       # why it is unavailable
    origin: str = ""       # "registered" / "resharded"
    added_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class LatentGatherPlan:
    """What the backend prepared for this graph (part of the pass's uuid)."""

    enabled: bool
    align: int
    min_rows: int
    channel_rows: int
    rank_in_group: dict[str, int]          # group name -> this rank's index
    world_of_group: dict[str, int]         # group name -> group size
    rows_for_input: dict[int, RowSource]   # column-shard input index -> row source
    graph_id: str = ""

    def fingerprint(self) -> str:
        rows = sorted((k, v.row_input, v.reason) for k, v in self.rows_for_input.items())
        return repr((self.enabled, self.align, self.min_rows, self.channel_rows,
                     sorted(self.rank_in_group.items()), sorted(self.world_of_group.items()), rows))


@dataclasses.dataclass
class DownReduceMatch:
    """One down_reduce site found in a post-grad graph."""

    all_reduce: fx.Node
    wait: fx.Node
    group_name: str
    gemm: fx.Node | None = None
    x_full: fx.Node | None = None
    weight_input: int | None = None       # placeholder index of w_col
    chain_nodes: list[fx.Node] = dataclasses.field(default_factory=list)
    k_shard: int = 0
    n: int = 0
    skip: str | None = None               # reason this site cannot be rewritten

    @property
    def name(self) -> str:
        return self.all_reduce.name


def _val(node: Any):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _single_user(node: fx.Node) -> bool:
    return len(node.users) == 1


def _is_target(node: Any, targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _walk_back(node: fx.Node, through: set, chain: list[fx.Node]) -> fx.Node:
    while _is_target(node, through):
        chain.append(node)
        node = node.args[0]
    return node


def _weight_input(b: fx.Node, placeholders: dict[fx.Node, int]) -> tuple[int | None, fx.Node | None, list]:
    """Trace a GEMM's right operand back to a [N, K/W] graph input through a transpose."""
    chain: list[fx.Node] = []
    node = _walk_back(b, _W_CHAIN, chain)
    if _is_target(node, {aten.permute.default}) and list(node.args[1]) == [1, 0]:
        chain.append(node)
        node = node.args[0]
    elif _is_target(node, {aten.t.default}):
        chain.append(node)
        node = node.args[0]
    else:
        return None, None, chain
    return placeholders.get(node), node, chain


def _as_k_slice(node: fx.Node):
    """A K-slice in any of its post-grad spellings, as (x_full, dim, start, end, step, nodes
    that die with it); None if ``node`` is not one.

    ``slice`` (also what ``narrow`` and ``x[..., a:b]`` become), ``getitem`` of a
    ``split`` / ``split_with_sizes`` (``torch.chunk`` / ``torch.split``), and
    ``index_select`` by a step-1 ``arange``.
    """
    if _is_target(node, {aten.slice.Tensor}):
        a = node.args
        return (a[0], a[1] if len(a) > 1 else 0, a[2] if len(a) > 2 else 0,
                a[3] if len(a) > 3 else None, a[4] if len(a) > 4 else 1, [])
    if isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem:
        split, j = node.args
        if _is_target(split, {aten.split.Tensor, aten.split_with_sizes.default}):
            size_arg = split.args[1]
            dim = split.args[2] if len(split.args) > 2 else 0
            k_full = _val(split.args[0]).shape[dim]
            sizes = (list(size_arg) if isinstance(size_arg, (list, tuple))
                     else [size_arg] * (-(-k_full // size_arg)))
            start = sum(sizes[:j])
            siblings = [u for u in split.users if u is not node]
            dead = siblings + [split] if all(not u.users for u in siblings) else []
            return split.args[0], dim, start, start + sizes[j], 1, dead
    if _is_target(node, {aten.index_select.default}):
        x, dim, index = node.args
        if _is_target(index, {aten.arange.start, aten.arange.start_step}):
            step = index.args[2] if len(index.args) > 2 else 1
            dead = [index] if len(index.users) == 1 else []
            return x, dim, index.args[0], index.args[1], step, dead
    return None


def find_down_reduces(graph: fx.Graph, plan: LatentGatherPlan) -> list[DownReduceMatch]:
    """Every all_reduce(sum)+wait site, classified (``skip`` set when not rewritable)."""
    placeholders = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
    matches = []
    for ar in graph.find_nodes(op="call_function", target=c10d.all_reduce.default):
        waits = [u for u in ar.users if u.target == c10d.wait_tensor.default]
        if len(waits) != 1 or len(ar.users) != 1:
            continue
        m = DownReduceMatch(all_reduce=ar, wait=waits[0], group_name=str(ar.args[2]))
        matches.append(m)
        if ar.args[1] != "sum":
            m.skip = f"all_reduce op is {ar.args[1]!r}, not sum"
            continue
        world = plan.world_of_group.get(m.group_name)
        rank = plan.rank_in_group.get(m.group_name)
        if world is None or rank is None:
            m.skip = f"group {m.group_name!r} unknown to this preparation"
            continue
        if world == 1:
            m.skip = "group of size 1: nothing to reduce"
            continue
        chain: list[fx.Node] = []
        gemm = _walk_back(ar.args[0], _OUT_CHAIN, chain)
        if _is_target(gemm, _BIASED_GEMMS):
            m.skip = "bias added inside each rank's partial (it would be reduced W times); add it after the reduce"
            continue
        if not _is_target(gemm, _GEMMS):
            m.skip = "reduced tensor is not a GEMM output (mm/bmm/linear)"
            continue
        m.gemm = gemm
        chain.append(gemm)
        a, b = gemm.args[0], gemm.args[1]
        w_idx, w_node, w_chain = _weight_input(b, placeholders)
        x_chain: list[fx.Node] = []
        sl = _walk_back(a, _X_CHAIN, x_chain)
        partial_users = [n for n in chain if n is not gemm and not _single_user(n)]
        if not _single_user(gemm) or partial_users:
            m.skip = "partial product is used outside the reduce"
            continue
        if w_idx is None:
            m.skip = "weight is not a graph input in [out, in] layout used through a transpose"
            continue
        wv = _val(w_node)
        m.weight_input = w_idx
        m.n, m.k_shard = int(wv.shape[0]), int(wv.shape[1])
        for e in x_chain:
            if e.target == aten.expand.default and list(_val(e).shape) != list(_val(e.args[0]).shape):
                m.skip = "hidden row is broadcast before the GEMM"
                break
        if m.skip:
            continue
        ks = _as_k_slice(sl)
        if ks is None:
            m.skip = "GEMM input is not a K-slice of a replicated hidden row (not replicated input)"
            continue
        x_full, dim, start, end, step, extra_dead = ks
        xv = _val(x_full)
        k_full = xv.shape[-1]
        end = k_full if end is None else min(end, k_full)  # open-ended slices carry INT64_MAX
        if (dim not in (-1, xv.dim() - 1) or step != 1 or k_full != m.k_shard * world
                or start != rank * m.k_shard or end != start + m.k_shard):
            m.skip = (f"slice [{start}:{end}] of dim {dim} is not this rank's K-slice "
                      f"[{rank * m.k_shard}:{(rank + 1) * m.k_shard}] of a [.., {k_full}] row (not replicated input)")
            continue
        if not _single_user(sl) or any(not _single_user(e) for e in x_chain):
            m.skip = "the K-slice is used outside the GEMM"
            continue
        m.x_full = x_full
        m.chain_nodes = [m.wait, ar] + chain + x_chain + [sl] + extra_dead
        if xv.dtype != wv.dtype:
            m.skip = f"dtype mismatch: hidden {xv.dtype} vs weight {wv.dtype}"
            continue
        if not xv.dtype.is_floating_point:
            m.skip = f"non-floating dtype {xv.dtype}"
            continue
    return matches


def _gate(m: DownReduceMatch, plan: LatentGatherPlan, graph: fx.Graph) -> str | None:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    world = plan.world_of_group[m.group_name]
    if not plan.enabled:
        return "knob off (TPFLARE_LATENT_GATHER=0)"
    if m.n % (plan.align * world):
        return f"width: N={m.n} is not a multiple of align*W={plan.align}*{world}"
    xv = _val(m.x_full)
    rows = xv.numel() // xv.shape[-1]
    if not statically_known_true(rows >= plan.min_rows):
        return f"rows: {rows} rows not known to be >= {plan.min_rows} (TPFLARE_LATENT_GATHER_MIN_ROWS)"
    src = plan.rows_for_input.get(m.weight_input)
    if src is None or src.row_input is None:
        return "no row shard" + (f": {src.reason}" if src is not None and src.reason else "")
    rows_node = list(graph.find_nodes(op="placeholder"))[src.row_input]
    rv = _val(rows_node)
    expect = (m.n // world, m.k_shard * world)
    if rv is None or tuple(rv.shape) != expect or rv.dtype != xv.dtype:
        got = None if rv is None else (tuple(rv.shape), rv.dtype)
        return f"row shard input has {got}, expected {expect} {xv.dtype}"
    return None


def _replace(m: DownReduceMatch, plan: LatentGatherPlan, graph: fx.Graph) -> dict[str, Any]:
    world = plan.world_of_group[m.group_name]
    src = plan.rows_for_input[m.weight_input]
    rows_node = list(graph.find_nodes(op="placeholder"))[src.row_input]
    xv = _val(m.x_full)
    k = xv.shape[-1]
    m_rows = xv.numel() // k
    out_shape = list(_val(m.all_reduce.args[0]).shape)
    chunk = plan.channel_rows if plan.channel_rows and isinstance(m_rows, int) else 0
    with graph.inserting_before(m.wait):
        x2 = graph.call_function(aten.view.default, (m.x_full, [m_rows, k]))

        def gathered(x_rows: fx.Node) -> fx.Node:
            xt = graph.call_function(aten.permute.default, (x_rows, [1, 0]))
            yt = graph.call_function(aten.mm.default, (rows_node, xt))
            ag = graph.call_function(c10d.all_gather_into_tensor.default, (yt, world, m.group_name))
            g = graph.call_function(c10d.wait_tensor.default, (ag,))
            return graph.call_function(aten.permute.default, (g, [1, 0]))

        if chunk and m_rows > chunk:
            parts = []
            for i0 in range(0, m_rows, chunk):
                xs = graph.call_function(aten.slice.Tensor, (x2, 0, i0, min(i0 + chunk, m_rows)))
                parts.append(gathered(xs))
            y2 = graph.call_function(aten.cat.default, (parts, 0))
        else:
            y2 = gathered(x2)
        y = graph.call_function(aten.view.default, (y2, out_shape))
    m.wait.replace_all_uses_with(y)
    for node in m.chain_nodes:  # wait, all_reduce, out views, gemm, x chain, slice
        if not node.users:
            graph.erase_node(node)
    return dict(rows=m_rows, chunks=(-(-m_rows // chunk) if chunk and m_rows > chunk else 1),
                row_shard=src.origin, memory_added_bytes=src.added_bytes)


def run(graph: fx.Graph, plan: LatentGatherPlan) -> list[dict[str, Any]]:
    """Find, gate and rewrite every down_reduce site; return one record per site."""
    out = []
    for m in find_down_reduces(graph, plan):
        site = f"{plan.graph_id}:{m.name}" if plan.graph_id else m.name
        base: dict[str, Any] = dict(site=site, group=m.group_name)
        if m.n:
            base.update(N=m.n, K=m.k_shard * plan.world_of_group.get(m.group_name, 0),
                        W=plan.world_of_group.get(m.group_name))
        reason = m.skip or _gate(m, plan, graph)
        if reason:
            out.append(report.record("latent_gather", "skipped", reason=reason, **base))
            continue
        info = _replace(m, plan, graph)
        out.append(report.record("latent_gather", "rewritten", **base, **info))
    if any(r["decision"] == "rewritten" for r in out):
        graph.lint()
    return out
