"""The block path's CUDA kernel (ops/select_block.py), the text NVRTC compiles, run on the CPU by
tests/cuda_on_cpu.py: every tile and kind, through ``block_select`` (its chunking, workspace and
merge), against the plain Python sort (tests/test_select_kernel_gpu.py's ``ref_python``; its
packed-key torch.sort reference where rows are long) on ties at the cutoff, NaN with payloads,
+-0, -inf, pads, fewer than k valid, duplicate ids, clustered winner keys, and N not a power of
two. Each case runs under two schedules (threads in order; a seeded random one, with shared
memory's starting bytes random too), which must both be exact.

What this does not show: speed, and anything the CPU runner does not model (cuda_on_cpu.h: warps
do not run in lockstep; memory reached through pointers outside the given arrays is not checked,
while an index past the shared struct's member arrays stops the launch). The GPU tests
(tests/test_select_kernel_gpu.py, ``block`` cases) run the same kernel on an H200.

``--block-module PATH`` runs these tests on another copy of the module (a kernel variant written
by bench/block_variants.py)."""
from __future__ import annotations

import inspect

import pytest
import torch

import cuda_on_cpu
from block_on_cpu import BlockOnCpu
from test_select_kernel_gpu import (KINDS, _clustered, _mass_tie, check_equal, make_case, neginf_cutoff_case, ref_packed,
                                    ref_python)
from tpflare.ops import select_block

pytestmark = pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")


@pytest.fixture(scope="module")
def sb():
    """The module under test: ops/select_block.py, or the copy ``--block-module`` names (which
    conftest.py puts in its place)."""
    return select_block


@pytest.fixture
def on_cpu(sb):
    """``run(scores, ids, k, chunk=None, seed=0)``: ``sb.block_select`` with its kernels built for
    the CPU (tests/block_on_cpu.py); ``run.launched``: the (threads, kind) of its launches."""
    return BlockOnCpu(sb)


def _launches(sb, n, k, chunk=None, q=None):
    """The (threads, kind) of a call's launches by the module's plan (a variant's may depend on the rows)."""
    kw = {"q": q} if "q" in inspect.signature(sb.plan_kernels).parameters else {}
    return {(t, kind) for kind, t in sb.plan_kernels(n, k, chunk, **kw)}


def _both_schedules(run, scores, ids, k, ref, what, chunk=None, seed=1):
    for s in (0, seed):
        check_equal(run(scores, ids, k, chunk, s), ref, f"{what} schedule seed={s}")


# (n, k): each tile (256: n <= 4096, 512: <= 8192, 1024: <= 16384), k of 1, k above the valid
# count or n, a full 2048, n not a power of two
ROWS = [(37, 5), (300, 1), (50, 80), (4096, 2048), (4097, 1000), (7001, 2048), (8193, 333), (16384, 2048)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k", ROWS)
def test_rows_against_python(on_cpu, sb, kind, n, k):
    """One block a row (kind ``row``), rows read at a stride (a slice of wider rows)."""
    wide_s, wide_i = make_case(kind, 2, n + 5, k, seed=n * 7 + k)
    scores, ids = wide_s[:, :n], wide_i[:, :n]
    _both_schedules(on_cpu, scores, ids, k, ref_python(scores, ids, k), f"{kind} n={n} k={k}", seed=n + k)
    assert set(on_cpu.launched) == _launches(sb, n, k, q=2)  # (shipped: {(sb.tile(n), "row")})


BLOCK_CHUNKS = [(37, 5, 1), (37, 5, 4), (100, 64, 16), (300, 1, 7), (2048, 64, 2047), (1000, 2048, 100),
                (6144, 100, 1000), (5000, 2048, 4096), (300, 300, 150), (20000, 700, None)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k,chunk", BLOCK_CHUNKS)
def test_chunks_and_their_merge_against_python(on_cpu, sb, chunked, kind, n, k, chunk):
    """A row cut into chunks: a block a chunk keeps its best in no order with their positions
    in the row (kind ``chunks``), a block a row merges them (``merge``); chunks of one candidate,
    a last chunk of one, chunks shorter than k, k beyond n. The sampled keep runs every other cell
    of the grid (each input kind against half the shapes; CI's time); the GPU runs them all."""
    if chunked == "sampled" and (KINDS.index(kind) + BLOCK_CHUNKS.index((n, k, chunk))) % 2:
        pytest.skip("the sampled keep: every other cell of this grid (CI's time)")
    assert sb.chunking(n, k, chunk)[0] > 1
    scores, ids = make_case(kind, 2, n, k, seed=n + k + (chunk or 0))
    _both_schedules(on_cpu, scores, ids, k, ref_python(scores, ids, k), f"{kind} n={n} k={k} chunk={chunk}",
                    chunk=chunk, seed=n + 3)
    assert set(on_cpu.launched) == _launches(sb, n, k, chunk, q=2)  # (chunks, merge; or the sampled keep's four)


@pytest.mark.parametrize("n,chunk", [(6000, 1500), (6000, 4096), (40000, None)])
def test_merge_orders_equal_keys_by_position(on_cpu, sb, chunked, n, chunk):
    """Equal keys (one id twice, both NaN, payloads differ) among the chunks' winners: the merge
    orders them by their positions in the row, not by where the chunks wrote them (the chunks'
    slots depend on the schedule). Each id sits at positions p and p + 32 (neighbouring warps),
    in reverse too; odd and even k cut through the pairs."""
    g = torch.Generator().manual_seed(n)
    q = 2
    base = (torch.randperm(n, generator=g)[: -(-n // 64) * 32] * 2 + 7).to(torch.int32)  # an id a pair
    pos = torch.arange(n)
    ids = base[(pos // 64) * 32 + pos % 32].expand(q, n).clone()
    ids[1] = ids[1].flip(0)
    payload = torch.randint(1, 1 << 22, (q, n), generator=g, dtype=torch.int32)
    sign = torch.where(torch.rand(q, n, generator=g) < 0.5, 0, -(1 << 31)).to(torch.int32)
    scores = (payload | 0x7F800000 | sign).view(torch.float32)
    assert bool(torch.isnan(scores).all())
    for k in (1, 1001, 2047):
        assert sb.chunking(n, k, chunk)[0] > 1
        _both_schedules(on_cpu, scores, ids, k, ref_packed(scores, ids, k), f"n={n} k={k} chunk={chunk}",
                        chunk=chunk, seed=k)


@pytest.mark.parametrize("kind", ["random", "nandups", "padding"])
def test_longest_row(on_cpu, sb, chunked, kind):
    """A row of MAX_N (131072) candidates: 8 chunks of 16384, their 8 x 2048 best merged by one
    block of 1024 threads; and k = 1."""
    n = sb.MAX_N
    scores, ids = make_case(kind, 1, n, 2048, seed=11)
    for k in (2048, 1):
        check_equal(on_cpu(scores, ids, k, None, 3), ref_packed(scores, ids, k), f"{kind} n={n} k={k}")
    assert set(on_cpu.launched) == _launches(sb, n, 2048, q=1) | _launches(sb, n, 1, q=1)


@pytest.mark.parametrize("n,chunk", [(300, None), (16384, None), (3000, 500)])
def test_cutoff_at_neginf(on_cpu, chunked, n, chunk):
    """A cutoff at -inf (a short context's pads with valid ids) from the kernel's counts, with no
    radix pass on the score key: k just below, at and above the finite scores, through the -inf
    tie and into the NaN below it; a row with no -inf."""
    scores, ids, ks = neginf_cutoff_case(3, n)
    for k in ks:
        ref = ref_python(scores, ids, k) if n <= 3000 else ref_packed(scores, ids, k)
        check_equal(on_cpu(scores, ids, k, chunk, k), ref, f"n={n} k={k} chunk={chunk}")


@pytest.mark.parametrize("kind", ["two_groups", "outliers", "dup_groups", "narrow_ids", "close_keys", "short_context",
                                  "three_groups", "signs_tie"])
def test_ordering_of_clustered_keys(on_cpu, kind):
    """The ordering's parts and second level (order_winners) on winner keys that cluster: tie
    groups across the cutoff, far outliers, duplicate ids, keys over 60 decades, a bucket of most
    winners, both signs with +-0."""
    for q, n, k in ((2, 3000, 1024), (1, 9000, 2048)):
        scores, ids = _clustered(kind, q, n, seed=n + k)
        _both_schedules(on_cpu, scores, ids, k, ref_python(scores, ids, k), f"{kind} q={q} n={n} k={k}", seed=q)


@pytest.mark.parametrize("kind", ["equal", "neginf", "nan_dups", "nan_pairs", "zeros", "one_bin"])
def test_mass_ties(on_cpu, kind):
    """Most of the row at one key: the id and position levels of the radix select, the ordering
    of one part."""
    for n, k in ((16384, 2048), (5000, 1111)):
        scores, ids = _mass_tie(kind, 2, n, seed=n)
        _both_schedules(on_cpu, scores, ids, k, ref_packed(scores, ids, k), f"{kind} n={n} k={k}", seed=5)
        if n <= 5000:
            check_equal(on_cpu(scores, ids, k), ref_python(scores, ids, k), f"{kind} python n={n} k={k}")


def test_empty_and_all_padding(on_cpu):
    """No rows; rows of pads only (every output a pad: id -1, score -inf)."""
    got = on_cpu(torch.zeros(0, 100), torch.zeros(0, 100, dtype=torch.int32), 7)
    assert got[0].shape == (0, 7) and got[1].shape == (0, 7)
    scores = torch.randn(2, 1000)
    ids = torch.full((2, 1000), -1, dtype=torch.int32)
    check_equal(on_cpu(scores, ids, 50, None, 9), ref_python(scores, ids, 50), "all pads")


# a slip in the kernel, and what it does here: the CPU tests can fail
BROKEN = {
    # the block scan's reset of its maximum before every thread has read it: threads disagree on
    # the second level, and a barrier some of them never reach (or a bucket past the end)
    "scan resets early": ("  int big = sm.big;\n  __syncthreads();\n", "  int big = sm.big;\n"),
    # equal keys ranked by position with <=: two winners take one output slot
    "rank ties": ("(kj == kk && sm.wpos[j] < pp)", "(kj == kk && sm.wpos[j] <= pp)"),
    # the radix select's bin test one short: the cutoff's bin is missed where the wanted count
    # ends a lane's bins
    "bin test": ("if (acc < rem && rem <= incl) {", "if (acc < rem && rem < incl) {"),
}


def _plant(request, monkeypatch, mod, attr: str, slip: str, old: str, new: str) -> None:
    """The slip ``old`` -> ``new`` planted in the module's kernel text ``attr`` (source() reads it at each
    call); skipped where the variant under test (``--block-module``) replaced that text."""
    text = getattr(mod, attr)
    if text.count(old) != 1 and request.config.getoption("--block-module") is not None:
        pytest.skip(f"the variant under test replaced this text ({slip})")
    assert text.count(old) == 1, f"the kernel changed under the slip {slip!r}: plant it anew"
    monkeypatch.setattr(mod, attr, text.replace(old, new))


@pytest.mark.parametrize("slip", list(BROKEN))
def test_a_broken_kernel_fails_here(request, monkeypatch, on_cpu, sb, slip):
    _plant(request, monkeypatch, sb, "SOURCE", slip, *BROKEN[slip])
    scores, ids = make_case("nandups", 2, 3000, 700, seed=7)
    with pytest.raises((AssertionError, RuntimeError)):
        _both_schedules(on_cpu, scores, ids, 700, ref_python(scores, ids, 700), slip)


def test_fuzzed_cases(on_cpu, sb, chunked):
    """Cases drawn by tools/fuzz_select.py's generator (shapes at the kernels' edges; normal,
    level, bit-pattern, sorted, ulp-apart, octave, short-context and cutoff-bin scores with NaN,
    +-0 and +-inf sprinkled; distinct, positional, duplicated and shared ids, some invalid; rows
    of a wider buffer), a third of them cut into shorter chunks than the default, each under its
    own schedule, against the packed-key reference."""
    import os
    import random
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import fuzz_select

    rng = random.Random(25 if chunked == "chunks" else 26)
    in_chunks = 0
    for case in range(24):
        c = fuzz_select.draw_block_case(rng, 1 << 17, sb, "cpu", max_rows=8)
        q, n, k, chunk, scores, ids, info = (c[key] for key in ("q", "n", "k", "chunk", "scores", "ids", "info"))
        in_chunks += sb.chunking(n, k, chunk)[0] > 1
        got = on_cpu(scores, ids, k, chunk, case + 1)
        why = fuzz_select.mismatch(got, ref_packed(scores.contiguous(), ids.contiguous(), k))
        assert why is None, f"case {case}: q={q} n={n} k={k} chunk={chunk} {info}: {why}"
    assert in_chunks >= 3


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


def test_sampled_keep_serves_rows_and_the_chunks_the_rest(sb, monkeypatch):
    """The sampled keep (a counted sample, a keep by warps): the keep's status a row against the
    rule in plain Python, and an exact output both where the keep serves the row and where the
    chunks do: a sample that sees only the row's best (too few kept), one key throughout (too
    many), fewer valid than k."""
    if not hasattr(sb, "SAMPLED_MIN_ROWS"):
        pytest.skip("this module has no sampled keep")
    monkeypatch.setattr(sb, "SAMPLED_MIN_ROWS", 1)
    mod = sb
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
        monkeypatch.setattr(mod, "STATS", [])
        check_equal(run(s, i, kk, seed=6), ref_packed(s, i, kk), what)
        got = [tuple(x) for x in mod.STATS[0][:, [0, 1, 3]].tolist()]
        assert got == _sampled_status(mod, s, i, kk), what
    assert [st for _, _, st in got] == [-1, -1]  # one key: more than the workspace holds
    assert [st >= 0 for _, _, st in _sampled_status(mod, scores, ids, k)] == [True, False, True]
    assert {kind for _, kind in run.launched} == {"sample", "keep", "chunks_gated", "merge_gated"}


def test_a_slip_in_the_counted_sample_shows_in_the_rows_status(sb, monkeypatch):
    """The counted sample's cutoff: with the r-th largest's test one short, no
    key passes it and the row's cutoff is whatever its slot held, so the keep's counts leave the
    rule's: the output stays exact (a row the keep cannot serve falls back to the chunks) and only
    the status against the rule in plain Python shows the slip."""
    good, bad = "gt[m] < r && r <= ge[m]", "gt[m] < r && r < ge[m]"
    if not hasattr(sb, "SAMPLED_MIN_ROWS"):
        pytest.skip("this module has no sampled keep")
    text = sb.SAMPLED_SOURCES["sample"]
    assert text.count(good) == 1
    monkeypatch.setitem(sb.SAMPLED_SOURCES, "sample", text.replace(good, bad))  # (source() reads it at each call)
    monkeypatch.setattr(sb, "SAMPLED_MIN_ROWS", 1)
    mod = sb
    g = torch.Generator().manual_seed(13)
    scores = torch.randn(2, 40000, generator=g)
    ids = torch.stack([torch.randperm(40000, generator=g) for _ in range(2)]).to(torch.int32)
    monkeypatch.setattr(mod, "STATS", [])
    check_equal(BlockOnCpu(mod)(scores, ids, 2048, seed=1), ref_packed(scores, ids, 2048), "slip: exact by the fallback")
    got = [tuple(x) for x in mod.STATS[0][:, [0, 1, 3]].tolist()]
    assert got != _sampled_status(mod, scores, ids, 2048)


def test_bitlen_div_is_the_bit_length_of_the_quotient():
    """The kernel's ``bitlen_div(d, n)`` (the ordering's bucket shifts) equals ``bitlen(d / n)`` (the
    64-bit division it replaced) for d up to 2^63 and n of 1..4096, the powers of two and their
    neighbours included: built from select_block.SOURCE's own text by the CPU runner."""
    import random
    import re

    text = select_block.SOURCE
    funcs = re.search(r"__device__ __forceinline__ int bitlen\(.*?int bitlen_div\(.*?\n}\n", text, re.S).group(0)
    src = ("typedef unsigned int u32;\ntypedef long long i64;\ntypedef unsigned long long u64;\n" + funcs +
           'extern "C" __global__ void check(const long long* d, const int* n, int* out, int count) {\n'
           "  for (int i = threadIdx.x; i < count; i += blockDim.x) out[i] = bitlen_div((u64)d[i], n[i]);\n}\n")
    kern = cuda_on_cpu.build(src, "check")
    rng = random.Random(32)
    cases = [(0, 1), (1, 1), (2**63 - 1, 1), (2**63 - 1, 4096), (4095, 4096), (4096, 4096), (8191, 4096)]
    cases += [(d + e, n + f) for d in (2**k for k in range(0, 62, 3)) for n in (1, 2, 3, 2048, 4095)
              for e in (-1, 0, 1) for f in (0, 1) if d + e >= 0]
    cases += [(rng.getrandbits(rng.randint(1, 63)), rng.randint(1, 4096)) for _ in range(2000)]
    d = torch.tensor([c[0] for c in cases], dtype=torch.int64)
    n = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    out = torch.full((len(cases),), -1, dtype=torch.int32)
    kern(grid=(1, 1, 1), block=(64, 1, 1), args=[d, n, out, len(cases)], shared_mem=0)
    want = [(a // b).bit_length() for a, b in cases]
    assert out.tolist() == want


def test_key_bits_inverts_the_order_key():
    """The kernel's ``key_bits`` (the winners' score bits at the output) gives back every score's bits
    from its order key but a NaN's (whose key is one for all payloads; the kernel reads those again):
    +-0, +-inf, subnormals, the largest finite scores, and random bits; built from
    select_block.SOURCE's text by the CPU runner."""
    import random
    import re

    text = select_block.SOURCE
    inv = re.search(r"__device__ __forceinline__ int key_bits\(.*?\n}\n", text, re.S).group(0)
    src = ("typedef unsigned int u32;\n" + select_block.ORDER_KEY + inv +
           'extern "C" __global__ void check(const int* bits, int* key, int* back, int count) {\n'
           "  for (int i = threadIdx.x; i < count; i += blockDim.x) {\n"
           "    key[i] = (int)order_key(bits[i], 0);\n"
           "    back[i] = key_bits((u32)key[i]);\n  }\n}\n")
    kern = cuda_on_cpu.build(src, "check")
    rng = random.Random(32)
    edges = [0, 1 << 31, 0x7F800000, 0xFF800000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x7F7FFFFF,
             0xFF7FFFFF, 0x3F800000, 0xBF800000, 0x7FC00000, 0xFFC00001, 0x7F800001]
    vals = edges + [rng.getrandbits(32) for _ in range(4000)]
    bits = torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in vals], dtype=torch.int32)
    key = torch.zeros_like(bits)
    back = torch.zeros_like(bits)
    kern(grid=(1, 1, 1), block=(64, 1, 1), args=[bits, key, back, len(vals)], shared_mem=0)
    nan = torch.isnan(bits.view(torch.float32))
    assert bool(nan.any()) and bool((~nan).sum() > 3000)
    assert torch.equal(back[~nan], bits[~nan])
    assert bool((key[nan] == 1).all()) and not bool((key[~nan] == 1).any())  # (KEY_NAN: NaN's alone)


def test_paired_kinds_run_the_same_selection(on_cpu, sb):
    """Where a launch has more blocks than SMs (here: ``n_sm=1``), the 512 tile's kinds run their
    functions for two blocks an SM (``kind@2``): the same source but for ``__launch_bounds__``, exact
    on a row of one block and on rows in chunks (the chunks and the merge on 512 threads)."""
    if not hasattr(sb, "PAIRED_TILES"):
        pytest.skip("this module has no paired tiles")
    scores, ids = make_case("nandups", 3, 6000, 1000, seed=32)
    check_equal(on_cpu(scores, ids, 1000, None, 1, n_sm=1), ref_python(scores, ids, 1000), "row@2")
    assert set(on_cpu.launched) == {(512, "row" + sb.PAIRED)}
    on_cpu.launched.clear()
    scores, ids = make_case("special", 2, 12000, 700, seed=33)
    check_equal(on_cpu(scores, ids, 700, 6000, 2, n_sm=1, keep=False), ref_python(scores, ids, 700), "chunks@2")
    assert set(on_cpu.launched) == {(512, "chunks" + sb.PAIRED), (256, "merge")}


# --- the filter kind (rows of 8193-16384 on 512 threads, two blocks an SM; session 34) ---------------------

def _filter_run(on_cpu, sb, scores, ids, k, seed):
    """``sb.block_select`` with no SM to spare (``n_sm=0``): the filter kind takes rows of its tile."""
    got = on_cpu(scores, ids, k, None, seed, n_sm=0)
    assert on_cpu.launched[-1] == (sb.FILTER_THREADS, "filter")
    return got


@pytest.fixture
def filt(sb):
    if not hasattr(sb, "FILTER_KERNEL"):
        pytest.skip("this module has no filter kind")
    return sb


FILTER_ROWS = [(8193, 333), (12001, 2048), (16384, 2048), (16384, 1), (10002, 2047)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k", FILTER_ROWS)
def test_filter_rows_against_python(on_cpu, filt, kind, n, k):
    """The filter kind, rows read at a stride that keeps 16-byte loads (n + 4) and one that does not
    (n + 5), under two schedules each: against the plain Python sort."""
    for extra in (4, 5):
        wide_s, wide_i = make_case(kind, 2, n + extra, k, seed=n * 7 + k + extra)
        scores, ids = wide_s[:, :n], wide_i[:, :n]
        ref = ref_python(scores, ids, k)
        for s in (0, n + k):
            check_equal(_filter_run(on_cpu, filt, scores, ids, k, s), ref, f"{kind} n={n} k={k} +{extra} seed={s}")


def test_filter_cutoff_at_neginf_and_mass_ties(on_cpu, filt):
    """The filter's levels: a cutoff at -inf from its counts (no pass on the score key); most of the
    row at one key, the id and position levels after it (NaN of assorted payloads with every id
    twice, +-0, one 11-bit bin)."""
    scores, ids, ks = neginf_cutoff_case(3, 16384)
    for k in ks:
        check_equal(_filter_run(on_cpu, filt, scores, ids, k, k), ref_packed(scores, ids, k), f"-inf k={k}")
    for kind in ("equal", "neginf", "nan_dups", "nan_pairs", "zeros", "one_bin"):
        for n, k in ((16384, 2048), (9000, 1111)):
            scores, ids = _mass_tie(kind, 2, n, seed=n)
            for s in (0, 5):
                check_equal(_filter_run(on_cpu, filt, scores, ids, k, s), ref_packed(scores, ids, k),
                            f"{kind} n={n} k={k} seed={s}")


@pytest.mark.parametrize("kind", ["two_groups", "outliers", "dup_groups", "narrow_ids", "close_keys", "short_context",
                                  "three_groups", "signs_tie"])
def test_filter_ordering_of_clustered_keys(on_cpu, filt, kind):
    scores, ids = _clustered(kind, 2, 9000, seed=9000 + 2048)
    for s in (0, 2):
        check_equal(_filter_run(on_cpu, filt, scores, ids, 2048, s), ref_python(scores, ids, 2048), f"{kind} seed={s}")


def _invalid_ids_case(seed: int):
    """Rows of 16384 (the filter's bulk-copy load: N a multiple of 4, 16-byte aligned) where invalid ids (-1,
    -2**31, assorted negatives) hold high finite scores: row 0 random scores with 2 % of them invalid, some of
    the row's best among them; row 1 five score levels, invalid ids inside the tie at the cutoff (-2**31
    inverts to the largest id key); row 2 invalid only below every cutoff."""
    g = torch.Generator().manual_seed(seed)
    q, n = 3, 16384
    ids = (torch.randperm(4 * n, generator=g)[: q * n].view(q, n)).to(torch.int32)
    scores = torch.randn(q, n, generator=g)
    scores[1] = torch.randint(0, 5, (n,), generator=g).float() * 0.25
    negs = torch.tensor([-1, -(2 ** 31), -2, -(2 ** 30), -12345], dtype=torch.int32)
    for r, frac in ((0, 0.02), (1, 0.02)):
        bad = torch.rand(n, generator=g) < frac
        ids[r] = torch.where(bad, negs[torch.randint(0, len(negs), (n,), generator=g)], ids[r])
    ids[0, scores[0].argsort(descending=True)[:40:3]] = negs[torch.arange(14) % len(negs)]  # (among the best)
    low = scores[2].argsort()[: n // 4]
    ids[2, low[::7]] = negs[torch.arange(len(low[::7])) % len(negs)]
    return scores.contiguous(), ids.contiguous(), (2048, 700, 1)


def test_filter_invalid_ids_with_scores(on_cpu, filt):
    """Invalid ids with finite, high scores, and inside the tie at the cutoff (every row here takes the bulk
    copy's load; bench/block_variants.py's lazy_ids reads their ids only after a first selection); against
    the plain Python sort."""
    scores, ids, ks = _invalid_ids_case(11)
    for k in ks:
        check_equal(_filter_run(on_cpu, filt, scores, ids, k, k), ref_python(scores, ids, k), f"invalid ids k={k}")


def test_filter_fuzzed_cases(on_cpu, filt):
    """Cases of tools/fuzz_select.py's input kinds at rows of the filter's tile (8193-16384), k of 1-2048."""
    import os
    import random
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import fuzz_select

    rng = random.Random(34)
    for case in range(16):
        q, n, k = rng.randint(1, 3), rng.randint(8193, 16384), rng.choice([1, 2, 7, 100, 1000, 2047, 2048])
        scores, ids, info = fuzz_select.make_inputs(q, n, k, rng.randrange(1 << 30), "cpu")
        got = _filter_run(on_cpu, filt, scores, ids, k, case + 1)
        why = fuzz_select.mismatch(got, ref_packed(scores.contiguous(), ids.contiguous(), k))
        assert why is None, f"case {case}: q={q} n={n} k={k} {info}: {why}"


# a slip in the filter kind, and what it does here
FILTER_BROKEN = {
    # the level's bin not taken where all of it wins: winners missing
    "all of the bin": ("(u64)(T >> sh) + (all ? 0u : 1u)", "(u64)(T >> sh) + 1u"),
    # the winners' gather before every thread's positions are written (session 35's gather): keys and ids
    # read from slots not yet filled
    "gather early": ("      sm.wpos[s] = 4 * ((b >> 2) * THREADS + tid) + (b & 3);\n    }\n    __syncthreads();\n",
                     "      sm.wpos[s] = 4 * ((b >> 2) * THREADS + tid) + (b & 3);\n    }\n"),
    # a winner's id gathered from its group's first candidate: ids and their order wrong
    "gather id": ("__ldg(irow + pu[u])", "__ldg(irow + (pu[u] & ~3))"),
    # level 3 keyed by the id again, not the position: duplicate ids at the cutoff tie in any order
    "level 3 key": ("(0x7FFFFFFFu - (lvl == 1 ? (u32)idj[j] : (u32)p))", "(0x7FFFFFFFu - (u32)idj[j])"),
    # the bin test one short: the cutoff's bin missed where the wanted count ends a thread's bins
    "bin test": ("if (acc < rem && rem <= acc + c[e]) {", "if (acc < rem && rem < acc + c[e]) {"),
    # the cutoff at -inf taken where k ends at the last finite score: no winner is left for the tie
    "-inf edge": ("if (over < nsel && nsel <= over + ninf) {  // the cutoff at -inf",
                  "if (over <= nsel && nsel <= over + ninf) {  // the cutoff at -inf"),
    # the keys read before the scores' bulk copy's wait (session 36): shared memory's old bytes
    "scores' wait": ("      if (cb == 0) bar_wait(&fbar, 0);\n", ""),
    # the NaN never counted (the test against the pads past N taken as against the whole row): a row's NaN
    # are not valid, and its cutoff moves
    "NaN count": ("if (hist[2047] > FI * THREADS - N) {", "if (hist[2047] > FI * THREADS) {"),
    # the -inf count read from the invalid keys' and NaN's bin (session 36: the counts come from the first
    # digit's bins): the cutoff at -inf taken where the row's pads and NaN decide it
    "-inf bin": ("const int ninf = hist[2047 - 3];", "const int ninf = hist[2047];"),
    # NaN not counted valid: a row's NaN never win, and its valid count is short
    "NaN valid": ("FI * THREADS - hist[2047] + nnan;", "FI * THREADS - hist[2047];"),
    # the counts zeroed for the ordering where no candidate wins, with no barrier after their reading: a
    # thread that reads them late finds them zeroed and takes another path (the CPU runner's deadlock)
    "counts zeroed early": ("  if (nsel > 0) {  // (with no winner, no barrier orders",
                            "  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;\n  if (nsel > 0) {  // (with no winner, no barrier orders"),
}


@pytest.mark.parametrize("slip", list(FILTER_BROKEN))
def test_a_broken_filter_fails_here(request, monkeypatch, on_cpu, filt, slip):
    _plant(request, monkeypatch, filt, "FILTER_KERNEL", slip, *FILTER_BROKEN[slip])
    cases = [make_case("nandups", 2, 12001, 700, seed=7) + (700,), _mass_tie("nan_dups", 2, 9000, seed=9000) + (1111,),
             make_case("padding", 2, 9000, 2048, seed=3) + (2048,), make_case("padding", 2, 16384, 1, seed=5) + (1,)]
    cases += [_mass_tie("nan_pairs", 2, n, seed=n) + (k,) for n, k in ((9000, 1111), (16384, 2047), (12001, 1))]
    scores, ids, ks = neginf_cutoff_case(3, 9000)
    cases += [(scores, ids, k) for k in ks]
    scores, ids, ks = _invalid_ids_case(11)
    cases += [(scores, ids, k) for k in ks]
    with pytest.raises((AssertionError, RuntimeError)):
        for scores, ids, k in cases:
            check_equal(_filter_run(on_cpu, filt, scores, ids, k, 1), ref_packed(scores, ids, k), slip)
