"""ordered_select (single process) against an independent pure-Python reference.

The reference sorts candidates by the Order rule written out directly: scores are
decoded from their fp32 bits into exact ``Fraction``s (no float arithmetic, no
torch.topk, no packed key), NaN is a class below -inf, +0.0 ranks above -0.0.
``test_select_ranks.py`` imports ``reference_select`` and ``special_bits`` from here.
"""
from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpflare.ops.ordering import ordered_select, order_keys, torch_ordered_select

NEG_INF_BITS = 0xFF800000


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


# Scores that exercise every branch of the order: zeros of both signs, infinities,
# NaNs with several payloads and both signs, subnormals, the extremes.
special_bits = [
    f32_bits(0.0), f32_bits(-0.0), f32_bits(math.inf), f32_bits(-math.inf),
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBFFFFF,
    0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
    0x7F7FFFFF, 0xFF7FFFFF, f32_bits(1.0), f32_bits(-1.0), f32_bits(1.5),
]


def _rank_of_bits(bits: int) -> tuple[int, Fraction, int]:
    """(class, exact value, sign rank): class 3 = +inf, 2 = finite, 1 = -inf, 0 = NaN.

    The sign rank (1 = positive) only decides between the two zeros.
    """
    neg, exp, man = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exp == 0xFF:
        if man:
            return 0, Fraction(0), 0
        return (1, Fraction(0), 0) if neg else (3, Fraction(0), 1)
    mag = Fraction(man, 2 ** 149) if exp == 0 else Fraction(man | 0x800000) * Fraction(2) ** (exp - 150)
    return 2, -mag if neg else mag, 1 - neg


def reference_row(bits: list[int], ids: list[int], k: int) -> tuple[list[int], list[int]]:
    """Top-k of one row: (ids, score bits), padding = (-1, bits of -inf)."""
    def key(j):
        cls, val, sign = _rank_of_bits(bits[j])
        return (0 if ids[j] >= 0 else 1, -cls, -val, -sign, ids[j])

    order = sorted(range(len(ids)), key=key)[:k]
    out_ids = [ids[j] if ids[j] >= 0 else -1 for j in order]
    out_bits = [bits[j] if ids[j] >= 0 else NEG_INF_BITS for j in order]
    return out_ids, out_bits


def reference_select(scores_list, ids_list, k):
    """Reference over candidate shards (one ``[Q, C]`` pair per rank, concatenated per row)."""
    scores = torch.cat(list(scores_list), dim=1)
    ids = torch.cat(list(ids_list), dim=1)
    bits = (scores.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist()
    out = [reference_row(b, i, k) for b, i in zip(bits, ids.tolist())]
    return [o[0] for o in out], [o[1] for o in out]


def as_bits(scores: torch.Tensor) -> list:
    return (scores.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist()


def from_bits(bits) -> torch.Tensor:
    t = torch.tensor(bits, dtype=torch.int64)
    return torch.where(t >= 2 ** 31, t - 2 ** 32, t).to(torch.int32).view(torch.float32)


def test_reference_on_hand_example():
    # one row, every class; expected order written out by hand
    bits = [f32_bits(1.0), 0x7FC00000, f32_bits(-0.0), f32_bits(0.0), f32_bits(-math.inf),
            f32_bits(2.0), f32_bits(math.inf), 0xFFC00000, f32_bits(5.0)]
    ids = [5, 1, 2, 3, 4, -1, 9, 0, -7]
    exp_ids = [9, 5, 3, 2, 4, 0, 1, -1, -1]
    exp_bits = [f32_bits(math.inf), f32_bits(1.0), f32_bits(0.0), f32_bits(-0.0),
                f32_bits(-math.inf), 0xFFC00000, 0x7FC00000, NEG_INF_BITS, NEG_INF_BITS]
    assert reference_row(bits, ids, 9) == (exp_ids, exp_bits)
    s, i = from_bits([bits]), torch.tensor([ids], dtype=torch.int32)
    got_ids, got_scores = ordered_select(s, i, 9)
    assert got_ids.tolist() == [exp_ids]
    assert as_bits(got_scores) == [exp_bits]
    assert got_ids.dtype == torch.int32 and got_scores.dtype == torch.float32


def test_keys_rank_specials_in_order():
    # strictly descending keys for one id; every NaN ties
    ordered = [f32_bits(math.inf), 0x7F7FFFFF, f32_bits(1.0), 0x00000001, f32_bits(0.0),
               f32_bits(-0.0), 0x80000001, f32_bits(-1.0), 0xFF7FFFFF, f32_bits(-math.inf),
               0x7FC00000]
    s = from_bits([ordered])
    keys = order_keys(s, torch.full((1, len(ordered)), 7, dtype=torch.int32))[0].tolist()
    assert all(a > b for a, b in zip(keys, keys[1:])), keys
    nans = from_bits([[0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0xFFC00000]])
    k2 = order_keys(nans, torch.full((1, 4), 3, dtype=torch.int32))[0].tolist()
    assert len(set(k2)) == 1 and k2[0] < keys[-2]


def test_tied_scores_break_by_lower_id_and_padding_fills():
    s = torch.full((2, 6), 0.25)
    i = torch.tensor([[40, 3, 17, -1, 8, 2], [-1, -1, -1, -5, 6, -1]], dtype=torch.int32)
    ids, scores = ordered_select(s, i, 4)
    assert ids.tolist() == [[2, 3, 8, 17], [6, -1, -1, -1]]
    assert scores[1, 1:].tolist() == [-math.inf] * 3


def test_noncontiguous_input_and_kernel_choice_on_cpu():
    torch.manual_seed(1)
    s = torch.randn(8, 5)
    i = torch.randperm(40, dtype=torch.int32).view(8, 5)
    exp = reference_select([s.t()], [i.t()], 5)
    for kernel in ("torch", "triton", "auto"):  # CPU always uses torch
        ids, scores = ordered_select(s.t(), i.t(), 5, kernel=kernel)
        assert (ids.tolist(), as_bits(scores)) == exp


@pytest.mark.parametrize("bad, match", [
    (dict(scores=torch.zeros(2, 3, dtype=torch.float64)), "scores must be float32"),
    (dict(ids=torch.zeros(2, 3, dtype=torch.int64)), "ids must be int32"),
    (dict(scores=torch.zeros(6)), "scores must be 2-D"),
    (dict(ids=torch.zeros(2, 4, dtype=torch.int32)), "ids shape"),
    (dict(k=0), "k=0"),
    (dict(k=4), "k=4"),
    (dict(k=2.0), "k must be an int"),
])
def test_bad_inputs_name_the_argument(bad, match):
    args = dict(scores=torch.zeros(2, 3), ids=torch.zeros(2, 3, dtype=torch.int32), k=2)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        ordered_select(args["scores"], args["ids"], args["k"])


def test_unknown_kernel_name_is_an_error():
    from tpflare.ops.ordering import resolve_kernel

    with pytest.raises(ValueError, match="kernel='fast'"):
        ordered_select(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32), 2, kernel="fast")
    with pytest.raises(ValueError, match="kernel='fast'"):
        resolve_kernel("fast", "cpu", 3, 2)


def test_kernel_is_an_argument_never_a_global_read(monkeypatch):
    """The knob is read at preparation (resolve_kernel), never by ordered_select: changing it
    after preparation changes nothing; the CPU resolves every choice to torch."""
    import tpflare
    from tpflare.ops import ordering

    for choice in ("torch", "auto", "triton"):
        assert ordering.resolve_kernel(choice, torch.device("cpu"), 16384, 2048) == "torch"
    calls = []
    monkeypatch.setattr(ordering, "_triton_impl", lambda: calls.append(1))
    s, i = torch.randn(2, 8), torch.arange(16, dtype=torch.int32).view(2, 8)
    with tpflare.config.patch(select_kernel="triton"):
        ids, _ = ordered_select(s, i, 3)  # default kernel="torch", whatever the knob says
    assert ids.tolist() == reference_select([s], [i], 3)[0] and calls == []


# --- property tests --------------------------------------------------------------------
_bits = st.one_of(
    st.sampled_from(special_bits),
    st.integers(0, 2 ** 32 - 1),                                  # any bit pattern
    st.sampled_from([f32_bits(x) for x in (0.5, 0.25, -0.5, 3.0)]),  # many exact ties
)


@st.composite
def candidate_rows(draw):
    q = draw(st.integers(1, 4))
    n = draw(st.integers(1, 24))
    k = draw(st.integers(1, n))
    bits = [[draw(_bits) for _ in range(n)] for _ in range(q)]
    ids = []
    for _ in range(q):
        valid = draw(st.lists(st.integers(0, 2 ** 31 - 1), min_size=n, max_size=n, unique=True))
        invalid = st.sampled_from([-1, -1, -2, -(2 ** 31)])
        ids.append([v if draw(st.booleans()) or draw(st.booleans()) else draw(invalid)
                    for v in valid])
    return bits, ids, k


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(candidate_rows())
def test_ordered_select_matches_reference(case):
    bits, ids, k = case
    s, i = from_bits(bits), torch.tensor(ids, dtype=torch.int32)
    got_ids, got_scores = torch_ordered_select(s, i, k)
    exp_ids, exp_bits = reference_select([s], [i], k)
    assert got_ids.tolist() == exp_ids
    assert as_bits(got_scores) == exp_bits


@settings(max_examples=100, deadline=None)
@given(candidate_rows(), st.permutations(list(range(24))))
def test_result_does_not_depend_on_candidate_order(case, perm):
    bits, ids, k = case
    n = len(ids[0])
    p = [j for j in perm if j < n]
    s, i = from_bits(bits), torch.tensor(ids, dtype=torch.int32)
    a = ordered_select(s, i, k)
    b = ordered_select(s[:, p], i[:, p], k)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32))


@pytest.mark.gpu
def test_cuda_matches_cpu_and_kernel_dispatch():
    import tpflare
    from tpflare.ops.ordering import _triton_impl

    torch.manual_seed(0)
    s = torch.randn(16, 4096)
    s[:, ::7] = s[:, 3:4]  # exact ties
    s[0, :5] = float("nan")
    i = torch.randperm(16 * 4096, dtype=torch.int32).view(16, 4096)
    i[2] = -1
    exp = reference_select([s], [i], 2048)
    for kernel in ("torch", "auto", "triton"):
        if kernel == "triton" and _triton_impl() is None:
            with pytest.raises(RuntimeError, match="kernel='triton'"):
                ordered_select(s.cuda(), i.cuda(), 2048, kernel=kernel)
            continue
        with tpflare.config.patch(select_kernel="torch"):  # the knob is not read here
            ids, scores = ordered_select(s.cuda(), i.cuda(), 2048, kernel=kernel)
        assert (ids.cpu().tolist(), as_bits(scores.cpu())) == exp, kernel
    # beyond the Triton kernel's row limit: the torch path, exact
    from tpflare.ops import select_kernel as sk

    n = sk.MAX_CANDIDATES + 8
    s2 = torch.randn(1, n)
    i2 = torch.randperm(n, dtype=torch.int32).view(1, n)
    ids, scores = ordered_select(s2.cuda(), i2.cuda(), 64, kernel="auto")
    assert (ids.cpu().tolist(), as_bits(scores.cpu())) == reference_select([s2], [i2], 64)
