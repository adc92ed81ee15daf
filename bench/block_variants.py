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
    Sub(r"(    plan = plan_kernels\(n, k, chunk, q, [^\n]*\n)(    if chunks == 1:\n)",
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

# the prefetch of the 1024 tile's next row by the TMA engine (session 33): as prefetch, a block an SM for
# several rows, but the next row's scores come in one bulk copy (cp.async.bulk, issued by one thread,
# completing on an mbarrier) as soon as every thread holds this row's slots, and its ids are only
# hinted to the L2 (cp.async.bulk.prefetch.L2: one instruction), so the row buffer is 64 KB, not 128:
# 146 KB of shared memory a block, against prefetch's 210 KB (whose 32 copies a thread and small L1
# were the suspects of its 13-24 % loss, session 28). Rows not 16-byte aligned load as shipped
_TMA_NEXT = [
    ("#define KEY_NEGINF 0x007FFFFFu", "#define KEY_NEGINF 0x007FFFFFu", r"""#if PREFETCH
#ifdef __CUDA_ARCH__
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
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (the generic reads of dst before the barrier)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void l2_prefetch(const void* src, u32 bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(u64* bar, u32 parity) {
  u32 done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}
#else  // the CPU runner: bar counts the copies landed; a copy lands at its issue (issued before every reader
// of the old bytes passed a barrier, it overwrites them); a wait gives way until its phase completed
inline void bar_init(u64* bar) { *bar = 0; }
inline void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
  std::memcpy(dst, src, bytes);
  ++*bar;
}
inline void l2_prefetch(const void*, u32) {}
inline void bar_wait(u64* bar, u32 parity) {
  while ((*bar & 1u) == parity) cuda_on_cpu::yield();
}
#endif
#endif

#define KEY_NEGINF 0x007FFFFFu  // order_key of -inf (the pad's score)
"""),
    ("  u32 pmin, pmax, ulo;", "  u32 pmin, pmax, ulo;",
     "  u32 pmin, pmax, ulo;  // ulo: the smallest score key among the winners (taken as they are written)\n"
     "  u64 rbar;  // (tma_next: the row buffer's mbarrier)\n"),
    Sub(r"(  const int lane = tid & 31;\n)  const i64 row = blockIdx.x;\n", r"""\1#if PREFETCH  // the row's scores after the ordering's dynamic memory, a bulk copy a row
#define ROWBUF reinterpret_cast<int*>(reinterpret_cast<char*>(dyn) + ROWBUF_AT)
  // rows blockIdx.x, + gridDim.x, ...: the next one's copy while this one is selected. The rows: the
  // row kind's s_op (a stride of out_pos, which it does not write)
  const int nrows = s_op;
  const bool bulk = ((reinterpret_cast<u64>(scores) & 15) | (u64)(s_sq & 3) | (u64)(N & 3)) == 0 && N > 0;
  if (tid == 0) bar_init(&sm.rbar);
  __syncthreads();
  if (tid == 0 && bulk)
    bulk_copy(ROWBUF, reinterpret_cast<const int*>(scores) + (i64)blockIdx.x * s_sq, 4u * (u32)N, &sm.rbar);
  u32 phase = 0;
  for (i64 row = blockIdx.x; row < nrows; row += gridDim.x, phase ^= 1u) {
#else
  {
  const i64 row = blockIdx.x;
#endif
""", 1),
    _PREFETCH[2],
    ("  u32 u[ITEMS];", "  u32 u[ITEMS];", """\
#if PREFETCH
  if (bulk) bar_wait(&sm.rbar, phase);  // this row's scores landed
#endif
  u32 u[ITEMS];
"""),
    ("    int b = p < N ? __ldg(srow + p) : 0;", "    int b = p < N ? __ldg(srow + p) : 0;", """\
#if PREFETCH
    int b = p < N ? (bulk ? ROWBUF[p] : __ldg(srow + p)) : 0;
#else
    int b = p < N ? __ldg(srow + p) : 0;
#endif
"""),
    ("  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;", "  __syncthreads();", """\
  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;
  __syncthreads();
#if PREFETCH  // every thread holds its slots: the next row's scores to the buffer, its ids toward the L2
  if (tid == 0 && row + gridDim.x < nrows) {
    const i64 nxt = row + gridDim.x;
    if (bulk) bulk_copy(ROWBUF, reinterpret_cast<const int*>(scores) + nxt * s_sq, 4u * (u32)N, &sm.rbar);
    if (((reinterpret_cast<u64>(ids + nxt * s_iq) & 15) | (u64)(N & 3)) == 0 && N > 0) l2_prefetch(ids + nxt * s_iq, 4u * (u32)N);
  }
#endif
"""),
    _PREFETCH[7],
] + _PREFETCH[8:] + [Sub(r"return DYN_BYTES \+ \(8 \* threads \* ITEMS", "return DYN_BYTES + (4 * threads * ITEMS", 1)]

# tma_next with the row's selection in a called function (session 33): tma_next's loop raised the 1024 tile's
# spills from 84 / 128 to 216 / 376 bytes (nvcc), and took 1.22-1.30x the shipped kernel's time on an H100
# even at 64 rows (a row a block); a __noinline__ call a row keeps the loop's state out of the
# selection's registers
_TMA_CALL = _TMA_NEXT[:2] + [
    ('extern "C" __global__ void __launch_bounds__(THREADS, MINB)', "  const i64 row = blockIdx.x;", r"""#if PREFETCH  // a row's selection, called for each of the block's rows (tpflare_select_rows below)
#define ROWBUF reinterpret_cast<int*>(reinterpret_cast<char*>(dyn) + ROWBUF_AT)
__device__ __noinline__ void
select_row(const float* __restrict__ scores, const int* __restrict__ ids, const int* __restrict__ pos_in,
                    int* __restrict__ out_ids, float* __restrict__ out_sc, int* __restrict__ out_pos, int N, int K,
                    int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op,
                    const int* __restrict__ stat,
           Smem& sm, u64* dyn, const i64 row, const bool bulk, const u32 phase) {
  const int nrows = s_op;
#else
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const int* __restrict__ pos_in,
                    int* __restrict__ out_ids, float* __restrict__ out_sc, int* __restrict__ out_pos, int N, int K,
                    int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op,
                    const int* __restrict__ stat) {
  __shared__ Smem sm;
  extern __shared__ u64 dyn[];
  const i64 row = blockIdx.x;
#endif
  constexpr int mode = MODE;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
"""),
    _TMA_NEXT[4], _TMA_NEXT[5], _TMA_NEXT[6],
    Sub(r'(    orow\[r\] = oid;\n    osrow\[r\] = bits;\n  \}\n)\}\n"""', r"""\1}
#if PREFETCH  // a block an SM, for rows blockIdx.x, + gridDim.x, ... (the row kind's s_op rows): the next one's scores
// copied while this one is selected
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
tpflare_select_rows(const float* __restrict__ scores, const int* __restrict__ ids, const int* __restrict__ pos_in,
                    int* __restrict__ out_ids, float* __restrict__ out_sc, int* __restrict__ out_pos, int N, int K,
                    int chunk, int s_sq, int s_iq, int s_pq, int s_oi, int s_os, int s_op,
                    const int* __restrict__ stat) {
  __shared__ Smem sm;
  extern __shared__ __align__(16) u64 dyn[];
  const int nrows = s_op;
  const bool bulk = ((reinterpret_cast<u64>(scores) & 15) | (u64)(s_sq & 3) | (u64)(N & 3)) == 0 && N > 0;
  if (threadIdx.x == 0) bar_init(&sm.rbar);
  __syncthreads();
  if (threadIdx.x == 0 && bulk)
    bulk_copy(ROWBUF, reinterpret_cast<const int*>(scores) + (i64)blockIdx.x * s_sq, 4u * (u32)N, &sm.rbar);
  u32 phase = 0;
  for (i64 row = blockIdx.x; row < nrows; row += gridDim.x, phase ^= 1u) {
    select_row(scores, ids, pos_in, out_ids, out_sc, out_pos, N, K, chunk, s_sq, s_iq, s_pq, s_oi, s_os, s_op, stat,
               sm, dyn, row, bulk, phase);
    __syncthreads();  // (the next row resets the shared state)
  }
}
#endif
""" + '"""', 1),
] + _TMA_NEXT[8:]

# the tie levels' keys (the inverted id, then the inverted position) in place of the score key in u for
# the slots in play (whose score key is T1, put back after them), the ids kept in registers: the
# arrays v and w (ITEMS registers each, live with u and id through the id level) go. Session 32's
# noids did this and also dropped the id registers (1.04-1.19x the time: the ids read again cost
# more); nvcc: the 1024 tile spills 84 / 128 bytes as shipped
_INPLACE_LEVELS = [
    ("      u32 v[ITEMS];", "        radix_select(w, play3, rem, eq, 1, sm, T3, sh3, ab, eq);", """\
      u32 play = 0;  // (the slots at T1: their keys become the inverted ids, then T1 again below)
#pragma unroll
      for (int t = 0; t < ITEMS; ++t) {
        if (((valid >> t) & 1u) && u[t] == T1) {
          play |= 1u << t;
          u[t] = 0x7FFFFFFFu - (u32)id[t];
        }
      }
      tied = play;
      radix_select(u, play, rem, eq, 0, sm, T2, sh2, ab, eq);
      rem -= ab;
      if (eq > rem) {  // duplicate ids at T1: by position
        lvl = 3;
        u32 play3 = 0;
#pragma unroll
        for (int t = 0; t < ITEMS; ++t) {
          if (((play >> t) & 1u) && u[t] == T2) {
            play3 |= 1u << t;
            u[t] = ~(u32)position(t * THREADS + tid);
          }
        }
        radix_select(u, play3, rem, eq, 1, sm, T3, sh3, ab, eq);
"""),
    ("  int lvl = 0;  // 0: every valid candidate wins; else the levels run", "  int lvl = 0;", """\
  int lvl = 0;  // 0: every valid candidate wins; else the levels run
  u32 tied = 0;  // the slots whose u holds a tie level's key (their score key is T1)
"""),
    ("  // the winners to shared memory: packed key (score key above inverted id)", "  // the winners to shared memory", """\
#pragma unroll
  for (int t = 0; t < ITEMS; ++t)
    if ((tied >> t) & 1u) u[t] = T1;
  // the winners to shared memory: packed key (score key above inverted id), position; a thread's
"""),
]

# two histograms (and pass extremes) taken in turn: a radix pass zeroes the next pass's while it fills its
# own, so the barrier before each pass's atomics goes (one a pass; session 32's phases: the score level
# takes 11,000 of 39,800 cycles a block at 1024 x 16384, three to four passes of three barriers each)
_HIST2 = [
    ("  int hist[256];", "  int hist[256];", "  int hist[2][256];  // a radix pass's histogram, and the next pass's (zeroed meanwhile)\n"),
    ("  u32 pmin, pmax, ulo;", "  u32 pmin, pmax, ulo;",
     "  u32 pmin[2], pmax[2], ulo;  // ulo: the smallest score key among the winners (taken as they are written)\n"),
    ("                                             Smem& sm, u32& T, int& sh, int& above, int& eq) {",
     "                                             Smem& sm, u32& T, int& sh, int& above, int& eq) {",
     "                                             Smem& sm, u32& T, int& sh, int& above, int& eq, int& hb) {\n"),
    ("    for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;", "    __syncthreads();", """\
    const int b0 = hb, b1 = hb ^ 1;  // this pass's histogram (zeroed before), the next pass's (zeroed now)
    for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[b1][i] = 0;
    if (threadIdx.x == 0) {
      sm.pmin[b1] = 0xFFFFFFFFu;
      sm.pmax[b1] = 0;
    }
"""),
    Sub(r"atomicAdd\(&sm\.hist\[b\], 1\);", "atomicAdd(&sm.hist[b0][b], 1);", 1),
    Sub(r"atomicMin\(&sm\.pmin, mn\);", "atomicMin(&sm.pmin[b0], mn);", 1),
    Sub(r"atomicMax\(&sm\.pmax, mx\);", "atomicMax(&sm.pmax[b0], mx);", 1),
    Sub(r"mn = sm\.pmin;", "mn = sm.pmin[b0];", 1),
    Sub(r"mx = sm\.pmax;", "mx = sm.pmax[b0];", 1),
    Sub(r"c\[j\] = sm\.hist\[255 - 8 \* lane - j\];", "c[j] = sm.hist[b0][255 - 8 * lane - j];", 1),
    Sub(r"(    prefix \|= \(u32\)sm\.bin << s;\n)", r"\1    hb = b1;\n", 1),
    Sub(r"radix_select\((u|v|w), (valid|play|play3), (nsel|rem), (nvalid|eq), (-1|0|1), sm, (T\d), (sh\d), ab, eq\);",
        r"radix_select(\1, \2, \3, \4, \5, sm, \6, \7, ab, eq, hb);", 3),
    ("  int lvl = 0;  // 0: every valid candidate wins; else the levels run", "  int lvl = 0;", """\
  int lvl = 0;  // 0: every valid candidate wins; else the levels run
  int hb = 0;  // the histogram radix_select's next pass fills (zeroed at the start)
"""),
    ("    sm.ulo = 0xFFFFFFFFu;", "    sm.ulo = 0xFFFFFFFFu;", """\
    sm.ulo = 0xFFFFFFFFu;
    sm.pmin[0] = 0xFFFFFFFFu;
    sm.pmax[0] = 0;
"""),
    ("  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;", "  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;", """\
  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;
  for (int i = tid; i < 256; i += THREADS) sm.hist[0][i] = 0;
"""),
]

# the score level's first pass (the top digit, every valid key in play) built with the row's counts,
# between the same two barriers: the pass's own zeroing barrier, loop and barrier go. -inf and NaN
# (both of bin 0) take no atomic: their counts are added to bin 0 where the bin is found, so a short
# context's -inf pads cost nothing where the cutoff is at -inf and the levels do not run
_FUSED_FIRST = [
    ("                                             Smem& sm, u32& T, int& sh, int& above, int& eq) {",
     "                                             Smem& sm, u32& T, int& sh, int& above, int& eq) {",
     "                                             Smem& sm, u32& T, int& sh, int& above, int& eq, bool pre) {\n"),
    ("    for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;",
     "    for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;", """\
    const bool span = THREADS == 1024;  // (below)
    const bool built = pre && s == s0;  // (this pass's histogram and extremes came with the row's counts)
    u32 mn = 0xFFFFFFFFu, mx = 0;
    if (!built) {  // (the pass's zeroing, atomics and barriers: as shipped)
    for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;
"""),
    ("    const bool span = THREADS == 1024;\n", "    u32 mn = 0xFFFFFFFFu, mx = 0;", ""),
    Sub(r"(    __syncthreads\(\);\n)(    if \(span\) \{\n      mn = sm\.pmin;)", r"\1    }\n\2", 1),
    Sub(r"c\[j\] = sm\.hist\[255 - 8 \* lane - j\];",
        "c[j] = sm.hist[255 - 8 * lane - j] + (built && 8 * lane + j == 255 ? sm.ninf + sm.nnan : 0);", 1),
    Sub(r"radix_select\(u, valid, nsel, nvalid, -1, sm, T1, sh1, ab, eq\);", "radix_select(u, valid, nsel, nvalid, -1, sm, T1, sh1, ab, eq, true);", 1),
    Sub(r"radix_select\((v|w|u), (play|play3), rem, eq, (0|1), sm, (T2|T3), (sh2|sh3), ab, eq\);",
        r"radix_select(\1, \2, rem, eq, \3, sm, \4, \5, ab, eq, false);", 2),
    ("    sm.ulo = 0xFFFFFFFFu;", "    sm.ulo = 0xFFFFFFFFu;", """\
    sm.ulo = 0xFFFFFFFFu;
    sm.pmin = 0xFFFFFFFFu;
    sm.pmax = 0;
"""),
    ("  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;", "  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;", """\
  for (int i = tid; i < NB; i += THREADS) sm.off[i] = 0;
  for (int i = tid; i < 256; i += THREADS) sm.hist[i] = 0;
"""),
    ("  nv = __reduce_add_sync(FULL, nv);", "  nv = __reduce_add_sync(FULL, nv);", """\
  {  // the score level's first pass: the top digit of every valid key (-inf and NaN: counted, bin 0)
    u32 mn = 0xFFFFFFFFu, mx = 0;
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      if ((valid >> t) & 1u) {
        if (u[t] != KEY_NEGINF && u[t] != KEY_NAN) atomicAdd(&sm.hist[u[t] >> 24], 1);
        mn = min(mn, u[t]);
        mx = max(mx, u[t]);
      }
    }
    if (THREADS == 1024) {  // (radix_select's span)
      mn = __reduce_min_sync(FULL, mn);
      mx = __reduce_max_sync(FULL, mx);
      if (lane == 0 && mn <= mx) {
        atomicMin(&sm.pmin, mn);
        atomicMax(&sm.pmax, mx);
      }
    }
  }
  nv = __reduce_add_sync(FULL, nv);
"""),
]

# level 1's later passes over a list (session 33): after the first pass over the registers, the candidates
# in its bin (at most LIST_MAX: 4096 keys, in the winners' key array, free until the winners are written)
# are listed in shared memory, and the passes after it read the list (a few keys a thread) instead of
# every thread's 16 slots. Random normal scores at 1024 x 16384 put about 2,200 keys in the first
# bin; an instruction a slot costs 128 issue cycles of a 1024-thread block, and a pass takes about a
# dozen (session 31's profile: the radix passes 22 % of the samples, latency-bound at IPC 2.3)
_LIST_PASSES = [
    ("  int pc[3], big, bin, above, eq, nvalid, ninf, nnan, wcount;", "  int pc[3], big, bin, above, eq,",
     "  int pc[3], big, bin, above, eq, nvalid, ninf, nnan, wcount, lcount;  // lcount: level 1's list\n"),
    ("    sm.kmax[0] = sm.kmax[1] = 0;", "    sm.kmax[0] = sm.kmax[1] = 0;", "    sm.kmax[0] = sm.kmax[1] = 0;\n    sm.lcount = 0;\n"),
    ("      radix_select(u, valid, nsel, nvalid, -1, sm, T1, sh1, ab, eq);",
     "      radix_select(u, valid, nsel, nvalid, -1, sm, T1, sh1, ab, eq);",
     "      radix_select(u, valid, nsel, nvalid, -1, sm, T1, sh1, ab, eq, reinterpret_cast<u32*>(sm.wkey));\n"),
    ("__device__ __forceinline__ void radix_select(const u32 (&key)[ITEMS], u32 play, int need, int total, int narrow,",
     "  T = prefix;", r"""#define LIST_MAX (2 * KMAX)  // level 1's list: keys in the winners' key array (i64[KMAX])
// the bin of the rem-th largest key of a pass's histogram (warp 0; lane l holds bins 255 - 8l - j):
// sm.bin, sm.above (the count in the bins above it), sm.eq (its count); the caller's barrier follows
__device__ __forceinline__ void find_bin(Smem& sm, int rem) {
  const int lane = threadIdx.x & 31;
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

// The need-th largest key among the candidates in play (play: a bit a slot; 1 <= need <= their
// count, total). Stops at the first digit whose bin holds exactly the candidates still wanted.
// Returns: T (the key's bits from shift sh up), sh, above (in play with key >> sh > T >> sh),
// eq (in play with key >> sh == T >> sh); eq == need - above unless sh == 0 and keys tie.
// narrow (0 or 1: a slot of sm.kmin / kmax, unused before; -1: none): first the smallest and the
// largest key in play, and the passes start at the digit of the highest bit in which they differ
// (the tie levels: ids and positions share their high bits, so their passes mostly start lower).
// list (level 1; else null): room for LIST_MAX keys, where the candidates of the first pass's bin go
// when they fit; the later passes read them there
__device__ __forceinline__ void radix_select(const u32 (&key)[ITEMS], u32 play, int need, int total, int narrow,
                                             Smem& sm, u32& T, int& sh, int& above, int& eq, u32* list = nullptr) {
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
    if (threadIdx.x < 32) find_bin(sm, need - above);
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
    if (list != nullptr && s > 0 && eq <= LIST_MAX) {  // the bin's keys to the list; the passes after read it
      int c = 0;
#pragma unroll
      for (int t = 0; t < ITEMS; ++t) c += ((play >> t) & 1u) && (key[t] >> s) == (prefix >> s);
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += y;
      }
      int at = 0;
      if (lane == 31 && incl) at = atomicAdd(&sm.lcount, incl);
      at = __shfl_sync(FULL, at, 31) + incl - c;
#pragma unroll
      for (int t = 0; t < ITEMS; ++t)
        if (((play >> t) & 1u) && (key[t] >> s) == (prefix >> s)) list[at++] = key[t];
      const int n = eq;  // (the list's length: the bin's count)
      for (s -= 8; s >= 0; s -= 8) {
        for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;
        __syncthreads();  // (and the list written)
        for (int i = threadIdx.x; i < n; i += THREADS) {
          const u32 k = list[i];
          if (((u64)k >> (s + 8)) == ((u64)prefix >> (s + 8))) atomicAdd(&sm.hist[(k >> s) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) find_bin(sm, need - above);
        __syncthreads();
        prefix |= (u32)sm.bin << s;
        above += sm.above;
        eq = sm.eq;
        sh = s;
        if (eq == need - above) break;
      }
      break;
    }
  }
  T = prefix;
"""),
]

# (session 30: scan and the sampled keep with a counted sample and a keep by warps, sampled_fast, are
# shipped; their variants, and those built on them or that no longer apply (sampled, sampled_count,
# sampled_rows, sampled_rows_tight, smem_keys: each measured slower, docs/benchmarks_select_kernel.md),
# are in the repository's history; so are session 31's order_merge, hist8 and l2_next, each measured
# slower on an H100: docs/benchmarks_select_kernel.md, session 31; session 32 shipped cheap_math, the
# ordering's shifts without 64-bit divisions, and measured part_warp and in32 slower: their text is in
# the history at commit 9fe81c3; it shipped key_bits too, the winners' score bits from their packed keys,
# and lb2_512 as PAIRED_TILES (the 512 tile at two blocks an SM where a launch has more blocks than SMs),
# and measured noids and wide slower (in the history at commit 031b5fb); it shipped lohi_fused, the winners'
# smallest score key taken as they are written, and measured parts_redux slower (history: c9346a5))
VARIANTS = {"match": _MATCH, "peel": _PEEL, "digits11": _DIGITS11, "rank_keys": _RANK_KEYS,
            "spread": _SPREAD, "prefetch": _PREFETCH, "prefetch512": _PREFETCH + _PREFETCH_512,
            "inplace_levels": _INPLACE_LEVELS, "hist2": _HIST2,
            "fused_first": _FUSED_FIRST, "list_passes": _LIST_PASSES, "tma_next": _TMA_NEXT, "tma_call": _TMA_CALL}


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
