"""Exact ordered top-k selection of (score, id) candidates on CUDA, in Triton.

``triton_ordered_select(scores, ids, k)`` returns the first ``k`` candidates of
each row under DESIGN.md's **Order** rule, bit for bit:

1. valid (``id >= 0``) before invalid;
2. score descending under a total order: the IEEE-754 bit order (so ``+0.0``
   ranks before ``-0.0``) with every NaN (any sign, any payload) below ``-inf``;
3. then lower id first.

Output: ``(ids int32 [Q, k], scores fp32 [Q, k])``. Score bits of the selected
candidates are copied, never recomputed (NaN payloads survive). When a row has
fewer than ``k`` valid candidates the tail is padded with id ``-1`` and score
``-inf`` (the ids are the contract; the pad score is ``-inf`` by choice).
Invalid candidates are never returned as such: every output slot past the valid
ones is a pad, whatever score the invalid candidate carried.

Two paths, chosen by ``choose_path`` (the one dispatcher; measured on an H200, graph replay):
the *staged* path of ``select_staged.py`` (each row spread over many programs; few rows) and the
*row* kernel of this module (one program a row; many rows). Both leave a row's winners
unordered in one workspace, which ``radix.order_winners`` orders (a rank kernel for few rows,
``torch.sort`` and a decode beyond).

Row kernel design (one program per row, no host synchronisation, CUDA-graph capturable):

* Score key ``s``: an int32 whose signed order is the total order above
  (``bits`` if the sign bit is clear, ``bits ^ 0x7fffffff`` otherwise; NaN is
  ``INT_MIN + 1``, an invalid candidate ``INT_MIN``). Rows of up to ``RESIDENT_MAX``
  candidates keep their ``s`` in registers (tiles of 4096 or 16384); longer rows are re-read
  in chunks.
* Phase 1, radix select on ``s``: up to seven passes of 5-bit digits (a runtime loop), each a
  ``tl.histogram`` over the keys of the candidates that still match the prefix, find ``T``, the
  score key of the ``min(k, n_valid)``-th candidate, and how many candidates with ``s == T``
  are still needed. Once every candidate still in play is needed, the remaining passes are
  skipped and ``T`` becomes the smallest key with the prefix found.
* Phase 2, only when the cutoff score is tied by more candidates than are needed: the same
  radix select on ``0x7fffffff - id`` over the tied candidates (chunks re-read) finds the id
  cutoff ``V``. Candidates equal in both score key and id (duplicates) are taken in position
  order, so the count is exact.
* Compaction: chunks of the row are re-read; winners get consecutive slots by a prefix sum and
  are written as a packed 63-bit key ``(s ^ INT_MIN) << 31 | (0x7fffffff - id)``, the raw
  score bits and the position.

Compile time: ``Q`` is the grid and ``N``, ``k`` and the strides are runtime arguments that
Triton does not specialise, so one compiled kernel serves every shape of a tile class
(``launch_plan`` names them; ``precompile`` compiles those a server's capacities need).

Limits: ``N <= MAX_CANDIDATES`` (131072) candidates a row and ``k <= MAX_K`` (2048)
(``supports(n, k)``); beyond, ``ordering.ordered_select`` uses the torch path.

This module imports without Triton or CUDA; ``available()`` says whether the
kernel can run here.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time
from typing import Iterable

import torch

from . import select_staged

__all__ = ["available", "supports", "choose_path", "launch_plan", "precompile", "triton_ordered_select",
           "MAX_CANDIDATES", "MAX_K", "PAD_SCORE"]

log = logging.getLogger("tpflare.select_kernel")

MAX_CANDIDATES = 131072
MAX_K = 2048
PAD_SCORE = float("-inf")
RESIDENT_MAX = 16384  # rows up to this many candidates keep their score keys in registers

try:  # Triton is optional: the module must import on CPU-only machines.
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    _HAVE_TRITON = False


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    if not _HAVE_TRITON:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover
        return False


def supports(n: int, k: int) -> bool:
    """True when a row of ``n`` candidates and ``k`` outputs is within the kernel's limits."""
    return 0 <= n <= MAX_CANDIDATES and 1 <= k <= MAX_K


def choose_path(q: int, n: int, k: int, n_sm: int) -> str:
    """The staged path (a row over many programs) or the one-program-a-row kernel.

    From the H200 runs in docs/benchmarks_select_kernel.md (CUDA-graph replay, which is how
    serving runs the selection): the staged path is faster up to 8 rows, and up to 64 rows when
    a row does not fit in the row kernel's registers; beyond, its global histogram (atomics on a
    few hot bins) costs more than the row kernel. The choice does not depend on whether a
    stream is capturing, so the first call outside capture compiles what capture will launch.
    """
    if q <= 8 or (n > RESIDENT_MAX and q <= 64):
        return "staged"
    return "row"


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    if _interpret() or not torch.cuda.is_available():
        return 132
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _row_config(n: int, num_warps=None, chunk=None, resident=None):
    """(block, num_warps, chunk, resident) of the row kernel for rows of ``n`` candidates.

    Register tiles of 4096 or 16384 keys (so a new ``N`` reuses a compiled kernel), chunks of
    4096 re-read from memory beyond ``RESIDENT_MAX``.
    """
    if resident is None:
        resident = n <= RESIDENT_MAX
    block = (4096 if n <= 4096 else RESIDENT_MAX) if resident else max(16, select_staged.next_pow2(n))
    if num_warps is None:
        num_warps = max(4, min(16, block // 1024)) if resident else 16
    if chunk is None:
        chunk = 256 * num_warps
    chunk = min(block, int(chunk))
    if not resident:
        block = chunk  # the tile a pass holds: one chunk
    return int(block), int(num_warps), chunk, bool(resident)


if _HAVE_TRITON:
    from .radix import (digit, extend, fill_empty, generic_jit, load_chunk, order_winners, packed_key,
                        pick_digit, prefix_is, score_key, winner_workspace)

    @triton.jit
    def _chunked_histogram(sc_row, id_row, N, T, t, p, D: tl.constexpr, CHUNK: tl.constexpr, IDS: tl.constexpr):
        # histogram of digit p, over the row re-read in chunks, of the score keys of the
        # valid candidates (IDS=False) or of the id keys (0x7fffffff - id) of the candidates
        # whose score key is T (IDS=True), among those whose higher digits equal t
        h = tl.zeros([1 << D], dtype=tl.int32)
        for c0 in range(0, N, CHUNK):
            b, i = load_chunk(sc_row, id_row, c0, N, CHUNK)
            sc = score_key(b, i)
            if IDS:
                m = sc == T
                x = 2147483647 - tl.maximum(i, 0)
            else:
                m = sc != -2147483648
                x = sc
            m = m & prefix_is(x, t, p, D)
            h += tl.histogram(digit(x, p, D), 1 << D, mask=m)
        return h

    @generic_jit
    def _row_kernel(sc_ptr, id_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, N, K, s_sq, s_iq,
                    BLOCK: tl.constexpr, CHUNK: tl.constexpr, KB: tl.constexpr, RESIDENT: tl.constexpr,
                    D: tl.constexpr):
        # grid (Q,): one program a row; its winners go unordered to W (radix.order_winners)
        row = tl.program_id(0).to(tl.int64)
        sc_row = sc_ptr + row * s_sq
        id_row = id_ptr + row * s_iq
        wk_row = wk_ptr + row * KB
        NB: tl.constexpr = 1 << D  # bins of a digit
        NP: tl.constexpr = (32 + D - 1) // D  # digits of a 32-bit key
        bins = tl.arange(0, NB)

        # ---- phase 1: radix select of the nsel-th largest score key --------------
        # after it: T = the cutoff score key; rem of the cnt candidates with s == T are needed
        if RESIDENT:  # the row's score keys stay in registers for every pass
            offs = tl.arange(0, BLOCK)
            inb = offs < N
            bits = tl.load(sc_row + offs, mask=inb, other=0.0).to(tl.int32, bitcast=True)
            s = score_key(bits, tl.load(id_row + offs, mask=inb, other=-1))
            nvalid = tl.sum((s != -2147483648).to(tl.int32), 0)
            nsel = tl.minimum(nvalid, K)
            rem = nsel
            t = nsel * 0
            cnt = nvalid
            for p in range(NP):
                if rem < cnt:  # the cutoff is still inside the candidates in play: one more digit
                    d = tl.where(prefix_is(s, t, p, D), digit(s, p, D), 0)
                    # every key not in play (invalid, or another prefix) landed in bin 0: take them out
                    h = tl.histogram(d, NB)
                    h = tl.where(bins == 0, h - (BLOCK - cnt), h)
                    dd, above, cnt = pick_digit(h, rem, NB)
                    rem = rem - above
                    t = extend(t, dd, p, D)
                else:  # all of them are needed: T is the smallest key with the prefix t
                    t = extend(t, t * 0, p, D)
        else:  # chunks re-read from memory (L2) on every pass
            nvalid = tl.zeros((), tl.int32)
            for c0 in range(0, N, CHUNK):
                b, i = load_chunk(sc_row, id_row, c0, N, CHUNK)
                nvalid += tl.sum((i >= 0).to(tl.int32), 0)
            nsel = tl.minimum(nvalid, K)
            rem = nsel
            t = nsel * 0
            cnt = nvalid
            for p in range(NP):
                if rem < cnt:
                    h = _chunked_histogram(sc_row, id_row, N, 0, t, p, D, CHUNK, False)
                    dd, above, cnt = pick_digit(h, rem, NB)
                    rem = rem - above
                    t = extend(t, dd, p, D)
                else:
                    t = extend(t, t * 0, p, D)
        T = t

        # ---- phase 2 (ties at the cutoff score): radix select on the ids ---------
        V = nsel * 0 - 1  # id-key cutoff: -1 takes every tied candidate
        rem2 = nsel * 0
        if rem < cnt:
            vt = nsel * 0
            r2 = rem
            c2 = cnt
            for p in range(NP):
                if r2 < c2:
                    h2 = _chunked_histogram(sc_row, id_row, N, T, vt, p, D, CHUNK, True)
                    dd2, above2, c2 = pick_digit(h2, r2, NB)
                    r2 = r2 - above2
                    vt = extend(vt, dd2, p, D)
                else:  # V is the smallest id key with the prefix vt: every tied one above is needed
                    vt = extend(vt, vt * 0, p, D)
            V = vt
            rem2 = r2  # candidates with s == T and id key == V still needed, in position order

        # ---- compaction: winners to consecutive workspace slots, in position order ----
        abase = nsel * 0  # definite winners so far
        tbase = nsel * 0  # (s == T, id key == V) candidates seen so far
        for c0 in range(0, N, CHUNK):
            b, i = load_chunk(sc_row, id_row, c0, N, CHUNK)
            sk = score_key(b, i)
            v = 2147483647 - tl.maximum(i, 0)
            tie = (sk == T) & (sk != -2147483648)
            a = ((sk > T) | (tie & (v > V))).to(tl.int32)  # sk > T implies valid
            dup = (tie & (v == V)).to(tl.int32)
            packed = a + (dup << 16)  # one scan for both counts (a chunk holds < 2**16)
            incl = tl.cumsum(packed, 0)
            a_incl = incl & 0xFFFF
            d_incl = tbase + (incl >> 16)
            take = (a != 0) | ((dup != 0) & (d_incl <= rem2))
            slot = abase + a_incl + tl.minimum(d_incl, rem2) - 1
            tot = tl.sum(packed, 0)
            abase += tot & 0xFFFF
            tbase += tot >> 16
            wmask = take & (slot < KB)
            tl.store(wk_row + slot, packed_key(sk, v), mask=wmask)
            tl.store(wv_ptr + row * KB + slot, b, mask=wmask)
            tl.store(wo_ptr + row * KB + slot, c0 + tl.arange(0, CHUNK), mask=wmask)
        fill_empty(wk_row, nsel, KB)
        tl.store(cnt_ptr + row, nsel)


def launch_plan(q: int, n: int, k: int, n_sm: int = 132) -> tuple:
    """What a call with ``Q`` rows of ``n`` candidates compiles: (path, tile class). Two calls
    with one plan share every compiled kernel (the shapes themselves are runtime values)."""
    kb = max(2, select_staged.next_pow2(k))
    path = choose_path(q, n, k, n_sm)
    order = "rank" if q <= select_staged.RANK_MAX_ROWS else "sort"
    tile = select_staged.rank_tile(q, kb, n_sm) if order == "rank" else ()
    if path == "staged":
        return (path, kb, order) + tile + select_staged.plan(q, n, kb, n_sm)
    block, nw, chunk, resident = _row_config(n)
    return (path, kb, order) + tile + (block, nw, chunk, resident)


def triton_ordered_select(scores: torch.Tensor, ids: torch.Tensor, k: int, *,
                          path: str | None = None, order: str | None = None, num_warps: int | None = None,
                          chunk: int | None = None, resident: bool | None = None, radix_bits: int | None = None,
                          staged: dict | None = None):
    """Exact ordered top-``k`` of each row: ``(ids int32 [Q, k], scores fp32 [Q, k])``.

    ``scores`` fp32 ``[Q, N]`` and ``ids`` int32 ``[Q, N]`` (``-1`` = padding) on one CUDA
    device. No host synchronisation; safe to capture in a CUDA graph (after a first,
    compiling call outside capture). ``path``: ``"row"`` or ``"staged"`` (default
    ``choose_path``). ``order``: the final ordering, ``"rank"`` or ``"sort"`` (default by Q,
    ``radix.order_winners``). Tuning options of the row kernel: ``num_warps``, ``chunk``,
    ``resident`` (keys in registers), ``radix_bits`` (digit width, 2..8, default 5); of the
    staged path: ``staged`` (``select_staged.staged_select``'s keywords).
    """
    if not _HAVE_TRITON:
        raise RuntimeError("triton_ordered_select needs Triton (pip install triton)")
    if scores.dim() != 2 or ids.shape != scores.shape:
        raise ValueError(f"scores and ids must be [Q, N] of one shape, got {tuple(scores.shape)} and {tuple(ids.shape)}")
    if scores.dtype != torch.float32 or ids.dtype != torch.int32:
        raise ValueError(f"need fp32 scores and int32 ids, got {scores.dtype} and {ids.dtype}")
    if scores.device != ids.device:
        raise ValueError("scores and ids must be on one device")
    if scores.device.type != "cuda" and not _interpret():
        raise ValueError("triton_ordered_select needs CUDA tensors")
    k = int(k)
    q, n = scores.shape
    if not supports(n, k):
        raise ValueError(f"unsupported shape: N={n} (max {MAX_CANDIDATES}), k={k} (1..{MAX_K})")
    row_opts = (num_warps, chunk, resident, radix_bits)
    n_sm = _num_sms(scores.device.index or 0) if scores.device.type == "cuda" else 132
    if path is None:  # an option of one path asks for that path; else the dispatcher decides
        if any(o is not None for o in row_opts):
            path = "row"
        else:
            path = "staged" if staged else choose_path(q, n, k, n_sm)
    if path not in ("row", "staged"):
        raise ValueError(f"path must be row or staged, got {path!r}")
    if order not in (None, "rank", "sort"):
        raise ValueError(f"order must be rank or sort, got {order!r}")
    if path == "staged" and any(o is not None for o in row_opts):
        raise ValueError("row kernel options given with path='staged'")
    if path == "row" and staged:
        raise ValueError("staged options given with path='row'")
    radix_bits = 5 if radix_bits is None else int(radix_bits)
    if not 2 <= radix_bits <= 8:
        raise ValueError(f"radix_bits must be in 2..8, got {radix_bits}")
    out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
    if q == 0:
        return out_ids, out_sc
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    if ids.stride(1) != 1:
        ids = ids.contiguous()
    kb = max(2, select_staged.next_pow2(k))
    if path == "staged":
        return select_staged.staged_select(scores, ids, k, out_ids, out_sc, n_sm, order=order, **dict(staged or {}))
    block, nw, chunk, resident = _row_config(n, num_warps, chunk, resident)
    wk, wv, wo, cnt, _ = winner_workspace(q, kb, 0, scores.device)
    _row_kernel[(q,)](scores, ids, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0),
                      BLOCK=block, CHUNK=chunk, KB=kb, RESIDENT=resident, D=radix_bits, num_warps=nw)
    return order_winners(wk, wv, wo, cnt, out_ids, out_sc, k, kb, n_sm, order)


def precompile(capacities: Iterable, k: int = 2048, n: int | None = None, *, device=None,
               progress: bool = True) -> dict:
    """Compile, once, every kernel the given shapes will launch (call it at preparation).

    ``capacities``: row counts ``Q`` (with ``n`` candidates a row) or ``(Q, N)`` pairs. Shapes
    that share a ``launch_plan`` share compiled kernels, so each plan is compiled once (a call on
    that shape, outside any capture). Logs one INFO line a plan on ``tpflare.select_kernel`` and,
    with ``progress``, prints it to stderr. Returns ``{(Q, N): seconds}`` of the shapes that
    compiled something (0 s for those whose plan was compiled already).
    """
    if not available():
        log.info("tpflare.select_kernel.precompile: Triton or CUDA not available, nothing to compile")
        return {}
    shapes = []
    for c in capacities:
        q_, n_ = (c, n) if isinstance(c, int) else tuple(c)
        if n_ is None:
            raise ValueError("precompile: give n= or (Q, N) pairs")
        if supports(int(n_), k) and int(q_) >= 1:
            shapes.append((int(q_), int(n_)))
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    n_sm = _num_sms(dev.index or 0)
    plans: dict = {}
    for shape in shapes:
        plans.setdefault(launch_plan(shape[0], shape[1], k, n_sm), shape)
    out = {}
    t_all = time.perf_counter()
    for i, (plan, (q_, n_)) in enumerate(plans.items()):
        t0 = time.perf_counter()
        s = torch.randn(q_, n_, device=dev)
        ids = torch.randperm(n_, device=dev, dtype=torch.int64).to(torch.int32).expand(q_, n_).contiguous()
        triton_ordered_select(s, ids, k)
        torch.cuda.synchronize(dev)
        del s, ids
        out[(q_, n_)] = time.perf_counter() - t0
        msg = (f"tpflare.select_kernel: precompiled {i + 1}/{len(plans)} (Q={q_}, N={n_}, k={k}, {plan[0]} path) "
               f"in {out[(q_, n_)]:.2f} s")
        log.info(msg)
        if progress:
            print(msg, file=sys.stderr, flush=True)
    log.info("tpflare.select_kernel: %d shapes, %d launch plans compiled in %.2f s", len(shapes), len(plans),
             time.perf_counter() - t_all)
    return out
