"""Agreed preparation collectives: shared failures and timeouts instead of hangs."""
import pytest

from tpflare.testing import run_ranks

pytestmark = pytest.mark.multiproc


def _one_rank_fails_one_absent(rank, world):
    from tpflare.distributed import agree
    from tpflare.errors import PreparationError

    out = {}

    def local():
        if rank == 1:
            raise ValueError("bad weight on rank 1")
        return rank

    try:
        agree("shared failure", local, timeout_s=5)
    except PreparationError as e:
        out["shared"] = str(e)
    if rank == 0:                     # rank 1 never arrives at this step
        try:
            agree("lonely step", rank, timeout_s=5)
        except PreparationError as e:
            out["timeout"] = str(e)
    return out


def test_failures_are_shared_and_absent_ranks_time_out():
    res = run_ranks(_one_rank_fails_one_absent, 2, timeout=90)
    for r in res:
        assert "failed on rank 1: ValueError: bad weight on rank 1" in r["shared"]
    assert "timed out after 5s" in res[0]["timeout"] and "lonely step" in res[0]["timeout"]


def _env_and_trace(rank, world, key):
    import os

    from tpflare.observe import trace

    trace({"kind": "probe", "rank": rank})  # a file under TORCH_TRACE where torch saw it at import
    return os.environ.get(key)


def test_ranks_see_the_callers_environment_at_each_call(tmp_path, monkeypatch):
    """Ranks start from a server that imported torch (``run_ranks``' forkserver): each call's
    ranks still see the caller's environment at that call, and a variable that ``import torch``
    reads (TORCH_TRACE) set after the server started takes effect as in a spawned process."""
    from tpflare.observe import read_trace_artifacts

    key = "TPFLARE_TEST_PROBE_VALUE"
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    monkeypatch.delenv(key, raising=False)
    assert run_ranks(_env_and_trace, 2, args=(key,), timeout=90) == [None, None]
    monkeypatch.setenv(key, "later")
    monkeypatch.setenv("TORCH_TRACE", str(tmp_path))
    assert run_ranks(_env_and_trace, 2, args=(key,), timeout=90, env={"OTHER": "1"}) == ["later", "later"]
    probes = [a for a in read_trace_artifacts(str(tmp_path)) if a["name"] == "tpflare_probe"]
    assert sorted(a["payload"]["rank"] for a in probes) == [0, 1]
