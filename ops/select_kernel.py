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

Two implementations, chosen by ``choose_path`` (measured on an H200, graph replay): the
*staged* path of ``select_staged.py`` (each row spread over many programs; few rows) and the
*row* kernel of this module, described below (many rows).

Row kernel design (one program per row, no host synchronisation, CUDA-graph capturable):

* Score key ``s``: an int32 whose signed order is the total order above
  (``bits`` if the sign bit is clear, ``bits ^ 0x7fffffff`` otherwise; NaN is
  ``INT_MIN + 1``, an invalid candidate ``INT_MIN``). The whole row's ``s`` stays
  in registers.
* Phase 1, radix select on ``s``: up to seven passes of 5-bit digits
  (``radix_bits``), each a ``tl.histogram`` over the register-resident keys of the
  candidates that still match the prefix, find ``T``, the score key of the
  ``min(k, n_valid)``-th candidate, and how many candidates with ``s == T`` are
  still needed. Once every candidate still in play is needed, the remaining
  passes are skipped and ``T`` becomes the smallest key with the prefix found
  (so ``s >= T`` selects exactly them); phase 2 stops the same way.
* Phase 2, only when the cutoff score is tied by more candidates than are
  needed: the same radix select on ``0x7fffffff - id`` over the tied
  candidates (chunks re-read from memory; a rare path) finds the id cutoff ``V``.
  Candidates equal in both score key and id (duplicates) are taken in position
  order, so the count is exact.
* Compaction: chunks of the row are re-read; winners get consecutive slots by a
  prefix sum and are written as a packed 63-bit key
  ``(s ^ INT_MIN) << 31 | (0x7fffffff - id)`` plus the raw score bits into a
  ``[Q, next_pow2(k)]`` workspace.
* Sort: the ``next_pow2(k)`` slots (empty ones hold key ``-1``) are sorted
  descending by a bitonic network on (key, slot): equal keys (duplicates, told apart
  only by NaN payloads) keep the slot order, which is the position order. Ids are
  decoded from the key, score bits gathered by slot. With many rows (``Q >= 4 * SMs``) the kernel stops after
  the compaction and ``torch.sort(stable=True)`` orders the packed keys (slots
  are in position order, so equal keys keep it), then a small kernel decodes.

The workspace is one ``torch.empty`` of a size fixed by ``(Q, k)``. Limits:
``N <= 32768`` candidates a row and ``k <= 2048`` (``supports(n, k)``).

This module imports without Triton or CUDA; ``available()`` says whether the
kernel can run here.
"""
from __future__ import annotations

import functools
import os

import torch

from . import select_staged

__all__ = ["available", "supports", "choose_path", "triton_ordered_select", "MAX_CANDIDATES", "MAX_K", "PAD_SCORE"]

MAX_CANDIDATES = 32768
MAX_K = 2048
PAD_SCORE = float("-inf")

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


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def choose_path(q: int, n: int, k: int, n_sm: int) -> str:
    """The staged path (a row over many programs) or the one-program-a-row kernel.

    From the H200 runs in docs/benchmarks_select_kernel.md (CUDA-graph replay, which is how
    serving runs the selection): the staged path is faster up to 8 rows, and up to 64 rows when
    a row does not fit in the row kernel's registers; beyond, its global histogram (atomics on a
    few hot bins) costs more than the row kernel. The choice does not depend on whether a
    stream is capturing, so the first call outside capture compiles what capture will launch.
    Outside graphs small calls are host-bound: each Python launch of a Triton kernel costs tens
    of µs and the staged path makes three or four.
    """
    if q <= 8 or (n > RESIDENT_MAX and q <= 64):
        return "staged"
    return "row"


RESIDENT_MAX = 16384  # rows up to this many candidates keep their score keys in registers


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    if _interpret() or not torch.cuda.is_available():
        return 132
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _launch_config(block: int, kb: int, q: int, n_sm: int, num_warps=None, chunk=None, resident=None,
                   split=None, order=None):
    """(num_warps, chunk, resident, split, order) for Q rows of ``block`` (a power of two) candidates.

    Defaults from the H200 runs in docs/benchmarks_select_kernel.md: the in-kernel bitonic
    network (``order="bitonic"``, ``split=1``) up to ``4 * SMs`` rows; beyond, the kernel leaves
    the winners unordered and ``torch.sort`` orders them (``order="sort"``; 0.14 ms for 1024
    rows of 2048 keys against 0.21 ms for the bitonic network). Spreading the rank count over
    ``split`` programs (``order="rank"``) measured slower than the network at Q = 1 and 8.
    """
    if order is None:
        order = "rank" if split not in (None, 1) else ("sort" if q >= 4 * n_sm and kb >= 1024 else "bitonic")
    if order not in ("bitonic", "rank", "sort"):
        raise ValueError(f"order must be bitonic, rank or sort, got {order!r}")
    if split is None:
        split = 16 if order == "rank" else 1
    if order != "rank":
        split = 1
    split = min(split, max(1, kb // 64))
    if resident is None:
        resident = block <= RESIDENT_MAX
    if num_warps is None:
        num_warps = max(4, min(16, block // 1024)) if resident else 16
    if chunk is None:
        chunk = 256 * num_warps
    return int(num_warps), min(block, int(chunk)), bool(resident), int(split), order


if _HAVE_TRITON:
    from .radix import digit, extend, key_id, load_chunk, packed_key, pick_digit, prefix_is, score_key

    @triton.jit
    def _indicator(n_dims: tl.constexpr, j: tl.constexpr):
        ar = tl.arange(0, 2)
        ar = tl.reshape(ar, [1] * (n_dims - j - 1) + [2] + [1] * j)
        return ar

    @triton.jit
    def _xor2(a, b, c, d):
        return a ^ c, b ^ d

    @triton.jit
    def _cas_pairs(x, p, flip, i: tl.constexpr, n_dims: tl.constexpr):
        # compare-and-swap along the i-th innermost hypercube axis; the payload p follows x.
        sx, sp = tl.reduce((x, p), n_dims - 1 - i, _xor2, keep_dims=True)
        y = x ^ sx  # partner's key
        q = p ^ sp  # partner's payload
        is_right = _indicator(n_dims, i)
        # does the left element of the pair come first: a larger key, or an equal key (a
        # duplicate) at an earlier slot (the payload is the slot); the same decision on both sides
        left_gt = tl.where(is_right == 1, (y > x) | ((y == x) & (q < p)), (x > y) | ((x == y) & (p < q)))
        swap = left_gt.to(tl.int32) != flip
        return tl.where(swap, y, x), tl.where(swap, q, p)

    @triton.jit
    def _merge_pairs(x, p, stage: tl.constexpr, order: tl.constexpr, n_dims: tl.constexpr):
        if order == 2:
            flip = _indicator(n_dims, stage)
        else:
            flip = order
        for i in tl.static_range(stage):
            x, p = _cas_pairs(x, p, flip, stage - 1 - i, n_dims)
        return x, p

    @triton.jit
    def _sort_pairs_desc(x, p, LOG_N: tl.constexpr):
        h = tl.reshape(x, [2] * LOG_N)
        hp = tl.reshape(p, [2] * LOG_N)
        for i in tl.static_range(1, LOG_N + 1):
            h, hp = _merge_pairs(h, hp, i, 2 if i < LOG_N else 1, LOG_N)
        return tl.reshape(h, x.shape), tl.reshape(hp, p.shape)

    @triton.jit
    def _chunked_histogram(sc_row, id_row, N, T, t, p: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr,
                           IDS: tl.constexpr):
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
            if p > 0:
                m = m & prefix_is(x, t, p, D)
            h += tl.histogram(digit(x, p, D), 1 << D, mask=m)
        return h

    @triton.jit
    def _ordered_select_kernel(
        sc_ptr, id_ptr, oid_ptr, osc_ptr, wk_ptr, wv_ptr,
        N, K, s_sq, s_iq, s_oi, s_os,
        BLOCK: tl.constexpr, CHUNK: tl.constexpr, KB: tl.constexpr, LOG_KB: tl.constexpr,
        RESIDENT: tl.constexpr, SPLIT: tl.constexpr, SORT_OUTSIDE: tl.constexpr, D: tl.constexpr,
        ABLATE: tl.constexpr,
    ):
        # grid (Q, SPLIT). With SPLIT > 1 the SPLIT programs of a row repeat the selection
        # (each into its own workspace copy; no communication) and each places 1/SPLIT of
        # the winners by counting ranks, instead of one program sorting all of them.
        # ABLATE (benchmarks only, wrong results): 1 = stop after the compaction, 3 = after the
        # load, 4 = after one radix pass, 5 = after phase 1 (3 and 4: rows in registers only).
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        sc_row = sc_ptr + row * s_sq
        id_row = id_ptr + row * s_iq
        wk_row = wk_ptr + (row * SPLIT + part) * KB
        wv_row = wv_ptr + (row * SPLIT + part) * KB
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
            if ABLATE == 3:  # load only
                tl.store(oid_ptr + row * s_oi, nvalid)
                return
            nsel = tl.minimum(nvalid, K)
            rem = nsel
            t = nsel * 0
            cnt = nvalid
            for p in tl.static_range(NP if ABLATE != 4 else 1):
                if rem < cnt:  # the cutoff is still inside the candidates in play: one more digit
                    d = digit(s, p, D)
                    if p > 0:
                        d = tl.where(prefix_is(s, t, p, D), d, 0)
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
            for p in tl.static_range(NP):
                if rem < cnt:
                    h = _chunked_histogram(sc_row, id_row, N, 0, t, p, D, CHUNK, False)
                    dd, above, cnt = pick_digit(h, rem, NB)
                    rem = rem - above
                    t = extend(t, dd, p, D)
                else:
                    t = extend(t, t * 0, p, D)
        T = t
        if ABLATE == 4 or ABLATE == 5:  # one radix pass / all of phase 1
            tl.store(oid_ptr + row * s_oi, T + rem)
            return

        # ---- phase 2 (ties at the cutoff score): radix select on the ids ---------
        V = nsel * 0 - 1  # id-key cutoff: -1 takes every tied candidate
        rem2 = nsel * 0
        if rem < cnt:
            vt = nsel * 0
            r2 = rem
            c2 = cnt
            for p in tl.static_range(NP):
                if r2 < c2:
                    h2 = _chunked_histogram(sc_row, id_row, N, T, vt, p, D, CHUNK, True)
                    dd2, above2, c2 = pick_digit(h2, r2, NB)
                    r2 = r2 - above2
                    vt = extend(vt, dd2, p, D)
                else:  # V is the smallest id key with the prefix vt: every tied one above is needed
                    vt = extend(vt, vt * 0, p, D)
            V = vt
            rem2 = r2  # candidates with s == T and id key == V still needed, in position order

        # ---- compaction: winners to consecutive workspace slots ------------------
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
            key = packed_key(sk, v)
            wmask = take & (slot < KB)
            tl.store(wk_row + slot, key, mask=wmask)
            tl.store(wv_row + slot, b, mask=wmask)

        if SORT_OUTSIDE:  # torch.sort orders the workspace: empty slots become key -1
            j = tl.arange(0, KB)
            tl.store(wk_row + j, tl.full([KB], -1, tl.int64), mask=j >= nsel)
            return

        tl.debug_barrier()  # the workspace writes above are read by other threads below

        # ---- order the winners (descending packed key), decode, write ----------
        if SPLIT == 1:
            j = tl.arange(0, KB)
            live = j < nsel
            key = tl.load(wk_row + j, mask=live, other=-1, cache_modifier=".cg")
            slot = j
            if ABLATE != 1:  # sorted by (key descending, slot): slots are in position order
                key, slot = _sort_pairs_desc(key, slot, LOG_KB)
            val = tl.load(wv_row + slot, mask=key >= 0, other=-8388608, cache_modifier=".cg")
            pos = j
        else:
            # this program's slice of the slots; rank = winners with a larger key, or an
            # equal key (a duplicate) in an earlier slot
            SL: tl.constexpr = KB // SPLIT
            JB: tl.constexpr = 64 if KB >= 64 else KB
            j = part * SL + tl.arange(0, SL)
            live = j < nsel
            key = tl.load(wk_row + j, mask=live, other=-1, cache_modifier=".cg")
            val = tl.load(wv_row + j, mask=live, other=-8388608, cache_modifier=".cg")
            rank = tl.zeros([SL], dtype=tl.int32)
            if ABLATE != 1:
                for j0 in range(0, KB, JB):
                    jj = j0 + tl.arange(0, JB)
                    kj = tl.load(wk_row + jj, mask=jj < nsel, other=-1, cache_modifier=".cg")
                    before = (kj[None, :] > key[:, None]) | ((kj[None, :] == key[:, None]) & (jj[None, :] < j[:, None]))
                    rank += tl.sum(before.to(tl.int32), 1)
                pos = tl.where(live, rank, j)  # winners to their rank, the rest are pads in place
            else:
                pos = j
        ok = key >= 0
        out_id = tl.where(ok, key_id(key), -1).to(tl.int32)
        out_sc = tl.where(ok, val, -8388608).to(tl.float32, bitcast=True)  # pad: -inf
        jm = pos < K
        tl.store(oid_ptr + row * s_oi + pos, out_id, mask=jm)
        tl.store(osc_ptr + row * s_os + pos, out_sc, mask=jm)


if _HAVE_TRITON:

    @triton.jit
    def _decode_sorted_kernel(key_ptr, pos_ptr, wv_ptr, oid_ptr, osc_ptr, K, s_o, KB: tl.constexpr):
        # keys sorted descending by torch.sort (with their slots): ids from the key, score
        # bits from the slot's payload; key -1 is an empty slot (a pad)
        row = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, KB)
        m = j < K
        key = tl.load(key_ptr + row * KB + j, mask=m, other=-1)
        pos = tl.load(pos_ptr + row * KB + j, mask=m, other=0)
        ok = key >= 0
        val = tl.load(wv_ptr + row * KB + pos, mask=m & ok, other=-8388608)
        tl.store(oid_ptr + row * s_o + j, tl.where(ok, key_id(key), -1).to(tl.int32), mask=m)
        tl.store(osc_ptr + row * s_o + j, tl.where(ok, val, -8388608).to(tl.float32, bitcast=True), mask=m)


def triton_ordered_select(scores: torch.Tensor, ids: torch.Tensor, k: int, *,
                          num_warps: int | None = None, chunk: int | None = None,
                          resident: bool | None = None, split: int | None = None, order: str | None = None,
                          radix_bits: int | None = None, path: str | None = None, staged: dict | None = None,
                          _ablate: int = 0):
    """Exact ordered top-``k`` of each row: ``(ids int32 [Q, k], scores fp32 [Q, k])``.

    ``scores`` fp32 ``[Q, N]`` and ``ids`` int32 ``[Q, N]`` (``-1`` = padding) on one CUDA
    device. No host synchronisation; safe to capture in a CUDA graph (after a first,
    compiling call outside capture). ``num_warps``, ``chunk``, ``resident``, ``split``,
    ``order`` and ``radix_bits`` (digit width of the radix select) are tuning knobs for
    benchmarks (defaults: ``_launch_config``; 5-bit digits, see the module docstring).
    ``path``: ``"row"`` (one program a row, this module's kernel) or ``"staged"`` (each row
    spread over many programs, ``select_staged``); default ``choose_path`` (the staged path
    for few rows). ``staged``: tuning
    knobs of the staged path (``select_staged.staged_config``; ``radix_bits`` there).
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
    out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
    if q == 0:
        return out_ids, out_sc
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    if ids.stride(1) != 1:
        ids = ids.contiguous()
    block = max(16, _next_pow2(n))
    kb = max(2, _next_pow2(k))
    n_sm = _num_sms(scores.device.index or 0) if scores.device.type == "cuda" else 132
    row_opts = (num_warps, chunk, resident, split, order, radix_bits)
    if path is None:  # an option of one path asks for that path
        if _ablate or any(o is not None for o in row_opts):
            path = "row"
        else:
            path = "staged" if staged else choose_path(q, n, k, n_sm)
    if path not in ("row", "staged"):
        raise ValueError(f"path must be row or staged, got {path!r}")
    if path == "staged":
        return select_staged.staged_select(scores, ids, k, out_ids, out_sc, n_sm, **dict(staged or {}))
    if staged:
        raise ValueError("staged options given with path='row'")
    radix_bits = 5 if radix_bits is None else int(radix_bits)
    nw, chunk, resident, split, order = _launch_config(block, kb, q, n_sm, num_warps, chunk, resident, split, order)
    if split < 1 or split & (split - 1) or split > kb:
        raise ValueError(f"split must be a power of two <= {kb}, got {split}")
    if not 2 <= radix_bits <= 8:
        raise ValueError(f"radix_bits must be in 2..8, got {radix_bits}")
    outside = order == "sort" and not _ablate
    # one allocation for both workspaces: packed keys (int64) then score bits (int32)
    ws = torch.empty((q * split * kb * 3,), dtype=torch.int32, device=scores.device)
    wk = ws[: q * split * kb * 2].view(torch.int64)
    wv = ws[q * split * kb * 2:]
    _ordered_select_kernel[(q, split)](
        scores, ids, out_ids, out_sc, wk, wv,
        n, k, scores.stride(0), ids.stride(0), out_ids.stride(0), out_sc.stride(0),
        BLOCK=block, CHUNK=chunk, KB=kb, LOG_KB=kb.bit_length() - 1, RESIDENT=resident,
        SPLIT=split, SORT_OUTSIDE=outside, D=int(radix_bits), ABLATE=int(_ablate), num_warps=nw,
    )
    if outside:
        key, pos = torch.sort(wk.view(q, kb), dim=1, descending=True, stable=True)
        _decode_sorted_kernel[(q,)](key, pos, wv, out_ids, out_sc, k, out_ids.stride(0), KB=kb,
                                    num_warps=max(1, min(8, kb // 256)))
    return out_ids, out_sc
