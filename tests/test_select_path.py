"""Which selection kernel a call gets (CPU: the policy needs neither Triton nor a GPU; the
import itself checks that ``select_kernel`` and ``select_staged`` load without Triton in CI)."""
import pytest

from tpflare.ops import select_kernel as sk


def test_path_policy():
    """The staged path for few rows, and for up to 32 rows of more candidates than the row
    kernel holds in registers; the row kernel beyond."""
    assert sk.choose_path(1, 16384, 2048, 132) == "staged"
    assert sk.choose_path(4, 16384, 2048, 132) == "staged"
    assert sk.choose_path(5, 16384, 2048, 132) == "row"
    assert sk.choose_path(64, 16384, 2048, 132) == "row"
    assert sk.choose_path(32, 32768, 2048, 132) == "staged"
    assert sk.choose_path(33, 32768, 2048, 132) == "row"
    assert sk.choose_path(256, 131072, 2048, 132) == "row"


def test_launch_plans_are_shape_generic():
    """Shapes of one tile class share a plan (one set of compiled kernels); the plan changes
    only where a constexpr does (path, register tile, k's power of two, ordering)."""
    assert sk.launch_plan(1, 16384, 2048) == sk.launch_plan(2, 12000, 1025) == sk.launch_plan(3, 9001, 2048)
    assert sk.launch_plan(20, 9000, 2048) == sk.launch_plan(1000, 16384, 2048)
    assert sk.launch_plan(20, 5000, 2048) == sk.launch_plan(1000, 8192, 2048)  # chunks of 4096
    assert sk.launch_plan(100, 40000, 2048) == sk.launch_plan(4096, 131072, 2048)
    assert sk.launch_plan(1, 16384, 2048) != sk.launch_plan(4, 16384, 2048)  # fused finish up to 3 rows
    assert sk.launch_plan(8, 40000, 2048) != sk.launch_plan(4, 40000, 2048)  # rank ordering up to 4 rows
    assert sk.launch_plan(20, 4096, 2048) != sk.launch_plan(20, 4097, 2048)  # register tiles 4096 / 16384
    assert sk.launch_plan(20, 4096, 2048) != sk.launch_plan(20, 4096, 1024)


def test_row_tiles():
    """The row kernel's tile (block, warps, chunk, in registers) by row length and rows, at the
    H200 crossovers that select_kernel.row_config names."""
    assert sk.launch_plan(8, 8192, 2048)[3:] == (4096, 16, 4096, False)  # 4097..8192 a row: chunks
    assert sk.launch_plan(64, 4097, 2048)[3:] == (4096, 16, 4096, False)
    assert sk.launch_plan(64, 8193, 2048)[3:] == (16384, 16, 4096, True)
    assert sk.launch_plan(128, 4096, 2048)[3:] == (4096, 16, 4096, True)  # up to FEW_ROWS_MAX: 16 warps
    assert sk.launch_plan(129, 4096, 2048)[3:] == (4096, 4, 1024, True)
    assert sk.launch_plan(64, 32768, 2048)[3:] == (4096, 16, 4096, False)
    assert sk.launch_plan(64, 32769, 2048)[3:] == (8192, 32, 8192, False)  # beyond WIDE_MIN_N: 32 warps
    assert sk.launch_plan(64, 131072, 2048)[3:] == (8192, 32, 8192, False)


def test_limits():
    assert sk.supports(131072, 2048) and not sk.supports(131073, 2048) and not sk.supports(16, 2049)


def test_workspace_parts_are_16_byte_aligned():
    """Triton specialises pointer arguments on 16-byte alignment: a workspace part that starts
    4 bytes off for some Q would compile a second kernel for shapes of one launch plan."""
    pytest.importorskip("triton")
    from tpflare.ops.radix import winner_workspace

    for q in (1, 2, 3, 5, 33, 65, 1023):
        for kb, extra in ((2, 7), (4, 1), (2048, 5000)):
            parts = winner_workspace(q, kb, extra, "cpu")
            assert [t.data_ptr() % 16 for t in parts] == [0] * 5, (q, kb, extra)
            assert [t.numel() for t in parts] == [q * kb, q * kb, q * kb, q, q * extra]

