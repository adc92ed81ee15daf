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
