"""bench/block_variants.py: every variant (and every combination the GPU calls time) still applies
to the shipped module; on the CPU, the combinations run exactly, a slip planted in a variant's own
code fails, the sampled keep leaves each row the status its rule gives, and the spread path is
exact (the whole CPU suite runs on any variant with ``--block-module``)."""
from __future__ import annotations

import os
import re
import sys

import pytest
import torch

import cuda_on_cpu
from block_on_cpu import BlockOnCpu, load_module
from test_select_kernel_gpu import _mass_tie, check_equal, make_case, ref_packed, ref_python

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
    assert {"scan+digits11+rank_keys+prefetch", "scan+digits11+smem_keys+rank_keys+sampled_rows"} <= set(calls)
    # (and the combinations timed or built before, which the docs name)
    names = list(block_variants.VARIANTS) + calls + ["scan+match+smem_keys", "scan+digits11+smem_keys+rank_keys",
                                                     "scan+digits11+smem_keys+rank_keys+sampled_rows+spread"]
    with open(block_variants.SHIPPED) as f:
        shipped = f.read()
    for name in names:
        text = block_variants.module_text(name)
        compile(text, f"{name}.py", "exec")  # (the module's Python still parses)
        assert text != shipped, name
    with pytest.raises(KeyError, match="no variant 'nope'"):
        block_variants.module_text("scan+nope")


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
    48 KiB (smem_keys' chunks, prefetch's row kind) are among them, so the check has work to do."""
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
        if hasattr(mod, "SAMPLED_ROWS"):
            mod.SAMPLED_ROWS = 1  # (rows of one block through the keep too)
        launches = []
        for q, n, k in [(2, 3000, 700), (5, 6000, 2048), (6, 12000, 2048), (2, 40000, 2048), (1, 131072, 2048)]:
            mod._KERNELS.clear()
            mod.block_select(torch.zeros(q, n), torch.zeros(q, n, dtype=torch.int32), k)
            launches += [nbytes for kern in mod._KERNELS.values() for nbytes in kern.launches]
        assert launches, name
        if max(launches) >= 48 * 1024:
            past.append(name)
    assert "shipped" not in past and {"smem_keys", "prefetch", "scan+digits11+rank_keys+prefetch"} <= set(past), past


def test_an_edit_whose_text_moved_raises(tmp_path):
    moved = tmp_path / "select_block.py"
    with open(block_variants.SHIPPED) as f:
        moved.write_text(f.read().replace("u32 bal = __ballot_sync(FULL, win);", "u32 bal = __ballot_sync(FULL, win != 0);"))
    with pytest.raises(ValueError, match="variant scan: 0 lines of the module hold"):
        block_variants.module_text("scan", shipped=str(moved))


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_combined_variant_is_exact_on_the_cpu(tmp_path):
    run = BlockOnCpu(load_module(block_variants.write("scan+match+smem_keys", str(tmp_path))))
    scores, ids = make_case("nandups", 2, 16384, 2048, seed=4)  # the 512 x 32 tile, ids twice
    check_equal(run(scores, ids, 2048, seed=3), ref_packed(scores, ids, 2048), "nandups 16384")
    scores, ids = _mass_tie("equal", 1, 20000, seed=5)  # chunks and their merge, one score
    check_equal(run(scores, ids, 1500, seed=4), ref_packed(scores, ids, 1500), "equal 20000")
    scores, ids = make_case("special", 2, 3000, 700, seed=6)
    check_equal(run(scores, ids, 700, seed=5), ref_python(scores, ids, 700), "special 3000")
    # the row kernel of tiles 1024 and 256; chunks of 1024 (10000 a chunk), their merge in 256
    assert sorted(set(run.launched)) == [(256, "merge"), (256, "row"), (1024, "chunks"), (1024, "row")]


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
    text = block_variants.module_text(variant)
    assert text.count(good) == 1
    path = tmp_path / f"{variant}_slip.py"
    path.write_text(text.replace(good, bad))
    run = BlockOnCpu(load_module(str(path)))
    scores, ids = make_case(kind, 2, 3000, 700, seed=8)
    with pytest.raises((AssertionError, RuntimeError)):
        check_equal(run(scores, ids, 700, seed=2), ref_python(scores, ids, 700), f"{variant} slip")


def _packed(bits: int, ident: int) -> int:
    """The packed key of a candidate (score key above inverted id), 0 for a pad: plain Python."""
    if ident < 0:
        return 0
    s = bits if bits >= 0 else bits ^ 0x7FFFFFFF
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        s = -0x7FFFFFFF  # (0x80000001: NaN, below -inf)
    return (((s & 0xFFFFFFFF) ^ 0x80000000) << 31) | (0x7FFFFFFF - ident)


def _sampled_status(mod, scores, ids, k):
    """What the sampled keep should leave a row, from its rule in plain Python: (kept, valid,
    status), status -1 where the kept ones may miss a winner or do not fit."""
    q, n = scores.shape
    chunks, chunk, kc = mod.chunking(n, k)
    w = max(chunks * kc, min(mod.TILE_N, int(mod.SAMPLED_WIDTH * k)))
    target = max(1, min(int(mod.SAMPLED_TARGET * k), 3 * w // 4))
    out = []
    for r in range(q):
        keys = [_packed(b, i) for b, i in zip(scores[r].view(torch.int32).tolist(), ids[r].tolist())]
        s = min(n, getattr(mod, "SAMPLES", 2048))  # (the counted sample's: 512)
        sample = sorted((keys[j * n // s] for j in range(s)), reverse=True)
        cut = sample[min(s, max(1, -(-target * s // n))) - 1]
        valid = sum(i >= 0 for i in ids[r].tolist())
        kept = sum(1 for key, i in zip(keys, ids[r].tolist()) if i >= 0 and key >= cut)
        out.append((kept, valid, kept if kept <= w and (kept >= k or kept == valid) else -1))
    return out


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
@pytest.mark.parametrize("variant", ["sampled", "sampled_fast"])  # (sampled_fast: the counted sample too)
def test_sampled_keep_serves_rows_and_the_chunks_the_rest(tmp_path, variant):
    """Variants ``sampled`` and ``sampled_fast`` (a counted sample, a keep by warps): the keep's
    status a row against the rule in plain Python, and an exact output both where the keep serves
    the row and where the chunks do: a sample that sees only the row's best (too few kept), one key
    throughout (too many), fewer valid than k."""
    mod = load_module(block_variants.write(variant, str(tmp_path)))
    run = BlockOnCpu(mod)
    g = torch.Generator().manual_seed(9)
    n, k = 40000, 2048
    scores = torch.randn(3, n, generator=g)
    ids = torch.stack([torch.randperm(n, generator=g) for _ in range(3)]).to(torch.int32)
    at = torch.arange(2048) * n // 2048  # row 1: the sampled positions hold its best
    scores[1, at] = 10 + torch.rand(2048, generator=g)
    ids[2, 500:] = -1  # row 2: 500 valid
    scores[2, 500:] = float("-inf")
    cases = [("sampled", scores, ids, k), ("one key", torch.ones(2, 20000), torch.full((2, 20000), 7, dtype=torch.int32), 1500)]
    for what, s, i, kk in cases:
        mod.STATS = []
        check_equal(run(s, i, kk, seed=6), ref_packed(s, i, kk), what)
        got = [tuple(x) for x in mod.STATS[0][:, [0, 1, 3]].tolist()]
        assert got == _sampled_status(mod, s, i, kk), what
    assert [st for _, _, st in got] == [-1, -1]  # one key: more than the workspace holds
    assert [st >= 0 for _, _, st in _sampled_status(mod, scores, ids, k)] == [True, False, True]
    assert {kind for _, kind in run.launched} == {"sample", "keep", "chunks_gated", "merge_gated"}


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
    """``scan+digits11+rank_keys+sampled_fast+prefetch+spread``, the combination the spread call
    times: 1-4 rows spread, more rows of one block in prefetching blocks (5 rows of the 1024 tile,
    3 blocks here: a block takes two rows), rows in chunks through the sampled keep, each against
    the plain Python sort. (Session 26's combination, with smem_keys and sampled_rows, still applies:
    test_every_variant_applies_to_the_shipped_module.)"""
    name = "scan+digits11+rank_keys+sampled_fast+prefetch+spread"
    mod = load_module(block_variants.write(name, str(tmp_path)))
    run = BlockOnCpu(mod)
    for (scores, ids), k in [(make_case("nandups", 2, 9000, 1000, seed=1), 1000),
                             (make_case("ties", 5, 9000, 1000, seed=2), 1000),
                             (make_case("special", 1, 30000, 700, seed=3), 700)]:
        check_equal(run(scores, ids, k, seed=2), ref_python(scores, ids, k), f"{name} q={scores.shape[0]} k={k}")
    assert {kind for _, kind in run.launched} == {"hist", "compact", "finish", "rank", "row", "sample", "keep",
                                                  "chunks_gated", "merge_gated"}


def _prefetch_module(tmp_path, text=None):
    """Variant ``prefetch`` with every tile prefetching and 2 blocks a launch, so that a block
    selects several rows and the small tiles run the loop too (on a GPU: the 1024 tile, a block
    an SM)."""
    path = tmp_path / "prefetch_x.py"
    path.write_text(text if text is not None else block_variants.module_text("prefetch"))
    mod = load_module(str(path))
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
    assert mod.dyn_bytes(1024, "row") == mod.DYN_BYTES + 8 * 16384 and mod.dyn_bytes(1024, "merge") == mod.DYN_BYTES


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
    good, bad = PREFETCH_SLIPS[slip]
    text = block_variants.module_text("prefetch")
    assert text.count(good) == 1
    run = BlockOnCpu(_prefetch_module(tmp_path, text.replace(good, bad)))
    scores, ids = make_case("random", 3, 3000, 700, seed=8)
    with pytest.raises((AssertionError, RuntimeError)):
        for seed in (0, 4):
            check_equal(run(scores, ids, 700, seed=seed), ref_python(scores, ids, 700), f"prefetch slip {slip}")


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_a_slip_in_the_counted_sample_shows_in_the_rows_status(tmp_path):
    """The counted sample's cutoff (``sampled_fast``): with the r-th largest's test one short, no
    key passes it and the row's cutoff is whatever its slot held, so the keep's counts leave the
    rule's: the output stays exact (a row the keep cannot serve falls back to the chunks) and only
    the status against the rule in plain Python shows the slip."""
    good, bad = "gt[m] < r && r <= ge[m]", "gt[m] < r && r < ge[m]"
    text = block_variants.module_text("sampled_fast")
    assert text.count(good) == 1
    path = tmp_path / "sampled_fast_slip.py"
    path.write_text(text.replace(good, bad))
    mod = load_module(str(path))
    g = torch.Generator().manual_seed(13)
    scores = torch.randn(2, 40000, generator=g)
    ids = torch.stack([torch.randperm(40000, generator=g) for _ in range(2)]).to(torch.int32)
    mod.STATS = []
    check_equal(BlockOnCpu(mod)(scores, ids, 2048, seed=1), ref_packed(scores, ids, 2048), "slip: exact by the fallback")
    got = [tuple(x) for x in mod.STATS[0][:, [0, 1, 3]].tolist()]
    assert got != _sampled_status(mod, scores, ids, 2048)
