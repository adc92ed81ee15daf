"""Exact ordered top-k selection with each row split over many programs (the *staged* path).

Same contract as ``select_kernel.triton_ordered_select`` (DESIGN.md's Order rule, bit for bit,
pads ``(-1, -inf)``, no host synchronisation, CUDA-graph capturable); this module holds the
kernels, ``select_kernel.choose_path`` chooses between them and the one-program-a-row kernel.

Why: one program a row leaves most SMs idle at few rows, and its radix passes and compaction
run one after another in that program. Here short kernels each spread a row over many programs:

1. **histogram** ``grid (Q, S)``: every program reads ``CA`` candidates of a row and adds the
   top ``HB`` = 12 bits of their score keys (sign, exponent, 3 mantissa bits) to the row's
   global histogram (``atomic_add``, 4096 bins; valid candidates only). (Sorting a program's bins
   first and adding one count a distinct bin measured slower on an H200 at 64 rows and more:
   docs/benchmarks_select_kernel.md.)
2. **compact** ``grid (Q, S)``: every program scans the row's histogram (the same scan in
   every program, no communication) for the cutoff bin ``d*``. Candidates above it are
   winners: they go to the row's winner list ``W``. Where the rank kernel orders (up to
   ``RANK_MAX_ROWS`` rows) W is *binned*: a winner's slot is its bin's first slot (the
   candidates in the bins above, from the histogram) plus one ``atomic_add`` on its bin's
   counter, so W is sorted by the first digit; beyond, slots come from one ``atomic_add`` a
   program plus a prefix sum (any order). The candidates of ``d*`` go to W whole, after the
   winners above it, when every one of them is needed, or when ``d*`` holds at most
   ``rank_play`` of them (``rank_layout``: 4096 at one row, 2048 at two, 1024 at 3-4; the rank
   kernel then ranks the bin whole and no finish runs for the row); else they are *in play*:
   their positions go to the row's list ``P``.
3. **finish** ``grid (Q,)``: one program a row picks the still-needed winners among the ``m``
   candidates of ``P`` (``select_finish.finish_row``, shared with the row kernel: a radix
   select on the score key, then the id, then the position) and appends them to W. A cutoff
   bin of more candidates than the finish's registers hold (``FR2``: a mass tie, such as the
   ``-inf`` of a padded row) is first *narrowed*: the compact kernel also counts its
   candidates by a second digit, the score key's next ``HB`` bits, and by the id key's top
   ``HB`` bits below those every valid id of the row shares (the histogram kernel ORs the id
   keys and their complements); where every candidate in play has one score key (ORs of the
   keys and complements share no bit) the id digit applies, else the score digit. The
   finish's program then walks ``P`` once: candidates above the digit holding the last
   winner go to W, those in it stay in ``P`` (compacted in place), and the finish runs on
   those, mostly in registers, instead of several chunked passes over the whole bin. In rows
   of more than ``SPREAD_MIN`` candidates that walk runs over the row's programs instead
   (``_walk_kernel``, grid ``(Q, N / WALK_CHUNK)``, launched for every row: the compact
   kernel's first program of a row leaves it a gate word, the cutoff bin's size where it has
   work, else 0; kept candidates go to a second list ``P2``, and the row's last walk program
   runs the finish on it). Up to ``FUSE_MAX_ROWS`` rows there is no finish kernel: the last
   compact program of a row to finish (a CTA barrier, then one gpu-scope acq_rel ticket, the
   cooperative-groups grid-sync pattern without the wait) runs it.
4. **order**: ``radix.order_winners``: the rank kernel up to ``RANK_MAX_ROWS`` rows (binned W:
   each entry counts the entries of its own bin before it; the bins above give the rest),
   bucket rank beyond.

Compile time: ``N``, ``k`` and the strides are runtime arguments Triton does not specialise,
the radix passes are runtime loops, and the tile sizes come from a small fixed set (``plan``).

Workspace: one zeroed int32 ``[Q, 4096 + 8]`` (histogram, slot counters, the ticket, what the
ordering reads; binned: also the bins' slot counters and first slots, ``[Q, 3 * 4096 + 8]``,
layout in ``radix.ZCTRS``; then the narrowing's two histograms and counters, ``2 * 4096 + 8``:
``narrow_offset``) and one ``torch.empty`` for ``W`` (``KB`` winners a row, and room
for a ranked cutoff bin when binned), the winner counts and ``P`` (``[Q, N]`` int32); with
the spread walk, ``P2`` as large as ``P``.
``N = 0`` is answered on the host (all pads).

Measured on an H200: docs/benchmarks_select_kernel.md.

This module imports without Triton; its kernels exist only where Triton imports.
"""
from __future__ import annotations

import torch

from .select_compile import launch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    _HAVE_TRITON = False

__all__ = ["staged_select", "plan", "rank_layout", "finish_tiers", "workspace_layout", "narrow_offset", "play_slots",
           "HIST_BITS", "RANK_MAX_ROWS", "FUSE_MAX_ROWS"]

HIST_BITS = 12  # width of the first digit: 4096 bins of the global histogram
RANK_MAX_ROWS = 4  # up to this many rows the rank kernel orders the winners (radix.order_winners)
FUSE_MAX_ROWS = 3  # up to this many rows the last compact program finishes the row (no finish kernel)
FIN_TIERS = (1024, 4096)  # in-play candidates the finish holds in registers (the smaller that holds P)
# a cutoff bin of up to this many candidates the rank kernel ranks whole at one row (no finish;
# rank_layout). H200, N = 16384, a quarter of the row tied: ranking 4096 beat the finish at one
# row, 2048 at two, neither at four (docs/benchmarks_select_kernel.md)
RANK_PLAY = 4096
NARROW_CTRS = 8  # int32 counters after the narrowing's two histograms (_narrow_ctrs, _walk_kernel)
SPREAD_MIN = 16384  # rows of more candidates walk a narrowed cutoff bin over their programs (staged_select)
WALK_CHUNK = 4096  # slots of P a program of the walk kernel walks


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def rank_tile(q: int, kb: int, n_sm: int, binned: bool = False, rows=None) -> tuple[int, int]:
    """(rows, cols) of the rank kernel's tile of key comparisons for Q rows of KB winners
    (binned: each compared with its own bin only, a shorter range); ``rows`` overrides."""
    kb = next_pow2(kb)
    if rows is None:
        rows = min(256, max(8, next_pow2(-(-q * kb // (8 * n_sm)))))  # H200, 1 row: 8 rows a tile beat 16
    rows = min(int(rows), kb)
    return rows, max(16, min(kb, (2048 if binned else 8192) // rows))


def play_cap(kb: int) -> int:
    """The largest cutoff bin ranked whole by default for KB winners: ``RANK_PLAY``, or ``2 KB``
    for fewer winners (a bin of many candidates for few winners is the finish's work)."""
    return min(RANK_PLAY, 2 * kb)


def rank_layout(q: int, kb: int, order=None, rank_play=None) -> tuple[bool, int]:
    """(binned, rank_play) of the staged path. Where the rank kernel orders (``order`` "rank",
    or None and ``Q <= RANK_MAX_ROWS``) W is sorted by the first digit, each winner ranked in
    its bin only, and a cutoff bin of up to ``rank_play`` candidates is ranked whole, with no
    finish: default ``play_cap(KB)`` at one row, halved for two, quartered for 3-4 (ranking a
    bin costs its size squared, the finish runs the rows side by side); 0: never. Elsewhere
    neither."""
    binned = order == "rank" or (order is None and q <= RANK_MAX_ROWS)
    if rank_play is None:
        return binned, (play_cap(kb) >> (max(1, int(q)) - 1).bit_length()) if binned else 0
    pr = int(rank_play)
    if pr < 0 or (pr and (not binned or pr & (pr - 1))):
        raise ValueError(f"rank_play must be 0 or a power of two, with the rank ordering; got {rank_play}")
    return binned, pr


def finish_tiers(binned: bool, pr: int, fr2: int = FIN_TIERS[1]) -> tuple[int, int]:
    """(FR1, FR2): the finish's register tiers. No first tier (0) where the rank ordering ranks
    every cutoff bin it would hold whole (``rank_play`` at least ``FIN_TIERS[0]``): no row
    reaches it, and its code is not compiled (about a fifth of the compact kernel's)."""
    fr1 = min(FIN_TIERS[0], fr2)
    return (0 if binned and pr >= fr1 else fr1), fr2


def play_slots(n: int) -> int:
    """int32 slots of a row of the staged path's in-play list P: ``n`` positions, then ``n``
    ids (the compact kernel writes both; ``select_finish.finish_row`` ``PIDS`` reads them)."""
    return 2 * n


def narrow_offset(binned: bool) -> int:
    """Where the narrowing's part of a zeroed workspace row starts (``ZN``): after the first
    digit's histogram and counters (and, binned, the bins' counters and first slots). It holds
    the two narrowing histograms (the score key's second digit, the id key's top digit) and
    ``NARROW_CTRS`` counters (``_narrow_ctrs``)."""
    nb = 1 << HIST_BITS
    return (3 * nb if binned else nb) + ZCTRS.value


def workspace_layout(k: int, n: int, binned: bool, pr: int, narrow: bool = True) -> tuple[int, int, int]:
    """(W's row stride, the zeroed workspace's row, the rank kernel's slots a row) for ``k``
    winners of ``n`` candidates: with a binned W, room for a whole cutoff bin (one stride for
    every ``rank_play`` up to ``play_cap``: it is a runtime value, one compiled kernel) and the
    bins' counters and first slots (``radix.ZCTRS``: the layout); the rank kernel covers W's
    entries (at most KB + rank_play, and at most n) and the k outputs. ``narrow``: room for
    the narrowing of a mass cutoff bin (``narrow_offset``)."""
    kb = max(2, next_pow2(k))
    nb = 1 << HIST_BITS
    zs = narrow_offset(binned) + ((2 * nb + NARROW_CTRS) if narrow else 0)
    if not binned:
        return kb, zs, kb
    return kb + max(pr, play_cap(kb)), zs, max(k, min(kb + pr, n))


def plan(q: int, n: int, kb: int, n_sm: int, ca=None, fuse=None, fin_warps=None) -> tuple:
    """(ca, fuse, fin_warps): the staged path's tile class for Q rows of n candidates.

    ``ca``: candidates a program of the histogram and compact kernels, 512 or 4096 (a few
    programs an SM); ``fuse``: the finish runs in the compact kernel's last program of a row;
    ``fin_warps``: warps of the finish, 16 for rows of more than 32768 candidates (a mass tie
    puts a quarter of such a row in play: H200, 131072 tied candidates, 0.27 against 0.33 ms
    with 8 warps), else 8.
    """
    if ca is None:
        ca = 512 if q * n <= (1 << 20) else 4096
    ca = min(int(ca), max(16, next_pow2(n)))
    if fuse is None:  # H200: fused 0.025 vs 0.030 ms at 1 row; from 8 rows the separate kernel is faster
        fuse = q <= FUSE_MAX_ROWS
    if fin_warps is None:
        fin_warps = 16 if n > 32768 else 8
    return int(ca), bool(fuse), int(fin_warps)


if _HAVE_TRITON:
    from .radix import (ZCTRS, Z_ABOVE, Z_PSLOT, Z_TICKET, Z_USED, Z_WSLOT, bit_length, generic_jit, load_chunk,
                        pick_digit, put_winners, score_key, top_digit, z_bin_firsts, z_bin_slots)
    from .select_finish import finish_row

    @triton.jit
    def _or(a, b):
        return a | b

    @triton.jit
    def _min_max(a, b, c, d):
        return tl.minimum(a, c), tl.maximum(b, d)

    @triton.jit
    def _narrow_ctrs(z_row, ZN: tl.constexpr, HB: tl.constexpr):
        # the narrowing's counters: OR of the in-play score keys, OR of their complements (every
        # in-play key equal: no bit in both), the same two of the row's valid id keys; then
        # _walk_kernel's: W slots, P2 slots, its ticket, the gate (the cutoff bin's size)
        return z_row + ZN + (2 << HB)

    @triton.jit
    def _id_digit(oc, HB: tl.constexpr):
        # (shift, mask) of the id key's top digit: the HB bits below the highest bit in which
        # the row's valid id keys differ (the bits above it are the same in every one)
        top = bit_length((tl.load(oc + 2) & tl.load(oc + 3) & 0x7FFFFFFF).to(tl.int64)).to(tl.int32)
        w = tl.minimum(top, HB)
        return top - w, (1 << w) - 1

    @triton.jit
    def _play_digits(s, v, shv, mv, HB: tl.constexpr):
        # the narrowing's digits of in-play candidates: the score key's second HB bits (the
        # first are the cutoff bin's), the id key's top digit
        return (s >> (32 - 2 * HB)) & ((1 << HB) - 1), (v >> shv) & mv

    @triton.jit
    def _narrow_hist(z_row, s, v, cut, npl, ZN: tl.constexpr, HB: tl.constexpr):
        # a compact program's in-play candidates (mask cut, npl of them) into the narrowing's
        # histograms and counters. A pure tie (every candidate one score key, one digit)
        # adds one count, not npl to one address
        hs = z_row + ZN
        oc = _narrow_ctrs(z_row, ZN, HB)
        shv, mv = _id_digit(oc, HB)
        sd, vd = _play_digits(s, v, shv, mv, HB)
        lo = tl.min(tl.where(cut, sd, 1 << HB), 0)
        hi = tl.max(tl.where(cut, sd, -1), 0)
        if lo == hi:
            tl.atomic_add(hs + lo, npl, sem="relaxed")
        else:
            tl.atomic_add(hs + sd, tl.full(sd.shape, 1, tl.int32), mask=cut, sem="relaxed")
        tl.atomic_add(hs + (1 << HB) + vd, tl.full(vd.shape, 1, tl.int32), mask=cut, sem="relaxed")
        tl.atomic_or(oc, tl.reduce(tl.where(cut, s, 0), 0, _or), sem="relaxed")
        tl.atomic_or(oc + 1, tl.reduce(tl.where(cut, ~s, 0), 0, _or), sem="relaxed")

    @triton.jit
    def _narrow_digit(z_row, need, ZN: tl.constexpr, HB: tl.constexpr):
        # from the narrowing's histograms (of the second score digit, or, where every in-play
        # candidate has one score key, of the id key's top digit): the digit dd holding the
        # last winner, the candidates above it and in it, whether all of those are wanted, and
        # what a walk over P needs (pure tie, id digit, the tie's score bits unless NaN)
        oc = _narrow_ctrs(z_row, ZN, HB)
        sk = tl.load(oc)  # (a pure tie: its one score key)
        pure = (sk & tl.load(oc + 1)) == 0
        shv, mv = _id_digit(oc, HB)
        NB: tl.constexpr = 1 << HB
        h = tl.load(z_row + ZN + pure.to(tl.int32) * NB + tl.arange(0, NB))
        dd, above_d, cnt = pick_digit(h, need, NB)
        take = (need - above_d) == cnt  # every candidate of the digit wanted: no finish
        # a pure tie's score bits follow from its one key, but for NaN (payloads differ)
        gather = (pure == 0) | (sk == -2147483647)
        bk = tl.where(sk >= 0, sk, sk ^ 0x7FFFFFFF)
        return pure, shv, mv, dd, above_d, cnt, take, gather, bk

    @triton.jit
    def _walk_chunk(sc_row, o, i, j, m, pure, shv, mv, dd, take, gather, bk, HB: tl.constexpr):
        # the candidates at slots j of P (positions o, ids i): winners (above the digit dd, or
        # in it when all of it is wanted) and kept (in it), their score bits and keys, and one
        # inclusive scan of both counts (winners in the low 16 bits, kept in the high)
        mj = j < m
        b = tl.load(sc_row + o, mask=mj & (j * 0 + pure.to(tl.int32) == 0), other=0.0).to(tl.int32, bitcast=True)
        s = score_key(b, i)
        v = 2147483647 - i
        sd, vd = _play_digits(s, v, shv, mv, HB)
        d = tl.where(pure, vd, sd)
        take_t = (j * 0 + take.to(tl.int32)) != 0  # (tensor masks: a scalar bool in a mask trips the interpreter)
        win = mj & ((d > dd) | (take_t & (d == dd)))
        if pure:  # the winners' score bits
            b = tl.where(gather, tl.load(sc_row + o, mask=win & (j * 0 + gather.to(tl.int32) != 0),
                                         other=0.0).to(tl.int32, bitcast=True), bk)
            s = score_key(b, i)
        keep = mj & (d == dd) & (take_t == 0)
        x = tl.cumsum(win.to(tl.int32) + (keep.to(tl.int32) << 16), 0)
        return win, keep, b, s, v, x

    @triton.jit(noinline=True)  # (noinline: select_kernel's docstring, Compile time)
    def _narrow_play(sc_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, z_row, row, N, s_sq, nsel, above, m,
                     KB: tl.constexpr, CH: tl.constexpr, ZN: tl.constexpr, HB: tl.constexpr):
        # one program, before the finish of a cutoff bin of m > FR2 candidates: the candidates
        # above the narrowing digit go to W (from slot above), those in it stay in P (compacted
        # in place), the rest lose. One walk over P; returns the finish's (above, m).
        need = nsel - above
        pure, shv, mv, dd, above_d, cnt, take, gather, bk = _narrow_digit(z_row, need, ZN, HB)
        above2 = above
        m2 = m
        if cnt < m:
            sc_row = sc_ptr + row * s_sq
            p_row = p_ptr + row * (2 * N)
            base = above
            pb = need * 0
            j = tl.arange(0, CH)
            o = tl.load(p_row + j, mask=j < m, other=0, cache_modifier=".cg")  # P: written by other programs
            i = tl.load(p_row + N + j, mask=j < m, other=0, cache_modifier=".cg")
            for c0 in range(0, m, CH):
                j = c0 + tl.arange(0, CH)
                # the next chunk's reads, in flight meanwhile (this chunk writes below c0 + CH only)
                o_n = tl.load(p_row + j + CH, mask=j + CH < m, other=0, cache_modifier=".cg")
                i_n = tl.load(p_row + N + j + CH, mask=j + CH < m, other=0, cache_modifier=".cg")
                win, keep, b, s, v, x = _walk_chunk(sc_row, o, i, j, m, pure, shv, mv, dd, take, gather, bk, HB)
                put_winners(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, base + (x & 0xFFFF) - 1, win, s,
                            v, b, o)
                slot = pb + (x >> 16) - 1  # <= j: a chunk is read before it is written
                tl.store(p_row + slot, o, mask=keep)
                tl.store(p_row + N + slot, i, mask=keep)
                t = tl.max(x, 0)  # (the inclusive scan's last: both totals)
                base += t & 0xFFFF
                pb += t >> 16
                o = o_n
                i = i_n
            tl.debug_barrier()  # P and W, written by the program's threads, read by others in the finish
            above2 = base
            m2 = pb
        return above2, m2

    @generic_jit
    def _walk_kernel(sc_ptr, id_ptr, z_ptr, p_ptr, p2_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, N, s_sq, s_iq,
                     HB: tl.constexpr, ZS: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr,
                     FR1: tl.constexpr, FR2: tl.constexpr, ZN: tl.constexpr, WCH: tl.constexpr):
        # grid (Q, S), the narrowing spread over the row's programs (``spread``): each walks WCH
        # slots of P, its winners to W and its kept candidates to P2 (slots from one atomic
        # each a chunk); the last program of the row (a CTA barrier, then one gpu-scope acq_rel
        # ticket; nobody waits) runs the finish on P2. Rows the compact kernel did not count
        # for narrowing (a cutoff bin ranked, taken whole, or within the finish's registers)
        # return at once: their finish runs where it did. The compact kernel's first program of
        # the row left the cutoff bin's size in counter 7 where the walk is needed (else 0), and
        # the winners wanted and above it, so a program reads three words, not the histogram.
        row = tl.program_id(0).to(tl.int64)
        z_row = z_ptr + row * ZS
        oc = _narrow_ctrs(z_row, ZN, HB)
        m = tl.load(oc + 7)
        nsel = tl.load(cnt_ptr + row)
        above = tl.load(z_row + (1 << HB) + Z_ABOVE)
        need = nsel - above
        if m > 0:
            pure, shv, mv, dd, above_d, cnt, take, gather, bk = _narrow_digit(z_row, need, ZN, HB)
            if cnt < m:
                sc_row = sc_ptr + row * s_sq
                p_row = p_ptr + row * (2 * N)
                q_row = p2_ptr + row * (2 * N)
                lim = tl.minimum(m, (tl.program_id(1) + 1) * WCH)  # this program's slots of P end here
                for c0 in range(tl.program_id(1) * WCH, lim, CH):
                    j = c0 + tl.arange(0, CH)
                    o = tl.load(p_row + j, mask=j < lim, other=0, cache_modifier=".cg")  # written by the compact kernel
                    i = tl.load(p_row + N + j, mask=j < lim, other=0, cache_modifier=".cg")
                    win, keep, b, s, v, x = _walk_chunk(sc_row, o, i, j, lim, pure, shv, mv, dd, take, gather, bk, HB)
                    t = tl.max(x, 0)
                    if (t & 0xFFFF) > 0:
                        wb = above + tl.atomic_add(oc + 4, t & 0xFFFF, sem="relaxed")
                        put_winners(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, wb + (x & 0xFFFF) - 1,
                                    win, s, v, b, o)
                    if (t >> 16) > 0:
                        slot = tl.atomic_add(oc + 5, t >> 16, sem="relaxed") + (x >> 16) - 1
                        tl.store(q_row + slot, o, mask=keep)
                        tl.store(q_row + N + slot, i, mask=keep)
                tl.debug_barrier()
                ticket = tl.atomic_add(oc + 6, 1, sem="acq_rel", scope="gpu")
                if ticket == tl.num_programs(1) - 1:
                    a2 = above + above_d + tl.where(take, cnt, 0)
                    finish_row(sc_ptr, id_ptr, p2_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel, a2,
                               tl.where(take, 0, cnt), KB, D, CH, FR1, FR2, 0, True)
            elif tl.program_id(1) == 0:  # one digit holds the whole bin: the finish on P as it is
                finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel, above, m,
                           KB, D, CH, FR1, FR2, 0, True)

    @triton.jit
    def _cutoff(z_row, K, HB: tl.constexpr):
        # from the row's histogram: winners wanted, the cutoff bin, winners above it, and how
        # many candidates the cutoff bin holds (the same scan in every program that needs it)
        h = tl.load(z_row + tl.arange(0, 1 << HB))
        nsel = tl.minimum(tl.sum(h, 0), K)
        dstar, above, m = pick_digit(h, nsel, 1 << HB)
        return h, nsel, dstar, above, m

    @generic_jit
    def _hist_kernel(sc_ptr, id_ptr, z_ptr, N, s_sq, s_iq, CA: tl.constexpr, HB: tl.constexpr, ZS: tl.constexpr,
                     ZN: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        b, i = load_chunk(sc_ptr + row * s_sq, id_ptr + row * s_iq, tl.program_id(1) * CA, N, CA)
        s = score_key(b, i)
        ones = tl.full([CA], 1, tl.int32)
        valid = s != -2147483648
        d = top_digit(s, HB)
        # few distinct bins (a mass tie: a padded row's -inf, a few tied scores) would put
        # thousands of atomics on one address, which serialise in L2: the program's lowest and
        # highest bins take one count each, again on the rest while those held an eighth of it
        z_row = z_ptr + row * ZS
        rest = valid
        go = tl.full((), 1, tl.int1)  # (a scalar tensor: the loop reassigns it)
        r = 0
        while go:
            lo, hi = tl.reduce((tl.where(rest, d, 1 << HB), tl.where(rest, d, -1)), 0, _min_max)
            c = tl.sum(tl.where(rest & (d == lo), 1, 0) + tl.where(rest & (d == hi) & (hi != lo), 1 << 16, 0), 0)
            if c > 0:
                tl.atomic_add(z_row + lo, c & 0xFFFF, sem="relaxed")
                if hi != lo:
                    tl.atomic_add(z_row + hi, c >> 16, sem="relaxed")
            rest = rest & (d != lo) & (d != hi)
            r += 1
            go = (r < 4) & (((c & 0xFFFF) + (c >> 16)) * 8 > CA)
        tl.atomic_add(z_row + d, ones, mask=rest, sem="relaxed")
        if ZN > 0:  # the bits in which the row's valid id keys differ (the narrowing's id digit)
            v = 2147483647 - i
            oc = _narrow_ctrs(z_row, ZN, HB)
            tl.atomic_or(oc + 2, tl.reduce(tl.where(valid, v, 0), 0, _or), sem="relaxed")
            tl.atomic_or(oc + 3, tl.reduce(tl.where(valid, ~v, 0), 0, _or), sem="relaxed")

    @generic_jit
    def _compact_kernel(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, N, K, s_sq, s_iq, play_max,
                        CA: tl.constexpr, HB: tl.constexpr, ZS: tl.constexpr, KB: tl.constexpr,
                        FUSED: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, FR1: tl.constexpr,
                        FR2: tl.constexpr, BINNED: tl.constexpr, ZN: tl.constexpr, SPREAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        z_row = z_ptr + row * ZS
        NB: tl.constexpr = 1 << HB
        h, nsel, dstar, above, m = _cutoff(z_row, K, HB)
        need = nsel - above
        # the rank kernel ranks a cutoff bin of up to play_max candidates whole: no finish for the row
        ranked = (need < m) & (m <= play_max)
        keep = ranked | (need == m)  # the cutoff bin's candidates go to W whole (else to P)
        if BINNED:  # every bin's first slot in W: the candidates in the bins above it
            firsts = tl.cumsum(h, 0, reverse=True) - h
        if tl.program_id(1) == 0:  # what the ordering reads: winners, entries of W, winners above
            tl.store(cnt_ptr + row, nsel)
            tl.store(z_row + NB + Z_USED, tl.where(ranked, above + m, nsel))
            tl.store(z_row + NB + Z_ABOVE, above)
            if BINNED:
                tl.store(z_bin_firsts(z_row, NB) + tl.arange(0, NB), firsts)
            if SPREAD:  # the walk kernel's gate: the cutoff bin's size where it walks the row, else 0
                tl.store(_narrow_ctrs(z_row, ZN, HB) + 7, tl.where((keep == 0) & (m > FR2), m, 0))
        o = tl.program_id(1) * CA + tl.arange(0, CA)
        b, i = load_chunk(sc_ptr + row * s_sq, id_ptr + row * s_iq, tl.program_id(1) * CA, N, CA)
        s = score_key(b, i)
        d = top_digit(s, HB)
        v = 2147483647 - tl.maximum(i, 0)
        valid = s != -2147483648
        win = valid & (d > dstar)  # winners above the cutoff bin
        wi = win.to(tl.int32)
        nw = tl.sum(wi, 0)
        if BINNED:  # sorted by bin: the bin's first slot plus a slot in it
            if nw > 0:
                slot = tl.gather(firsts, d, 0) + tl.atomic_add(z_bin_slots(z_row, NB) + d, tl.full([CA], 1, tl.int32),
                                                               mask=win, sem="relaxed")
                put_winners(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, slot, win, s, v, b, o)
        else:  # in any order: one atomic a program, a prefix sum
            if nw > 0:
                base = tl.atomic_add(z_row + NB + Z_WSLOT, nw, sem="relaxed")
                put_winners(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, base + tl.cumsum(wi, 0) - 1,
                            win, s, v, b, o)
        cut = valid & (d == dstar)
        ci = cut.to(tl.int32)
        npl = tl.sum(ci, 0)
        if npl > 0:
            pbase = tl.atomic_add(z_row + NB + Z_PSLOT, npl, sem="relaxed")
            if keep:  # whole records after the winners above the cutoff bin
                put_winners(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB,
                            above + pbase + tl.cumsum(ci, 0) - 1, cut, s, v, b, o)
            else:  # in play: positions to P, and their ids N slots after them (the finish reads
                # those, not the ids by position)
                ps = p_ptr + row * (2 * N) + pbase + tl.cumsum(ci, 0) - 1
                tl.store(ps, o, mask=cut)
                tl.store(ps + N, i, mask=cut)
                if ZN > 0:
                    if m > FR2:  # more than the finish's registers hold: histograms to narrow it
                        _narrow_hist(z_row, s, v, cut, npl, ZN, HB)
        if FUSED:
            if keep == 0:  # (ranked, or the whole bin taken: nothing to finish)
                # the last program of the row to get here finishes it: a CTA barrier, then one
                # gpu-scope acq_rel ticket (the cooperative-groups grid-sync pattern) makes every
                # program's P and W writes visible to it; nobody waits, so nothing can hang
                tl.debug_barrier()
                ticket = tl.atomic_add(z_row + NB + Z_TICKET, 1, sem="acq_rel", scope="gpu")
                # (spread: the walk kernel finishes a row counted for narrowing)
                if (ticket == tl.num_programs(1) - 1) & ((SPREAD == 0) | (m <= FR2)):
                    # the cutoff scan above holds for the whole row: the finish reuses it
                    if ZN > 0:
                        if m > FR2:
                            above, m = _narrow_play(sc_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, z_row, row, N, s_sq, nsel,
                                                    above, m, KB, CH, ZN, HB)
                    finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq,
                               nsel, above, m, KB, D, CH, FR1, FR2, 0, True)

    @generic_jit
    def _finish_kernel(sc_ptr, id_ptr, z_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, N, K, s_sq, s_iq, play_max,
                       HB: tl.constexpr, ZS: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr,
                       FR1: tl.constexpr, FR2: tl.constexpr, ZN: tl.constexpr, SPREAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        z_row = z_ptr + row * ZS
        h, nsel, dstar, above, m = _cutoff(z_row, K, HB)
        # (else the rank kernel ranks the cutoff bin whole; spread: the walk kernel finishes a
        # row counted for narrowing)
        if ((nsel - above >= m) | (m > play_max)) & ((SPREAD == 0) | (nsel - above >= m) | (m <= FR2)):
            if ZN > 0:
                if (nsel - above < m) & (m > FR2):  # (as the compact kernel decided: its histograms)
                    above, m = _narrow_play(sc_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, z_row, row, N, s_sq, nsel, above,
                                            m, KB, CH, ZN, HB)
            finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel, above, m,
                       KB, D, CH, FR1, FR2, 0, True)


def staged_select(scores: torch.Tensor, ids: torch.Tensor, k: int, out_ids: torch.Tensor, out_sc: torch.Tensor,
                  n_sm: int, *, ca=None, fin_chunk=None, fin_warps=None, fin_resident=None, rank_rows=None,
                  order=None, fuse=None, radix_bits: int = 5, rank_play=None, rank_cols=None, narrow: bool = True,
                  spread=None, walk_chunk=None):
    """Fill ``out_ids``/``out_sc`` ``[Q, k]`` with the ordered top ``k`` of each row.

    Inputs are validated by the caller (``select_kernel.triton_ordered_select``): fp32
    ``scores`` and int32 ``ids`` ``[Q, N]`` with unit stride along N, ``Q >= 1``. Tuning
    options (defaults: ``plan``): ``ca``, ``fuse``; the finish's ``fin_chunk``
    (candidates of ``P`` a step), ``fin_warps``, ``fin_resident`` (its largest register tier),
    ``radix_bits``; ``order``: ``radix.order_winners``; ``rank_rows`` and ``rank_cols``: the
    rank kernel's tile (default ``rank_tile``); ``rank_play``: ``rank_layout``; ``narrow``
    (default on): a cutoff bin of more candidates than the finish's registers hold is first
    narrowed by one more digit (module docstring, step 3); ``spread`` (default: rows of more
    than ``SPREAD_MIN``): that walk runs in a kernel of its own, over the row's programs, and
    its last program finishes the row (one more launch for every row); ``walk_chunk``: slots of
    P a program of that walk takes (default ``WALK_CHUNK``).
    """
    from .radix import order_winners, winner_workspace

    q, n = scores.shape
    if n == 0:  # no candidates: no program would run to count the winners; all pads
        out_ids.fill_(-1)
        out_sc.fill_(float("-inf"))
        return out_ids, out_sc
    kb = max(2, next_pow2(k))
    if not 2 <= int(radix_bits) <= 8:
        raise ValueError(f"radix_bits must be in 2..8, got {radix_bits}")
    fr2 = FIN_TIERS[1] if fin_resident is None else int(fin_resident)
    if fr2 < 16 or fr2 & (fr2 - 1):
        raise ValueError(f"fin_resident must be a power of two >= 16, got {fr2}")
    ca, fuse, fw = plan(q, n, kb, n_sm, ca, fuse, fin_warps)
    binned, pr = rank_layout(q, kb, order, rank_play)
    fr1, fr2 = finish_tiers(binned, pr, fr2)
    wb, zs, span = workspace_layout(k, n, binned, pr, bool(narrow))
    zn = narrow_offset(binned) if narrow else 0
    spread = bool(narrow) and (n > SPREAD_MIN if spread is None else bool(spread))
    wch = WALK_CHUNK if walk_chunk is None else int(walk_chunk)
    if wch < 16 or wch & (wch - 1):
        raise ValueError(f"walk_chunk must be a power of two >= 16, got {walk_chunk}")
    nw_a = max(1, min(8, ca // 256))
    ch = 2048 if fin_chunk is None else int(fin_chunk)
    if not 16 <= ch <= 32768 or ch & (ch - 1):  # (the narrowing counts a chunk's two lists in 16-bit halves)
        raise ValueError(f"fin_chunk must be a power of two in 16..32768, got {fin_chunk}")
    dev = scores.device
    z = torch.zeros((q, zs), dtype=torch.int32, device=dev)
    wk, wv, wo, cnt, pl = winner_workspace(q, wb, play_slots(n), dev)
    # (spread: the walk's kept candidates, laid out as P)
    p2 = torch.empty((q * play_slots(n),), dtype=torch.int32, device=dev) if spread else pl
    grid_a = (q, -(-n // ca))
    fin = dict(HB=HIST_BITS, ZS=zs, KB=wb, D=int(radix_bits), CH=ch, FR1=fr1, FR2=fr2, ZN=zn)
    sp = dict(SPREAD=spread)
    launch(_hist_kernel, grid_a, scores, ids, z, n, scores.stride(0), ids.stride(0), CA=ca, HB=HIST_BITS, ZS=zs,
           ZN=zn, num_warps=nw_a)
    launch(_compact_kernel, grid_a, scores, ids, z, pl, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0), pr,
           CA=ca, FUSED=fuse, BINNED=binned, num_warps=fw if fuse else nw_a, **fin, **sp)
    if spread:
        launch(_walk_kernel, (q, -(-n // wch)), scores, ids, z, pl, p2, wk, wv, wo, cnt, n, scores.stride(0),
               ids.stride(0), WCH=wch, num_warps=fw, **fin)
    if not fuse:
        launch(_finish_kernel, (q,), scores, ids, z, pl, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0), pr,
               num_warps=fw, **fin, **sp)
    sl, jb = rank_tile(q, kb, n_sm, binned, rank_rows)  # (from the winners, not W's stride)
    if rank_cols is not None:
        jb = int(rank_cols)
    return order_winners(wk, wv, wo, cnt, out_ids, out_sc, k, wb, n_sm, order, (sl, jb),
                         binned=(z, zs, HIST_BITS) if binned else None, span=span, scores=scores)
