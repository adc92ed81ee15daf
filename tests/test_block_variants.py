"""bench/block_variants.py: every variant (and every combination the GPU calls time) still applies
to the shipped module; on the CPU, the combinations run exactly, a slip planted in a variant's own
code fails, and the spread path is exact (the whole CPU suite runs on any variant with
``--block-module``). The sampled keep, shipped since session 30: tests/test_select_block_cpu.py."""
from __future__ import annotations

import os
import re
import sys

import pytest
import torch

import cuda_on_cpu
from block_on_cpu import BlockOnCpu, load_module
from test_select_kernel_gpu import _mass_tie, check_equal, make_case, neginf_cutoff_case, ref_packed, ref_python

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import block_variants  # noqa: E402


def _gpu_call_variants() -> list[str]:
    """The variants the GPU calls time: the script's default and those its usage lines name."""
    with open(os.path.join(ROOT, "bench", "block_variants_gpu.sh")) as f:
        text = f.read()
    names = re.search(r'VARIANTS=\$\{VARIANTS:-"([^"]+)"\}', text).group(1).split()
    return names + [v for m in re.findall(r'#\s+VARIANTS="([^"]+)"', text) for v in m.split()]


def test_every_variant_applies_to_the_shipped_module():
    calls = _gpu_call_variants()
    assert {"digits11+rank_keys+prefetch", "digits11+rank_keys+prefetch+spread"} <= set(calls)
    names = list(block_variants.VARIANTS) + calls + ["match+rank_keys", "digits11+rank_keys+prefetch512"]
    with open(block_variants.SHIPPED) as f:
        shipped = f.read()
    for name in names:
        text = block_variants.module_text(name)
        compile(text, f"{name}.py", "exec")  # (the module's Python still parses)
        assert text != shipped, name
    with pytest.raises(KeyError, match="no variant 'nope'"):
        block_variants.module_text("match+nope")


class _TorchKernel:
    """torch's NVRTC kernel as its launcher checks shared memory (torch.cuda._utils._CudaKernel): a
    launch of 48 KiB or more of dynamic shared memory raises unless ``set_shared_memory_config``
    allowed that much (session 27: an H200 run stopped there; the CPU runner has no such check)."""

    def __init__(self):
        self.func, self.configured, self.launches = object(), 0, []

    def set_shared_memory_config(self, nbytes):
        self.configured = nbytes

    def __call__(self, grid=(1, 1, 1), block=(1, 1, 1), args=None, shared_mem=0, stream=None):
        if shared_mem >= 48 * 1024 and shared_mem > self.configured:
            raise RuntimeError(f"Kernel requires {shared_mem} bytes of shared memory (>= 48KB), but not configured")
        self.launches.append(shared_mem)


def test_every_launch_past_48_kib_is_configured_through_torch(tmp_path, monkeypatch):
    """Every variant's ``block_select`` (and the shipped one), on shapes that launch each of its
    kinds and tiles, through its own ``compile_tile`` with torch's kernel object stood in by one
    that checks shared memory as torch's launcher does: no launch is refused. The variants past
    48 KiB (prefetch's row kind) are among them, so the check has work to do."""
    import contextlib
    monkeypatch.setattr(torch.cuda, "_compile_kernel", lambda src, name: _TorchKernel(), raising=False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    class Driver:
        def cuFuncSetAttribute(self, func, attr, value):  # noqa: N802 (the driver's name)
            return 0
    past = []
    for name in ["shipped"] + sorted(set(block_variants.VARIANTS) | set(_gpu_call_variants())):
        mod = load_module(block_variants.SHIPPED if name == "shipped" else block_variants.write(name, str(tmp_path)))
        mod._driver_library = lambda: Driver
        mod.SAMPLED_MIN_ROWS = 1  # (rows in chunks through the sampled keep too)
        launches = []
        for q, n, k in [(2, 3000, 700), (5, 6000, 2048), (6, 12000, 2048), (2, 40000, 2048), (1, 131072, 2048)]:
            mod.SAMPLED_MIN_ROWS = 2 if n == 40000 else 1 << 30  # (rows in chunks: the sampled keep, and not)
            mod._KERNELS.clear()
            mod.block_select(torch.zeros(q, n), torch.zeros(q, n, dtype=torch.int32), k)
            launches += [nbytes for kern in mod._KERNELS.values() for nbytes in kern.launches]
        assert launches, name
        if max(launches) >= 48 * 1024:
            past.append(name)
    assert "shipped" not in past and {"prefetch", "digits11+rank_keys+prefetch"} <= set(past), past


def test_an_edit_whose_text_moved_raises(tmp_path):
    moved = tmp_path / "select_block.py"
    with open(block_variants.SHIPPED) as f:
        moved.write_text(f.read().replace("atomicAdd(&sm.hist[b], 1);", "atomicAdd(&sm.hist[b], 1u);"))
    with pytest.raises(ValueError, match="variant match: 0 lines of the module hold"):
        block_variants.module_text("match", shipped=str(moved))


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_combined_variant_is_exact_on_the_cpu(tmp_path):
    run = BlockOnCpu(load_module(block_variants.write("match+rank_keys", str(tmp_path))))
    scores, ids = make_case("nandups", 2, 16384, 2048, seed=4)  # the 1024 tile, ids twice
    check_equal(run(scores, ids, 2048, seed=3), ref_packed(scores, ids, 2048), "nandups 16384")
    scores, ids = _mass_tie("equal", 1, 20000, seed=5)  # chunks and their merge, one score
    check_equal(run(scores, ids, 1500, seed=4), ref_packed(scores, ids, 1500), "equal 20000")
    scores, ids = make_case("special", 2, 3000, 700, seed=6)
    check_equal(run(scores, ids, 700, seed=5), ref_python(scores, ids, 700), "special 3000")
    # the row kernel of tiles 1024 and 256; chunks of 1024 (10000 a chunk), their merge in 256
    assert sorted(set(run.launched)) == [(256, "merge"), (256, "row"), (1024, "chunks"), (1024, "row")]


def _variant_module(tmp_path, name: str, slip: tuple[str, str] | None = None):
    """Variant ``name``'s module, loaded; with ``slip`` (good, bad): that text, found once, replaced."""
    text = block_variants.module_text(name)
    if slip is not None:
        good, bad = slip
        assert text.count(good) == 1, f"{name}: the slip's text is not found once"
        text = text.replace(good, bad)
    path = tmp_path / f"{name}{'_slip' if slip else ''}.py"
    path.write_text(text)
    return load_module(str(path))


# a slip planted in a variant's own code (the shipped kernel's slips: test_select_block_cpu.py),
# and a case it breaks: the CPU runner's check fails, so the variants do not pass by default
SLIPS = {
    # the 11-bit bin test one short: the bin whose top offset equals the wanted count is missed
    "digits11": ("if (lo < rem && rem <= hi) {", "if (lo < rem && rem < hi) {", "ties"),
    # equal keys (one id twice) ranked by <=: two winners take one output slot
    "rank_keys": ("          r += sm.wpos[j] < pp ? 1 : 0;", "          r += sm.wpos[j] <= pp ? 1 : 0;", "nandups"),
    # the spread path's rank of a winner above the cutoff bin: equal keys by position with <=
    "spread": ("(kj == kk && __ldg(wpos + row * K + t) < pp)", "(kj == kk && __ldg(wpos + row * K + t) <= pp)", "nandups"),
}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
@pytest.mark.parametrize("variant", list(SLIPS))
def test_a_slip_in_a_variant_fails_on_the_cpu(tmp_path, variant):
    good, bad, kind = SLIPS[variant]
    run = BlockOnCpu(_variant_module(tmp_path, variant, (good, bad)))
    scores, ids = make_case(kind, 2, 3000, 700, seed=8)
    with pytest.raises((AssertionError, RuntimeError)):
        check_equal(run(scores, ids, 700, seed=2), ref_python(scores, ids, 700), f"{variant} slip")


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_spread_is_exact_on_the_cpu(tmp_path):
    """Variant ``spread`` (1-4 rows of one block): winners above the cutoff bin ranked in their
    bins, the bin's own picked and ordered by the finish, pads, against the plain Python sort: NaN
    payloads on duplicate ids, a mass tie, a row of pads only, fewer valid than k, k of 1."""
    run = BlockOnCpu(load_module(block_variants.write("spread", str(tmp_path))))
    cases = [(make_case("nandups", 3, 5000, 2048, seed=2), 2048), (_mass_tie("equal", 2, 9000, seed=3), 1500),
             (make_case("padding", 4, 700, 300, seed=4), 300), (make_case("special", 1, 16384, 1, seed=5), 1)]
    empty = (torch.zeros(2, 300), torch.full((2, 300), -1, dtype=torch.int32))
    cases.append((empty, 50))
    for (scores, ids), k in cases:
        check_equal(run(scores, ids, k, seed=k % 7 + 1), ref_python(scores, ids, k), f"spread q={scores.shape[0]} k={k}")
    assert {kind for _, kind in run.launched} == {"hist", "compact", "finish", "rank"}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_every_path_of_the_all_nvrtc_combination_is_exact_on_the_cpu(tmp_path):
    """``digits11+rank_keys+prefetch+spread``, every variant the spread call would time with the
    shipped kernel: 1-4 rows spread, more rows of one block in prefetching blocks (5 rows of the
    1024 tile, 3 blocks here: a block takes two rows), rows in chunks through the sampled keep, each
    against the plain Python sort."""
    name = "digits11+rank_keys+prefetch+spread"
    mod = load_module(block_variants.write(name, str(tmp_path)))
    mod.SAMPLED_MIN_ROWS = 1
    run = BlockOnCpu(mod)
    for (scores, ids), k in [(make_case("nandups", 2, 9000, 1000, seed=1), 1000),
                             (make_case("ties", 5, 9000, 1000, seed=2), 1000),
                             (make_case("special", 1, 30000, 700, seed=3), 700)]:
        check_equal(run(scores, ids, k, seed=2), ref_python(scores, ids, k), f"{name} q={scores.shape[0]} k={k}")
    assert {kind for _, kind in run.launched} == {"hist", "compact", "finish", "rank", "row", "sample", "keep",
                                                  "chunks_gated", "merge_gated"}


def _prefetch_module(tmp_path, slip=None):
    """Variant ``prefetch`` with every tile prefetching and 2 blocks a launch, so that a block
    selects several rows and the small tiles run the loop too (on a GPU: the 1024 tile, a block
    an SM)."""
    mod = _variant_module(tmp_path, "prefetch", slip)
    mod.PREFETCH_TILES, mod.PREFETCH_BLOCKS = tuple(mod.TILES), 2
    return mod


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_prefetch_is_exact_on_the_cpu(tmp_path):
    """Variant ``prefetch``: a block for several rows, the next row's candidates copied to shared
    memory while it orders this one. Rows that start 16-byte aligned (16-byte copies) and rows
    that do not (4-byte copies: N not a multiple of 4, a view one column in), against the plain
    Python sort, under two schedules (the copies land at the wait, or at random at the issue)."""
    mod = _prefetch_module(tmp_path)
    assert mod.row_blocks(3, 1024, torch.device("cpu")) == 2 and mod.row_blocks(1, 256, torch.device("cpu")) == 1
    run = BlockOnCpu(mod)
    wide = make_case("nandups", 3, 8200, 1000, seed=1)  # the 1024 tile
    view = make_case("ties", 3, 5001, 2048, seed=2)  # the 512 tile, rows one column in
    cases = [(wide, 1000, 0), (wide, 1000, 5), ((view[0][:, 1:], view[1][:, 1:]), 2048, 3),
             (make_case("special", 4, 3001, 700, seed=3), 700, 2), (make_case("padding", 1, 700, 300, seed=4), 300, 1)]
    for (scores, ids), k, seed in cases:
        check_equal(run(scores, ids, k, seed=seed), ref_python(scores, ids, k), f"prefetch {tuple(scores.shape)} k={k}")
    assert {kind for _, kind in run.launched} == {"row"}
    assert mod.row_dyn_bytes(1024, "row") == mod.DYN_BYTES + 8 * 16384 and mod.row_dyn_bytes(1024, "merge") == mod.DYN_BYTES


# slips in the prefetch's order: no barrier between the wait and reading other threads' copies; the
# next row's copy issued before this row's candidates are read
PREFETCH_SLIPS = {
    "no barrier after the wait": ("  cp_async_wait_all();  // this thread's copies of the row; after the barrier, every thread's\n"
                                  "  __syncthreads();\n", "  cp_async_wait_all();\n"),
    "next copy before the reads": (
        "  cp_async_wait_all();  // this thread's copies of the row; after the barrier, every thread's\n"
        "  __syncthreads();\n",
        "  cp_async_wait_all();\n  __syncthreads();\n"
        "  if (row + (int)gridDim.x < nrows) copy_row(ROWBUF, scores, ids, row + gridDim.x, s_sq, s_iq, N);\n"),
}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
@pytest.mark.parametrize("slip", list(PREFETCH_SLIPS))
def test_a_slip_in_the_prefetch_fails_on_the_cpu(tmp_path, slip):
    run = BlockOnCpu(_prefetch_module(tmp_path, PREFETCH_SLIPS[slip]))
    scores, ids = make_case("random", 3, 3000, 700, seed=8)
    with pytest.raises((AssertionError, RuntimeError)):
        for seed in (0, 4):
            check_equal(run(scores, ids, 700, seed=seed), ref_python(scores, ids, 700), f"prefetch slip {slip}")


def _bulk_copy_cases():
    """Rows of the filter's tile for the bulk-copy variants (filter_tma shipped in session 36): 16-byte
    aligned (the bulk copy), a view one column in (the threads' loads), mass ties, pads, N not a multiple of 4."""
    view = make_case("ties", 2, 12001, 2048, seed=2)
    return [(make_case("nandups", 2, 16384, 2048, seed=1), 2048), (make_case("padding", 2, 9000, 700, seed=3), 700),
            ((view[0][:, 1:], view[1][:, 1:]), 2048), (_mass_tie("nan_pairs", 2, 12000, seed=4), 1111),
            (make_case("special", 2, 8193, 1, seed=5), 1)]


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
@pytest.mark.parametrize("name", ["tma_ids", "tma_split"])
def test_bulk_copy_variants_are_exact_on_the_cpu(tmp_path, name):
    """Variant ``tma_ids``: the filter kind's ids by bulk copies too (its scores by one, as shipped since
    session 36; the CPU runner lands a copy at the first wait on its barrier), through a ring of two
    stages; ``tma_split``: the scores' copy in four, each on its own barrier; against the packed-key
    reference, two schedules."""
    run = BlockOnCpu(_variant_module(tmp_path, name))
    for (scores, ids), k in _bulk_copy_cases():
        for seed in (0, 3):
            got = run(scores, ids, k, seed=seed, n_sm=0)
            check_equal(got, ref_packed(scores.contiguous(), ids.contiguous(), k), f"{name} {tuple(scores.shape)} k={k}")
    assert {kind for _, kind in run.launched} == {"filter"}


# a slip in a bulk-copy variant: (variant, the good text, the slip's)
BULK_SLIPS = {
    # the ids read before their stage's wait: the ring's old bytes
    "ids' wait": ("tma_ids", "      if (c * IDS_STAGE < N) bar_wait(&ibar[s], (u32)(c >> 1) & 1u);\n", ""),
    # a slot refilled before every thread has read it: some threads read the stage after next
    "slot freed early": ("tma_ids", "      __syncthreads();  // (every thread has read the slot", "      // ("),
    # only the first of the scores' four copies waited for: the later groups read shared memory's old bytes
    "chunk waits": ("tma_split", "if (((cb + u) & 1) == 0 && (cb + u) * 4 * THREADS < N) bar_wait(&fbar[(cb + u) >> 1], 0);",
                    "if (cb + u == 0) bar_wait(&fbar[0], 0);"),
}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
@pytest.mark.parametrize("slip", list(BULK_SLIPS))
def test_a_slip_in_a_bulk_copy_variant_fails_on_the_cpu(tmp_path, slip):
    name, good, bad = BULK_SLIPS[slip]
    run = BlockOnCpu(_variant_module(tmp_path, name, (good, bad)))
    with pytest.raises((AssertionError, RuntimeError)):
        for (scores, ids), k in _bulk_copy_cases():
            check_equal(run(scores, ids, k, seed=1, n_sm=0), ref_packed(scores, ids, k), f"{name} slip {slip}")


def _cutoff_tie_cases():
    """Random normal rows of the filter's tile whose k-th largest score is copied to a few more
    candidates, some of them with a tied candidate's id: the cutoff bin's list (cut_list) ends at an
    exact tie, resolved by id, then by position; and a row of NaN, duplicate ids and pads."""
    g = torch.Generator().manual_seed(36)
    cases = []
    for n, k in ((16384, 2048), (9001, 700)):
        scores = torch.randn(2, n, generator=g)
        ids = torch.stack([torch.randperm(n, generator=g) for _ in range(2)]).to(torch.int32)
        kth = scores.topk(k, dim=1).values[:, -1:]
        at = torch.randint(0, n, (2, 6), generator=g)
        scores.scatter_(1, at, kth.expand(2, 6))
        ids.scatter_(1, at[:, :2], ids.gather(1, at[:, 2:4]))  # (two of the tied share another's id)
        cases.append(((scores, ids), k))
    return cases + [(make_case("nandups", 2, 16384, 2048, seed=1), 2048)]


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_cut_list_is_exact_on_the_cpu(tmp_path):
    """Variant ``cut_list`` (session 36, measured slower): level 1's cutoff bin as a list, exact against
    the plain Python sort, two schedules; its slips fail."""
    run = BlockOnCpu(_variant_module(tmp_path, "cut_list"))
    for (scores, ids), k in _cutoff_tie_cases():
        for seed in (0, 3):
            check_equal(run(scores, ids, k, seed=seed, n_sm=0), ref_python(scores, ids, k), f"cut_list k={k}")
    assert {kind for _, kind in run.launched} == {"filter"}
    slips = [  # the tied keys' next level by position, not id; the winners above the bin given another key
        ("lk[cp[u]] = 0x80000000u | (0x7FFFFFFFu - (u32)idl[u]);", "lk[cp[u]] = 0x80000000u | (0x7FFFFFFFu - (u32)cp[u]);"),
        ("sm.wkey[u * THREADS + tid] = ((i64)sk << 31)", "sm.wkey[u * THREADS + tid] = ((i64)(sk - 1) << 31)")]
    for good, bad in slips:
        run = BlockOnCpu(_variant_module(tmp_path, "cut_list", (good, bad)))
        with pytest.raises((AssertionError, RuntimeError)):
            for (scores, ids), k in _cutoff_tie_cases():
                check_equal(run(scores, ids, k, seed=1, n_sm=0), ref_python(scores, ids, k), f"cut_list slip {bad}")


def _lazy_cases():
    """Rows that take the filter's bulk-copy load (N a multiple of 4, 16-byte aligned): invalid ids with high
    scores and inside the cutoff's tie, pads with finite scores, a short context's cutoff at -inf, NaN with
    every id twice, random rows (lazy keys exact as they are)."""
    from test_select_block_cpu import _invalid_ids_case

    scores, ids, ks = _invalid_ids_case(11)
    cases = [((scores, ids), k) for k in ks]
    scores, ids, ks = neginf_cutoff_case(3, 16384)
    cases += [((scores, ids), k) for k in ks[:3]]
    return cases + [(make_case("padding", 3, 16384, 2048, seed=3), 2048), (make_case("nandups", 2, 16384, 700, seed=1), 700),
                    (make_case("random", 2, 16384, 2048, seed=2), 2048)]


# a slip in lazy_ids: (the good text, the slip's)
LAZY_SLIPS = {
    # the flag never read: an invalid candidate with a high score wins
    "flag ignored": ("if (nsel < 0 || sm.lazy_bad) {", "if (nsel < 0) {"),
    # an invalid candidate tied at the cutoff not flagged: it may win by its (wrapped) inverted id
    "tie unflagged": ("            bad |= lvl == 1 && tie && idj[j] < 0;\n", ""),
    # the keys taken again from lk, which level 1's emit has rewritten, not from the scores
    "no reread": ("fids(lk4, hist, srow, irow, N, nsel >= 0);", "fids(lk4, hist, srow, irow, N, false);"),
}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_lazy_ids_is_exact_on_the_cpu(tmp_path):
    """Variant ``lazy_ids`` (session 40; timed in session 41, exact and slower): the filter's bulk-copy load
    takes score keys only and reads the ids where level 1 needs them; a row with an invalid winner or tie, or a
    cutoff at -inf, runs again with its ids. Against the packed-key reference, two schedules; its slips fail."""
    _filter_variant_exact(tmp_path, "lazy_ids", _lazy_cases(), LAZY_SLIPS)


def _filter_variant_exact(tmp_path, name: str, inputs, slips: dict) -> None:
    """Variant ``name`` on the filter kind: each case ((scores, ids), k) against the packed-key reference under
    two schedules; each slip (good text, the slip's) fails on one of them."""
    cases = [((scores, ids), k, ref_packed(scores, ids, k)) for (scores, ids), k in inputs]
    run = BlockOnCpu(_variant_module(tmp_path, name))
    for (scores, ids), k, ref in cases:
        for seed in (0, 3):
            check_equal(run(scores, ids, k, seed=seed, n_sm=0), ref, f"{name} k={k}")
    assert {kind for _, kind in run.launched} == {"filter"}
    for slip, (good, bad) in slips.items():
        run = BlockOnCpu(_variant_module(tmp_path, name, (good, bad)))
        with pytest.raises((AssertionError, RuntimeError)):
            for (scores, ids), k, ref in cases:
                check_equal(run(scores, ids, k, seed=1, n_sm=0), ref, f"{name} slip {slip}")


def _window_cases():
    """Rows of the filter's bulk-copy load whose cutoff falls in the sampled window (random, ties at the cutoff,
    ragged valid counts with rows below k), above it (the sampled scores high, the rest low) and below it (the sampled scores low): the
    sample reads position tid * N / 512 plus the lane."""
    n, pos = 16384, torch.tensor([t * 32 + (t & 31) for t in range(512)])
    g = torch.Generator().manual_seed(42)
    high = torch.randn(2, n, generator=g) - 10
    high[:, pos] = torch.randn(2, 512, generator=g) + 10
    low = torch.randn(2, n, generator=g) + 10
    low[:, pos] = torch.randn(2, 512, generator=g) - 10
    ids = torch.randperm(4 * n, generator=g)[:2 * n].view(2, n).to(torch.int32)
    return [((high, ids), 2048), ((low, ids), 2048), ((low, ids), 1), (make_case("random", 2, n, 2048, seed=5), 2048),
            (make_case("ties", 2, n, 1000, seed=6), 1000), (make_case("padding", 2, n, 2048, seed=7), 2048)]


# a slip in window: (the good text, the slip's)
WINDOW_SLIPS = {
    # the keys above the window not added to level 1's count: the cutoff lands too high
    "above dropped": ("        above = above0;\n", "        above = 0;\n"),
    # a cutoff outside the window taken from the window's counts: no full count
    "no fallback": ("        primed = false;\n", ""),
}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_window_is_exact_on_the_cpu(tmp_path):
    """Variant ``window`` (session 42; timed in session 43, exact and slower): the filter's load counts the first
    digit only in a window found from a sample of the row, and level 1 counts the whole digit again where the
    cutoff falls outside it. Against the packed-key reference, two schedules; its slips fail."""
    _filter_variant_exact(tmp_path, "window", _window_cases(), WINDOW_SLIPS)


def _split_string_literals(src: str) -> list[str]:
    """The lines of CUDA source ``src`` (comments dropped) on which a string literal is left open."""
    bad = []
    for n, line in enumerate(src.splitlines(), 1):
        code = re.sub(r'\\.', "", line)  # (escapes, \" included, are no quotes)
        code = re.sub(r'"[^"]*"', "", code)  # (the closed literals)
        if '"' in code.split("//", 1)[0]:
            bad.append(f"{n}: {line.strip()}")
    return bad


def test_no_variant_splits_a_string_literal_over_lines(tmp_path):
    """A ``\\n`` in a variant's replacement text turns into a line break (re.sub reads the escapes), which
    splits the CUDA source's inline assembly strings. The CPU runner compiles only the ``#else`` side of
    such code, so this reaches NVRTC on a GPU (session 35's first call failed there); the text is
    checked here instead, for every kind and tile."""
    names = list(block_variants.VARIANTS) + _gpu_call_variants()
    for name in dict.fromkeys(names):
        mod = load_module(block_variants.write(name, str(tmp_path)))
        fixed = getattr(mod, "KIND_THREADS", {})
        for t in mod.TILES:
            for kind in mod.KINDS:
                if fixed.get(kind, t) == t:
                    assert not _split_string_literals(mod.source(t, kind)), (name, t, kind)
    slip = 'asm("{\n .reg .pred p;\n}" : "=r"(x));'  # (what re.sub made of session 34's text)
    assert _split_string_literals(slip) == ['1: asm("{', '3: }" : "=r"(x));']
    assert not _split_string_literals('asm("{\\n .reg .pred p;\\n}" : "=r"(x));  // "a" b"')
