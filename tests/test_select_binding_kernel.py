"""The ordered-selection kernel is decided at preparation and bound into the graph (CPU, in CI).

``bind_select_sites`` resolves ``TPFLARE_SELECT_KERNEL`` for the site and appends it to the
bound op's arguments (like the id-replication plan), so the compiled graph keeps it: a knob
changed after compilation changes nothing at replay.
"""
from __future__ import annotations

import pytest
import torch
from torch import fx

import tpflare
from tpflare import race
from tpflare.ops import ordering
from tpflare.passes import select_binding


def _graph(q: int, c: int, k: int, symbolic: bool = False, sites: int = 1, symbolic_rows: bool = False) -> fx.GraphModule:
    g = fx.Graph()
    s, i = g.placeholder("s"), g.placeholder("i")
    s.meta["example_value"] = torch.empty(q, c) if not symbolic else None
    if symbolic_rows:  # a fake tensor whose row count is a SymInt, its candidates static
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        mode = FakeTensorMode(shape_env=ShapeEnv())
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
        s.meta["example_value"] = mode.from_tensor(torch.empty(q, c), symbolic_context=ctx)
        assert not isinstance(s.meta["example_value"].shape[0], int)
    outs = [g.call_function(torch.ops.tpflare.select.default, (s, i, k, "0", True)) for _ in range(sites)]
    g.output(tuple(g.call_function(lambda t: t[0], (n,)) for n in outs))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.fixture
def fake_cuda_group(monkeypatch):
    """A one-rank group on a device the resolver treats as CUDA with Triton available."""
    monkeypatch.setattr(race, "group_size", lambda g: 1)
    monkeypatch.setattr(race, "group_ranks", lambda g: [0])
    monkeypatch.setattr(select_binding, "device_of_backend", lambda g: torch.device("cuda", 0))
    seen = []

    def resolve(choice, device, n, k):
        seen.append((choice, torch.device(device).type, n, k))
        return "torch" if choice == "torch" else "triton"

    monkeypatch.setattr(ordering, "resolve_kernel", resolve)
    return seen


@pytest.mark.parametrize("knob, bound", [("auto", "triton"), ("triton", "triton"), ("torch", "torch")])
@pytest.mark.parametrize("select, target, plan", [("replicated", "select_replicated", ()),
                                                  ("owner", "select_owner", ("allgather",))])
def test_forced_site_binds_the_resolved_kernel(fake_cuda_group, knob, bound, select, target, plan):
    gm = _graph(4, 64, 16)
    settings = tpflare.config.resolve({"TPFLARE_SELECT": select, "TPFLARE_SELECT_KERNEL": knob,
                                       "TPFLARE_SELECT_ID_REPLICATION": "allgather"})
    (d,) = select_binding.bind_select_sites(gm, [], settings, graph_id="g")
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "tpflare" in str(n.target)]
    assert node.target == getattr(torch.ops.tpflare, target).default
    assert node.args[4:] == (True,) + plan + (bound,)
    assert fake_cuda_group == [(knob, "cuda", 64, 16)]  # resolved once, for the site's rows of W*C
    # the graph carries the decision: the knob changing later is not read
    with tpflare.config.patch(select_kernel="torch" if bound == "triton" else "triton"):
        assert node.args[-1] == bound
    assert f"'{bound}'" in gm.code  # the regenerated code passes it as a constant


def test_dynamic_site_binds_the_knob_value(fake_cuda_group, caplog, monkeypatch):
    monkeypatch.setattr(select_binding, "_warned_symbolic", False)
    settings = tpflare.config.resolve({"TPFLARE_SELECT_KERNEL": "auto"})
    with caplog.at_level("WARNING", logger="tpflare.passes.select_binding"):
        for graph_id in ("g0", "g1"):
            gm = _graph(4, 64, 16, symbolic=True)
            assert select_binding.bind_select_sites(gm, [], settings, graph_id=graph_id) == []
            (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "tpflare" in str(n.target)]
            assert node.target == torch.ops.tpflare.select_replicated.default
            assert node.args[4:] == (True, "auto")
            assert "select_replicated" in gm.code  # the code runs what the graph says
    # the user is told once how to get the race back, not once a graph
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "g0:" in warned[0] and "dynamic=False" in warned[0], warned
    monkeypatch.setattr(select_binding, "_warned_symbolic", False)
    gm = _graph(4, 64, 16)  # a static site warns nothing
    forced = tpflare.config.resolve({"TPFLARE_SELECT": "replicated"})
    select_binding.bind_select_sites(gm, [], forced, graph_id="g2")
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def _eager_kernel_argument(rank, world):
    import tpflare
    from tpflare.ops import select as sel

    seen = []
    real = sel.ordered_select

    def spy(scores, ids, k, *, kernel):
        seen.append(kernel)
        return real(scores, ids, k, kernel=kernel)

    sel.ordered_select = spy
    s, i = torch.randn(2, 8), torch.arange(16, dtype=torch.int32).view(2, 8)
    with tpflare.config.patch(select_kernel="triton"):
        a = tpflare.select_topk(s, i, 3)                              # eager: the knob
    b = tpflare.select_topk(s, i, 3, select_kernel="auto")            # explicit
    torch.library.opcheck(torch.ops.tpflare.select_replicated, (s, i, 3, "0", True, "triton"))
    torch.library.opcheck(torch.ops.tpflare.select_owner, (s, i, 3, "0", True, "bf16", "auto"))
    with pytest.raises(ValueError, match="kernel='fast'"):
        torch.ops.tpflare.select_replicated(s, i, 3, "0", True, "fast")
    return seen[:2], torch.equal(a, b)


@pytest.mark.multiproc
def test_eager_select_topk_passes_the_knob_or_the_argument():
    from tpflare.testing import run_ranks

    ((seen, same),) = run_ranks(_eager_kernel_argument, 1)
    assert seen == ["triton", "auto"] and same  # CPU tensors: both run the torch path


def _fake_decide(calls):
    """race.decide standing in: owner/bf16 up to 4 rows, replicated beyond (no collectives)."""
    def decide(q, c, k, group_name, with_scores, device, settings, site=""):
        calls.append((q, c, k, site))
        comps = {cm.name: cm for cm in race.compositions(settings, race.site_kernel(settings, c, k, group_name, device))}
        return race.Decision(comps["owner/bf16" if q <= 4 else "replicated"], "race", key=f"k{q}")
    return decide


def test_symbolic_rows_bind_a_table_decided_at_each_row_count(fake_cuda_group, monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(race, "decide", _fake_decide(calls))
    monkeypatch.setattr(select_binding, "_warned_symbolic", False)
    settings = tpflare.config.resolve({"TPFLARE_SELECT_ROWS": "1,4,64", "TPFLARE_SELECT_KERNEL": "auto"})
    gm = _graph(8, 64, 16, sites=2, symbolic_rows=True)
    with caplog.at_level("WARNING", logger="tpflare.passes.select_binding"):
        decisions = select_binding.bind_select_sites(gm, [], settings, graph_id="g")
    # one decision a row count, shared by both sites (same C, k, group, with_scores)
    assert [c[0] for c in calls] == [1, 4, 64] and len(decisions) == 3
    assert all(c[3].startswith("g:") and "@rows=" in c[3] for c in calls)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and "tpflare" in str(n.target)]
    assert len(nodes) == 2
    for node in nodes:
        assert node.target == torch.ops.tpflare.select_by_rows.default
        assert node.args[4:] == (True, [1, 4, 64], "owner/bf16,owner/bf16,replicated", "triton")
    assert gm.code.count("select_by_rows") == 2
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # a race is no warning


@pytest.mark.parametrize("knobs, target, tail", [
    ({"TPFLARE_SELECT": "owner", "TPFLARE_SELECT_ID_REPLICATION": "bf16"}, "select_owner", ("bf16", "triton")),
    ({"TPFLARE_SELECT_ROWS": ""}, "select_replicated", ("triton",)),
], ids=["forced", "no_rows"])
def test_symbolic_rows_forced_or_without_row_counts(fake_cuda_group, monkeypatch, caplog, knobs, target, tail):
    calls = []
    monkeypatch.setattr(race, "decide", _fake_decide(calls))
    monkeypatch.setattr(select_binding, "_warned_symbolic", False)
    gm = _graph(8, 64, 16, symbolic_rows=True)
    with caplog.at_level("WARNING", logger="tpflare.passes.select_binding"):
        select_binding.bind_select_sites(gm, [], tpflare.config.resolve(knobs), graph_id="g")
    assert calls == []
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "tpflare" in str(n.target)]
    assert node.target == getattr(torch.ops.tpflare, target).default  # a forced composition holds under dynamic shapes
    assert node.args[4:] == (True,) + tail and target in gm.code
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == (0 if "TPFLARE_SELECT" in knobs else 1)


@pytest.mark.parametrize("failing", [{64}, {1, 4, 64}], ids=["one_row_count", "every_row_count"])
def test_a_row_count_whose_preparation_fails_is_dropped_from_the_table(fake_cuda_group, monkeypatch, failing):
    """A race whose every composition failed validation on every rank (NoValidComposition, an
    agreed result: e.g. out of memory at that row count in every composition) costs the table that
    row count, not the compile; with none left the site runs the default composition. Any other
    preparation failure (a timeout: another rank may be gone) still fails the compile."""
    from tpflare.errors import NoValidComposition

    calls = []
    decide = _fake_decide(calls)

    def flaky(q, *args, **kw):
        if q in failing:
            raise NoValidComposition(f"tpflare race: no composition passed holdout validation at {q} rows")
        return decide(q, *args, **kw)

    monkeypatch.setattr(race, "decide", flaky)
    monkeypatch.setattr(select_binding, "_warned_symbolic", True)
    tpflare.reporting.clear()
    gm = _graph(8, 64, 16, symbolic_rows=True)
    select_binding.bind_select_sites(gm, [], tpflare.config.resolve({"TPFLARE_SELECT_ROWS": "1,4,64"}), graph_id="g")
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "tpflare" in str(n.target)]
    (rec,) = [r for r in tpflare.reporting.records("select") if r["site"] == f"g:{node.name}"]
    assert "dropped" in rec["reason"] and "64" in rec["reason"]
    if failing == {64}:
        assert node.target == torch.ops.tpflare.select_by_rows.default
        assert node.args[5:7] == ([1, 4], "owner/bf16,owner/bf16") and "select_by_rows" in gm.code
        assert rec["table"] == {1: "owner/bf16", 4: "owner/bf16"}
    else:
        assert node.target == torch.ops.tpflare.select_replicated.default and rec["source"] == "default"


def test_a_row_count_that_times_out_fails_the_compile(fake_cuda_group, monkeypatch):
    from tpflare.errors import PreparationError

    def timeout(q, *args, **kw):
        raise PreparationError("tpflare: 'race timings' timed out after 300s (another rank may be gone)")

    monkeypatch.setattr(race, "decide", timeout)
    gm = _graph(8, 64, 16, symbolic_rows=True)
    with pytest.raises(PreparationError, match="timed out"):
        select_binding.bind_select_sites(gm, [], tpflare.config.resolve({"TPFLARE_SELECT_ROWS": "1,4"}), graph_id="g")
