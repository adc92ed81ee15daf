"""Exact ordered top-k selection with CUDA thread blocks (the *block* path): one block a row of
up to ``TILE_N`` (16384) candidates; a longer row (up to ``MAX_N``, 131072) in chunks, a block
each, and one block a row merging their best.

``block_select(scores, ids, k)`` gives what ``select_kernel.triton_ordered_select`` gives (DESIGN.md's
Order rule, bit for bit: score key descending with +0 before -0 and every NaN below -inf, then
id ascending, then position ascending; pads are id -1 with score -inf past the valid
candidates) for rows of at most ``MAX_N`` candidates. The kernel (``SOURCE``, CUDA C++) is
compiled at run time by NVRTC through ``torch.cuda._compile_kernel`` (torch's private API:
``available()`` feature-detects it) into one function a tile and kind (``KINDS``: row, chunks,
merge, and the sampled keep's sample, keep, chunks_gated, merge_gated), each in a fraction of a
second to a second.

Why CUDA here: a thread block controls its shared memory, which a Triton program cannot
allocate. Histograms are shared atomics, and the winners are ordered in shared memory. On an
H200 (docs/benchmarks_select_kernel.md, session 22) this took 0.49-0.88x the Triton row
kernel's time at 8-4096 rows of 4096-16384 candidates.

The kernel, one block of ``tile(n)`` threads a row (kind ``row``):
* The row stays in registers, 16 candidates a thread (``ITEMS``): candidate ``t * THREADS +
  tid`` sits in thread ``tid``'s slot ``t``. One block an SM, but the 512 tile runs two (its
  kinds' ``PAIRED`` functions, 64 registers a thread) where a launch has more blocks than SMs
  (``paired``, session 32).
* The k-th key is found by radix select with 8-bit digits, each histogram built by shared
  atomics. It runs on the unsigned score key (at most 4 passes, stopping at the first bin that
  holds exactly the candidates still wanted; in the 1024-thread tile also at a pass whose keys
  in play are all equal). Where candidates tie at that key, it runs again on the inverted id
  among them, then on the inverted position. Where the counts of the row's -inf and NaN scores
  (taken as the row loads) put the k-th key at -inf (a short context padded with -inf), the
  score key takes no pass.
* The winners go to shared memory as packed keys (score key above the inverted id, as in
  ``radix.packed_key``) and positions, a thread's in slot order from its offset in a block scan
  of the threads' winner counts (since session 30; a ballot and an atomic a warp and slot before:
  3.6-8.2 % slower at 8-4096 rows of 8192-16384 on an H200).
* Ordering by bucket rank, as ``radix.order_row`` does it, in shared memory:
  - three parts (positive score keys, negative ones, the tie at the smallest score key), each
    mapped over its own key range into buckets in proportion to its winners;
  - one shared atomic a winner gives its slot in its bucket, and a scan gives the buckets'
    offsets;
  - where a bucket holds more than ``SPLIT`` winners, every bucket splits again over its own key
    range (min and max by shared atomics, at the bucket's offset) into as many sub-buckets as it
    holds;
  - a winner's rank in its (sub-)bucket counts the members before it: a larger key, or an equal
    key at an earlier position.
* Output: ids and score bits from the packed keys (the order key maps every score but NaN one to
  one, ``key_bits``); a NaN's bits read again from the row at its position, so NaN payloads
  survive.

Kind ``filter`` (session 34): the 1024 tile's rows (8193-16384 candidates) where a launch has more
rows than ``FILTER_OVER_SMS`` x the device's SMs. A block of 512 threads a row, two blocks an SM: the
row's score keys go to dynamic shared memory (64 KB, ``FILTER_DYN``), not registers, their first
11-bit digit counted as they load (the scores by one bulk copy on sm_90 and later where N is a
multiple of 4 and both rows start 16-byte aligned, the ids by 16-byte loads; else 16-byte loads where
the rows allow; a pad's too, in the lowest bin, so no branch). Nothing else is counted a candidate:
the valid and -inf counts come from that digit's bins, the NaN from one more pass only where the
lowest bin holds more than the pads past N. Radix select over them by digits of 11, 11 and 10 bits; each level's winners go
to shared memory as soon as they are known (where all of level 1's bin wins, their positions are
compacted by the bits of a thread's mask and their keys and ids gathered; else level 1 reads the ids
of a group of four holding a winner or a tie again, in one load), and where the exact k-th key ties,
the tied keys are rewritten in place as the next level's (inverted id, then inverted position). The
ordering and the output are the row kind's. H100, graph replay, k = 2048
(docs/benchmarks_select_kernel.md, sessions 34-35): 0.76-0.82x the row kind's time on random scores at
256-4096 rows of 9000-16384 (1024 x 16384: 126 against 162 µs), 0.84-0.89x on mass ties, 0.91-0.96x
on a short context; at 133 rows 0.80-0.96x; at 64 rows (one wave) 1.27x, so it stays off there.
Session 35's gather and branchless count took 0.87-0.91x more of that time (1024 x 16384: 115 µs).
Session 36's bulk copy, counts from the digit's bins and passes with no test for a key of 0 took
0.93-0.98x more of that time (1024 x 16384: 108.5 µs). Session 37's turns at the load (a block that
arrives within a row's load time of its SM's last block waits for the rest of it, so that one block an
SM loads while the other computes, where a launch has more blocks than two an SM) and the load's id rounds
unrolled took 0.93x more at 1024 x 16384 (101.2 µs); session 38's longer turn, 0.98-0.99x more (100.1-100.2 µs).

A row of more than ``TILE_N`` candidates (or any row, given a shorter ``chunk``: ``chunking``):
* kind ``chunks``, a block a chunk (grid rows x chunks): the same selection on the chunk, and its
  first ``kc = min(k, chunk)`` winners, in no order, with their positions in the row, to a
  workspace of ``chunks x kc`` a row (no ordering, no dynamic shared memory);
* kind ``merge``, a block a row: the same kernel on the workspace row, ordered, a candidate's
  position (the last tie-break, equal keys) read from the workspace. Exact: a row's best ``k``
  are among its chunks' best ``k``. The merge holds ``chunks x kc <= TILE_N``: 8 chunks of
  16384 at k = 2048.

From ``SAMPLED_MIN_ROWS`` (64) rows a call (and where the dispatcher asks, ``keep``: beyond one wave
of chunks, session 32), rows in chunks take the sampled keep instead (session 30), which reads the
row about once rather than selecting each chunk whole:
* kind ``sample``, a block of 256 threads a row: the packed keys of up to 512 evenly spaced
  candidates; the cutoff is the key about ``SAMPLED_TARGET x k`` of the row should reach, the r-th
  largest of the sample, found by counting (each thread its two keys against all 512);
* kind ``keep``, warps of 32 x 16 candidates: every candidate at or above the cutoff to a
  workspace row of ``max(chunks x kc, SAMPLED_WIDTH x k)`` slots (one atomic a warp on the row's
  count, slots in order by a ballot a step); the row's last warp writes its status: the kept count,
  or -1 where the kept ones may miss a winner (fewer than ``min(k, valid)``) or do not fit;
* kinds ``chunks_gated`` and ``merge_gated``: the chunks as above for the rows of status -1 only
  (the others' blocks return at once), then the merge of the workspace row (the kept candidates, or
  the chunks' winners). Exact either way: where at least ``min(k, valid)`` candidates reach a
  packed key, the best ``k`` are among them, equal packed keys all kept.

Where it compiles: torch's NVRTC wrapper passes the CUDA toolkit's include directory, which it
finds from ``CUDA_HOME`` (or ``CUDA_PATH``), ``nvcc`` on the path, or ``/usr/local/cuda``; on a
machine with CUDA wheels and no toolkit it raises, and the first compile logs one warning naming
why, turns the block path off for the process, and the Triton row kernel takes its shapes
(``select_kernel.triton_ordered_select``). The kernel itself includes no header.

No host synchronisation; capturable in a CUDA graph after a first, compiling call outside
capture (as the Triton kernels). Shared memory: 42 KB static and ``dyn_bytes(kind)`` dynamic a
block (``DYN_BYTES``, the ordering's; the chunks kind launches without; the filter kind's
``FILTER_DYN``, 64 KB), which needs the function's opt-in beyond 48 KB (``cuFuncSetAttribute``, set
at compile). Torch's launcher also refuses 48 KB or more of dynamic memory alone unless told
(``set_shared_memory_config``), so the filter kind is told. A long row's workspace: 12 bytes a slot, ``Q x
chunks x kc`` slots (50 MB at 1024 rows of 32768, k = 2048), from torch's allocator.

Tests: this source, as NVRTC gets it, runs on the CPU in CI (tests/test_select_block_cpu.py,
through tests/cuda_on_cpu.py: every tile and kind against a plain sort, under seeded thread
schedules) and on a GPU (tests/test_select_kernel_gpu.py, its ``block`` cases).
"""
from __future__ import annotations

import functools
import logging
import threading
import time

import torch

__all__ = ["available", "supports", "tile", "chunking", "sampled", "plan_kernels", "source", "dyn_bytes", "block_select",
           "compile_kernels", "compile_tile", "paired", "sm_count", "FILTER_THREADS", "KINDS", "MAX_N", "PAIRED", "PAIRED_TILES", "SAMPLED_MIN_ROWS", "TILE_N", "TILES"]

log = logging.getLogger("tpflare.select_block")

ITEMS = 16  # candidates a thread
TILES = (256, 512, 1024)  # threads a block: rows of up to ITEMS x threads candidates
TILE_N = ITEMS * TILES[-1]  # a block's candidates at most
MAX_CHUNKS = 8  # a longer row: its chunks' winners merged by one more block (chunks x k <= TILE_N)
MAX_N = MAX_CHUNKS * TILE_N
MAX_K = 2048
DYN_BYTES = MAX_K * 8 * 2 + MAX_K * 4  # the second level's key ranges and sub-bucket sizes
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

# the unsigned order key of a score, in CUDA (after the typedef of u32): SOURCE's, and bench variants' kernels'
ORDER_KEY = r"""// the unsigned order key of a score: larger comes first; invalid 0, NaN 1, -inf 0x007fffff
__device__ __forceinline__ u32 order_key(int bits, int id) {
  int s = bits >= 0 ? bits : (bits ^ 0x7FFFFFFF);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) s = (int)0x80000001;
  if (id < 0) s = (int)0x80000000;
  return (u32)s ^ 0x80000000u;
}
"""

SOURCE_HEAD = r"""
// THREADS, ITEMS, KMAX, and MODE of the bits POS_IN and UNORDERED: defined before this text (source(threads, kind))
#if !defined(MODE) || !defined(POS_IN) || !defined(UNORDERED)
#error "source(threads, kind) defines MODE, POS_IN and UNORDERED"
#endif
#define NB 2048  // buckets of the ordering
static_assert(NB == 2048 && KMAX == 2048, "scan2048 scans the bucket and sub-bucket sizes, 2048 each");
#define WPER ((KMAX + THREADS - 1) / THREADS)  // winners a thread at most
#define FULL 0xffffffffu

typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

struct Smem {
  int hist[256];
  i64 wkey[KMAX];
  int wpos[KMAX];
  int off[NB];   // the ordering's bucket sizes, then their offsets
  int mem[KMAX];  // the members in bucket order, then the winners in output order
  int wtot[32];
  u64 ph[3], pl[3];
  u32 kmin[2], kmax[2];
  int pc[3], big, bin, above, eq, nvalid, ninf, nnan, wcount;
  u32 pmin, pmax, ulo;  // ulo: the smallest score key among the winners (taken as they are written)
};
// dynamic shared memory (the module's DYN_BYTES): the second level's key ranges (max, min) at each
// bucket's output offset, and its sub-bucket sizes, then offsets

""" + ORDER_KEY + r"""
// The need-th largest key among the candidates in play (play: a bit a slot; 1 <= need <= their
// count, total). Stops at the first digit whose bin holds exactly the candidates still wanted.
// Returns: T (the key's bits from shift sh up), sh, above (in play with key >> sh > T >> sh),
// eq (in play with key >> sh == T >> sh); eq == need - above unless sh == 0 and keys tie.
// narrow (0 or 1: a slot of sm.kmin / kmax, unused before; -1: none): first the smallest and the
// largest key in play, and the passes start at the digit of the highest bit in which they differ
// (the tie levels: ids and positions share their high bits, so their passes mostly start lower).
__device__ __forceinline__ void radix_select(const u32 (&key)[ITEMS], u32 play, int need, int total, int narrow,
                                             Smem& sm, u32& T, int& sh, int& above, int& eq) {
  const int lane = threadIdx.x & 31;
  u32 prefix = 0;
  above = 0;
  eq = 0;
  sh = 0;
  int s0 = 24;
  if (narrow >= 0) {
    u32 mn = 0xFFFFFFFFu, mx = 0;
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      if ((play >> t) & 1u) {
        mn = min(mn, key[t]);
        mx = max(mx, key[t]);
      }
    }
    mn = __reduce_min_sync(FULL, mn);
    mx = __reduce_max_sync(FULL, mx);
    if (lane == 0) {
      atomicMin(&sm.kmin[narrow], mn);
      atomicMax(&sm.kmax[narrow], mx);
    }
    __syncthreads();
    mn = sm.kmin[narrow];
    mx = sm.kmax[narrow];
    if (mn == mx) {  // every key in play equal
      T = mn;
      eq = total;
      return;
    }
    s0 = ((31 - __clz(mn ^ mx)) >> 3) << 3;
    prefix = (u32)(((u64)mn >> (s0 + 8)) << (s0 + 8));  // the bits all share, above the first digit
  }
  for (int s = s0; s >= 0; s -= 8) {
    for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;
    if (threadIdx.x == 0) {
      sm.pmin = 0xFFFFFFFFu;
      sm.pmax = 0;
    }
    __syncthreads();
    // the 1024-thread tile: also the smallest and the largest key in play (all equal: a tie at the
    // cutoff, and no pass after this one). H200 (session 23, bench/block_ab.py): there mass ties took
    // 0.90-0.94x the time and random scores 1.02-1.04x; the 256 and 512 tiles took 0.98-1.05x
    const bool span = THREADS == 1024;
    u32 mn = 0xFFFFFFFFu, mx = 0;
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      bool in = ((play >> t) & 1u) && (((u64)key[t] >> (s + 8)) == ((u64)prefix >> (s + 8)));
      int b = in ? (int)((key[t] >> s) & 255u) : 256;
      if (in) {
        atomicAdd(&sm.hist[b], 1);
        if (span) {
          mn = min(mn, key[t]);
          mx = max(mx, key[t]);
        }
      }
    }
    if (span) {
      mn = __reduce_min_sync(FULL, mn);
      mx = __reduce_max_sync(FULL, mx);
      if (lane == 0 && mn <= mx) {
        atomicMin(&sm.pmin, mn);
        atomicMax(&sm.pmax, mx);
      }
    }
    __syncthreads();
    if (span) {
      mn = sm.pmin;  // (read before the barrier below: the next pass resets them after it)
      mx = sm.pmax;
    }
    if (threadIdx.x < 32) {  // the bin of the (need - above)-th largest: lane l holds bins 255 - 8l - j
      int c[8];
      int tot = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = sm.hist[255 - 8 * lane - j];
        tot += c[j];
      }
      int incl = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += y;
      }
      int rem = need - above;
      int acc = incl - tot;
      if (acc < rem && rem <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (acc < rem && rem <= acc + c[j]) {
            sm.bin = 255 - 8 * lane - j;
            sm.above = acc;
            sm.eq = c[j];
          }
          acc += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= (u32)sm.bin << s;
    above += sm.above;
    eq = sm.eq;
    sh = s;
    if (eq == need - above) break;  // the whole bin is wanted
    if (span && mn == mx) {  // every key in play equal (a tie at the cutoff): its bin is that key
      prefix = mn;
      sh = 0;
      break;
    }
  }
  T = prefix;
}

// candidate slot t of this thread against a select's result: 1 above, 0 at, -1 below
__device__ __forceinline__ int cmp_at(u32 key, u32 T, int sh) {
  u32 a = key >> sh, b = T >> sh;
  return a > b ? 1 : (a == b ? 0 : -1);
}

__device__ __forceinline__ int bitlen(u64 x) { return x ? 64 - __clzll((i64)x) : 0; }
// bitlen(d / n) for n >= 1 with no 64-bit division (session 32: 0.93-1.0x the time): the smallest s with
// (d >> s) < n is bitlen(d / n), and it is b or b + 1 for b = max(0, bitlen(d) - bitlen(n)), so one
// shift and one compare decide; the ordering's buckets stay the same
__device__ __forceinline__ int bitlen_div(u64 d, int n) {
  const int b = max(0, bitlen(d) - (32 - __clz(n)));
  return (d >> b) < (u64)n ? b : b + 1;
}

// exclusive scan of a[0 .. 2048) in place; returns the largest element
__device__ int scan2048(int* a, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int E = 2048 / THREADS;
  int c[E];
  int tsum = 0, mx = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    c[e] = a[tid * E + e];
    tsum += c[e];
    mx = max(mx, c[e]);
  }
  int incl = tsum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(FULL, incl, o);
    if (lane >= o) incl += y;
  }
  mx = __reduce_max_sync(FULL, mx);
  if (lane == 31) sm.wtot[tid >> 5] = incl;
  if (lane == 0) atomicMax(&sm.big, mx);
  __syncthreads();
  if (tid < 32) {
    int wt = tid < THREADS / 32 ? sm.wtot[tid] : 0;
    int wi = wt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(FULL, wi, o);
      if (lane >= o) wi += y;
    }
    if (tid < THREADS / 32) sm.wtot[tid] = wi - wt;
  }
  __syncthreads();
  int base = sm.wtot[tid >> 5] + incl - tsum;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    a[tid * E + e] = base;
    base += c[e];
  }
  int big = sm.big;
  __syncthreads();
  if (tid == 0) sm.big = 0;
  return big;
}

#define SPLIT 16  // a bucket of more winners than this: the second level
// The nsel winners (sm.wkey, sm.wpos) in output order to sm.mem. First level: three parts
// (positive score keys, negative ones, the tie at the smallest score key), each mapped over its
// own key range into buckets in proportion to its winners (radix.part_counts' design); where a
// bucket still holds more than SPLIT, every bucket splits again over its own key range into as
// many sub-buckets as it holds (radix.split_buckets'); a winner's rank in its (sub-)bucket
// counts the members before it.
__device__ void order_winners(Smem& sm, u64* dyn, int nsel, const int* __restrict__ prow) {
  const int tid = threadIdx.x, lane = tid & 31;
  const u64 ut = sm.ulo;  // the smallest score key among the winners (as in the packed key)
  int part[WPER];
#pragma unroll
  for (int w = 0; w < WPER; ++w) {
    int i = w * THREADS + tid;
    part[w] = -1;
    if (i < nsel) {
      u64 kk = (u64)sm.wkey[i];
      part[w] = (kk >> 31) == ut ? 2 : ((kk >> 62) ? 0 : 1);  // (score key's top bit: a positive score)
      atomicMax(&sm.ph[part[w]], kk);
      atomicMin(&sm.pl[part[w]], kk);
      atomicAdd(&sm.pc[part[w]], 1);
    }
  }
  __syncthreads();
  int nb[3], base[3], shp[3];
  nb[0] = sm.pc[0] ? max(1, (NB * sm.pc[0]) / nsel) : 0;  // (NB x a part's count <= 2048 x 2048: an int)
  nb[1] = sm.pc[1] ? max(1, (NB * sm.pc[1]) / nsel) : 0;
  nb[2] = NB - nb[0] - nb[1];  // (>= 1: the tie holds the smallest key)
  base[0] = 0;
  base[1] = nb[0];
  base[2] = nb[0] + nb[1];
#pragma unroll
  for (int p = 0; p < 3; ++p) shp[p] = nb[p] ? bitlen_div(sm.ph[p] - sm.pl[p], nb[p]) : 0;
  int bk[WPER], slot[WPER];
#pragma unroll
  for (int w = 0; w < WPER; ++w) {
    int i = w * THREADS + tid;
    if (i < nsel) {
      int p = part[w];
      bk[w] = base[p] + (int)((sm.ph[p] - (u64)sm.wkey[i]) >> shp[p]);
      slot[w] = atomicAdd(&sm.off[bk[w]], 1);
    }
  }
  __syncthreads();
  int big = scan2048(sm.off, sm);  // offsets; sizes: the next offset less this one
  int* offs = sm.off;
  if (big > SPLIT) {  // the second level, over each bucket's own key range
    u64* yh = dyn;
    u64* yl = dyn + KMAX;
    int* c2 = reinterpret_cast<int*>(dyn + 2 * KMAX);
    for (int t = tid; t < KMAX; t += THREADS) {
      yh[t] = 0;
      yl[t] = ~0ull;
      c2[t] = 0;
    }
    __syncthreads();
    int o[WPER], cb[WPER];
#pragma unroll
    for (int w = 0; w < WPER; ++w) {
      int i = w * THREADS + tid;
      if (i < nsel) {
        o[w] = sm.off[bk[w]];
        cb[w] = (bk[w] + 1 < NB ? sm.off[bk[w] + 1] : nsel) - o[w];
        u64 kk = (u64)sm.wkey[i];
        atomicMax(&yh[o[w]], kk);
        atomicMin(&yl[o[w]], kk);
      }
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < WPER; ++w) {
      int i = w * THREADS + tid;
      if (i < nsel) {
        u64 h = yh[o[w]];
        int sh2 = bitlen_div(h - yl[o[w]], cb[w]);
        bk[w] = o[w] + (int)((h - (u64)sm.wkey[i]) >> sh2);  // < o + cb
        slot[w] = atomicAdd(&c2[bk[w]], 1);
      }
    }
    __syncthreads();
    scan2048(c2, sm);
    offs = c2;
  }
#pragma unroll
  for (int w = 0; w < WPER; ++w) {
    int i = w * THREADS + tid;
    if (i < nsel) sm.mem[offs[bk[w]] + slot[w]] = i;
  }
  __syncthreads();
  int rank[WPER];
#pragma unroll
  for (int w = 0; w < WPER; ++w) {
    int i = w * THREADS + tid;
    if (i < nsel) {
      int o = offs[bk[w]];
      int end = bk[w] + 1 < NB ? offs[bk[w] + 1] : nsel;
      i64 kk = sm.wkey[i];
      int pp = sm.wpos[i];
      int r = 0;
#pragma unroll 1
      for (int t = o; t < end; ++t) {
        int j = sm.mem[t];
        i64 kj = sm.wkey[j];
#if MODE & POS_IN  // (equal keys: a duplicate id; then the candidates' positions in the row)
        r += (kj > kk || (kj == kk && __ldg(prow + sm.wpos[j]) < __ldg(prow + pp))) ? 1 : 0;
#else
        r += (kj > kk || (kj == kk && sm.wpos[j] < pp)) ? 1 : 0;
#endif
      }
      rank[w] = o + r;
    }
  }
  __syncthreads();  // (the member list's space takes the output order)
#pragma unroll
  for (int w = 0; w < WPER; ++w) {
    int i = w * THREADS + tid;
    if (i < nsel) sm.mem[rank[w]] = i;
  }
  __syncthreads();
}

// a block's shared counters and extremes at their starting values (one thread, before a barrier)
__device__ __forceinline__ void reset_shared(Smem& sm) {
  sm.nvalid = 0;
  sm.ninf = 0;
  sm.nnan = 0;
  sm.wcount = 0;
  sm.ulo = 0xFFFFFFFFu;
  sm.big = 0;
  for (int p = 0; p < 3; ++p) {
    sm.ph[p] = 0;
    sm.pl[p] = ~0ull;
    sm.pc[p] = 0;
  }
  sm.kmin[0] = sm.kmin[1] = 0xFFFFFFFFu;
  sm.kmax[0] = sm.kmax[1] = 0;
}

// the block's valid, -inf and NaN candidates (nv, ninf, nnan: this thread's) added to sm.nvalid, sm.ninf
// and sm.nnan (0 before); then a barrier
__device__ __forceinline__ void add_counts(int nv, int ninf, int nnan, Smem& sm) {
  nv = __reduce_add_sync(FULL, nv);
  ninf = __reduce_add_sync(FULL, ninf);
  nnan = __reduce_add_sync(FULL, nnan);
  if ((threadIdx.x & 31) == 0 && nv) {
    atomicAdd(&sm.nvalid, nv);
    if (ninf) atomicAdd(&sm.ninf, ninf);
    if (nnan) atomicAdd(&sm.nnan, nnan);
  }
  __syncthreads();
}

#define KEY_NEGINF 0x007FFFFFu  // order_key of -inf (the pad's score)
#define KEY_NAN 1u
// a score's bits from its order key (order_key's inverse; not for KEY_NAN, whose payloads differ, nor 0):
// the winners' score bits at the output, only a NaN's read again from the row (session 32: 0.96-0.99x the time)
__device__ __forceinline__ int key_bits(u32 key) {
  const int s = (int)(key ^ 0x80000000u);
  return s >= 0 ? s : (s ^ 0x7FFFFFFF);
}

"""

ROW_KERNEL = r"""
// MODE (defined before this text, like POS_IN and UNORDERED; 0: a block a row, ordered output, positions the
// candidates' indices): UNORDERED: block (x, y) selects in row x's candidates [y * chunk, min(N, (y + 1) * chunk))
// and writes its first min(K, its valid) winners in no order to slots [y * K, y * K + K) of the output
// rows, their positions in the row to out_pos (pads: id -1, score -inf, position 0). POS_IN: a
// candidate's position in the row is pos_in's (the merge of chunks' winners), the output ordered.
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const int* __restrict__ pos_in,
                    int* __restrict__ out_ids, float* __restrict__ out_sc, int* __restrict__ out_pos, int N, int K,
                    int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op,
                    const int* __restrict__ stat) {
  constexpr int mode = MODE;
  __shared__ Smem sm;
  extern __shared__ u64 dyn[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const i64 row = blockIdx.x;
  const int base = (mode & UNORDERED) ? blockIdx.y * chunk : 0;
  if (mode & UNORDERED) N = min(chunk, N - base);
#if MODE & GATED  // after the sampled keep: the row's kept count, or -1 where the chunks serve the row
  {
    const int nkeep = __ldg(stat + row * 4 + 3);
    if ((mode & UNORDERED) && nkeep >= 0) return;  // (the whole block, before any barrier)
    if (!(mode & UNORDERED) && nkeep >= 0) N = nkeep;
  }
#endif
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq + base;
  const int* irow = ids + row * s_iq + base;
  const int* prow = pos_in + row * s_pq + base;
  // a candidate's position in the row (the last tie-break), from its index in this block's chunk
  auto position = [&](int p) -> int { return (mode & POS_IN) ? __ldg(prow + p) : base + p; };

  u32 u[ITEMS];
  int id[ITEMS];
  u32 valid = 0;
  int nv = 0, ninf = 0, nnan = 0;
#pragma unroll
  for (int t = 0; t < ITEMS; ++t) {
    int p = t * THREADS + tid;
    int b = p < N ? __ldg(srow + p) : 0;
    id[t] = p < N ? __ldg(irow + p) : -1;
    u[t] = order_key(b, id[t]);
    if (id[t] >= 0) {
      valid |= 1u << t;
      ++nv;
      ninf += u[t] == KEY_NEGINF;
      nnan += u[t] == KEY_NAN;
    }
  }
  if (tid == 0) reset_shared(sm);
  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;
  __syncthreads();
  add_counts(nv, ninf, nnan, sm);
  const int nvalid = sm.nvalid;
  const int nsel = min(K, nvalid);

  // the winners: level 1 by score key; where candidates tie at the cutoff key, level 2 by
  // inverted id among them; where ids tie too, level 3 by inverted position
  u32 T1 = 0, T2 = 0, T3 = 0;
  int sh1 = 0, sh2 = 0, sh3 = 0, ab, eq;
  int lvl = 0;  // 0: every valid candidate wins; else the levels run
  if (nsel > 0 && nsel < nvalid) {
    lvl = 1;
    const int over = nvalid - sm.ninf - sm.nnan;  // above -inf
    if (over < nsel && nsel <= over + sm.ninf) {  // the cutoff at -inf (a short context's pads): no passes
      T1 = KEY_NEGINF;
      ab = over;
      eq = sm.ninf;
    } else {
      radix_select(u, valid, nsel, nvalid, -1, sm, T1, sh1, ab, eq);
    }
    int rem = nsel - ab;
    if (eq > rem) {  // a tie at the exact score key T1 (sh1 == 0)
      lvl = 2;
      u32 v[ITEMS];
      u32 play = 0;
#pragma unroll
      for (int t = 0; t < ITEMS; ++t) {
        v[t] = 0x7FFFFFFFu - (u32)id[t];
        if (((valid >> t) & 1u) && u[t] == T1) play |= 1u << t;
      }
      radix_select(v, play, rem, eq, 0, sm, T2, sh2, ab, eq);
      rem -= ab;
      if (eq > rem) {  // duplicate ids at T1: by position
        lvl = 3;
        u32 w[ITEMS];
        u32 play3 = 0;
#pragma unroll
        for (int t = 0; t < ITEMS; ++t) {
          w[t] = 0;
          if (((play >> t) & 1u) && v[t] == T2) {
            play3 |= 1u << t;
            w[t] = ~(u32)position(t * THREADS + tid);
          }
        }
        radix_select(w, play3, rem, eq, 1, sm, T3, sh3, ab, eq);
      }
    }
  }

  // the winners to shared memory: packed key (score key above inverted id), position; a thread's
  // winners in slot order from its offset in a scan of the threads' counts (sm.mem: free until
  // the ordering)
  u32 wins = 0;
#pragma unroll
  for (int t = 0; t < ITEMS; ++t) {
    bool win = (valid >> t) & 1u;
    if (lvl >= 1 && win) {
      int c1 = cmp_at(u[t], T1, sh1);
      win = c1 > 0;
      if (c1 == 0) {
        if (lvl == 1) {
          win = true;
        } else {
          u32 vt = 0x7FFFFFFFu - (u32)id[t];
          int c2 = cmp_at(vt, T2, sh2);
          win = c2 > 0 || (c2 == 0 && (lvl == 2 || cmp_at(~(u32)position(t * THREADS + tid), T3, sh3) >= 0));
        }
      }
    }
    wins |= (u32)win << t;
  }
  {
    constexpr int E = 2048 / THREADS;  // (scan2048's entries a thread: its own, read before its first barrier)
    sm.mem[tid * E] = __popc(wins);
#pragma unroll
    for (int e = 1; e < E; ++e) sm.mem[tid * E + e] = 0;
    scan2048(sm.mem, sm);
    int slot = sm.mem[tid * E];
    u32 umin = 0xFFFFFFFFu;  // (no score key is all ones: NaN's is 1)
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      if ((wins >> t) & 1u) {
        sm.wkey[slot] = ((i64)u[t] << 31) | (i64)(0x7FFFFFFFu - (u32)id[t]);
        sm.wpos[slot] = t * THREADS + tid;
        ++slot;
        umin = min(umin, u[t]);
      }
    }
    umin = __reduce_min_sync(FULL, umin);
    if (lane == 0 && umin != 0xFFFFFFFFu) atomicMin(&sm.ulo, umin);
  }
  __syncthreads();

  if (mode & UNORDERED) {  // a chunk's winners as they came, with their positions (a merge's input)
    int* orow = out_ids + row * s_oi + blockIdx.y * K;
    int* osrow = reinterpret_cast<int*>(out_sc) + row * s_os + blockIdx.y * K;
    int* oprow = out_pos + row * s_op + blockIdx.y * K;
    for (int r = tid; r < K; r += THREADS) {
      int oid = -1, bits = (int)0xFF800000, op = 0;
      if (r < nsel) {
        oid = 0x7FFFFFFF - (int)(sm.wkey[r] & 0x7FFFFFFF);
        const u32 wk = (u32)((u64)sm.wkey[r] >> 31);
        bits = wk == KEY_NAN ? __ldg(srow + sm.wpos[r]) : key_bits(wk);
        op = position(sm.wpos[r]);
      }
      orow[r] = oid;
      osrow[r] = bits;
      oprow[r] = op;
    }
    return;
  }

  // the ordering (order_winners)
  if (nsel > 0) order_winners(sm, dyn, nsel, prow);

  int* orow = out_ids + row * s_oi;
  int* osrow = reinterpret_cast<int*>(out_sc) + row * s_os;
  for (int r = tid; r < K; r += THREADS) {
    int oid = -1, bits = (int)0xFF800000;
    if (r < nsel) {
      int i = sm.mem[r];
      oid = 0x7FFFFFFF - (int)(sm.wkey[i] & 0x7FFFFFFF);
      const u32 wk = (u32)((u64)sm.wkey[i] >> 31);
      bits = wk == KEY_NAN ? __ldg(srow + sm.wpos[i]) : key_bits(wk);
    }
    orow[r] = oid;
    osrow[r] = bits;
  }
}
"""

SOURCE = SOURCE_HEAD + ROW_KERNEL

FILTER_KERNEL = r"""
// Kind filter: a row of up to FI x THREADS candidates (16384) on THREADS = 512 threads, two blocks an SM.
// The row's level keys stay in dynamic shared memory (lk: candidate 4 (c THREADS + tid) + j is thread tid's
// group c, entry j), not in registers, so a block holds half an SM's registers and two rows overlap. A level
// key of 0 is out of play. Level 1: the score key (order_key; 0 an invalid candidate), its first digit counted
// as the row loads; where the exact k-th key ties, level 2 (0x80000000 | inverted id) among the tied, then
// level 3 (0x80000000 | inverted position). Each level's winners go to sm.wkey / sm.wpos as they are known;
// the ordering (order_winners) and the output are the row kind's.
#define FI 32
#define FV (FI / 4)
static_assert(THREADS == 512 && FI * THREADS == 16384, "the filter kind: 512 threads of 32 candidates");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (the bulk copy engine: sm_90 on)
#define FILTER_TMA 1
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}
__device__ __forceinline__ void bar_init(u64* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst, completing on bar
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait(u64* bar, u32 parity) {
  u32 done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}
#elif defined(__CUDA_ARCH__)  // (before sm_90 the threads load the scores too: never called)
#define FILTER_TMA 0
__device__ __forceinline__ void bar_init(u64*) {}
__device__ __forceinline__ void bulk_copy(void*, const void*, u32, u64*) {}
__device__ __forceinline__ void bar_wait(u64*, u32) {}
#else  // (the CPU runner: tests/cuda_on_cpu.h emulates bar_init, bulk_copy and bar_wait)
#define FILTER_TMA 1
#endif

#if defined(__CUDA_ARCH__)
// Turns at the load. Two blocks an SM that load their rows at once share the SM's part of the HBM's bandwidth
// and then both compute, round after round (session 36, H100: the load 20,400 of a block's 53,400 cycles,
// all the HBM's bandwidth). So a block that arrives within a row's load time (TURN_NS ns for 16384
// candidates, in proportion to N) of its SM's last block waits for the rest of that window: from the first
// wave on, one block an SM loads while the other computes (session 37, H100: 0.96x the time at 1024 x
// 16384, 0.98x at 4096). Only where the launch has more blocks than two an SM (%nsmid): in one wave a turn
// only delays the second block (session 37: 1.06x the time at 133 rows). Timing only: no result depends on
// it, and no block waits longer than the window. filter_arrival: each SM's last block's arrival on the
// global timer (zero at the module's load; by %smid). The window: 6,000 ns (session 38, H100: 0.98-0.99x the
// time of 5,000 on random scores at 512-4096 rows in five A/Bs, 0.98-1.01x on mass ties)
#define TURN_NS 6000
__device__ unsigned long long filter_arrival[1024];
__device__ __forceinline__ void take_turn(int N) {
  u32 nsm, smid;
  asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  if (gridDim.x <= 2 * nsm) return;  // (one wave)
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  u64 now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  const u64 prev = atomicExch(&filter_arrival[smid & 1023u], (unsigned long long)now);
  const i64 window = (i64)N * TURN_NS / (FI * THREADS);
  if ((i64)(now - prev) < window) {
    const u64 until = min(prev, now) + (u64)window;  // (a later or stale arrival: at most the window)
    while (now < until) {
      __nanosleep(200);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
  }
}
#else  // (the CPU runner: the same results with no turns)
__device__ __forceinline__ void take_turn(int) {}
#endif

// four candidates' score keys (bits b, ids d), their first 11-bit digit counted into hist, a pad's too (key 0:
// digit 0, the lowest bin; the passes after the first count only keys in play, and the -inf cutoff is decided
// from the counts), so that no branch surrounds the atomics. Nothing else is counted a candidate: the valid
// and -inf counts come from the digit's bins once the row is counted, and the NaN only where that bin holds
// more than the row's pads past N (session 36: 0.97-0.98x the time of three counters a candidate)
__device__ __forceinline__ uint4 put_keys(const int (&b)[4], const int (&d)[4], int* hist) {
  u32 kk[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    kk[j] = order_key(b[j], d[j]);
    atomicAdd(&hist[2047 - (int)(kk[j] >> 21)], 1);  // (a pad: bin 2047, digit 0)
  }
  return make_uint4(kk[0], kk[1], kk[2], kk[3]);
}

// hist: a digit's counts over nb bins, reversed (entry r counts digit nb - 1 - r). The bin of the rem-th
// largest (1 <= rem <= the count): sm.bin (its digit), sm.above (in play with a larger digit), sm.eq (in it)
__device__ __forceinline__ void fbin(const int* hist, int nb, int rem, Smem& sm) {
  const int tid = threadIdx.x;
  int c[4];
  int tsum = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    c[e] = 4 * tid + e < nb ? hist[4 * tid + e] : 0;
    tsum += c[e];
  }
  int total;
  int acc = block_scan<THREADS>(tsum, sm.wtot, total);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (acc < rem && rem <= acc + c[e]) {
      sm.bin = nb - 1 - (4 * tid + e);
      sm.above = acc;
      sm.eq = c[e];
    }
    acc += c[e];
  }
  __syncthreads();
}

// The need-th largest level key in lk (1 <= need <= the keys in play), by digits of 11, 11 and 10 bits from
// the top, stopping at the first bin that holds exactly the keys still wanted. primed: the first digit's
// counts are in hist already. T, sh, above, eq: as radix_select's (eq > need - above only where sh == 0).
// A key of 0 (out of play) is counted too, in digit 0, with no test a key (session 36: 0.96-0.97x the time
// on ties). Zeros are the smallest keys and at most the keys in play are wanted, so a bin that holds zeros
// holds the wanted key only where all its digits so far are 0; its count then exceeds the keys still
// wanted, and a later digit separates them (at bit 0, key 0 is a bin of its own).
__device__ void lselect(const u32* lk, int* hist, int need, bool primed, Smem& sm, u32& T, int& sh, int& above,
                        int& eq) {
  const int tid = threadIdx.x;
  const uint4* lk4 = reinterpret_cast<const uint4*>(lk);
  u32 prefix = 0;
  above = 0;
  eq = 0;
  sh = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const int s = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int nb = pass == 2 ? 1024 : 2048;
    const int top = pass == 0 ? 32 : s + (pass == 2 ? 10 : 11);  // (the digit's bits: [s, top))
    if (pass > 0 || !primed) {
#pragma unroll
      for (int e = 0; e < 4; ++e) hist[4 * tid + e] = 0;
      __syncthreads();
#pragma unroll 4
      for (int c = 0; c < FV; ++c) {
        const uint4 v = lk4[c * THREADS + tid];
        const u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (top == 32 || (x[j] >> top) == (prefix >> top))  // (a key of 0 too: see above)
            atomicAdd(&hist[nb - 1 - (int)((x[j] >> s) & (u32)(nb - 1))], 1);
      }
      __syncthreads();
    }
    fbin(hist, nb, need - above, sm);
    prefix |= (u32)sm.bin << s;
    above += sm.above;
    eq = (int)sm.eq;
    sh = s;
    if (eq == need - above) break;  // the whole bin is wanted
  }
  T = prefix;
}

// A level's winners to sm.wkey / sm.wpos from slot wn on: the level keys above T's bin (from bit sh up), and
// those in it where all of it wins (all). Where not all (the exact key T ties: sh == 0), the keys equal to T
// become the next level's (after level 1: 0x80000000 | inverted id; after level 2: 0x80000000 | inverted
// position) and every other key 0. A winner's packed key: level 1, its score key above its inverted id (read
// again); level 2, t1 (level 1's key) above its inverted id; level 3, t1 above i2 (level 2's). Where all of
// level 1's bin wins (random scores' usual cutoff), each thread writes its winners' positions by their bits,
// then gathers up to WPER winners' keys and ids, its loads all issued at once (session 35: 0.90-0.92x the
// time of a branch a candidate); otherwise a group of four's ids come in one load where it holds a winner or
// a tie, four groups' loads at once. Returns wn plus the level's winners.
__device__ int femit(u32* lk, int lvl, u32 T, int sh, bool all, u32 t1, u32 i2, int wn, const int* irow, int N,
                     bool vec, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31;
  uint4* lk4 = reinterpret_cast<uint4*>(lk);
  const u64 lo = ((u64)(T >> sh) + (all ? 0u : 1u)) << sh;  // (the smallest winning key; past 32 bits: none)
  u32 win = 0;
#pragma unroll
  for (int c = 0; c < FV; ++c) {
    const uint4 v = lk4[c * THREADS + tid];
    const u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (x[j] != 0u && (u64)x[j] >= lo) win |= 1u << (4 * c + j);
    }
  }
  int total;
  int slot = wn + block_scan<THREADS>(__popc(win), sm.wtot, total);
  u32 umin = 0xFFFFFFFFu;
  if (lvl == 1 && all) {  // the winners' positions by their bits, then their keys and ids gathered
    u32 m = win;
    for (int s = slot; m != 0u; m &= m - 1u, ++s) {
      const int b = __ffs(m) - 1;
      sm.wpos[s] = 4 * ((b >> 2) * THREADS + tid) + (b & 3);
    }
    __syncthreads();
    int pu[WPER], idu[WPER];
#pragma unroll
    for (int u = 0; u < WPER; ++u) pu[u] = u * THREADS + tid < total ? sm.wpos[wn + u * THREADS + tid] : -1;
#pragma unroll
    for (int u = 0; u < WPER; ++u) idu[u] = pu[u] >= 0 ? __ldg(irow + pu[u]) : 0;
#pragma unroll
    for (int u = 0; u < WPER; ++u) {
      if (pu[u] >= 0) {
        const u32 sk = lk[pu[u]];
        sm.wkey[wn + u * THREADS + tid] = ((i64)sk << 31) | (i64)(0x7FFFFFFFu - (u32)idu[u]);
        umin = min(umin, sk);
      }
    }
  } else {
#pragma unroll 1
    for (int cb = 0; cb < FV; cb += 4) {  // four groups of four at a time
      if (all && ((win >> (4 * cb)) & 0xFFFFu) == 0) continue;
      u32 x[4][4];
      int4 idv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q4 = (cb + u) * THREADS + tid;
        const uint4 v = lk4[q4];
        x[u][0] = v.x;
        x[u][1] = v.y;
        x[u][2] = v.z;
        x[u][3] = v.w;
        bool need = lvl == 1 && ((win >> (4 * (cb + u))) & 15u) != 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) need |= lvl == 1 && !all && x[u][j] != 0 && x[u][j] == T;
        idv[u] = make_int4(-1, -1, -1, -1);
        if (need) {
          if (vec) {
            idv[u] = __ldg(reinterpret_cast<const int4*>(irow) + q4);
          } else {
            idv[u].x = 4 * q4 < N ? __ldg(irow + 4 * q4) : -1;
            idv[u].y = 4 * q4 + 1 < N ? __ldg(irow + 4 * q4 + 1) : -1;
            idv[u].z = 4 * q4 + 2 < N ? __ldg(irow + 4 * q4 + 2) : -1;
            idv[u].w = 4 * q4 + 3 < N ? __ldg(irow + 4 * q4 + 3) : -1;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = cb + u;
        const int idj[4] = {idv[u].x, idv[u].y, idv[u].z, idv[u].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int p = 4 * (c * THREADS + tid) + j;
          if ((win >> (4 * c + j)) & 1u) {
            const u32 sk = lvl == 1 ? x[u][j] : t1;
            const u32 iv = lvl == 1 ? 0x7FFFFFFFu - (u32)idj[j] : (lvl == 2 ? (x[u][j] & 0x7FFFFFFFu) : i2);
            sm.wkey[slot] = ((i64)sk << 31) | (i64)iv;
            sm.wpos[slot] = p;
            ++slot;
            umin = min(umin, sk);
          }
          if (!all) {
            const bool tie = x[u][j] != 0 && x[u][j] == T;
            x[u][j] = !tie ? 0u : 0x80000000u | (0x7FFFFFFFu - (lvl == 1 ? (u32)idj[j] : (u32)p));
          }
        }
        if (!all) lk4[c * THREADS + tid] = make_uint4(x[u][0], x[u][1], x[u][2], x[u][3]);
      }
    }
  }
  umin = __reduce_min_sync(FULL, umin);
  if (lane == 0 && umin != 0xFFFFFFFFu) atomicMin(&sm.ulo, umin);
  return wn + total;
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const int* __restrict__ pos_in,
                    int* __restrict__ out_ids, float* __restrict__ out_sc, int* __restrict__ out_pos, int N, int K,
                    int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op,
                    const int* __restrict__ stat) {
  __shared__ Smem sm;
  extern __shared__ u64 fdyn[];  // (the row's level keys, then the ordering's dynamic memory)
  __shared__ u64 fbar;  // (the scores' bulk copy's mbarrier)
  u32* lk = reinterpret_cast<u32*>(fdyn);
  uint4* lk4 = reinterpret_cast<uint4*>(fdyn);
  int* hist = sm.off;  // (the digits' counts; the ordering's bucket sizes after them)
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const i64 row = blockIdx.x;
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  // the row's score keys to lk, level 1's first digit counted. The scores by the bulk copy (tma: sm_90 on, N a
  // multiple of 4 and both rows 16-byte aligned; session 36: 0.95-0.97x the time on random scores) and the ids
  // by 16-byte loads, four groups at a time, both rounds unrolled so that the second's loads may issue before
  // the first's keys are counted (session 37, with the turns: 0.97x the time); else both by 16-byte loads where
  // the rows allow them (vec)
  const bool vec = (N & 3) == 0 && ((reinterpret_cast<u64>(srow) | reinterpret_cast<u64>(irow)) & 15) == 0;
  const bool tma = FILTER_TMA && N > 0 && vec;
  if (tid == 0) {  // (thread 0 takes the SM's turn; the copy runs while the block zeroes its counts)
    take_turn(N);
    if (tma) {  // (the scores' bulk copy)
      bar_init(&fbar);
      bulk_copy(lk, srow, 4u * (u32)N, &fbar);
    }
    reset_shared(sm);
  }
  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;
  __syncthreads();
  if (tma) {
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
  } else {
#pragma unroll 2
    for (int c = 0; c < FV; ++c) {
      const int p0 = 4 * (c * THREADS + tid);
      int b[4], d[4];
      if (vec && p0 < N) {
        const int4 sv = __ldg(reinterpret_cast<const int4*>(srow) + (c * THREADS + tid));
        const int4 iv = __ldg(reinterpret_cast<const int4*>(irow) + (c * THREADS + tid));
        b[0] = sv.x; b[1] = sv.y; b[2] = sv.z; b[3] = sv.w;
        d[0] = iv.x; d[1] = iv.y; d[2] = iv.z; d[3] = iv.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          b[j] = p0 + j < N ? __ldg(srow + p0 + j) : 0;
          d[j] = p0 + j < N ? __ldg(irow + p0 + j) : -1;
        }
      }
      lk4[c * THREADS + tid] = put_keys(b, d, hist);
    }
  }
  __syncthreads();
  int nnan = 0;
  if (hist[2047] > FI * THREADS - N) {  // invalid ids or NaN in the row (the same for every thread): NaN counted
#pragma unroll
    for (int c = 0; c < FV; ++c) {
      const uint4 v = lk4[c * THREADS + tid];
      nnan += (v.x == KEY_NAN) + (v.y == KEY_NAN) + (v.z == KEY_NAN) + (v.w == KEY_NAN);
    }
    nnan = __reduce_add_sync(FULL, nnan);
    if (lane == 0 && nnan) atomicAdd(&sm.nnan, nnan);
    __syncthreads();
  }
  // the first digit's bins (hist[2047 - digit]): digit 0 holds the invalid keys (0) and NaN's (1), digit 3
  // only -inf's (0x007fffff), digits 1-2 none (order_key)
  nnan = sm.nnan;
  const int ninf = hist[2047 - 3];
  const int nvalid = FI * THREADS - hist[2047] + nnan;
  const int nsel = min(K, nvalid);
  if (nsel > 0 && nsel == nvalid) {  // every valid candidate wins
    femit(lk, 1, 0u, 0, true, 0u, 0u, 0, irow, N, vec, sm);
  } else if (nsel > 0) {
    u32 T1, T2, T3;
    int sh, ab, eq;
    const int over = nvalid - ninf - nnan;  // above -inf
    if (over < nsel && nsel <= over + ninf) {  // the cutoff at -inf (a short context's pads): no passes
      T1 = KEY_NEGINF;
      sh = 0;
      ab = over;
      eq = ninf;
    } else {
      lselect(lk, hist, nsel, true, sm, T1, sh, ab, eq);
    }
    int rem = nsel - ab;
    int wn = femit(lk, 1, T1, sh, eq == rem, 0u, 0u, 0, irow, N, vec, sm);
    if (eq > rem) {  // a tie at the exact score key T1: by inverted id among the tied
      lselect(lk, hist, rem, false, sm, T2, sh, ab, eq);
      rem -= ab;
      wn = femit(lk, 2, T2, sh, eq == rem, T1, 0u, wn, irow, N, vec, sm);
      if (eq > rem) {  // duplicate ids too: by inverted position (distinct)
        lselect(lk, hist, rem, false, sm, T3, sh, ab, eq);
        femit(lk, 3, T3, sh, true, T1, T2 & 0x7FFFFFFFu, wn, irow, N, vec, sm);
      }
    }
  }
  if (nsel > 0) {  // (with no winner, no barrier orders a thread's reading of the counts before another's zeroing)
    for (int i = tid; i < NB; i += THREADS) hist[i] = 0;  // (the ordering counts its buckets from 0)
    __syncthreads();
    order_winners(sm, fdyn, nsel, irow);
  }

  int* out_row = out_ids + row * s_oi;  // (the row kind's output)
  int* out_srow = reinterpret_cast<int*>(out_sc) + row * s_os;
  for (int r = tid; r < K; r += THREADS) {
    int oid = -1, bits = (int)0xFF800000;
    if (r < nsel) {
      const int w = sm.mem[r];
      oid = 0x7FFFFFFF - (int)(sm.wkey[w] & 0x7FFFFFFF);
      const u32 wk = (u32)((u64)sm.wkey[w] >> 31);
      bits = wk == KEY_NAN ? __ldg(srow + sm.wpos[w]) : key_bits(wk);
    }
    out_row[r] = oid;
    out_srow[r] = bits;
  }
}
"""


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
_SAMPLED_HEAD = r'''
// the sampled keep (kinds sample and keep): blocks of their own sizes (SB; KB x KI: source(...) defines them)
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define SAMPLES 512

''' + ORDER_KEY + r'''
// the packed key (score key above inverted id, as SOURCE's winners); 0: invalid (id < 0)
__device__ __forceinline__ u64 packed_key(int bits, int id) {
  return id < 0 ? 0 : ((u64)order_key(bits, id) << 31) | (u64)(0x7FFFFFFFu - (u32)id);
}
''' + BLOCK_SCAN
SAMPLED_SOURCES = {"sample": _SAMPLED_HEAD + r'''
// a block of SB threads a row: the packed keys of S = min(N, SAMPLES) evenly spaced candidates, SK a
// thread; the cutoff is the r-th largest, r = ceil(target S / N) (about target of the row at or above
// it), found by counting: the key with fewer than r keys above it and at least r at or above it
// (equal keys, a duplicate id's, write the same value). Resets the row's status for the keep.
static_assert(SAMPLES % SB == 0, "SK keys a thread");
#define SK (SAMPLES / SB)
extern "C" __global__ void __launch_bounds__(SB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, u64* __restrict__ cut,
                    int* __restrict__ stat, int N, int target, int s_sq, int s_iq) {
  __shared__ u64 key[SAMPLES];
  const int tid = threadIdx.x;
  const i64 row = blockIdx.x;
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  const int S = min(N, SAMPLES);
  u64 mine[SK];
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
''', "keep": _SAMPLED_HEAD + r'''
// grid (rows, blocks of KB threads x KI candidates), each warp on its own 32 x KI: the candidates at
// or above the row's cutoff to slots [0, cap) of the workspace row with their positions; stat[row]:
// kept, valid, warps done, then (the row's last warp) the status: the kept count where they hold the
// winners and fit, else -1
extern "C" __global__ void __launch_bounds__(KB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const u64* __restrict__ cut,
                    int* __restrict__ stat, int* __restrict__ w_ids, float* __restrict__ w_sc,
                    int* __restrict__ w_pos, int N, int cap, int K, int s_sq, int s_iq, int s_w) {
  const int lane = threadIdx.x & 31;
  const i64 row = blockIdx.x;
  const int base = blockIdx.y * (KB * KI) + (threadIdx.x >> 5) * (32 * KI);  // the warp's first candidate
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  const u64 c = __ldg(cut + row);
  int bits[KI], id[KI];
  u32 keep = 0;
  int nv = 0;
#pragma unroll
  for (int t = 0; t < KI; ++t) {
    const int p = base + t * 32 + lane;
    bits[t] = p < N ? __ldg(srow + p) : 0;
    id[t] = p < N ? __ldg(irow + p) : -1;
    if (id[t] >= 0) {
      ++nv;
      if (packed_key(bits[t], id[t]) >= c) keep |= 1u << t;
    }
  }
  const int kept = __reduce_add_sync(FULL, __popc(keep)), valid = __reduce_add_sync(FULL, nv);
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
  if (lane == 0) {  // the row's last warp writes its status
    __threadfence();
    const int done = atomicAdd(stat + row * 4 + 2, 1);
    if (done == (int)gridDim.y * (KB / 32) - 1) {
      __threadfence();
      const int kall = atomicAdd(stat + row * 4, 0), vall = atomicAdd(stat + row * 4 + 1, 0);
      stat[row * 4 + 3] = (kall <= cap && (kall >= K || kall == vall)) ? kall : -1;
    }
  }
}
'''}

_KERNELS: dict = {}  # (device index, threads, kind) -> compiled function
_LOCK = threading.Lock()  # guards _KEY_LOCKS
_KEY_LOCKS: dict = {}  # (device index, threads, kind) -> the lock its compile holds (kernels compile at once)
_FAILED: list = []  # a compile that failed here: the reason (the block path then stays off)


def _driver_library():
    # torch's getter of the CUDA driver library (its name by torch version), or None
    u = getattr(torch.cuda, "_utils", None)
    return getattr(u, "_get_gpu_runtime_library", None) or getattr(u, "_get_cuda_library", None)


@functools.lru_cache(maxsize=None)
def _machine_runs_it() -> bool:
    # CUDA, torch's NVRTC entry point and its driver library: fixed for the process
    try:
        if not torch.cuda.is_available():
            return False
    except Exception:  # pragma: no cover - depends on the machine
        return False
    return hasattr(torch.cuda, "_compile_kernel") and _driver_library() is not None


def available() -> bool:
    """Whether the block path can run here: CUDA, torch's NVRTC entry point and its driver
    library, and no earlier compile failure in this process."""
    return not _FAILED and _machine_runs_it()


def supports(n: int, k: int) -> bool:
    """Rows of ``n <= MAX_N`` candidates, ``1 <= k <= MAX_K`` outputs."""
    return 0 <= n <= MAX_N and 1 <= k <= MAX_K


def tile(n: int) -> int:
    """Threads a block for ``n`` candidates: the smallest tile that holds them."""
    for t in TILES:
        if n <= ITEMS * t:
            return t
    raise ValueError(f"a block takes at most {TILE_N} candidates, got {n}")


def chunking(n: int, k: int, chunk: int | None = None) -> tuple[int, int, int]:
    """How a row of ``n`` candidates is cut: ``(chunks, chunk, kc)``. One chunk: one block a row
    gives the ordered output. Several: a block a chunk keeps its ``kc = min(k, chunk)`` best in
    no order, and one block a row orders the best ``k`` of their ``chunks x kc`` (exact: the
    best ``k`` of a row are among its chunks' best ``k``). ``chunk``: candidates a chunk
    (default: the row in the fewest chunks of at most ``TILE_N``, of equal size)."""
    if chunk is None:
        chunks = max(1, -(-n // TILE_N))
        chunk = max(1, -(-n // chunks))
    chunk = int(chunk)
    if not 1 <= chunk <= TILE_N:
        raise ValueError(f"chunk must be in 1..{TILE_N}, got {chunk}")
    chunks = max(1, -(-n // chunk))
    kc = min(k, chunk)
    if chunks > 1 and chunks * kc > TILE_N:
        raise ValueError(f"{chunks} chunks of {chunk} keep {chunks * kc} candidates for the merge, more than a "
                         f"block's {TILE_N}: use longer chunks")
    return chunks, chunk, kc


_POS_IN, _UNORDERED, _GATED = 1, 2, 4  # SOURCE's MODE bits
_SAMPLE, _KEEP, _FILTER = 8, 16, 32  # SAMPLED_SOURCES' kernels and FILTER_KERNEL (MODE: a kind's number only)
KINDS = {"row": 0, "chunks": _UNORDERED, "merge": _POS_IN, "chunks_gated": _UNORDERED | _GATED,
         "merge_gated": _POS_IN | _GATED, "sample": _SAMPLE, "keep": _KEEP, "filter": _FILTER}
# the filter kind (FILTER_KERNEL): rows of the 1024 tile on 512 threads of 32 candidates, two blocks an SM, the
# row's keys in FILTER_DYN bytes of dynamic shared memory; taken where a launch of the 1024 tile's rows has
# more than FILTER_OVER_SMS x the device's SMs blocks
FILTER_THREADS, FILTER_DYN, FILTER_OVER_SMS = 512, 4 * TILE_N, 1
SAMPLE_THREADS, KEEP_THREADS, KEEP_ITEMS = 256, 256, 16  # the sample's and the keep's blocks
SAMPLES = 512  # the sample's keys a row at most (the kernels' SAMPLES)
KIND_THREADS = {"sample": SAMPLE_THREADS, "keep": KEEP_THREADS, "filter": FILTER_THREADS}  # kinds of one block size
# tiles whose kinds also compile for two blocks an SM (kind + PAIRED: ``__launch_bounds__(THREADS, 2)``, 64
# registers a thread), launched so where a launch has more blocks than the device has SMs. H100, graph
# replay, k = 2048 (docs/benchmarks_select_kernel.md, session 32): the 512 tile (rows of 4097-8192, a
# long row's merge of up to 8192) at 192-4096 rows took 0.70-0.91x its time at one block an SM (1024
# x 8192 random: 94.0 against 130.9 µs), 1024 x 20000 0.86-0.91x, 256 x 65536 0.93-0.99x; at 64 and
# 128 rows (one wave) 1.04-1.19x, so those keep one block an SM
PAIRED_TILES = (512,)
PAIRED = "@2"
SAMPLED_TARGET, SAMPLED_WIDTH = 2.0, 4.0  # x k: what the sample aims to keep a row; the workspace row (the merge's most)
# rows in chunks take the sampled keep from this many rows a call (H200, graph replay, k = 2048,
# docs/benchmarks_select_kernel.md session 30: at 64-1024 rows of 20000-131072 it took 0.44-0.93x the
# chunks-and-merge time on mass ties and a short context, 0.67-1.08x on random scores (1.04-1.08x at
# 20000-32768); at 8 rows of 131072 1.27x on random scores)
SAMPLED_MIN_ROWS = 64


def sampled_sizes(chunks: int, kc: int, k: int) -> tuple[int, int]:
    # the sampled keep's workspace row (the kept candidates, or the chunks' winners where the keep
    # may miss one), and what the sample aims to keep a row
    w = max(chunks * kc, min(TILE_N, int(SAMPLED_WIDTH * k)))
    return w, max(1, min(int(SAMPLED_TARGET * k), 3 * w // 4))


def sampled(q: int | None) -> bool:
    """Whether a call of ``q`` rows in chunks takes the sampled keep (``SAMPLED_MIN_ROWS``)."""
    return q is not None and q >= SAMPLED_MIN_ROWS


def paired(kind: str, threads: int, blocks: int, n_sm: int | None) -> str:
    """``kind``, or ``kind + PAIRED`` (its function for two blocks an SM) where the tile is one of
    ``PAIRED_TILES`` and the launch's ``blocks`` outnumber the device's ``n_sm`` SMs (None: not)."""
    return kind + PAIRED if threads in PAIRED_TILES and n_sm is not None and blocks > n_sm else kind


def plan_kernels(n: int, k: int, chunk: int | None = None, q: int | None = None, *, keep: bool | None = None,
                 n_sm: int | None = None) -> tuple[tuple[str, int], ...]:
    """The kernels a call of ``q`` rows runs, as ``(kind, threads)``: ``(("row", tile),)`` for a row
    in one block, or ``(("filter", FILTER_THREADS),)`` for the 1024 tile's rows where ``q`` exceeds
    ``FILTER_OVER_SMS`` x ``n_sm``; rows in chunks: ``(("chunks", chunk's tile), ("merge", merge's tile))``, or with
    the sampled keep (``keep``; default ``sampled(q)``: from ``SAMPLED_MIN_ROWS`` rows) its
    ``sample``, ``keep``, ``chunks_gated`` and ``merge_gated``. A kind ends in ``PAIRED`` where its
    function runs two blocks an SM (``paired``: given ``q`` and the device's ``n_sm``)."""
    chunks, chunk, kc = chunking(n, k, chunk)
    rows = q or 0
    if chunks == 1:
        t = tile(n)
        if t == TILES[-1] and n_sm is not None and rows > FILTER_OVER_SMS * n_sm:
            return (("filter", FILTER_THREADS),)
        return ((paired("row", t, rows, n_sm), t),)
    t1 = tile(chunk)
    if not (sampled(q) if keep is None else keep):
        t2 = tile(chunks * kc)
        return ((paired("chunks", t1, rows * chunks, n_sm), t1), (paired("merge", t2, rows, n_sm), t2))
    t2 = tile(sampled_sizes(chunks, kc, k)[0])  # block_select's workspace row
    return (("sample", SAMPLE_THREADS), ("keep", KEEP_THREADS), (paired("chunks_gated", t1, rows * chunks, n_sm), t1),
            (paired("merge_gated", t2, rows, n_sm), t2))


def source(threads: int, kind: str = "row") -> str:
    """The kernel's CUDA source for a tile of ``threads`` and a kind (``KINDS``, or one of them with
    ``PAIRED``: two blocks an SM), as NVRTC compiles it."""
    base = kind[:-len(PAIRED)] if kind.endswith(PAIRED) else kind
    return (f"#define THREADS {int(threads)}\n#define ITEMS {ITEMS}\n#define KMAX {MAX_K}\n"
            f"#define POS_IN {_POS_IN}\n#define UNORDERED {_UNORDERED}\n#define GATED {_GATED}\n"
            f"#define SB {SAMPLE_THREADS}\n#define KB {KEEP_THREADS}\n#define KI {KEEP_ITEMS}\n"
            f"#define MINB {2 if base != kind or base == 'filter' else 1}\n"
            f"#define MODE {KINDS[base]}\n" + (SOURCE_HEAD + BLOCK_SCAN + FILTER_KERNEL if base == "filter"
                                                 else SAMPLED_SOURCES.get(base, SOURCE)))


def dyn_bytes(kind: str) -> int:
    """A kind's dynamic shared memory a block, as launched: the ordering's (``DYN_BYTES``), the filter's
    row keys (``FILTER_DYN``, which hold the ordering's after the winners)."""
    return FILTER_DYN if kind == "filter" else DYN_BYTES


def sm_count(index: int | None = None) -> int:
    """The SMs of a CUDA device (the current one by default): what ``paired`` weighs a launch's
    blocks against (``select_kernel`` keeps it per device)."""
    return int(torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
               .multi_processor_count)


def compile_tile(threads: int, device: int | None = None, kind: str = "row"):
    """The compiled kernel of a tile and kind on a device (the current one by default), compiled
    once a process. Raises RuntimeError where the compile fails; ``available()`` is False after."""
    index = torch.cuda.current_device() if device is None else int(device)
    key = (index, int(threads), kind)
    kern = _KERNELS.get(key)
    if kern is not None:
        return kern
    with _LOCK:
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:
        kern = _KERNELS.get(key)
        if kern is None:
            t0 = time.perf_counter()
            try:
                with torch.cuda.device(index):
                    kern = torch.cuda._compile_kernel(source(threads, kind), "tpflare_select_rows")
                    rc = _driver_library()().cuFuncSetAttribute(kern.func, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                      dyn_bytes(kind))
                if rc != 0:
                    raise RuntimeError(f"cuFuncSetAttribute (dynamic shared memory {dyn_bytes(kind)} B): CUDA error {rc}")
                if dyn_bytes(kind) >= 48 * 1024 and hasattr(kern, "set_shared_memory_config"):
                    with torch.cuda.device(index):  # (torch's launcher refuses 48 KB of dynamic memory or more
                        kern.set_shared_memory_config(dyn_bytes(kind))  # unless told: the filter kind's 64 KB)
            except Exception as e:
                _FAILED.append(f"{type(e).__name__}: {e}")
                log.warning("tpflare.select_block: the block kernel did not compile (%s); the Triton row kernel "
                            "serves its shapes", _FAILED[-1])
                raise RuntimeError(f"tpflare.select_block: compile failed: {_FAILED[-1]}") from e
            _KERNELS[key] = kern
            log.info("tpflare.select_block: compiled the %d-thread %s kernel on cuda:%d in %.2f s", threads, kind,
                     index, time.perf_counter() - t0)
    return kern


def compile_kernels(kernels, device: int | None = None) -> None:
    """Compile the ``(kind, threads)`` kernels of a plan (``plan_kernels``) on a CUDA device, those
    not compiled yet at once, a thread each. Most of a kernel's cold compile is the driver's JIT of
    NVRTC's PTX when the module loads (about 0.7 s for a 1024-thread kind on an H100 whose JIT
    cache, ~/.nv/ComputeCache, does not hold it yet: session 33, docs/benchmarks_select_kernel.md),
    and a module loads on the thread's current context: each thread makes the device's primary
    context current first. Raises RuntimeError as ``compile_tile``."""
    index = torch.cuda.current_device() if device is None else int(device)
    todo = [(kind, int(t)) for kind, t in dict.fromkeys(kernels) if (index, int(t), kind) not in _KERNELS]
    if len(todo) <= 1:
        for kind, t in todo:
            compile_tile(t, index, kind)
        return
    import ctypes
    from concurrent.futures import ThreadPoolExecutor

    lib = _driver_library()()
    release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or lib.cuDevicePrimaryCtxRelease
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc in (lib.cuDeviceGet(ctypes.byref(dev), index), lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)):
        if rc != 0:
            raise RuntimeError(f"tpflare.select_block: the primary context of cuda:{index}: CUDA error {rc}")

    def on_context(t: int, kind: str):
        rc = lib.cuCtxSetCurrent(ctx)
        if rc != 0:
            raise RuntimeError(f"tpflare.select_block: cuCtxSetCurrent: CUDA error {rc}")
        return compile_tile(t, index, kind)

    try:
        with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="tpflare-nvrtc") as pool:
            for f in [pool.submit(on_context, t, kind) for kind, t in todo]:
                f.result()
    finally:
        release(dev)


def block_select(scores: torch.Tensor, ids: torch.Tensor, k: int, chunk: int | None = None, keep: bool | None = None,
                 n_sm: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ordered top-``k`` of each row: ``(ids int32 [Q, k], scores fp32 [Q, k])``.

    ``scores`` fp32 and ``ids`` int32 ``[Q, N]`` on the current CUDA device, rows contiguous
    (a row stride is free), ``N <= MAX_N``, ``1 <= k <= MAX_K``: the caller
    (``select_kernel.triton_ordered_select``) checks them. ``chunk``: see ``chunking`` (rows of
    more than ``TILE_N`` candidates, or a shorter ``chunk``, run in two launches: the chunks'
    best, then their merge; with the sampled keep in four: the sample, the keep, the chunks where
    the keep may miss a winner, the merge). ``keep``: whether rows in chunks take the sampled keep
    (default ``sampled(q)``: from ``SAMPLED_MIN_ROWS`` rows; ``select_kernel.block_keep`` decides
    for the dispatcher). ``n_sm``: the SMs that ``paired`` weighs a launch's blocks against
    (default: the CUDA device's; on another device none, one block an SM)."""
    q, n = scores.shape
    dev = scores.device
    out_ids = torch.empty((q, k), dtype=torch.int32, device=dev)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=dev)
    if q == 0:
        return out_ids, out_sc
    if n_sm is None and dev.type == "cuda":
        n_sm = sm_count(dev.index)
    chunks, chunk, kc = chunking(n, k, chunk)
    keep = sampled(q) if keep is None else bool(keep)
    plan = plan_kernels(n, k, chunk, q, keep=keep, n_sm=n_sm)  # (kind, threads) of each launch
    if dev.type == "cuda":  # (the CPU runner, tests/block_on_cpu.py, builds its kernels as they launch)
        compile_kernels(plan, dev.index)
    if chunks == 1:
        kind, t = plan[0]
        compile_tile(t, dev.index, kind)(
            grid=(q, 1, 1), block=(t, 1, 1), shared_mem=dyn_bytes(kind),
            args=[scores, ids, ids, out_ids, out_sc, out_ids, n, k, n, scores.stride(0), ids.stride(0), 0,
                  out_ids.stride(0), out_sc.stride(0), 0, out_ids])
        return out_ids, out_sc
    m = chunks * kc  # the chunks' winners a row (where the sampled keep may miss one)
    w, target = sampled_sizes(chunks, kc, k) if keep else (m, 0)  # the workspace row
    w_ids = torch.empty((q, w), dtype=torch.int32, device=dev)
    w_sc = torch.empty((q, w), dtype=torch.float32, device=dev)
    w_pos = torch.empty((q, w), dtype=torch.int32, device=dev)
    gate = out_ids  # (the ungated kinds read no status: any pointer)
    if keep:  # the sample's cutoff; the keep fills the workspace row and writes each row's status
        cut = torch.empty((q,), dtype=torch.int64, device=dev)
        gate = torch.empty((q, 4), dtype=torch.int32, device=dev)
        compile_tile(SAMPLE_THREADS, dev.index, "sample")(
            grid=(q, 1, 1), block=(SAMPLE_THREADS, 1, 1), shared_mem=0,
            args=[scores, ids, cut, gate, n, target, scores.stride(0), ids.stride(0)])
        compile_tile(KEEP_THREADS, dev.index, "keep")(
            grid=(q, -(-n // (KEEP_THREADS * KEEP_ITEMS)), 1), block=(KEEP_THREADS, 1, 1), shared_mem=0,
            args=[scores, ids, cut, gate, w_ids, w_sc, w_pos, n, w, k, scores.stride(0), ids.stride(0), w])
    (kind1, t1), (kind2, t2) = plan[-2:]  # (chunks, merge; gated after the keep)
    compile_tile(t1, dev.index, kind1)(  # (no ordering: no dynamic shared memory; gated: the rows of status -1)
        grid=(q, chunks, 1), block=(t1, 1, 1), shared_mem=0,
        args=[scores, ids, ids, w_ids, w_sc, w_pos, n, kc, chunk, scores.stride(0), ids.stride(0), 0, w, w, w, gate])
    compile_tile(t2, dev.index, kind2)(
        grid=(q, 1, 1), block=(t2, 1, 1), shared_mem=DYN_BYTES,
        args=[w_sc, w_ids, w_pos, out_ids, out_sc, out_ids, m, k, m, w, w, w, out_ids.stride(0), out_sc.stride(0), 0,
              gate])
    if keep and STATS is not None:
        STATS.append(gate)
    return out_ids, out_sc


STATS = None  # a list: each sampled call appends its rows' status (tests and bench/launch_phases.py: which rows the keep served)
