"""column_gather / reshard_rows across real gloo processes, against plain torch."""
import pytest
import torch

from tpflare.testing import run_ranks

pytestmark = pytest.mark.multiproc


def _gather_and_reshard(rank, world):
    import torch.distributed as dist

    import tpflare
    from tpflare.distributed import group_name_of

    g = group_name_of(None)
    torch.manual_seed(0)
    m, n, k = 5, 3 * world, 4 * world
    full = torch.randn(m, n * world, dtype=torch.bfloat16)          # same on every rank
    mine = full[:, rank * n:(rank + 1) * n]
    out = torch.ops.tpflare.column_gather(mine.contiguous(), world, g)
    # a transposed input (what the rewrite produces) goes through without a copy
    out_t = torch.ops.tpflare.column_gather(mine.t().contiguous().t(), world, g)
    w = torch.randn(n * world, k, dtype=torch.float32)               # full weight [N, K]
    kw = k // world
    w_col = w[:, rank * kw:(rank + 1) * kw].contiguous()
    rows = torch.ops.tpflare.reshard_rows(w_col, world, g)
    exp_rows = w[rank * n:(rank + 1) * n]
    bits = out.contiguous().view(torch.int16).to(torch.int32)  # gloo has no int16
    allbits = [torch.empty_like(bits) for _ in range(world)]
    dist.all_gather(allbits, bits)
    return dict(
        gather_ok=torch.equal(out, full), gather_t_ok=torch.equal(out_t, full),
        stride=out.stride(), rows_ok=torch.equal(rows, exp_rows),
        same_bits=all(torch.equal(allbits[0], b) for b in allbits),
    )


@pytest.mark.parametrize("world", [2, 3, 4])  # (3: blocks of a world that is no power of two)
def test_column_gather_and_reshard(world):
    res = run_ranks(_gather_and_reshard, world, timeout=120)
    for r in res:
        assert r["gather_ok"] and r["gather_t_ok"] and r["rows_ok"] and r["same_bits"], r
        assert r["stride"] == (1, 5)  # column-major view: no layout copy


def test_fake_impls_opcheck_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tpflare  # noqa: F401

    with FakeTensorMode():
        x = torch.empty(7, 4, dtype=torch.bfloat16)
        y = torch.ops.tpflare.column_gather(x, 4, "fake")
        assert y.shape == (7, 16) and y.stride() == (1, 7) and y.dtype == torch.bfloat16
        w = torch.empty(16, 3)
        r = torch.ops.tpflare.reshard_rows(w, 4, "fake")
        assert r.shape == (4, 12)
