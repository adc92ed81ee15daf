"""GPU tests of ops/select_kernel.py against two independent references.

* ``ref_packed``: a packed int64 key (valid | total-order score bits | inverted id)
  and a stable ``torch.sort`` (equal keys in position order), scores gathered by the
  returned positions.
* ``ref_python``: a plain Python sort with the rule spelled out on Python floats
  (small cases only).

Exactness is bitwise: ids equal and score bits equal (``view(torch.int32)``).
Run on a CUDA machine: ``pytest -m gpu tests/test_select_kernel_gpu.py``; it also
runs as a script (``python tests/test_select_kernel_gpu.py``). Under
``TRITON_INTERPRET=1`` (CPU, Triton installed) the small cases run on the CPU.
"""
from __future__ import annotations

import functools
import math
import os
import sys

import pytest
import torch

from tpflare.ops import select_kernel as sk

pytestmark = pytest.mark.gpu

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _device():
    if INTERPRET:
        return "cpu"
    return "cuda"


def _require_path(path):
    """Skip the block path where it cannot run (the interpreter: CUDA C; no NVRTC entry point)."""
    from tpflare.ops import select_block

    if path == "block" and (INTERPRET or not select_block.available()):
        pytest.skip("the block path needs CUDA and torch's NVRTC entry point")


@pytest.fixture
def triton_only(monkeypatch):
    """The dispatcher without the block path: tests of the Triton kernels' launch plans and
    compiles, whose shapes the block path would otherwise take."""
    monkeypatch.setattr(sk, "BLOCK_PATH", False)
    sk._first_call_plan.cache_clear()
    yield
    sk._first_call_plan.cache_clear()


def _require_kernel():
    if INTERPRET and sk._HAVE_TRITON:
        return
    if not sk._HAVE_TRITON:
        pytest.skip("triton is not importable here")
    if not sk.available():
        pytest.skip("no CUDA device")


# --------------------------------------------------------------------------- references
def _score_order_key(scores: torch.Tensor) -> torch.Tensor:
    """int64 in [0, 2^32): larger = earlier; IEEE bit order with all NaN at 0 (below -inf)."""
    b = scores.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = (b & 0x80000000) != 0
    u = torch.where(neg, b ^ 0xFFFFFFFF, b | 0x80000000)
    return torch.where(torch.isnan(scores), torch.zeros_like(u), u)


def ref_packed(scores: torch.Tensor, ids: torch.Tensor, k: int):
    """On the inputs' device (torch.topk there: independent of the Triton kernel)."""
    q, n = scores.shape
    valid = ids >= 0
    key = (_score_order_key(scores) << 31) | (0x7FFFFFFF - ids.to(torch.int64).clamp(min=0))
    key = torch.where(valid, key, torch.full_like(key, -1))
    kk = min(k, n)
    out_ids = torch.full((q, k), -1, dtype=torch.int32, device=scores.device)
    out_sc = torch.full((q, k), float("-inf"), dtype=torch.float32, device=scores.device)
    if kk > 0:
        # a stable sort: equal keys (duplicate ids with NaN scores) stay in position order
        top, pos = torch.sort(key, dim=1, descending=True, stable=True)
        top, pos = top[:, :kk], pos[:, :kk]
        ok = top >= 0
        out_ids[:, :kk] = torch.where(ok, torch.gather(ids, 1, pos), torch.full_like(pos, -1, dtype=torch.int32))
        g = torch.gather(scores.view(torch.int32), 1, pos)
        out_sc[:, :kk] = torch.where(ok, g, torch.full_like(g, -8388608)).view(torch.float32)
    return out_ids, out_sc


def _py_rank(score: float, bits: int, ident: int):
    if ident < 0:
        return (1, 0, 0.0, 0, 0)
    if math.isnan(score):
        return (0, 1, 0.0, 0, ident)
    # +0.0 before -0.0 (IEEE bit order); otherwise plain descending value
    return (0, 0, -score, 1 if (score == 0.0 and bits >> 31) else 0, ident)


def ref_python(scores: torch.Tensor, ids: torch.Tensor, k: int):
    scores = scores.cpu()
    ids = ids.cpu()
    q, n = scores.shape
    bits = scores.view(torch.int32)
    out_ids = torch.full((q, k), -1, dtype=torch.int32)
    out_sc = torch.full((q, k), float("-inf"), dtype=torch.float32)
    ob = out_sc.view(torch.int32)
    for r in range(q):
        sl, bl, il = scores[r].tolist(), bits[r].tolist(), ids[r].tolist()
        order = sorted(range(n), key=lambda j: _py_rank(sl[j], bl[j] & 0xFFFFFFFF, il[j]))
        for slot, j in enumerate(order[:k]):
            if il[j] < 0:
                break
            out_ids[r, slot] = il[j]
            ob[r, slot] = bl[j]
    return out_ids, out_sc


# --------------------------------------------------------------------------- inputs
def make_case(kind: str, q: int, n: int, k: int, seed: int, device: str = "cpu"):
    """Inputs on ``device`` (made there: large cases are quick on a GPU)."""
    with torch.device(device):
        return _make_case(kind, q, n, k, seed, device)


def _make_case(kind, q, n, k, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    # distinct global ids per row (spread over a KV range 4n wide), random order
    ids = (torch.rand(q, n, generator=g).argsort(dim=1) * 4 + torch.randint(0, 4, (q, 1), generator=g)).to(torch.int32)
    scores = torch.randn(q, n, generator=g)
    if kind == "random":
        pass
    elif kind == "ties":
        # few distinct values: the cutoff falls inside a large tie group
        scores = torch.randint(0, 5, (q, n), generator=g).float() * 0.25
    elif kind == "equal":
        scores = torch.full((q, n), 1.5)
    elif kind == "special":
        # bit patterns: +-inf, +-0, quiet and signalling NaNs of both signs, +-1, +-tiny
        bits = [0x7F800000, 0xFF800000, 0x00000000, 0x80000000, 0x7FC00000, 0xFFC00001,
                0x7F800001, 0xFFFFFFFF, 0x3F800000, 0xBF800000, 0x00000001, 0x80000001]
        specials = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)
        pick = torch.randint(0, len(specials), (q, n), generator=g)
        mix = torch.rand(q, n, generator=g) < 0.7
        scores = torch.where(mix, specials[pick], scores)
    elif kind == "padding":
        # a ragged number of valid candidates a row, some rows below k, one row empty
        nvalid = torch.randint(0, n + 1, (q,), generator=g)
        nvalid[0] = min(n, max(0, k // 3))
        if q > 2:
            nvalid[1] = 0
        pad = torch.rand(q, n, generator=g).argsort(dim=1) >= nvalid[:, None]
        ids = torch.where(pad, torch.full_like(ids, -1), ids)
        scores = torch.where(torch.rand(q, n, generator=g) < 0.5, scores, torch.full_like(scores, float("-inf")))
    elif kind == "dups":
        # duplicate (id, score) pairs straddling the cutoff, plus ties
        scores = torch.randint(0, 3, (q, n), generator=g).float()
        half = n // 2
        ids[:, half:] = ids[:, : n - half].clone()
        scores[:, half:] = scores[:, : n - half].clone()
    elif kind == "nandups":
        # most scores NaN with assorted payloads, and every id twice: equal keys (same id, both
        # NaN) whose score bits differ, so only the position order tells them apart
        nan_bits = torch.tensor([0x7FC00000, 0x7FC00001, 0x7F800001, 0xFFC00002 - (1 << 32), 0xFFFFFFFF - (1 << 32)],
                                dtype=torch.int32).view(torch.float32)
        pick = torch.randint(0, len(nan_bits), (q, n), generator=g)
        scores = torch.where(torch.rand(q, n, generator=g) < 0.8, nan_bits[pick], scores)
        half = n // 2
        ids[:, half:] = ids[:, : n - half].clone()
    else:
        raise ValueError(kind)
    return scores.contiguous(), ids.contiguous()


def check_equal(got, ref, what=""):
    gi, gs = got[0].cpu(), got[1].cpu()
    ri, rs = ref[0].cpu(), ref[1].cpu()
    assert gi.shape == ri.shape and gs.shape == rs.shape, what
    bad = (gi != ri).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} id mismatches, first at {bad[0].tolist()}: got {gi[tuple(bad[0])]} want {ri[tuple(bad[0])]}"
    sb = (gs.view(torch.int32) != rs.view(torch.int32)).nonzero()
    assert sb.numel() == 0, f"{what}: {sb.shape[0]} score-bit mismatches, first at {sb[0].tolist()}"


def run_kernel(scores, ids, k, **config):
    dev = _device()
    return sk.triton_ordered_select(scores.to(dev), ids.to(dev), k, **config)


# --------------------------------------------------------------------------- tests
KINDS = ["random", "ties", "equal", "special", "padding", "dups", "nandups"]


def _interpreter_third(*at: int) -> None:
    """In Triton's interpreter (CI's CPU subset), run a third of a test's grid: the cells whose
    indices (one a parameter) sum to a multiple of 3, so that each value of a parameter still runs
    against about a third of each other's (CI's suite time: every other cell in session 28, a third
    in session 30); the GPU runs them all."""
    if INTERPRET and sum(at) % 3:
        pytest.skip("interpreter: a third of this grid's cells (the GPU runs them all)")


def test_references_agree():
    for kind in KINDS:
        for n, k in [(37, 5), (64, 64), (50, 80), (300, 1)]:
            scores, ids = make_case(kind, 3, n, k, seed=hash((kind, n, k)) % 1000)
            check_equal(ref_packed(scores, ids, k), ref_python(scores, ids, k), f"refs {kind} n={n} k={k}")


SMALL = [(37, 5), (100, 64), (300, 1), (2048, 64), (1000, 2048), (6144, 100)]


VARIANTS = {"staged": dict(path="staged"), "row": dict(path="row"), "block": dict(path="block"),
            "row_chunked": dict(resident=False),
            "staged_finish": dict(staged=dict(rank_play=0)),  # the finish picks every cutoff bin's winners
            "staged_rank16": dict(staged=dict(rank_play=16, rank_cols=16)),  # cutoff bins of <= 16 ranked; short rank steps
            "row_wide": dict(resident=False, num_warps=32, chunk=8192),  # 32 warps, chunks of 8192
            "row_chunk128": dict(resident=False, chunk=128)}  # chunks narrower than radix.SLOT_COLS


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k", SMALL)
def test_small_against_python(kind, n, k, variant):
    """The staged path, the block path and the row kernel's tiles (keys in registers / chunks
    re-read, with 16 or 32 warps) against a plain sort."""
    _require_kernel()
    _require_path(VARIANTS[variant].get("path"))
    if INTERPRET and variant == "staged_rank16" and k > 1024:
        # 128 rank steps of 16 columns: 4-29 s a case in Triton's interpreter (about 90 s of CI's
        # subset); the GPU runs it, the interpreter runs this variant at the other sizes
        pytest.skip("interpreter: staged_rank16 at k > 1024 runs on the GPU only")
    if INTERPRET and variant == "staged_finish" and k >= n:
        # every valid candidate wins, so no cutoff bin reaches the finish: the variant is the
        # default there (about 50 s of CI's subset); the GPU runs it
        pytest.skip("interpreter: staged_finish with k >= n runs on the GPU only")
    _interpreter_third(KINDS.index(kind), SMALL.index((n, k)), list(VARIANTS).index(variant))
    # (Triton's interpreter runs a staged row's many programs one after another: one row there,
    # two on the GPU; the row kernel's variants keep two rows everywhere)
    q = 1 if INTERPRET and variant.startswith("staged") else 2
    scores, ids = make_case(kind, q, n, k, seed=7)
    got = run_kernel(scores, ids, k, **VARIANTS[variant])
    check_equal(got, ref_python(scores, ids, k), f"{kind} n={n} k={k} {variant}")


# the staged path with tiny tiles: many programs a row, the finish over chunks of the in-play
# list (more than its registers hold), several rank tiles, 3- and 5-bit digits in the finish
# passes, both orderings, the finish fused into the compact kernel (last program) or not
STAGED_TILES = [(dict(ca=64, fin_chunk=32, fin_warps=1, fin_resident=64, rank_rows=16), None),
                (dict(ca=512, fin_chunk=64, fin_resident=256, radix_bits=5), "sort"),
                (dict(fin_chunk=128, radix_bits=3, fuse=False), None),
                (dict(ca=64, fuse=False, fin_resident=1024), "sort")]


@pytest.mark.parametrize("tiles", range(len(STAGED_TILES)))
@pytest.mark.parametrize("kind", KINDS)
def test_staged_tiles(kind, tiles):
    _require_kernel()
    opts, order = STAGED_TILES[tiles]
    for n, k in [(300, 64), (1000, 2048), (6144, 2048)]:
        scores, ids = make_case(kind, 3, n, k, seed=13)
        got = run_kernel(scores, ids, k, path="staged", staged=opts, order=order)
        check_equal(got, ref_packed(scores, ids, k), f"{kind} n={n} k={k} {opts} order={order}")


ROWS = [1, 7, 64, 1024]


@pytest.mark.parametrize("path", ["staged", "row", "block"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 64, 2048])
@pytest.mark.parametrize("n", [2048, 8 * 2048, 16 * 2048])
def test_against_packed_topk(kind, k, n, path):
    _require_kernel()
    _require_path(path)
    rows = (ROWS if path != "staged" else ROWS[:-1]) if not INTERPRET else [1, 2]
    for q in rows:
        scores, ids = make_case(kind, q, n, k, seed=q * 31 + n + k, device=_device())
        check_equal(run_kernel(scores, ids, k, path=path), ref_packed(scores, ids, k), f"{kind} q={q} n={n} k={k} {path}")


@pytest.mark.parametrize("kind", KINDS + ["neginf"])
@pytest.mark.parametrize("n", [3000, 6000, 8192])
def test_many_rows_capped_tiles(n, kind):
    """Beyond ``FEW_ROWS_MAX`` rows the 4096 and 8192 register tiles run 8 warps capped at 128
    registers a thread (``row_config``'s ``MANY_ROWS``; spills into local memory): every input
    kind, a mass tie among them, at k of 1, 64 and 2048, against the packed reference. (On the
    GPU only: the interpreter ignores the cap, and 300 rows would take it minutes.)"""
    _require_kernel()
    if INTERPRET:
        pytest.skip("the register cap is a compiled kernel's (GPU)")
    q = 300
    assert sk.row_config(n, q)[1:] == (sk.MANY_ROWS[0], 256 * sk.MANY_ROWS[0], True, sk.MANY_ROWS[1])
    for k in (1, 64, 2048):
        if kind == "neginf":
            scores, ids = _mass_tie("neginf", q, n, seed=n + k)
        else:
            scores, ids = make_case(kind, q, n, k, seed=n + 7 * k, device=_device())
        check_equal(run_kernel(scores, ids, k, path="row"), ref_packed(scores, ids, k), f"{kind} q={q} n={n} k={k}")


ORDERS = [("row", "rank"), ("row", "sort"), ("row", "bucket"), ("staged", "rank"), ("staged", "sort"),
          ("staged", "bucket")]
FINAL_KINDS = ["ties", "dups", "nandups", "padding", "special"]


@pytest.mark.parametrize("path,order", ORDERS, ids=[f"{p}-{o}" for p, o in ORDERS])
@pytest.mark.parametrize("kind", FINAL_KINDS)
def test_final_orderings(kind, path, order):
    """Both final orderings after both paths: the rank kernel (winners counted before each), or
    torch.sort (any tie order) and a decode that puts equal keys in position order."""
    _require_kernel()
    # (Triton's interpreter: the rank kernel's 2048 x 2048 comparisons a row took 9-34 s a case,
    # a third of CI's subset; there it ranks 512 winners, the GPU 2048)
    # (and a staged row's programs run one after another: two rows of 3072 there, three of 6144
    # on the GPU)
    _interpreter_third(FINAL_KINDS.index(kind), ORDERS.index((path, order)))
    k = 512 if INTERPRET and order == "rank" else 2048
    q, n = (2, 3072) if INTERPRET and path == "staged" else (3, 6144)
    scores, ids = make_case(kind, q, n, k, seed=5)
    got = run_kernel(scores, ids, k, path=path, order=order)
    check_equal(got, ref_packed(scores, ids, k), f"{kind} path={path} order={order} k={k}")


def _clustered(kind: str, q: int, n: int, seed: int):
    """Winner keys in clusters, where one linear bucket map of the key range fails: two tie
    groups straddling the cutoff; a tie group with a few far outliers; three tie groups of
    duplicate ids (only positions tell them apart); equal scores over a narrow id range; scores
    over 60 decades, each twice; a short context in a padded buffer (a few finite scores, the
    rest -inf with valid ids: most winners in one bucket, over many of the second level's groups
    of 32 positions, from the middle of one)."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.rand(q, n, generator=g).argsort(dim=1) * 3).to(torch.int32)
    if kind == "two_groups":
        scores = torch.where(torch.rand(q, n, generator=g) < 0.6, 1.0, 2.0)
    elif kind == "outliers":
        scores = torch.full((q, n), 0.5)
        scores[:, :7] = torch.tensor([1e30, 3e29, 1e20, 7.0, 6.5, -1.0, float("inf")])
    elif kind == "dup_groups":
        scores = torch.randint(0, 3, (q, n), generator=g).float()
        ids = ids % 97
    elif kind == "narrow_ids":
        scores = torch.full((q, n), -2.25)
        ids = (ids // 3 + 1_000_000).to(torch.int32)
    elif kind == "close_keys":  # scores over 60 decades, each twice (distinct ids): keys a few
        # units apart in the buckets of a very wide first level
        mag = torch.pow(10.0, torch.rand(q, n // 2, generator=g) * 60 - 30)
        half = torch.where(torch.rand(q, n // 2, generator=g) < 0.5, -mag, mag)
        scores = torch.stack([half, half], dim=2).reshape(q, n // 2 * 2)
        ids = ids[:, : n // 2 * 2]
    elif kind == "short_context":
        scores = torch.where(torch.rand(q, n, generator=g) < 0.05, torch.randn(q, n, generator=g), float("-inf"))
        scores[:, 1:4] = float("nan")
    elif kind == "three_groups":  # the cutoff in the 1.0 tie; 3.0 and 2.0 crowd the positive part
        scores = torch.randint(1, 4, (q, n), generator=g).float()
        scores[:, : n // 2] = 1.0
    elif kind == "signs_tie":  # scores of both signs, +0 and -0, above a tie at -3.5
        u = torch.rand(q, n, generator=g)
        scores = torch.where(u < 0.15, torch.randn(q, n, generator=g), torch.tensor(-3.5))
        scores = torch.where(u < 0.01, torch.where(u < 0.005, torch.tensor(0.0), torch.tensor(-0.0)), scores)
    else:
        raise ValueError(kind)
    return scores.contiguous(), ids.contiguous()


@pytest.mark.parametrize("path,order", [("row", None), ("staged", "bucket"), ("block", None)],
                         ids=["row", "staged-bucket", "block"])
@pytest.mark.parametrize("kind", ["two_groups", "outliers", "dup_groups", "narrow_ids", "close_keys", "short_context",
                                  "three_groups", "signs_tie"])
def test_bucket_order_clustered_keys(kind, path, order):
    """The bucket ordering (radix.order_row) on winners whose keys cluster: a crowded first
    level maps again in parts (radix.part_counts: positive, negative, the tie at the smallest
    score), and where a part still crowds (three_groups: two tie groups above the cutoff's) a
    second level splits every bucket over its own key range; close_keys: equal scores with
    distinct ids in the buckets of a key range of 60 decades; short_context: one bucket of most
    winners, over many of the second level's groups; signs_tie: winners of both signs, +0 and
    -0, above a tie at a negative score; exact against both references. The block path's
    ordering (select_block) maps in the same parts and splits alike, in shared memory."""
    _require_kernel()
    _require_path(path)
    for q, n, k in ((2, 3000, 1024), (1, 700, 512)):
        scores, ids = _clustered(kind, q, n, seed=n + k)
        got = run_kernel(scores, ids, k, path=path, order=order)
        check_equal(got, ref_packed(scores, ids, k), f"{kind} {path} q={q} n={n} k={k}")
        if n <= 700:
            check_equal(got, ref_python(scores, ids, k), f"{kind} {path} python q={q} n={n} k={k}")


@pytest.mark.parametrize("buckets", [1, 2], ids=["kb", "2kb"])
@pytest.mark.parametrize("kind", ["random", "ties", "dups", "nandups", "padding", "special"])
def test_row_order_buckets(kind, buckets):
    """The row kernel's ordering over as many buckets as winner slots, or twice as many (the
    default, ``select_kernel.ORDER_BUCKETS``), on plain and clustered winner keys: exact against
    both references."""
    _require_kernel()
    for q, n, k in ((3, 6144, 2048), (2, 300, 64)):
        scores, ids = make_case(kind, q, n, k, seed=n + k)
        got = run_kernel(scores, ids, k, path="row", order_buckets=buckets * max(2, 1 << (k - 1).bit_length()))
        check_equal(got, ref_packed(scores, ids, k), f"{kind} q={q} n={n} k={k}")
        if n <= 300:
            check_equal(got, ref_python(scores, ids, k), f"{kind} python q={q} n={n} k={k}")
    for kind2 in ("two_groups", "outliers", "dup_groups", "narrow_ids") if kind == "ties" else ():
        scores, ids = _clustered(kind2, 2, 3000, seed=7)
        got = run_kernel(scores, ids, 1024, path="row", order_buckets=buckets * 1024)
        check_equal(got, ref_packed(scores, ids, 1024), f"{kind2} order_buckets={buckets * 1024}")


def _mass_tie(kind: str, q: int, n: int, seed: int):
    """A cutoff bin larger than the finish's registers (select_staged.FIN_TIERS[1]): one score
    for most of the row; few finite scores and the rest -inf with valid ids (a short context in
    a padded buffer); most scores NaN with assorted payloads and every id twice (the cut between
    two copies of an id: only positions tell them apart), or all NaN and every id twice (an odd
    k splits the pair at the cutoff); +0 and -0 (+0 first); scores of one bin (same 12-bit
    prefix) that differ below it, with ties."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.rand(q, n, generator=g).argsort(dim=1) * 3 + 5).to(torch.int32)
    u = torch.rand(q, n, generator=g)
    if kind == "equal":
        scores = torch.full((q, n), -0.75)
    elif kind == "neginf":
        scores = torch.where(u < 0.05, torch.randn(q, n, generator=g), torch.tensor(float("-inf")))
    elif kind == "nan_dups":
        nan_bits = torch.tensor([0x7FC00000, 0x7FC00001, 0xFFC00002 - (1 << 32), 0xFFFFFFFF - (1 << 32)],
                                dtype=torch.int32).view(torch.float32)
        scores = torch.where(u < 0.05, torch.randn(q, n, generator=g),
                             nan_bits[torch.randint(0, 4, (q, n), generator=g)])
        half = n // 2
        ids[:, half:] = ids[:, : n - half].clone()
    elif kind == "nan_pairs":  # every id twice, all NaN with distinct payloads: an odd k splits a pair
        scores = (torch.randperm(n, generator=g).to(torch.int32).expand(q, n) | 0x7FC00000).view(torch.float32).clone()
        ids[:, n // 2:] = ids[:, : n - n // 2].flip(1)
    elif kind == "zeros":
        scores = torch.where(u < 0.5, torch.tensor(0.0), torch.tensor(-0.0))
        scores[:, :5] = 1.0
    elif kind == "one_bin":  # 1.0 .. 1.125 share the 12-bit prefix; 256 distinct values
        scores = 1.0 + torch.randint(0, 256, (q, n), generator=g).float() / 2048
    else:
        raise ValueError(kind)
    return scores.contiguous(), ids.contiguous()


MASS_TIE_KINDS, MASS_TIE_REFINE = ["equal", "neginf", "nan_dups", "nan_pairs", "zeros", "one_bin"], [None, 0, 16384]


@pytest.mark.parametrize("refine", MASS_TIE_REFINE, ids=["refine", "refine_all", "chunks"])
@pytest.mark.parametrize("kind", MASS_TIE_KINDS)
def test_row_mass_tie_in_registers(kind, refine):
    """The row kernel's 8192 and 16384 register tiles with a cutoff bin of more candidates than
    the finish's registers hold (refined on the row read again as a tile: the score key, then the
    id, then the position) when it holds more than ``select_kernel.refine_min`` (4096 / 8192), at
    several k and row lengths that are not powers of two. ``refine`` 0: every cutoff bin not taken
    whole is refined, however small (no finish compiled); 16384: none (the finish's chunks; no
    refinement compiled)."""
    _require_kernel()
    _interpreter_third(MASS_TIE_KINDS.index(kind), MASS_TIE_REFINE.index(refine))
    for n, k in ((16384, 2047), (12000, 700), (9000, 1), (6000, 999)):  # (6000: the 8192 tile)
        scores, ids = _mass_tie(kind, 2, n, seed=n + k)
        got = run_kernel(scores, ids, k, path="row", **({} if refine is None else dict(refine=refine)))
        check_equal(got, ref_packed(scores, ids, k), f"{kind} n={n} k={k}")
        if n == 9000:
            check_equal(got, ref_python(scores, ids, k), f"{kind} python n={n} k={k}")


@pytest.mark.parametrize("n,bins,refine", [(8000, (1024, 1025, 2048, 4096, 4097), None),
                                           (16000, (4096, 4097, 8192, 8193), None), (8000, (1025, 2048, 2049), 2048)],
                         ids=["tile8192", "tile16384", "tile8192-refine2048"])
def test_row_refine_threshold_edges(n, bins, refine):
    """A cutoff bin (candidates sharing the cutoff's 12-bit prefix, here one tied score) of just
    as many candidates as ``select_kernel.refine_min`` sends to the finish, and one more, which
    the tile refines (the 8192 tile from 1024, the 16384 tile from 4096; the 16384 tile's finish
    keeps its chunks, ``finish_max``; the 8192 tile refining from 2048 as an option, the
    finish's second register tier), and bins at the finish's tiers: distinct scores in another
    octave above the bin and below it, shuffled, ids a permutation with gaps; the cutoff inside
    the bin, so the id decides which of the tie win. Both references."""
    _require_kernel()
    g = torch.Generator().manual_seed(n)
    for b in bins:
        above = 700
        k = min(sk.MAX_K, above + b // 2 + 1)  # (the cutoff inside the bin either way)
        sc = torch.cat([2.0 + torch.rand(above, generator=g),  # (2, 3): above the bin's octave
                        torch.full((b,), 0.75),  # the bin: one score
                        -2.0 - torch.rand(n - above - b, generator=g)])  # below
        perm = torch.randperm(n, generator=g)
        scores = sc[perm].reshape(1, n).contiguous()
        ids = (torch.randperm(3 * n, generator=g)[:n]).to(torch.int32).reshape(1, n).contiguous()
        got = run_kernel(scores, ids, k, path="row", refine=refine)
        check_equal(got, ref_packed(scores, ids, k), f"n={n} bin={b} k={k} refine={refine}")
        check_equal(got, ref_python(scores, ids, k), f"python n={n} bin={b} k={k}")


@pytest.mark.parametrize("n,b", [(6000, 1000), (16000, 700), (16000, 4096), (40000, 3000)])
def test_row_tie_cut_in_the_finish_registers(n, b):
    """A tie at the cutoff score held in the finish's registers (a bin of at most 1024 in the 8192
    tile, 4096 in the 16384 tile, and in the sampled tile of a row read in chunks), cut by id and
    then, among duplicate ids, by position (the finish's digit passes on the id, then the position).
    The bin (one 12-bit prefix) holds a tenth of its candidates a few ulps above the tied score
    and a tenth just below it, so the score phase cuts first; the tie's ids repeat (drawn from a
    range of an eighth of the bin: about 8 each); k takes one winner of the tie, all but one (at
    most ``MAX_K`` in all), about half and a third. Both references. (Distinct ids:
    ``test_row_refine_threshold_edges``.)"""
    _require_kernel()
    g = torch.Generator().manual_seed(n + b)
    above, side = 300, b // 10
    tie = b - 2 * side
    bits = torch.tensor(0.8).view(torch.int32).item()  # (0.8 +- a few ulps: one 12-bit prefix, 0.75 .. 0.875)
    near = [torch.full((side,), bits + d, dtype=torch.int32).view(torch.float32) for d in (3, -1)]
    for r in (1, tie - 1, tie // 2, tie // 3 + 5):
        k = min(sk.MAX_K, above + side + r)
        sc = torch.cat([2.0 + torch.rand(above, generator=g), near[0], torch.full((tie,), 0.8), near[1],
                        -2.0 - torch.rand(n - above - b, generator=g)])
        ids = torch.randperm(4 * n, generator=g)[:n].to(torch.int32)
        ids[above + side:above + side + tie] = torch.randint(0, b // 8 + 1, (tie,), generator=g).to(torch.int32)
        perm = torch.randperm(n, generator=g)
        scores, ids = sc[perm].reshape(1, n).contiguous(), ids[perm].reshape(1, n).contiguous()
        got = run_kernel(scores, ids, k, path="row")
        check_equal(got, ref_packed(scores, ids, k), f"n={n} bin={b} k={k}")
        check_equal(got, ref_python(scores, ids, k), f"python n={n} bin={b} k={k}")


@pytest.mark.parametrize("kind", KINDS)
def test_row_refine_every_bin(kind):
    """The 16384 register tile's refinement (the cutoff bin's score key, id and position found by
    bisection on the tile) on every row whose cutoff bin is not taken whole (refine 0), small
    bins included, at row lengths that are not powers of two."""
    _require_kernel()
    for n, k in ((6144, 2048), (16384, 100), (9000, 1)):
        scores, ids = make_case(kind, 2, n, k, seed=n + k)
        got = run_kernel(scores, ids, k, path="row", resident=True, refine=0)
        check_equal(got, ref_packed(scores, ids, k), f"{kind} n={n} k={k} refine=0")


if sk._HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _smallest_cut_kernel(x_ptr, need_ptr, out_ptr, T: tl.constexpr):
        # one program a case: select_kernel.smallest_cut over a tile of T values
        row = tl.program_id(0)
        x = tl.load(x_ptr + row * T + tl.arange(0, T))
        tl.store(out_ptr + row, sk.smallest_cut(x, tl.load(need_ptr + row)))


def test_smallest_cut_against_python():
    """``select_kernel.smallest_cut`` (the refinement's id and position cut: bisection steps on the
    values above the lowest 14 bits, then two values a compare in a 14-bit window) against a
    plain Python sort: values spanning less than, exactly and just over 2**14, spanning
    2**31 - 1, duplicates, the others' -1 among them, one value, need 1 and need = all, and cuts
    at the window's edges."""
    _require_kernel()
    T = 1024
    g = torch.Generator().manual_seed(11)
    cases = []  # (values, need)

    def add(vals, needs):
        x = torch.full((T,), -1, dtype=torch.int64)
        pos = torch.randperm(T, generator=g)[: len(vals)]
        x[pos] = torch.tensor(vals, dtype=torch.int64)
        for need in needs:
            cases.append((x.clone(), need))

    for lo, span in ((0, 100), (5, 16383), (7, 16384), (3, 16385), (123456, 70000), (0, 2**31 - 1),
                     (2**31 - 40000, 39999), (2**30, 2**14 - 2)):
        vals = [lo, lo + span] + (lo + torch.randint(0, span + 1, (500,), generator=g)).tolist()
        n = len(vals)
        add(vals, [1, 2, n // 3, n // 2, n - 1, n])
    # a window edge: the cut's value with 2**14 - 1 or 2**14 above the smallest
    add([0, 16382, 16383, 16384, 16385, 40000], [1, 2, 3, 4, 5, 6])
    add([9] * 300 + [10] * 300 + [2**20], [1, 300, 301, 600, 601])  # duplicates
    add([77], [1])  # one value
    add(list(range(T)), [1, 517, T])  # every lane, no -1
    x = torch.stack([c[0] for c in cases]).to(torch.int32)
    need = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    dev = _device()
    out = torch.empty(len(cases), dtype=torch.int32, device=dev)
    _smallest_cut_kernel[(len(cases),)](x.to(dev), need.to(dev), out, T=T)
    want = [sorted(v for v in c[0].tolist() if v >= 0)[c[1] - 1] for c in cases]
    assert out.cpu().tolist() == want


# the sampled cutoff of rows re-read in chunks (select_kernel.sample_config): small samples and
# tiles forced at small rows (several chunks, a row length not a power of two), the defaults
# beyond RESIDENT_MAX, and 32 warps with chunks of 8192 (an option)
SAMPLED = {"small": (3001, 64, dict(resident=False, chunk=512, sample=256, sample_cap=1024)),
           "small_k2048": (6144, 2048, dict(resident=False, chunk=1024, sample=512, sample_cap=4096)),
           "default": (20000, 2048, {}), "default_k1000": (40000, 1000, {}),
           "wide": (40000, 2048, dict(resident=False, num_warps=32, chunk=8192))}


@pytest.mark.parametrize("spread", [True, False], ids=["spread", "one_program"])
@pytest.mark.parametrize("kind", ["random", "ties", "neginf", "padding", "nandups"])
def test_row_sampled_pass_spread_or_in_one_program(kind, spread):
    """The sampled cutoff's pass over the row spread over the row's programs (its own kernels,
    kept positions in any order: ``spread_pass``, the default up to SPREAD_ROWS_MAX rows) or in
    the row kernel's one program (the default beyond): both exact, the tile held on every row, rows
    of a length that is no multiple of the spread pass's chunk."""
    _require_kernel()
    n, k = 20001, 2048
    if kind in KINDS:
        scores, ids = make_case(kind, 3, n, k, seed=n + len(kind))
    else:
        scores, ids = _mass_tie(kind, 3, n, seed=n + len(kind))
    got, hits = _sampled_run(scores, ids, k, dict(spread_sample=spread))
    check_equal(got, ref_packed(scores, ids, k), f"{kind} spread={spread}")
    assert hits.tolist() == [1] * 3, f"{kind} spread={spread}: sampled cutoff held {hits.tolist()}"


def _sampled_run(scores, ids, k, opts):
    dev = _device()
    hits = torch.full((scores.shape[0],), -7, dtype=torch.int32, device=dev)
    got = sk.triton_ordered_select(scores.to(dev), ids.to(dev), k, sample_hits=hits, **opts)
    return got, hits.cpu()


SAMPLED_KINDS = KINDS + ["neginf", "one_bin", "nan_pairs", "nan_dups", "zeros"]


@pytest.mark.parametrize("size", list(SAMPLED))
@pytest.mark.parametrize("kind", SAMPLED_KINDS)
def test_row_sampled_cutoff(kind, size):
    """The row kernel's sampled cutoff on every input kind, mass ties included (one score for
    the whole row; a short context padded with -inf and valid ids; NaN duplicates; +-0): the
    kept candidates hold the winners (the sample cuts a tie at the cutoff score by id, as the
    order does), so the register tile runs on every row here, and it is exact against the
    packed reference. (Rows where it does not hold: the tests below.)"""
    _require_kernel()
    _interpreter_third(SAMPLED_KINDS.index(kind), list(SAMPLED).index(size))
    n, k, opts = SAMPLED[size]
    if kind in KINDS:
        scores, ids = make_case(kind, 3, n, k, seed=n + k)
    else:
        scores, ids = _mass_tie(kind, 3, n, seed=n + k)
    got, hits = _sampled_run(scores, ids, k, opts)
    check_equal(got, ref_packed(scores, ids, k), f"{kind} n={n} k={k} {opts}")
    assert hits.tolist() == [1] * 3, f"{kind} {size}: sampled cutoff held {hits.tolist()}"


def test_row_sampled_cutoff_one_id():
    """One score and one id for the whole row (the cutoff cannot be cut): the sample predicts the
    whole row, so no keeping pass and the histogram passes run; exact (k copies, position order)."""
    _require_kernel()
    n, k = 20000, 2048
    g = torch.Generator().manual_seed(3)
    scores = torch.full((2, n), 0.5)
    scores[1, :100] = torch.randn(100, generator=g)  # a few above the tie
    ids = torch.full((2, n), 7, dtype=torch.int32)
    got, hits = _sampled_run(scores, ids, k, {})
    check_equal(got, ref_packed(scores, ids, k), "one id")
    assert hits.tolist() == [0, 0], hits.tolist()


@pytest.mark.parametrize("extra", [0, 1], ids=["cap", "cap_plus_one"])
def test_row_sampled_cutoff_tile_boundary(extra):
    """Exactly ``sample_cap`` candidates at or above the sampled cutoff fill the tile (kept); one
    more overflows it (the histogram passes run after the keeping pass). The top group holds a quarter of the row and 3/16
    of the sampled positions (enough of them that the cutoff is its score, few enough that the
    sample predicts 3/4 of the tile); the rest of the row is far below it; k is a quarter of the
    tile (each row, which of the top group win is decided by their ids). Both exact."""
    _require_kernel()
    q, n, k, sample, cap = 16, 4096, 256, 256, 1024
    g = torch.Generator().manual_seed(11 + extra)
    ids = torch.stack([torch.randperm(n, generator=g) * 2 + 1 for _ in range(q)]).to(torch.int32)
    scores = -100.0 - torch.rand(q, n, generator=g) * 100
    sampled = (torch.arange(sample) * n) // sample
    top = torch.zeros(n, dtype=torch.bool)
    top[sampled[torch.randperm(sample, generator=g)[: sample * 3 // 16]]] = True
    others = (~top).nonzero().flatten()
    others = others[~torch.isin(others, sampled)]
    top[others[torch.randperm(others.numel(), generator=g)[: cap + extra - sample * 3 // 16]]] = True
    scores[:, top] = 5.0
    got, hits = _sampled_run(scores, ids, k, dict(resident=False, chunk=512, sample=sample, sample_cap=cap))
    check_equal(got, ref_packed(scores, ids, k), f"{cap + extra} at the cutoff")
    check_equal(got, ref_python(scores, ids, k), f"{cap + extra} at the cutoff, python")
    assert hits.tolist() == [1 - extra] * q, hits.tolist()


def test_row_sampled_cutoff_unlucky_sample():
    """The sampled positions hold the row's best scores and little else does, so far fewer than
    k candidates reach the sampled cutoff: the histogram passes run, exact. A row with fewer
    valid candidates than k (the cutoff is then the lowest valid key) keeps them all."""
    _require_kernel()
    n, k, sample = 20000, 2048, 2048
    g = torch.Generator().manual_seed(5)
    ids = torch.randperm(n, generator=g).to(torch.int32).expand(2, n).contiguous()
    scores = torch.randn(2, n, generator=g)
    scores[:, (torch.arange(sample) * n) // sample] += 50.0
    got, hits = _sampled_run(scores, ids, k, {})
    check_equal(got, ref_packed(scores, ids, k), "unlucky sample")
    assert hits.tolist() == [0, 0], hits.tolist()
    few = ids.clone()
    few[:, 1500:] = -1  # 1500 valid a row, fewer than k
    got, hits = _sampled_run(scores, few, k, {})
    check_equal(got, ref_packed(scores, few, k), "fewer valid than k")
    assert hits.tolist() == [1, 1], hits.tolist()


def test_row_sampled_cutoff_rejects_bad_options():
    _require_kernel()
    s, i = make_case("random", 2, 3000, 64, seed=1)
    for opts in (dict(resident=True, sample=256), dict(resident=False, sample=100), dict(resident=False, sample_cap=8),
                 dict(resident=False, sample=256, sample_hits=torch.zeros(3, dtype=torch.int32))):
        with pytest.raises(ValueError):
            run_kernel(s, i, 64, **opts)


@pytest.mark.parametrize("resident", [True, False], ids=["registers", "chunked"])
@pytest.mark.parametrize("bits", [3, 7, 8])
def test_radix_digit_widths(bits, resident):
    """Digit widths that do and do not divide 32 (the last digit takes the rest) give the
    same exact result, for the score passes and the id passes (ties), in registers or chunked."""
    _require_kernel()
    for kind in ("ties", "special", "padding"):
        scores, ids = make_case(kind, 3, 6144, 2048, seed=bits)
        got = run_kernel(scores, ids, 2048, radix_bits=bits, resident=resident)
        check_equal(got, ref_packed(scores, ids, 2048), f"{kind} radix_bits={bits} resident={resident}")


def narrow_model(scores: torch.Tensor, ids: torch.Tensor, k: int, hb: int = 12) -> dict:
    """The staged path's narrowing of one row's cutoff bin, in plain Python (what the kernels
    should find, so a test can assert which branch its input takes): the first digit's cutoff
    bin (``m`` candidates, ``need`` of them wanted), whether every one of them has one score
    key (``pure``), the narrowing digit's count at the cutoff (``cnt``) and whether all of those
    are wanted (``take``)."""
    bits = [b & 0xFFFFFFFF for b in scores.view(torch.int32).tolist()]
    ident = ids.tolist()

    def key(b, i):  # the signed score key as an unsigned 32-bit pattern
        if i < 0:
            return None
        if (b & 0x7FFFFFFF) > 0x7F800000:
            return 0x80000001  # NaN: just above the invalid key
        return (b ^ 0x7FFFFFFF if b >> 31 else b) & 0xFFFFFFFF

    keys = [key(b, i) for b, i in zip(bits, ident)]
    valid = [j for j, x in enumerate(keys) if x is not None]
    first = {j: ((keys[j] >> (32 - hb)) ^ (1 << (hb - 1))) for j in valid}
    nsel = min(len(valid), k)

    def cutoff(digits, want):
        # the largest digit whose suffix holds want; the count above it and in it
        for d in sorted(set(digits.values()), reverse=True):
            above = sum(1 for x in digits.values() if x > d)
            cnt = sum(1 for x in digits.values() if x == d)
            if above + cnt >= want:
                return d, above, cnt
        raise AssertionError("no cutoff")

    dstar, above, m = cutoff(first, nsel)
    play = [j for j in valid if first[j] == dstar]
    need = nsel - above
    pure = len({keys[j] for j in play}) == 1
    vs = [0x7FFFFFFF - ident[j] for j in valid]
    diff = 0  # the bits in which some valid id key differs from the first
    for a in vs:
        diff |= a ^ vs[0]
    top = diff.bit_length()
    w = min(top, hb)
    if pure:
        digits = {j: ((0x7FFFFFFF - ident[j]) >> (top - w)) & ((1 << w) - 1) for j in play}
    else:
        digits = {j: (keys[j] >> (32 - 2 * hb)) & ((1 << hb) - 1) for j in play}
    dd, above_d, cnt = cutoff(digits, need)
    return dict(m=m, need=need, pure=pure, cnt=cnt, take=need - above_d == cnt)


def _narrow_case(case: str, q: int, n: int, g: torch.Generator):
    scores = torch.full((q, n), 1.5)
    ids = torch.stack([torch.randperm(n, generator=g) for _ in range(q)]).to(torch.int32)
    if case == "ids_clustered":  # one far id: the id digit's bins are 512 ids wide
        ids[:, 0] = (1 << 20) + 5
    elif case == "ids_one_bin":  # a far id out of play: every in-play id in one digit
        ids[:, 0] = 1 << 30
        scores[:, 0] = -1.0
    elif case == "ids_take":  # ids 7 apart: one candidate a digit, every one wanted
        ids = ids * 7
    elif case == "second_digit":  # 128 scores in one first-digit bin, told apart by the second
        scores = 1.0 + torch.randint(0, 128, (q, n), generator=g).float() * 2.0 ** -10
    elif case == "low_bits":  # scores that differ below the second digit: nothing to narrow
        scores = 1.0 + torch.randint(0, 64, (q, n), generator=g).float() * 2.0 ** -23
    elif case == "nan_dups":  # NaN with assorted payloads (one score key), every id twice
        nan_bits = torch.tensor([0x7FC00000, 0x7FC00001, 0x7F800001, 0xFFC00002 - (1 << 32), 0xFFFFFFFF - (1 << 32)],
                                dtype=torch.int32).view(torch.float32)
        scores = torch.where(torch.rand(q, n, generator=g) < 0.9, nan_bits[torch.randint(0, 5, (q, n), generator=g)],
                             torch.randn(q, n, generator=g))
        ids[:, n // 2:] = ids[:, : n - n // 2].clone()
    else:
        raise ValueError(case)
    return scores.contiguous(), ids.contiguous()


# (case, what the narrowing model must find in every row: the branch the case is for)
NARROW_CASES = {
    "ids_clustered": lambda r: r["pure"] and not r["take"] and 64 < r["cnt"] < r["m"],  # the finish's chunks after
    "ids_one_bin": lambda r: r["pure"] and r["cnt"] == r["m"],  # no narrowing pass
    "ids_take": lambda r: r["pure"] and r["take"],  # the digit's candidates all taken: no finish
    "second_digit": lambda r: not r["pure"] and not r["take"] and r["cnt"] <= 64 < r["m"],  # registers after
    "low_bits": lambda r: not r["pure"] and r["cnt"] == r["m"],
    "nan_dups": lambda r: r["pure"] and r["cnt"] < r["m"],
}


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("case", list(NARROW_CASES))
def test_staged_narrowing(case, fuse):
    """The staged path's narrowing of a cutoff bin bigger than the finish's registers (here 64,
    ``fin_resident``): by the id key's top digit where the bin is one score key (a pure tie),
    else by the score key's second digit, then the finish on what is left (in registers or
    chunks), or no finish where the digit's candidates are all wanted, or no narrowing where
    one digit holds the whole bin; and with ``narrow=False``. The Python model asserts each
    case takes its branch."""
    _require_kernel()
    _interpreter_third(list(NARROW_CASES).index(case), int(fuse))
    q, n, k = 2, 1500, 64 if case != "nan_dups" else 300
    scores, ids = _narrow_case(case, q, n, torch.Generator().manual_seed(len(case)))
    for r in range(q):
        model = narrow_model(scores[r], ids[r], k)
        assert NARROW_CASES[case](model), f"{case} row {r}: {model}"
    ref = ref_python(scores, ids, k)
    # narrow False: the finish walks the whole bin, as before the narrowing; spread: the walk
    # over the row's programs (256 slots of P each, in chunks of 64: several programs a row, some
    # past the bin)
    # (Triton's interpreter skips narrow=False, the walk of the whole bin, which the GPU runs:
    # about 25 s of CI's subset)
    option_sets = [dict(narrow=True, spread=False), dict(spread=True, walk_chunk=256, fin_chunk=64)]
    for opts in option_sets if INTERPRET else option_sets + [dict(narrow=False)]:
        got = run_kernel(scores, ids, k, path="staged", order="rank",
                         staged=dict(fin_resident=64, fuse=fuse, rank_play=0, **opts))
        check_equal(got, ref, f"{case} fuse={fuse} {opts}")


@pytest.mark.parametrize("bin_size,play", [(16, 16), (17, 16), (16, 8), (16, 0)])
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_staged_rank_play_boundary(bin_size, play, fuse):
    """The staged path's cutoff bin ranked whole (bin_size <= rank_play) or left to the finish
    (one more, or rank_play 0), at the boundary: 4 winners in a bin above (one counter for all
    their binned slots), then a cutoff bin [1, 1.125) of bin_size candidates, tied scores and
    duplicate ids among them (the id, then the position, breaks the tie), 4 of them wanted;
    three rows that differ in which positions hold the bin."""
    _require_kernel()
    q, n, k = 3, 64, 8
    g = torch.Generator().manual_seed(bin_size * 31 + play)
    scores = torch.full((q, n), -5.0)
    ids = torch.stack([torch.randperm(n, generator=g) for _ in range(q)]).to(torch.int32)
    for r in range(q):
        pos = torch.randperm(n, generator=g)
        scores[r, pos[:4]] = 3.0
        b = pos[4: 4 + bin_size]
        scores[r, b] = torch.where(torch.arange(bin_size) % 3 == 0, 1.0, 1.0 + 0.01 * (torch.arange(bin_size) % 5)).float()
        ids[r, b[1::4]] = int(ids[r, b[0]])  # duplicate ids inside the bin
    got = run_kernel(scores, ids, k, path="staged", staged=dict(rank_play=play, fuse=fuse), order="rank")
    check_equal(got, ref_python(scores, ids, k), f"bin={bin_size} rank_play={play} fuse={fuse}")


@pytest.mark.parametrize("kw", [dict(path="row"), dict(path="staged"), dict(path="staged", staged=dict(fuse=False)),
                                dict(path="block")], ids=["row", "staged", "staged_unfused", "block"])
def test_no_candidates(kw):
    """N = 0: every slot a pad (the staged path launches no compact program then)."""
    _require_kernel()
    _require_path(kw["path"])
    dev = _device()
    ids, sc = sk.triton_ordered_select(torch.zeros(3, 0, device=dev), torch.zeros(3, 0, dtype=torch.int32, device=dev),
                                       5, **kw)
    assert ids.cpu().eq(-1).all() and sc.cpu().eq(float("-inf")).all()


@pytest.mark.parametrize("path", ["staged", "row", "block"])
def test_strided_rows_and_no_host_sync(path):
    _require_kernel()
    _require_path(path)
    if INTERPRET:
        pytest.skip("sync debug mode needs CUDA")
    scores, ids = make_case("ties", 9, 3 * 2048, 2048, seed=3)
    big_s = torch.zeros(9, 4 * 2048).cuda()
    big_i = torch.zeros(9, 4 * 2048, dtype=torch.int32).cuda()
    big_s[:, : 3 * 2048] = scores.cuda()
    big_i[:, : 3 * 2048] = ids.cuda()
    s_view, i_view = big_s[:, : 3 * 2048], big_i[:, : 3 * 2048]
    sk.triton_ordered_select(s_view, i_view, 2048, path=path)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = sk.triton_ordered_select(s_view, i_view, 2048, path=path)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    check_equal(got, ref_packed(scores, ids, 2048), f"strided {path}")


@pytest.mark.parametrize("path", ["staged", "row", "block"])
def test_tensors_on_a_device_that_is_not_current(path):
    """Triton launches on the current device: inputs on another GPU run there, the current
    device unchanged."""
    _require_kernel()
    if INTERPRET or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    _require_path(path)
    scores, ids = make_case("special", 5, 3000, 512, seed=11)
    cur = torch.cuda.current_device()
    other = (cur + 1) % torch.cuda.device_count()
    got = sk.triton_ordered_select(scores.to(f"cuda:{other}"), ids.to(f"cuda:{other}"), 512, path=path)
    assert got[0].device.index == other and torch.cuda.current_device() == cur
    check_equal(got, ref_packed(scores, ids, 512), f"on cuda:{other}, current cuda:{cur}, {path}")


GRAPH_CASES = [("rank", 64), ("sort", 64), ("bucket", 64), ("staged", 64), ("block", 1), ("default", 1), ("default", 4),
               ("default", 64)]


@pytest.mark.parametrize("order,q", GRAPH_CASES, ids=[f"{o}-q{q}" for o, q in GRAPH_CASES])
def test_cuda_graph_capture_and_replay(order, q):
    """Capture once, replay on other inputs. ``default``: the path chosen by default (the staged
    path at 1 and 4 rows: fused finish at 1 row, finish kernel at 4; the block path at 64 where
    it runs)."""
    _require_kernel()
    if INTERPRET:
        pytest.skip("CUDA graphs need CUDA")
    _require_path(order)
    n, k = 8 * 2048, 2048
    scores, ids = make_case("random", q, n, k, seed=11)
    st_s, st_i = scores.cuda(), ids.cuda()
    kw = {"staged": dict(path="staged"), "block": dict(path="block"), "default": {}}.get(order,
                                                                                      dict(path="row", order=order))
    sk.triton_ordered_select(st_s, st_i, k, **kw)  # warm-up: compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sk.triton_ordered_select(st_s, st_i, k, **kw)
    for i, kind in enumerate(["ties", "padding", "special", "nandups", "random"]):
        s2, i2 = make_case(kind, q, n, k, seed=100 + i, device="cuda")
        st_s.copy_(s2)
        st_i.copy_(i2)
        graph.replay()
        torch.cuda.synchronize()
        check_equal((out[0].clone(), out[1].clone()), ref_packed(s2, i2, k), f"graph replay {kind} {order} q={q}")


@functools.lru_cache(maxsize=1)
def _fuzz_tool():
    # tools/fuzz_select.py (a script, not a package): its shapes and inputs, and the call serving makes
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "fuzz_select.py")
    spec = importlib.util.spec_from_file_location("fuzz_select", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("index", range(6) if INTERPRET else range(40))
def test_fuzz_cases(index):
    """Cases of tools/fuzz_select.py: a shape drawn near the dispatcher's and the tiles' edges
    (in the interpreter at most 2048 candidates and 8 rows), rows of up to three score patterns (NaN payloads, +-0, +-inf,
    subnormals, ulps apart, a -inf padded short context, ...) and id patterns (distinct up to
    INT32_MAX, positional, duplicated, invalid), at times rows of a wider buffer; the index-th
    seed from 0 whose case the order rule's special values reach (fuzz_select.special); the
    call serving makes (ordered_select on CUDA) and the other path, against the packed
    reference."""
    import random

    _require_kernel()
    fz = _fuzz_tool()
    seed, found = -1, -1
    while found < index:
        seed += 1
        q, n, k = fz.draw_shape(random.Random(seed), *((2048, 8) if INTERPRET else (1 << 22, 4096)))
        scores, ids, drawn = fz.make_inputs(q, n, k, seed, _device())
        found += fz.special(scores, ids, k)
    want = ref_packed(scores, ids, k)
    what = f"seed {seed}: Q={q} N={n} k={k} {drawn}"
    check_equal(fz.serving_call(scores, ids, k), want, what)
    for other in fz.other_paths(q, n, k):
        check_equal(sk.triton_ordered_select(scores, ids, k, path=other), want, f"{what} path={other}")


LONG = [(131072, 2048), (100003, 2048), (65536, 64), (40000, 1)]


@pytest.mark.parametrize("path", ["staged", "row"])
@pytest.mark.parametrize("kind", ["random", "ties", "padding", "nandups", "special"])
@pytest.mark.parametrize("n,k", LONG, ids=[f"{n}-{k}" for n, k in LONG])
def test_long_rows(n, k, kind, path):
    """Rows up to MAX_CANDIDATES (N not a power of two too), both paths, against torch.sort."""
    _require_kernel()
    if INTERPRET:
        pytest.skip("too large for the interpreter")
    for q in ([1, 5] if path == "staged" else [3, 33]):
        scores, ids = make_case(kind, q, n, k, seed=q + n + k, device="cuda")
        check_equal(run_kernel(scores, ids, k, path=path), ref_packed(scores, ids, k), f"{kind} q={q} n={n} k={k} {path}")


def _kernels():
    from tpflare.ops import radix, select_staged

    return [sk._row_kernel, sk._sample_kernel, sk._spread_pass_kernel, select_staged._hist_kernel,
            select_staged._compact_kernel, select_staged._finish_kernel, select_staged._walk_kernel,
            radix._rank_kernel, radix._decode_runs_kernel, radix.bucket_kernel]


def _compiled_variants() -> int:
    return sum(len(c[0]) for f in _kernels() for c in f.device_caches.values())


# shapes that share a launch plan: (Q, N, k, row stride); the first one compiles
GENERIC = {"staged, fused, rank": [(1, 16384, 2048, 16384), (2, 12000, 1500, 12000), (3, 9001, 2048, 9001),
                                   (1, 16384, 2048, 20000)],
           # rows beyond select_staged.SPREAD_MIN: the narrowing walk's kernel too
           "staged, fused, rank, spread": [(1, 32768, 2048, 32768), (2, 20000, 2048, 20000), (1, 16385, 1500, 16400)],
           # Q of every residue mod 4 (the workspace's parts must stay 16-byte aligned for all)
           "row, registers, sort": [(20, 9000, 2048, 9000), (33, 12001, 2048, 12001), (100, 16384, 1025, 16384),
                                    (22, 10000, 2048, 10000), (35, 16000, 2048, 16000)],
           "row, chunks of 4096": [(20, 5000, 2048, 5000), (64, 8192, 2048, 8192), (65, 6001, 2048, 6001)],
           "row, chunks of 4096, sampled": [(65, 20000, 2048, 20000), (66, 32768, 1500, 32768), (67, 17001, 2048, 17001),
                                            (100, 70000, 2048, 70000), (80, 131072, 2048, 131072)],
           # up to 64 rows (select_kernel.spread_pass): the sampled pass spread over the row's programs
           "row, chunks of 4096, sampled, spread": [(9, 20000, 2048, 20000), (64, 32768, 1500, 32768),
                                                    (5, 70000, 2048, 70000), (8, 131072, 2048, 131072)],
           # 5-8 rows of 16385..24576 (select_kernel.STAGED_LONG_ROWS): the staged path, unfused
           "staged, unfused, bucket, spread": [(8, 24576, 2048, 24576), (5, 20000, 2048, 20000),
                                               (6, 16385, 1500, 16400)],
           "row, chunks, sort": [(65, 40000, 2048, 40000), (70, 131072, 2048, 131072)]}


@pytest.mark.parametrize("plan", list(GENERIC))
def test_one_compiled_kernel_serves_every_shape_of_a_plan(plan, triton_only):
    """Q, N, k and the strides are runtime values: after precompile of the first shape, the
    other shapes of its launch plan run exactly without compiling anything."""
    _require_kernel()
    if INTERPRET:
        pytest.skip("the interpreter compiles nothing")
    shapes = GENERIC[plan]
    assert len({sk.launch_plan(q, n, k) for q, n, k, _ in shapes}) == 1
    for f in _kernels():  # forget the variants earlier tests compiled (they would hide a new one)
        f.device_caches.clear()
    q0, n0, k0, _ = shapes[0]
    sk.precompile([(q0, n0)], k=k0, progress=False)
    before = _compiled_variants()
    for q, n, k, stride in shapes:
        big_s, big_i = make_case("ties", q, stride, k, seed=q + n, device="cuda")
        scores, ids = big_s[:, :n], big_i[:, :n]
        check_equal(sk.triton_ordered_select(scores, ids, k), ref_packed(scores.contiguous(), ids.contiguous(), k),
                    f"{plan} q={q} n={n} k={k}")
    assert _compiled_variants() == before, f"{plan}: a shape of the same plan compiled another kernel"


def _parallel_compile_from_scratch():
    """Skip where no parallel compile runs (the interpreter, a Triton without AsyncCompileMode);
    else forget every compiled kernel and every warmed plan, so the next call compiles anew."""
    from tpflare.ops import select_compile

    _require_kernel()
    if INTERPRET:
        pytest.skip("the interpreter compiles nothing")
    if select_compile.async_compile_mode() is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    for f in _kernels():
        f.device_caches.clear()
    sk._WARMED.clear()


@pytest.mark.parametrize("plan", ["staged, fused, rank, spread", "row, chunks of 4096",
                                  "row, chunks of 4096, sampled, spread"])
def test_parallel_compile_compiles_what_the_call_launches(plan, triton_only):
    """A plan's first call compiles its kernels at once (select_compile): collecting its launches
    compiles and launches nothing; compile_in_parallel compiles each launched kernel once; the
    call then compiles nothing more and is exact."""
    from tpflare.ops import select_compile

    _parallel_compile_from_scratch()
    q, n, k, _ = GENERIC[plan][0]
    scores, ids = make_case("ties", q, n, k, seed=q + n, device="cuda")

    def call():
        return sk.triton_ordered_select(scores, ids, k)

    launches = select_compile.collect(call)
    assert launches and _compiled_variants() == 0, "collecting compiled something"
    assert select_compile.compile_in_parallel([call]) == len(launches)
    compiled = _compiled_variants()
    assert compiled == len({id(kernel) for kernel, _, _, _ in launches})
    check_equal(call(), ref_packed(scores, ids, k), plan)
    assert _compiled_variants() == compiled, f"{plan}: the call compiled a kernel the warm-up did not"


@pytest.mark.parametrize("plan", list(GENERIC))
def test_first_call_compiles_its_plan_at_once(plan, caplog, triton_only):
    """A plan's first call, as users make it, compiles its kernels at once and loads them before
    it launches (select_compile's INFO line, no warning), then runs exactly, compiling nothing
    more. (Up to session 11 of 2026-12-03 the staged plans' first call failed its parallel
    compile, with a warning, and compiled one kernel after another.)"""
    import logging

    from tpflare.ops import select_compile

    _parallel_compile_from_scratch()
    q, n, k, _ = GENERIC[plan][0]
    scores, ids = make_case("random", q, n, k, seed=q * n, device="cuda")
    kernels = len({id(kernel) for kernel, _, _, _ in select_compile.collect(lambda: sk.triton_ordered_select(
        scores, ids, k))})
    with caplog.at_level(logging.INFO, logger="tpflare.select_compile"):
        got = sk.triton_ordered_select(scores, ids, k)
    assert "parallel compile failed" not in caplog.text, caplog.text
    assert f"{kernels} kernels loaded" in caplog.text, caplog.text
    assert _compiled_variants() == kernels
    check_equal(got, ref_packed(scores, ids, k), plan)


@pytest.mark.parametrize("plan", list(GENERIC))
def test_stand_ins_have_their_kernels_launchers(plan, triton_only):
    """Where Triton builds a C launcher a kernel (3.6), each kernel a plan launches has a
    stand-in (select_compile.stand_in) that, compiled with the kernel's arguments, has the
    kernel's argument types, which are all the launcher's C source depends on: the launcher
    the stand-in builds during the compiles is the one the kernel's load then finds in
    Triton's cache. And its source is the kernel's, built from both compiled kernels."""
    from tpflare.ops import select_compile

    _parallel_compile_from_scratch()
    if not select_compile.builds_launchers():
        pytest.skip("this Triton launches every kernel through one launcher")
    from triton.backends.nvidia import driver

    q, n, k, _ = GENERIC[plan][0]
    scores, ids = make_case("random", q, n, k, seed=q + n, device="cuda")
    launches = select_compile.collect(lambda: sk.triton_ordered_select(scores, ids, k))
    seen = set()
    for kernel, grid, args, kwargs in launches:
        if id(kernel) in seen:
            continue
        seen.add(id(kernel))
        twin = select_compile.stand_in(kernel)
        assert twin is not None, kernel
        real = kernel.warmup(*args, grid=grid, **kwargs)
        stub = twin.warmup(*args, grid=grid, **kwargs)
        assert list(stub.src.signature.values()) == list(real.src.signature.values()), kernel

        def source(c):
            return driver.make_launcher({}, dict(c.src.signature), getattr(c.metadata, "tensordesc_meta", None))

        assert source(stub) == source(real), kernel
    assert seen


def test_precompile_of_several_plans_compiles_them_all(triton_only):
    """precompile compiles several plans' kernels at once; their shapes then compile nothing."""
    _require_kernel()
    if INTERPRET:
        pytest.skip("the interpreter compiles nothing")
    for f in _kernels():
        f.device_caches.clear()
    sk._WARMED.clear()
    shapes = [GENERIC[p][0] for p in ("staged, fused, rank", "staged, fused, rank, spread", "row, registers, sort")]
    assert {k for _, _, k, _ in shapes} == {2048} and len({sk.launch_plan(q, n, k) for q, n, k, _ in shapes}) == 3
    sk.precompile([(q, n) for q, n, _, _ in shapes], k=2048, progress=False)
    before = _compiled_variants()
    assert before >= 3
    for q, n, _, _ in shapes:
        scores, ids = make_case("random", q, n, 2048, seed=q * n, device="cuda")
        check_equal(sk.triton_ordered_select(scores, ids, 2048), ref_packed(scores, ids, 2048), f"q={q} n={n}")
    assert _compiled_variants() == before, "a precompiled shape compiled another kernel"


BLOCK_SHAPES = [(5, 16384, 2048, 16384), (64, 9000, 2048, 9000), (33, 12001, 1025, 12100), (7, 8193, 64, 8193),
                (300, 5000, 2048, 5000), (5, 4096, 1, 4200), (9, 100, 2048, 100), (6, 1, 7, 1),
                # long rows: chunks, then their merge
                (5, 16385, 2048, 16400), (8, 40000, 1000, 40000), (6, 131072, 2048, 131072), (8, 100000, 3, 100001),
                # while the rows' chunks make one wave of blocks (a block an SM, 132: session 31)
                (16, 131072, 2048, 131072), (33, 65536, 1000, 65600),
                # from SAMPLED_MIN_ROWS (64) rows, or beyond one wave of chunks (session 32): the sampled keep
                # (the chunks for rows it may miss a winner in)
                (500, 30000, 2048, 30000), (64, 131072, 2048, 131072), (70, 65536, 700, 65600),
                (24, 131072, 2048, 131072), (48, 49152, 1000, 49200),
                # more rows of 8193-16384 than SMs: the filter kind (session 34), by 16-byte loads and not
                (200, 16384, 2048, 16400), (140, 9001, 1000, 9001)]


def test_block_path_one_function_a_tile_serves_every_shape():
    """The block path compiles one function a tile (256, 512, 1024 threads) and device: shapes of
    any Q, N, k and row stride within a tile run exactly on it, compiling nothing more; the
    dispatcher takes the block path for every one of these shapes (more than 4 rows), and
    launch_plan names its tiles (a long row's chunks' and their merge's)."""
    from tpflare.ops import select_block

    _require_kernel()
    _require_path("block")
    for q, n, k, stride in BLOCK_SHAPES:
        assert sk.choose_path(q, n, k, 132) == "block" and sk.launch_plan(q, n, k)[0] == "block", (q, n, k)
    for q, n, k, _ in BLOCK_SHAPES:  # (each shape's k: a long row's merge tile depends on it)
        sk.precompile([(q, n)], k=k, progress=False)
    dev = torch.cuda.current_device()
    kernels = {(dev, t, kind) for q, n, k, _ in BLOCK_SHAPES for kind, t in sk.launch_plan(q, n, k)[2:]}
    assert sk.launch_plan(6, 131072, 2048)[2:] == (("chunks", 1024), ("merge", 1024))
    for q in (24, 64):
        assert sk.launch_plan(q, 131072, 2048)[2:] == (("sample", 256), ("keep", 256), ("chunks_gated", 1024),
                                                       ("merge_gated", 1024))
    assert kernels <= set(select_block._KERNELS)
    before = len(select_block._KERNELS)
    for kind in ("random", "nandups", "padding"):
        for q, n, k, stride in BLOCK_SHAPES:
            big_s, big_i = make_case(kind, q, stride, k, seed=q + n + k, device="cuda")
            scores, ids = big_s[:, :n], big_i[:, :n]
            check_equal(sk.triton_ordered_select(scores, ids, k),
                        ref_packed(scores.contiguous(), ids.contiguous(), k), f"{kind} q={q} n={n} k={k}")
    assert len(select_block._KERNELS) == before


# (n, k, chunk): chunks of one candidate, a last chunk of one, chunks shorter than k, k beyond n
BLOCK_CHUNKS = [(37, 5, 1), (37, 5, 4), (100, 64, 16), (300, 1, 7), (2048, 64, 2047), (1000, 2048, 100),
                (6144, 100, 1000), (5000, 2048, 4096), (300, 300, 150)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k,chunk", BLOCK_CHUNKS)
def test_block_path_chunks_and_their_merge_against_python(chunked, kind, n, k, chunk):
    """A row cut into chunks (select_block.chunking): a block a chunk keeps its best in no order
    with their positions in the row, a block a row merges them; ties broken by id, then by
    position across chunks (duplicate ids, NaN payloads), pads, -inf, +-0: against a plain sort."""
    from tpflare.ops import select_block

    _require_kernel()
    _require_path("block")
    assert select_block.chunking(n, k, chunk)[0] > 1
    scores, ids = make_case(kind, 3, n, k, seed=n + k + chunk)
    got = select_block.block_select(scores.cuda(), ids.cuda(), k, chunk=chunk)
    check_equal(got, ref_python(scores, ids, k), f"{kind} n={n} k={k} chunk={chunk}")


@pytest.mark.parametrize("n,chunk", [(6000, 1500), (6000, 4096), (40000, None)])
def test_block_path_merge_orders_equal_keys_by_position(chunked, n, chunk):
    """Equal keys (one id twice, both NaN, payloads differ) in the chunks' winners: the merge
    orders them by their positions in the row, not by where the chunks wrote them (warps append a
    chunk's winners in no fixed order). Each id sits at positions p and p + 32 (neighbouring warps
    of one block), in reverse too; odd and even k cut through the pairs."""
    from tpflare.ops import select_block

    _require_kernel()
    _require_path("block")
    g = torch.Generator().manual_seed(n)
    q = 4
    base = (torch.randperm(n, generator=g)[: -(-n // 64) * 32] * 2 + 7).to(torch.int32)  # an id a pair
    pos = torch.arange(n)
    pair = (pos // 64) * 32 + pos % 32  # positions p and p + 32 of each 64 share an id
    ids = base[pair].expand(q, n).clone()
    ids[1] = ids[1].flip(0)
    payload = torch.randint(1, 1 << 22, (q, n), generator=g, dtype=torch.int32)
    scores = (payload | 0x7F800000 | torch.where(torch.rand(q, n, generator=g) < 0.5, 0, -(1 << 31)).to(torch.int32))
    scores = scores.view(torch.float32)
    assert bool(torch.isnan(scores).all())
    for k in (1, 1001, 1500, 2047):
        assert select_block.chunking(n, k, chunk)[0] > 1
        got = select_block.block_select(scores.cuda(), ids.cuda(), k, chunk=chunk)
        check_equal(got, ref_packed(scores.cuda(), ids.cuda(), k), f"n={n} k={k} chunk={chunk}")


@pytest.mark.parametrize("kind", ["random", "special", "padding", "dups", "nandups"])
@pytest.mark.parametrize("n", [16385, 40000, 131072])
def test_block_path_long_rows(chunked, kind, n):
    """Rows beyond a block's 16384 candidates (2 to 8 chunks) at k of 1, 100 and 2048 and a few
    row counts, with a row stride, against the packed reference."""
    _require_kernel()
    _require_path("block")
    for q, k in ((5, 2048), (33, 100), (9, 1)):
        big_s, big_i = make_case(kind, q, n + 3, k, seed=n + k + q, device="cuda")
        scores, ids = big_s[:, :n], big_i[:, :n]
        check_equal(sk.triton_ordered_select(scores, ids, k, path="block"),
                    ref_packed(scores.contiguous(), ids.contiguous(), k), f"{kind} q={q} n={n} k={k}")


def neginf_cutoff_case(q: int, n: int):
    """Rows of a few finite scores, many -inf (valid ids), some NaN and the rest pads, the last
    row with no -inf; and the k that put the cutoff just below, at and above the finite scores,
    through the -inf tie and into the NaN below it: ``(scores, ids, ks)``."""
    g = torch.Generator().manual_seed(n)
    ids = (torch.rand(q, n, generator=g).argsort(dim=1) * 3 + 5).to(torch.int32)
    f, m, z = min(n // 10, 700), n // 2, n // 5  # finite, -inf, NaN a row; the rest pads
    kind = torch.zeros(q, n, dtype=torch.int64)
    kind[:, f:f + m] = 1
    kind[:, f + m:f + m + z] = 2
    kind[:, f + m + z:] = 3
    kind = torch.gather(kind, 1, torch.rand(q, n, generator=g).argsort(dim=1))
    kind[q - 1] = torch.where(kind[q - 1] == 1, torch.zeros_like(kind[q - 1]), kind[q - 1])  # a row with no -inf
    scores = torch.where(kind == 0, torch.randn(q, n, generator=g), torch.tensor(float("-inf")))
    scores = torch.where(kind == 2, torch.tensor(float("nan")), scores)
    ids = torch.where(kind == 3, torch.full_like(ids, -1), ids)
    ks = sorted({max(1, min(k, 2048)) for k in (1, f - 1, f, f + 1, f + m // 2, f + m - 1, f + m, f + m + 1,
                                                  f + m + z + 5)})
    return scores, ids, ks


@pytest.mark.parametrize("n,chunk", [(300, None), (16384, None), (50000, None), (3000, 500)])
def test_block_path_cutoff_at_neginf(chunked, n, chunk):
    """The block kernel takes a cutoff at -inf (a short context's pads with valid ids) from its
    counts, with no radix pass on the score key: k just below, at and above the finite scores,
    through the -inf tie, and into the NaN below it; rows with no -inf; against the references."""
    from tpflare.ops import select_block

    _require_kernel()
    _require_path("block")
    scores, ids, ks = neginf_cutoff_case(4, n)
    for k in ks:
        got = select_block.block_select(scores.cuda(), ids.cuda(), k, chunk=chunk)
        ref = ref_python(scores, ids, k) if n <= 300 else ref_packed(scores.cuda(), ids.cuda(), k)
        check_equal(got, ref, f"n={n} k={k} chunk={chunk}")


def test_block_path_falls_back_to_the_row_kernel_where_it_does_not_compile(monkeypatch, caplog):
    """Where the block kernel does not compile (NVRTC missing or refusing), the call the
    dispatcher sent there runs on the Triton row kernel, exactly, with one warning; the
    dispatcher then takes the row kernel; a call that asked for the block path gets the error."""
    import logging

    from tpflare.ops import select_block

    _require_kernel()
    _require_path("block")
    scores, ids = make_case("special", 9, 6000, 2048, seed=5, device="cuda")
    monkeypatch.setattr(select_block, "_KERNELS", {})
    monkeypatch.setattr(select_block, "_FAILED", [])

    def refuse(*a, **kw):
        raise RuntimeError("NVRTC refused (test)")

    monkeypatch.setattr(torch.cuda, "_compile_kernel", refuse)
    sk._first_call_plan.cache_clear()
    try:
        assert sk.choose_path(9, 6000, 2048, 132) == "block"
        with caplog.at_level(logging.WARNING, logger="tpflare.select_block"):
            got = sk.triton_ordered_select(scores, ids, 2048)
        check_equal(got, ref_packed(scores, ids, 2048), "after the fallback")
        assert "did not compile" in caplog.text and not select_block.available()
        assert sk.choose_path(9, 6000, 2048, 132) == "row"
        with pytest.raises(RuntimeError, match="compile failed"):
            select_block.compile_tile(512)
    finally:
        sk._first_call_plan.cache_clear()


def test_rejects_bad_input():
    if not sk._HAVE_TRITON:
        with pytest.raises(RuntimeError):
            sk.triton_ordered_select(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32), 1)
    else:
        dev = _device() if (INTERPRET or sk.available()) else "cpu"
        with pytest.raises(ValueError):
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int64, device=dev), 1)
        with pytest.raises(ValueError):
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 0)
        with pytest.raises(ValueError):
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     radix_bits=9)
        with pytest.raises(ValueError):
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     path="staged", staged=dict(radix_bits=9))
        for ch in (65536, 3000):  # the narrowing counts a chunk in 16 bits; chunks are powers of two
            with pytest.raises(ValueError, match="fin_chunk"):
                sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev),
                                         1, path="staged", staged=dict(fin_chunk=ch))
        with pytest.raises(ValueError):
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     path="rows")
        with pytest.raises(ValueError, match="resident"):  # a register tile holds 16384 candidates
            sk.triton_ordered_select(torch.zeros(1, 20000, device=dev), torch.zeros(1, 20000, dtype=torch.int32,
                                                                                     device=dev), 1, resident=True)
        with pytest.raises(ValueError, match="chunk"):  # not a power of two
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     chunk=1000)
        with pytest.raises(ValueError, match="order_buckets"):  # neither k's power of two nor twice it
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     order_buckets=8)
        with pytest.raises(ValueError, match="refine"):
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     refine=-1)
        with pytest.raises(ValueError, match="row kernel options"):  # refine is the row kernel's
            sk.triton_ordered_select(torch.zeros(2, 3, device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev), 1,
                                     path="staged", refine=0)
    assert not sk.supports(sk.MAX_CANDIDATES + 1, 1)
    assert not sk.supports(16, sk.MAX_K + 1)
    assert sk.supports(16 * 2048, 2048)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-p", "no:cacheprovider"] + sys.argv[1:]))
