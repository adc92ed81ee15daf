// cuda_on_cpu.h: the CUDA built-ins a block kernel uses, for running it on the CPU (tests only).
//
// A launch runs its blocks one after another (in index order with seed 0, in an order the seed
// shuffles with another: blocks that hand work on through global atomics, a last block finishing a
// row, see others finish before and after them); a block's threads are fibers (ucontext, switched by
// _setjmp/_longjmp) on one OS thread, each with its own stack. A thread runs until it waits: at
// __syncthreads() until every thread of the block is there, at a warp function (__ballot_sync,
// __match_any_sync, __shfl*_sync, __reduce_*_sync) until its 32 lanes are. Nothing runs in parallel, so atomics are
// plain read-modify-writes that return the old value.
//
// What a GPU leaves open, a seed decides here. Seed 0: threads run first come, first run. Another
// seed: the next thread to run is any that can, at random (a warp may run far ahead of the
// others), and a thread may also give way at an atomic; so the order in which threads reach shared
// atomics (the slots they get), and whether a read comes before another thread's write, change
// from seed to seed. Shared memory (static and dynamic) starts as random bytes, not zeros. A
// kernel whose output depends on either is wrong on a GPU too, and shows it here as outputs that
// differ from seed to seed.
//
// What it refuses (the launch returns the reason): a barrier or warp function some threads never
// reach (a deadlock: threads exited or wait elsewhere), lanes of a warp in different warp
// functions at the same step, a warp mask other than all 32 lanes, a block not a whole number of
// warps, and an index past an array of known size, a __shared__ struct's member arrays included
// (the build's -fsanitize=bounds). Not emulated: memory reached through pointers outside the
// arrays a launch is given is not checked; warps do not run in lockstep (code that relies on
// implicit warp-synchronous execution without __syncwarp or a *_sync function is not modelled);
// clock64 and inline PTX do not exist.
//
// Asynchronous copies to shared memory (sm_80's cp.async; a kernel's own helpers of these names, in
// PTX on the GPU): cp_async16 / cp_async4 (dst shared, src global, 16- or 4-byte aligned, else the
// launch stops) and cp_async_wait_all (this thread's copies land). A copy lands at some point
// between its issue and the thread's wait: with seed 0 at the wait (a read of another thread's copy
// without a barrier after its wait sees the old bytes), with another seed at the issue or at the
// wait, at random (a copy issued before every reader of the old bytes passed a barrier overwrites
// them). A thread that ends with copies it never waited for stops the launch.
//
// The bulk copy engine (sm_90's cp.async.bulk completing on an mbarrier; a kernel's own helpers of these
// names, in PTX on the GPU): bar_init(bar), bulk_copy(dst, src, bytes, bar) (both addresses 16-byte aligned
// and bytes a multiple of 16, else the launch stops; one copy in flight a barrier) and bar_wait(bar,
// parity). A copy lands at the first wait on its barrier: a read before any wait sees the old bytes.
//
// Vector types int4 / uint4 (make_int4, make_uint4): 16-byte aligned, as on a GPU; __ldg of any type
// at an address not aligned to it stops the launch (a GPU faults there).
//
// cuda_on_cpu.py includes this before a kernel's source, in which it has replaced the
// `__shared__` declarations by calls to static_shared / dynamic_shared below.
#pragma once
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

// CUDA's 16-byte vector types (a vector load must be 16-byte aligned, as on a GPU: see __ldg below)
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

namespace cuda_on_cpu {

enum State { RUN, BARRIER, WARP, DONE, ABORTED };
enum WarpOp { BALLOT = 1, SHFL, SHFL_UP, SHFL_XOR, RED_ADD, RED_MIN, RED_MAX, SYNCWARP, MATCH_ANY };
static const char* const kOpName[] = {"", "__ballot_sync", "__shfl_sync", "__shfl_up_sync", "__shfl_xor_sync",
                                      "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync", "__syncwarp",
                                      "__match_any_sync"};

struct Thread {
  ucontext_t ctx;  // its first entry
  jmp_buf jb;      // where it gave way (a switch by _setjmp/_longjmp: no signal-mask system call)
  bool started = false;
  State state = RUN;
  unsigned tid = 0;
  unsigned long long wgen = 0;  // warp functions this thread has passed
  size_t shared_calls = 0;      // static_shared calls so far (the i-th names the block's i-th array)
  struct Copy {
    void* dst;
    const void* src;
    size_t n;
  };
  std::vector<Copy> pending;  // asynchronous copies issued, not yet landed
};

struct WarpStep {  // a warp function in progress; two a warp, by step parity
  unsigned long long val[32];
  int op = 0;
  int arrived = 0;
};

struct Block {
  std::vector<Thread> th;
  std::vector<WarpStep> steps;  // [warp * 2 + parity]
  std::vector<std::vector<unsigned char>> shared;
  std::vector<unsigned char> dyn;
  jmp_buf sched;
  std::deque<int> ready;  // threads that can run, the current one aside
  int cur = -1, nthreads = 0, at_barrier = 0;
  unsigned seed = 0;
  std::mt19937 rng;
  std::string error;
};

inline Block* B = nullptr;
inline std::function<void()> kernel_body;

inline Thread& me() { return B->th[B->cur]; }

inline void release(int i) {  // thread i can run again (the current one goes back in line as it yields)
  B->th[i].state = RUN;
  if (i != B->cur) B->ready.push_back(i);
}

inline void yield() {
  if (!_setjmp(me().jb)) _longjmp(B->sched, 1);
}

[[noreturn]] inline void fail(const std::string& why) {
  if (B->error.empty()) B->error = why;
  me().state = ABORTED;
  yield();
  __builtin_unreachable();  // an aborted thread is never resumed
}

inline void maybe_yield() {  // a seeded run: give way now and then, at an atomic
  if (B->seed != 0 && (B->rng() & 7u) == 0) yield();
}

inline void random_fill(std::vector<unsigned char>& v) {
  for (auto& c : v) c = (unsigned char)B->rng();
}

inline void* static_shared(size_t bytes) {
  Thread& t = me();
  size_t i = t.shared_calls++;
  if (i == B->shared.size()) {
    B->shared.emplace_back(bytes + 64);
    random_fill(B->shared.back());
  }
  if (B->shared[i].size() != bytes + 64) fail("threads declare different __shared__ arrays");
  auto* p = B->shared[i].data();
  return p + (64 - (reinterpret_cast<uintptr_t>(p) & 63)) % 64;  // 64-byte aligned
}

inline void* dynamic_shared() { return B->dyn.empty() ? nullptr : B->dyn.data(); }

template <class T>
inline unsigned long long to_bits(T v) {
  static_assert(sizeof(T) <= 8, "a warp function takes at most 64 bits");
  unsigned long long u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T from_bits(unsigned long long u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

// every lane of the warp posts v; returns the 32 posted values once all are there
inline const unsigned long long* exchange(int op, unsigned mask, unsigned long long v) {
  Thread& t = me();
  if (mask != 0xFFFFFFFFu) fail(std::string(kOpName[op]) + ": only the full warp mask is emulated");
  const int warp = (int)(t.tid / 32), lane = (int)(t.tid % 32);
  WarpStep& s = B->steps[warp * 2 + (t.wgen & 1)];
  if (s.arrived == 0) {
    s.op = op;
  } else if (s.op != op) {
    fail("warp " + std::to_string(warp) + ": lanes in " + kOpName[s.op] + " and " + kOpName[op] + " at the same step");
  }
  s.val[lane] = v;
  t.state = WARP;
  if (++s.arrived == 32) {
    s.arrived = 0;
    for (int l = 0; l < 32; ++l) release(warp * 32 + l);
  }
  yield();
  ++t.wgen;
  return s.val;
}

inline int lane_id() { return (int)(me().tid % 32); }

}  // namespace cuda_on_cpu

inline void __syncthreads() {
  using namespace cuda_on_cpu;
  me().state = BARRIER;
  if (++B->at_barrier == B->nthreads) {
    B->at_barrier = 0;
    for (int i = 0; i < B->nthreads; ++i) release(i);
  }
  yield();
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  const unsigned long long* v = cuda_on_cpu::exchange(cuda_on_cpu::BALLOT, mask, pred != 0);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= (v[l] ? 1u : 0u) << l;
  return r;
}
template <class T>
inline unsigned __match_any_sync(unsigned mask, T x) {  // the lanes whose value equals this lane's
  const unsigned long long* v = cuda_on_cpu::exchange(cuda_on_cpu::MATCH_ANY, mask, cuda_on_cpu::to_bits(x));
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= (v[l] == cuda_on_cpu::to_bits(x) ? 1u : 0u) << l;
  return r;
}
template <class T>
inline T __shfl_sync(unsigned mask, T x, int src, int width = 32) {
  if (width != 32) cuda_on_cpu::fail("__shfl_sync: only width 32 is emulated");
  return cuda_on_cpu::from_bits<T>(cuda_on_cpu::exchange(cuda_on_cpu::SHFL, mask, cuda_on_cpu::to_bits(x))[src & 31]);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T x, unsigned delta, int width = 32) {
  if (width != 32) cuda_on_cpu::fail("__shfl_up_sync: only width 32 is emulated");
  const unsigned long long* v = cuda_on_cpu::exchange(cuda_on_cpu::SHFL_UP, mask, cuda_on_cpu::to_bits(x));
  int l = cuda_on_cpu::lane_id();
  return l >= (int)delta ? cuda_on_cpu::from_bits<T>(v[l - (int)delta]) : x;
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T x, int lane_mask, int width = 32) {
  if (width != 32) cuda_on_cpu::fail("__shfl_xor_sync: only width 32 is emulated");
  const unsigned long long* v = cuda_on_cpu::exchange(cuda_on_cpu::SHFL_XOR, mask, cuda_on_cpu::to_bits(x));
  return cuda_on_cpu::from_bits<T>(v[(cuda_on_cpu::lane_id() ^ lane_mask) & 31]);
}
namespace cuda_on_cpu {
template <class T, class F>
inline T reduce(int op, unsigned mask, T x, F f) {  // the warp's 32 values folded by f
  static_assert(sizeof(T) == 4, "the __reduce_*_sync functions take 32-bit integers");
  const unsigned long long* v = exchange(op, mask, to_bits(x));
  T r = from_bits<T>(v[0]);
  for (int l = 1; l < 32; ++l) r = f(r, from_bits<T>(v[l]));
  return r;
}
template <class T, class F>
inline T atomic_rmw(T* p, F f) {  // *p = f(*p); the old value
  maybe_yield();
  T o = *p;
  *p = f(o);
  return o;
}
}  // namespace cuda_on_cpu

template <class T>
inline T __reduce_add_sync(unsigned mask, T x) {  // (wraps, as 32-bit hardware does)
  return cuda_on_cpu::reduce(cuda_on_cpu::RED_ADD, mask, x, [](T a, T b) { return (T)((unsigned)a + (unsigned)b); });
}
template <class T>
inline T __reduce_min_sync(unsigned mask, T x) {
  return cuda_on_cpu::reduce(cuda_on_cpu::RED_MIN, mask, x, [](T a, T b) { return std::min(a, b); });
}
template <class T>
inline T __reduce_max_sync(unsigned mask, T x) {
  return cuda_on_cpu::reduce(cuda_on_cpu::RED_MAX, mask, x, [](T a, T b) { return std::max(a, b); });
}
template <class T, class U>
inline T atomicAdd(T* p, U v) { return cuda_on_cpu::atomic_rmw(p, [v](T o) { return (T)(o + (T)v); }); }
template <class T, class U>
inline T atomicMin(T* p, U v) { return cuda_on_cpu::atomic_rmw(p, [v](T o) { return std::min(o, (T)v); }); }
template <class T, class U>
inline T atomicMax(T* p, U v) { return cuda_on_cpu::atomic_rmw(p, [v](T o) { return std::max(o, (T)v); }); }

template <class T>
inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T))
    cuda_on_cpu::fail("a load of " + std::to_string(sizeof(T)) + " bytes at an address not " +
                      std::to_string(alignof(T)) + "-byte aligned");
  return *p;
}
template <class T>
inline T __ldcg(const T* p) { return __ldg(p); }  // (cache hints: the same load here)
template <class T>
inline T __ldcs(const T* p) { return __ldg(p); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline void __threadfence() { cuda_on_cpu::maybe_yield(); }  // (one thread runs at a time: an order point only)
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { (void)cuda_on_cpu::exchange(cuda_on_cpu::SYNCWARP, mask, 0); }

// asynchronous copies global -> shared (see the top)
inline void cp_async(void* dst, const void* src, size_t n) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % n)
    cuda_on_cpu::fail("cp.async of " + std::to_string(n) + " bytes at an address not " + std::to_string(n) +
                      "-byte aligned");
  if (cuda_on_cpu::B->seed != 0 && (cuda_on_cpu::B->rng() & 1u))
    std::memcpy(dst, src, n);
  else
    cuda_on_cpu::me().pending.push_back({dst, src, n});
}
inline void cp_async16(void* dst, const void* src) { cp_async(dst, src, 16); }
inline void cp_async4(void* dst, const void* src) { cp_async(dst, src, 4); }
inline void cp_async_wait_all() {
  for (const auto& c : cuda_on_cpu::me().pending) std::memcpy(c.dst, c.src, c.n);
  cuda_on_cpu::me().pending.clear();
  cuda_on_cpu::maybe_yield();
}

// the bulk copy engine (see the top): one copy in flight a barrier, landing at the first wait on it
namespace cuda_on_cpu {
struct BulkCopy {
  void* dst;
  const void* src;
  unsigned bytes;
  unsigned long long* bar;  // (nullptr: a free entry)
};
static BulkCopy bulk_inflight[8];  // (static: each kernel library its own)
}  // namespace cuda_on_cpu
inline void bar_init(unsigned long long* bar) {
  *bar = 0;
  for (auto& c : cuda_on_cpu::bulk_inflight)
    if (c.bar == bar) c.bar = nullptr;
}
inline void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) % 16)
    cuda_on_cpu::fail("cp.async.bulk of " + std::to_string(bytes) + " bytes: not 16-byte aligned, or not a multiple of 16");
  for (const auto& c : cuda_on_cpu::bulk_inflight)
    if (c.bar == bar) cuda_on_cpu::fail("a second bulk copy on one mbarrier before a wait on the first");
  for (auto& c : cuda_on_cpu::bulk_inflight)
    if (c.bar == nullptr) {
      c = {dst, src, bytes, bar};
      return;
    }
  cuda_on_cpu::fail("more than 8 bulk copies in flight");
}
inline void bar_wait(unsigned long long* bar, unsigned parity) {
  if (*bar == parity) {  // (the phase's first waiter lands its copy and completes the phase)
    for (auto& c : cuda_on_cpu::bulk_inflight)
      if (c.bar == bar) {
        std::memcpy(c.dst, c.src, c.bytes);
        c.bar = nullptr;
      }
    *bar = parity ^ 1u;
  }
  cuda_on_cpu::maybe_yield();
}

// CUDA's min and max of two values of one type
template <class T>
inline T min(T a, T b) { return b < a ? b : a; }
template <class T>
inline T max(T a, T b) { return a < b ? b : a; }

namespace cuda_on_cpu {

inline void fiber_entry() {
  kernel_body();
  if (!me().pending.empty()) fail("a thread ended with asynchronous copies it never waited for (cp_async_wait_all)");
  me().state = DONE;
  yield();
}

inline std::string deadlock() {
  int n[5] = {0, 0, 0, 0, 0};
  for (auto& t : B->th) n[t.state]++;
  return "deadlock in block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) + ", " +
         std::to_string(blockIdx.z) + "): " + std::to_string(n[BARRIER]) + " threads wait at __syncthreads, " +
         std::to_string(n[WARP]) + " in a warp function, " + std::to_string(n[DONE]) + " have exited";
}

// runs body for every thread of every block; "" or the reason it stopped
inline std::string launch(dim3 grid, dim3 block, size_t dyn_bytes, unsigned seed, std::function<void()> body) {
  const size_t n = (size_t)block.x * block.y * block.z;
  if (n == 0 || n > 1024 || n % 32) return "a block of " + std::to_string(n) + " threads: 32..1024, whole warps";
  const size_t stack = 256 * 1024, page = 4096, per = stack + page;  // a guard page below each stack
  void* mem = mmap(nullptr, per * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) return "mmap of the fibers' stacks failed";
  for (size_t i = 0; i < n; ++i) mprotect((char*)mem + i * per, page, PROT_NONE);
  kernel_body = std::move(body);
  gridDim = grid;
  blockDim = block;
  std::string err;
  Block blk;
  blk.seed = seed;
  blk.rng.seed(seed * 2654435761u + 12345u);
  B = &blk;
  std::vector<dim3> order;  // the blocks in the order they run
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) order.push_back(dim3{x, y, z});
  if (seed) std::shuffle(order.begin(), order.end(), blk.rng);
  for (const dim3& at : order) {
    if (!err.empty()) break;
    blockIdx = at;
    blk.th.assign(n, Thread{});
    blk.steps.assign(n / 32 * 2, WarpStep{});
    blk.shared.clear();
    blk.dyn.assign(dyn_bytes, 0);
    random_fill(blk.dyn);
    blk.nthreads = (int)n;
    blk.at_barrier = 0;
    for (size_t i = 0; i < n; ++i) {
      Thread& t = blk.th[i];
      t.tid = (unsigned)i;
      getcontext(&t.ctx);
      t.ctx.uc_stack.ss_sp = (char*)mem + i * per + page;
      t.ctx.uc_stack.ss_size = stack;
      t.ctx.uc_link = nullptr;
      makecontext(&t.ctx, fiber_entry, 0);
    }
    blk.ready.clear();
    for (size_t i = 0; i < n; ++i) blk.ready.push_back((int)i);
    size_t done = 0;
    while (done < n && blk.error.empty()) {
      if (blk.ready.empty()) {
        blk.error = deadlock();
        break;
      }
      // seed 0: first come, first run; else any thread that can run, at random
      if (seed) std::swap(blk.ready[blk.rng() % blk.ready.size()], blk.ready.front());
      const int i = blk.ready.front();
      blk.ready.pop_front();
      Thread& t = blk.th[i];
      blk.cur = i;
      threadIdx = dim3{t.tid % block.x, t.tid / block.x % block.y, t.tid / (block.x * block.y)};
      if (!_setjmp(blk.sched)) {
        if (t.started) _longjmp(t.jb, 1);
        t.started = true;
        ucontext_t from;
        swapcontext(&from, &t.ctx);  // (it comes back by _longjmp to blk.sched, not to from)
      }
      if (t.state == DONE) ++done;
      if (t.state == RUN) blk.ready.push_back(i);
    }
    err = blk.error;
  }
  B = nullptr;
  kernel_body = nullptr;
  munmap(mem, per * n);
  return err;
}

}  // namespace cuda_on_cpu
