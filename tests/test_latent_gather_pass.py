"""Pass-level tests of the latent-gather rewrite on traced ATen graphs (no processes)."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from tpflare.passes import latent_gather as lg
from tpflare.passes.manager import TpflarePostGradPass

c10d = torch.ops._c10d_functional
aten = torch.ops.aten

W, RANK, KS, N = 2, 1, 8, 128          # K = 16, this rank's K-slice is [8:16]


def _reduce(y):
    return c10d.wait_tensor(c10d.all_reduce(y, "sum", "g"))


def site(x, w, rows):
    y = F.linear(x[..., RANK * KS:(RANK + 1) * KS], w)
    return _reduce(y) + 1


def _trace(fn, x, w=None, rows=None, dtype=torch.bfloat16):
    w = torch.randn(N, KS, dtype=dtype) if w is None else w
    rows = torch.randn(N // W, KS * W, dtype=dtype) if rows is None else rows
    return make_fx(fn, tracing_mode="fake")(x, w, rows)


def _plan(**kw):
    base = dict(enabled=True, align=64, min_rows=9, channel_rows=0, rank_in_group={"g": RANK},
                world_of_group={"g": W}, rows_for_input={1: lg.RowSource(2, "", "registered", 0)})
    base.update(kw)
    return lg.LatentGatherPlan(**base)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("shape", [(16, 2 * KS), (2, 8, 2 * KS)], ids=["mm", "3d"])
def test_rewrites_matched_site(shape):
    gm = _trace(site, torch.randn(*shape, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert [r["decision"] for r in recs] == ["rewritten"], recs
    t = _targets(gm)
    assert c10d.all_reduce.default not in t and aten.slice.Tensor not in t   # K-slice copy gone
    assert t.count(c10d.all_gather_into_tensor.default) == 1
    mm = next(n for n in gm.graph.nodes if n.target == aten.mm.default)
    assert mm.args[0].name == "rows_1"                          # full-K GEMM with the row shard
    ag = next(n for n in gm.graph.nodes if n.target == c10d.all_gather_into_tensor.default)
    assert ag.args[1:] == (W, "g")
    gm.recompile()
    # the rewritten graph still produces the shape the model expects
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = gm(torch.empty(*shape, dtype=torch.bfloat16), torch.empty(N, KS, dtype=torch.bfloat16),
                 torch.empty(N // W, 2 * KS, dtype=torch.bfloat16))
    assert tuple(out.shape) == shape[:-1] + (N,)


def test_channel_rows_chunks_the_gather():
    gm = _trace(site, torch.randn(40, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan(channel_rows=16))
    assert recs[0]["decision"] == "rewritten" and recs[0]["chunks"] == 3
    assert _targets(gm).count(c10d.all_gather_into_tensor.default) == 3


@pytest.mark.parametrize("plan_kw,x_rows,reason", [
    (dict(enabled=False), 16, "knob off"),
    (dict(align=128), 16, "width"),
    (dict(min_rows=9), 8, "rows"),
    (dict(rows_for_input={}), 16, "no row shard"),
    (dict(rows_for_input={1: lg.RowSource(None, "not registered and TPFLARE_LATENT_GATHER_RESHARD=never")}),
     16, "RESHARD=never"),
    (dict(world_of_group={"g": 1}, rank_in_group={"g": 0}), 16, "size 1"),
    (dict(rank_in_group={"g": 0}), 16, "not this rank's K-slice"),
])
def test_gates_skip_with_reason(plan_kw, x_rows, reason):
    gm = _trace(site, torch.randn(x_rows, 2 * KS, dtype=torch.bfloat16))
    before = str(gm.graph)
    recs = lg.run(gm.graph, _plan(**plan_kw))
    assert len(recs) == 1 and recs[0]["decision"] == "skipped"
    assert reason in recs[0]["reason"], recs[0]
    assert str(gm.graph) == before


def test_group_of_size_one_skipped():
    def one(x, w, rows):
        return _reduce(F.linear(x[..., 0:2 * KS], w))

    gm = _trace(one, torch.randn(16, 2 * KS, dtype=torch.bfloat16), w=torch.randn(N, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan(world_of_group={"g": 1}, rank_in_group={"g": 0}))
    assert recs[0]["decision"] == "skipped" and "size 1" in recs[0]["reason"]


def test_not_replicated_input_skipped():
    def sharded_input(x, w, rows):                 # x is already this rank's K-shard: no slice
        return _reduce(F.linear(x, w))

    gm = _trace(sharded_input, torch.randn(16, KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert recs[0]["decision"] == "skipped" and "not replicated input" in recs[0]["reason"]


def test_wrong_slice_offset_skipped():
    def other_rank(x, w, rows):                    # rank 1 slicing rank 0's columns
        return _reduce(F.linear(x[..., 0:KS], w))

    gm = _trace(other_rank, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert "not this rank's K-slice" in recs[0]["reason"]


def test_bias_inside_partial_skipped_and_bias_after_kept_once():
    def biased(x, w, rows):                        # bias inside: the model adds it W times
        return _reduce(F.linear(x[..., RANK * KS:(RANK + 1) * KS], w, rows[:, 0]))

    gm = _trace(biased, torch.randn(16, 2 * KS, dtype=torch.bfloat16),
                rows=torch.randn(N, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan(rows_for_input={}))
    assert "bias" in recs[0]["reason"]

    def bias_after(x, w, rows):
        return _reduce(F.linear(x[..., RANK * KS:(RANK + 1) * KS], w)) + w[:, 0]

    gm = _trace(bias_after, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert recs[0]["decision"] == "rewritten"
    assert _targets(gm).count(aten.add.Tensor) == 1


def test_dtype_mismatch_skipped():
    gm = _trace(site, torch.randn(16, 2 * KS, dtype=torch.float32), w=torch.randn(N, KS, dtype=torch.bfloat16),
                rows=torch.randn(N // W, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert "dtype" in recs[0]["reason"]


def test_wrong_row_shard_shape_skipped_with_expected_shape():
    gm = _trace(site, torch.randn(16, 2 * KS, dtype=torch.bfloat16),
                rows=torch.randn(N, KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert recs[0]["decision"] == "skipped" and "expected (64, 16)" in recs[0]["reason"]


def test_partial_used_elsewhere_skipped():
    def leaky(x, w, rows):
        y = F.linear(x[..., RANK * KS:(RANK + 1) * KS], w)
        return _reduce(y) + y.sum()

    gm = _trace(leaky, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert "partial product is used outside" in recs[0]["reason"]


def test_graph_without_pattern_unchanged():
    def plain(x, w, rows):
        return torch.relu(x @ rows.t())

    gm = _trace(plain, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    before = str(gm.graph)
    assert lg.run(gm.graph, _plan()) == []
    assert str(gm.graph) == before


def test_uuid_changes_with_knobs_and_plan():
    a = TpflarePostGradPass(_plan(), "k1").uuid()
    assert a == TpflarePostGradPass(_plan(), "k1").uuid()
    assert a != TpflarePostGradPass(_plan(), "k2").uuid()             # other decision knobs
    assert a != TpflarePostGradPass(_plan(enabled=False), "k1").uuid()
    assert a != TpflarePostGradPass(_plan(rows_for_input={}), "k1").uuid()
    assert a != TpflarePostGradPass(_plan(rank_in_group={"g": 0}), "k1").uuid()


def test_uuid_of_unhashable_chained_pass_bypasses_cache():
    assert TpflarePostGradPass(_plan(), "k", chained=lambda g: None).uuid() is None


def test_open_ended_slice_of_last_rank_matches():
    def last_rank(x, w, rows):                    # x[..., 8:] is rank 1's K-slice
        return _reduce(F.linear(x[..., RANK * KS:], w))

    gm = _trace(last_rank, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    assert [r["decision"] for r in lg.run(gm.graph, _plan())] == ["rewritten"]


@pytest.mark.parametrize("form", ["narrow", "chunk", "split", "index_select"])
def test_k_slice_spellings(form):
    def sliced(x):
        if form == "narrow":
            return x.narrow(-1, RANK * KS, KS)
        if form == "chunk":
            return torch.chunk(x, W, -1)[RANK]
        if form == "split":
            return torch.split(x, [KS, KS], dim=-1)[RANK]
        return x.index_select(-1, torch.arange(RANK * KS, (RANK + 1) * KS))

    def fn(x, w, rows):
        return _reduce(F.linear(sliced(x), w))

    gm = _trace(fn, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    recs = lg.run(gm.graph, _plan())
    assert [r["decision"] for r in recs] == ["rewritten"], recs
    t = _targets(gm)
    assert not {aten.split.Tensor, aten.split_with_sizes.default, aten.index_select.default,
                aten.slice.Tensor} & set(t), t                  # the K-slice copy is gone
    gm.recompile()


def test_chunk_of_another_rank_is_not_replicated_input():
    def fn(x, w, rows):
        return _reduce(F.linear(torch.chunk(x, W, -1)[0], w))   # rank 1 using rank 0's chunk

    gm = _trace(fn, torch.randn(16, 2 * KS, dtype=torch.bfloat16))
    assert "not this rank's K-slice" in lg.run(gm.graph, _plan())[0]["reason"]
