"""Triton helpers shared by the selection kernels: the score key and radix-select digits.

Keys are int32 whose *signed* order is the selection order. A digit ``p`` of width ``D``
(most significant first; the last digit takes what is left of the 32 bits) is handed out as
an unsigned bin number: the sign bit is flipped in digit 0 so negative keys sort below
positive ones. A prefix ``t`` holds the raw bits of the digits found so far.

Imported only where Triton imports (``select_kernel.py``, ``select_staged.py``).
"""
from __future__ import annotations

import triton
import triton.language as tl


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
    suf = tl.cumsum(h, 0, reverse=True)  # candidates with digit >= d
    bins = tl.arange(0, NB).to(tl.int64)
    packed = tl.where(suf >= rem, (bins << 40) | ((suf - h).to(tl.int64) << 20) | h.to(tl.int64), 0)
    best = tl.max(packed, 0)  # the largest digit whose suffix still holds rem
    d = (best >> 40).to(tl.int32)
    above = ((best >> 20) & 0xFFFFF).to(tl.int32)
    cnt = (best & 0xFFFFF).to(tl.int32)
    return d, above, cnt


@triton.jit
def digit(s, p: tl.constexpr, D: tl.constexpr):
    # p-th digit (most significant first) of an int32 key, as an unsigned number: digits
    # are D bits wide, the last one takes what is left of the 32 bits
    if D * (p + 1) <= 32:
        d = (s >> (32 - D * (p + 1))) & ((1 << D) - 1)
        if p == 0:
            d = d ^ (1 << (D - 1))  # the sign bit: negative keys below positive ones
    else:
        d = s & ((1 << (32 - D * p)) - 1)
    return d


@triton.jit
def prefix_is(s, t, p: tl.constexpr, D: tl.constexpr):
    # do the digits above digit p of key s equal the prefix t (raw bits)?
    return ((s >> (32 - D * p)) & ((1 << (D * p)) - 1)) == t


@triton.jit
def extend(t, dd, p: tl.constexpr, D: tl.constexpr):
    # the prefix t (raw bits) followed by digit dd
    if p == 0:
        t = dd ^ (1 << (D - 1))
    else:
        if D * (p + 1) <= 32:
            t = (t << D) | dd
        else:
            t = (t << (32 - D * p)) | dd
    return t


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
