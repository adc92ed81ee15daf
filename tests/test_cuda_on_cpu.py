"""The CPU runner of CUDA block kernels (tests/cuda_on_cpu.py) against plain Python: warp
functions, barriers, shared memory, and what it reports instead of computing (a deadlock, a
crash, a hang), so that a block kernel's CPU tests can fail where a GPU would."""
from __future__ import annotations

import math

import pytest
import torch

import cuda_on_cpu

pytestmark = pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")

WARPS = r"""
extern "C" __global__ void warps(const int* x, int* out) {
  const int t = threadIdx.x, lane = t & 31;
  int v = x[t];
  __syncwarp();
  out[t * 8 + 0] = (int)__ballot_sync(0xffffffffu, v & 1);
  out[t * 8 + 1] = __shfl_sync(0xffffffffu, v, (lane * 7 + 3) & 31);
  out[t * 8 + 2] = __shfl_up_sync(0xffffffffu, v, 5);
  out[t * 8 + 3] = __shfl_xor_sync(0xffffffffu, v, 9);
  out[t * 8 + 4] = __reduce_add_sync(0xffffffffu, v);
  out[t * 8 + 5] = __reduce_min_sync(0xffffffffu, v);
  out[t * 8 + 6] = (int)__reduce_max_sync(0xffffffffu, (unsigned)v);
  unsigned long long w = ((unsigned long long)(unsigned)v << 32) | (unsigned)t;
  out[t * 8 + 7] = (int)(__shfl_xor_sync(0xffffffffu, w, 1) >> 32);
  out[8 * blockDim.x + t] = (int)__match_any_sync(0xffffffffu, v % 3);
  out[9 * blockDim.x + t] = __ffs(v);
}
"""


def test_warp_functions_against_python():
    k = cuda_on_cpu.build(WARPS, "warps")
    n = 128
    x = torch.randint(-1000, 1000, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    out = torch.zeros(n * 10, dtype=torch.int32)
    k(grid=(1,), block=(n,), args=[x, out], seed=5)
    xs = x.tolist()
    got = out[:n * 8].view(n, 8).tolist()
    match, ffs = out[n * 8:n * 9].tolist(), out[n * 9:].tolist()
    for t in range(n):
        w, lane = t // 32, t % 32
        warp = xs[w * 32:(w + 1) * 32]
        ballot = sum(1 << l for l in range(32) if warp[l] & 1)
        ballot = ballot - (1 << 32) if ballot >= 1 << 31 else ballot
        want = [ballot, warp[(lane * 7 + 3) & 31], warp[lane - 5] if lane >= 5 else warp[lane], warp[lane ^ 9],
                sum(warp), min(warp), max(warp, key=lambda v: v & 0xFFFFFFFF), warp[lane ^ 1]]
        assert got[t] == want, (t, got[t], want)
        peers = sum(1 << l for l in range(32) if math.fmod(warp[l], 3) == math.fmod(xs[t], 3))  # (C's %)
        assert match[t] & 0xFFFFFFFF == peers, t
        assert ffs[t] == ((xs[t] & -xs[t]).bit_length() if xs[t] else 0), t


RACE = r"""
// a missing barrier: each thread reads the slot another warp wrote, with only a warp function between
extern "C" __global__ void race(int* out) {
  __shared__ int x[128];
  const int t = threadIdx.x;
  x[t] = t + 1;
  int v = __shfl_sync(0xffffffffu, t, 0);
  out[t] = x[127 - t] + 0 * v;
}
"""


def test_a_missing_barrier_shows_under_a_seeded_schedule():
    """Threads first come, first run (seed 0) happen to read what the other warp wrote; a seeded
    schedule runs a warp ahead, and it reads shared memory's starting bytes instead."""
    k = cuda_on_cpu.build(RACE, "race")
    want = torch.arange(128, 0, -1, dtype=torch.int32)
    out = torch.zeros(128, dtype=torch.int32)
    k(grid=(1,), block=(128,), args=[out], seed=0)
    assert torch.equal(out, want)
    wrong = 0
    for seed in range(1, 9):
        k(grid=(1,), block=(128,), args=[out], seed=seed)
        wrong += not torch.equal(out, want)
    assert wrong > 0


BLOCKS = r"""
// a block's shared memory is its own: a block sums its row; threads of other blocks never see it
extern "C" __global__ void sums(const int* x, int* out, int n) {
  __shared__ int acc;
  if (threadIdx.x == 0) acc = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&acc, x[blockIdx.y * gridDim.x * n + blockIdx.x * n + i]);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}
"""


@pytest.mark.parametrize("seed", [0, 7])
def test_blocks_and_atomics(seed):
    k = cuda_on_cpu.build(BLOCKS, "sums")
    x = torch.randint(-50, 50, (3, 5, 300), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    out = torch.zeros(3, 5, dtype=torch.int32)
    k(grid=(5, 3), block=(96,), args=[x, out, 300], seed=seed)
    assert torch.equal(out, x.sum(-1, dtype=torch.int32))


TICKETS = r"""
// the order in which blocks start: each takes a ticket from a global counter; the last one takes the total
extern "C" __global__ void tickets(int* counter, int* order) {
  if (threadIdx.x == 0) {
    const int t = atomicAdd(counter, 1);
    __threadfence();
    order[t] = blockIdx.y * gridDim.x + blockIdx.x;
    if (t == (int)(gridDim.x * gridDim.y) - 1) order[t + 1] = atomicAdd(counter, 0);
  }
}
"""


def test_a_seed_shuffles_the_order_of_blocks():
    k = cuda_on_cpu.build(TICKETS, "tickets")
    orders = []
    for seed in (0, 0, 3, 4):
        counter, order = torch.zeros(1, dtype=torch.int32), torch.full((25,), -1, dtype=torch.int32)
        k(grid=(6, 4), block=(32,), args=[counter, order], seed=seed)
        assert sorted(order[:24].tolist()) == list(range(24)) and order[24] == 24 and counter.item() == 24
        orders.append(order[:24].tolist())
    assert orders[0] == orders[1] == list(range(24))  # seed 0: in index order
    assert orders[2] != orders[0] and orders[3] != orders[0] and orders[2] != orders[3]


FAULTS = r"""
struct Two { int a[64]; int b[64]; };
extern "C" __global__ void faults(int* out, int what) {
  if (what == 0 && threadIdx.x < 32) __syncthreads();   // a barrier only some threads reach
  if (what == 1) out[threadIdx.x] = ((int*)0)[threadIdx.x];   // a bad address
  if (what == 2) for (;;) out[0] = out[0] + 1;   // no end
  if (what == 3 && threadIdx.x >= 32) out[threadIdx.x] = __shfl_sync(0xffffu, 1, 0);   // a partial warp mask
  if (what == 5) {   // an index past a shared struct's member array
    __shared__ Two two;
    two.a[threadIdx.x + 8] = 1;
    __syncthreads();
    out[threadIdx.x] = two.b[0];
  }
  if (what == 4) {   // lanes of one warp in different warp functions
    if (threadIdx.x & 1) out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    else out[threadIdx.x] = (int)__ballot_sync(0xffffffffu, 1);
  }
}
"""


@pytest.mark.parametrize("what,match", [(0, "deadlock in block .*32 threads wait at __syncthreads, 0 in a warp "
                                            "function, 32 have exited"),
                                        (1, "crashed: SIGSEGV"), (2, "ran past 2 s"),
                                        (3, "only the full warp mask"),
                                        (4, "lanes in __shfl_sync and __ballot_sync at the same step|lanes in "
                                            "__ballot_sync and __shfl_sync at the same step"),
                                        (5, "crashed: SIGILL \\(an index out of an array's bounds\\)")])
def test_what_a_gpu_would_not_finish_is_an_error_here(what, match):
    """A kernel that would hang or fault on a GPU raises here, and the test process goes on."""
    k = cuda_on_cpu.build(FAULTS, "faults")
    k.timeout = 2.0
    out = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=match):
        k(grid=(1,), block=(64,), args=[out, what])


def test_launch_checks():
    k = cuda_on_cpu.build(FAULTS, "faults")
    out = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        k(grid=(1,), block=(64,), args=[out])
    with pytest.raises(RuntimeError, match="whole warps"):
        k(grid=(1,), block=(48,), args=[out, 5])
    with pytest.raises(ValueError, match="pointers and integers only"):
        cuda_on_cpu.build('extern "C" __global__ void f(float x) {}', "f")
    with pytest.raises(RuntimeError, match="failed"):
        cuda_on_cpu.build('extern "C" __global__ void g(int x) { undefined_thing(); }', "g")


COPIES = r"""
// asynchronous copies to shared memory: thread t copies words [4t, 4t + 4) (16 bytes, or 4 a copy);
// each thread then reads a word another thread copied. what: 0 wait and barrier; 1 no barrier after
// the wait; 2 no wait at all; 3 a 16-byte copy one word off its alignment
extern "C" __global__ void copies(const int* x, int* out, int what) {
  __shared__ int s[4 * 64 + 4];
  const int t = threadIdx.x;
  if (what == 3) cp_async16(s + 4 * t + 1, x + 4 * t);
  else if (t & 1) cp_async16(s + 4 * t, x + 4 * t);
  else for (int j = 0; j < 4; ++j) cp_async4(s + 4 * t + j, x + 4 * t + j);
  if (what != 2) cp_async_wait_all();
  if (what == 0) __syncthreads();
  out[t] = s[(4 * t + 37) % 256];
}
"""


def test_asynchronous_copies_land_by_the_wait_and_are_seen_after_a_barrier():
    """cp_async16 / cp_async4 (sm_80's cp.async, as a kernel's own helpers call it) against plain
    Python: with the wait and a barrier every thread reads what another copied, under any schedule;
    without the barrier, first come first run (seed 0: copies land at the wait) reads shared
    memory's starting bytes; a copy never waited for, or a misaligned one, stops the launch."""
    k = cuda_on_cpu.build(COPIES, "copies")
    x = torch.randint(-1000, 1000, (256,), dtype=torch.int32, generator=torch.Generator().manual_seed(2))
    want = x[(4 * torch.arange(64) + 37) % 256]
    out = torch.zeros(64, dtype=torch.int32)
    for seed in (0, 3, 9):
        k(grid=(1,), block=(64,), args=[x, out, 0], seed=seed)
        assert torch.equal(out, want), seed
    k(grid=(1,), block=(64,), args=[x, out, 1], seed=0)
    assert not torch.equal(out, want)
    with pytest.raises(RuntimeError, match="asynchronous copies it never waited for"):
        k(grid=(1,), block=(64,), args=[x, out, 2])
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        k(grid=(1,), block=(64,), args=[x, out, 3])
