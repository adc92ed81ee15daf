"""Pass-level tests of the latent-gather matcher and rewrite on traced ATen graphs (no processes)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from tpflare.passes import collectives, replication
from tpflare.passes import latent_gather as lg

c10d = torch.ops._c10d_functional
aten = torch.ops.aten

W, RANK, KS, N = 2, 1, 8, 128          # K = 16, this rank's K-slice is [8:16]


def _reduce(y):
    return c10d.wait_tensor(c10d.all_reduce(y, "sum", "g"))


def site(x, w, rows):
    y = F.linear(x[..., RANK * KS:(RANK + 1) * KS], w)
    return _reduce(y) + 1


def _trace(fn, x, w=None, rows=None, dtype=torch.bfloat16, mode="fake", decompose=False):
    """``fn`` as an ATen graph; ``decompose``: with Inductor's decompositions, as the pass sees
    a graph in a real compile (index_select becomes index of an iota)."""
    from torch._inductor.decomposition import select_decomp_table

    w = torch.randn(N, KS, dtype=dtype) if w is None else w
    rows = torch.randn(N // W, KS * W, dtype=dtype) if rows is None else rows
    table = select_decomp_table() if decompose else None
    gm = make_fx(fn, tracing_mode=mode, decomposition_table=table)(x, w, rows)
    gm.graph.eliminate_dead_code()  # (as AOT's graph reaches the pass: decompositions leave dead casts)
    return gm


def _info(world=W, rank=RANK):
    return lambda g: (rank, world)


def _sites(gm, **kw):
    return lg.find_sites(gm.graph, _info(**kw))


def _rewrite(gm, s, channel_rows=0):
    rows = list(gm.graph.find_nodes(op="placeholder"))[2]
    fake_mode = rows.meta["val"].fake_mode
    return lg.rewrite(gm.graph, s, rows, fake_mode, channel_rows)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _run_fake(gm, *shapes):
    gm.recompile()
    with FakeTensorMode():
        return gm(*[torch.empty(*s, dtype=torch.bfloat16) for s in shapes])


@pytest.mark.parametrize("shape", [(16, 2 * KS), (2, 8, 2 * KS)], ids=["mm", "3d"])
def test_rewrites_matched_site(shape):
    gm = _trace(site, torch.randn(*shape, dtype=torch.bfloat16))
    [s] = _sites(gm)
    assert s.skip is None and (s.n, s.k, s.layout) == (N, 2 * KS, "out_in")
    _rewrite(gm, s)
    t = _targets(gm)
    assert c10d.all_reduce.default not in t and aten.slice.Tensor not in t   # K-slice copy gone
    assert t.count(c10d.all_gather_into_tensor.default) == 1
    mm = next(n for n in gm.graph.nodes if n.target == aten.mm.default)
    assert mm.args[0].name == "rows_1"                          # full-K GEMM with the row shard
    ag = next(n for n in gm.graph.nodes if n.target == c10d.all_gather_into_tensor.default)
    assert ag.args[1:] == (W, "g")
    assert all("val" in n.meta for n in gm.graph.nodes if n.op != "output")   # later passes read it
    out = _run_fake(gm, shape, (N, KS), (N // W, 2 * KS))
    assert tuple(out.shape) == shape[:-1] + (N,)


def test_channel_rows_chunks_the_gather():
    gm = _trace(site, torch.randn(40, 2 * KS, dtype=torch.bfloat16))
    [s] = _sites(gm)
    assert _rewrite(gm, s, channel_rows=16)["chunks"] == 3
    assert _targets(gm).count(c10d.all_gather_into_tensor.default) == 3


def test_in_out_weight_layout_matches():
    def io(x, w, rows):                           # x_local @ w, w stored [in, out] = [K/W, N]
        return _reduce(torch.matmul(torch.chunk(x, W, -1)[RANK], w))

    gm = _trace(io, torch.randn(16, 2 * KS, dtype=torch.bfloat16), w=torch.randn(KS, N, dtype=torch.bfloat16))
    [s] = _sites(gm)
    assert s.skip is None and s.layout == "in_out" and (s.n, s.k_shard) == (N, KS)
    _rewrite(gm, s)
    assert tuple(_run_fake(gm, (16, 2 * KS), (KS, N), (N // W, 2 * KS)).shape) == (16, N)


def test_bias_over_world_is_rewritten_with_the_full_bias():
    def dtensor_style(x, w, rows):               # DTensor: Replicate bias -> Partial = bias / W
        b = w[:, 0].clone()
        return _reduce(torch.addmm(b / W, x[..., RANK * KS:(RANK + 1) * KS], w.t()))

    gm = _trace(dtensor_style, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    [s] = _sites(gm)
    assert s.skip is None and s.bias is not None
    _rewrite(gm, s)
    t = _targets(gm)
    assert aten.div.Tensor not in t and t.count(aten.addmm.default) == 1


@pytest.mark.parametrize("decompose", [False, True], ids=["aten", "inductor_decomposed"])
@pytest.mark.parametrize("form", ["narrow", "chunk", "split", "index_select", "open_ended"])
def test_k_slice_spellings(form, decompose):
    def sliced(x):
        if form == "narrow":
            return x.narrow(-1, RANK * KS, KS)
        if form == "chunk":
            return torch.chunk(x, W, -1)[RANK]
        if form == "split":
            return torch.split(x, [KS, KS], dim=-1)[RANK]
        if form == "open_ended":
            return x[..., RANK * KS:]
        return x.index_select(-1, torch.arange(RANK * KS, (RANK + 1) * KS))

    gm = _trace(lambda x, w, rows: _reduce(F.linear(sliced(x), w)), torch.randn(16, 2 * KS, dtype=torch.bfloat16),
                decompose=decompose)
    [s] = _sites(gm)
    assert s.skip is None, s.skip
    _rewrite(gm, s)
    t = _targets(gm)
    assert not {aten.split.Tensor, aten.split_with_sizes.default, aten.index_select.default, aten.index.Tensor,
                torch.ops.prims.iota.default, aten.slice.Tensor} & set(t), t      # the K-slice copy is gone


@pytest.mark.parametrize("form", ["chunk", "split"])
def test_split_of_a_symbolic_width(form):
    """A split or chunk whose size is a symbolic expression (dynamic=True makes the hidden width
    symbolic): the bounds specialise when the pass may rewrite, else the site is skipped with
    its reason. (The matcher once raised a TypeError on these, caught as "not understood".)"""
    def fn(x, w, rows):
        y = torch.chunk(x, W, -1)[RANK] if form == "chunk" else torch.split(x, x.shape[-1] // W, -1)[RANK]
        return _reduce(F.linear(y, w))

    gm = _trace(fn, torch.randn(16, 2 * KS, dtype=torch.bfloat16), mode="symbolic")
    assert any(isinstance(_val, torch.SymInt) for n in gm.graph.nodes
               for _val in [n.meta.get("val")]), "the trace kept no symbolic size"
    [s] = lg.find_sites(gm.graph, _info(), specialize=True)
    assert s.skip is None, s.skip
    [s] = lg.find_sites(gm.graph, _info(), specialize=False)
    assert s.skip is not None and "symbolic" in s.skip, s.skip


@pytest.mark.parametrize("lead", [(16,), (2, 8)], ids=["2d", "3d"])
def test_a_rewrite_of_symbolic_sizes_puts_no_size_object_in_the_graph(lead):
    """Under ``dynamic=True`` the hidden width and N reach the pass as SymInts, which the matcher
    specialises (guards). The rewrite's views take those static sizes, and a row count that stays
    symbolic comes from a ``sym_size`` node: a SymInt object in a node's arguments names no node of
    the graph (torch 2.13 warns "Raw SymInt value ... passed as argument"; seen in
    ``tools/fuzz_latent.py --seed 29``)."""
    def fn(x, w, rows):
        return _reduce(F.linear(torch.chunk(x, W, -1)[RANK], w)) * 2

    gm = _trace(fn, torch.randn(*lead, 2 * KS, dtype=torch.bfloat16), mode="symbolic")
    [s] = lg.find_sites(gm.graph, _info(), specialize=True)
    assert s.skip is None, s.skip
    _rewrite(gm, s)
    raw = [(n.name, a) for n in gm.graph.nodes for a in torch.utils._pytree.tree_leaves((n.args, n.kwargs))
           if isinstance(a, torch.SymInt)]
    assert not raw, raw
    assert tuple(_run_fake(gm, (*lead, 2 * KS), (N, KS), (N // W, 2 * KS)).shape) == (*lead, N)


def _skip(fn, x, **kw):
    gm = _trace(fn, x, **{k: v for k, v in kw.items() if k in ("w", "rows")})
    sites = _sites(gm, **{k: v for k, v in kw.items() if k in ("world", "rank")})
    assert len(sites) == 1
    return sites[0].skip or ""


X = torch.randn(16, 2 * KS, dtype=torch.bfloat16)


def test_structural_skips_name_their_reason():
    assert "not a K-slice" in _skip(lambda x, w, r: _reduce(F.linear(x[..., :KS].contiguous() * 2, w)), X)
    assert "not this rank's K-slice" in _skip(lambda x, w, r: _reduce(F.linear(x[..., 0:KS], w)), X)
    assert "not this rank's K-slice" in _skip(lambda x, w, r: _reduce(F.linear(torch.chunk(x, W, -1)[0], w)), X)
    assert "size 1" in _skip(lambda x, w, r: _reduce(F.linear(x, w)), X, w=torch.randn(N, 2 * KS).bfloat16(),
                             world=1, rank=0)
    assert "bias added inside" in _skip(
        lambda x, w, r: _reduce(F.linear(x[..., RANK * KS:(RANK + 1) * KS], w, r[:, 0])), X,
        rows=torch.randn(N, 2 * KS, dtype=torch.bfloat16))
    assert "dtype mismatch" in _skip(site, X.float(), w=torch.randn(N, KS).bfloat16())
    def leaky(x, w, r):
        y = F.linear(x[..., RANK * KS:], w)
        return _reduce(y) + y.sum()

    assert "used outside the reduce" in _skip(leaky, X)
    assert "not a GEMM output" in _skip(lambda x, w, r: _reduce(x * 2), X)
    assert "not a GEMM output" in _skip(lambda x, w, r: _reduce(x[..., RANK * KS:] + 1), X)
    assert "bias added inside" in _skip(                                  # mm + bias, spelt out
        lambda x, w, r: _reduce(x[..., RANK * KS:(RANK + 1) * KS] @ w.t() + r[:, 0]), X,
        rows=torch.randn(N, 2 * KS, dtype=torch.bfloat16))
    assert "not a GEMM output" in _skip(                                  # two partials summed: not a bias
        lambda x, w, r: _reduce(x[..., RANK * KS:(RANK + 1) * KS] @ w.t() + x[..., :KS] @ w.t()), X)
    assert "not sum" in (lg.find_sites(make_fx(lambda x: c10d.wait_tensor(c10d.all_reduce(x, "max", "g")),
                                               tracing_mode="fake")(X).graph, _info())[0].skip or "")


def test_graph_without_pattern_has_no_sites():
    gm = _trace(lambda x, w, rows: torch.relu(x @ rows.t()), X)
    assert _sites(gm) == []


# --- replication analysis ------------------------------------------------------------------------
def _upstream(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    out = list(gm.graph.find_nodes(op="output"))[0].args[0][0]
    index = {p: i for i, p in enumerate(gm.graph.find_nodes(op="placeholder"))}
    return replication.upstream(out, index)


def test_upstream_leaves_collectives_and_blockers():
    a, b = torch.randn(4, 8), torch.randn(8)
    u = _upstream(lambda x, g: (x * g + 1,), a, b)
    assert u.leaves == (0, 1) and u.proven_groups == () and u.blocker is None
    u = _upstream(lambda x, g: (_reduce(x) * g,), a, b)       # after an all-reduce: only g is a leaf
    assert u.leaves == (1,) and u.proven_groups == ("g",)
    assert "random" in (_upstream(lambda x, g: (x + torch.rand_like(x),), a, b).blocker or "")
    import tpflare  # noqa: F401  (registers torch.ops.tpflare)

    s, i = torch.randn(4, 8), torch.arange(32, dtype=torch.int32).view(4, 8)
    u = _upstream(lambda s, i: (torch.ops.tpflare.select_replicated(s, i, 4, "g", True)[1] * 2,), s, i)
    assert u.leaves == () and u.proven_groups == ("g",)        # selection outputs are replicated
    # a rank-dependent constant changes the fingerprint that ranks compare
    assert _upstream(lambda x, g: (x + 0,), a, b).fingerprint != _upstream(lambda x, g: (x + 1,), a, b).fingerprint


# --- a stack's own all-reduce op: registration is checked where it is made ----------------------
lib = torch.library.Library("tpflare_test_stack", "FRAGMENT")
lib.define("all_reduce(Tensor x, str group_name) -> Tensor")
lib.define("inplace_all_reduce(Tensor(a!) x, str group_name) -> ()")
lib.define("no_group(Tensor x) -> Tensor")
lib.define("int_group(Tensor x, int group_name) -> Tensor")
lib.define("all_gather(Tensor x, int dim, int world_size, str group_name) -> Tensor")
lib.define("bad_gather(Tensor x, str group_name) -> Tensor")
lib.impl("all_reduce", lambda x, g: x.clone(), "Meta")
ops = torch.ops.tpflare_test_stack


@pytest.mark.parametrize("kwargs,needle", [
    (dict(op=ops.no_group), "no argument 'group_name'"),
    (dict(op=ops.int_group), "is int, expected str"),
    (dict(op=ops.all_reduce, inplace=True), "does not mutate its first argument"),
    (dict(op=ops.inplace_all_reduce, inplace=False), "mutates its first argument"),
    (dict(op=ops.all_reduce, all_gather=ops.bad_gather), "expected all_gather(Tensor x, int dim"),
    (dict(op=ops.all_reduce, resolve_group={"tp:0": 3}), "bad entries"),
    (dict(op="all_reduce"), "must be a torch op"),
])
def test_register_all_reduce_rejects_bad_ops_naming_op_and_argument(kwargs, needle):
    with pytest.raises(collectives.RegistrationError) as e:
        collectives.register_all_reduce(**kwargs)
    assert needle in str(e.value)
    assert collectives.registered() == []


def test_registered_stack_op_is_a_reduce_and_an_unresolvable_group_fails_by_name():
    spec = collectives.register_all_reduce(ops.all_reduce, resolve_group={"tp:0": "not-a-c10d-group"},
                                           all_gather=ops.all_gather)
    try:
        assert spec.inplace is False and spec.all_gather == ops.all_gather.default
        gm = make_fx(lambda x: ops.all_reduce(x, "tp:0"), tracing_mode="fake")(X)
        with pytest.raises(ValueError) as e:
            collectives.find_reduces(gm.graph)
        msg = str(e.value)
        assert "tpflare_test_stack.all_reduce" in msg and "group_name='tp:0'" in msg and "not-a-c10d-group" in msg
        gm = make_fx(lambda x: ops.all_reduce(x, "tp:9"), tracing_mode="fake")(X)
        with pytest.raises(ValueError, match="no such group in the registered mapping"):
            collectives.find_reduces(gm.graph)
    finally:
        collectives.unregister_all_reduce(ops.all_reduce)
    assert collectives.register_all_reduce(ops.inplace_all_reduce).inplace is True
    collectives.unregister_all_reduce(ops.inplace_all_reduce)


# --- the sticky skip: what an earlier compile of a frame found, and how the ranks agree on it -------
def test_a_pair_found_unreplicated_applies_to_later_compiles_of_its_frame_only():
    from tpflare import latent_history as lh

    lh.clear()
    try:
        first, later = lh.Frame("frame 0 (f)", 0), lh.Frame("frame 0 (f)", 1)
        lh.remember(first, "L['c']", ["L['x']"])
        assert lh.found_earlier(first, "L['c']", ["L['x']"]) is None       # the compile that found it
        assert lh.found_earlier(later, "L['c']", ["L['x']", "L['x'].size()[0]"]) == "L['x']"
        assert lh.found_earlier(later, "L['d']", ["L['x']"]) is None       # another site
        assert lh.found_earlier(lh.Frame("frame 1 (g)", 1), "L['c']", ["L['x']"]) is None   # another frame
        lh.remember(lh.Frame("frame 0 (f)", 3), "L['d']", ["L['x']"])
        assert lh.found_earlier(later, "L['d']", ["L['x']"]) is None       # counter went back: a reset
        assert lh.describe() == []
        lh.remember(lh.Frame(lh.UNKNOWN), "x", ["y"])                         # no compile id: every later graph
        assert lh.found_earlier(lh.Frame(lh.UNKNOWN), "x", ["y"]) == "y"
        import torch._dynamo

        torch.compile(lambda t: t + 1, backend="tpflare")   # Dynamo now resets this backend too
        torch._dynamo.reset()
        assert lh.describe() == []
    finally:
        lh.clear()


def test_one_rank_with_the_sticky_flag_makes_every_rank_skip():
    from tpflare.latent_prep import LatentGatherCompiler

    def rec(sticky):
        return dict(sig=("s",), skip=None, blocker=None, fingerprint=["f"], leaves={3: ("bits", "h")},
                    leaf_names={3: "L['x']"}, rows_hint="64", sticky=sticky)

    everyone = [rec(None), rec("L['x']")]
    for me in everyone:
        why, differing = LatentGatherCompiler._agreed_reason(0, me, [[o] for o in everyone], [0, 1])
        assert why.startswith("hidden row not replicated: an earlier compile of this frame found graph input "
                              "L['x'] differing across ranks (on rank 1); kept the all-reduce"), why
        assert differing == []
    other_bits = dict(rec(None), leaves={3: ("bits", "g")})
    why, differing = LatentGatherCompiler._agreed_reason(0, rec(None), [[rec(None)], [other_bits]], [0, 1])
    assert "graph input L['x'] differs across ranks" in why and differing == ["L['x']"]
    assert LatentGatherCompiler._agreed_reason(0, rec(None), [[rec(None)], [rec(None)]], [0, 1]) == (None, [])


def test_rewrites_are_remembered_for_later_compiles_of_their_frame_and_warned_once():
    from tpflare import latent_history as lh

    lh.clear()
    try:
        first, later = lh.Frame("frame 0 (f)", 0), lh.Frame("frame 0 (f)", 1)
        lh.remember_rewrite(first, "L['c']", ["L['x']"])
        lh.remember_rewrite(first, "L['e']", [])                            # proven by a collective: nothing
        assert not lh.rewrote_earlier(first, "L['c']", ["L['x']"])           # the compile that rewrote it
        assert lh.rewrote_earlier(later, "L['c']", ["L['x']", "L['x'].size()[0]"])
        assert not lh.rewrote_earlier(later, "L['c']", ["L['y']"])           # another site of the same weight
        assert not lh.rewrote_earlier(later, "L['d']", ["L['x']"])           # another weight
        assert not lh.rewrote_earlier(lh.Frame("frame 1 (g)", 1), "L['c']", ["L['x']"])   # another frame
        assert lh.describe() == []                                           # rewrites are not sticky skips
        assert not lh.warned(later, "L['c']")
        lh.mark_warned(later, "L['c']")
        assert lh.warned(later, "L['c']") and not lh.warned(later, "L['d']")
        assert [(d["weight"], d["input"], d["compile_index"], d["warned"]) for d in lh.describe_rewrites()] == \
            [("L['c']", "L['x']", 0, True)]
        lh.remember_rewrite(lh.Frame("frame 2 (h)", 2), "w", ["x"])
        assert not lh.rewrote_earlier(lh.Frame("frame 2 (h)", 1), "w", ["x"])   # counter went back: a reset
        assert [d["frame"] for d in lh.describe_rewrites()] == ["frame 0 (f)"]
        lh.remember_rewrite(lh.Frame(lh.UNKNOWN), "x", ["y"])                  # no compile id: every later graph
        assert lh.rewrote_earlier(lh.Frame(lh.UNKNOWN), "x", ["y"])
        lh.clear()
        assert lh.describe_rewrites() == [] and not lh.warned(later, "L['c']")
    finally:
        lh.clear()


def test_one_rank_that_saw_the_rewrite_makes_every_rank_warn_once(caplog):
    """The earlier-rewrite mark and the warning come from every rank's record (one rank that has the
    flag is enough), and one rank that warned already keeps every rank quiet."""
    from tpflare import latent_history as lh
    from tpflare.latent_prep import EARLIER_REWRITE, LatentGatherCompiler

    lh.clear()
    compiler = object.__new__(LatentGatherCompiler)        # the agreement only: no graph, no inputs
    compiler._frame, compiler._warned = lh.Frame("frame 0 (f)", 1), set()
    rec = dict(weight_name="L['c']", rewrote_earlier=False, rewrite_warned=False)
    try:
        with caplog.at_level("WARNING", logger="tpflare.latent_gather"):
            assert compiler._not_replicated(0, rec, ["L['x']"], [[rec], [rec]], "g:s") == ("", {})
            assert caplog.messages == []
            seen = [[rec], [dict(rec, rewrote_earlier=True)]]                  # only rank 1 saw the rewrite
            assert compiler._not_replicated(0, rec, ["L['x']"], seen, "g:s") == \
                (EARLIER_REWRITE, {"earlier_rewrite": True})
            [msg] = caplog.messages
            assert "graph input L['x'] at the site of L['c'] (site g:s, frame 0 (f))" in msg, msg
            assert lh.warned(compiler._frame, "L['c']")
            compiler._warned = set()                                           # a later compile, say
            quiet = [[dict(rec, rewrote_earlier=True)], [dict(rec, rewrite_warned=True)]]
            assert compiler._not_replicated(0, rec, ["L['x']"], quiet, "g:s")[1] == {"earlier_rewrite": True}
            assert len(caplog.messages) == 1                                   # rank 1 warned already
        assert lh.found_earlier(lh.Frame("frame 0 (f)", 2), "L['c']", ["L['x']"]) == "L['x']"
    finally:
        lh.clear()
