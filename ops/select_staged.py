"""Exact ordered top-k selection with each row split over many programs (the *staged* path).

Same contract as ``select_kernel.triton_ordered_select`` (DESIGN.md's Order rule, bit for bit,
pads ``(-1, -inf)``, no host synchronisation, CUDA-graph capturable); this module holds the
kernels, ``select_kernel`` chooses between them and the one-program-a-row kernel.

Why: one program a row leaves most SMs idle at few rows, and its radix passes, compaction and
sort run one after another in that program. Here four short kernels each spread a row over
many programs:

1. **histogram** ``grid (Q, S)``: every program reads ``CA`` candidates of a row and adds the
   top ``HB`` = 12 bits of their score keys (sign, exponent, 3 mantissa bits) to the row's
   global histogram (``atomic_add``, 4096 bins; valid candidates only).
2. **compact** ``grid (Q, S)``: every program scans the row's histogram (the same scan in
   every program, no communication) for the cutoff bin ``d*``. Candidates above it are
   winners: they go to the row's winner list ``W`` (slots from one ``atomic_add`` a program
   plus a prefix sum: any order). Candidates in ``d*`` are *in play*: their positions go to
   the row's list ``P``. When every candidate of ``d*`` is needed they are winners directly.
3. **finish** ``grid (Q,)``: one program a row picks the still-needed winners among the ``m``
   candidates of ``P`` (random scores: a few hundred at 16384 candidates; mass ties: the whole
   tie group). It is the radix select of ``select_kernel`` on ``P``, held in registers (tiers
   of 1024 / 4096 / 8192, the smallest that holds ``P``) or re-read in chunks beyond, with
   8-bit digits, the digits shared by the smallest and the largest key skipped without a pass:
   on the score key, then, for ties at the cutoff score, on ``0x7fffffff - id``, then, for
   duplicates (equal score key and id), on ``0x7fffffff - position`` (so duplicates are taken
   in position order). Winners are appended to ``W``. Up to ``FUSE_MAX_ROWS`` rows there is no
   finish kernel: the last compact program of a row to finish (a CTA barrier, then one
   gpu-scope acq_rel ticket, the cooperative-groups grid-sync pattern without the wait) runs it.
4. **order** up to ``RANK_MAX_ROWS`` rows, the rank kernel ``grid (Q, KB / SL)``: every
   program takes ``SL`` winners and counts, for each, the winners before it (a larger packed
   key, or an equal key at an earlier position): that count is its output slot; the slots past
   the winners get pads. Beyond (its work grows as ``Q k^2``), ``torch.sort`` of the winner
   keys, then a decode kernel that puts each run of equal keys in position order.

Workspace: one zeroed int32 ``[Q, 4096 + 4]`` (histogram, two slot counters, the ticket) and
one ``torch.empty`` for ``P`` (``[Q, N]`` int32), ``W`` (``[Q, KB]`` packed int64 keys, score
bits, positions) and the winner counts. ``N = 0`` is answered on the host (all pads).

Measured on an H200: docs/benchmarks_select_kernel.md.

This module imports without Triton; its kernels exist only where Triton imports.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    _HAVE_TRITON = False

__all__ = ["staged_select", "staged_config", "HIST_BITS"]

HIST_BITS = 12  # width of the first digit: 4096 bins of the global histogram
_ZS = (1 << HIST_BITS) + 4  # row stride of the zeroed workspace: histogram, winner count, in-play count


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def staged_config(n: int, kb: int, q: int, n_sm: int, ca=None, fin_chunk=None, fin_warps=None, rank_rows=None):
    """(ca, nw_a, fin_chunk, fin_warps, rank_rows, rank_cols) for Q rows of n candidates.

    ``ca``: candidates a program of the histogram and compact kernels (aim: a few programs
    an SM). ``fin_chunk``: candidates of ``P`` a step of the finish kernel.
    ``rank_rows x rank_cols``: the tile of key comparisons of the rank kernel.
    """
    if ca is None:
        ca = min(8192, max(512, _next_pow2(-(-q * n // (4 * n_sm)))))
    ca = min(int(ca), max(16, _next_pow2(n)))
    nw_a = max(1, min(8, ca // 256))
    if fin_chunk is None:
        fin_chunk = 2048
    if fin_warps is None:
        fin_warps = 8
    if rank_rows is None:
        rank_rows = min(256, max(16, _next_pow2(-(-q * kb // (8 * n_sm)))))
    rank_rows = min(int(rank_rows), kb)
    rank_cols = max(16, min(kb, 8192 // rank_rows))
    return int(ca), nw_a, int(fin_chunk), int(fin_warps), rank_rows, rank_cols


if _HAVE_TRITON:
    from .radix import digit, extend, key_id, load_chunk, packed_key, pick_digit, prefix_is, score_key

    @triton.jit
    def _top_digit(s, HB: tl.constexpr):
        # the first HB bits of the score key as an unsigned bin (sign flipped: negatives below)
        return ((s >> (32 - HB)) & ((1 << HB) - 1)) ^ (1 << (HB - 1))

    @triton.jit
    def _cutoff(z_row, K, HB: tl.constexpr):
        # from the row's histogram: winners wanted, the cutoff bin, winners above it, and how
        # many candidates the cutoff bin holds (the same scan in every program that needs it)
        h = tl.load(z_row + tl.arange(0, 1 << HB))
        nsel = tl.minimum(tl.sum(h, 0), K)
        dstar, above, m = pick_digit(h, nsel, 1 << HB)
        return nsel, dstar, above, m

    @triton.jit
    def _hist_kernel(sc_ptr, id_ptr, z_ptr, N, s_sq, s_iq, CA: tl.constexpr, HB: tl.constexpr, ZS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        b, i = load_chunk(sc_ptr + row * s_sq, id_ptr + row * s_iq, tl.program_id(1) * CA, N, CA)
        s = score_key(b, i)
        ones = tl.full([CA], 1, tl.int32)
        tl.atomic_add(z_ptr + row * ZS + _top_digit(s, HB), ones, mask=s != -2147483648, sem="relaxed")

    @triton.jit
    def _compact_kernel(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, N, K, s_sq, s_iq,
                        CA: tl.constexpr, HB: tl.constexpr, ZS: tl.constexpr, KB: tl.constexpr,
                        FUSED: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, FR1: tl.constexpr,
                        FR2: tl.constexpr, FR3: tl.constexpr, SORT_OUTSIDE: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        z_row = z_ptr + row * ZS
        nsel, dstar, above, m = _cutoff(z_row, K, HB)
        need = nsel - above
        o = tl.program_id(1) * CA + tl.arange(0, CA)
        b, i = load_chunk(sc_ptr + row * s_sq, id_ptr + row * s_iq, tl.program_id(1) * CA, N, CA)
        s = score_key(b, i)
        d = _top_digit(s, HB)
        valid = s != -2147483648
        # when every candidate of the cutoff bin is needed they are winners, none is in play
        win = valid & ((d > dstar) | ((d == dstar) & (need == m)))
        play = valid & (d == dstar) & (need != m)
        wi = win.to(tl.int32)
        nw = tl.sum(wi, 0)
        if nw > 0:
            base = tl.atomic_add(z_row + (1 << HB), nw, sem="relaxed")
            slot = base + tl.cumsum(wi, 0) - 1
            key = packed_key(s, 2147483647 - tl.maximum(i, 0))
            tl.store(wk_ptr + row * KB + slot, key, mask=win)
            tl.store(wv_ptr + row * KB + slot, b, mask=win)
            tl.store(wo_ptr + row * KB + slot, o, mask=win)
        pi = play.to(tl.int32)
        npl = tl.sum(pi, 0)
        if npl > 0:
            pbase = tl.atomic_add(z_row + (1 << HB) + 1, npl, sem="relaxed")
            tl.store(p_ptr + row * N + pbase + tl.cumsum(pi, 0) - 1, o, mask=play)
        if FUSED:
            # the last program of the row to get here finishes it: a CTA barrier, then one
            # gpu-scope acq_rel ticket (the cooperative-groups grid-sync pattern) makes every
            # program's P and W writes visible to it; nobody waits, so nothing can hang
            tl.debug_barrier()
            ticket = tl.atomic_add(z_row + (1 << HB) + 2, 1, sem="acq_rel", scope="gpu")
            if ticket == tl.num_programs(1) - 1:
                _finish_row(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, K, s_sq, s_iq,
                            HB, ZS, KB, D, CH, FR1, FR2, FR3, SORT_OUTSIDE)

    @triton.jit
    def _load_play(p_row, sc_row, id_row, j, m):
        # the in-play candidates at slots j of P: mask, position, score bits, id, score key
        mj = j < m
        o = tl.load(p_row + j, mask=mj, other=0, cache_modifier=".cg")  # P is written by other programs
        b = tl.load(sc_row + o, mask=mj, other=0.0).to(tl.int32, bitcast=True)
        i = tl.load(id_row + o, mask=mj, other=0)
        return mj, o, b, i, score_key(b, i)

    @triton.jit
    def _play_key(p_row, sc_row, id_row, j, m, T, V, MODE: tl.constexpr):
        # the candidates of P at slots j: the radix key of this phase and whether they are in it
        # (MODE 0: score key; 1: inverted id among score key T; 2: inverted position among
        # score key T and inverted id V)
        mj, o, b, i, s = _load_play(p_row, sc_row, id_row, j, m)
        if MODE == 0:
            x = s
            inm = mj
        elif MODE == 1:
            x = 2147483647 - i
            inm = mj & (s == T)
        else:
            x = 2147483647 - o
            inm = mj & (s == T) & ((2147483647 - i) == V)
        return x, inm

    @triton.jit
    def _play_minmax(p_row, sc_row, id_row, m, T, V, MODE: tl.constexpr, CH: tl.constexpr):
        lo = tl.full((), 2147483647, tl.int32)
        hi = tl.full((), -2147483648, tl.int32)
        for c0 in range(0, m, CH):
            x, inm = _play_key(p_row, sc_row, id_row, c0 + tl.arange(0, CH), m, T, V, MODE)
            lo = tl.minimum(lo, tl.min(tl.where(inm, x, 2147483647), 0))
            hi = tl.maximum(hi, tl.max(tl.where(inm, x, -2147483648), 0))
        return lo, hi

    @triton.jit
    def _play_hist(p_row, sc_row, id_row, m, T, V, t, p: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr,
                   CH: tl.constexpr):
        h = tl.zeros([1 << D], dtype=tl.int32)
        for c0 in range(0, m, CH):
            x, inm = _play_key(p_row, sc_row, id_row, c0 + tl.arange(0, CH), m, T, V, MODE)
            if p > 0:
                inm = inm & prefix_is(x, t, p, D)
            h += tl.histogram(digit(x, p, D), 1 << D, mask=inm)
        return h

    @triton.jit
    def _cut(x, inm, p_row, sc_row, id_row, m, T, V, rem, cnt, MODE: tl.constexpr, D: tl.constexpr,
             CH: tl.constexpr, RES: tl.constexpr):
        # radix select over the candidates of one phase (cnt of them, rem wanted): the cutoff key
        # X (x >= X selects the wanted ones, plus rem of the cnt' candidates equal to X). RES: the
        # keys are in registers (x, inm: the candidates of this phase); else chunks of P are
        # re-read on every pass (MODE picks the key, x and inm are unused)
        if RES:
            lo = tl.min(tl.where(inm, x, 2147483647), 0)
            hi = tl.max(tl.where(inm, x, -2147483648), 0)
        else:
            lo, hi = _play_minmax(p_row, sc_row, id_row, m, T, V, MODE, CH)
        t = rem * 0
        for p in tl.static_range((32 + D - 1) // D):
            if rem < cnt:
                if D * (p + 1) >= 32:
                    same = lo == hi
                else:
                    same = ((lo ^ hi) >> (32 - D * (p + 1))) == 0
                if same:  # every candidate in play shares this digit: no pass needed
                    t = extend(t, digit(hi, p, D), p, D)
                else:
                    if RES:
                        msk = inm
                        if p > 0:
                            msk = msk & prefix_is(x, t, p, D)
                        h = tl.histogram(digit(x, p, D), 1 << D, mask=msk)
                    else:
                        h = _play_hist(p_row, sc_row, id_row, m, T, V, t, p, D, MODE, CH)
                    dd, above, cnt = pick_digit(h, rem, 1 << D)
                    rem = rem - above
                    t = extend(t, dd, p, D)
            else:  # all of them are wanted: X is the smallest key with the prefix t
                t = extend(t, t * 0, p, D)
        return t, rem, cnt

    @triton.jit
    def _store_winners(wk_ptr, wv_ptr, wo_ptr, row, base, sel, s, v, b, o, KB: tl.constexpr):
        si = sel.to(tl.int32)
        slot = base + tl.cumsum(si, 0) - 1
        tl.store(wk_ptr + row * KB + slot, packed_key(s, v), mask=sel)
        tl.store(wv_ptr + row * KB + slot, b, mask=sel)
        tl.store(wo_ptr + row * KB + slot, o, mask=sel)
        return base + tl.sum(si, 0)

    @triton.jit
    def _finish_in_play(sc_row, id_row, p_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                        KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, RES: tl.constexpr,
                        FR: tl.constexpr):
        # need of the m in-play candidates, appended to W from slot above: the cutoff score key T,
        # then (ties at T) the id key V, then (duplicates at T, V) the position key W. RES: P is
        # held in FR registers (one load); else every pass re-reads chunks of CH.
        if RES:
            mj, o, b, i, s = _load_play(p_row, sc_row, id_row, tl.arange(0, FR), m)
            v = 2147483647 - i
            w = 2147483647 - o
        else:  # placeholders: _cut reads P itself
            mj = need >= 0
            s = need
            v = need
            w = need
        T, rem, cnt = _cut(s, mj, p_row, sc_row, id_row, m, 0, 0, need, m, 0, D, CH, RES)
        V = T * 0 - 1  # -1: every candidate with score key T is taken
        W = T * 0  # 0: every duplicate (score key T, id key V) is taken
        if rem < cnt:
            V, rem2, c2 = _cut(v, mj & (s == T), p_row, sc_row, id_row, m, T, 0, rem, cnt, 1, D, CH, RES)
            if rem2 < c2:
                W, rem3, c3 = _cut(w, mj & (s == T) & (v == V), p_row, sc_row, id_row, m, T, V, rem2, c2, 2,
                                   D, CH, RES)
        if RES:
            sel = mj & ((s > T) | ((s == T) & ((v > V) | ((v == V) & (w >= W)))))
            _store_winners(wk_ptr, wv_ptr, wo_ptr, row, above, sel, s, v, b, o, KB)
        else:
            base = above
            for c0 in range(0, m, CH):
                mc, oc, bc, ic, sc = _load_play(p_row, sc_row, id_row, c0 + tl.arange(0, CH), m)
                vc = 2147483647 - ic
                sel = mc & ((sc > T) | ((sc == T) & ((vc > V) | ((vc == V) & ((2147483647 - oc) >= W)))))
                base = _store_winners(wk_ptr, wv_ptr, wo_ptr, row, base, sel, sc, vc, bc, oc, KB)

    @triton.jit
    def _finish_row(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, K, s_sq, s_iq,
                    HB: tl.constexpr, ZS: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr,
                    FR1: tl.constexpr, FR2: tl.constexpr, FR3: tl.constexpr, SORT_OUTSIDE: tl.constexpr):
        # one program: pick the winners still needed among the row's in-play list P
        nsel, dstar, above, m = _cutoff(z_ptr + row * ZS, K, HB)
        tl.store(cnt_ptr + row, nsel)
        need = nsel - above
        sc_row = sc_ptr + row * s_sq
        id_row = id_ptr + row * s_iq
        p_row = p_ptr + row * N
        if need < m:  # (need == m: compact took every candidate of the cutoff bin)
            # register tiers (the smallest that holds P), else chunks re-read on every pass
            if m <= FR1:
                _finish_in_play(sc_row, id_row, p_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                                KB, D, CH, True, FR1)
            elif m <= FR2:
                _finish_in_play(sc_row, id_row, p_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                                KB, D, CH, True, FR2)
            elif m <= FR3:
                _finish_in_play(sc_row, id_row, p_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                                KB, D, CH, True, FR3)
            else:
                _finish_in_play(sc_row, id_row, p_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                                KB, D, CH, False, FR1)
        if SORT_OUTSIDE:  # torch.sort orders the winner keys: the empty slots become key -1 (last)
            jk = tl.arange(0, KB)
            tl.store(wk_ptr + row * KB + jk, tl.full([KB], -1, tl.int64), mask=jk >= nsel)

    @triton.jit
    def _finish_kernel(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, N, K, s_sq, s_iq,
                       HB: tl.constexpr, ZS: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr,
                       FR1: tl.constexpr, FR2: tl.constexpr, FR3: tl.constexpr, SORT_OUTSIDE: tl.constexpr):
        _finish_row(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, tl.program_id(0).to(tl.int64),
                    N, K, s_sq, s_iq, HB, ZS, KB, D, CH, FR1, FR2, FR3, SORT_OUTSIDE)

    @triton.jit
    def _rank_kernel(wk_ptr, wv_ptr, wo_ptr, cnt_ptr, oid_ptr, osc_ptr, K, s_oi, s_os,
                     KB: tl.constexpr, SL: tl.constexpr, JB: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        nsel = tl.load(cnt_ptr + row)
        j = tl.program_id(1) * SL + tl.arange(0, SL)
        live = j < nsel
        wk_row = wk_ptr + row * KB
        wo_row = wo_ptr + row * KB
        key = tl.load(wk_row + j, mask=live, other=-1)
        o = tl.load(wo_row + j, mask=live, other=0)
        val = tl.load(wv_ptr + row * KB + j, mask=live, other=-8388608)
        acc = tl.zeros([SL, JB], dtype=tl.int32)  # one reduction at the end, not one a step
        if tl.program_id(1) * SL < nsel:
            for j0 in range(0, nsel, JB):
                jj = j0 + tl.arange(0, JB)
                mm = jj < nsel
                kj = tl.load(wk_row + jj, mask=mm, other=-1)
                oj = tl.load(wo_row + jj, mask=mm, other=0)
                before = (kj[None, :] > key[:, None]) | ((kj[None, :] == key[:, None]) & (oj[None, :] < o[:, None]))
                acc += (before & mm[None, :]).to(tl.int32)
        rank = tl.sum(acc, 1)
        pos = tl.where(live, rank, j)  # winners to their rank; the slots past them get pads
        out_id = tl.where(live, key_id(key), -1).to(tl.int32)
        out_sc = tl.where(live, val, -8388608).to(tl.float32, bitcast=True)
        mk = pos < K
        tl.store(oid_ptr + row * s_oi + pos, out_id, mask=mk)
        tl.store(osc_ptr + row * s_os + pos, out_sc, mask=mk)


if _HAVE_TRITON:

    @triton.jit
    def _max2(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _min2(a, b):
        return tl.minimum(a, b)

    @triton.jit
    def _decode_runs_kernel(key_ptr, pos_ptr, wv_ptr, wo_ptr, cnt_ptr, oid_ptr, osc_ptr, K, s_oi, s_os,
                            KB: tl.constexpr):
        # winner keys sorted descending (torch.sort, any tie order) with their W slots: ids from
        # the key, score bits from the slot. Equal keys (duplicates: same score key and id; only
        # NaN payloads can tell them apart) form runs; each run is put in position order.
        row = tl.program_id(0).to(tl.int64)
        nsel = tl.load(cnt_ptr + row)
        j = tl.arange(0, KB)
        live = j < nsel
        k_row = key_ptr + row * KB
        p_row = pos_ptr + row * KB
        key = tl.load(k_row + j)
        slot = tl.load(p_row + j, mask=live, other=0)
        val = tl.load(wv_ptr + row * KB + slot, mask=live, other=-8388608)
        prev = tl.load(k_row + j - 1, mask=j > 0, other=-2)
        nxt = tl.load(k_row + j + 1, mask=j < KB - 1, other=-2)
        a = tl.associative_scan(tl.where(key != prev, j, 0), 0, _max2)  # run start
        e = tl.associative_scan(tl.where(key != nxt, j, KB), 0, _min2, reverse=True)  # run end (incl.)
        dest = j
        longest = tl.max(tl.where(live, e - a + 1, 1), 0)
        if longest > 1:
            o = tl.load(wo_ptr + row * KB + slot, mask=live, other=0)
            r = tl.zeros([KB], dtype=tl.int32)
            for t in range(0, longest):
                i = a + t
                mi = live & (i <= e)
                oi = tl.load(wo_ptr + row * KB + tl.load(p_row + i, mask=mi, other=0), mask=mi, other=0)
                r += (mi & (oi < o)).to(tl.int32)
            dest = tl.where(live, a + r, j)  # the empty slots past the winners stay pads
        out_id = tl.where(live, key_id(key), -1).to(tl.int32)
        out_sc = tl.where(live, val, -8388608).to(tl.float32, bitcast=True)
        mk = dest < K
        tl.store(oid_ptr + row * s_oi + dest, out_id, mask=mk)
        tl.store(osc_ptr + row * s_os + dest, out_sc, mask=mk)


RANK_MAX_ROWS = 8  # up to this many rows the rank kernel orders the winners, beyond torch.sort
FUSE_MAX_ROWS = 3  # up to this many rows the last compact program finishes the row (no finish kernel)


def staged_select(scores: torch.Tensor, ids: torch.Tensor, k: int, out_ids: torch.Tensor, out_sc: torch.Tensor,
                  n_sm: int, *, ca=None, fin_chunk=None, fin_warps=None, fin_resident=None, rank_rows=None,
                  order=None, fuse=None, radix_bits: int = 8):
    """Fill ``out_ids``/``out_sc`` ``[Q, k]`` with the ordered top ``k`` of each row.

    Inputs are validated by the caller (``select_kernel.triton_ordered_select``): fp32
    ``scores`` and int32 ``ids`` ``[Q, N]`` with unit stride along N, ``Q >= 1``.
    """
    q, n = scores.shape
    if n == 0:  # no candidates: no program would run to count the winners; all pads
        out_ids.fill_(-1)
        out_sc.fill_(float("-inf"))
        return out_ids, out_sc
    kb = max(2, _next_pow2(k))
    if order is None:
        order = "rank" if q <= RANK_MAX_ROWS else "sort"
    if fuse is None:  # H200: fused 0.025 vs 0.030 ms at 1 row; from 8 rows the separate kernel is faster
        fuse = q <= FUSE_MAX_ROWS
    if order not in ("rank", "sort"):
        raise ValueError(f"staged order must be rank or sort, got {order!r}")
    if not 2 <= int(radix_bits) <= 8:
        raise ValueError(f"radix_bits must be in 2..8, got {radix_bits}")
    fr = 8192 if fin_resident is None else int(fin_resident)
    if fr < 16 or fr & (fr - 1):
        raise ValueError(f"fin_resident must be a power of two >= 16, got {fr}")
    # register tiers of the finish: the smallest of them that holds the in-play list is used
    top = min(fr, max(16, _next_pow2(n)))
    fr1, fr2, fr3 = min(1024, top), min(4096, top), top
    ca, nw_a, ch, fw, sl, jb = staged_config(n, kb, q, n_sm, ca, fin_chunk, fin_warps, rank_rows)
    dev = scores.device
    z = torch.zeros((q, _ZS), dtype=torch.int32, device=dev)
    # one allocation: W keys (int64), then W score bits, W positions, P, winner counts (int32)
    ws = torch.empty((q * (kb * 4 + n + 1),), dtype=torch.int32, device=dev)
    wk = ws[: q * kb * 2].view(torch.int64)
    wv = ws[q * kb * 2: q * kb * 3]
    wo = ws[q * kb * 3: q * kb * 4]
    pl = ws[q * kb * 4: q * (kb * 4 + n)]
    cnt = ws[q * (kb * 4 + n):]
    grid_a = (q, -(-n // ca))
    fin = dict(HB=HIST_BITS, ZS=_ZS, KB=kb, D=int(radix_bits), CH=ch, FR1=fr1, FR2=fr2, FR3=fr3,
               SORT_OUTSIDE=order == "sort")
    _hist_kernel[grid_a](scores, ids, z, n, scores.stride(0), ids.stride(0), CA=ca, HB=HIST_BITS, ZS=_ZS,
                         num_warps=nw_a)
    _compact_kernel[grid_a](scores, ids, z, pl, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0),
                            CA=ca, FUSED=bool(fuse), num_warps=fw if fuse else nw_a, **fin)
    if not fuse:
        _finish_kernel[(q,)](scores, ids, z, pl, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0),
                             num_warps=fw, **fin)
    if order == "rank":
        _rank_kernel[(q, kb // sl)](wk, wv, wo, cnt, out_ids, out_sc, k, out_ids.stride(0), out_sc.stride(0),
                                    KB=kb, SL=sl, JB=jb, num_warps=4)
    else:
        key, pos = torch.sort(wk.view(q, kb), dim=1, descending=True)
        _decode_runs_kernel[(q,)](key, pos, wv, wo, cnt, out_ids, out_sc, k, out_ids.stride(0), out_sc.stride(0),
                                  KB=kb, num_warps=max(1, min(8, kb // 256)))
    return out_ids, out_sc
