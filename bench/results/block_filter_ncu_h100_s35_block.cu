#define THREADS 512
#define ITEMS 16
#define KMAX 2048
#define POS_IN 1
#define UNORDERED 2
#define GATED 4
#define SB 256
#define KB 256
#define KI 16
#define MINB 2
#define MODE 32

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

// the unsigned order key of a score: larger comes first; invalid 0, NaN 1, -inf 0x007fffff
__device__ __forceinline__ u32 order_key(int bits, int id) {
  int s = bits >= 0 ? bits : (bits ^ 0x7FFFFFFF);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) s = (int)0x80000001;
  if (id < 0) s = (int)0x80000000;
  return (u32)s ^ 0x80000000u;
}

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

// four candidates' score keys (bits b, ids d), counted (valid, -inf, NaN) and their first 11-bit digit into hist
__device__ __forceinline__ uint4 put_keys(const int (&b)[4], const int (&d)[4], int* hist, int& nv, int& ninf,
                                          int& nnan) {
  u32 kk[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    kk[j] = order_key(b[j], d[j]);
    if (d[j] >= 0) {
      ++nv;
      ninf += kk[j] == KEY_NEGINF;
      nnan += kk[j] == KEY_NAN;
      atomicAdd(&hist[2047 - (int)(kk[j] >> 21)], 1);
    }
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
          if (x[j] != 0 && (top == 32 || (x[j] >> top) == (prefix >> top)))
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
// again: a group of four's ids in one load where it holds a winner or a tie, four groups' loads at once); level
// 2, t1 (level 1's key) above its inverted id; level 3, t1 above i2 (level 2's). Returns wn plus the level's
// winners.
__device__ int femit(u32* lk, int lvl, u32 T, int sh, bool all, u32 t1, u32 i2, int wn, const int* irow, int N,
                     bool vec, Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31;
  uint4* lk4 = reinterpret_cast<uint4*>(lk);
  u32 win = 0;
#pragma unroll
  for (int c = 0; c < FV; ++c) {
    const uint4 v = lk4[c * THREADS + tid];
    const u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int cm = x[j] ? cmp_at(x[j], T, sh) : -1;
      if (cm > 0 || (cm == 0 && all)) win |= 1u << (4 * c + j);
    }
  }
  int total;
  int slot = wn + block_scan<THREADS>(__popc(win), sm.wtot, total);
  u32 umin = 0xFFFFFFFFu;
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
  u32* lk = reinterpret_cast<u32*>(fdyn);
  uint4* lk4 = reinterpret_cast<uint4*>(fdyn);
  int* hist = sm.off;  // (the digits' counts; the ordering's bucket sizes after them)
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const i64 row = blockIdx.x;
  const int* srow = reinterpret_cast<const int*>(scores) + row * s_sq;
  const int* irow = ids + row * s_iq;
  if (tid == 0) reset_shared(sm);
  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;
  __syncthreads();
  // the row's score keys to lk, by 16-byte loads where both rows allow them; level 1's first digit counted
  const bool vec = (N & 3) == 0 && ((reinterpret_cast<u64>(srow) | reinterpret_cast<u64>(irow)) & 15) == 0;
  int nv = 0, ninf = 0, nnan = 0;
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
    lk4[c * THREADS + tid] = put_keys(b, d, hist, nv, ninf, nnan);
  }
  add_counts(nv, ninf, nnan, sm);
  const int nvalid = sm.nvalid;
  const int nsel = min(K, nvalid);
  if (nsel > 0 && nsel == nvalid) {  // every valid candidate wins
    femit(lk, 1, 0u, 0, true, 0u, 0u, 0, irow, N, vec, sm);
  } else if (nsel > 0) {
    u32 T1, T2, T3;
    int sh, ab, eq;
    const int over = nvalid - sm.ninf - sm.nnan;  // above -inf
    if (over < nsel && nsel <= over + sm.ninf) {  // the cutoff at -inf (a short context's pads): no passes
      T1 = KEY_NEGINF;
      sh = 0;
      ab = over;
      eq = sm.ninf;
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
  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;  // (the ordering counts its buckets from 0)
  __syncthreads();
  if (nsel > 0) order_winners(sm, fdyn, nsel, irow);

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
