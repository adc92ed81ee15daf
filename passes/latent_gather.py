"""Latent gather: the one matcher and the rewrite, on the AOT forward (ATen) graph.

One site, as every spelling reaches this graph (``dist.all_reduce``, functional
collectives, DTensor's ``RowwiseParallel``, a stack's registered all-reduce op)::

    x_full [.., K]                      (replicated on every rank: checked, see replication.py)
      -> K-slice [r*K/W : (r+1)*K/W]    slice | split/chunk getitem | index_select(arange)
                                        (Inductor's decomposition: index(x, [.., iota]))
      [-> view / expand / clone]*
      -> mm | bmm | addmm(bias/W, ..)   against  permute(w_col) ([N, K/W], [out, in])
                                        or       w_io            ([K/W, N], [in, out])
      [-> view]*
      -> all-reduce(sum, group)         (Reduce: c10d + wait, or a stack op)

becomes::

    x2 = view(x_full, [-1, K])
    yt = mm(w_rows, permute(x2))                 # [N/W, M], full-K dot products, rounded once
         (addmm(bias[N_r, None], w_rows, x2^T)   # when the partial carried bias/W)
    g  = all_gather(yt, W, group)                # [N, M] rank-major: a copy, same bits everywhere
    y  = view(permute(g), shape of the partial)  # column-major [M, N]

``w_rows`` (this rank's row shard ``[N/W, K]``, ``[out, in]``) is a graph input
appended by preparation (``tpflare.latent_prep``), which also decides which
sites are rewritten; this module only finds (``find_sites``) and rewrites
(``rewrite``), so a site is matched in exactly one place.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable

import torch
from torch import fx

from . import collectives
from .collectives import Reduce

aten = torch.ops.aten
prims = torch.ops.prims

_X_CHAIN = {aten.expand.default, aten.view.default, aten._unsafe_view.default,
            aten.reshape.default, aten.clone.default, aten.alias.default}
_OUT_CHAIN = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_W_CHAIN = {aten.expand.default, aten.view.default, aten._unsafe_view.default, aten.clone.default}
_GEMMS = {aten.mm.default, aten.bmm.default}
_BIASED_GEMMS = {aten.addmm.default, aten.baddbmm.default}

GroupInfo = Callable[[str], tuple[int, int]]   # c10d group name -> (rank in group, group size)


@dataclasses.dataclass
class Site:
    """One all-reduce site of an ATen graph, classified (``skip`` set when it cannot be rewritten)."""

    reduce: Reduce
    rank: int = 0
    world: int = 0
    gemm: fx.Node | None = None
    x_full: fx.Node | None = None
    weight: fx.Node | None = None         # the column-shard placeholder
    layout: str = "out_in"                # "out_in": w [N, K/W]; "in_out": w [K/W, N]
    bias: fx.Node | None = None           # full bias [N] that each partial carried as bias/W
    chain_nodes: list[fx.Node] = dataclasses.field(default_factory=list)
    k_shard: int = 0
    n: int = 0
    skip: str | None = None
    symbolic: bool = False                # a size was symbolic and not specialised (specialize off)

    @property
    def name(self) -> str:
        return self.reduce.result.name

    @property
    def group(self) -> str | None:
        return self.reduce.group

    @property
    def k(self) -> int:
        return self.k_shard * self.world

    @property
    def dtype(self) -> torch.dtype | None:
        v = _val(self.x_full)
        return v.dtype if v is not None else None

    def rows(self) -> Any:
        """Row count of the hidden row (an int, or a SymInt expression under dynamic shapes)."""
        v = _val(self.x_full)
        out = 1
        for d in v.shape[:-1]:
            out = out * d
        return out


def _val(node: Any):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _is(node: Any, targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _walk_back(node: Any, through: set, chain: list[fx.Node]) -> Any:
    while _is(node, through):
        chain.append(node)
        node = node.args[0]
    return node


def _weight(b: Any) -> tuple[fx.Node | None, str, list[fx.Node]]:
    """A GEMM's right operand as (placeholder, layout, nodes that die with it)."""
    chain: list[fx.Node] = []
    node = _walk_back(b, _W_CHAIN, chain)
    layout = "in_out"
    if (_is(node, {aten.permute.default}) and list(node.args[1]) == [1, 0]) or _is(node, {aten.t.default}):
        chain.append(node)
        node = _walk_back(node.args[0], _W_CHAIN, chain)
        layout = "out_in"
    if not (isinstance(node, fx.Node) and node.op == "placeholder"):
        return None, layout, chain
    return node, layout, chain


def _size(a: Any):
    """A size argument as its value: an int, or the SymInt an FX node of a symbolic size holds."""
    return _val(a) if isinstance(a, fx.Node) else a


def _as_range(index: Any):
    """(start, end, step) of an index tensor that is a range: ``arange`` (what the user wrote)
    or ``prims.iota`` (Inductor's decomposition of it); None otherwise."""
    if _is(index, {aten.arange.start, aten.arange.start_step}):
        return index.args[0], index.args[1], index.args[2] if len(index.args) > 2 else 1
    if _is(index, {prims.iota.default}):
        length, start, step = (_size(v) for v in (index.args[0], index.kwargs.get("start", 0),
                                                  index.kwargs.get("step", 1)))
        return start, start + length * step, step
    return None


def _as_k_slice(node: Any):
    """A K-slice in any of its ATen spellings, as (x_full, dim, start, end, step, nodes
    that die with it); None if ``node`` is not one. Bounds may be symbolic (SymInt)."""
    if _is(node, {aten.slice.Tensor}):
        a = node.args
        return (a[0], a[1] if len(a) > 1 else 0, a[2] if len(a) > 2 else 0,
                a[3] if len(a) > 3 else None, a[4] if len(a) > 4 else 1, [])
    if isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem:
        split, j = node.args
        if _is(split, {aten.split.Tensor, aten.split_with_sizes.default}):
            size_arg = split.args[1]
            dim = split.args[2] if len(split.args) > 2 else 0
            if isinstance(size_arg, (list, tuple)):
                sizes = [_size(v) for v in size_arg]
                start, end = sum(sizes[:j]), sum(sizes[:j + 1])
            else:  # (chunk, or split by one size: a node where the size is symbolic; the last
                size = _size(size_arg)  # piece may be shorter, which the caller clips at K)
                start, end = size * j, size * (j + 1)
            siblings = [u for u in split.users if u is not node]
            dead = siblings + [split] if all(not u.users for u in siblings) else []
            return split.args[0], dim, start, end, 1, dead
    if _is(node, {aten.index_select.default}):
        x, dim, index = node.args
        rng = _as_range(index)
        if rng is not None:
            return (x, dim, *rng, [index] if len(index.users) == 1 else [])
    if _is(node, {aten.index.Tensor}):  # index_select as Inductor's decompositions leave it
        x, indices = node.args
        picked = [(d, index) for d, index in enumerate(indices) if index is not None]
        rng = _as_range(picked[0][1]) if len(picked) == 1 else None
        if rng is not None:
            dim, index = picked[0]
            return (x, dim, *rng, [index] if len(index.users) == 1 else [])
    return None


def _bias_over_world(c: Any, world: int) -> fx.Node | None:
    """``bias / W`` (how DTensor turns a Replicate bias into a Partial one): the full bias."""
    if _is(c, {aten.div.Tensor}) and c.args[1] == world:
        return c.args[0]
    if _is(c, {aten.mul.Tensor}) and isinstance(c.args[1], float) and c.args[1] * world == 1.0:
        return c.args[0]
    return None


def _gemm_plus_bias(node: Any) -> bool:
    """``add(GEMM output, a number or an [N] vector)``: a bias spelt out inside the partial."""
    if not _is(node, {aten.add.Tensor}):
        return False
    a, b = node.args[:2]
    for g, other in ((a, b), (b, a)):
        if _is(_walk_back(g, _OUT_CHAIN, []), _GEMMS | _BIASED_GEMMS):
            v = _val(other)
            if not isinstance(other, fx.Node) or (isinstance(v, torch.Tensor) and v.dim() <= 1):
                return True
    return False


def _static_size(d: Any, specialize: bool) -> int | None:
    """A static size; a symbolic one is specialised (a guard: weights do not change shape)
    only when the caller may rewrite, so a knob-off compile gains no guards."""
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt) and specialize:
        return int(d)
    return None


def _classify(s: Site, specialize: bool) -> None:
    def static(d: Any) -> int | None:  # a static size; notes on s a symbolic one left symbolic
        v = _static_size(d, specialize)
        if v is None and isinstance(d, torch.SymInt):
            s.symbolic = True
        return v

    r = s.reduce
    chain: list[fx.Node] = []
    gemm = _walk_back(r.partial, _OUT_CHAIN, chain)
    bias_node = None
    if _is(gemm, _BIASED_GEMMS):
        bias_node = gemm.args[0]
        s.bias = _bias_over_world(bias_node, s.world)
        if s.bias is None:
            s.skip = ("bias added inside each rank's partial (the reduce adds it W times); "
                      "add it after the reduce")
            return
        a, b = gemm.args[1], gemm.args[2]
    elif _is(gemm, _GEMMS):
        a, b = gemm.args[0], gemm.args[1]
    elif _gemm_plus_bias(gemm):
        s.skip = ("bias added inside each rank's partial (GEMM + bias before the reduce: the reduce adds "
                  "it W times); add it after the reduce")
        return
    else:
        s.skip = "reduced tensor is not a GEMM output (mm/bmm/addmm)"
        return
    s.gemm = gemm
    chain.append(gemm)
    if len(gemm.users) != 1 or any(len(n.users) != 1 for n in chain if n is not gemm):
        s.skip = "partial product is used outside the reduce"
        return
    w_node, s.layout, w_chain = _weight(b)
    if w_node is None:
        s.skip = "weight is not a graph input ([out, in] used through a transpose, or [in, out])"
        return
    wv = _val(w_node)
    if wv is None or wv.dim() != 2:
        s.skip = "weight is not a 2-D graph input"
        return
    dims = [static(d) for d in wv.shape]
    if None in dims:
        s.skip = "weight shape is symbolic"
        return
    s.weight = w_node
    if s.layout == "out_in":
        s.n, s.k_shard = dims
    else:
        s.k_shard, s.n = dims
    x_chain: list[fx.Node] = []
    sl = _walk_back(a, _X_CHAIN, x_chain)
    for e in x_chain:
        if e.target == aten.expand.default and list(_val(e).shape) != list(_val(e.args[0]).shape):
            s.skip = "hidden row is broadcast before the GEMM"
            return
    ks = _as_k_slice(sl)
    if ks is None:
        s.skip = "GEMM input is not a K-slice of a full hidden row (the row is not replicated here)"
        return
    x_full, dim, start, end, step, extra_dead = ks
    start, end, step = (None if a is None else static(_val(a) if isinstance(a, fx.Node) else a)
                        for a in (start, end, step))
    if start is None or step is None:
        s.skip = "K-slice bounds are symbolic"
        return
    xv = _val(x_full)
    k_full = static(xv.shape[-1])
    if k_full is None:
        s.skip = "hidden width is symbolic"
        return
    end = k_full if end is None else min(end, k_full)      # open-ended slices carry INT64_MAX
    if (dim not in (-1, xv.dim() - 1) or step != 1 or k_full != s.k_shard * s.world
            or start != s.rank * s.k_shard or end != start + s.k_shard):
        s.skip = (f"slice [{start}:{end}] of dim {dim} is not this rank's K-slice "
                  f"[{s.rank * s.k_shard}:{(s.rank + 1) * s.k_shard}] of a [.., {s.k_shard * s.world}] row")
        return
    pv = _val(r.partial)
    if (pv is None or static(pv.shape[-1]) != s.n
            or [str(d) for d in pv.shape[:-1]] != [str(d) for d in xv.shape[:-1]]):
        s.skip = "the reduced tensor is not [leading dims of the hidden row, N]"
        return
    s.x_full = x_full
    dead_bias = [bias_node] if bias_node is not None and len(bias_node.users) == 1 else []
    s.chain_nodes = r.nodes + chain + w_chain + x_chain + [sl] + extra_dead + dead_bias
    if xv.dtype != wv.dtype:
        s.skip = f"dtype mismatch: hidden {xv.dtype} vs weight {wv.dtype}"
    elif not xv.dtype.is_floating_point:
        s.skip = f"non-floating dtype {xv.dtype}"
    elif s.bias is not None and (_val(s.bias) is None or _val(s.bias).dim() != 1
                                 or static(_val(s.bias).shape[0]) != s.n):
        s.skip = "bias/W inside the partial is not a [N] vector"


def find_sites(graph: fx.Graph, group_info: GroupInfo, specialize: bool = False) -> list[Site]:
    """Every sum all-reduce of ``graph`` as a classified ``Site`` (the only matcher).

    ``specialize``: symbolic weight / hidden-width sizes become static (guards);
    else such a site is skipped.  Row counts stay symbolic (see ``Site.rows``).
    """
    sites = []
    for r in collectives.find_reduces(graph):
        s = Site(r)
        sites.append(s)
        if r.skip:
            s.skip = r.skip
            continue
        try:
            s.rank, s.world = group_info(r.group)
        except Exception as e:
            s.skip = f"group {r.group!r} cannot be resolved on this rank ({type(e).__name__}: {e})"
            continue
        if s.world == 1:
            s.skip = "group of size 1: nothing to reduce"
            continue
        try:
            _classify(s, specialize)
        except Exception as e:  # a spelling the matcher does not know: never crash the compile
            s.skip = f"not understood by the matcher ({type(e).__name__}: {e})"
    return sites


# --- the rewrite ------------------------------------------------------------------------------------
class _Builder:
    """Adds nodes before ``anchor`` with fake values (the passes after us read ``meta['val']``)."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node, fake_mode) -> None:
        self.graph, self.anchor, self.fake_mode = graph, anchor, fake_mode

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        _ensure_val(node, self.fake_mode)
        return node


def rewrite(graph: fx.Graph, s: Site, rows_node: fx.Node, fake_mode, channel_rows: int = 0,
            replaced: dict[fx.Node, fx.Node] | None = None) -> dict[str, Any]:
    """Replace site ``s`` (gates already passed) by the row-shard GEMM + column gather.

    ``replaced`` maps the results of sites rewritten before to their new nodes (a
    site's hidden row may be an earlier site's output); this site's is added.
    """
    replaced = {} if replaced is None else replaced
    s.x_full = replaced.get(s.x_full, s.x_full)
    if s.bias is not None:
        s.bias = replaced.get(s.bias, s.bias)
    xv = _val(s.x_full)
    k = s.k  # the matcher's static sizes (s.k, s.n): a SymInt in a node's arguments names no node
    m_rows = s.rows()
    out_shape = list(_val(s.reduce.partial).shape)
    b = _Builder(graph, s.reduce.result, fake_mode)
    x2 = s.x_full if xv.dim() == 2 else b(aten.view.default, s.x_full, [-1, k])
    bias_col = None
    if s.bias is not None:
        n_r = s.n // s.world
        part = b(aten.slice.Tensor, s.bias, 0, s.rank * n_r, (s.rank + 1) * n_r)
        bias_col = b(aten.view.default, part, [n_r, 1])

    def gathered(x_rows: fx.Node) -> fx.Node:
        xt = b(aten.permute.default, x_rows, [1, 0])
        yt = (b(aten.addmm.default, bias_col, rows_node, xt) if bias_col is not None
              else b(aten.mm.default, rows_node, xt))
        with graph.inserting_before(s.reduce.result):
            g = collectives.emit_all_gather(graph, yt, s.world, s.reduce)
        _ensure_val(g, fake_mode)
        return b(aten.permute.default, g, [1, 0])

    chunk = channel_rows if channel_rows and isinstance(m_rows, int) and m_rows > channel_rows else 0
    if chunk:
        parts = [gathered(b(aten.slice.Tensor, x2, 0, i0, min(i0 + chunk, m_rows)))
                 for i0 in range(0, m_rows, chunk)]
        y2 = b(aten.cat.default, parts, 0)
    else:
        y2 = gathered(x2)
    if len(out_shape) == 2:
        y = y2
    else:
        lead = [d if isinstance(d, int) else b(aten.sym_size.int, s.x_full, i)
                for i, d in enumerate(out_shape[:-1])]
        y = b(aten.view.default, y2, lead + [s.n])
    result = s.reduce.result
    orig = _val(result)
    result.replace_all_uses_with(y)
    replaced[result] = y
    for node in s.chain_nodes:
        if not node.users:
            graph.erase_node(node)
    out_copy = _restore_output_layouts(graph, y, orig, fake_mode)
    return dict(rows=m_rows if isinstance(m_rows, int) else str(m_rows),
                chunks=(-(-m_rows // chunk) if chunk else 1), output_layout_copy=out_copy)


def _restore_output_layouts(graph: fx.Graph, new: fx.Node, orig: Any, fake_mode) -> bool:
    """Graph outputs computed from ``new`` (the rewrite's column-major view, replacing a value
    whose fake tensor was ``orig``) keep the row-major layout eager code gave them.

    The fake values downstream of ``new`` are recomputed (their strides follow the new layout,
    as eager's stride rules and Inductor's layouts do: a pointwise op on the view is column-major
    too, a GEMM's output is not); an output that was contiguous and no longer is gets one
    contiguous copy (Inductor fuses it into a pointwise producer). Consumers inside the graph
    read the view in place. A value that cannot be recomputed counts as changed. True when a
    copy was added."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    reach, stack = {new}, [new]
    while stack:
        for u in stack.pop().users:
            if u not in reach and u is not out:
                reach.add(u)
                stack.append(u)
    before = {new: orig}
    unknown = set()
    for n in sorted(reach - {new}, key=order.__getitem__):
        before[n] = n.meta.get("val")
        try:
            args, kwargs = torch.utils._pytree.tree_map_only(fx.Node, lambda a: a.meta["val"], (n.args, n.kwargs))
            with fake_mode:
                n.meta["val"] = n.target(*args, **kwargs)
        except Exception:  # keep the old value; the output check below treats it as changed
            unknown.add(n)
    copied = False
    for a in dict.fromkeys(a for a in out.all_input_nodes if a in reach):
        was, now = before[a], a.meta.get("val")
        if not (isinstance(was, torch.Tensor) and was.is_contiguous()):
            continue
        if a not in unknown and isinstance(now, torch.Tensor) and now.is_contiguous():
            continue
        with graph.inserting_before(out):
            c = graph.call_function(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
        _ensure_val(c, fake_mode)
        out.replace_input_with(a, c)
        copied = True
    return copied


def _ensure_val(node: fx.Node, fake_mode) -> None:
    if "val" in node.meta:
        return
    for n in node.all_input_nodes:
        _ensure_val(n, fake_mode)
    args, kwargs = torch.utils._pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs))
    with fake_mode:
        node.meta["val"] = node.target(*args, **kwargs)


__all__ = ["Site", "find_sites", "rewrite"]
