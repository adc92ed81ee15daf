"""Variants of the block path's kernel (ops/select_block.py), for A/B timing on a GPU and for
the CPU runner's exactness tests: each is the shipped module with a few exact text edits of its
kernel source (``VARIANTS``), written out as a module file that ``bench/block_ab.py --old`` and
``tests/test_select_block_cpu.py --block-module`` take.

    python3 bench/block_variants.py --out /tmp/variants              # every variant
    python3 bench/block_variants.py --out /tmp/variants match rank_keys   # some; "a+b" combines them
    python3 -m pytest -q tests/test_select_block_cpu.py --block-module /tmp/variants/match+rank_keys.py
    python3 bench/block_ab.py --old /tmp/variants/match+rank_keys.py --out ab.json   # (GPU)

An edit names the lines it replaces by their first and last (the first held by one line of the
shipped module); where the module has changed under it, writing the variant raises. What each one is for, and what was measured:
docs/benchmarks_select_kernel.md (session 25).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "..", "ops", "select_block.py")

# An edit is (first, last, new): the module's text from its one line holding ``first`` through the
# next line holding ``last`` becomes ``new``; or a Sub: every match of a pattern, which must match
# at least ``count`` times (variants combined may add matches).


@dataclasses.dataclass(frozen=True)
class Sub:
    pattern: str
    repl: str
    count: int


def _lit(old: str, new: str, count: int = 1) -> Sub:
    """A Sub of ``old``'s exact text by ``new``'s, both literal (no pattern, no escapes in ``new``)."""
    return Sub(re.escape(old), new.replace("\\", "\\\\"), count)


# a histogram pass's shared atomics, one a bin a warp: the lanes whose candidate falls in one bin
# (__match_any_sync) add their count through the lowest of them. Random normal scores' first
# digit (sign and 7 exponent bits) crowds a few bins; mass ties crowd one.
_MATCH = [
    ("atomicAdd(&sm.hist[b], 1);", "atomicAdd(&sm.hist[b], 1);", ""),
    ("int b = in ? (int)((key[t] >> s) & 255u) : 256;", "int b = in ?", """\
      int b = in ? (int)((key[t] >> s) & 255u) : 256;
      const u32 peers = __match_any_sync(FULL, b);
      if (in && (peers & ((1u << lane) - 1u)) == 0) atomicAdd(&sm.hist[b], __popc(peers));
"""),
]

# as _MATCH, for the bin of the first lane in play only (a ballot and a shuffle, no match): the
# other lanes add one each
_PEEL = [
    ("atomicAdd(&sm.hist[b], 1);", "atomicAdd(&sm.hist[b], 1);", ""),
    ("int b = in ? (int)((key[t] >> s) & 255u) : 256;", "int b = in ?", """\
      int b = in ? (int)((key[t] >> s) & 255u) : 256;
      const int lead = __ffs((int)__ballot_sync(FULL, in)) - 1;
      const int lb = __shfl_sync(FULL, b, lead < 0 ? 0 : lead);
      const u32 same = __ballot_sync(FULL, in && b == lb);
      if (in && b != lb) atomicAdd(&sm.hist[b], 1);
      if (in && lane == lead) atomicAdd(&sm.hist[b], __popc(same));
"""),
]

# radix select by digits of up to 11 bits, not 8: three passes for a 32-bit key, not four; the
# histogram (2048 bins, highest digit first) in sm.mem, which is free until the ordering, its bin
# found by scan2048 over the whole block, not by one warp; with a narrowed start, the first digit
# starts at the highest bit in which the keys in play differ. The first digit of random normal
# scores (sign, 8 exponent bits, 2 mantissa bits) spreads over more bins than the 8-bit one.
_DIGITS11 = [
    ("// The need-th largest key among the candidates in play", "// The need-th largest key among", """\
__device__ int scan2048(int* a, Smem& sm);

// The need-th largest key among the candidates in play (play: a bit a slot; 1 <= need <= their
"""),
    ("  int s0 = 24;", "  int s0 = 24;", """\
  int top = 31;  // the digit's highest bit
  int inplay = total;  // candidates in play under the prefix
"""),
    ("    s0 = ((31 - __clz(mn ^ mx)) >> 3) << 3;", "    prefix = (u32)(((u64)mn >> (s0 + 8))", """\
    top = 31 - __clz(mn ^ mx);
    prefix = (u32)(((u64)mn >> (top + 1)) << (top + 1));  // the bits all share, above the first digit
"""),
    ("  for (int s = s0; s >= 0; s -= 8) {", "sm.hist[i] = 0;", """\
  for (int s = top > 10 ? top - 10 : 0; top >= 0; top = s - 1, s = top > 10 ? top - 10 : 0) {  // bits s .. top
    const u32 dmask = (2u << (top - s)) - 1u;
    for (int i = threadIdx.x; i < 2048; i += THREADS) sm.mem[i] = 0;
"""),
    ("      bool in = ((play >> t) & 1u) && (((u64)key[t] >> (s + 8))", "        atomicAdd(&sm.hist[b], 1);", """\
      bool in = ((play >> t) & 1u) && (((u64)key[t] >> (top + 1)) == ((u64)prefix >> (top + 1)));
      if (in) {
        atomicAdd(&sm.mem[2047 - (int)((key[t] >> s) & dmask)], 1);  // (the highest digit first)
"""),
    ("    if (threadIdx.x < 32) {  // the bin of the (need - above)-th largest", "    __syncthreads();", """\
    scan2048(sm.mem, sm);  // in play above each bin (its barriers end with the offsets in place)
    {  // the bin of the (need - above)-th largest: this thread's bins, their sizes the offsets' steps
      constexpr int E = 2048 / THREADS;
      const int rem = need - above;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int i = threadIdx.x * E + e;
        const int lo = sm.mem[i], hi = i + 1 < 2048 ? sm.mem[i + 1] : inplay;
        if (lo < rem && rem <= hi) {
          sm.bin = 2047 - i;
          sm.above = lo;
          sm.eq = hi - lo;
        }
      }
    }
    __syncthreads();
"""),
    ("    eq = sm.eq;", "    eq = sm.eq;", """\
    eq = sm.eq;
    inplay = eq;
"""),
]

# the ordering's rank step reads the members' keys in bucket order from one array (written as the
# members are placed, in the dynamic shared memory the second level no longer needs), not through
# the member's index: one shared load a member, not two dependent ones. Session 24: the rank step
# took 4,900 of 44,900 cycles a block at 1024 x 16384, 14,000-21,000 at 1024 x 4096
_RANK_KEYS = [
    ("    if (i < nsel) sm.mem[offs[bk[w]] + slot[w]] = i;", "    if (i < nsel) sm.mem[offs[bk[w]] + slot[w]] = i;", """\
    if (i < nsel) {
      sm.mem[offs[bk[w]] + slot[w]] = i;
      reinterpret_cast<i64*>(dyn)[offs[bk[w]] + slot[w]] = sm.wkey[i];  // (the second level's ranges are spent)
    }
"""),
    ("        int j = sm.mem[t];", "#endif", """\
        const i64 kj = reinterpret_cast<const i64*>(dyn)[t];
        if (kj > kk) {
          ++r;
        } else if (kj == kk) {  // a duplicate id: the candidates' positions in the row
          const int j = sm.mem[t];
#if MODE & POS_IN
          r += __ldg(prow + sm.wpos[j]) < __ldg(prow + pp) ? 1 : 0;
#else
          r += sm.wpos[j] < pp ? 1 : 0;
#endif
        }
"""),
]


# a row of one block at up to SPREAD_ROWS rows (the Triton staged path's shapes, 1-4 rows) spread
# over blocks of 2048 candidates, in NVRTC kernels (the staged path's Triton plans compile in
# 2.5-3.5 s): "hist" adds each block's 12-bit histogram of the score keys to the row's (global
# atomics, a bin a block); "compact" finds the cutoff bin from it (every block, the same scan),
# sends the candidates above it to the winner list in bin order (a bin's first slot from the scan,
# a global atomic a winner) and those in it to an in-play list (a block scan, an atomic a block);
# "finish" (the merge kernel, its row's count, wanted number and output offset read from the row's
# status) selects and orders the wanted ones of the in-play list straight into the output after
# the winners above; "rank" writes each winner above at its rank in its bin (the members before
# it: a larger packed key, or an equal one at a smaller position) and the pads.
_SPREAD = [
    ("def plan_kernels(", ") -> tuple[tuple[str, int], ...]:", '''\
_SPREAD_BIT = 32  # SOURCE's MODE bit: the finish of the spread path
KINDS.update({"finish": _POS_IN | _SPREAD_BIT, "hist": 64, "compact": 128, "rank": 192})
SPREAD_ROWS, SPREAD_THREADS, SPREAD_ITEMS = 4, 256, 8  # up to this many rows of one block; its blocks
KIND_THREADS = {**globals().get("KIND_THREADS", {}), "hist": SPREAD_THREADS, "compact": SPREAD_THREADS,
                "rank": SPREAD_THREADS}


def plan_kernels(n: int, k: int, chunk: int | None = None, q: int | None = None, **kw) -> tuple[tuple[str, int], ...]:
    """As the shipped plan; with ``q`` (rows) up to SPREAD_ROWS and a row of one block, the spread
    path's kernels."""
    if q is not None and q <= SPREAD_ROWS and chunking(n, k, chunk)[0] == 1:
        return (("hist", SPREAD_THREADS), ("compact", SPREAD_THREADS), ("finish", tile(n)), ("rank", SPREAD_THREADS))
    return _plan_kernels_one_path(n, k, chunk, q, **kw)


def _plan_kernels_one_path(n: int, k: int, chunk: int | None = None, q: int | None = None, *, keep: bool | None = None,
                           n_sm: int | None = None) -> tuple[tuple[str, int], ...]:
'''),
    ("auto position = [&](int p) -> int {", "auto position = [&](int p) -> int {", """\
  int spread_nab = 0;  // (the spread path's finish: where its output starts in the row)
#if MODE & SPREAD  // the spread path's finish: the row's in-play count, wanted number and output offset
  {
    const int* st = out_pos;
    N = __ldg(st + row * 8 + 0);
    K = __ldg(st + row * 8 + 1);
    spread_nab = __ldg(st + row * 8 + 2);
    if (K == 0) return;  // (the whole block, before any barrier: the winners above the cutoff bin are all)
  }
#endif
  auto position = [&](int p) -> int { return (mode & POS_IN) ? __ldg(prow + p) : base + p; };
"""),
    ("  int* orow = out_ids + row * s_oi;", "  int* osrow = reinterpret_cast<int*>(out_sc) + row * s_os;", """\
  int* orow = out_ids + row * s_oi + spread_nab;
  int* osrow = reinterpret_cast<int*>(out_sc) + row * s_os + spread_nab;
"""),
    ("def compile_tile(", "def compile_tile(", '''\
_source_one_path = source


def source(threads: int, kind: str = "row") -> str:
    """As the shipped source; the spread path's hist, compact and rank kernels are SPREAD_SOURCES'."""
    head = f"#define SPREAD {_SPREAD_BIT}\\n#define SPB {SPREAD_THREADS}\\n#define SPI {SPREAD_ITEMS}\\n"
    if kind in SPREAD_SOURCES:
        return head + SPREAD_SOURCES[kind]
    return head + _source_one_path(threads, kind)


_SPREAD_HEAD = r"""
// the spread path's kernels (hist, compact, rank): blocks of SPB threads x SPI candidates
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define NBIN 4096  // the 12-bit prefix of the score key
#define ST 8  // a row's status: in-play count, wanted from it, winners above the cutoff bin, selected
""" + ORDER_KEY + r"""

""" + BLOCK_SCAN + r"""

"""
SPREAD_SOURCES = {"hist": _SPREAD_HEAD + r"""
// grid (rows, blocks): the block's histogram of its valid candidates' 12-bit prefixes, added to the row's
extern "C" __global__ void __launch_bounds__(SPB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, int* __restrict__ ghist, int N,
                    int s_sq, int s_iq) {
  __shared__ int h[NBIN];
  const int tid = threadIdx.x;
  const i64 row = blockIdx.x;
  const int base = blockIdx.y * (SPB * SPI);
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  for (int i = tid; i < NBIN; i += SPB) h[i] = 0;
  __syncthreads();
#pragma unroll
  for (int t = 0; t < SPI; ++t) {
    const int p = base + t * SPB + tid;
    if (p < N) {
      const int id = __ldg(irow + p);
      if (id >= 0) atomicAdd(&h[order_key(__ldg(srow + p), id) >> 20], 1);
    }
  }
  __syncthreads();
  for (int i = tid; i < NBIN; i += SPB)
    if (h[i]) atomicAdd(ghist + row * NBIN + i, h[i]);
}
""", "compact": _SPREAD_HEAD + r"""
// grid (rows, blocks): the cutoff bin c (the bin of the K-th largest key; from the top bin down, the
// bins above it hold fewer than min(K, valid)); candidates of bins above c to the winner list at
// their bin's slots (gofs: the row's bin offsets, written by block 0 for the rank), those of c to
// the in-play list; the row's status (block 0)
extern "C" __global__ void __launch_bounds__(SPB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const int* __restrict__ ghist,
                    int* __restrict__ gfill, int* __restrict__ gofs, int* __restrict__ st, i64* __restrict__ wkey,
                    int* __restrict__ wpos, int* __restrict__ p_sc, int* __restrict__ p_id, int* __restrict__ p_pos,
                    int N, int K, int s_sq, int s_iq) {
  constexpr int BPT = NBIN / SPB;  // bins a thread: thread t holds bins NBIN - 1 - BPT t - j
  __shared__ int off[NBIN];
  __shared__ int wsum[SPB / 32 + 1];
  __shared__ int cut[3];  // cutoff bin, winners above it, the block's first in-play slot
  const int tid = threadIdx.x;
  const i64 row = blockIdx.x;
  const int base = blockIdx.y * (SPB * SPI);
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  int c[BPT];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < BPT; ++j) {
    c[j] = __ldg(ghist + row * NBIN + (NBIN - 1 - BPT * tid - j));
    sum += c[j];
  }
  if (tid == 0) {
    cut[0] = NBIN;  // (no winner: no bin is the cutoff)
    cut[1] = 0;
  }
  int valid;
  int acc = block_scan<SPB>(sum, wsum, valid);  // candidates in the bins above this thread's first
  const int nsel = min(K, valid);
#pragma unroll
  for (int j = 0; j < BPT; ++j) {
    const int b = NBIN - 1 - BPT * tid - j;
    off[b] = acc;
    if (acc < nsel && nsel <= acc + c[j]) {
      cut[0] = b;
      cut[1] = acc;
    }
    acc += c[j];
  }
  __syncthreads();
  const int cb = cut[0], nab = cut[1];
  if (blockIdx.y == 0) {
    for (int b = tid; b < NBIN; b += SPB) gofs[row * NBIN + b] = off[b];
    if (tid == 0) {
      st[row * ST + 1] = nsel - nab;
      st[row * ST + 2] = nab;
      st[row * ST + 3] = nsel;
    }
  }
  int bits[SPI], id[SPI];
  u32 play = 0;
#pragma unroll
  for (int t = 0; t < SPI; ++t) {
    const int p = base + t * SPB + tid;
    bits[t] = p < N ? __ldg(srow + p) : 0;
    id[t] = p < N ? __ldg(irow + p) : -1;
    if (id[t] < 0) continue;
    const u32 key = order_key(bits[t], id[t]);
    const int b = (int)(key >> 20);
    if (b > cb) {  // above the cutoff bin: a winner, at its bin's next slot
      const int slot = off[b] + atomicAdd(gfill + row * NBIN + b, 1);
      wkey[row * K + slot] = ((i64)key << 31) | (i64)(0x7FFFFFFFu - (u32)id[t]);
      wpos[row * K + slot] = p;
    } else if (b == cb) {
      play |= 1u << t;
    }
  }
  int total;
  int slot = block_scan<SPB>(__popc(play), wsum, total);
  if (tid == 0) cut[2] = total ? atomicAdd(st + row * ST + 0, total) : 0;
  __syncthreads();
  slot += cut[2];
#pragma unroll
  for (int t = 0; t < SPI; ++t) {
    if ((play >> t) & 1u) {
      p_sc[row * N + slot] = bits[t];
      p_id[row * N + slot] = id[t];
      p_pos[row * N + slot] = base + t * SPB + tid;
      ++slot;
    }
  }
}
""", "rank": _SPREAD_HEAD + r"""
// grid (rows, K / SPB): output slot s = y SPB + tid: the winner above the cutoff bin at list slot s
// goes to its rank (its bin's offset, plus the members of its bin before it); slots from the
// row's selected count on get pads (the finish wrote those between)
extern "C" __global__ void __launch_bounds__(SPB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ghist, const int* __restrict__ gofs,
                    const int* __restrict__ st, const i64* __restrict__ wkey, const int* __restrict__ wpos,
                    int* __restrict__ out_ids, float* __restrict__ out_sc, int K, int s_sq, int s_oi, int s_os) {
  const i64 row = blockIdx.x;
  const int s = blockIdx.y * SPB + threadIdx.x;
  if (s >= K) return;
  const int nab = __ldg(st + row * ST + 2), nsel = __ldg(st + row * ST + 3);
  int* orow = out_ids + row * s_oi;
  int* osrow = reinterpret_cast<int*>(out_sc) + row * s_os;
  if (s < nab) {
    const i64 kk = __ldg(wkey + row * K + s);
    const int pp = __ldg(wpos + row * K + s);
    const int b = (int)((u64)kk >> 51);  // (the score key's top 12 bits)
    const int o = __ldg(gofs + row * NBIN + b), n = __ldg(ghist + row * NBIN + b);
    int r = o;
    for (int t = o; t < o + n; ++t) {
      const i64 kj = __ldg(wkey + row * K + t);
      r += (kj > kk || (kj == kk && __ldg(wpos + row * K + t) < pp)) ? 1 : 0;
    }
    orow[r] = 0x7FFFFFFF - (int)(kk & 0x7FFFFFFF);
    osrow[r] = __ldg(reinterpret_cast<const int*>(scores) + row * s_sq + pp);
  } else if (s >= nsel) {
    orow[s] = -1;
    osrow[s] = (int)0xFF800000;
  }
}
"""}


def _spread_select(scores, ids, k, out_ids, out_sc):
    """The spread path (rows of one block, up to SPREAD_ROWS rows): hist, compact, finish, rank."""
    q, n = scores.shape
    dev = scores.device
    i32 = dict(dtype=torch.int32, device=dev)
    zero = torch.zeros(q * (2 * 4096 + 8), **i32)  # the histograms, the bins' fill counts, the rows' status
    ghist, gfill, st = (zero[: q * 4096].view(q, 4096), zero[q * 4096: 2 * q * 4096].view(q, 4096),
                        zero[2 * q * 4096:].view(q, 8))
    gofs = torch.empty((q, 4096), **i32)
    wkey = torch.empty((q, k), dtype=torch.int64, device=dev)
    wpos = torch.empty((q, k), **i32)
    p_sc, p_id, p_pos = (torch.empty((q, n), **i32) for _ in range(3))
    blocks, b = -(-n // (SPREAD_THREADS * SPREAD_ITEMS)), (SPREAD_THREADS, 1, 1)
    compile_tile(SPREAD_THREADS, dev.index, "hist")(
        grid=(q, blocks, 1), block=b, shared_mem=0, args=[scores, ids, ghist, n, scores.stride(0), ids.stride(0)])
    compile_tile(SPREAD_THREADS, dev.index, "compact")(
        grid=(q, blocks, 1), block=b, shared_mem=0,
        args=[scores, ids, ghist, gfill, gofs, st, wkey, wpos, p_sc, p_id, p_pos, n, k, scores.stride(0), ids.stride(0)])
    t = tile(n)
    compile_tile(t, dev.index, "finish")(  # (the merge kernel on the in-play list; out_pos: the rows' status)
        grid=(q, 1, 1), block=(t, 1, 1), shared_mem=DYN_BYTES,
        args=[p_sc, p_id, p_pos, out_ids, out_sc, st, n, k, n, n, n, n, out_ids.stride(0), out_sc.stride(0), 0, st])
    compile_tile(SPREAD_THREADS, dev.index, "rank")(
        grid=(q, -(-k // SPREAD_THREADS), 1), block=b, shared_mem=0,
        args=[scores, ghist, gofs, st, wkey, wpos, out_ids, out_sc, k, scores.stride(0), out_ids.stride(0),
              out_sc.stride(0)])
    return out_ids, out_sc


def compile_tile(threads: int, device: int | None = None, kind: str = "row"):
'''),
    Sub(r"(    plan = plan_kernels\(n, k, chunk, q, [^\n]*\n)",  # (before the plan's kernels compile)
        r"\1    if chunks == 1 and q <= SPREAD_ROWS:\n        return _spread_select(scores, ids, k, out_ids, out_sc)\n", 1),
]

# rows of one block, the 1024 tile (PREFETCH_TILES): a block an SM for several rows, each row's
# candidates copied to shared memory (cp.async, after the ordering's dynamic memory: 128 KB, 210 KB a
# block in all) while the block orders the row before it (the copy is issued once that row's
# winners are in shared memory). Session 24's profile: a 1024 x 16384 block
# spends 9,000 of 45,000 cycles loading its row, the same at 64 rows as at 1024 (latency, not
# bandwidth), and only one block an SM fits, so nothing hides it; here every row's load but the
# first overlaps the previous row's selection. The registers come from shared memory, so the
# load no longer holds 32 loads in flight a thread under the 64-register cap.
_PREFETCH = [
    ("#define KEY_NEGINF 0x007FFFFFu", "#define KEY_NEGINF 0x007FFFFFu", r"""#if PREFETCH
#ifdef __CUDA_ARCH__  // (the CPU runner, tests/cuda_on_cpu.h, has its own: a copy lands between issue and wait)
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}
__device__ __forceinline__ void cp_async16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async4(void* s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#endif
// row's N scores, then its ids (at THREADS x ITEMS), to buf by asynchronous copies: 16 bytes a copy
// where both rows start 16-byte aligned, else 4
__device__ __forceinline__ void copy_row(int* buf, const float* scores, const int* ids, i64 row, int s_sq, int s_iq,
                                         int N) {
  const int* s = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* d = ids + row * s_iq;
  const int n4 = ((reinterpret_cast<u64>(s) | reinterpret_cast<u64>(d)) & 15) == 0 ? N >> 2 : 0;
  for (int j = threadIdx.x; j < n4; j += THREADS) {
    cp_async16(buf + 4 * j, s + 4 * j);
    cp_async16(buf + THREADS * ITEMS + 4 * j, d + 4 * j);
  }
  for (int p = 4 * n4 + threadIdx.x; p < N; p += THREADS) {
    cp_async4(buf + p, s + p);
    cp_async4(buf + THREADS * ITEMS + p, d + p);
  }
}
#endif

#define KEY_NEGINF 0x007FFFFFu  // order_key of -inf (the pad's score)
"""),
    Sub(r"(  const int lane = tid & 31;\n)  const i64 row = blockIdx.x;\n", r"""\1#if PREFETCH  // the row after the ordering's dynamic memory: scores, then ids; the block's first row
#define ROWBUF reinterpret_cast<int*>(reinterpret_cast<char*>(dyn) + ROWBUF_AT)
  copy_row(ROWBUF, scores, ids, blockIdx.x, s_sq, s_iq, N);
  // rows blockIdx.x, + gridDim.x, ...: the next one's copy while this one is selected (the row kind:
  // N stays the row's). The rows: the row kind's s_op, a stride of out_pos, which it does not write
  // (so that the kernel's parameters stay the shipped ones, which other variants edit)
  const int nrows = s_op;
  for (int row = blockIdx.x; row < nrows; row += gridDim.x) {
#else
  {
  const i64 row = blockIdx.x;
#endif
""", 1),
    ("  extern __shared__ u64 dyn[];", "  extern __shared__ u64 dyn[];",
     "  extern __shared__ __align__(16) u64 dyn[];  // (the row's 16-byte copies land ROWBUF_AT bytes in)\n"),
    ("  u32 u[ITEMS];", "  u32 u[ITEMS];", """\
#if PREFETCH
  cp_async_wait_all();  // this thread's copies of the row; after the barrier, every thread's
  __syncthreads();
#endif
  u32 u[ITEMS];
"""),
    ("  int id[ITEMS];", "  int id[ITEMS];", """\
#if PREFETCH  // a candidate's id: read again from the row in shared memory, there until the winners are written
  struct RowIds {
    const int* at;
    __device__ int operator[](int t) const { return at[t * THREADS + threadIdx.x]; }
  } id{ROWBUF + THREADS * ITEMS};
#else
  int id[ITEMS];
#endif
"""),
    ("    int b = p < N ? __ldg(srow + p) : 0;", "    if (id[t] >= 0) {", """\
#if PREFETCH
    const int b = p < N ? ROWBUF[p] : 0;
    const int idt = p < N ? ROWBUF[THREADS * ITEMS + p] : -1;
#else
    const int b = p < N ? __ldg(srow + p) : 0;
    const int idt = id[t] = p < N ? __ldg(irow + p) : -1;
#endif
    u[t] = order_key(b, idt);
    if (idt >= 0) {
"""),
    ("  if (mode & UNORDERED) {  // a chunk's winners as they came", "  if (mode & UNORDERED) {  // a chunk's winners", """\
#if PREFETCH  // the winners are in shared memory, the candidates' registers free: the next row's copy, while this one is ordered
  if (row + (int)gridDim.x < nrows) copy_row(ROWBUF, scores, ids, row + gridDim.x, s_sq, s_iq, N);
#endif
  if (mode & UNORDERED) {  // a chunk's winners as they came, with their positions (a merge's input)
"""),
    Sub(r'(    orow\[r\] = oid;\n    osrow\[r\] = bits;\n  \}\n)\}\n"""',
        r'\1#if PREFETCH\n  __syncthreads();  // (the next row resets the shared state)\n#endif\n  }\n}\n"""', 1),
    ("DYN_BYTES = MAX_K * 8 * 2 + MAX_K * 4", "DYN_BYTES = MAX_K * 8 * 2 + MAX_K * 4", """\
DYN_BYTES = MAX_K * 8 * 2 + MAX_K * 4  # the second level's key ranges and sub-bucket sizes
PREFETCH_TILES = (1024,)  # tiles whose row kind runs a block an SM for several rows, the next row copied ahead
PREFETCH_BLOCKS = None  # their blocks: None, the device's SMs (3 on the CPU runner, so that a block takes rows)


def row_dyn_bytes(threads: int, kind: str) -> int:
    # a kind's dynamic shared memory, and a prefetching row kind's row (scores and ids) after the ordering's
    return dyn_bytes(kind) + (8 * threads * ITEMS if kind == "row" and threads in PREFETCH_TILES else 0)


def row_blocks(q: int, threads: int, dev, kind: str = "row") -> int:
    # the row kind's blocks: a row each, or a prefetching tile's one an SM (its shared memory holds one)
    if threads not in PREFETCH_TILES or kind != "row":
        return q
    sms = PREFETCH_BLOCKS or (torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 3)
    return min(q, sms)
"""),
    Sub(r'(\n *)(f"#define POS_IN \{_POS_IN\})',
        r"""\1f"#define PREFETCH {int(kind == 'row' and int(threads) in PREFETCH_TILES)}\\n#define ROWBUF_AT {DYN_BYTES}\\n"\1\2""",
        1),
    Sub(r"dyn_bytes\(kind\)(\)|\}| >= 48)", r"row_dyn_bytes(threads, kind)\1", 4),  # (compile_tile's)
    Sub(r"grid=\(q, 1, 1\), block=\(t, 1, 1\), shared_mem=dyn_bytes\(kind\),",
        "grid=(row_blocks(q, t, dev, kind), 1, 1), block=(t, 1, 1), shared_mem=row_dyn_bytes(t, kind),", 1),
    Sub(r'(shared_mem=row_dyn_bytes\(t, kind\),\n\s+args=\[scores, ids, ids, out_ids, out_sc, out_ids, n, k, '
        r'n, scores\.stride\(0\), ids\.stride\(0\), 0,\n\s+out_ids\.stride\(0\), out_sc\.stride\(0\), )0', r"\1q", 1),
    # (the row kind at every row count: the filter kind, session 34, would take the 1024 tile's rows beyond one wave)
    Sub(r"(FILTER_THREADS, FILTER_DYN, FILTER_OVER_SMS = 512, 4 \* TILE_N, )1\b", r"\g<1>1 << 30", 1),
]

# prefetch for rows of 4097-8192 too (the 512 tile: 146 KB of shared memory a block, one block an SM
# as in the shipped kernel, whose 96 registers a thread leave no room for a second; session 24: a
# 1024 x 8192 block spends 5,600 of 34,800 cycles loading its row)
_PREFETCH_512 = [Sub(r"PREFETCH_TILES = \(1024,\)", "PREFETCH_TILES = (512, 1024)", 1)]

# (session 30: scan and the sampled keep with a counted sample and a keep by warps, sampled_fast, are
# shipped; their variants, and those built on them or that no longer apply (sampled, sampled_count,
# sampled_rows, sampled_rows_tight, smem_keys: each measured slower, docs/benchmarks_select_kernel.md),
# are in the repository's history; so are session 31's order_merge, hist8 and l2_next, each measured
# slower on an H100: docs/benchmarks_select_kernel.md, session 31; session 32 shipped cheap_math, the
# ordering's shifts without 64-bit divisions, and measured part_warp and in32 slower: their text is in
# the history at commit 9fe81c3; it shipped key_bits too, the winners' score bits from their packed keys,
# and lb2_512 as PAIRED_TILES (the 512 tile at two blocks an SM where a launch has more blocks than SMs),
# and measured noids and wide slower (in the history at commit 031b5fb); it shipped lohi_fused, the winners'
# smallest score key taken as they are written, and measured parts_redux slower (history: c9346a5); session
# 33 measured inplace_levels, hist2, fused_first, list_passes and tma_next slower and built tma_call, which
# still spills: their text is in the history at commit 9d89add; session 34 shipped the filter kind and measured
# its edits filter_always, filter_unroll4 / 8, filter_ldcg / ldcs, split8 / 4, filter_fbinzero, filter_stagger
# and filter_async: in the history at commit 8dda639)
# the filter kind's scores by one bulk copy of the TMA engine (session 34's next step; ready, not timed): thread 0
# issues it into the keys' shared memory, completing on an mbarrier, while the threads load the ids, four groups
# of four at a time. Session 34's profile put the load at 21,000 of a block's 57,700 cycles, an SM taking in
# about 13 bytes a cycle through its loads whatever the blocks did; the bulk copy takes the scores off that path
# and costs no registers (the asynchronous copies, filter_async at 8dda639, cut the load to 17,200 but raised
# the spills). Rows not 16-byte aligned load as shipped.
# filter_tma (the filter's scores by one bulk copy, sm_90 on) shipped in session 36 with nan_lazy and lsel_nz:
# together 0.95-0.97x the time on an H100 at 256-4096 rows of 9000-16384; their variant text is at commit 0cc7d5e.
# Session 35 shipped count_all (put_keys with no branch), emit_gather (level 1's winners compacted by their
# bits, then gathered) and rank1 (the rank step not unrolled). Together they took 0.87-0.91x the time at
# 256-4096 rows of 9000-16384 on an H100, 0.99-1.0x on the row kinds; their variant text is at commit 42e46e6.
# parts_warp: the ordering's three parts' extremes and counts by warp reductions, one lane's atomics a part
# present in the warp, not every winner's three atomics on one of three addresses (ord:parts, 2,100 cycles
# of the filter's block; the row kinds run the same code). Session 35: 1.00-1.04x the time on an H100, not shipped.
_PARTS_WARP = [
    Sub(re.escape("""    part[w] = -1;
    if (i < nsel) {
      u64 kk = (u64)sm.wkey[i];
      part[w] = (kk >> 31) == ut ? 2 : ((kk >> 62) ? 0 : 1);  // (score key's top bit: a positive score)
      atomicMax(&sm.ph[part[w]], kk);
      atomicMin(&sm.pl[part[w]], kk);
      atomicAdd(&sm.pc[part[w]], 1);
    }
"""), """    part[w] = -1;
    u64 kk = 0;
    if (i < nsel) {
      kk = (u64)sm.wkey[i];
      part[w] = (kk >> 31) == ut ? 2 : ((kk >> 62) ? 0 : 1);  // (score key's top bit: a positive score)
    }
    const u32 hi = (u32)(kk >> 32), lo = (u32)kk;
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      const u32 in = __ballot_sync(FULL, part[w] == p);
      if (in == 0u) continue;  // (the same for the warp)
      const bool me = part[w] == p;
      const u32 xh = __reduce_max_sync(FULL, me ? hi : 0u);
      const u32 xl = __reduce_max_sync(FULL, me && hi == xh ? lo : 0u);
      const u32 nh = __reduce_min_sync(FULL, me ? hi : 0xFFFFFFFFu);
      const u32 nl = __reduce_min_sync(FULL, me && hi == nh ? lo : 0xFFFFFFFFu);
      if (lane == __ffs(in) - 1) {
        atomicMax(&sm.ph[p], ((u64)xh << 32) | xl);
        atomicMin(&sm.pl[p], ((u64)nh << 32) | nl);
        atomicAdd(&sm.pc[p], __popc(in));
      }
    }
""", 1),
]
# tma_ids: the ids by bulk copies too, a group's 2,048 (8 KB) a stage through a ring of two slots in sm.wkey's
# space (free until level 1's winners), so no thread loads from global memory during the load; a barrier a
# stage frees its slot for the stage after next. Session 36: 1.0-1.08x the time on an H100, not shipped.
_TMA_IDS = [
    _lit("  __shared__ u64 fbar;  // (the scores' bulk copy's mbarrier)\n",
         "  __shared__ u64 fbar;  // (the bulk copies' mbarriers: the scores; the ids' two ring slots)\n"
         "  __shared__ u64 ibar[2];\n"),
    _lit("  int* hist = sm.off;  // (the digits' counts; the ordering's bucket sizes after them)\n",
         """  int* hist = sm.off;  // (the digits' counts; the ordering's bucket sizes after them)
  int* ring = reinterpret_cast<int*>(sm.wkey);  // (the ids' two stages of IDS_STAGE during the load)
"""),
    _lit("""  const bool tma = FILTER_TMA && N > 0 && vec;
  if (tid == 0) {  // (thread 0 takes the SM's turn; the copy runs while the block zeroes its counts)
    take_turn(N);
    if (tma) {  // (the scores' bulk copy)
      bar_init(&fbar);
      bulk_copy(lk, srow, 4u * (u32)N, &fbar);
    }
""", """  const bool tma = FILTER_TMA && N > 0 && vec && (reinterpret_cast<u64>(ring) & 15) == 0;
  if (tid == 0) {  // (the copies run while the block zeroes its counts)
    take_turn(N);
    if (tma) {  // (the scores' bulk copy)
      bar_init(&fbar);
      bulk_copy(lk, srow, 4u * (u32)N, &fbar);
      for (int s = 0; s < 2; ++s) {
        bar_init(&ibar[s]);
        const int n = min(IDS_STAGE, N - s * IDS_STAGE);
        if (n > 0) bulk_copy(ring + s * IDS_STAGE, irow + s * IDS_STAGE, 4u * (u32)n, &ibar[s]);
      }
    }
"""),
    ("  if (tma) {\n", "  } else {\n", """  if (tma) {  // the scores in lk and the ids through the ring by bulk copies
    bar_wait(&fbar, 0);
#pragma unroll 1
    for (int c = 0; c < FV; ++c) {
      const int s = c & 1, q4 = c * THREADS + tid;
      if (c * IDS_STAGE < N) bar_wait(&ibar[s], (u32)(c >> 1) & 1u);
      const bool in = 4 * q4 < N;
      const uint4 sv = in ? lk4[q4] : make_uint4(0, 0, 0, 0);
      const int4 iv = in ? reinterpret_cast<const int4*>(ring + s * IDS_STAGE)[tid] : make_int4(-1, -1, -1, -1);
      const int b[4] = {(int)sv.x, (int)sv.y, (int)sv.z, (int)sv.w};
      const int d[4] = {iv.x, iv.y, iv.z, iv.w};
      lk4[q4] = put_keys(b, d, hist);
      __syncthreads();  // (every thread has read the slot: it takes the stage after next)
      if (tid == 0 && (c + 2) * IDS_STAGE < N) {
        const int n = min(IDS_STAGE, N - (c + 2) * IDS_STAGE);
        bulk_copy(ring + s * IDS_STAGE, irow + (c + 2) * IDS_STAGE, 4u * (u32)n, &ibar[s]);
      }
    }
  } else {
"""),
    _lit("#define FV (FI / 4)\n", "#define FV (FI / 4)\n#define IDS_STAGE (4 * THREADS)  // (tma_ids: a group's ids, 8 KB, a stage of the ring)\n"),
]


# count_nan (session 36: the filter's load counts only NaN a candidate, its valid and -inf counts from the
# first digit's bins) shipped: 0.97-0.98x the time at 1024-4096 rows of 9000-16384 on an H100; its variant
# text is at commit 531ebc5.
# emit_u32 (session 36): femit's winner test one 32-bit compare, the smallest winning key clamped to 1 (a
# key of 0 is out of play); where no key can win (past 32 bits) the test is skipped.
_EMIT_U32 = [
    _lit("""  u32 win = 0;
#pragma unroll
  for (int c = 0; c < FV; ++c) {
    const uint4 v = lk4[c * THREADS + tid];
    const u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (x[j] != 0u && (u64)x[j] >= lo) win |= 1u << (4 * c + j);
    }
  }
""", """  u32 win = 0;
  if (lo <= 0xFFFFFFFFull) {  // (emit_u32; past 32 bits no key wins)
    const u32 lo32 = max((u32)lo, 1u);
#pragma unroll
    for (int c = 0; c < FV; ++c) {
      const uint4 v = lk4[c * THREADS + tid];
      const u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (x[j] >= lo32) win |= 1u << (4 * c + j);
      }
    }
  }
"""),
]
# cut_list (session 36): where level 1's first digit leaves a cutoff bin not all wanted, of at most KMAX keys
# (random normal scores: about 870 of 16,384), one scan of lk writes the winners above the bin (as femit's
# gather) and the bin's positions to a list in sm.mem; the next digits' passes and the bin's winners run on
# the list, not on every key again. Where the exact key ties, every key of lk becomes 0 but the tied ones,
# level 2's keys, and the tie levels run as before.
_CUT_LIST = [
    _lit("""__device__ void lselect(const u32* lk, int* hist, int need, bool primed, Smem& sm, u32& T, int& sh, int& above,
                        int& eq) {""", """__device__ void lselect(const u32* lk, int* hist, int need, bool primed, Smem& sm, u32& T, int& sh, int& above,
                        int& eq, bool binned = false) {  // (binned: the first digit's bin found already)"""),
    _lit("""    fbin(hist, nb, need - above, sm);
    prefix |= (u32)sm.bin << s;""", """    if (pass > 0 || !binned) fbin(hist, nb, need - above, sm);
    prefix |= (u32)sm.bin << s;"""),
    Sub(r"(extern \"C\" __global__ void __launch_bounds__\(THREADS, MINB\)\ntpflare_select_rows\(const float\* __restrict__ scores, const int\* __restrict__ ids, const int\* __restrict__ pos_in,\n[^\n]*\n[^\n]*\n[^\n]*\n  __shared__ Smem sm;\n  extern __shared__ u64 fdyn)", r"""// Level 1 where the first digit's bin (fbin's sm.bin > 0, sm.above, sm.eq) is not all wanted and holds at most
// KMAX keys: one scan of lk writes the winners above the bin (their positions by their bits, then their keys
// and ids gathered, as femit's) and the bin's positions to sm.mem; the next digits' passes (11 and 10 bits)
// and the bin's winners run on that list. Returns the winners written; T, above, eq as lselect's over the row.
// Where the exact key T ties (eq > need - above), every key of lk is 0 on return but the tied ones, level
// 2's (0x80000000 | inverted id), as femit's.
__device__ __noinline__ int fcut(u32* lk, int* hist, int need, const int* irow, Smem& sm, u32& T, int& above,
                                 int& eq) {  // (inlined, the kernel spilled 36 / 20 bytes)
  const int tid = threadIdx.x, lane = tid & 31;
  uint4* lk4 = reinterpret_cast<uint4*>(lk);
  const u32 b0 = (u32)sm.bin;
  const int nab = sm.above, ncut = sm.eq;
  u32 win = 0, cut = 0;
#pragma unroll
  for (int c = 0; c < FV; ++c) {
    const uint4 v = lk4[c * THREADS + tid];
    const u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 d = x[j] >> 21;
      win |= (d > b0 ? 1u : 0u) << (4 * c + j);
      cut |= (d == b0 ? 1u : 0u) << (4 * c + j);
    }
  }
  int total;
  const int ex = block_scan<THREADS>(__popc(win) | (__popc(cut) << 16), sm.wtot, total);  // (both < 2^16)
  {
    int s = ex & 0xFFFF;
    for (u32 m = win; m != 0u; m &= m - 1u, ++s) {
      const int b = __ffs(m) - 1;
      sm.wpos[s] = 4 * ((b >> 2) * THREADS + tid) + (b & 3);
    }
    s = ex >> 16;
    for (u32 m = cut; m != 0u; m &= m - 1u, ++s) {
      const int b = __ffs(m) - 1;
      sm.mem[s] = 4 * ((b >> 2) * THREADS + tid) + (b & 3);
    }
  }
  __syncthreads();
  u32 umin = 0xFFFFFFFFu;
  {  // the winners above the bin: keys and ids gathered, every load issued at once
    int pu[WPER], idu[WPER];
#pragma unroll
    for (int u = 0; u < WPER; ++u) pu[u] = u * THREADS + tid < nab ? sm.wpos[u * THREADS + tid] : -1;
#pragma unroll
    for (int u = 0; u < WPER; ++u) idu[u] = pu[u] >= 0 ? __ldg(irow + pu[u]) : 0;
#pragma unroll
    for (int u = 0; u < WPER; ++u) {
      if (pu[u] >= 0) {
        const u32 sk = lk[pu[u]];
        sm.wkey[u * THREADS + tid] = ((i64)sk << 31) | (i64)(0x7FFFFFFFu - (u32)idu[u]);
        umin = min(umin, sk);
      }
    }
  }
  u32 ck[WPER];  // the list's keys (a thread's entries u * THREADS + tid < ncut <= KMAX); 0: none
  int cp[WPER];
#pragma unroll
  for (int u = 0; u < WPER; ++u) {
    cp[u] = u * THREADS + tid < ncut ? sm.mem[u * THREADS + tid] : -1;
    ck[u] = cp[u] >= 0 ? lk[cp[u]] : 0u;
  }
  const int want = need - nab;  // (1 <= want < ncut)
  u32 prefix = b0 << 21;
  int ab = 0, sh = 21;
  eq = ncut;
  for (int pass = 1; pass < 3; ++pass) {
    const int s = pass == 1 ? 10 : 0;
    const int nb = pass == 1 ? 2048 : 1024;
    const int top = pass == 1 ? 21 : 10;  // (the digit's bits: [s, top); a key of 0 is not in the list's prefix)
#pragma unroll
    for (int e = 0; e < 4; ++e) hist[4 * tid + e] = 0;
    __syncthreads();
#pragma unroll
    for (int u = 0; u < WPER; ++u)
      if ((ck[u] >> top) == (prefix >> top)) atomicAdd(&hist[nb - 1 - (int)((ck[u] >> s) & (u32)(nb - 1))], 1);
    __syncthreads();
    fbin(hist, nb, want - ab, sm);
    prefix |= (u32)sm.bin << s;
    ab += sm.above;
    eq = (int)sm.eq;
    sh = s;
    if (eq == want - ab) break;  // the whole bin is wanted
  }
  T = prefix;
  above = nab + ab;
  const bool all = eq == want - ab;
  const u64 lo = ((u64)(prefix >> sh) + (all ? 0u : 1u)) << sh;  // (the smallest winning key)
  u32 lw = 0, tw = 0;  // the list's winners, and (not all) its keys tied at T
#pragma unroll
  for (int u = 0; u < WPER; ++u) {
    lw |= (ck[u] != 0u && (u64)ck[u] >= lo ? 1u : 0u) << u;
    tw |= (!all && ck[u] != 0u && ck[u] == prefix ? 1u : 0u) << u;
  }
  int lt;
  int slot = nab + block_scan<THREADS>(__popc(lw), sm.wtot, lt);
  int idl[WPER];
#pragma unroll
  for (int u = 0; u < WPER; ++u) idl[u] = ((lw | tw) >> u) & 1u ? __ldg(irow + cp[u]) : 0;
#pragma unroll
  for (int u = 0; u < WPER; ++u) {
    if ((lw >> u) & 1u) {
      sm.wkey[slot] = ((i64)ck[u] << 31) | (i64)(0x7FFFFFFFu - (u32)idl[u]);
      sm.wpos[slot] = cp[u];
      ++slot;
      umin = min(umin, ck[u]);
    }
  }
  if (!all) {  // the tie levels' keys: the tied at T by inverted id, every other key 0
#pragma unroll
    for (int c = 0; c < FV; ++c) lk4[c * THREADS + tid] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < WPER; ++u)
      if ((tw >> u) & 1u) lk[cp[u]] = 0x80000000u | (0x7FFFFFFFu - (u32)idl[u]);
    __syncthreads();
  }
  umin = __reduce_min_sync(FULL, umin);
  if (lane == 0 && umin != 0xFFFFFFFFu) atomicMin(&sm.ulo, umin);
  return nab + lt;
}

\1""", 1),
    _lit("""    } else {
      lselect(lk, hist, nsel, true, sm, T1, sh, ab, eq);
    }
    int rem = nsel - ab;
    int wn = femit(lk, 1, T1, sh, eq == rem, 0u, 0u, 0, irow, N, vec, sm);
""", """    } else {
      fbin(hist, 2048, nsel, sm);  // (the first digit's bin, on the load's counts)
      if (sm.bin > 0 && sm.eq != nsel - sm.above && sm.eq <= KMAX) {  // (cut_list: the same for every thread)
        wn1 = fcut(lk, hist, nsel, irow, sm, T1, ab, eq);
      } else {
        lselect(lk, hist, nsel, true, sm, T1, sh, ab, eq, true);
      }
    }
    int rem = nsel - ab;
    int wn = wn1 >= 0 ? wn1 : femit(lk, 1, T1, sh, eq == rem, 0u, 0u, 0, irow, N, vec, sm);
"""),
    _lit("""    u32 T1, T2, T3;
    int sh, ab, eq;
    const int over = nvalid""", """    u32 T1, T2, T3;
    int sh, ab, eq, wn1 = -1;
    const int over = nvalid"""),
]

# tma_split (session 36, untimed): the scores' bulk copy in four of 16 KB (4,096 candidates, two groups), each
# on its own mbarrier, so that a thread turns its first groups into keys while the rest of the row lands.
_TMA_SPLIT = [
    _lit("  __shared__ u64 fbar;  // (the scores' bulk copy's mbarrier)\n",
         "  __shared__ u64 fbar[4];  // (tma_split: the scores' four bulk copies' mbarriers)\n"),
    _lit("""      bar_init(&fbar);
      bulk_copy(lk, srow, 4u * (u32)N, &fbar);
    }
""", """      for (int i = 0; i < 4; ++i) {
        bar_init(&fbar[i]);
        const int n = min(4096, N - 4096 * i);
        if (n > 0) bulk_copy(lk + 4096 * i, srow + 4096 * i, 4u * (u32)n, &fbar[i]);
      }
    }
"""),
    _lit("""      if (cb == 0) bar_wait(&fbar, 0);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q4 = (cb + u) * THREADS + tid;
""", """#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q4 = (cb + u) * THREADS + tid;
        if (((cb + u) & 1) == 0 && (cb + u) * 4 * THREADS < N) bar_wait(&fbar[(cb + u) >> 1], 0);  // (a chunk's first group)
"""),
]
# ids_all (session 36): the bulk-copy load's two rounds of id loads unrolled; shipped in session 37 (with the
# turns at the load, 0.97x the time at 1024 x 16384); its text: commit 9fd72f8
# stagger and lease (session 37): one block an SM loads while the other computes, by a first-wave delay or by a
# lease an SM; the lease (5,000 ns a row of 16384) shipped as the filter kind's take_turn. Their text:
# commit 9fd72f8 (bench/block_variants.py: _stagger, _lease); their A/Bs:
# bench/results/block_filter_h100_s37_ab_stagger*.json
# turn4 (session 37), turn5 (session 38): the filter kind's turn at the load (take_turn) 4,000 and 5,000 ns a row of 16384.
# 5,000 shipped in session 37; session 38 shipped 6,000 (turn6 then: 0.98-0.99x the time of 5,000 at 512-4096
# random rows, 0.98-1.01x on mass ties; H100, bench/results/block_filter_h100_s38_*.json). H100, against 5,000: turn4 1.00-1.04x
# turn7, turn8 (session 39): 7,000 and 8,000 ns, past the load phase's length (H100, 1024 x 16384 random:
# 13,600-15,100 cycles at 1.98 GHz, 6,900-7,600 ns). H100, against 6,000, two A/Bs: slower at rows of 16384
# (random: turn7 1.01-1.03x, turn8 1.02-1.05x), 0.99x at 1024 x 9000, within 0.2 % at 2048 x 12001
# (bench/results/block_filter_h100_s39_ab_turn78_*.json). So the window stays 6,000 ns.
def _turn(ns: int) -> list:
    return [_lit("#define TURN_NS 6000\n", f"#define TURN_NS {ns}\n")]


# lazy_ids (session 40, not yet timed): the filter kind's bulk-copy load takes the score keys only, every
# candidate of the row as valid, and reads no id (half the load's bytes, no id loads by the threads). Lazy keys
# are exact where every winner, and every candidate tied at the cutoff, has a valid id: the valid candidates'
# order is the same, and the invalid ones come after them all. Level 1's emit reads those ids anyway (the
# winners' gather, the tie's groups) and flags an invalid one (sm.lazy_bad); then, or where the lazy counts put
# the cutoff at -inf or below (a short context's pads), the row's keys are taken again with its ids (fids) and
# the selection (fselect) runs once more. Exact on the CPU runner (tests/test_select_block_cpu.py
# --block-module, and its invalid-ids case); nvcc: 64 registers, 4 bytes spilled. Session 41, H100, against the
# shipped kernel: exact (GPU tests, fuzz) and slower, 1.08x at 1024 x 16384 random (108.0 against 100.1 µs),
# 1.10-1.17x on short contexts (the ids read twice), 1.03-1.10x elsewhere; its load phase only 7 % shorter
# (bench/results/block_filter_h100_s41_ab_lazy.json). Not shipped
_LAZY_CALL = r"""  // Lazy keys (the bulk copy's load) are exact where every winner, and every candidate tied at the cutoff, has a
  // valid id: the valid candidates' order is the same, and the invalid ones (key 0 with their ids) all come
  // after. Level 1's emit reads those ids and flags an invalid one (sm.lazy_bad); then, or where the cutoff is
  // at -inf or below, the row's keys are taken again with its ids (fids) and the selection runs once more.
  int nsel = fselect(lk, hist, K, N, irow, vec, tma, sm);
  if (tma) {
    __syncthreads();
    if (nsel < 0 || sm.lazy_bad) {  // (the same for every thread)
      __syncthreads();
      if (tid == 0) reset_shared(sm);
      for (int i = tid; i < NB; i += THREADS) hist[i] = 0;
      __syncthreads();
      fids(lk4, hist, srow, irow, N, nsel >= 0);
      __syncthreads();
      nsel = fselect(lk, hist, K, N, irow, vec, false, sm);
    }
  }
  if (nsel > 0) {  // (with no winner, no barrier orders a thread's reading of the counts before another's zeroing)
"""


def _lazy_select(text: str) -> str:
    """lazy_ids: the filter kernel's selection, from its NaN count to its last level, moved as the module has
    it into a function (fselect, after femit) that a lazy load's row may run twice; the kernel calls it
    (_LAZY_CALL). fselect computes ``over`` before any pass, for the lazy shortcut: where lazy keys put the
    cutoff at -inf or below, it returns -1 (the ids are needed before any pass)."""
    lines, a, b = _span(text, "  int nnan = 0;", "  if (nsel > 0) {  // (with no winner", "lazy_ids")
    sel = "".join(lines[a:b])
    over = "  const int over = nvalid - ninf - nnan;  // above -inf\n"
    nsel = "  const int nsel = min(K, nvalid);\n"
    if sel.count("  " + over) != 1 or sel.count(nsel) != 1:
        raise ValueError("variant lazy_ids: the filter kernel's selection has changed; rebuild fselect")
    sel = sel.replace("  " + over, "").replace(nsel, over + nsel + (
        "  if (lazy && nsel > over) return -1;  // (a shortcut: level 1's emit would flag the pads, tied at -inf)\n"))
    fselect = _FSELECT_HEAD + sel + "  return nsel;\n}\n"
    text = "".join(lines[:a]) + _LAZY_CALL + "".join(lines[b + 1:])
    end = "  return wn + total;\n}\n"  # (femit's end: fselect after it)
    if text.count(end) != 1:
        raise ValueError(f"variant lazy_ids: {text.count(end)} lines end femit, not one")
    return text.replace(end, end + fselect)


_FSELECT_HEAD = r"""
// The row's winners from its level keys in lk (the first digit counted in hist) to sm.wkey / sm.wpos; returns
// their number (nsel), or -1 where lazy keys (every candidate taken as valid) put the cutoff at -inf or below (a
// short context's pads: id -1, score -inf), so that the ids are needed before any pass.
__device__ __forceinline__ int fselect(u32* lk, int* hist, int K, int N, const int* irow, bool vec, bool lazy,
                                       Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31;
  const uint4* lk4 = reinterpret_cast<const uint4*>(lk);
"""


_LAZY_IDS = [
    _lazy_select,
    _lit('nnan, wcount;\n',
         'nnan, wcount, lazy_bad;\n'),
    _lit('  sm.wcount = 0;\n',
         r"""  sm.wcount = 0;
  sm.lazy_bad = 0;
"""),
    _lit("// A level's winners to sm.wkey / sm.wpos from slot wn on:",
         r"""// The row's keys with their ids, after a lazy load (score keys only, every candidate taken as valid): each
// group of four's ids by one 16-byte load (the rows allow it: the bulk copy's condition), an invalid
// candidate's key 0, the first digit counted again into hist (zeroed). reread: the scores read again too (level
// 1's emit has rewritten lk); else lk still holds the score keys.
__device__ __noinline__ void fids(uint4* lk4, int* hist, const int* srow, const int* irow, int N, bool reread) {
  const int tid = threadIdx.x;
#pragma unroll 2
  for (int c = 0; c < FV; ++c) {
    const int q4 = c * THREADS + tid;
    const bool in = 4 * q4 < N;
    const int4 iv = in ? __ldg(reinterpret_cast<const int4*>(irow) + q4) : make_int4(-1, -1, -1, -1);
    const int d[4] = {iv.x, iv.y, iv.z, iv.w};
    if (reread) {
      const int4 sv = in ? __ldg(reinterpret_cast<const int4*>(srow) + q4) : make_int4(0, 0, 0, 0);
      const int b[4] = {sv.x, sv.y, sv.z, sv.w};
      lk4[q4] = put_keys(b, d, hist);
    } else {  // (an in-row score key is never 0: order_key)
      const uint4 v = lk4[q4];
      u32 kk[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (d[j] < 0) kk[j] = 0u;
        atomicAdd(&hist[2047 - (int)(kk[j] >> 21)], 1);
      }
      lk4[q4] = make_uint4(kk[0], kk[1], kk[2], kk[3]);
    }
  }
}

// A level's winners to sm.wkey / sm.wpos from slot wn on:"""),
    _lit(r"""  u32 umin = 0xFFFFFFFFu;
  if (lvl == 1 && all) {""",
         r"""  u32 umin = 0xFFFFFFFFu;
  bool bad = false;  // (level 1: an invalid winner, or an invalid candidate tied at T)
  if (lvl == 1 && all) {"""),
    _lit('        const u32 sk = lk[pu[u]];\n',
         r"""        const u32 sk = lk[pu[u]];
        bad |= idu[u] < 0;
"""),
    _lit('          if ((win >> (4 * c + j)) & 1u) {\n',
         r"""          if ((win >> (4 * c + j)) & 1u) {
            bad |= lvl == 1 && idj[j] < 0;
"""),
    _lit('            const bool tie = x[u][j] != 0 && x[u][j] == T;\n',
         r"""            const bool tie = x[u][j] != 0 && x[u][j] == T;
            bad |= lvl == 1 && tie && idj[j] < 0;
"""),
    _lit(r"""  return wn + total;
}
""",
         r"""  if (bad) sm.lazy_bad = 1;  // (read only after a lazy load's selection)
  return wn + total;
}
"""),
    _lit(r"""  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const i64 row = blockIdx.x;
  const int* srow""",
         r"""  const int tid = threadIdx.x;
  const i64 row = blockIdx.x;
  const int* srow"""),
    _lit(r"""  if (tma) {
#pragma unroll
    for (int cb = 0; cb < FV; cb += 4) {
      int4 idv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q4 = (cb + u) * THREADS + tid;
        idv[u] = 4 * q4 < N ? __ldg(reinterpret_cast<const int4*>(irow) + q4) : make_int4(-1, -1, -1, -1);
      }
      if (cb == 0) bar_wait(&fbar, 0);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q4 = (cb + u) * THREADS + tid;
        const uint4 sv = 4 * q4 < N ? lk4[q4] : make_uint4(0, 0, 0, 0);
        const int b[4] = {(int)sv.x, (int)sv.y, (int)sv.z, (int)sv.w};
        const int d[4] = {idv[u].x, idv[u].y, idv[u].z, idv[u].w};
        lk4[q4] = put_keys(b, d, hist);
      }
    }
""",
         r"""  if (tma) {  // lazy: the score keys only, every candidate of the row taken as valid (ids read for winners)
    bar_wait(&fbar, 0);
#pragma unroll 4
    for (int c = 0; c < FV; ++c) {
      const int q4 = c * THREADS + tid;
      const bool in = 4 * q4 < N;
      const uint4 sv = in ? lk4[q4] : make_uint4(0, 0, 0, 0);
      const int b[4] = {(int)sv.x, (int)sv.y, (int)sv.z, (int)sv.w};
      const int v = in ? 0 : -1;
      const int d[4] = {v, v, v, v};
      lk4[q4] = put_keys(b, d, hist);
    }
"""),
]


# ids_l2 (session 40; with lazy_ids): thread 0 prefetches the row's ids to L2 by one bulk prefetch as the
# scores' bulk copy starts (no thread loads them), so that level 1's gather of the winners' ids, and a redo
# with the ids, read L2, not HBM. Session 41, H100: lazy_ids+ids_l2 1.03x the shipped kernel's time at
# 1024 x 16384 random (102.8 against 100.1 µs), 1.01-1.15x elsewhere. Not shipped
_IDS_L2 = [
    _lit("#elif defined(__CUDA_ARCH__)  // (before sm_90 the threads load the scores too: never called)\n",
         """__device__ __forceinline__ void prefetch_l2(const void* src, u32 bytes) {  // (ids_l2)
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
#elif defined(__CUDA_ARCH__)  // (before sm_90 the threads load the scores too: never called)
__device__ __forceinline__ void prefetch_l2(const void*, u32) {}
"""),
    _lit("#else  // (the CPU runner: tests/cuda_on_cpu.h emulates bar_init, bulk_copy and bar_wait)\n",
         "#else  // (the CPU runner: tests/cuda_on_cpu.h emulates bar_init, bulk_copy and bar_wait)\n"
         "inline void prefetch_l2(const void*, u32) {}  // (ids_l2: no cache to fill)\n"),
    _lit("      bulk_copy(lk, srow, 4u * (u32)N, &fbar);\n",
         "      bulk_copy(lk, srow, 4u * (u32)N, &fbar);\n      prefetch_l2(irow, 4u * (u32)N);  // (ids_l2)\n"),
]


# hist4 (session 37): the load's first-digit counts in four copies, a lane's by lane & 3 (sm.off, and sm.wkey,
# sm.wpos and sm.mem, free until level 1's winners), summed into sm.off after the load: a warp's atomics on
# one bin (random normal scores crowd a few bins of the first digit; mass ties one) conflict a quarter as often.
# H100: 1.01-1.04x the time, not shipped
_HIST4 = [
    _lit("    reset_shared(sm);\n  }\n  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;\n",
         """    reset_shared(sm);
  }
  int* hc1 = reinterpret_cast<int*>(sm.wkey);  // (hist4: the counts' other copies)
  int* hc2 = sm.wpos;
  int* hc3 = sm.mem;
  for (int i = tid; i < NB; i += THREADS) {
    hist[i] = 0;
    hc1[i] = 0;
    hc2[i] = 0;
    hc3[i] = 0;
  }
  int* hmine = (lane & 3) == 0 ? hist : ((lane & 3) == 1 ? hc1 : ((lane & 3) == 2 ? hc2 : hc3));
"""),
    _lit("put_keys(b, d, hist)", "put_keys(b, d, hmine)", 2),
    _lit("  __syncthreads();\n  int nnan = 0;\n", """  __syncthreads();
  for (int i = tid; i < NB; i += THREADS) hist[i] += hc1[i] + hc2[i] + hc3[i];
  __syncthreads();
  int nnan = 0;
"""),
]
# rank_ilp (session 38): a winner's rank in its (sub-)bucket, up to four winners of a thread at once, a step each
# over their member lists (a warp's steps: the longest list of its lanes, not the sum over its winners of the
# longest; four loads in flight a lane, not one). Random normal scores' winners crowd about half the buckets
# (three members a winner on average; a lane's four winners about 12 steps, a warp's about 20 before:
# python3 bench/order_bucket_sizes.py, its block rank line).
# Session 38, H100 (bench/results/block_filter_h100_s38_ab_rank_ilp.json): 1.01-1.10x the time, the rank
# phase 9,966 cycles against 8,131 (NVRTC: 24 bytes of local memory in the filter kind); not shipped
_RANK_ILP = [
    ("  int rank[WPER];", "  __syncthreads();  // (the member list's space takes the output order)", """\
  int rank[WPER];
#define RG (WPER < 4 ? WPER : 4)  // (winners ranked at once)
#pragma unroll
  for (int w0 = 0; w0 < WPER; w0 += RG) {
    int ro[RG], re[RG];
    i64 rk[RG];
    int rp[RG];
    int len = 0;
#pragma unroll
    for (int g = 0; g < RG; ++g) {
      const int w = w0 + g, i = w * THREADS + tid;
      ro[g] = 0;
      re[g] = 0;
      rk[g] = 0;
      rp[g] = 0;
      if (w < WPER && i < nsel) {
        ro[g] = offs[bk[w]];
        re[g] = bk[w] + 1 < NB ? offs[bk[w] + 1] : nsel;
        rk[g] = sm.wkey[i];
        rp[g] = sm.wpos[i];
        len = max(len, re[g] - ro[g]);
      }
      if (w < WPER) rank[w] = ro[g];
    }
#pragma unroll 1
    for (int st = 0; st < len; ++st) {
#pragma unroll
      for (int g = 0; g < RG; ++g) {
        const int t = ro[g] + st;
        if (w0 + g < WPER && t < re[g]) {
          const int j = sm.mem[t];
          const i64 kj = sm.wkey[j];
#if MODE & POS_IN  // (equal keys: a duplicate id; then the candidates' positions in the row)
          rank[w0 + g] += (kj > rk[g] || (kj == rk[g] && __ldg(prow + sm.wpos[j]) < __ldg(prow + rp[g]))) ? 1 : 0;
#else
          rank[w0 + g] += (kj > rk[g] || (kj == rk[g] && sm.wpos[j] < rp[g])) ? 1 : 0;
#endif
        }
      }
    }
  }
#undef RG
  __syncthreads();  // (the member list's space takes the output order)
"""),
]
# count_after (session 42, a probe): the load's first digit counted after the load, in a pass over the keys in
# shared memory, not as each group of four is keyed. With bench/block_phases.py's "load" stamp (before the NaN
# count) it splits the load's time into the load itself and its atomics: what a load with few atomics (a
# sampled window of the first digit) could save at most. Session 43, H200, 1024 x 16384 random: load 9,737 cycles
# against the shipped 10,905, and the pass after it 2,496 against 436
_COUNT_AFTER = [
    _lit("    atomicAdd(&hist[2047 - (int)(kk[j] >> 21)], 1);  // (a pad: bin 2047, digit 0)\n", ""),
    _lit("  __syncthreads();\n  int nnan = 0;\n", """  __syncthreads();
  int nnan = 0;
#pragma unroll 4
  for (int c = 0; c < FV; ++c) {  // (count_after: the first digit, from the keys in shared memory)
    const uint4 v = lk4[c * THREADS + tid];
    atomicAdd(&hist[2047 - (int)(v.x >> 21)], 1);
    atomicAdd(&hist[2047 - (int)(v.y >> 21)], 1);
    atomicAdd(&hist[2047 - (int)(v.z >> 21)], 1);
    atomicAdd(&hist[2047 - (int)(v.w >> 21)], 1);
  }
  __syncthreads();
"""),
]
# window (session 42): the load counts the first digit only in a window of it, found from a sample of the row. After
# the scores' bulk copy lands, each thread keys one score (512 spread over the row) into a sample histogram (sm.mem,
# free until the ordering); the window: the digits of the sample's (K / N)-quantile give or take three standard
# deviations of its rank, and one more digit either side.
# A candidate's digit in the window: one shared atomic as before; above it: a register count (sm.wabove); the
# invalid, NaN and -inf counts by register too (sm.w01: keys 0 and 1; sm.wlow: digits 0-3). Level 1's first
# pass takes the window's counts where the cutoff falls in it (the keys above it added to its "above"), else
# counts the whole digit again (lselect unprimed). Exact either way: a digit inside the window is counted whole.
# Random normal scores: about 3,000 of a row's 16,384 atomics at the load (the rest: compares)
# Session 43, H200: exact and slower, 117.3 against the shipped 94.5 µs at 1024 x 16384 random (its load 16,810
# cycles against 10,905: the sample costs more than the atomics it saves; count_after says those are at most 1,168)
_WINDOW = [
    ("__device__ __forceinline__ uint4 put_keys(const int (&b)[4], const int (&d)[4], int* hist) {",
     "  return make_uint4(kk[0], kk[1], kk[2], kk[3]);", """\
__device__ __forceinline__ uint4 put_keys(const int (&b)[4], const int (&d)[4], int* hist, int dlo, int dhi1,
                                          int& na, int& nl, int& n01) {
  u32 kk[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    kk[j] = order_key(b[j], d[j]);
    const int top = (int)(kk[j] >> 21);
    if ((u32)(top - dlo) < (u32)(dhi1 - dlo)) atomicAdd(&hist[2047 - top], 1);  // (a pad: digit 0)
    na += top >= dhi1;
    nl += top < 4;
    n01 += kk[j] <= 1u;
  }
  return make_uint4(kk[0], kk[1], kk[2], kk[3]);
"""),
    _lit("  u32 pmin, pmax, ulo;", "  int wabove, wlow, w01;  // (window: keys above it; keys 0, 1 and -inf; keys 0 and 1)\n"
         "  u32 pmin, pmax, ulo;"),
    _lit("  sm.wcount = 0;\n", "  sm.wcount = 0;\n  sm.wabove = 0;\n  sm.wlow = 0;\n  sm.w01 = 0;\n"),
    _lit("__device__ void lselect(const u32* lk, int* hist, int need, bool primed, Smem& sm, u32& T, int& sh, int& above,\n"
         "                        int& eq) {",
         "__device__ void lselect(const u32* lk, int* hist, int need, bool primed, Smem& sm, u32& T, int& sh, int& above,\n"
         "                        int& eq, int above0 = 0) {"),
    _lit("  above = 0;\n  eq = 0;\n  sh = 0;\n  for (int pass = 0; pass < 3; ++pass) {", """\
  above = 0;
  eq = 0;
  sh = 0;
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 0 && primed) {  // (window: hist holds the first digit's counts in the window; above0 keys above it)
      const int r = need - above0;
      if (tid == 0) sm.bin = -1;
      if (r >= 1) fbin(hist, 2048, r, sm); else __syncthreads();
      if (sm.bin >= 0) {
        above = above0;
      } else {  // (the cutoff outside the window: the whole digit counted again)
        primed = false;
        __syncthreads();
      }
    }"""),
    _lit("    fbin(hist, nb, need - above, sm);\n    prefix |=",
         "    if (pass > 0 || !primed) fbin(hist, nb, need - above, sm);\n    prefix |="),
    _lit("  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;\n  __syncthreads();\n  if (tma) {\n", """\
  for (int i = tid; i < NB; i += THREADS) {
    hist[i] = 0;
    sm.mem[i] = 0;  // (window: the sample's counts)
  }
  __syncthreads();
  int dlo = 0, dhi1 = 2048, na = 0, nl = 0, n01 = 0;  // (window: all of the digit unless sampled)
  if (tma) {
"""),
    _lit("      if (cb == 0) bar_wait(&fbar, 0);\n", """\
      if (cb == 0) {
        bar_wait(&fbar, 0);
        // (window: the sample, one score a thread, offset by the lane so that a warp's reads take 32 banks)
        const u32 skey = order_key((int)lk[min(N - 1, (int)(((i64)tid * N) >> 9) + (tid & 31))], 0);
        atomicAdd(&sm.mem[2047 - (int)(skey >> 21)], 1);
        __syncthreads();
        // the window: the sample's digits at ranks r - m and r + m (r: its (K / N)-quantile's rank; m: three
        // standard deviations of that rank in a sample of 512, and two more), and one more digit either side
        const int r = (int)max((i64)1, min((i64)512, ((i64)K * 512 + N - 1) / N));
        const int m = 2 + (int)(3.0f * sqrtf((float)r * (float)(512 - r) / 512.0f));
        fbin(sm.mem, 2048, max(1, r - m), sm);
        dhi1 = min(2048, sm.bin + 2);
        fbin(sm.mem, 2048, min(512, r + m), sm);
        dlo = max(0, sm.bin - 1);
      }
"""),
    _lit("put_keys(b, d, hist)", "put_keys(b, d, hist, dlo, dhi1, na, nl, n01)", 2),
    _lit("  __syncthreads();\n  int nnan = 0;\n  if (hist[2047] > FI * THREADS - N) {", """\
  na = __reduce_add_sync(FULL, na);  // (window: the counts by register, summed)
  nl = __reduce_add_sync(FULL, nl);
  n01 = __reduce_add_sync(FULL, n01);
  if (lane == 0) {
    if (na) atomicAdd(&sm.wabove, na);
    if (nl) atomicAdd(&sm.wlow, nl);
    if (n01) atomicAdd(&sm.w01, n01);
  }
  __syncthreads();
  int nnan = 0;
  if (sm.w01 > FI * THREADS - N) {"""),
    _lit("  const int ninf = hist[2047 - 3];\n  const int nvalid = FI * THREADS - hist[2047] + nnan;\n",
         "  const int ninf = sm.wlow - sm.w01;\n  const int nvalid = FI * THREADS - sm.w01 + nnan;\n"),
    _lit("      lselect(lk, hist, nsel, true, sm, T1, sh, ab, eq);", "      lselect(lk, hist, nsel, true, sm, T1, sh, ab, eq, sm.wabove);"),
]
VARIANTS = {"match": _MATCH, "peel": _PEEL, "digits11": _DIGITS11, "rank_keys": _RANK_KEYS,
            "spread": _SPREAD, "prefetch": _PREFETCH, "prefetch512": _PREFETCH + _PREFETCH_512,
            "parts_warp": _PARTS_WARP, "tma_ids": _TMA_IDS,
            "emit_u32": _EMIT_U32, "cut_list": _CUT_LIST,
            "tma_split": _TMA_SPLIT, "turn3": _turn(3000), "turn4": _turn(4000), "turn5": _turn(5000),
            "turn7": _turn(7000), "turn8": _turn(8000), "lazy_ids": _LAZY_IDS, "ids_l2": _IDS_L2,
            "hist4": _HIST4, "rank_ilp": _RANK_ILP, "count_after": _COUNT_AFTER, "window": _WINDOW}


def _span(text: str, first: str, last: str, what: str) -> tuple[list[str], int, int]:
    """The module's lines, the one line that holds ``first``, and the first line from it on that holds ``last``."""
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if first in line]
    if len(at) != 1:
        raise ValueError(f"variant {what}: {len(at)} lines of the module hold {first!r}, not one")
    end = next((j for j in range(at[0], len(lines)) if last in lines[j]), None)
    if end is None:
        raise ValueError(f"variant {what}: no line holds {last!r} after {first!r}")
    return lines, at[0], end


def _edit(text: str, edit, what: str) -> str:
    if isinstance(edit, Sub):
        text, n = re.subn(edit.pattern, edit.repl, text)
        if n < edit.count:
            raise ValueError(f"variant {what}: {edit.pattern!r} matched {n} times, fewer than {edit.count}")
        return text
    if callable(edit):  # (an edit built from the module's own text)
        return edit(text)
    first, last, new = edit
    lines, a, b = _span(text, first, last, what)
    return "".join(lines[:a]) + new + "".join(lines[b + 1:])


def module_text(name: str, shipped: str | None = None) -> str:
    """The shipped module's text with the edits of ``name`` (variants joined by ``+``)."""
    with open(shipped or SHIPPED) as f:
        text = f.read()
    for part in name.split("+"):
        if part not in VARIANTS:
            raise KeyError(f"no variant {part!r} (have {', '.join(VARIANTS)})")
        for edit in VARIANTS[part]:
            text = _edit(text, edit, part)
    return text


def write(name: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.py")
    with open(path, "w") as f:
        f.write(f"# bench/block_variants.py: ops/select_block.py with the edits of {name!r}\n" + module_text(name))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for the variants' module files")
    ap.add_argument("names", nargs="*", help=f"variants (default: each of {', '.join(VARIANTS)}); a+b combines")
    args = ap.parse_args(argv)
    for name in args.names or list(VARIANTS):
        print(write(name, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
