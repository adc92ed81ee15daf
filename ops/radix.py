"""Triton helpers shared by the selection kernels: the score key, radix-select digits, and the
final ordering of the winners that both paths produce.

Keys are int32 whose *signed* order is the selection order. A radix pass reads the key
*biased* (``x + 2**31`` as an int64: the same order, unsigned bit fields): a digit is the bits
``[sh, sh + w)``, a prefix ``t`` the biased bits found so far (the bits below clear). The
digits start at the highest bit in which the keys still in play differ, and the shift ``sh``
is a *runtime* value (the radix passes are loops, not unrolled): one copy of a pass's code
serves every digit, which keeps compile time to a second or two.

Both paths leave the row's winners unordered in a workspace ``W`` (``[Q, KB]`` packed keys,
score bits and positions, plus the winner count a row; no score bits from the row kernel's
compaction where ``order_row`` follows in the kernel: it rebuilds them from the keys; the
staged path's rank ordering: sorted by the first digit, and room for a whole cutoff bin);
``order_row`` (in the row kernel, or ``bucket_kernel`` after the staged path) or
``order_winners``'s other orderings order them.

Imported only where Triton imports (``select_kernel.py``, ``select_staged.py``).
"""
from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

from .select_compile import launch

# the integer arguments of every kernel that Triton must not specialise (a value divisible by
# 16 or equal to 1 would otherwise compile another copy of the kernel for each new shape)
RUNTIME_INTS = ("N", "K", "s_sq", "s_iq", "s_oi", "s_os", "play_max")


def generic_jit(fn):
    """``triton.jit`` with the shape arguments (``RUNTIME_INTS``) as plain runtime values."""
    names = inspect.signature(fn).parameters
    return triton.jit(fn, do_not_specialize=[n for n in RUNTIME_INTS if n in names])


@triton.jit
def score_key(bits, ids):
    # int32 whose signed order is the selection order of the score:
    # IEEE bit order (+0 above -0), NaN = INT_MIN + 1 (below -inf), invalid = INT_MIN.
    s = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    s = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, -2147483647, s)
    s = tl.where(ids >= 0, s, -2147483648)
    return s


@triton.jit
def pick_digit(h, rem, NB: tl.constexpr):
    # h: histogram of one digit over the candidates still in play; rem: how many of
    # them are wanted (largest digits first). Returns the digit d holding the rem-th
    # largest, how many are above d, and how many have digit d (one scan, one max).
    # Counts must stay below 2**20 (rows of at most 131072 candidates do).
    suf = tl.cumsum(h, 0, reverse=True)  # candidates with digit >= d
    bins = tl.arange(0, NB).to(tl.int64)
    packed = tl.where(suf >= rem, (bins << 40) | ((suf - h).to(tl.int64) << 20) | h.to(tl.int64), 0)
    best = tl.max(packed, 0)  # the largest digit whose suffix still holds rem
    d = (best >> 40).to(tl.int32)
    above = ((best >> 20) & 0xFFFFF).to(tl.int32)
    cnt = (best & 0xFFFFF).to(tl.int32)
    return d, above, cnt


@triton.jit
def biased(x):
    # an int32 key as a non-negative int64 of the same order (x + 2**31): digits of it are
    # plain unsigned bit fields, and shifts by up to 32 are defined
    return x.to(tl.int64) + 2147483648


@triton.jit
def digit_at(y, sh, w):
    # the w-bit digit of a biased key y at bits [sh, sh + w) (runtime sh, w), as an int32 bin
    return ((y >> sh) & ((1 << w) - 1)).to(tl.int32)


@triton.jit
def prefix_at(y, t, sh):
    # do the bits of biased key y from bit sh up equal those of t?
    return (y >> sh) == (t >> sh)


@triton.jit
def shared_bits(lo, hi):
    # (bits, t) of int32 keys lo <= hi: every key between them shares its bits from bit ``bits``
    # up (0..32) with them; t: those shared bits (biased), the bits below clear
    yh = biased(hi)
    top = bit_length(biased(lo) ^ yh).to(tl.int32)
    return top, (yh >> top) << top


@triton.jit
def load_chunk(sc_row, id_row, c0, N, CHUNK: tl.constexpr):
    # candidates c0 .. c0 + CHUNK of a row: score bits (int32) and ids; past N: id -1 (invalid)
    o = c0 + tl.arange(0, CHUNK)
    mc = o < N
    b = tl.load(sc_row + o, mask=mc, other=0.0).to(tl.int32, bitcast=True)
    i = tl.load(id_row + o, mask=mc, other=-1)
    return b, i


@triton.jit
def packed_key(s, v):
    # 63-bit winner key: the unsigned-ordered score key above the inverted id (v = 0x7fffffff - id);
    # larger = earlier, non-negative
    return ((s ^ -2147483648).to(tl.int64) & 0xFFFFFFFF) << 31 | v.to(tl.int64)


@triton.jit
def key_id(key):
    # the id a packed key holds
    return 2147483647 - (key & 0x7FFFFFFF)


@triton.jit
def key_top_digit(key, HB: tl.constexpr):
    # the first HB bits of the score key a packed key holds, as top_digit gives them
    return ((key >> (63 - HB)) & ((1 << HB) - 1)).to(tl.int32)


@triton.jit
def top_digit(s, HB: tl.constexpr):
    # the first HB bits of the score key as an unsigned bin (sign flipped: negatives below)
    return ((s >> (32 - HB)) & ((1 << HB) - 1)) ^ (1 << (HB - 1))


SLOT_COLS = tl.constexpr(512)  # scan_slots: columns of the [T / C, C] view of a tile


@triton.jit
def scan_slots(x, T: tl.constexpr):
    # inclusive prefix sums of the counts x (a [T] tile) in the column order of its [T / C, C]
    # view, and their total: distinct slots for the counted elements, in some order (the
    # winner and in-play lists take any). Sums down the columns stay in a thread (or a few); one
    # scan runs over the C column totals, not over T elements. H200, the row kernel's
    # compaction (bench/bench_row_phases.py): 0.36 against 0.47 ms at 1024 rows of 16384. Not
    # in the finish: there (a tile of the in-play list, 16 warps) it measured slower, 0.53
    # against 0.51 ms at 1024 rows with a quarter of each row tied.
    C: tl.constexpr = SLOT_COLS if T > SLOT_COLS else T
    x2 = tl.reshape(x, [T // C, C])
    tot = tl.sum(x2, 0)
    incl = tl.reshape(tl.cumsum(x2, 0) + (tl.cumsum(tot, 0) - tot)[None, :], [T])
    return incl, tl.sum(tot, 0)


@triton.jit
def put_keys(wk_row, wo_row, slot, win, s, v, o):
    # winners (mask win) to their W slots: packed key and position (the row kernel's ordering
    # takes the score bits from the key: score_bits)
    tl.store(wk_row + slot, packed_key(s, v), mask=win)
    tl.store(wo_row + slot, o, mask=win)


@triton.jit
def put_winners(wk_row, wv_row, wo_row, slot, win, s, v, b, o):
    # winners (mask win) to their W slots: packed key, position, raw score bits
    put_keys(wk_row, wo_row, slot, win, s, v, o)
    tl.store(wv_row + slot, b, mask=win)


# --------------------------------------------------------------------------- ordering
# The staged path's zeroed workspace row (select_staged, int32): the histogram of the first
# digit [0, NB); counters [NB, NB + ZCTRS): W slots, P slots, the ticket, W entries to rank,
# winners above the cutoff bin; the bins' slot counters [NB + ZCTRS, 2 NB + ZCTRS) and the
# bins' first W slots [2 NB + ZCTRS, 3 NB + ZCTRS) (the binned W of the rank ordering).
ZCTRS = tl.constexpr(8)
Z_WSLOT = tl.constexpr(0)
Z_PSLOT = tl.constexpr(1)
Z_TICKET = tl.constexpr(2)
Z_USED = tl.constexpr(3)
Z_ABOVE = tl.constexpr(4)


@triton.jit
def z_bin_slots(z_row, NB: tl.constexpr):
    # the bins' slot counters of a staged workspace row (binned W)
    return z_row + NB + ZCTRS


@triton.jit
def z_bin_firsts(z_row, NB: tl.constexpr):
    # the bins' first W slots of a staged workspace row (binned W)
    return z_row + 2 * NB + ZCTRS


@generic_jit
def _rank_kernel(wk_ptr, wv_ptr, wo_ptr, cnt_ptr, z_ptr, oid_ptr, osc_ptr, K, s_oi, s_os,
                 KB: tl.constexpr, SL: tl.constexpr, JB: tl.constexpr, BINNED: tl.constexpr,
                 ZS: tl.constexpr, HB: tl.constexpr):
    # grid (Q, span / SL): every program takes SL entries of W and counts, for each, the entries
    # before it (a larger packed key, or an equal key at an earlier position): its output slot.
    # Not BINNED: W holds a row's nsel winners (cnt_ptr) in any order, and each is compared
    # with all. BINNED (the staged path, z_ptr its workspace): W is sorted by the first digit:
    # the winners above the cutoff bin at their bin's slots (the bin's first slot, from z),
    # then the cutoff bin's entries in slots [above, used): the winners the finish picked, or
    # the whole bin (at most rank_play candidates, of which the first nsel - above win). An
    # entry is compared only with its own bin: entries of the bins above all come before it.
    row = tl.program_id(0).to(tl.int64)
    NB: tl.constexpr = 1 << HB
    nsel = tl.load(cnt_ptr + row)
    j = tl.program_id(1) * SL + tl.arange(0, SL)
    wk_row = wk_ptr + row * KB
    wo_row = wo_ptr + row * KB
    if BINNED:
        z_row = z_ptr + row * ZS
        nu = tl.load(z_row + NB + Z_USED)
        above = tl.load(z_row + NB + Z_ABOVE)
    else:
        nu = nsel
        above = nsel * 0
    live = j < nu
    key = tl.load(wk_row + j, mask=live, other=-1)
    o = tl.load(wo_row + j, mask=live, other=0)
    val = tl.load(wv_ptr + row * KB + j, mask=live, other=-8388608)
    if BINNED:
        d = key_top_digit(key, HB)
        hb = live & (j < above)
        lo = tl.where(hb, tl.load(z_bin_firsts(z_row, NB) + d, mask=hb, other=0), above)
        hi = tl.where(hb, lo + tl.load(z_row + d, mask=hb, other=0), nu)
    else:
        lo = j * 0
        hi = lo + nu
    j_lo = tl.min(tl.where(live, lo, 2147483647), 0)
    j_hi = tl.max(tl.where(live, hi, 0), 0)
    acc = tl.zeros([SL, JB], dtype=tl.int32)  # one reduction at the end, not one a step
    for j0 in range(j_lo, j_hi, JB):
        jj = j0 + tl.arange(0, JB)
        mm = jj < j_hi
        kj = tl.load(wk_row + jj, mask=mm, other=-1)
        oj = tl.load(wo_row + jj, mask=mm, other=0)
        before = (kj[None, :] > key[:, None]) | ((kj[None, :] == key[:, None]) & (oj[None, :] < o[:, None]))
        acc += (before & (jj[None, :] >= lo[:, None]) & (jj[None, :] < hi[:, None])).to(tl.int32)
    rank = lo + tl.sum(acc, 1)
    win = live & (rank < nsel)  # winners to their rank
    tl.store(oid_ptr + row * s_oi + rank, key_id(key).to(tl.int32), mask=win)
    tl.store(osc_ptr + row * s_os + rank, val.to(tl.float32, bitcast=True), mask=win)
    pad = (j >= nsel) & (j < K)  # the slots past them get pads
    tl.store(oid_ptr + row * s_oi + j, tl.full([SL], -1, tl.int32), mask=pad)
    tl.store(osc_ptr + row * s_os + j, tl.full([SL], float("-inf"), tl.float32), mask=pad)


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min2(a, b):
    return tl.minimum(a, b)


@generic_jit
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


ORDER_SCRATCH = tl.constexpr(9)  # int32 scratch a row of order_row, in units of KB (8-byte aligned rows)
SPLIT = tl.constexpr(16)  # order_row splits buckets again when the largest holds more winners than this


@triton.jit
def bit_length(x):
    # bits of a non-negative int64 from its float64 exponent (a rounding up gives one more: safe)
    e = ((x.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1022
    return tl.where(x > 0, e, 0)


@triton.jit
def over_groups(v, G: tl.constexpr, KB: tl.constexpr):
    # one value a group of G consecutive lanes (v: [KB // G]) spread over the group's lanes: [KB]
    return tl.reshape(tl.broadcast_to(v[:, None], [KB // G, G]), [KB])


@triton.jit
def bucket_counts(wk_row, wo_row, nsel, z_row, KB: tl.constexpr, NB: tl.constexpr, ZEROED: tl.constexpr):
    # order_row's first level: the winners' packed keys span [lo, hi]; a shift maps hi - key to
    # one of NB (KB or 2 KB) buckets (bucket 0 = the largest keys); one atomic add a winner
    # gives each its slot in its bucket (any order); returns
    # (j, live, key, position, bucket, slot, bucket sizes c [NB], lo). z_row[0:NB] holds the
    # sizes (ZEROED: the caller zeroed them, before a barrier)
    j = tl.arange(0, KB)
    live = j < nsel
    key = tl.load(wk_row + j, mask=live, other=-1)
    o = tl.load(wo_row + j, mask=live, other=0)
    hi = tl.max(tl.where(live, key, -1), 0)
    lo = tl.min(tl.where(live, key, 9223372036854775807), 0)
    sh = bit_length(tl.maximum(hi - lo, 0) // NB)  # (hi - lo) >> sh < NB
    bkt = tl.where(live, (hi - key) >> sh, 0).to(tl.int32)
    jb = tl.arange(0, NB)
    if not ZEROED:
        tl.store(z_row + jb, tl.zeros([NB], dtype=tl.int32))
        tl.debug_barrier()
    slot = tl.atomic_add(z_row + bkt, tl.full([KB], 1, tl.int32), mask=live, sem="relaxed", scope="cta")
    tl.debug_barrier()
    c = tl.load(z_row + jb, cache_modifier=".cg")
    return j, live, key, o, bkt, slot, c, lo


@triton.jit
def _part_ranges(n0, ph0, pl0, nh0, nl0, th0, n1, ph1, pl1, nh1, nl1, th1):
    # part_counts' reduction: the sum of the packed counts, the max / min of each part's keys
    return (n0 + n1, tl.maximum(ph0, ph1), tl.minimum(pl0, pl1), tl.maximum(nh0, nh1), tl.minimum(nl0, nl1),
            tl.maximum(th0, th1))


@triton.jit
def part_counts(key, live, lo, nsel, zp, NB: tl.constexpr):
    # order_row's first level again where one map of the winners' key range crowded a bucket:
    # in three parts, each mapped over its own key range, the NB buckets shared in proportion
    # to their winners: the winners of a positive score key (packed key >= 2**62), those of a
    # negative one, both above the tie at the smallest score key (lo's; a short context's -inf
    # winners, which differ by id only). A map linear in the key bits leaves empty the exponents
    # between parts (the octaves around 0 between two signs, those down to a -inf tie), so their
    # winners crowd a few buckets; each part over its own range spreads them (bench/
    # order_bucket_sizes.py on the CPU: a short context's largest bucket 1227-1637 -> 7-8, a
    # median row, and none past SPLIT at N = 8192-16384). The parts keep the order: positive >
    # negative > the tie. zp: NB int32 of scratch that nothing else holds at this point.
    # Returns (bucket, slot in it, bucket sizes [NB]).
    MAXK: tl.constexpr = 9223372036854775807
    tie = live & ((key >> 31) == (lo >> 31))
    pos = live & (tie == 0) & (key >= 4611686018427387904)
    neg = live & (tie == 0) & (pos == 0)
    # the parts' sizes and key ranges in one reduction (one round of the program's barriers)
    n, phi, plo, nhi, nlo, thi = tl.reduce((pos.to(tl.int32) + (neg.to(tl.int32) << 16), tl.where(pos, key, -1),
                                            tl.where(pos, key, MAXK), tl.where(neg, key, -1), tl.where(neg, key, MAXK),
                                            tl.where(tie, key, -1)), 0, _part_ranges)  # (counts < 2**16)
    bp = (NB * (n & 0xFFFF)) // nsel  # (>= 1 a winner: NB >= KB >= nsel; the tie keeps the rest, >= 1)
    bn = (NB * (n >> 16)) // nsel
    shp = bit_length(tl.maximum(phi - plo, 0) // tl.maximum(bp, 1))  # (an empty part: 0)
    shn = bit_length(tl.maximum(nhi - nlo, 0) // tl.maximum(bn, 1))
    sht = bit_length(tl.maximum(thi - lo, 0) // (NB - bp - bn))
    top = tl.where(pos, phi, tl.where(neg, nhi, thi))
    sh = tl.where(pos, shp, tl.where(neg, shn, sht))
    base = tl.where(pos, 0, tl.where(neg, bp, bp + bn))
    bkt = tl.where(live, base + ((top - key) >> sh).to(tl.int32), 0)
    jb = tl.arange(0, NB)
    tl.store(zp + jb, tl.zeros([NB], dtype=tl.int32))
    tl.debug_barrier()
    slot = tl.atomic_add(zp + bkt, tl.full(bkt.shape, 1, tl.int32), mask=live, sem="relaxed", scope="cta")
    tl.debug_barrier()
    return bkt, slot, tl.load(zp + jb, cache_modifier=".cg")


@triton.jit
def offsets_sizes(c, idx, live):
    # each winner's (sub-)bucket output offset and size, from the sizes c and its (sub-)bucket
    # idx: one gather of both (the exclusive scan of c above c: offsets and sizes < 2**16)
    g = tl.gather(((tl.cumsum(c, 0) - c) << 16) | c, idx, 0)
    return tl.where(live, g >> 16, 0), tl.where(live, g & 0xFFFF, 0)


@triton.jit
def split_buckets(key, live, off, cb, slot, j, z_row, KB: tl.constexpr):
    # order_row's second level: every bucket (output offset off, size cb; the winner's slot in it)
    # splits over its own key range into cb sub-buckets laid out in its output range; returns
    # (sub-bucket, slot in it, sub-bucket sizes cc). The buckets' key ranges by atomic max / min at
    # each bucket's output offset, from the members in bucket order (the member list at
    # z_row[2KB:3KB]) in groups of G = 32 positions: the members of a group's first bucket send one
    # max and one min for the group, the others their own; so a bucket of a thousand winners (a
    # short context's -inf scores, which differ by id only) sends about a thirty-second as many
    # atomics to its address. z_row[3KB:4KB] holds the sub-bucket sizes, [5KB:9KB) the key ranges
    # (< KB, one a non-empty bucket, whatever the buckets' count).
    G: tl.constexpr = 32 if KB > 32 else KB
    lst = z_row + 2 * KB
    c2 = z_row + 3 * KB
    yh = (z_row + 5 * KB).to(tl.pointer_type(tl.int64))
    yl = yh + KB
    tl.store(lst + off + slot, j, mask=live)
    tl.store(c2 + j, tl.zeros([KB], dtype=tl.int32))
    tl.store(yh + j, tl.full([KB], -1, tl.int64))
    tl.store(yl + j, tl.full([KB], 9223372036854775807, tl.int64))
    tl.debug_barrier()
    mem = tl.minimum(tl.maximum(tl.load(lst + j, mask=live, other=0, cache_modifier=".cg"), 0), KB - 1)
    mkey = tl.gather(key, mem, 0)  # position p (< nsel) of the bucket order: its key and its bucket's offset
    moff = tl.where(live, tl.gather(off, mem, 0), KB)
    lead = tl.broadcast_to(tl.min(tl.reshape(moff, [KB // G, G]), 1)[:, None], [KB // G, G])
    first = tl.reshape(moff, [KB // G, G]) == lead  # in the group's first bucket
    k2 = tl.reshape(mkey, [KB // G, G])
    gmax = over_groups(tl.max(tl.where(first, k2, -1), 1), G, KB)
    gmin = over_groups(tl.min(tl.where(first, k2, 9223372036854775807), 1), G, KB)
    first = tl.reshape(first, [KB])
    send = live & ((first == 0) | (j % G == 0))  # (position j: a group's first is in its first bucket)
    tl.atomic_max(yh + moff, tl.where(first, gmax, mkey), mask=send, sem="relaxed", scope="cta")
    tl.atomic_min(yl + moff, tl.where(first, gmin, mkey), mask=send, sem="relaxed", scope="cta")
    tl.debug_barrier()
    bh = tl.load(yh + off, mask=live, other=0, cache_modifier=".cg")
    bl = tl.load(yl + off, mask=live, other=0, cache_modifier=".cg")
    sh2 = bit_length(tl.maximum(bh - bl, 0) // tl.maximum(cb, 1).to(tl.int64))
    sub = off + tl.where(live, (bh - key) >> sh2, 0).to(tl.int32)  # < off + cb
    slot = tl.atomic_add(c2 + sub, tl.full([KB], 1, tl.int32), mask=live, sem="relaxed", scope="cta")
    tl.debug_barrier()
    cc = tl.load(c2 + j, cache_modifier=".cg")
    return sub, slot, cc


@triton.jit
def key_bits(key):
    # a packed key's raw score bits (score_key inverted), except a NaN's: its score key is
    # INT_MIN + 1 whatever its payload, so score_bits reads those bits from the row
    s = (key >> 31).to(tl.int32) ^ -2147483648
    return tl.where(s >= 0, s, s ^ 0x7FFFFFFF)


@triton.jit
def nan_key(key):
    # whether a packed key's score key is a NaN's (INT_MIN + 1, the lowest valid one) or below
    return (key >> 31) <= 1


@triton.jit
def score_bits(key, o, live, sc_row):
    # a winner's raw score bits from its packed key; a NaN's from the row at its position o
    nan = live & nan_key(key)
    return tl.where(nan, tl.load(sc_row + o, mask=nan, other=0.0).to(tl.int32, bitcast=True), key_bits(key))


@triton.jit
def write_ordered(oid_row, osc_row, key, o, j, dest, nsel, inv, sc_row, nan_wins, inv_read, K, KB: tl.constexpr):
    # the winners (lane j < nsel: key, position o) to the output row at their ranks dest, pads
    # past them, with coalesced stores: each lane writes its index at its rank (inv, KB int32 of
    # scratch; dest is a permutation of 0 .. KB), and output slot j gathers the key of lane
    # inv[j] from registers and rebuilds its score bits (key_bits); only where a NaN wins
    # (nan_wins: the smallest winner key is a NaN's) are the positions gathered too and the NaN
    # payloads read from the row (sc_row): 0.985-0.997x the time of the bits built in each lane,
    # every winner's masked payload load with them, and gathered beside the key (H200, N =
    # 8192-16384, 64-4096 rows, session 12 of docs/benchmarks_select_kernel.md). (Stores of ids
    # and scores at the ranks themselves, scattered, queued on the memory pipe: H200, 1024 rows
    # of 16384, bench/bench_row_phases.py: 0.2767 against 0.2676 ms with the bits from the key.)
    # inv_read: inv's scratch was read before (split_buckets' sizes), so a barrier first
    if inv_read:
        tl.debug_barrier()
    tl.store(inv + dest, j)
    tl.debug_barrier()
    src = tl.minimum(tl.maximum(tl.load(inv + j, cache_modifier=".cg"), 0), KB - 1)
    ks = tl.gather(key, src, 0)
    ls = j < nsel
    mk = j < K
    vs = key_bits(ks)
    if nan_wins:
        vs = score_bits(ks, tl.gather(o, src, 0), ls, sc_row)
    tl.store(oid_row + j, tl.where(ls, key_id(ks), -1).to(tl.int32), mask=mk)
    tl.store(osc_row + j, tl.where(ls, vs, -8388608).to(tl.float32, bitcast=True), mask=mk)


@triton.jit
def rank_in_bucket(key, o, live, off, cb, members, big, KB: tl.constexpr):
    # each winner's rank in its (sub-)bucket (output offset off, size cb; members: the winners'
    # indices in bucket order; big: the largest bucket): the members before it, a larger key or
    # an equal key at an earlier position. A step of the count gathers one key; positions only in
    # a second count, where two winners share a key (a duplicate id, equal or NaN scores).
    mkey = tl.gather(key, members, 0)  # the members' keys in bucket order
    r = tl.zeros([KB], dtype=tl.int32)
    eq = tl.zeros([KB], dtype=tl.int32)
    for t in range(0, big):
        mt = live & (t < cb)
        ko = tl.gather(mkey, tl.minimum(off + t, KB - 1), 0)
        r += (mt & (ko > key)).to(tl.int32)
        eq += (mt & (ko == key)).to(tl.int32)
    if tl.max(eq, 0) > 1:
        mo = tl.gather(o, members, 0)
        for t in range(0, big):
            mt = live & (t < cb)
            at = tl.minimum(off + t, KB - 1)
            ko = tl.gather(mkey, at, 0)
            oo = tl.gather(mo, at, 0)
            r += (mt & (ko == key) & (oo < o)).to(tl.int32)
    return r


@triton.jit(noinline=True)  # (noinline: select_kernel's docstring, Compile time)
def order_row(wk_row, wo_row, nsel, z_row, sc_row, oid_row, osc_row, K, refined, KB: tl.constexpr,
              SPLIT_AT: tl.constexpr, NB: tl.constexpr, ZEROED: tl.constexpr, PARTS: tl.constexpr = False):
    # one program orders one row's nsel winners (W slots 0 .. nsel) into the output row, pads
    # past them. Bucket rank: bucket_counts gives the sizes of NB buckets (KB or 2 KB; more
    # buckets, fewer members each) and each winner a slot in its bucket; a scan of the sizes
    # gives the buckets' output offsets. When a bucket holds more
    # than SPLIT_AT winners (SPLIT in production; keys in clusters: a tie group and a few
    # others), the first level maps again in three parts (part_counts: positive and negative
    # score keys, each over its own range, above the tie at the smallest score key). H200,
    # graph replay, 64-4096 rows (docs/benchmarks_select_kernel.md, session 16): a short context
    # 0.94-0.98x the time, ties at N = 8192 0.94-0.96x, random scores (which never map again)
    # 0.99-1.008x. Where a part still crowds, every bucket splits again (split_buckets), so one
    # scan over all sub-buckets gives every sub-bucket's offset.
    # A winner's rank in its (sub-)bucket counts the members before it (rank_in_bucket: a
    # step gathers one key; up to session 6 of 2026-12-02 a key and a position). Work: KB
    # winners x the largest (sub-)bucket.
    # A winner's offset and size, and the members' keys and positions in the count, come from
    # registers (tl.gather), not from global scratch: one store of the member list, one barrier
    # and one load where every step of the count took two dependent L2 round trips. H200, 1024
    # rows of 16384 (bench/bench_row_phases.py, variant scratch): 0.310 against 0.335 ms.
    # The output: write_ordered (score bits from the keys, W holds none; sc_row: the row's
    # scores, for NaN payloads). z_row: ORDER_SCRATCH x KB int32; ZEROED: its first NB are
    # zero already (the row kernel zeroed them after its compaction: no store and barrier here);
    # refined (a runtime flag, read where PARTS: the row kernel refined its cutoff bin, a mass
    # tie): the first level in parts at once (part_counts), not one map first
    # (select_kernel.parts_first).
    by_parts = 0  # (a constant where PARTS is off: the code below not compiled)
    if PARTS:
        by_parts = refined
    if by_parts:  # the row kernel refined its cutoff bin (a mass tie): the first level in parts at once
        # (W read here as bucket_counts reads it: a helper shared by both changed the 16384
        # tile's timed SASS, python tools/compile_select_kernels.py --sass)
        j = tl.arange(0, KB)
        live = j < nsel
        key = tl.load(wk_row + j, mask=live, other=-1)
        o = tl.load(wo_row + j, mask=live, other=0)
        lo = tl.min(tl.where(live, key, 9223372036854775807), 0)
        bkt, slot, c = part_counts(key, live, lo, nsel, z_row + 5 * KB, NB)
        big = tl.max(c, 0)
    else:
        j, live, key, o, bkt, slot, c, lo = bucket_counts(wk_row, wo_row, nsel, z_row, KB, NB, ZEROED)
        big = tl.max(c, 0)
        if big > SPLIT_AT:  # a crowded bucket: the first level again, in parts (part_counts)
            bkt, slot, c = part_counts(key, live, lo, nsel, z_row + 5 * KB, NB)
            big = tl.max(c, 0)
    split = big > SPLIT_AT
    off, cb = offsets_sizes(c, bkt, live)
    if split:  # still crowded: a second level over each bucket's own key range
        tl.debug_barrier()  # (the parts' sizes, which others may still read, share its scratch)
        sub, slot, cc = split_buckets(key, live, off, cb, slot, j, z_row, KB)
        big = tl.max(cc, 0)
        off, cb = offsets_sizes(cc, sub, live)
    r = tl.zeros([KB], dtype=tl.int32)
    if big > 1:
        lst = z_row + 2 * KB
        tl.store(lst + off + slot, j, mask=live)
        tl.debug_barrier()
        members = tl.minimum(tl.maximum(tl.load(lst + j, mask=live, other=0, cache_modifier=".cg"), 0), KB - 1)
        r = rank_in_bucket(key, o, live, off, cb, members, big, KB)
    write_ordered(oid_row, osc_row, key, o, j, tl.where(live, off + r, j), nsel, z_row + 3 * KB, sc_row,
                  nan_key(lo), split, K, KB)  # (lo: the smallest winner key)


@generic_jit
def bucket_kernel(wk_ptr, wo_ptr, cnt_ptr, z_ptr, sc_ptr, oid_ptr, osc_ptr, K, s_sq, s_oi, s_os, KB: tl.constexpr):
    # grid (Q,): order_row for each row of W (the staged path's winners; sc_ptr: the scores)
    row = tl.program_id(0).to(tl.int64)
    order_row(wk_ptr + row * KB, wo_ptr + row * KB, tl.load(cnt_ptr + row), z_ptr + row * (ORDER_SCRATCH * KB),
              sc_ptr + row * s_sq, oid_ptr + row * s_oi, osc_ptr + row * s_os, K, 0, KB, SPLIT, KB, False)


def winner_workspace(q: int, kb: int, extra: int, device) -> tuple[torch.Tensor, ...]:
    """One allocation: W keys (int64 ``[Q, KB]``), W score bits, W positions (int32), the winner
    count a row, then ``extra`` int32 a row for the caller (the in-play list).

    Every part starts on a 16-byte boundary: Triton specialises a pointer argument on its
    alignment, so a part that started 4 bytes off for some ``Q`` (the in-play list did after
    the ``Q`` winner counts, for ``Q`` not a multiple of 4) compiled a second kernel for shapes
    of one launch plan."""
    sizes = (q * kb * 2, q * kb, q * kb, q, q * extra)
    starts = []
    end = 0
    for size in sizes:
        starts.append(end)
        end = -(-(end + size) // 4) * 4
    ws = torch.empty((end,), dtype=torch.int32, device=device)
    wk, wv, wo, cnt, rest = (ws[a: a + size] for a, size in zip(starts, sizes))
    return wk.view(torch.int64), wv, wo, cnt, rest


def order_winners(wk, wv, wo, cnt, out_ids, out_sc, k: int, kb: int, n_sm: int, order: str | None = None,
                  tile: tuple[int, int] | None = None, binned=None, span: int | None = None,
                  scores: torch.Tensor | None = None):
    """Write the ordered winners of W to ``out_ids``/``out_sc`` ``[Q, k]``, pads past them.

    ``order``: ``"rank"`` (rank kernel; default up to ``RANK_MAX_ROWS`` rows: its work grows as
    ``Q k^2``; ``tile``: its (rows, cols), default ``select_staged.rank_tile`` of ``kb``: a
    binned W passes the tile of its winners, since its stride is larger), ``"bucket"``
    (one program a row, ``order_row``; the default beyond) or ``"sort"`` (``torch.sort`` of
    the keys, then a decode that puts runs of equal keys in position order). Only W's first
    ``cnt`` slots of a row hold winners, or (``binned``: the staged path's workspace ``z``, its
    row stride and first-digit bits, the rank ordering only) W is sorted by the first digit and may hold a
    whole cutoff bin (``_rank_kernel``). ``kb``: W's row stride; ``span``: the slots of a row
    the rank kernel covers (default ``kb``: at least its entries and ``k``). ``scores``: the
    rows W's positions index (the bucket ordering reads a NaN winner's score bits there).
    """
    from .select_staged import RANK_MAX_ROWS, rank_tile

    q = out_ids.shape[0]
    if order is None:
        order = "rank" if q <= RANK_MAX_ROWS else "bucket"
    if order == "rank":
        sl, jb = rank_tile(q, kb, n_sm, binned is not None) if tile is None else tile
        z, zs, hb = (cnt, 1, 1) if binned is None else binned
        grid = (q, -(-(kb if span is None else span) // sl))
        launch(_rank_kernel, grid, wk, wv, wo, cnt, z, out_ids, out_sc, k, out_ids.stride(0), out_sc.stride(0),
               KB=kb, SL=sl, JB=jb, BINNED=binned is not None, ZS=int(zs), HB=int(hb), num_warps=4)
    elif binned is not None:
        raise ValueError("a binned W needs the rank ordering")
    elif order == "sort":
        keys = wk.view(q, kb)  # slots past a row's winners: key -1, so they sort last
        keys.masked_fill_(torch.arange(kb, device=wk.device) >= cnt.view(q, 1), -1)
        key, pos = torch.sort(keys, dim=1, descending=True)
        launch(_decode_runs_kernel, (q,), key, pos, wv, wo, cnt, out_ids, out_sc, k, out_ids.stride(0),
               out_sc.stride(0), KB=kb, num_warps=max(1, min(8, kb // 256)))
    elif order == "bucket":
        if scores is None:
            raise ValueError("the bucket ordering needs the scores (a NaN winner's bits)")
        z = torch.empty((q * ORDER_SCRATCH.value * kb,), dtype=torch.int32, device=wk.device)
        launch(bucket_kernel, (q,), wk, wo, cnt, z, scores, out_ids, out_sc, k, scores.stride(0), out_ids.stride(0),
               out_sc.stride(0), KB=kb, num_warps=max(1, min(8, kb // 256)))
    else:
        raise ValueError(f"order must be rank, bucket or sort, got {order!r}")
    return out_ids, out_sc
