"""The compile-time agreement across ranks (``plugin/distributed.check_compile_agrees``): inputs
that Dynamo specialised differently on some rank (here a storage offset equal to a size on one
rank only, which duck sizing turns into a shared symbol) are reported on every rank, since a later
call may recompile there alone; torch's guard collectives, which the warning names, then keep the
ranks together. Real gloo processes, against a float64 reference."""
import pytest
import torch

from tpflare.testing import run_ranks


def _scenario(rank, world):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import tpflare

    def f(x):
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD)

    def rows(q, offset):  # a rank's q values, a view at ``offset`` into a longer buffer
        base = torch.arange(offset + q, dtype=torch.float32) + 10 * rank
        return base[offset:offset + q]

    def want(q, offsets):  # float64, every rank's view summed
        return sum(2 * (torch.arange(o, o + q, dtype=torch.float64) + 10 * r) for r, o in enumerate(offsets))

    out = {}
    torch._dynamo.reset()
    tpflare.clear_report()
    cf = torch.compile(f, backend="tpflare", dynamic=True)
    x = rows(3, 0).clone()  # the same sizes, strides and offset on every rank
    out["same_ok"] = torch.equal(cf(x).double(), want(3, [0] * world))
    out["same_records"] = [r for r in tpflare.report() if r["kind"] == "compile"]

    torch.compiler.set_enable_guard_collectives(True)
    torch._dynamo.reset()
    tpflare.clear_report()
    cf = torch.compile(f, backend="tpflare", dynamic=True)
    # rank 0 at offset 0; rank 1 at offset 3, equal to its size: duck sizing gives both one
    # symbol, so rank 1's guard holds only while the size stays 3
    offset, offsets = 3 * rank, [3 * r for r in range(world)]
    out["first_ok"] = torch.equal(cf(rows(3, offset)).double(), want(3, offsets))
    out["warned"] = [r for r in tpflare.report() if r["kind"] == "compile"]
    # a second size: rank 1's guard fails, rank 0's holds; the guard collective recompiles both
    out["second_ok"] = torch.equal(cf(rows(5, offset)).double(), want(5, offsets))
    torch.compiler.set_enable_guard_collectives(False)
    return out


def test_inputs_specialised_differently_across_ranks_are_reported_and_guard_collectives_keep_ranks_together():
    if not hasattr(torch.compiler, "set_enable_guard_collectives"):
        pytest.skip("this torch has no guard collectives")
    res = run_ranks(_scenario, 2, timeout=240)
    for rank, r in enumerate(res):
        assert r["same_ok"] and r["first_ok"] and r["second_ok"], (rank, r)
        assert r["same_records"] == [], (rank, r["same_records"])
        assert len(r["warned"]) == 1, (rank, r["warned"])
        reason = r["warned"][0]["reason"]
        assert "input 0" in reason and "rank 0" in reason and "rank 1" in reason and "offset" in reason, reason
        assert "set_enable_guard_collectives" in r["warned"][0]["advice"]
