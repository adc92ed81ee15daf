"""Variants of the block path's kernel (ops/select_block.py), for A/B timing on a GPU and for
the CPU runner's exactness tests: each is the shipped module with a few exact text edits of its
kernel source (``VARIANTS``), written out as a module file that ``bench/block_ab.py --old`` and
``tests/test_select_block_cpu.py --block-module`` take.

    python3 bench/block_variants.py --out /tmp/variants              # every variant
    python3 bench/block_variants.py --out /tmp/variants scan match   # some; "a+b" combines them
    python3 -m pytest -q tests/test_select_block_cpu.py --block-module /tmp/variants/scan+match.py
    python3 bench/block_ab.py --old /tmp/variants/scan+match.py --out ab.json   # (GPU)

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

# the winners' slots from one scan of the threads' winner counts, not a ballot and an atomic on
# one shared counter for each warp and slot (session 24's profile: 7,900 of 44,900 cycles a block
# at 1024 x 16384)
_SCAN = [
    ("// the winners to shared memory: packed key", "for (int t = 0; t < ITEMS; ++t) {", """\
  // the winners to shared memory: packed key (score key above inverted id), position; a thread's
  // winners in slot order from its offset in a scan of the threads' counts (sm.mem: free until
  // the ordering)
  u32 wins = 0;
#pragma unroll
  for (int t = 0; t < ITEMS; ++t) {
"""),
    ("u32 bal = __ballot_sync(FULL, win);", "__syncthreads();", """\
    wins |= (u32)win << t;
  }
  {
    constexpr int E = 2048 / THREADS;  // (scan2048's entries a thread: its own, read before its first barrier)
    sm.mem[tid * E] = __popc(wins);
#pragma unroll
    for (int e = 1; e < E; ++e) sm.mem[tid * E + e] = 0;
    scan2048(sm.mem, sm);
    int slot = sm.mem[tid * E];
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      if ((wins >> t) & 1u) {
        sm.wkey[slot] = ((i64)u[t] << 31) | (i64)(0x7FFFFFFFu - (u32)id[t]);
        sm.wpos[slot] = t * THREADS + tid;
        ++slot;
      }
    }
  }
  __syncthreads();
"""),
]

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

# two blocks an SM for the 512-thread tile (rows of 4097-8192): 64 registers a thread (session
# 24: 0.73-0.87x the time at 1024 x 8192; not timed at fewer rows)
_LB2_512 = [
    ("__launch_bounds__(THREADS, 1)", "__launch_bounds__(THREADS, 1)",
     'extern "C" __global__ void __launch_bounds__(THREADS, THREADS == 512 ? 2 : 1)\n'),
]

# two blocks an SM for rows of 8193-16384: the row's score keys in dynamic shared memory (64 KB,
# which the ordering's second level takes after the winners are written) and its ids read again
# where needed, so that a tile of 512 threads of 32 candidates fits 64 registers a thread; its
# two blocks an SM hold 2 x 106 KB of shared memory. Session 24's profile: a block of the
# 1024-thread tile is mostly latency (the same cycles at 64 rows as at 1024), and two blocks an SM
# took the 512 tile's time to 0.73x at 1024 x 8192. The tile keeps its name (1024) in the plans.
_SMEM_KEYS = [
    ("DYN_BYTES = MAX_K * 8 * 2 + MAX_K * 4", "DYN_BYTES = ", """\
DYN_BYTES = max(MAX_K * 8 * 2 + MAX_K * 4, 4 * TILE_N)  # the row's keys; then the ordering's second level
SHAPE = {256: (256, 16), 512: (512, 16), 1024: (512, 32)}  # a tile's threads, and candidates a thread
"""),
    ('return (f"#define THREADS {int(threads)}', "#define THREADS {int(threads)}", """\
    return (f"#define THREADS {SHAPE[int(threads)][0]}\\n#define ITEMS {SHAPE[int(threads)][1]}\\n#define KMAX {MAX_K}\\n"
"""),
    ("grid=(q, 1, 1), block=(t, 1, 1), shared_mem=DYN_BYTES,", "block=(t, 1, 1)", """\
            grid=(q, 1, 1), block=(SHAPE[t][0], 1, 1), shared_mem=DYN_BYTES,
"""),
    ('compile_tile(t1, dev.index, "chunks")(', "block=(t1, 1, 1), shared_mem=0,", """\
    compile_tile(t1, dev.index, "chunks")(  # (the row's keys in dynamic shared memory)
        grid=(q, chunks, 1), block=(SHAPE[t1][0], 1, 1), shared_mem=DYN_BYTES,
"""),
    ("grid=(q, 1, 1), block=(t2, 1, 1), shared_mem=DYN_BYTES,", "block=(t2, 1, 1)", """\
        grid=(q, 1, 1), block=(SHAPE[t2][0], 1, 1), shared_mem=DYN_BYTES,
"""),
    # 64 KB is past 48: torch's launcher refuses it unless the kernel's own record says so (H200, session 27)
    ("rc = _driver_library()().cuFuncSetAttribute(", "CUDA error {rc}", """\
                    kern.set_shared_memory_config(DYN_BYTES)  # (sets the attribute, and torch's record of it)
"""),
    ("__device__ __forceinline__ void radix_select(const u32 (&key)[ITEMS]", "radix_select(const u32 (&key)", """\
// a thread's candidate slots as a function of the slot (read like a register array: s[t])
template <class F>
struct Slots {
  F f;
  __device__ __forceinline__ decltype(auto) operator[](int t) const { return f(t); }
};
template <class F>
__device__ __forceinline__ Slots<F> slots(F f) { return Slots<F>{f}; }

template <class K>
__device__ __forceinline__ void radix_select(const K& key, u32 play, int need, int total, int narrow,
"""),
    ("const bool span = THREADS == 1024;", "const bool span", """\
    const bool span = THREADS * ITEMS == 16384;
"""),
    ("__launch_bounds__(THREADS, 1)", "__launch_bounds__(THREADS, 1)", """\
extern "C" __global__ void __launch_bounds__(THREADS, THREADS * ITEMS == 16384 ? 2 : 1)
"""),
    ("  u32 u[ITEMS];", "  int id[ITEMS];", """\
  u32* const keys = reinterpret_cast<u32*>(dyn);  // the row's score keys, slot t of thread tid at t * THREADS + tid
  const auto u = slots([&](int t) -> u32& { return keys[t * THREADS + tid]; });
  const auto id = slots([&](int t) -> int {
    const int p = t * THREADS + tid;
    return p < N ? __ldg(irow + p) : -1;
  });
"""),
    ("id[t] = p < N ? __ldg(irow + p) : -1;", "if (id[t] >= 0) {", """\
    const int idt = p < N ? __ldg(irow + p) : -1;
    u[t] = order_key(b, idt);
    if (idt >= 0) {
"""),
    ("u32 v[ITEMS];", "v[t] = 0x7FFFFFFFu - (u32)id[t];", """\
      const auto v = slots([&](int t) -> u32 { return 0x7FFFFFFFu - (u32)id[t]; });
      u32 play = 0;
#pragma unroll
      for (int t = 0; t < ITEMS; ++t) {
"""),
    ("u32 w[ITEMS];", "w[t] = ~(u32)position(t * THREADS + tid);", """\
        const auto w = slots([&](int t) -> u32 { return ~(u32)position(t * THREADS + tid); });
        u32 play3 = 0;
#pragma unroll
        for (int t = 0; t < ITEMS; ++t) {
          if (((play >> t) & 1u) && v[t] == T2) {
            play3 |= 1u << t;
"""),
    # the loops over a thread's slots unrolled by 8, not whole: whole, nvcc keeps 112 registers (248 /
    # 800 bytes spilled at 64); by 8, 55 and none spilled (nvcc 13.0, sm_90)
    Sub(r"#pragma unroll\n(\s*for \(int t = 0; t < ITEMS; \+\+t\))", r"#pragma unroll 8\n\1", 6),
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

# a block scan in CUDA for the kernels of the sampled and spread variants: the Python text that defines
# BLOCK_SCAN in a variant's module (either variant's edits carry it)
_BLOCK_SCAN_DEF = '''
BLOCK_SCAN = r"""
// the exclusive sum over a block of T threads of v (one value a thread), and the block's total
// (wsum: T / 32 + 1 ints of shared memory, free again on return)
template <int T>
__device__ __forceinline__ int block_scan(int v, int* wsum, int& total) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  if (tid < 32) {
    const int w = tid < T / 32 ? wsum[tid] : 0;
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(FULL, wi, o);
      if (tid >= o) wi += y;
    }
    if (tid < T / 32) wsum[tid] = wi - w;
    if (tid == 31) wsum[T / 32] = wi;
  }
  __syncthreads();
  total = wsum[T / 32];
  const int ex = wsum[warp] + incl - v;
  __syncthreads();
  return ex;
}
"""
'''

# rows in chunks (beyond 16384, or a shorter chunk): a sampled keep instead of a whole selection a
# chunk. Kernel "sample" (a block a row) sorts an even sample of the row's packed keys (2048, or
# the row) and takes as the cutoff the key that should leave about 2 k of the row at or above it;
# kernel "keep" (a block of 256 threads a 4096 candidates) sends every candidate at or above the
# cutoff to a workspace row with its position (a block scan, one global atomic a block); the row's
# last block (a ticket) writes the row's status: the kept count, or -1 where the kept ones may
# miss a winner (fewer than min(k, valid)) or do not fit the workspace row. The chunks kernel runs
# only for rows of -1 (kind chunks_gated) and fills the same workspace; the merge (merge_gated)
# orders the kept ones or the chunks' winners. Exact either way: where at least min(k, valid)
# candidates reach a packed key, the best k are among them (equal packed keys are all kept).
# Session 23: at 1024 rows of 20000-32768 (mass ties) the block path took 0.89-0.92x fp32 topk's
# speed, and at 64-1024 rows of 65536-131072 the row kernel won: each chunk costs about a whole
# 16384 row.
_SAMPLED = [
    ("_POS_IN, _UNORDERED = 1, 2", 'KINDS = {"row": 0,', """\
_POS_IN, _UNORDERED, _GATED = 1, 2, 4  # SOURCE's MODE bits
_SAMPLE, _KEEP = 8, 16  # SAMPLED_SOURCES' kernels (MODE: a kind's number only)
KINDS = {"row": 0, "chunks": _UNORDERED, "merge": _POS_IN, "chunks_gated": _UNORDERED | _GATED,
         "merge_gated": _POS_IN | _GATED, "sample": _SAMPLE, "keep": _KEEP}
SAMPLE_THREADS, KEEP_THREADS, KEEP_ITEMS = 1024, 256, 16  # the sample's and the keep's blocks
KIND_THREADS = {"sample": SAMPLE_THREADS, "keep": KEEP_THREADS}  # kinds of one block size
SAMPLED_TARGET, SAMPLED_WIDTH = 2.0, 4.0  # x k: what the sample aims to keep a row; the workspace row (the merge's most)


def sampled_sizes(chunks: int, kc: int, k: int) -> tuple[int, int]:
    # the sampled keep's workspace row (the kept candidates, or the chunks' winners where the keep
    # may miss one), and what the sample aims to keep a row
    w = max(chunks * kc, min(TILE_N, int(SAMPLED_WIDTH * k)))
    return w, max(1, min(int(SAMPLED_TARGET * k), 3 * w // 4))
"""),
    ('return (("row", tile(n)),) if chunks == 1', 'return (("row", tile(n)),) if chunks == 1', """\
    if chunks == 1:
        return (("row", tile(n)),)
    w = sampled_sizes(chunks, kc, k)[0]  # block_select's workspace row
    return (("sample", SAMPLE_THREADS), ("keep", KEEP_THREADS), ("chunks_gated", tile(chunk)), ("merge_gated", tile(w)))
"""),
    ('f"#define POS_IN {_POS_IN}', "+ SOURCE)", """\
            f"#define POS_IN {_POS_IN}\\n#define UNORDERED {_UNORDERED}\\n#define GATED {_GATED}\\n"
            f"#define SB {SAMPLE_THREADS}\\n#define KB {KEEP_THREADS}\\n#define KI {KEEP_ITEMS}\\n"
            f"#define MODE {KINDS[kind]}\\n" + SAMPLED_SOURCES.get(kind, SOURCE))
"""),
    ("int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op) {",
     "int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op) {", """\
                    int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op,
                    const int* __restrict__ stat) {
"""),
    ("if (mode & UNORDERED) N = min(chunk, N - base);", "if (mode & UNORDERED) N = min(chunk, N - base);", """\
  if (mode & UNORDERED) N = min(chunk, N - base);
#if MODE & GATED  // after the sampled keep: the row's kept count, or -1 where the chunks serve the row
  {
    const int nkeep = __ldg(stat + row * 4 + 3);
    if ((mode & UNORDERED) && nkeep >= 0) return;  // (the whole block, before any barrier)
    if (!(mode & UNORDERED) && nkeep >= 0) N = nkeep;
  }
#endif
"""),
    ("_KERNELS: dict = {}  # (device index, threads, kind)", "_KERNELS: dict = {}", _BLOCK_SCAN_DEF + """\
_SAMPLED_HEAD = r'''
// the sampled keep (kinds sample and keep): blocks of their own sizes (SB; KB x KI: source(...) defines them)
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define SAMPLES 2048

''' + ORDER_KEY + r'''
// the packed key (score key above inverted id, as SOURCE's winners); 0: invalid (id < 0)
__device__ __forceinline__ u64 packed_key(int bits, int id) {
  return id < 0 ? 0 : ((u64)order_key(bits, id) << 31) | (u64)(0x7FFFFFFFu - (u32)id);
}
''' + BLOCK_SCAN
SAMPLED_SOURCES = {"sample": _SAMPLED_HEAD + r'''
// a block a row: the packed keys of S = min(N, SAMPLES) evenly spaced candidates, sorted (bitonic,
// descending); the cutoff is the r-th, r = ceil(target S / N): about target of the row at or above
// it. Resets the row's status for the keep.
static_assert(SB * 2 == SAMPLES, "a thread compares one pair a step");
extern "C" __global__ void __launch_bounds__(SB, 1)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, u64* __restrict__ cut,
                    int* __restrict__ stat, int N, int target, int s_sq, int s_iq) {
  __shared__ u64 key[SAMPLES];
  const int tid = threadIdx.x;
  const i64 row = blockIdx.x;
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  const int S = min(N, SAMPLES);
  for (int j = tid; j < SAMPLES; j += SB) {
    u64 kk = 0;
    if (j < S) {
      const int p = (int)((i64)j * N / S);
      kk = packed_key(__ldg(srow + p), __ldg(irow + p));
    }
    key[j] = kk;
  }
  for (int size = 2; size <= SAMPLES; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      const int i = 2 * tid - (tid & (stride - 1));
      const u64 a = key[i], b = key[i + stride];
      if ((a < b) == ((i & size) == 0)) {
        key[i] = b;
        key[i + stride] = a;
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    const i64 r = S > 0 ? min((i64)S, max((i64)1, ((i64)target * S + N - 1) / N)) : 1;
    cut[row] = key[r - 1];  // (0, an invalid sample: every valid candidate is kept)
    for (int j = 0; j < 4; ++j) stat[row * 4 + j] = 0;
  }
}
''', "keep": _SAMPLED_HEAD + r'''
// grid (rows, blocks of KB threads x KI candidates): the candidates at or above the row's cutoff to
// slots [0, cap) of the workspace row; stat[row]: kept, valid, blocks done, then (the last block)
// the status: the kept count where they hold the winners and fit, else -1
extern "C" __global__ void __launch_bounds__(KB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const u64* __restrict__ cut,
                    int* __restrict__ stat, int* __restrict__ w_ids, float* __restrict__ w_sc,
                    int* __restrict__ w_pos, int N, int cap, int K, int s_sq, int s_iq, int s_w) {
  __shared__ int wsum[KB / 32 + 1];
  __shared__ int first;  // the block's first slot in the workspace row
  const int tid = threadIdx.x;
  const i64 row = blockIdx.x;
  const int base = blockIdx.y * (KB * KI);
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  const u64 c = __ldg(cut + row);
  int bits[KI], id[KI];
  u32 keep = 0;
  int nv = 0;
#pragma unroll
  for (int t = 0; t < KI; ++t) {
    const int p = base + t * KB + tid;
    bits[t] = p < N ? __ldg(srow + p) : 0;
    id[t] = p < N ? __ldg(irow + p) : -1;
    if (id[t] >= 0) {
      ++nv;
      if (packed_key(bits[t], id[t]) >= c) keep |= 1u << t;
    }
  }
  int nkept, nvalid;
  int slot = block_scan<KB>(__popc(keep), wsum, nkept);
  block_scan<KB>(nv, wsum, nvalid);
  if (tid == 0) {  // the block's slots: one atomic on the row's count
    first = atomicAdd(stat + row * 4, nkept);
    atomicAdd(stat + row * 4 + 1, nvalid);
  }
  __syncthreads();
  slot += first;
#pragma unroll
  for (int t = 0; t < KI; ++t) {
    if ((keep >> t) & 1u) {
      if (slot < cap) {
        w_ids[row * s_w + slot] = id[t];
        reinterpret_cast<int*>(w_sc)[row * s_w + slot] = bits[t];
        w_pos[row * s_w + slot] = base + t * KB + tid;
      }
      ++slot;
    }
  }
  if (tid == 0) {  // the row's last block writes its status
    __threadfence();
    const int done = atomicAdd(stat + row * 4 + 2, 1);
    if (done == (int)gridDim.y - 1) {
      __threadfence();
      const int kept = atomicAdd(stat + row * 4, 0), valid = atomicAdd(stat + row * 4 + 1, 0);
      stat[row * 4 + 3] = (kept <= cap && (kept >= K || kept == valid)) ? kept : -1;
    }
  }
}
'''}

_KERNELS: dict = {}  # (device index, threads, kind) -> compiled function
"""),
    ("args=[scores, ids, ids, out_ids, out_sc, out_ids, n, k, n,", "out_ids.stride(0), out_sc.stride(0), 0])", """\
            args=[scores, ids, ids, out_ids, out_sc, out_ids, n, k, n, scores.stride(0), ids.stride(0), 0,
                  out_ids.stride(0), out_sc.stride(0), 0, out_ids])
"""),
    ("m = chunks * kc  # the merge's candidates a row", "return out_ids, out_sc", """\
    m = chunks * kc  # the chunks' winners a row (where the sampled keep may miss one)
    w, target = sampled_sizes(chunks, kc, k)
    w_ids = torch.empty((q, w), dtype=torch.int32, device=dev)
    w_sc = torch.empty((q, w), dtype=torch.float32, device=dev)
    w_pos = torch.empty((q, w), dtype=torch.int32, device=dev)
    cut = torch.empty((q,), dtype=torch.int64, device=dev)
    stat = torch.empty((q, 4), dtype=torch.int32, device=dev)
    compile_tile(SAMPLE_THREADS, dev.index, "sample")(
        grid=(q, 1, 1), block=(SAMPLE_THREADS, 1, 1), shared_mem=0,
        args=[scores, ids, cut, stat, n, target, scores.stride(0), ids.stride(0)])
    compile_tile(KEEP_THREADS, dev.index, "keep")(
        grid=(q, -(-n // (KEEP_THREADS * KEEP_ITEMS)), 1), block=(KEEP_THREADS, 1, 1), shared_mem=0,
        args=[scores, ids, cut, stat, w_ids, w_sc, w_pos, n, w, k, scores.stride(0), ids.stride(0), w])
    t1, t2 = tile(chunk), tile(w)
    shape = globals().get("SHAPE")  # (with smem_keys: a tile's threads; the chunks' keys in shared memory)
    b1, b2, smem1 = (shape[t1][0], shape[t2][0], DYN_BYTES) if shape else (t1, t2, 0)
    compile_tile(t1, dev.index, "chunks_gated")(  # (rows whose keep may miss a winner; the others return)
        grid=(q, chunks, 1), block=(b1, 1, 1), shared_mem=smem1,
        args=[scores, ids, ids, w_ids, w_sc, w_pos, n, kc, chunk, scores.stride(0), ids.stride(0), 0, w, w, w, stat])
    compile_tile(t2, dev.index, "merge_gated")(
        grid=(q, 1, 1), block=(b2, 1, 1), shared_mem=DYN_BYTES,
        args=[w_sc, w_ids, w_pos, out_ids, out_sc, out_ids, m, k, m, w, w, w, out_ids.stride(0), out_sc.stride(0), 0,
              stat])
    if STATS is not None:
        STATS.append(stat)
    return out_ids, out_sc


STATS = None  # a list: each chunked call appends its rows' status (tests: which rows the keep served)
"""),
]

# sampled with a cheap sample: 512 keys (not 2048) in a block of 256 threads (not 1024), and the
# cutoff (the r-th largest) found by counting, each thread its two keys against all 512 (one shared
# broadcast load a key), not by a bitonic sort of 66 barrier steps. Session 27: the sort's sample
# took 126-143 µs at 1024 rows of 16384-32768 and 20 at 64 x 131072, as much as a whole selection;
# the keep and the merge alone took 340-370 at 1024 x 32768, less than the shipped path's 389 (random)
# and 567 (ties). 512 keys: about 64 above the cutoff at 32768 candidates (a spread of about 1/8),
# 16 at 131072 (about 1/4), where a row the sample misjudges falls back to the chunks.
_COUNT_SAMPLE = [
    Sub(r"SAMPLE_THREADS, KEEP_THREADS, KEEP_ITEMS = 1024, 256, 16  # the sample's and the keep's blocks",
        "SAMPLE_THREADS, KEEP_THREADS, KEEP_ITEMS = 256, 256, 16  # the sample's and the keep's blocks\n"
        "SAMPLES = 512  # the sample's keys a row at most (the kernels' SAMPLES)", 1),
    Sub(r"#define SAMPLES 2048", "#define SAMPLES 512", 1),
    Sub(r"(?s)// a block a row: the packed keys of S = min\(N, SAMPLES\) evenly spaced candidates, sorted.*?"
        r"extern \"C\" __global__ void __launch_bounds__\(SB, 1\)\n", r"""// a block of SB threads a row: the packed keys of S = min(N, SAMPLES) evenly spaced candidates, SK a
// thread; the cutoff is the r-th largest, r = ceil(target S / N) (about target of the row at or above
// it), found by counting: the key with fewer than r keys above it and at least r at or above it
// (equal keys, a duplicate id's, write the same value). Resets the row's status for the keep.
static_assert(SAMPLES % SB == 0, "SK keys a thread");
#define SK (SAMPLES / SB)
extern "C" __global__ void __launch_bounds__(SB)
""", 1),
    Sub(r"(?s)(  const int S = min\(N, SAMPLES\);\n)  for \(int j = tid; j < SAMPLES; j \+= SB\) \{.*?\n(''', \"keep\": )",
        r"""\1  u64 mine[SK];
#pragma unroll
  for (int m = 0; m < SK; ++m) {
    const int j = m * SB + tid;
    mine[m] = 0;
    if (j < S) {
      const int p = (int)((i64)j * N / S);
      mine[m] = packed_key(__ldg(srow + p), __ldg(irow + p));
    }
    key[j] = mine[m];
  }
  if (tid < 4) stat[row * 4 + tid] = 0;
  if (S == 0 && tid == 0) cut[row] = 0;  // (no candidate: every valid one is kept)
  __syncthreads();
  const i64 r = min((i64)S, max((i64)1, ((i64)target * S + N - 1) / max(N, 1)));
  int gt[SK], ge[SK];
#pragma unroll
  for (int m = 0; m < SK; ++m) gt[m] = ge[m] = 0;
  for (int j = 0; j < S; ++j) {
    const u64 o = key[j];
#pragma unroll
    for (int m = 0; m < SK; ++m) {
      gt[m] += o > mine[m];
      ge[m] += o >= mine[m];
    }
  }
#pragma unroll
  for (int m = 0; m < SK; ++m)
    if (m * SB + tid < S && gt[m] < r && r <= ge[m]) cut[row] = mine[m];
}
\2""", 1),
]

# the keep by warps: each warp of a keep block on its 512 candidates alone (item t of lane l at
# 32 t + l: a load of a slot is 128 consecutive bytes), its kept count and first slot from one atomic
# on the row's count, its kept written in slot order by a ballot a slot (consecutive lanes, consecutive
# slots), and the row's last warp (a ticket a warp) writing the status. No block scan, no barrier, no
# thread waiting on another's atomic. Session 27: the block keep took 145-147 µs at 1024 x 16384 (a
# quarter of the row kept) and 34 at 64 x 131072 (1/32 kept), 0.2x the time for 0.5x the blocks: the
# cost follows what is kept, which the block keep stores a thread's kept at a time, scattered
# (a thread's slots follow its lower neighbours' counts).
_KEEP_WARP = [
    Sub(r"(?s)// grid \(rows, blocks of KB threads x KI candidates\): the candidates at or above the row's cutoff to\n.*?"
        r"(extern \"C\" __global__ void __launch_bounds__\(KB\)\n)", r"""// grid (rows, blocks of KB threads x KI candidates), each warp on its own 32 x KI: the candidates at
// or above the row's cutoff to slots [0, cap) of the workspace row with their positions; stat[row]:
// kept, valid, warps done, then (the row's last warp) the status: the kept count where they hold the
// winners and fit, else -1
\1""", 1),
    Sub(r"  __shared__ int wsum\[KB / 32 \+ 1\];\n  __shared__ int first;[^\n]*\n  const int tid = threadIdx.x;\n",
        "  const int lane = threadIdx.x & 31;\n", 1),
    Sub(r"  const int base = blockIdx.y \* \(KB \* KI\);\n",
        "  const int base = blockIdx.y * (KB * KI) + (threadIdx.x >> 5) * (32 * KI);  // the warp's first candidate\n", 1),
    Sub(r"    const int p = base \+ t \* KB \+ tid;\n", "    const int p = base + t * 32 + lane;\n", 1),
    Sub(r"(?s)  int nkept, nvalid;\n  int slot = block_scan<KB>.*?\n(  if \(tid == 0\) \{  // the row's last block writes its status\n)",
        r"""  const int kept = __reduce_add_sync(FULL, __popc(keep)), valid = __reduce_add_sync(FULL, nv);
  int slot = 0;
  if (lane == 0) {  // the warp's slots: one atomic on the row's count
    if (kept) slot = atomicAdd(stat + row * 4, kept);
    if (valid) atomicAdd(stat + row * 4 + 1, valid);
  }
  slot = __shfl_sync(FULL, slot, 0);
#pragma unroll
  for (int t = 0; t < KI; ++t) {
    const u32 b = __ballot_sync(FULL, (keep >> t) & 1u);
    if ((keep >> t) & 1u) {
      const int at = slot + __popc(b & ((1u << lane) - 1u));
      if (at < cap) {
        w_ids[row * s_w + at] = id[t];
        reinterpret_cast<int*>(w_sc)[row * s_w + at] = bits[t];
        w_pos[row * s_w + at] = base + t * 32 + lane;
      }
    }
    slot += __popc(b);
  }
\1""", 1),
    Sub(r"  if \(tid == 0\) \{  // the row's last block writes its status\n(    __threadfence\(\);\n[^\n]*\n)"
        r"    if \(done == \(int\)gridDim.y - 1\) \{\n",
        r"  if (lane == 0) {  // the row's last warp writes its status\n\1"
        r"    if (done == (int)gridDim.y * (KB / 32) - 1) {\n", 1),
    Sub(r"const int kept = atomicAdd\(stat \+ row \* 4, 0\), valid = atomicAdd\(stat \+ row \* 4 \+ 1, 0\);\n"
        r"      stat\[row \* 4 \+ 3\] = \(kept <= cap && \(kept >= K \|\| kept == valid\)\) \? kept : -1;",
        "const int kall = atomicAdd(stat + row * 4, 0), vall = atomicAdd(stat + row * 4 + 1, 0);\n"
        "      stat[row * 4 + 3] = (kall <= cap && (kall >= K || kall == vall)) ? kall : -1;", 1),
]

# sampled, and rows of one block too, from SAMPLED_ROWS rows and 8 k candidates (a 16384 row at k =
# 2048): the sampled keep leaves the merge about 2 k of the row (its load and score level a quarter
# of the row's), and the keep's blocks read the row at the memory's pace. Session 24's profile: a
# 1024 x 16384 block spends 9,000 of 45,000 cycles loading and 11,000 on the score level
_SAMPLED_ROWS = [
    Sub(r"    if chunks == 1:\n        t = tile\(n\)", """\
    if chunks == 1 and not (q >= SAMPLED_ROWS and n >= 8 * k):
        t = tile(n)""", 1),
    ("STATS = None  # a list", "STATS = None  # a list", """\
STATS = None  # a list: each chunked call appends its rows' status (tests: which rows the keep served)
SAMPLED_ROWS = 256  # rows of one block: the sampled keep from this many rows
"""),
]

# sampled_rows with a tighter keep: about 1.5 k kept a row in a workspace row of 2 k (4096 at k = 2048,
# the 256-thread merge where the chunks' winners fit it), so the merge loads and selects less and
# its tile is smaller; more rows fall back to the chunks where the sample is sparse (about 48 of
# 2048 samples above the cutoff at 131072 candidates)
_TIGHT = [Sub(r"SAMPLED_TARGET, SAMPLED_WIDTH = 2\.0, 4\.0", "SAMPLED_TARGET, SAMPLED_WIDTH = 1.5, 2.0", 1)]

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
    ("def plan_kernels(", "def plan_kernels(", '''\
_SPREAD_BIT = 32  # SOURCE's MODE bit: the finish of the spread path
KINDS.update({"finish": _POS_IN | _SPREAD_BIT, "hist": 64, "compact": 128, "rank": 192})
SPREAD_ROWS, SPREAD_THREADS, SPREAD_ITEMS = 4, 256, 8  # up to this many rows of one block; its blocks
KIND_THREADS = {**globals().get("KIND_THREADS", {}), "hist": SPREAD_THREADS, "compact": SPREAD_THREADS,
                "rank": SPREAD_THREADS}


def plan_kernels(n: int, k: int, chunk: int | None = None, q: int | None = None) -> tuple[tuple[str, int], ...]:
    """As the shipped plan; with ``q`` (rows) up to SPREAD_ROWS and a row of one block, the spread
    path's kernels."""
    if q is not None and q <= SPREAD_ROWS and chunking(n, k, chunk)[0] == 1:
        return (("hist", SPREAD_THREADS), ("compact", SPREAD_THREADS), ("finish", tile(n)), ("rank", SPREAD_THREADS))
    return _plan_kernels_one_path(n, k, chunk)


def _plan_kernels_one_path(n: int, k: int, chunk: int | None = None) -> tuple[tuple[str, int], ...]:
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
    ("def compile_tile(", "def compile_tile(", _BLOCK_SCAN_DEF + '''\
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
    shape = globals().get("SHAPE")  # (combined with smem_keys: a tile's threads)
    more = [st] if "const int* __restrict__ stat) {" in SOURCE else []  # (combined with sampled: its gate's argument)
    compile_tile(t, dev.index, "finish")(  # (the merge kernel on the in-play list; out_pos: the rows' status)
        grid=(q, 1, 1), block=(shape[t][0] if shape else t, 1, 1), shared_mem=DYN_BYTES,
        args=[p_sc, p_id, p_pos, out_ids, out_sc, st, n, k, n, n, n, n, out_ids.stride(0), out_sc.stride(0), 0, *more])
    compile_tile(SPREAD_THREADS, dev.index, "rank")(
        grid=(q, -(-k // SPREAD_THREADS), 1), block=b, shared_mem=0,
        args=[scores, ghist, gofs, st, wkey, wpos, out_ids, out_sc, k, scores.stride(0), out_ids.stride(0),
              out_sc.stride(0)])
    return out_ids, out_sc


def compile_tile(threads: int, device: int | None = None, kind: str = "row"):
'''),
    Sub(r"(    chunks, chunk, kc = chunking\(n, k, chunk\)\n)(    if chunks == 1[^\n]*\n        t = tile\(n\))",
        r"\1    if chunks == 1 and q <= SPREAD_ROWS:\n        return _spread_select(scores, ids, k, out_ids, out_sc)\n\2", 1),
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


def dyn_bytes(threads: int, kind: str) -> int:
    # the ordering's dynamic shared memory, and a prefetching row kind's row (scores and ids) after it
    return DYN_BYTES + (8 * threads * ITEMS if kind == "row" and threads in PREFETCH_TILES else 0)


def row_blocks(q: int, threads: int, dev) -> int:
    # the row kind's blocks: a row each, or a prefetching tile's one an SM (its shared memory holds one)
    if threads not in PREFETCH_TILES:
        return q
    sms = PREFETCH_BLOCKS or (torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 3)
    return min(q, sms)
"""),
    Sub(r'(\n *)(f"#define POS_IN \{_POS_IN\})',
        r"""\1f"#define PREFETCH {int(kind == 'row' and int(threads) in PREFETCH_TILES)}\\n#define ROWBUF_AT {DYN_BYTES}\\n"\1\2""",
        1),
    Sub(r"_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,\n(\s+)DYN_BYTES\)",
        r"_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,\n\1dyn_bytes(threads, kind))", 1),
    Sub(r"\(dynamic shared memory \{DYN_BYTES\} B\)", "(dynamic shared memory {dyn_bytes(threads, kind)} B)", 1),
    Sub(r"(CUDA error \{rc\}\"\)\n)", r"""\1                if dyn_bytes(threads, kind) >= 48 * 1024:  # (torch's launcher refuses it unconfigured)
                    with torch.cuda.device(index):
                        kern.set_shared_memory_config(dyn_bytes(threads, kind))
""", 1),
    Sub(r"grid=\(q, 1, 1\), block=\(t, 1, 1\), shared_mem=DYN_BYTES,",
        'grid=(row_blocks(q, t, dev), 1, 1), block=(t, 1, 1), shared_mem=dyn_bytes(t, "row"),', 1),
    Sub(r'(shared_mem=dyn_bytes\(t, "row"\),\n\s+args=\[scores, ids, ids, out_ids, out_sc, out_ids, n, k, n, '
        r'scores\.stride\(0\), ids\.stride\(0\), 0,\n\s+out_ids\.stride\(0\), out_sc\.stride\(0\), )0', r"\1q", 1),
]

# prefetch for rows of 4097-8192 too (the 512 tile: 146 KB of shared memory a block, one block an SM
# as in the shipped kernel, whose 96 registers a thread leave no room for a second; session 24: a
# 1024 x 8192 block spends 5,600 of 34,800 cycles loading its row)
_PREFETCH_512 = [Sub(r"PREFETCH_TILES = \(1024,\)", "PREFETCH_TILES = (512, 1024)", 1)]

VARIANTS = {"scan": _SCAN, "match": _MATCH, "peel": _PEEL, "lb2_512": _LB2_512, "smem_keys": _SMEM_KEYS,
            "digits11": _DIGITS11, "rank_keys": _RANK_KEYS, "sampled": _SAMPLED,
            "sampled_rows": _SAMPLED + _SAMPLED_ROWS, "sampled_rows_tight": _SAMPLED + _SAMPLED_ROWS + _TIGHT,
            "spread": _SPREAD, "prefetch": _PREFETCH, "sampled_count": _SAMPLED + _COUNT_SAMPLE,
            "sampled_fast": _SAMPLED + _COUNT_SAMPLE + _KEEP_WARP,
            "prefetch512": _PREFETCH + _PREFETCH_512}


def _edit(text: str, edit, what: str) -> str:
    if isinstance(edit, Sub):
        text, n = re.subn(edit.pattern, edit.repl, text)
        if n < edit.count:
            raise ValueError(f"variant {what}: {edit.pattern!r} matched {n} times, fewer than {edit.count}")
        return text
    first, last, new = edit
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if first in line]
    if len(at) != 1:
        raise ValueError(f"variant {what}: {len(at)} lines of the module hold {first!r}, not one")
    end = next((j for j in range(at[0], len(lines)) if last in lines[j]), None)
    if end is None:
        raise ValueError(f"variant {what}: no line holds {last!r} after {first!r}")
    return "".join(lines[:at[0]]) + new + "".join(lines[end + 1:])


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
