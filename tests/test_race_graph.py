"""The race's trial timing: CUDA-graph replays or eager calls (TPFLARE_RACE_TIMING).

CPU tests cover the knob, the eager default, 'graph' on a CPU device (every rank falls
back to eager and records why) and the capture agreement with a stand-in graph.  The
GPU tests (NCCL, W = every visible GPU) time real graph replays.
"""
import pytest
import torch

from tpflare.config import Config, ConfigError
from test_race import C, K, Q, quick_race_knobs
from tpflare.testing import run_ranks


def test_race_timing_knob():
    from tpflare.race import timing_method

    c = Config()
    assert c.resolve({}).race_timing == "auto"
    assert c.resolve({"TPFLARE_RACE_TIMING": "Graph"}).race_timing == "graph"
    with pytest.raises(ConfigError, match="TPFLARE_RACE_TIMING.*eager"):
        c.resolve({"TPFLARE_RACE_TIMING": "replay"})
    eager = c.resolve({"TPFLARE_RACE_TIMING": "eager"})
    assert eager.decision_hash() != c.resolve({"TPFLARE_RACE_TIMING": "graph"}).decision_hash()
    auto = c.resolve({})
    assert timing_method(auto, torch.device("cpu")) == "eager"
    assert timing_method(auto, torch.device("cuda", 0)) == "graph"
    assert timing_method(eager, torch.device("cuda", 0)) == "eager"


def _decide(rank, world, cache_dir, timing):
    import tpflare
    from tpflare import race

    quick_race_knobs(cache_dir=cache_dir, race_timing=timing)
    d = race.decide(Q, C, K, "0", False, torch.device("cpu"), tpflare.config.resolve(), site="t")
    return dict(name=d.composition.name, timings=d.timings, why=d.why, report=tpflare.format_report())


@pytest.mark.multiproc
def test_cpu_auto_times_eagerly(tmp_path):
    for r in run_ranks(_decide, 2, args=(str(tmp_path), "auto"), timeout=120):
        assert all(t["timing"] == "eager" and "graph_fallback" not in t for t in r["timings"].values())
        assert "eager timing" in r["why"] and "'timing': 'eager'" in r["report"]


@pytest.mark.multiproc
def test_graph_on_cpu_falls_back_to_eager_on_every_rank(tmp_path):
    res = run_ranks(_decide, 2, args=(str(tmp_path), "graph"), timeout=120)
    assert len({r["name"] for r in res}) == 1
    for r in res:
        assert len(r["timings"]) == 3
        for t in r["timings"].values():
            assert t["timing"] == "eager" and t["max_rank_ms"] > 0
            assert "rank 0: RuntimeError: CUDA-graph timing needs a CUDA device" in t["graph_fallback"]
            assert "rank 1: " in t["graph_fallback"]
        assert "graph_fallback" in r["report"]


class _StandInGraph:
    """A 'graph' whose replay is the eager call: the capture agreement without a GPU."""

    def __init__(self, call):
        self.replay, self.resets = call, 0

    def reset(self):
        self.resets += 1


def _one_rank_fails_capture(rank, world, fail_ranks):
    import tpflare
    from tpflare import race

    graphs = []

    def capture(call, device, warmup):
        if rank in fail_ranks:
            raise RuntimeError(f"capture refused on rank {rank}\nsecond line")
        graphs.append(_StandInGraph(call))
        return graphs[-1]

    race._capture = capture
    race.release_graph = lambda g, device: g.reset()
    quick_race_knobs(race_iters=2, race_timing="graph")
    settings = tpflare.config.resolve()
    winner, timings, _, _ = race.run_race(Q, C, K, "0", True, torch.device("cpu"),
                                          race.compositions(settings), settings)
    return winner, timings, [g.resets for g in graphs]


@pytest.mark.multiproc
@pytest.mark.parametrize("fail_ranks", [[], [1], [0, 1]], ids=["none", "rank-1", "all"])
def test_capture_agreement(fail_ranks):
    res = run_ranks(_one_rank_fails_capture, 2, args=(fail_ranks,), timeout=120)
    assert len({winner for winner, _, _ in res}) == 1
    for rank, (_, timings, resets) in enumerate(res):
        assert resets == [1] * (0 if rank in fail_ranks else 3)     # every graph freed once
        for t in timings.values():
            if not fail_ranks:
                assert t["timing"] == "graph" and "graph_fallback" not in t
                continue
            assert t["timing"] == "eager"
            assert t["graph_fallback"] == "capture failed on " + "; ".join(
                f"rank {r}: RuntimeError: capture refused on rank {r}" for r in fail_ranks)


# --- GPU (NCCL, one process per visible GPU) ----------------------------------------------------
GQ, GC, GK = 256, 2048, 2048


def _race_on_cuda(rank, world, fail_rank):
    import tpflare
    from tpflare import race
    from tpflare.timing import capture_graph, release_graph

    dev = torch.device("cuda", torch.cuda.current_device())
    tpflare.config.cache = False
    tpflare.config.race_iters = 5
    tpflare.config.race_timing = "graph"
    if rank == fail_rank:               # fail mid-capture, after the composition's collectives
        original = race._capture

        def failing(call, device, warmup):
            def call_then_fail():
                out = call()
                if torch.cuda.is_current_stream_capturing():
                    raise RuntimeError("injected capture failure")
                return out
            return original(call_then_fail, device, warmup)

        race._capture = failing
    d = race.decide(GQ, GC, GK, "0", True, dev, tpflare.config.resolve(), site="gpu")
    # the user's own capture of the winner still works after the race, and matches eager
    s, i = race.make_candidates(GQ, GC, rank, world, 3, "holdout", dev)
    outs = []
    graph = capture_graph(lambda: outs.append(d.composition.run(s, i, GK, "0", True)), 1)
    for t in outs[-1]:
        t.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    expected = d.composition.run(s, i, GK, "0", True)
    same = race.same_selection(*outs[-1], *expected)
    outs.clear()
    release_graph(graph)
    return dict(name=d.composition.name, timings=d.timings, memory=d.validation["_memory"], same=same)


@pytest.mark.gpu
@pytest.mark.multiproc
@pytest.mark.parametrize("last_rank_fails", [False, True], ids=["all-capture", "last-rank-fails"])
def test_race_times_graph_replays_on_cuda(last_rank_fails):
    world = torch.cuda.device_count()
    fail = world - 1 if last_rank_fails else None
    res = run_ranks(_race_on_cuda, world, args=(fail,), backend="nccl", timeout=400,
                    env={"NCCL_NVLS_ENABLE": "0"})
    assert len({r["name"] for r in res}) == 1
    for r in res:
        assert r["same"] and len(r["timings"]) == 3
        grown = r["memory"]["allocated_after"] - r["memory"]["allocated_before"]
        assert grown < 2**20, f"the race kept {grown} bytes allocated"     # graphs and trials freed
        for t in r["timings"].values():
            if fail is None:
                assert t["timing"] == "graph" and "graph_fallback" not in t
            else:
                assert t["timing"] == "eager"
                assert f"rank {fail}: RuntimeError: injected capture failure" in t["graph_fallback"]
        print({n: (t["max_rank_ms"], t["timing"]) for n, t in r["timings"].items()})
