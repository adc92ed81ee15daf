"""Which selection kernel a call gets (CPU: the policy needs neither Triton nor a GPU; the
import itself checks that ``select_kernel`` and ``select_staged`` load without Triton in CI)."""
import pytest

from tpflare.ops import select_kernel as sk


@pytest.fixture(autouse=True)
def triton_kernels_only(monkeypatch):
    """The Triton kernels' policy, as where the block path does not run (a CPU machine; NVRTC
    missing): the block path's own is tests/test_select_block.py's."""
    monkeypatch.setattr(sk, "BLOCK_PATH", False)
    sk._first_call_plan.cache_clear()
    yield
    sk._first_call_plan.cache_clear()


def test_path_policy():
    """The staged path for up to 4 rows (whatever their length) and up to 8 rows of 16385..24576
    candidates, the row kernel beyond."""
    assert sk.choose_path(1, 16384, 2048, 132) == "staged"
    assert sk.choose_path(4, 16384, 2048, 132) == "staged"
    assert sk.choose_path(5, 16384, 2048, 132) == "row"
    assert sk.choose_path(8, 16384, 2048, 132) == "row"
    assert sk.choose_path(64, 16384, 2048, 132) == "row"
    assert sk.choose_path(4, 131072, 2048, 132) == "staged"
    assert sk.choose_path(5, 16385, 2048, 132) == "staged"
    assert sk.choose_path(5, 24576, 2048, 132) == "staged"
    assert sk.choose_path(5, 32768, 2048, 132) == "row"
    assert sk.choose_path(8, 24576, 2048, 132) == "staged"
    assert sk.choose_path(9, 24576, 2048, 132) == "row"
    assert sk.choose_path(8, 24577, 2048, 132) == "row"
    assert sk.choose_path(5, 65536, 2048, 132) == "row"
    assert sk.choose_path(5, 131072, 2048, 132) == "row"
    assert sk.choose_path(256, 131072, 2048, 132) == "row"


def test_launch_plans_are_shape_generic():
    """Shapes of one tile class share a plan (one set of compiled kernels); the plan changes
    only where a constexpr or a launch option does (path, register tile, k's power of two,
    ordering, warps)."""
    assert sk.launch_plan(1, 16384, 2048) == sk.launch_plan(2, 12000, 1025) == sk.launch_plan(3, 9001, 2048)
    assert sk.launch_plan(20, 9000, 2048) == sk.launch_plan(1000, 16384, 2048)
    assert sk.launch_plan(20, 5000, 2048) == sk.launch_plan(128, 8192, 2048)  # the 8192 tile, 16 warps
    assert sk.launch_plan(129, 5000, 2048) == sk.launch_plan(1000, 8192, 2048)  # 8 warps, capped registers
    assert sk.launch_plan(9, 40000, 2048) == sk.launch_plan(64, 131072, 2048)  # chunks, sampled cutoff,
    assert sk.launch_plan(65, 16385, 2048) == sk.launch_plan(4096, 32768, 2048)  # its pass spread up to 64 rows
    assert sk.launch_plan(64, 40000, 2048) != sk.launch_plan(65, 40000, 2048)
    assert sk.launch_plan(100, 16385, 2048) != sk.launch_plan(100, 8192, 2048)  # (not at 4097..8192)
    assert sk.launch_plan(1, 16384, 2048) != sk.launch_plan(4, 16384, 2048)  # fused finish up to 3 rows
    assert sk.launch_plan(9, 20000, 2048) != sk.launch_plan(8, 20000, 2048)  # the staged path up to 8 rows here
    assert sk.launch_plan(8, 30000, 2048) != sk.launch_plan(8, 20000, 2048)  # (of up to 24576)
    assert sk.launch_plan(1, 16384, 2048) != sk.launch_plan(1, 16385, 2048)  # the walk's kernel beyond SPREAD_MIN
    assert sk.launch_plan(20, 4096, 2048) != sk.launch_plan(20, 4097, 2048)  # register tiles 4096 / 16384
    assert sk.launch_plan(20, 4096, 2048) != sk.launch_plan(20, 4096, 1024)


def test_row_tiles():
    """The row kernel's tile (block, warps, chunk, in registers, register cap; then the sampled
    cutoff's sample and tile) by row length and rows, at the H200 crossovers that
    select_kernel.row_config names. Rows re-read in chunks beyond RESIDENT_MAX take the sampled
    cutoff, its pass over the row spread over the row's programs up to SPREAD_ROWS_MAX rows
    (spread_pass); beyond FEW_ROWS_MAX rows the 4096 and 8192 tiles take 8 warps of at most 128
    registers a thread (two programs an SM)."""
    s = (sk.SAMPLE, sk.SAMPLE_CAP)
    assert sk.launch_plan(8, 8192, 2048)[3:] == (8192, 16, 4096, True, None, 0, 0, False)  # 4097..8192: the 8192 tile
    assert sk.launch_plan(128, 4097, 2048)[3:] == (8192, 16, 4096, True, None, 0, 0, False)
    assert sk.launch_plan(129, 4097, 2048)[3:] == (8192, 8, 2048, True, 128, 0, 0, False)  # beyond FEW_ROWS_MAX
    assert sk.launch_plan(4096, 8192, 2048)[3:] == (8192, 8, 2048, True, 128, 0, 0, False)
    assert sk.launch_plan(64, 6000, 2048) == sk.launch_plan(64, 8192, 2048) != sk.launch_plan(64, 8193, 2048)
    assert sk.row_config(6000, 64, resident=False) == (4096, 16, 4096, False, None)  # chunks: an option
    assert sk.row_config(6000, 1024, num_warps=16) == (8192, 16, 4096, True, None)  # warps given: no cap
    assert sk.row_config(6000, 1024, maxnreg=96) == (8192, 8, 2048, True, 96)
    with pytest.raises(ValueError):
        sk.row_config(6000, 1024, maxnreg=8)
    assert sk.launch_plan(64, 8193, 2048)[3:] == (16384, 16, 4096, True, None, 0, 0, False)
    assert sk.launch_plan(4096, 16384, 2048)[3:] == (16384, 16, 4096, True, None, 0, 0, False)  # the 16384 tile: 16 warps
    assert sk.launch_plan(128, 4096, 2048)[3:] == (4096, 16, 4096, True, None, 0, 0, False)  # up to FEW_ROWS_MAX: 16 warps
    assert sk.launch_plan(129, 4096, 2048)[3:] == (4096, 8, 2048, True, 128, 0, 0, False)
    assert sk.launch_plan(64, 16385, 2048)[3:] == (4096, 16, 4096, False, None) + s + (True,)
    assert sk.launch_plan(64, 32768, 2048)[3:] == (4096, 16, 4096, False, None) + s + (True,)
    assert sk.launch_plan(1024, 32769, 2048)[3:] == (4096, 16, 4096, False, None) + s + (False,)
    assert sk.launch_plan(64, 131072, 2048)[3:] == (4096, 16, 4096, False, None) + s + (True,)
    assert sk.launch_plan(65, 131072, 2048)[3:] == (4096, 16, 4096, False, None) + s + (False,)
    assert sk.spread_pass(5, True) and not sk.spread_pass(5, False)


def test_refinement_and_finish_tiers():
    """Which cutoff bins a register tile refines on itself (refine_min: the 8192 tile beyond 1024,
    the 16384 tile beyond 4096) and what the finish is compiled for (finish_max: the largest bin
    it sees, 0 for any, i.e. its chunks compiled): the 8192 tile's finish holds every bin it
    sees in registers; the 16384 tile keeps its chunks (its body's register allocation);
    without a refinement the finish sees the whole tile; rows in chunks, any bin."""
    fr1, fr2 = 1024, 4096
    assert sk.refine_min(8192, fr2) == 1024 and sk.refine_min(16384, fr2) == 4096
    assert sk.refine_min(4096, fr2) == 4096  # (no refinement compiled: the tile fits the finish)
    assert sk.finish_max(8192, True, sk.refine_min(8192, fr2), fr2) == fr2
    assert sk.finish_max(16384, True, sk.refine_min(16384, fr2), fr2) == 0
    assert sk.finish_max(16384, True, 8192, fr2) == 0
    assert sk.finish_max(8192, True, 8192, fr2) == 8192  # refine >= the tile: none compiled
    assert sk.finish_max(4096, True, 0, fr2) == 4096
    assert sk.finish_max(4096, False, 0, fr2) == 0


def test_sample_config():
    """The sampled cutoff's options: powers of two in 16..16384, rows re-read in chunks only."""
    assert sk.sample_config(20000, False) == (sk.SAMPLE, sk.SAMPLE_CAP)
    assert sk.sample_config(8192, False) == (0, 0) and sk.sample_config(16384, True) == (0, 0)
    assert sk.sample_config(5000, False, 256, 1024) == (256, 1024)
    assert sk.sample_config(40000, False, 0) == (0, 0)
    for bad in (dict(sample=100), dict(sample=32768), dict(cap=8), dict(cap=0), dict(resident=True, sample=256)):
        with pytest.raises(ValueError):
            sk.sample_config(20000, bad.pop("resident", False), bad.get("sample"), bad.get("cap"))


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



def test_staged_rank_layout():
    """Up to RANK_MAX_ROWS rows (the rank ordering) the staged path bins W and ranks a cutoff
    bin of up to rank_play candidates whole: 4096 at one row, halved at two, quartered at 3-4,
    at most 2 KB; a runtime value, so Q = 1..3 keep one launch plan (above). Elsewhere neither;
    an explicit rank_play must be 0 or a power of two, and only with the rank ordering."""
    from tpflare.ops import select_staged as st

    assert st.RANK_MAX_ROWS == 4
    assert [st.rank_layout(q, 2048) for q in (1, 2, 3, 4)] == [(True, 4096), (True, 2048), (True, 1024), (True, 1024)]
    assert st.rank_layout(1, 64) == (True, 128)  # few winners: at most 2 KB ranked whole
    assert st.rank_layout(5, 2048) == (False, 0) == st.rank_layout(1, 2048, "bucket") == st.rank_layout(2, 2048, "sort")
    assert st.rank_layout(8, 2048, "rank") == (True, 512)
    assert st.rank_layout(1, 2048, None, 0) == (True, 0) and st.rank_layout(3, 2048, "rank", 16) == (True, 16)
    for bad in [dict(order="bucket", rank_play=16), dict(rank_play=24), dict(rank_play=-1)]:
        with pytest.raises(ValueError):
            st.rank_layout(1, 2048, bad.get("order"), bad["rank_play"])
    assert st.rank_tile(1, 2048, 132, True) == (8, 256) and st.rank_tile(1, 2048, 132) == (8, 1024)


def test_staged_finish_tiers():
    """The finish's first register tier (FIN_TIERS[0] candidates) is compiled only where a row can
    reach it: not where the rank ordering ranks every cutoff bin of that size whole (rank_play
    at least the tier). A launch plan carries the tiers, so shapes of one plan compile one kernel."""
    from tpflare.ops import select_kernel as sk
    from tpflare.ops import select_staged as st

    t1, t2 = st.FIN_TIERS
    assert st.finish_tiers(True, t1) == (0, t2) == st.finish_tiers(True, 4096)
    assert st.finish_tiers(True, t1 // 2) == (t1, t2) == st.finish_tiers(False, 0) == st.finish_tiers(True, 0)
    assert st.finish_tiers(False, 0, 256) == (256, 256)  # fin_resident below the first tier
    assert [sk.launch_plan(q, 16384, 2048)[-2:] for q in (1, 2, 3, 4)] == [(0, t2)] * 4
    assert st.rank_layout(1, 512) == (True, 1024) and st.rank_layout(2, 512) == (True, 512)
    assert sk.launch_plan(1, 16384, 512)[-2:] == (0, t2)  # rank_play 1024 at one row ...
    assert sk.launch_plan(2, 16384, 512)[-2:] == (t1, t2)  # ... 512 at two: the tier is reached
    # the staged path beyond 4 rows (path="staged"): the bucket ordering, no bin ranked whole
    assert st.finish_tiers(*st.rank_layout(8, 2048)) == (t1, t2)
