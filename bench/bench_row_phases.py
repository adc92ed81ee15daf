"""Where the time of the row kernel goes, phase by phase, and bench-only variants of it (H200).

    python bench/bench_row_phases.py --out phases.json [--q 64 1024] [--n 16384]

The bench kernel ``_row_prefix_kernel`` is the row kernel of ``ops/select_kernel.py`` built from
the same helpers, stopped after phase ``STOP`` (0 load and score key, 1 first histogram,
2 second histogram, 3 compaction, 4 finish, 5 ordering = the whole kernel); each prefix writes
what it computed, so nothing is dead code. Differences between prefixes (CUDA-graph replay)
are the phases' costs. Variants (constexprs, bench only until one measures faster):

* ``LEAN``: the tile keeps only the score keys; the compaction re-reads the winners' ids (and
  the score bits of NaN winners) by position instead of holding ids and bits in registers.
* ``KEYED``: the ordering lays each bucket's keys and positions out in bucket order, so a
  winner's in-bucket count loads them directly (two loads a step, not a load and two gathers).

Every variant's full kernel (STOP=5) is checked bit for bit against the production kernel.
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
from tpflare.ops.radix import (ORDER_SCRATCH, SPLIT, generic_jit, key_id, load_chunk, order_row, pick_digit,  # noqa: E402
                               put_winners, score_key, top_digit, winner_workspace, bit_length)
from tpflare.ops.select_finish import finish_row  # noqa: E402

KEYED_SCRATCH = ORDER_SCRATCH.value + 3  # the keyed ordering's bucket-ordered keys (int64) and positions


@triton.jit
def compact_lean(s, o, P, all_in, sc_row, id_row, wk_row, wv_row, wo_row, p_row):
    # compact_tile from the score keys alone: winners' ids re-read by position, their score bits
    # rebuilt from the key (the key is a bijection of the bits except for NaN: those re-read)
    u = top_digit(s, 12)
    valid = s != -2147483648
    on = valid & (u == P)
    whole = (u * 0 + all_in) != 0
    win = valid & ((u > P) | (on & whole))
    play = on & (whole == 0)
    packed = win.to(tl.int32) + (play.to(tl.int32) << 16)
    incl = tl.cumsum(packed, 0)
    i = tl.load(id_row + o, mask=win, other=0)
    nan = s == -2147483647
    bn = tl.load(sc_row + o, mask=win & nan, other=0.0).to(tl.int32, bitcast=True)
    b = tl.where(nan, bn, tl.where(s >= 0, s, s ^ 0x7FFFFFFF))
    put_winners(wk_row, wv_row, wo_row, (incl & 0xFFFF) - 1, win, s, 2147483647 - i, b, o)
    tl.store(p_row + (incl >> 16) - 1, o, mask=play)


@triton.jit
def order_row_keyed(wk_row, wv_row, wo_row, nsel, z_row, oid_row, osc_row, K, KB: tl.constexpr):
    # radix.order_row with the members of every (sub-)bucket laid out as (key, position) in
    # bucket order (scratch units 9..11), so the in-bucket count loads them without a gather
    j = tl.arange(0, KB)
    live = j < nsel
    key = tl.load(wk_row + j, mask=live, other=-1)
    o = tl.load(wo_row + j, mask=live, other=0)
    hi = tl.max(tl.where(live, key, -1), 0)
    lo = tl.min(tl.where(live, key, 9223372036854775807), 0)
    sh = bit_length(tl.maximum(hi - lo, 0) // KB)
    bkt = tl.where(live, (hi - key) >> sh, 0).to(tl.int32)
    tl.store(z_row + j, tl.zeros([KB], dtype=tl.int32))
    tl.debug_barrier()
    slot = tl.atomic_add(z_row + bkt, tl.full([KB], 1, tl.int32), mask=live, sem="relaxed", scope="cta")
    tl.debug_barrier()
    c = tl.load(z_row + j, cache_modifier=".cg")
    tl.store(z_row + KB + j, tl.cumsum(c, 0) - c)
    big = tl.max(c, 0)
    tl.debug_barrier()
    off = tl.load(z_row + KB + bkt, mask=live, other=0, cache_modifier=".cg")
    cb = tl.load(z_row + bkt, mask=live, other=0, cache_modifier=".cg")
    if big > SPLIT:
        c2 = z_row + 3 * KB
        o2 = z_row + 4 * KB
        yh = (z_row + 5 * KB).to(tl.pointer_type(tl.int64))
        yl = yh + KB
        tl.store(c2 + j, tl.zeros([KB], dtype=tl.int32))
        tl.store(yh + j, tl.full([KB], -1, tl.int64))
        tl.store(yl + j, tl.full([KB], 9223372036854775807, tl.int64))
        tl.debug_barrier()
        tl.atomic_max(yh + bkt, key, mask=live, sem="relaxed", scope="cta")
        tl.atomic_min(yl + bkt, key, mask=live, sem="relaxed", scope="cta")
        tl.debug_barrier()
        bh = tl.load(yh + bkt, mask=live, other=0, cache_modifier=".cg")
        bl = tl.load(yl + bkt, mask=live, other=0, cache_modifier=".cg")
        sh2 = bit_length(tl.maximum(bh - bl, 0) // tl.maximum(cb, 1).to(tl.int64))
        sub = off + tl.where(live, (bh - key) >> sh2, 0).to(tl.int32)
        slot = tl.atomic_add(c2 + sub, tl.full([KB], 1, tl.int32), mask=live, sem="relaxed", scope="cta")
        tl.debug_barrier()
        cc = tl.load(c2 + j, cache_modifier=".cg")
        tl.store(o2 + j, tl.cumsum(cc, 0) - cc)
        big = tl.max(cc, 0)
        tl.debug_barrier()
        cb = tl.load(c2 + sub, mask=live, other=0, cache_modifier=".cg")
        off = tl.load(o2 + sub, mask=live, other=0, cache_modifier=".cg")
    r = tl.zeros([KB], dtype=tl.int32)
    if big > 1:
        lk = (z_row + ORDER_SCRATCH * KB).to(tl.pointer_type(tl.int64))
        lo_ = z_row + (ORDER_SCRATCH + 2) * KB
        tl.store(lk + off + slot, key, mask=live)
        tl.store(lo_ + off + slot, o, mask=live)
        tl.debug_barrier()
        for t in range(0, big):
            mt = live & (t < cb)
            ko = tl.load(lk + off + t, mask=mt, other=-1, cache_modifier=".cg")
            oo = tl.load(lo_ + off + t, mask=mt, other=0, cache_modifier=".cg")
            r += (mt & ((ko > key) | ((ko == key) & (oo < o)))).to(tl.int32)
    dest = tl.where(live, off + r, j)
    val = tl.load(wv_row + j, mask=live, other=-8388608)
    mk = dest < K
    tl.store(oid_row + dest, tl.where(live, key_id(key), -1).to(tl.int32), mask=mk)
    tl.store(osc_row + dest, tl.where(live, val, -8388608).to(tl.float32, bitcast=True), mask=mk)


@triton.jit
def order_row_sorted(wk_row, wv_row, wo_row, nsel, z_row, oid_row, osc_row, K, KB: tl.constexpr):
    # bitonic sort (tl.sort) of the packed keys in registers; the score bits come back from the
    # key (a bijection except for NaN); winners with equal keys are then bit-identical. A row
    # with a NaN winner (payloads, duplicate ids in position order) takes radix.order_row.
    j = tl.arange(0, KB)
    live = j < nsel
    key = tl.load(wk_row + j, mask=live, other=-1)
    sk_ = ((key >> 31) & 0xFFFFFFFF).to(tl.int32) ^ -2147483648
    if tl.max((live & (sk_ == -2147483647)).to(tl.int32), 0) > 0:
        order_row(wk_row, wv_row, wo_row, nsel, z_row, oid_row, osc_row, K, KB)
    else:
        srt = tl.sort(key, descending=True)
        s2 = ((srt >> 31) & 0xFFFFFFFF).to(tl.int32) ^ -2147483648
        bits = tl.where(s2 >= 0, s2, s2 ^ 0x7FFFFFFF)
        mk = j < K
        tl.store(oid_row + j, tl.where(live, key_id(srt), -1).to(tl.int32), mask=mk)
        tl.store(osc_row + j, tl.where(live, bits, -8388608).to(tl.float32, bitcast=True), mask=mk)


@generic_jit
def _order_kernel(wk_ptr, wv_ptr, wo_ptr, cnt_ptr, z_ptr, oid_ptr, osc_ptr, K, s_oi, s_os, KB: tl.constexpr,
                  ZS: tl.constexpr, HOW: tl.constexpr):
    # grid (Q,): one row's winners ordered by a kernel of its own (HOW 0 bucket rank, 1 sort)
    row = tl.program_id(0).to(tl.int64)
    if HOW == 0:
        order_row(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, tl.load(cnt_ptr + row),
                  z_ptr + row * (ZS * KB), oid_ptr + row * s_oi, osc_ptr + row * s_os, K, KB)
    else:
        order_row_sorted(wk_ptr + row * KB, wv_ptr + row * KB, wo_ptr + row * KB, tl.load(cnt_ptr + row),
                         z_ptr + row * (ZS * KB), oid_ptr + row * s_oi, osc_ptr + row * s_os, K, KB)


@triton.jit
def compact_2d(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row, COLS: tl.constexpr):
    # compact_tile over a [R, C] tile: in-row prefix sums along C, one scan of the R row totals;
    # COLS: prefix sums down each column (in one thread), one scan of the C column totals
    # (slots in column order: any order will do for W and P)
    u = top_digit(s, 12)
    valid = s != -2147483648
    on = valid & (u == P)
    whole = (u * 0 + all_in) != 0
    win = valid & ((u > P) | (on & whole))
    play = on & (whole == 0)
    packed = win.to(tl.int32) + (play.to(tl.int32) << 16)
    if COLS:
        tot = tl.sum(packed, 0)
        incl = tl.cumsum(packed, 0) + (tl.cumsum(tot, 0) - tot)[None, :]
    else:
        tot = tl.sum(packed, 1)
        incl = tl.cumsum(packed, 1) + (tl.cumsum(tot, 0) - tot)[:, None]
    put_winners(wk_row, wv_row, wo_row, (incl & 0xFFFF) - 1, win, s, 2147483647 - tl.maximum(i, 0), b, o)
    tl.store(p_row + (incl >> 16) - 1, o, mask=play)


@triton.jit
def compact_cols(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row, R: tl.constexpr, C: tl.constexpr):
    # compact_tile whose prefix sum runs as [R, C] (a reshape of the 1-D tile): sums down each
    # column, one scan of the C column totals; slots in column order (any order will do)
    u = top_digit(s, 12)
    valid = s != -2147483648
    on = valid & (u == P)
    whole = (u * 0 + all_in) != 0
    win = valid & ((u > P) | (on & whole))
    play = on & (whole == 0)
    packed = tl.reshape(win.to(tl.int32) + (play.to(tl.int32) << 16), [R, C])
    tot = tl.sum(packed, 0)
    incl = tl.reshape(tl.cumsum(packed, 0) + (tl.cumsum(tot, 0) - tot)[None, :], [R * C])
    put_winners(wk_row, wv_row, wo_row, (incl & 0xFFFF) - 1, win, s, 2147483647 - tl.maximum(i, 0), b, o)
    tl.store(p_row + (incl >> 16) - 1, o, mask=play)


@generic_jit
def _row_prefix_kernel(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, z_ptr, oid_ptr, osc_ptr,
                       N, K, s_sq, s_iq, s_oi, s_os,
                       BLOCK: tl.constexpr, KB: tl.constexpr, D: tl.constexpr, CH: tl.constexpr,
                       FR1: tl.constexpr, FR2: tl.constexpr, ZS: tl.constexpr,
                       STOP: tl.constexpr, LEAN: tl.constexpr, KEYED: tl.constexpr, SORT: tl.constexpr,
                       C2: tl.constexpr, COLS: tl.constexpr = 0):
    # select_kernel._row_kernel (resident tile) up to phase STOP; ZS: scratch units a row
    row = tl.program_id(0).to(tl.int64)
    sc_row = sc_ptr + row * s_sq
    id_row = id_ptr + row * s_iq
    wk_row = wk_ptr + row * KB
    wv_row = wv_ptr + row * KB
    wo_row = wo_ptr + row * KB
    p_row = p_ptr + row * N
    if C2 > 0:  # a [BLOCK // C2, C2] tile (compact_2d); the histograms take it as 1-D in any order
        o = tl.arange(0, BLOCK // C2)[:, None] * C2 + tl.arange(0, C2)[None, :]
    if C2 < 0:  # the tile as [BLOCK // -C2, -C2] with each column's rows in one thread (compact_cols)
        o = tl.arange(0, BLOCK // -C2)[:, None] * -C2 + tl.arange(0, -C2)[None, :]
    if C2 != 0:
        b = tl.load(sc_row + o, mask=o < N, other=0.0).to(tl.int32, bitcast=True)
        i = tl.load(id_row + o, mask=o < N, other=-1)
        s = score_key(b, i)
        s1 = tl.reshape(s, [BLOCK], can_reorder=True)
    else:
        b, i = load_chunk(sc_row, id_row, 0, N, BLOCK)
        s = score_key(b, i)
        s1 = s
    if STOP == 0:
        tl.store(cnt_ptr + row, tl.sum(s1, 0))
    else:
        h1 = sk.digit_hist(sk.top12_valid(s1), 0, 0)
        nsel = tl.minimum(tl.sum(h1, 0), K)
        d1, ab1, _ = pick_digit(h1, nsel, 64)
        if STOP == 1:
            tl.store(cnt_ptr + row, d1 + ab1)
        else:
            h2 = sk.digit_hist(sk.top12_valid(s1), d1, 1)
            d2, ab2, m = pick_digit(h2, nsel - ab1, 64)
            above = ab1 + ab2
            all_in = (nsel - above == m).to(tl.int32)
            P = (d1 << 6) | d2
            if STOP == 2:
                tl.store(cnt_ptr + row, P + above + all_in)
            else:
                if C2 != 0:
                    compact_2d(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row, C2 < 0)
                elif COLS > 0:
                    o = tl.arange(0, BLOCK)
                    compact_cols(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row, BLOCK // COLS, COLS)
                elif LEAN:
                    o = tl.arange(0, BLOCK)
                    compact_lean(s, o, P, all_in, sc_row, id_row, wk_row, wv_row, wo_row, p_row)
                else:
                    o = tl.arange(0, BLOCK)
                    sk.compact_tile(s, b, i, o, P, all_in, wk_row, wv_row, wo_row, p_row, 0, 0, BLOCK)
                if STOP == 3:
                    tl.store(cnt_ptr + row, nsel)
                else:
                    tl.debug_barrier()
                    finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel,
                               above, m, KB, D, CH, FR1, FR2)
                    if STOP == 5:
                        tl.debug_barrier()
                        if SORT:
                            order_row_sorted(wk_row, wv_row, wo_row, nsel, z_ptr + row * (ZS * KB),
                                             oid_ptr + row * s_oi, osc_ptr + row * s_os, K, KB)
                        elif KEYED:
                            order_row_keyed(wk_row, wv_row, wo_row, nsel, z_ptr + row * (ZS * KB),
                                            oid_ptr + row * s_oi, osc_ptr + row * s_os, K, KB)
                        else:
                            order_row(wk_row, wv_row, wo_row, nsel, z_ptr + row * (ZS * KB),
                                      oid_ptr + row * s_oi, osc_ptr + row * s_os, K, KB)


def row_prefix(scores, ids, k, stop=5, lean=False, keyed=False, sort=False, c2=0, num_warps=None,
               split=None, split_warps=8, cols=0, maxnreg=None):
    """The row kernel (resident tile) up to phase ``stop``; returns (ids, scores) at stop 5.
    ``split``: "bucket" or "sort": the row kernel stops after the finish and a kernel of its own
    (``split_warps`` warps) orders the winners."""
    q, n = scores.shape
    kb = max(2, st.next_pow2(k))
    block, nw, _, resident = sk._row_config(n)
    assert resident, "the bench kernel holds the row in registers (N <= 16384)"
    zs = KEYED_SCRATCH if keyed else ORDER_SCRATCH.value
    wk, wv, wo, cnt, p_list = winner_workspace(q, kb, n, scores.device)
    z = torch.empty((q * zs * kb,), dtype=torch.int32, device=scores.device)
    out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
    fr2 = st.FIN_TIERS[1]
    _row_prefix_kernel[(q,)](scores, ids, p_list, wk, wv, wo, cnt, z, out_ids, out_sc, n, k, scores.stride(0),
                             ids.stride(0), out_ids.stride(0), out_sc.stride(0), BLOCK=block, KB=kb, D=5, CH=2048,
                             FR1=min(st.FIN_TIERS[0], fr2), FR2=fr2, ZS=zs, STOP=4 if split else stop, LEAN=lean,
                             KEYED=keyed, SORT=sort, C2=c2, COLS=min(cols, block), num_warps=num_warps or nw)
    if split:
        _order_kernel[(q,)](wk, wv, wo, cnt, z, out_ids, out_sc, k, out_ids.stride(0), out_sc.stride(0), KB=kb, ZS=zs,
                            HOW=0 if split == "bucket" else 1, num_warps=split_warps,
                            **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    return out_ids, out_sc


STOPS = ("load+key", "+hist1", "+hist2", "+compact", "+finish", "+order")
VARIANTS = {"default": {}, "scan1d": dict(cols=16384),
            "split16": dict(split="bucket", split_warps=16),
            "split16r64": dict(split="bucket", split_warps=16, maxnreg=64),
            "split32": dict(split="bucket", split_warps=32),
            "split8r80": dict(split="bucket", split_warps=8, maxnreg=80),
            "split8r128": dict(split="bucket", split_warps=8, maxnreg=128),
            "split4r128": dict(split="bucket", split_warps=4, maxnreg=128)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--q", type=int, nargs="*", default=[64, 1024])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--patterns", default="random,ties")
    a = ap.parse_args(argv)
    k, n = a.k, a.n
    recs = []
    for pattern in a.patterns.split(","):
        for q in a.q:
            sets = [make_inputs(q, n, pattern, seed=i) for i in range(3)]
            ref = sk.triton_ordered_select(*sets[0], k)
            prod = time_graph(lambda s, i: sk.triton_ordered_select(s, i, k), sets, 10, 10)
            recs.append(dict(kind="production", pattern=pattern, q=q, n=n, graph_ms=prod))
            print(json.dumps(recs[-1]), flush=True)
            for vname, kw in VARIANTS.items():
                got = row_prefix(*sets[0], k, **kw)
                exact = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1].view(torch.int32),
                                                                          ref[1].view(torch.int32)))
                prev = 0.0
                for stop, sname in enumerate(STOPS):
                    first = 3 if (kw.get("lean") or kw.get("cols")) and not ("split" in kw or "keyed" in kw) else 5
                    if vname != "default" and stop < first:
                        continue  # a variant changes only its phase and those after it
                    ms = time_graph(lambda s, i, stop=stop, kw=kw: row_prefix(s, i, k, stop, **kw), sets, 10, 10)
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
