"""Where the time of the row kernel goes, phase by phase, and bench-only variants of it (H200).

    python bench/bench_row_phases.py --out phases.json [--q 64 256 1024 4096] [--n 16384]
    python bench/bench_row_phases.py --ptx      # no GPU: PTX instructions a thread, phase by phase

The bench kernel ``_row_prefix_kernel`` is the row kernel of ``ops/select_kernel.py`` (the
resident tile) built from the same helpers, stopped after phase ``STOP`` (0 load and score key,
2 the cutoff prefix, 3 compaction, 4 finish, 5 ordering = the whole kernel; 1, the first of
the two histogram passes, only for ``hist``); each prefix writes what it computed, so nothing
is dead code. Differences between prefixes (CUDA-graph replay) are the phases' costs. Like
the production kernel (since session 14 of 2026-12-03), a cutoff bin beyond
``select_kernel.refine_min`` is refined on the tile in phase 4 (``refine_row``), and the
ordering zeroes its bucket sizes early (16384 tile) and maps in parts at once after a refinement
(8192 tile, since session 16; by groups of atomic adds in sessions 14-15), so a mass tie (``--patterns short``) times the production kernel's phases; up to session
13 the bench kernel sent every bin to the finish (variant ``norefine``), and its ``short``
phases did not add up to the production kernel's time.
Variants (bench only; each full kernel is checked bit for bit against the production kernel):

* ``norefine``: every cutoff bin to the finish (its chunks beyond its registers), no
  refinement compiled, the ordering's zeroing and first level its own (the bench kernel up to
  session 13; its cubin at the finish the same size as that kernel's on today's helpers);

* ``hist``: the cutoff prefix from two 6-bit ``tl.histogram`` passes (production up to
  f08fc80) where the production kernel bisects (``select_kernel.cutoff_search``);
* ``halving``: the bisection's counts compare the score keys (``cutoff_search_halving``,
  production up to session 7 of 2026-12-02) where production compares pairs of 12-bit
  prefixes packed in an int32;
* ``scratch``: ``order_row_scratch``, the ordering through global scratch (production up to
  f08fc80) where ``radix.order_row`` gathers from registers; ``f08fc80``: both;
* ``sub4``, ``sub8``: ``radix.order_row``'s second level from buckets of more than 4 or 8
  winners (production: ``radix.SPLIT`` = 16), so the in-bucket count takes fewer steps;
* ``scan1d``: the compaction's slots from one prefix sum over the whole tile (the production
  kernel before ``radix.scan_slots``);
* ``split*``: the row kernel stops after the finish and a kernel of its own orders the winners
  (``radix.order_row``), with ``split_warps`` warps and a register cap ``maxnreg`` (two or more
  programs an SM);
* ``ostops``: the ordering stopped after each of its sub-phases (``order_row_v``: bucket sizes
  and slots, offsets, member lists, in-bucket count, output), from the finish on; ``lkeys``,
  ``scatter``, ``wvload``, ``twokey``, ``s6before`` (the ordering up to session 6 of
  2026-12-02): ``order_row_v``'s flags; ``hilo1``, ``zfirst``, ``histc``, ``bv_all``:
  ``bucket_counts_v``'s (timed in session 7: ``hilo1`` and ``zfirst`` within 0.3 % of
  production, ``histc`` 2.3x slower; none kept).

Measured and dropped (records ``bench/results/select_kernel_h200_phases_ed6e841-*.json``, the
code in docs/benchmarks_select_kernel.md): a tile of score keys only (ids re-read by position),
bucket lists of keys instead of indices, ``tl.sort`` of the packed keys, [R, C] tiles loaded as
2-D, 32 warps.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_select_kernel import make_inputs, time_graph  # noqa: E402

from tpflare.ops import select_kernel as sk, select_staged as st  # noqa: E402
from tpflare.ops.radix import (ORDER_SCRATCH, SPLIT, bit_length, bucket_counts, bucket_kernel,  # noqa: E402
                               generic_jit, key_id, load_chunk, nan_key, offsets_sizes, order_row, part_counts, pick_digit,
                               put_winners, rank_in_bucket, score_key, score_bits, split_buckets, top_digit,
                               winner_workspace, write_ordered)
from tpflare.ops.select_finish import finish_row  # noqa: E402

ORDER_NB = tl.constexpr(sk.ORDER_BUCKETS)  # the production ordering's buckets, in units of KB


@triton.jit
def compact_scan1d(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row):
    # select_kernel.compact_tile with its slots from one prefix sum over the whole tile
    u = top_digit(s, 12)
    valid = s != -2147483648
    on = valid & (u == P)
    whole = (u * 0 + all_in) != 0
    win = valid & ((u > P) | (on & whole))
    play = on & (whole == 0)
    incl = tl.cumsum(win.to(tl.int32) + (play.to(tl.int32) << 16), 0)
    put_winners(wk_row, wv_row, wo_row, (incl & 0xFFFF) - 1, win, s, 2147483647 - tl.maximum(i, 0), b, o)
    tl.store(p_row + (incl >> 16) - 1, o, mask=play)


@triton.jit
def write_ranked(wv_row, oid_row, osc_row, key, live, j, dest, K):
    # radix.write_ordered as it was up to session 6 of 2026-12-02: ids and score bits (from W)
    # stored at the winners' ranks, scattered
    val = tl.load(wv_row + j, mask=live, other=-8388608)
    mk = dest < K
    tl.store(oid_row + dest, tl.where(live, key_id(key), -1).to(tl.int32), mask=mk)
    tl.store(osc_row + dest, tl.where(live, val, -8388608).to(tl.float32, bitcast=True), mask=mk)


@triton.jit
def write_ordered_vals(oid_row, osc_row, key, val, j, dest, nsel, inv, K, KB: tl.constexpr):
    # radix.write_ordered as it was up to session 12 of 2026-12-03: each winner's score bits
    # (val) computed in its lane, then gathered with its key (the WVLOAD variants read them from W)
    tl.debug_barrier()
    tl.store(inv + dest, j)
    tl.debug_barrier()
    src = tl.minimum(tl.maximum(tl.load(inv + j, cache_modifier=".cg"), 0), KB - 1)
    ks = tl.gather(key, src, 0)
    vs = tl.gather(val, src, 0)
    ls = j < nsel
    mk = j < K
    tl.store(oid_row + j, tl.where(ls, key_id(ks), -1).to(tl.int32), mask=mk)
    tl.store(osc_row + j, tl.where(ls, vs, -8388608).to(tl.float32, bitcast=True), mask=mk)


@triton.jit
def order_row_scratch(wk_row, wv_row, wo_row, nsel, z_row, oid_row, osc_row, K, KB: tl.constexpr):
    # radix.order_row as it was up to f08fc80: the (sub-)buckets' offsets and sizes, and the
    # members' keys and positions in the in-bucket count, through global scratch (a store, a
    # barrier and loads; two dependent L2 round trips a step of the count)
    j, live, key, o, bkt, slot, c, _ = bucket_counts(wk_row, wo_row, nsel, z_row, KB, KB, False)
    tl.store(z_row + KB + j, tl.cumsum(c, 0) - c)
    big = tl.max(c, 0)
    tl.debug_barrier()
    off = tl.load(z_row + KB + bkt, mask=live, other=0, cache_modifier=".cg")
    cb = tl.load(z_row + bkt, mask=live, other=0, cache_modifier=".cg")
    if big > SPLIT:
        sub, slot, cc = split_buckets(key, live, off, cb, slot, j, z_row, KB)
        o2 = z_row + 4 * KB
        tl.store(o2 + j, tl.cumsum(cc, 0) - cc)
        big = tl.max(cc, 0)
        tl.debug_barrier()
        cb = tl.load(z_row + 3 * KB + sub, mask=live, other=0, cache_modifier=".cg")
        off = tl.load(o2 + sub, mask=live, other=0, cache_modifier=".cg")
    r = tl.zeros([KB], dtype=tl.int32)
    if big > 1:
        lst = z_row + 2 * KB
        tl.store(lst + off + slot, j, mask=live)
        tl.debug_barrier()
        for t in range(0, big):
            mt = live & (t < cb)
            jo = tl.load(lst + off + t, mask=mt, other=0, cache_modifier=".cg")
            ko = tl.load(wk_row + jo, mask=mt, other=-1)
            oo = tl.load(wo_row + jo, mask=mt, other=0)
            r += (mt & ((ko > key) | ((ko == key) & (oo < o)))).to(tl.int32)
    write_ranked(wv_row, oid_row, osc_row, key, live, j, tl.where(live, off + r, j), K)


@triton.jit
def _max_min(a_hi, a_lo, b_hi, b_lo):
    return tl.maximum(a_hi, b_hi), tl.minimum(a_lo, b_lo)


@triton.jit
def bucket_counts_v(wk_row, wo_row, nsel, z_row, KB: tl.constexpr, NB: tl.constexpr, HILO1: tl.constexpr,
                    ZFIRST: tl.constexpr, HISTC: tl.constexpr):
    # radix.bucket_counts with bench variants (order_row_v calls the production one when no flag
    # is set), prepared in session 6 of 2026-12-02, timed in session 7 (H200, records
    # select_kernel_h200_s7_phases_1_*: HILO1 and ZFIRST within 0.3 %, HISTC 2.3x slower):
    # HILO1: the keys' largest and smallest in one reduction (a tuple), not two;
    # ZFIRST: the bucket counters zeroed before those reductions, so their stores drain meanwhile;
    # HISTC: the bucket sizes from tl.histogram (shared memory), not from the counters after a
    #   barrier and an L2 round trip (the atomics still give each winner its slot).
    j = tl.arange(0, KB)
    live = j < nsel
    jb = tl.arange(0, NB)
    if ZFIRST:
        tl.store(z_row + jb, tl.zeros([NB], dtype=tl.int32))
    key = tl.load(wk_row + j, mask=live, other=-1)
    o = tl.load(wo_row + j, mask=live, other=0)
    if HILO1:
        hi, lo = tl.reduce((tl.where(live, key, -1), tl.where(live, key, 9223372036854775807)), 0, _max_min)
    else:
        hi = tl.max(tl.where(live, key, -1), 0)
        lo = tl.min(tl.where(live, key, 9223372036854775807), 0)
    sh = bit_length(tl.maximum(hi - lo, 0) // NB)
    bkt = tl.where(live, (hi - key) >> sh, 0).to(tl.int32)
    if not ZFIRST:
        tl.store(z_row + jb, tl.zeros([NB], dtype=tl.int32))
    tl.debug_barrier()
    slot = tl.atomic_add(z_row + bkt, tl.full([KB], 1, tl.int32), mask=live, sem="relaxed", scope="cta")
    if HISTC:
        c = tl.histogram(bkt, NB, mask=live)
    else:
        tl.debug_barrier()
        c = tl.load(z_row + jb, cache_modifier=".cg")
    return j, live, key, o, bkt, slot, c, lo


@triton.jit(noinline=True)
def order_row_v(wk_row, wv_row, wo_row, nsel, z_row, oid_row, osc_row, K, sc_row, KB: tl.constexpr,
                SPLIT_AT: tl.constexpr, NB: tl.constexpr, LKEYS: tl.constexpr, SCATTER: tl.constexpr,
                WVLOAD: tl.constexpr, TWOKEY: tl.constexpr, OSTOP: tl.constexpr, BV: tl.constexpr):
    # radix.order_row (flags 0: the production code, without the 8192 tile's parts first after a
    # refinement, PARTS) stopped after its sub-phase OSTOP (1 bucket
    # sizes and slots, 2 offsets (and the second level), 3 the member lists, 4 the in-bucket
    # count, 5 the output), and bench variants:
    # LKEYS: the members' packed keys and positions are stored once in bucket order (global
    #   scratch, read through L1) where production stores their indices and gathers keys and
    #   positions from registers (tl.gather: shared memory, barriers, each step of the count);
    #   a step of the count loads one key; positions are read only in a second count that runs
    #   when two winners share a packed key (duplicate ids, NaN scores).
    # SCATTER: ids and scores stored at the winners' ranks (write_ranked; production up to
    #   session 6 of 2026-12-02) where production writes the output row in order (coalesced:
    #   radix.write_ordered).
    # WVLOAD: the score bits from W (production up to session 6; the compaction stores them
    #   then) where production rebuilds them from the keys (radix.score_bits).
    # TWOKEY: each step of the in-bucket count gathers a key and a position (production up to
    #   session 6) where production gathers the key, and positions only in a second count where
    #   two winners share a key.
    # BV: bucket_counts_v's flags (bit 0 HILO1, bit 1 ZFIRST, bit 2 HISTC).
    if BV == 0:
        j, live, key, o, bkt, slot, c, lo = bucket_counts(wk_row, wo_row, nsel, z_row, KB, NB, False)
    else:
        j, live, key, o, bkt, slot, c, lo = bucket_counts_v(wk_row, wo_row, nsel, z_row, KB, NB, BV & 1, (BV >> 1) & 1,
                                                        (BV >> 2) & 1)
    if OSTOP == 1:
        tl.store(oid_row + j, slot + tl.sum(c, 0), mask=j < K)
    else:
        big = tl.max(c, 0)
        split = big > SPLIT_AT
        if split:  # (as production: the first level again, in parts)
            bkt, slot, c = part_counts(key, live, lo, nsel, z_row + 5 * KB, NB)
            big = tl.max(c, 0)
            split = big > SPLIT_AT
        off, cb = offsets_sizes(c, bkt, live)
        if split:
            tl.debug_barrier()
            sub, slot, cc = split_buckets(key, live, off, cb, slot, j, z_row, KB)
            big = tl.max(cc, 0)
            off, cb = offsets_sizes(cc, sub, live)
        if OSTOP == 2:
            tl.store(oid_row + j, off + cb + slot, mask=j < K)
        else:
            r = tl.zeros([KB], dtype=tl.int32)
            if LKEYS:
                lk = (z_row + 5 * KB).to(tl.pointer_type(tl.int64))  # (the second level's key ranges: read already)
                lp = z_row + 2 * KB
                if big > 1:
                    tl.debug_barrier()  # (part_counts' sizes, which others may still read, share lk's scratch)
                    tl.store(lk + off + slot, key, mask=live)
                    tl.store(lp + off + slot, o, mask=live)
                    tl.debug_barrier()
                    if OSTOP == 3:
                        tl.store(oid_row + j, off + cb, mask=j < K)
                    else:
                        eq = tl.zeros([KB], dtype=tl.int32)
                        for t in range(0, big):
                            mt = live & (t < cb)
                            at = tl.minimum(off + t, KB - 1)
                            ko = tl.load(lk + at, mask=mt, other=-1)  # (a live key is >= 0)
                            r += (ko > key).to(tl.int32)
                            eq += (ko == key).to(tl.int32)
                        if tl.max(eq, 0) > 1:  # a packed key twice: equal keys in position order
                            r = tl.zeros([KB], dtype=tl.int32)
                            for t in range(0, big):
                                mt = live & (t < cb)
                                at = tl.minimum(off + t, KB - 1)
                                ko = tl.load(lk + at, mask=mt, other=-1)
                                oo = tl.load(lp + at, mask=mt, other=0)
                                r += ((ko > key) | ((ko == key) & (oo < o))).to(tl.int32)
            else:
                if big > 1:
                    lst = z_row + 2 * KB
                    tl.store(lst + off + slot, j, mask=live)
                    tl.debug_barrier()
                    members = tl.minimum(tl.maximum(tl.load(lst + j, mask=live, other=0, cache_modifier=".cg"), 0),
                                         KB - 1)
                    mkey = tl.gather(key, members, 0)
                    if TWOKEY:
                        mo = tl.gather(o, members, 0)
                        if OSTOP == 3:
                            tl.store(oid_row + j, (mkey + mo).to(tl.int32) + off + cb, mask=j < K)
                        else:
                            for t in range(0, big):
                                mt = live & (t < cb)
                                at = tl.minimum(off + t, KB - 1)
                                ko = tl.gather(mkey, at, 0)
                                oo = tl.gather(mo, at, 0)
                                r += (mt & ((ko > key) | ((ko == key) & (oo < o)))).to(tl.int32)
                    elif OSTOP == 3:
                        tl.store(oid_row + j, mkey.to(tl.int32) + off + cb, mask=j < K)
                    else:  # (rank_in_bucket gathers the keys again: timed with the count)
                        r = rank_in_bucket(key, o, live, off, cb, members, big, KB)
            if OSTOP == 4:
                tl.store(oid_row + j, off + r, mask=j < K)
            elif OSTOP == 5:
                dest = tl.where(live, off + r, j)
                if SCATTER:
                    if WVLOAD:
                        write_ranked(wv_row, oid_row, osc_row, key, live, j, dest, K)
                    else:
                        val = score_bits(key, o, live, sc_row)
                        mk = dest < K
                        tl.store(oid_row + dest, tl.where(live, key_id(key), -1).to(tl.int32), mask=mk)
                        tl.store(osc_row + dest, tl.where(live, val, -8388608).to(tl.float32, bitcast=True), mask=mk)
                elif WVLOAD:
                    write_ordered_vals(oid_row, osc_row, key, tl.load(wv_row + j, mask=live, other=-8388608), j, dest,
                                       nsel, z_row + 3 * KB, K, KB)
                else:
                    write_ordered(oid_row, osc_row, key, o, j, dest, nsel, z_row + 3 * KB, sc_row, nan_key(lo), 1, K, KB)


@triton.jit
def cutoff_search_halving(s, K):
    # select_kernel.cutoff_search as it was up to session 7 of 2026-12-02: every count compares
    # the score keys s themselves (u >= c as s >= (c << 20) ^ -2**31), the last two counts in one
    # sum; 113 SASS instructions a step (16384 tile, 16 warps) where production's pairs take 66
    c = tl.sum((s != -2147483648).to(tl.int32) + ((s >= 0).to(tl.int32) << 16), 0)  # valid; u >= 2048
    nsel = tl.minimum(c & 0xFFFF, K)
    hit = (c >> 16) >= nsel
    P = tl.where(hit, 2048, 0)
    ge = tl.where(hit, c >> 16, c & 0xFFFF)  # count(u >= P)
    for t in range(1, 11):
        cand = P | (1 << (11 - t))
        n = tl.sum((s >= ((cand << 20) ^ -2147483648)).to(tl.int32), 0)
        hit = n >= nsel
        P = tl.where(hit, cand, P)
        ge = tl.where(hit, n, ge)
    cand = P | 1
    c = tl.sum((s >= ((cand << 20) ^ -2147483648)).to(tl.int32)
               + ((s > (((cand << 20) | 0xFFFFF) ^ -2147483648)).to(tl.int32) << 16), 0)  # u >= cand; u > cand
    hit = (c & 0xFFFF) >= nsel
    above = tl.where(hit, c >> 16, c & 0xFFFF)
    ge = tl.where(hit, c & 0xFFFF, ge)
    return nsel, tl.where(hit, cand, P), above, ge - above


@generic_jit
def _row_prefix_kernel(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, z_ptr, oid_ptr, osc_ptr,
                       N, K, s_sq, s_iq, s_oi, s_os,
                       BLOCK: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr,
                       FR1: tl.constexpr, FR2: tl.constexpr, STOP: tl.constexpr, SCAN1D: tl.constexpr,
                       HIST: tl.constexpr, SCRATCH: tl.constexpr, SPLIT_AT: tl.constexpr, ORDV: tl.constexpr,
                       OSTOP: tl.constexpr, HALVING: tl.constexpr = False, REFINE: tl.constexpr = 0,
                       ZF: tl.constexpr = False, PARTS: tl.constexpr = False, MMAX: tl.constexpr = 0):
    # select_kernel._row_kernel (resident tile) up to phase STOP; REFINE, ZF, PARTS, MMAX: the
    # production kernel's (its cutoff bin refined on the tile, its ordering's zeroing and first
    # level, the finish's largest bin), so a mass tie's phases are the production kernel's
    row = tl.program_id(0).to(tl.int64)
    sc_row = sc_ptr + row * s_sq
    id_row = id_ptr + row * s_iq
    b, i = load_chunk(sc_row, id_row, 0, N, BLOCK)
    s = score_key(b, i)
    if STOP == 0:
        tl.store(cnt_ptr + row, tl.sum(s, 0))
    elif HIST:  # the cutoff prefix from two 6-bit tl.histogram passes (production up to f08fc80)
        h1 = sk.digit_hist(sk.top12_valid(s), 0, 0)
        nsel = tl.minimum(tl.sum(h1, 0), K)
        d1, ab1, _ = pick_digit(h1, nsel, 64)
        if STOP == 1:
            tl.store(cnt_ptr + row, d1 + ab1)
        else:
            h2 = sk.digit_hist(sk.top12_valid(s), d1, 1)
            d2, ab2, m = pick_digit(h2, nsel - ab1, 64)
            above = ab1 + ab2
            all_in = (nsel - above == m).to(tl.int32)
            P = (d1 << 6) | d2
            if STOP == 2:
                tl.store(cnt_ptr + row, P + above + all_in)
            else:
                rest_of_row(s, b, i, P, all_in, nsel, above, m, row, sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr,
                            cnt_ptr, z_ptr, oid_ptr, osc_ptr, N, K, s_sq, s_iq, s_oi, s_os, BLOCK, KB, D, CH, FR1,
                            FR2, STOP, SCAN1D, SCRATCH, SPLIT_AT, ORDV, OSTOP, REFINE, ZF, PARTS, MMAX)
    else:
        if HALVING:
            nsel, P, above, m = cutoff_search_halving(s, K)
        else:
            nsel, P, above, m = sk.cutoff_search(s, K)
        all_in = (nsel - above == m).to(tl.int32)
        if STOP <= 2:
            tl.store(cnt_ptr + row, P + above + all_in)
        else:
            rest_of_row(s, b, i, P, all_in, nsel, above, m, row, sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr,
                        cnt_ptr, z_ptr, oid_ptr, osc_ptr, N, K, s_sq, s_iq, s_oi, s_os, BLOCK, KB, D, CH, FR1,
                        FR2, STOP, SCAN1D, SCRATCH, SPLIT_AT, ORDV, OSTOP, REFINE, ZF, PARTS, MMAX)


@triton.jit
def rest_of_row(s, b, i, P, all_in, nsel, above, m, row, sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr,
                z_ptr, oid_ptr, osc_ptr, N, K, s_sq, s_iq, s_oi, s_os, BLOCK: tl.constexpr, KB: tl.constexpr,
                D: tl.constexpr, CH: tl.constexpr, FR1: tl.constexpr, FR2: tl.constexpr, STOP: tl.constexpr,
                SCAN1D: tl.constexpr, SCRATCH: tl.constexpr, SPLIT_AT: tl.constexpr, ORDV: tl.constexpr,
                OSTOP: tl.constexpr, REFINE: tl.constexpr, ZF: tl.constexpr, PARTS: tl.constexpr,
                MMAX: tl.constexpr):
    # the phases after the cutoff prefix: compaction (3), finish or refinement (4), ordering (5;
    # ORDV > 0 or OSTOP < 5: order_row_v, ORDV bit 0 LKEYS, bit 1 SCATTER, bit 2 WVLOAD, bit 3
    # TWOKEY, bits 4-6 bucket_counts_v's HILO1, ZFIRST, HISTC, stopped after its sub-phase OSTOP).
    # A cutoff bin of more than REFINE candidates (0: none) is refined on the tile
    # (select_kernel.refine_row), as in the production kernel
    wk_row = wk_ptr + row * KB
    wv_row = wv_ptr + row * KB
    wo_row = wo_ptr + row * KB
    p_row = p_ptr + row * N
    o = tl.arange(0, BLOCK)
    refine = False  # (a constant where REFINE is 0: no refinement compiled)
    keep = 1
    if REFINE > 0:
        refine = (nsel - above < m) & (m > REFINE)
        keep = 1 - refine.to(tl.int32)
    if SCAN1D:
        compact_scan1d(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row)
    else:  # W gets the score bits where the ordering reads them
        sk.compact_tile(s, b, i, o, P, all_in, keep, wk_row, wv_row, wo_row, p_row, 0, 0, BLOCK,
                        SCRATCH or (ORDV & 4) > 0)
    if STOP == 3:
        tl.store(cnt_ptr + row, nsel)
    else:
        if STOP == 5 and ZF:
            tl.store(z_ptr + row * (ORDER_SCRATCH * KB) + tl.arange(0, ORDER_NB * KB),
                     tl.zeros([ORDER_NB * KB], dtype=tl.int32))
        tl.debug_barrier()
        if refine:
            sk.refine_row(sc_ptr + row * s_sq, id_ptr + row * s_iq, p_row, wk_row, wv_row, wo_row, cnt_ptr, row, N,
                          nsel, above, P, BLOCK, KB)
        else:
            finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel,
                       above, m, KB, D, CH, FR1, FR2, MMAX)
        if STOP == 5:
            tl.debug_barrier()
            if ORDV > 0 or OSTOP < 5:
                order_row_v(wk_row, wv_row, wo_row, nsel, z_ptr + row * (ORDER_SCRATCH * KB), oid_ptr + row * s_oi,
                            osc_ptr + row * s_os, K, sc_ptr + row * s_sq, KB, SPLIT_AT, ORDER_NB * KB, ORDV & 1,
                            (ORDV >> 1) & 1, (ORDV >> 2) & 1, (ORDV >> 3) & 1, OSTOP, ORDV >> 4)
            elif SCRATCH:
                order_row_scratch(wk_row, wv_row, wo_row, nsel, z_ptr + row * (ORDER_SCRATCH * KB),
                                  oid_ptr + row * s_oi, osc_ptr + row * s_os, K, KB)
            else:
                refined = 0
                if PARTS:
                    refined = refine.to(tl.int32)
                order_row(wk_row, wo_row, nsel, z_ptr + row * (ORDER_SCRATCH * KB), sc_ptr + row * s_sq,
                          oid_ptr + row * s_oi, osc_ptr + row * s_os, K, refined, KB, SPLIT_AT, ORDER_NB * KB, ZF, PARTS)


def row_prefix(scores, ids, k, stop=5, scan1d=False, split=False, split_warps=16, maxnreg=None, hist=False,
               scratch=False, split_at=None, ordv=0, ostop=5, halving=False, refine=True):
    """The row kernel (resident tile) up to phase ``stop``; returns (ids, scores) at stop 5.
    ``split``: the row kernel stops after the finish and ``radix.bucket_kernel`` (``split_warps``
    warps, at most ``maxnreg`` registers a thread) orders the winners. ``refine``: a cutoff bin
    beyond ``select_kernel.refine_min`` is refined on the tile, and the ordering zeroes and adds
    as the production kernel's does (``zero_first``, ``parts_first``); False: every bin goes to
    the finish (the bench kernel up to session 13)."""
    q, n = scores.shape
    kb = max(2, st.next_pow2(k))
    if n > sk.RESIDENT_MAX:
        raise ValueError(f"the bench kernel holds the row in registers (N <= {sk.RESIDENT_MAX}), got N={n}")
    block, nw, _, _, maxnreg = sk.row_config(n, q, resident=True)
    wk, wv, wo, cnt, p_list = winner_workspace(q, kb, n, scores.device)
    z = torch.empty((q * ORDER_SCRATCH.value * kb,), dtype=torch.int32, device=scores.device)
    out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
    fr1, fr2 = st.finish_tiers(False, 0)  # the row kernel's
    prod = refine and not split and not scratch and ordv == 0 and ostop == 5  # the production ordering
    ref = sk.refine_min(block, fr2) if refine and block > fr2 else 0
    # the finish's largest bin, as production compiles it (select_kernel.finish_max)
    mmax = sk.finish_max(block, True, ref, fr2) if refine else 0
    _row_prefix_kernel[(q,)](scores, ids, p_list, wk, wv, wo, cnt, z, out_ids, out_sc, n, k, scores.stride(0),
                             ids.stride(0), out_ids.stride(0), out_sc.stride(0), BLOCK=block, KB=kb, D=5, CH=2048,
                             FR1=fr1, FR2=fr2, STOP=4 if split else stop, SCAN1D=scan1d, HIST=bool(hist), SCRATCH=bool(scratch),
                             SPLIT_AT=SPLIT.value if split_at is None else int(split_at), ORDV=int(ordv),
                             OSTOP=int(ostop), HALVING=bool(halving), REFINE=ref,
                             ZF=prod and sk.zero_first(block, True), PARTS=prod and sk.parts_first(block, True),
                             MMAX=mmax, num_warps=nw, **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    if split:
        bucket_kernel[(q,)](wk, wo, cnt, z, scores, out_ids, out_sc, k, scores.stride(0), out_ids.stride(0),
                            out_sc.stride(0), KB=kb, num_warps=split_warps,
                            **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    return out_ids, out_sc


STOPS = ("load+key", "+hist1", "+cutoff", "+compact", "+finish", "+order")


def ptx_counts(arch: int = 90) -> int:
    """Instructions of each prefix kernel's PTX (16384-candidate tile, k = 2048), for the
    production compaction and ``scan1d``, with the opcodes the compaction adds; no GPU (Triton's
    pipeline and the bundled ptxas, as tools/compile_select_kernels.py)."""
    import collections
    import re

    sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tools")
    from compile_select_kernels import compile_one

    def instructions(ptx):
        body = ptx[ptx.index(".entry"):]
        body = body[body.index("{"):body.index("\n}\n")]
        ops = [m.group(2) for m in (re.match(r"\s*(@!?%p\d+\s+)?([a-z][\w.]*)", line) for line in body.split("\n")[1:])
               if m and not m.group(2).startswith(("reg", "local", "shared"))]
        return collections.Counter(ops)

    fr1, fr2 = st.finish_tiers(False, 0)
    consts = dict(BLOCK=16384, KB=2048, D=5, CH=2048, FR1=fr1, FR2=fr2, HIST=False,
                  SCRATCH=False, SCAN1D=False, SPLIT_AT=SPLIT.value, ORDV=0, OSTOP=5)

    def count(stop, **kw):
        return instructions(compile_one(_row_prefix_kernel, dict(consts, STOP=stop, **kw), 16, arch).asm["ptx"])

    load, hist, cut = count(0), count(2, HIST=True), count(2)
    print(f"instructions a thread (16 warps, 32 candidates a thread): to load+key {sum(load.values())}, "
          f"to +cutoff {sum(cut.values())} (bisection; a static count: its loop body runs 10 times), "
          f"{sum(hist.values())} (two histogram passes, hist)")
    for scan1d in (False, True):
        c3 = count(3, SCAN1D=scan1d)
        added = c3 - cut
        top = ", ".join(f"{op} {n}" for op, n in added.most_common(6))
        print(f"{'scan1d' if scan1d else 'default'}: to +compact {sum(c3.values())}; the compaction adds "
              f"{sum(c3.values()) - sum(cut.values())} (most added: {top})")
    return 0
VARIANTS = {"default": {}, "norefine": dict(refine=False), "scan1d": dict(scan1d=True), "hist": dict(hist=True), "scratch": dict(scratch=True),
            "f08fc80": dict(hist=True, scratch=True),
            "sub4": dict(split_at=4), "sub8": dict(split_at=8),
            "split16": dict(split=True, split_warps=16),
            "split16r64": dict(split=True, split_warps=16, maxnreg=64),
            "split32": dict(split=True, split_warps=32),
            "split8r80": dict(split=True, split_warps=8, maxnreg=80),
            "split8r128": dict(split=True, split_warps=8, maxnreg=128),
            "split4r128": dict(split=True, split_warps=4, maxnreg=128),
            # the ordering's sub-phases (order_row_v, OSTOP) and its bench variants
            "ostops": dict(ordv=0), "lkeys": dict(ordv=1), "scatter": dict(ordv=2), "wvload": dict(ordv=4),
            "twokey": dict(ordv=8), "s6before": dict(ordv=14),
            # the first call of session 6 (record _phases_order_cb2f7f1) timed, over cb2f7f1's
            # kernels, what these give: its coal (output in order) and nowv (bits from the keys)
            "s6_coal": dict(ordv=12), "s6_nowv": dict(ordv=10),
            # bucket_counts_v's variants (prepared in session 6, timed and dropped in session 7)
            "hilo1": dict(ordv=16), "zfirst": dict(ordv=32), "histc": dict(ordv=64), "bv_all": dict(ordv=112),
            # the cutoff search comparing the score keys (production up to session 7)
            "halving": dict(halving=True)}
OSTOPS = ("+o.buckets", "+o.offsets", "+o.members", "+o.count", "+o.out")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--q", type=int, nargs="*", default=[64, 1024])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--patterns", default="random,ties")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS to time")
    ap.add_argument("--ptx", action="store_true", help="only count PTX instructions of the prefixes (no GPU)")
    a = ap.parse_args(argv)
    if a.ptx:
        return ptx_counts()
    if not a.out:
        ap.error("--out is required (except with --ptx)")
    k, n = a.k, a.n
    recs = []
    for pattern in a.patterns.split(","):
        for q in a.q:
            sets = [make_inputs(q, n, pattern, seed=i) for i in range(3)]
            ref = sk.triton_ordered_select(*sets[0], k)
            prod = time_graph(lambda s, i: sk.triton_ordered_select(s, i, k), sets, 10, 10)
            recs.append(dict(kind="production", pattern=pattern, q=q, n=n, graph_ms=prod))
            print(json.dumps(recs[-1]), flush=True)
            for vname in a.variants.split(","):
                kw = VARIANTS[vname]
                got = row_prefix(*sets[0], k, **kw)
                exact = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1].view(torch.int32),
                                                                          ref[1].view(torch.int32)))
                prev = 0.0
                if "ordv" in kw:  # the ordering's sub-phases: from the finish on
                    steps = [(4, 5, STOPS[4])] + [(5, o + 1, name) for o, name in enumerate(OSTOPS)
                                                  if kw["ordv"] in (0, 1, 8, 14, 112) or o == 4]
                else:
                    steps = [(stop, 5, sname) for stop, sname in enumerate(STOPS)]
                for stop, ostop, sname in steps:
                    if stop == 1 and not kw.get("hist"):
                        continue  # the bisection has no first half
                    if vname != "default" and "ordv" not in kw and stop < (
                            5 if ("split" in kw or "split_at" in kw or kw == dict(scratch=True)) else
                            1 if kw.get("hist") else 2 if kw.get("halving") else 3):
                        continue  # a variant changes only its phase and those after it
                    kw2 = dict(kw, ostop=ostop) if "ordv" in kw else kw
                    ms = time_graph(lambda s, i, stop=stop, kw2=kw2: row_prefix(s, i, k, stop, **kw2), sets, 10, 10)
                    recs.append(dict(kind="prefix", variant=vname, pattern=pattern, q=q, n=n, stage=sname,
                                     graph_ms=ms, stage_ms=ms - prev if prev else None, exact=exact))
                    prev = ms
                    print(json.dumps(recs[-1]), flush=True)
            del sets
    with open(a.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       records=recs), f, indent=1)
    print("\nrow kernel phases (graph replay ms):")
    for r in recs:
        if r["kind"] == "production":
            print(f"{r['pattern']:7} Q={r['q']:<5} production {r['graph_ms']:.4f}")
        else:
            st_ms = "" if r["stage_ms"] is None else f"  phase {r['stage_ms']:.4f}"
            print(f"{r['pattern']:7} Q={r['q']:<5} {r['variant']:10} {r['stage']:9} total {r['graph_ms']:.4f}{st_ms}"
                  f"  exact={r['exact']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
