"""The finish of a row's selection, shared by the staged path and the row kernel.

After a first digit has been found, a row's candidates fall in three groups: *winners* above
the cutoff prefix (already in the winner list ``W``), candidates *in play* (the cutoff prefix:
their positions are in the list ``P``), and losers. ``finish_row`` picks, in one program, the
still-needed winners among the ``m`` candidates of ``P`` and appends them to ``W``:

* a radix select on ``P``, held in registers (tiers ``FR1`` / ``FR2``, the smaller that holds
  ``P``) or re-read in chunks of ``CH`` beyond, with ``D``-bit digits from the highest bit
  in which the smallest and the largest key still in play differ (the bits above are shared:
  no pass for them); a tier that no row of a kernel reaches is not compiled (``FR1`` 0;
  ``MMAX``);
* in up to three phases (a runtime loop, one copy of the code): the score key, then (ties at
  the cutoff score) ``0x7fffffff - id``, then (duplicates: equal score key and id)
  ``0x7fffffff - position``, so duplicates are taken in position order.

Random scores leave a few hundred candidates in play at 16384 a row; a mass tie puts the
whole tie group in play (the chunked tier). When the score phase finds every candidate in play
at one score key (a pure tie: a padded row's ``-inf``), the later phases' chunked passes read
the ids only, not the scores (one gather a candidate a pass instead of two).

Imported only where Triton imports (``select_kernel.py``, ``select_staged.py``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .radix import biased, digit_at, pick_digit, prefix_at, put_winners, score_key, shared_bits

__all__ = ["finish_row"]


@triton.jit
def load_play(p_row, pi_row, sc_row, id_row, j, m, tied=0, mode=0, PIDS: tl.constexpr = False):
    # the in-play candidates at slots j of P: mask, position, score bits, id, score key (tied:
    # every candidate in play has one score key, which the caller knows: the scores are not
    # read, and the key returned is meaningless). PIDS: P's ids are listed too (pi_row, slot
    # for slot), read there and not by position; then after a pure tie the id phase (mode 1)
    # reads that list only, not the positions (the position returned is meaningless)
    mj = j < m
    if PIDS:
        i = tl.load(pi_row + j, mask=mj, other=0, cache_modifier=".cg")
        # (tensor masks: a scalar bool in a mask trips the interpreter)
        o = tl.load(p_row + j, mask=mj & (((j * 0 + tied) == 0) | ((j * 0 + mode) == 2)), other=0,
                    cache_modifier=".cg")
    else:
        o = tl.load(p_row + j, mask=mj, other=0, cache_modifier=".cg")  # P is written by other programs
        i = tl.load(id_row + o, mask=mj, other=0)
    b = tl.load(sc_row + o, mask=mj & ((j * 0 + tied) == 0), other=0.0).to(tl.int32, bitcast=True)
    return mj, o, b, i, score_key(b, i)


@triton.jit
def phase_key(s, i, o, mj, T, V, mode, tied=0):
    # the radix key of a finish phase and whether a candidate takes part in it (mode, a
    # runtime value: 0 the score key; 1 the inverted id among score key T; 2 the inverted
    # position among score key T and inverted id V; tied: every candidate in play has score
    # key T, so s is not looked at)
    v = 2147483647 - i
    x = tl.where(mode == 0, s, tl.where(mode == 1, v, 2147483647 - o))
    inm = mj & ((mode == 0) | (s == T) | ((s * 0 + tied) != 0)) & ((mode <= 1) | (v == V))
    return x, inm


@triton.jit
def play_key(p_row, pi_row, sc_row, id_row, j, m, T, V, mode, tied, PIDS: tl.constexpr):
    mj, o, b, i, s = load_play(p_row, pi_row, sc_row, id_row, j, m, tied, mode, PIDS)
    return phase_key(s, i, o, mj, T, V, mode, tied)


@triton.jit
def play_minmax(p_row, pi_row, sc_row, id_row, m, T, V, mode, tied, CH: tl.constexpr, PIDS: tl.constexpr):
    # the smallest and largest key of the phase among the candidates in it, and (for the id
    # phase after a score phase that found every candidate in play tied) the smallest and
    # largest id key of all candidates in play: one pass over the chunks for both
    lo = tl.full((), 2147483647, tl.int32)
    hi = tl.full((), -2147483648, tl.int32)
    vlo = lo
    vhi = hi
    for c0 in range(0, m, CH):
        mj, o, b, i, s = load_play(p_row, pi_row, sc_row, id_row, c0 + tl.arange(0, CH), m, tied, mode, PIDS)
        x, inm = phase_key(s, i, o, mj, T, V, mode, tied)
        lo = tl.minimum(lo, tl.min(tl.where(inm, x, 2147483647), 0))
        hi = tl.maximum(hi, tl.max(tl.where(inm, x, -2147483648), 0))
        if mode == 0:
            v = 2147483647 - i
            vlo = tl.minimum(vlo, tl.min(tl.where(mj, v, 2147483647), 0))
            vhi = tl.maximum(vhi, tl.max(tl.where(mj, v, -2147483648), 0))
    return lo, hi, vlo, vhi


@triton.jit
def play_hist(p_row, pi_row, sc_row, id_row, m, T, V, t, sh, w, D: tl.constexpr, mode, tied, CH: tl.constexpr,
              PIDS: tl.constexpr):
    h = tl.zeros([1 << D], dtype=tl.int32)
    for c0 in range(0, m, CH):
        x, inm = play_key(p_row, pi_row, sc_row, id_row, c0 + tl.arange(0, CH), m, T, V, mode, tied, PIDS)
        y = biased(x)
        h += tl.histogram(digit_at(y, sh, w), 1 << D, mask=inm & prefix_at(y, t, sh + w))
    return h


@triton.jit
def store_winners(wk_ptr, wv_ptr, wo_ptr, row, base, sel, s, v, b, o, KB: tl.constexpr):
    si = sel.to(tl.int32)
    put_winners(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, base + tl.cumsum(si, 0) - 1, sel, s, v, b, o)
    return base + tl.sum(si, 0)


@triton.jit(noinline=True)  # (noinline: select_kernel's docstring, Compile time)
def finish_in_play(sc_row, id_row, p_row, pi_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                   KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, RES: tl.constexpr,
                   FR: tl.constexpr, PIDS: tl.constexpr):
    # need of the m in-play candidates, appended to W from slot above. Up to three phases
    # (a runtime loop: one copy of the radix select's code), each a radix select over the
    # candidates the previous one left tied: the cutoff score key T, then (ties at T) the id
    # key V, then (duplicates at T, V) the position key W. RES: P is held in FR registers
    # (one load); else every pass re-reads chunks of CH.
    if RES:
        mj, o, b, i, s = load_play(p_row, pi_row, sc_row, id_row, tl.arange(0, FR), m, 0, 0, PIDS)
    T = need * 0
    V = T - 1  # -1: every candidate with score key T is taken
    W = T  # 0: every duplicate (score key T, id key V) is taken
    rem = need
    cnt = m
    vlo = T
    vhi = T
    pure = T  # the score phase found every candidate in play tied (chunks: vlo, vhi hold the id range)
    tied = T  # the same, kept for the later phases: their chunked passes do not read the scores
    for mode in range(3):
        if rem < cnt:  # more candidates tie in this phase's key than are wanted
            if RES:
                x, inm = phase_key(s, i, o, mj, T, V, mode)
                lo = tl.min(tl.where(inm, x, 2147483647), 0)
                hi = tl.max(tl.where(inm, x, -2147483648), 0)
            elif (mode == 1) & (pure != 0):
                lo = vlo
                hi = vhi
            else:
                lo, hi, vlo, vhi = play_minmax(p_row, pi_row, sc_row, id_row, m, T, V, mode, tied, CH, PIDS)
            pure = ((mode == 0) & (lo == hi)).to(tl.int32)
            tied = tl.where(mode == 0, pure, tied)
            # the bits every key of the phase shares: no pass for them; then digits of D bits
            # from the highest bit that differs down, while more tie than are wanted
            sh, t = shared_bits(lo, hi)
            while (sh > 0) & (rem < cnt):
                w = tl.minimum(sh, D)
                sh = sh - w
                if RES:
                    y = biased(x)
                    h = tl.histogram(digit_at(y, sh, w), 1 << D, mask=inm & prefix_at(y, t, sh + w))
                else:
                    h = play_hist(p_row, pi_row, sc_row, id_row, m, T, V, t, sh, w, D, mode, tied, CH, PIDS)
                dd, above_d, cnt = pick_digit(h, rem, 1 << D)
                rem = rem - above_d
                t = t | (dd.to(tl.int64) << sh)
            # the cutoff key: the digits found, the bits below them clear (when every candidate
            # with those digits is wanted, the smallest key that has them)
            cut = (t - 2147483648).to(tl.int32)
            T = tl.where(mode == 0, cut, T)
            V = tl.where(mode == 1, cut, V)
            W = tl.where(mode == 2, cut, W)
    if RES:
        v = 2147483647 - i
        sel = mj & ((s > T) | ((s == T) & ((v > V) | ((v == V) & ((2147483647 - o) >= W)))))
        store_winners(wk_ptr, wv_ptr, wo_ptr, row, above, sel, s, v, b, o, KB)
    else:
        base = above
        for c0 in range(0, m, CH):
            mc, oc, bc, ic, sc = load_play(p_row, pi_row, sc_row, id_row, c0 + tl.arange(0, CH), m, 0, 0, PIDS)
            vc = 2147483647 - ic
            sel = mc & ((sc > T) | ((sc == T) & ((vc > V) | ((vc == V) & ((2147483647 - oc) >= W)))))
            base = store_winners(wk_ptr, wv_ptr, wo_ptr, row, base, sel, sc, vc, bc, oc, KB)


@triton.jit(noinline=True)  # (noinline: select_kernel's docstring, Compile time)
def finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel, above, m,
               KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, FR1: tl.constexpr, FR2: tl.constexpr,
               MMAX: tl.constexpr = 0, PIDS: tl.constexpr = False):
    # one program: pick the winners still needed among the row's in-play list P (nsel winners,
    # above of them above the cutoff bin, m candidates in it: the row's cutoff scan). Tiers that
    # no row reaches are not compiled: FR1 0, no first register tier (the staged path's rank
    # ordering ranks every cutoff bin that small whole: select_staged.finish_tiers); MMAX: the
    # most candidates a row holds (a register tile's size; 0: any), so no chunks for the row
    # kernel's 4096 tile; PIDS: a row of P holds N positions then N ids (the staged path)
    tl.store(cnt_ptr + row, nsel)
    need = nsel - above
    sc_row = sc_ptr + row * s_sq
    id_row = id_ptr + row * s_iq
    if PIDS:
        p_row = p_ptr + row * (2 * N)
        pi_row = p_row + N
    else:
        p_row = p_ptr + row * N
        pi_row = p_row
    if need < m:  # (need == m: compact took every candidate of the cutoff bin)
        # register tiers (the smaller that holds P), else chunks re-read on every pass
        if FR1 > 0 and m <= FR1:  # (FR1 0: not compiled)
            finish_in_play(sc_row, id_row, p_row, pi_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                           KB, D, CH, True, FR1, PIDS)
        elif (MMAX > 0 and MMAX <= FR2) or m <= FR2:  # (every row's P fits: no chunks compiled)
            finish_in_play(sc_row, id_row, p_row, pi_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                           KB, D, CH, True, FR2, PIDS)
        else:
            finish_in_play(sc_row, id_row, p_row, pi_row, wk_ptr, wv_ptr, wo_ptr, row, m, need, above,
                           KB, D, CH, False, FR2, PIDS)
