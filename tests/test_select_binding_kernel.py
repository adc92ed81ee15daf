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


def _graph(q: int, c: int, k: int, symbolic: bool = False) -> fx.GraphModule:
    g = fx.Graph()
    s, i = g.placeholder("s"), g.placeholder("i")
    s.meta["example_value"] = torch.empty(q, c) if not symbolic else None
    node = g.call_function(torch.ops.tpflare.select.default, (s, i, k, "0", True))
    g.output((g.call_function(lambda t: t[0], (node,)),))
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
