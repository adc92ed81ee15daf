"""Differential fuzzing of the exact selection kernels: random shapes and inputs, bit for bit.

    python tools/fuzz_select.py --seconds 300 [--seed S] [--max-elems N] [--other-path P] [--graph P]
                                [--out fuzz.json] [--save DIR]

Each case draws a shape biased to the edges the dispatcher and the kernels have (rows ``Q``
around the staged / row boundary and the SM count, ``N`` around the register tiles, the
sampled and spread thresholds and ``MAX_CANDIDATES``, ``k`` around powers of two and ``N``),
then each row one of a few score patterns (normal at several scales, a few levels, random bit
patterns with NaN payloads and subnormals, rows sorted either way, values a few ulps apart,
scores spread over every octave, a short context padded with ``-inf``, and a cutoff bin of a size
near a threshold of the kernels, ``EDGE_BIN``, with the k-th candidate inside it) with sprinkles of NaN,
``+-0``, ``+-inf``, and one of a few id patterns (distinct ids over a range up to
``INT32_MAX``, ids in or against position order, duplicated ids, a handful of ids shared by
the whole row) with a share of invalid (negative) ids. Some cases take rows of a wider
buffer (a row stride larger than ``N``).

Each case is checked bit for bit (ids and score bits):

* what serving runs: ``ordering.ordered_select(kernel="triton")`` (the dispatcher's path and
  launch plan; ``select_kernel.triton_ordered_select`` where ``k > N``, which the op refuses);
* with probability ``--other-path``, ``triton_ordered_select`` on each other path (``other_paths``:
  of row, staged and, where it runs, block) for the same inputs;
* with probability ``--graph``, the call captured in a CUDA graph, replayed on new inputs
  of the same shape copied into the captured buffers;

against ``ref_packed`` of ``tests/test_select_kernel_gpu.py`` (a stable ``torch.sort`` of
packed keys; equal keys in position order, as the kernels order them). The packed torch path
(``ordering.torch_ordered_select``) is checked against the same reference, up to what
DESIGN's rule leaves open: the bits of a duplicated id whose copies are both NaN.

A mismatch prints its case; ``--save DIR`` also writes its inputs (``torch.save``) for a
repro. ``--out`` writes the cases run by launch plan and pattern, the mismatches and the
seconds. Exit status 1 when any case mismatched. On a CPU with ``TRITON_INTERPRET=1`` it runs
through Triton's interpreter (keep ``--max-elems`` small: the interpreter is slow; no graphs).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_select_kernel_gpu import ref_packed  # noqa: E402  (the tests' independent reference)

from tpflare.ops import ordering  # noqa: E402
from tpflare.ops import select_kernel as sk  # noqa: E402

INT32_MAX = 2**31 - 1
EDGE_Q = (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 31, 63, 64, 65, 127, 128, 129, 132, 133, 255, 256, 264, 511, 1024, 2048)
EDGE_N = (1, 2, 3, 31, 32, 33, 511, 1000, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193, 12000, 16383,
          16384, 16385, 20000, 24576, 24577, 28000, 32768, 40000, 65536, 65537, 100000, 131071, 131072)
EDGE_K = (1, 2, 3, 17, 64, 100, 1000, 1023, 1024, 1025, 2047)
SCORES = ("normal", "levels", "bits", "sorted", "ulps", "octaves", "short", "bin")
# cutoff-bin sizes of the "bin" pattern: around the ordering's crowded bucket (16), the finish's
# register tiers, the refinement thresholds, the staged rank_play and the sampled tile (8192)
EDGE_BIN = (1, 2, 16, 17, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193, 16384)
IDS = ("distinct", "positional", "dups", "few")


def draw_shape(rng: random.Random, max_elems: int, max_rows: int = 4096) -> tuple[int, int, int]:
    n = rng.choice(EDGE_N) if rng.random() < 0.5 else int(round(2 ** rng.uniform(0, 17)))
    n = max(1, min(n, sk.MAX_CANDIDATES, max_elems))
    q = rng.choice(EDGE_Q) if rng.random() < 0.5 else int(round(2 ** rng.uniform(0, 12)))
    q = max(1, min(q, max_rows, max_elems // n))
    r = rng.random()
    if r < 0.45:
        k = sk.MAX_K
    elif r < 0.6:
        k = n + rng.choice((-1, 0, 0, 1))
    else:
        k = rng.choice(EDGE_K)
    return q, n, max(1, min(k, sk.MAX_K))


def _floats(bits: torch.Tensor) -> torch.Tensor:
    # int64 bit patterns (any range: wrapped to 32 bits) as fp32
    return (((bits + 2**31) % 2**32) - 2**31).to(torch.int32).view(torch.float32)


def _score_rows(kind: str, q: int, n: int, k: int, g: torch.Generator, rng: random.Random, dev) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(q, n, generator=g, device=dev) * rng.choice((1.0, 1e-30, 1e30, 3e-39))
    if kind == "levels":  # a few distinct values: ties at the cutoff, a whole row equal at one level
        levels = rng.choice((1, 2, 3, 4, 8, 64, 4096))
        return torch.randint(0, levels, (q, n), generator=g, device=dev).float() * rng.choice((0.25, -1.0, 1e-40))
    if kind == "bits":  # any bit pattern: subnormals, infinities, NaNs of both signs with payloads
        return _floats(torch.randint(-2**31, 2**31, (q, n), generator=g, device=dev, dtype=torch.int64))
    if kind == "sorted":
        return torch.sort(torch.randn(q, n, generator=g, device=dev), dim=1, descending=rng.random() < 0.5)[0]
    if kind == "ulps":  # a few ulps around one value: distinct keys that share every top bit
        base = rng.choice((0x3F800000, 0x00000000, 0x80000005, 0x7F7FFFF0, -0x00800000))
        return _floats(base + torch.randint(0, 7, (q, n), generator=g, device=dev, dtype=torch.int64))
    if kind == "octaves":  # sign and exponent at random: the winners spread over every octave
        e = torch.randint(-149, 128, (q, n), generator=g, device=dev).float()
        sign = torch.where(torch.rand(q, n, generator=g, device=dev) < 0.5, -1.0, 1.0)
        return sign * torch.exp2(e)
    if kind == "short":  # a short context in a padded buffer: the rest -inf with valid ids
        frac = rng.choice((0.0, 0.001, 0.05, 0.5))
        x = torch.randn(q, n, generator=g, device=dev)
        return torch.where(torch.rand(q, n, generator=g, device=dev) < frac, x, float("-inf"))
    if kind == "bin":
        return _bin_rows(q, n, k, g, rng, dev)
    raise ValueError(kind)


def _bin_rows(q: int, n: int, k: int, g: torch.Generator, rng: random.Random, dev) -> torch.Tensor:
    # the cutoff's 12-bit bin (scores in [1, 1.125): one prefix) holds B candidates near a
    # threshold of the kernels, above ones in [2, 4), the rest below 1 (or -inf); the candidates
    # above the bin are as many as put the k-th inside it (where the row allows)
    b = max(1, min(rng.choice(EDGE_BIN) + rng.choice((0, 0, -1, 1)), n))
    above = max(0, min(k - 1 - rng.randrange(min(b, k)), n - b))
    rank = torch.rand(q, n, generator=g, device=dev).argsort(dim=1).argsort(dim=1)  # a random rank a position
    spread = rng.choice((0, 1, 4, 1 << 20))  # the bin's keys: one (a mass tie), a few, or any in the prefix
    inbin = _floats(0x3F800000 + torch.randint(0, spread, (q, n), generator=g, device=dev, dtype=torch.int64)) \
        if spread else torch.full((q, n), 1.0, device=dev)
    high = 2.0 + 2.0 * torch.rand(q, n, generator=g, device=dev)
    low = torch.rand(q, n, generator=g, device=dev) * 0.9
    if rng.random() < 0.3:
        low = torch.full_like(low, float("-inf"))
    return torch.where(rank < above, high, torch.where(rank < above + b, inbin, low))


def _sprinkle(s: torch.Tensor, g: torch.Generator, rng: random.Random) -> torch.Tensor:
    q, n = s.shape
    dev = s.device
    for value in ("nan", "zero", "inf", "-inf"):
        if rng.random() >= 0.3:
            continue
        at = torch.rand(q, n, generator=g, device=dev) < rng.choice((0.001, 0.1, 0.9))
        if value == "nan":  # assorted payloads and both signs
            payload = torch.randint(1, 1 << 23, (q, n), generator=g, device=dev, dtype=torch.int64)
            sign = torch.randint(0, 2, (q, n), generator=g, device=dev, dtype=torch.int64) << 31
            v = _floats((0x7F800000 | payload) | sign)
        elif value == "zero":
            v = torch.where(torch.rand(q, n, generator=g, device=dev) < 0.5, 0.0, -0.0)
        else:
            v = torch.full_like(s, float(value))
        s = torch.where(at, v, s)
    return s


def _id_rows(kind: str, q: int, n: int, g: torch.Generator, rng: random.Random, dev) -> torch.Tensor:
    stride = rng.choice((1, 1, 3, 4096))
    span = stride * n
    base = rng.randint(0, max(0, INT32_MAX - span))
    if kind == "distinct":
        order = torch.rand(q, n, generator=g, device=dev).argsort(dim=1)
        return (base + order * stride).to(torch.int32)
    if kind == "positional":  # ids in (or against) position order
        pos = torch.arange(n, device=dev).expand(q, n)
        if rng.random() < 0.5:
            pos = n - 1 - pos
        return (base + pos * stride).to(torch.int32)
    if kind == "dups":  # a share of positions repeat another position's id (its score too, at times)
        ids = (base + torch.rand(q, n, generator=g, device=dev).argsort(dim=1) * stride)
        src = torch.randint(0, n, (q, n), generator=g, device=dev)
        at = torch.rand(q, n, generator=g, device=dev) < rng.choice((0.01, 0.5, 1.0))
        return torch.where(at, ids.gather(1, src), ids).to(torch.int32)
    if kind == "few":  # a handful of ids shared by the whole row
        return (base + torch.randint(0, rng.choice((1, 2, 16)), (q, n), generator=g, device=dev)).to(torch.int32)
    raise ValueError(kind)


def _invalidate(ids: torch.Tensor, g: torch.Generator, rng: random.Random) -> torch.Tensor:
    share = rng.choices((0.0, 0.01, 0.5, 0.99, 1.0), weights=(60, 20, 12, 6, 2))[0]
    if share == 0.0:
        return ids
    q, n = ids.shape
    neg = torch.randint(-2**31, 0, (q, n), generator=g, device=ids.device, dtype=torch.int64).to(torch.int32)
    neg = torch.where(torch.rand(q, n, generator=g, device=ids.device) < 0.5, torch.full_like(neg, -1), neg)
    return torch.where(torch.rand(q, n, generator=g, device=ids.device) < share, neg, ids)


def make_inputs(q: int, n: int, k: int, seed: int, dev) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A case's scores and ids ([Q, N], rows of up to three score and id patterns) and what was drawn."""
    rng = random.Random(seed)
    g = torch.Generator(device=dev).manual_seed(seed)
    kinds = [(rng.choice(SCORES), rng.choice(IDS)) for _ in range(rng.choice((1, 1, 2, 3)))]
    row_kind = torch.randint(0, len(kinds), (q, 1), generator=g, device=dev)
    scores = torch.empty(q, n, device=dev)
    ids = torch.empty(q, n, dtype=torch.int32, device=dev)
    for j, (sk_, ik) in enumerate(kinds):
        mine = row_kind == j
        scores = torch.where(mine, _sprinkle(_score_rows(sk_, q, n, k, g, rng, dev), g, rng), scores)
        ids = torch.where(mine, _invalidate(_id_rows(ik, q, n, g, rng, dev), g, rng), ids)
    if rng.random() < 0.15:  # rows of a wider buffer
        pad = rng.choice((1, 3, 64))
        wide_s = torch.empty(q, n + pad, device=dev)
        wide_i = torch.empty(q, n + pad, dtype=torch.int32, device=dev)
        wide_s[:, :n], wide_i[:, :n] = scores, ids
        scores, ids = wide_s[:, :n], wide_i[:, :n]
    return scores, ids, dict(patterns=[f"{a}/{b}" for a, b in kinds], strided=scores.stride(0) != n)


def draw_chunk(rng: random.Random, n: int, k: int, block_module, share: float = 1 / 3) -> int | None:
    """For the block path (``block_module``: ops/select_block.py or a copy): with probability
    ``share``, a chunk shorter than the default for a row of ``n`` (its chunks' best merged by one
    block), where the merge holds what they keep; else None (the default chunking)."""
    if n <= 1 or rng.random() >= share:
        return None
    chunk = rng.randrange(1, min(n, block_module.TILE_N) + 1)
    try:
        block_module.chunking(n, k, chunk)
    except ValueError:
        return None
    return chunk


def draw_block_case(rng: random.Random, max_elems: int, block_module, dev, max_rows: int = 4096) -> dict:
    """A case for the block path alone (``block_module``: ops/select_block.py or a copy): a shape
    (``draw_shape``: ``N`` within the block path's ``MAX_N``, which is ``MAX_CANDIDATES``), its
    inputs (``make_inputs``, drawn from ``seed``) and, a third of the time, a shorter chunk
    (``draw_chunk``). Keys: q, n, k, seed, scores, ids, info, chunk."""
    q, n, k = draw_shape(rng, max_elems, max_rows)
    seed = rng.randrange(1 << 30)
    scores, ids, info = make_inputs(q, n, k, seed, dev)
    return dict(q=q, n=n, k=k, seed=seed, scores=scores, ids=ids, info=info,
                chunk=draw_chunk(rng, n, k, block_module))


def special(scores: torch.Tensor, ids: torch.Tensor, k: int) -> bool:
    """Whether a case holds at least min(k, 8) valid candidates and, among them, what the order
    rule singles out: a NaN, an infinity, a zero, a subnormal, or an id held twice in a row (a
    filter for the few cases a test can afford)."""
    valid = ids >= 0
    if int(valid.sum(dim=1).min()) < min(k, 8):
        return False
    odd = torch.isnan(scores) | torch.isinf(scores) | (scores.abs() < 1.1754944e-38)
    if bool((odd & valid).any()):
        return True
    held = torch.where(valid, ids.long(), -1 - torch.arange(ids.shape[1], device=ids.device))
    return bool((torch.sort(held, dim=1)[0].diff(dim=1) == 0).any())


def mismatch(got, want, ids: torch.Tensor | None = None) -> str | None:
    """None when ids and score bits agree, else where they first differ. ``ids`` (the input's):
    score bits may differ where both slots hold a NaN and their id is held more than once in
    the row (DESIGN's latitude, which the packed torch path takes)."""
    gi, gs = got[0], got[1].contiguous().view(torch.int32)
    wi, ws = want[0], want[1].contiguous().view(torch.int32)
    if gi.shape != wi.shape:
        return f"shape {tuple(gi.shape)} against {tuple(wi.shape)}"
    bad = gi != wi
    if bad.any():
        r, c = (int(x) for x in bad.nonzero()[0])
        return f"{int(bad.sum())} ids differ, first at row {r} slot {c}: {int(gi[r, c])} against {int(wi[r, c])}"
    bad = gs != ws
    if ids is not None:
        for r, c in (bad & torch.isnan(got[1]) & torch.isnan(want[1])).nonzero().tolist():
            bad[r, c] = int((ids[r] == gi[r, c]).sum()) < 2
    if bad.any():
        r, c = (int(x) for x in bad.nonzero()[0])
        return f"{int(bad.sum())} score bits differ, first at row {r} slot {c}: {int(gs[r, c]) & 0xFFFFFFFF:#010x} against {int(ws[r, c]) & 0xFFFFFFFF:#010x}"
    return None


def other_paths(q: int, n: int, k: int) -> list[str]:
    """The paths other than the one the dispatcher takes for the shape: the row kernel and the
    staged path always apply, the block path where it runs (rows of up to select_block.MAX_N)."""
    from tpflare.ops import select_block

    chosen = sk.choose_path(q, n, k, 132)
    paths = ["row", "staged"] + (["block"] if select_block.supports(n, k) and select_block.available() else [])
    return [p for p in paths if p != chosen]


def serving_call(scores, ids, k):
    # the public op where it takes the call (it makes rows contiguous), else the kernel itself
    if scores.is_cuda and k <= scores.shape[1] and scores.is_contiguous():
        return ordering.ordered_select(scores, ids, k, kernel="triton")
    return sk.triton_ordered_select(scores, ids, k)


def _graph_check(scores, ids, k, seed, dev) -> str | None:
    # capture the serving call on static buffers, then replay it on other inputs copied into them
    s_in, i_in = scores.clone(), ids.clone()
    serving_call(s_in, i_in, k)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = serving_call(s_in, i_in, k)
    for j in range(2):
        s2, i2, _ = make_inputs(scores.shape[0], scores.shape[1], k, seed * 7 + j + 1, dev)
        s_in.copy_(s2)
        i_in.copy_(i2)
        graph.replay()
        bad = mismatch(out, ref_packed(s_in, i_in, k))
        if bad:
            return f"replay {j}: {bad}"
    return None


def run(seconds: float, seed: int, max_elems: int, other_path: float, graph: float, save: str | None) -> dict:
    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1" else "cpu"
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 132
    rng = random.Random(seed)
    by_plan, by_pattern = collections.Counter(), collections.Counter()
    bad, cases, checks = [], 0, collections.Counter()
    t0 = time.time()
    while time.time() - t0 < seconds:
        case_seed = rng.randrange(2**31)
        q, n, k = draw_shape(random.Random(case_seed), max_elems)
        scores, ids, drawn = make_inputs(q, n, k, case_seed, dev)
        plan = sk.launch_plan(q, n, k, n_sm)
        case = dict(seed=case_seed, q=q, n=n, k=k, plan=str(plan), **drawn)
        want = ref_packed(scores, ids, k)
        found = []
        if k <= n:
            found.append(("torch path", mismatch(ordering.torch_ordered_select(scores, ids, k), want, ids)))
            checks["torch path"] += 1
        found.append(("serving call", mismatch(serving_call(scores, ids, k), want)))
        checks["serving call"] += 1
        if rng.random() < other_path:
            for other in other_paths(q, n, k):
                found.append((f"path={other}", mismatch(sk.triton_ordered_select(scores, ids, k, path=other), want)))
                checks[f"path={other}"] += 1
        if dev == "cuda" and rng.random() < graph:
            found.append(("graph replay", _graph_check(scores, ids, k, case_seed, dev)))
            checks["graph replay"] += 1
        cases += 1
        by_plan[f"{plan[0]} kb={plan[1]} {plan[3:]}"] += 1
        for p in drawn["patterns"]:
            by_pattern[p] += 1
        for what, msg in found:
            if msg:
                bad.append(dict(case, check=what, mismatch=msg))
                print(f"MISMATCH {what}: {case}: {msg}", flush=True)
                if save:
                    os.makedirs(save, exist_ok=True)
                    torch.save(dict(case=case, scores=scores.cpu(), ids=ids.cpu()),
                               os.path.join(save, f"case_{case_seed}.pt"))
    return dict(device=torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (Triton interpreter)",
                torch=torch.__version__, triton=getattr(sk.triton, "__version__", None), seed=seed,
                seconds=round(time.time() - t0, 1), max_elems=max_elems, cases=cases, checks=dict(checks),
                mismatches=bad, by_plan=dict(by_plan.most_common()), by_pattern=dict(by_pattern.most_common()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="fuzz this long (the cases' compiles included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-elems", type=int, default=1 << 24, help="at most this many candidates a case (Q x N)")
    ap.add_argument("--other-path", type=float, default=0.3, help="share of cases also run on the other paths")
    ap.add_argument("--graph", type=float, default=0.05, help="share of cases also replayed in a CUDA graph")
    ap.add_argument("--out", help="write the summary (JSON) here")
    ap.add_argument("--save", help="write each mismatching case's inputs into this folder")
    a = ap.parse_args(argv)
    res = run(a.seconds, a.seed, a.max_elems, a.other_path, a.graph, a.save)
    print(json.dumps({k: v for k, v in res.items() if k != "by_plan"}, indent=1))
    print(f"{res['cases']} cases over {len(res['by_plan'])} launch plans in {res['seconds']} s; "
          f"{len(res['mismatches'])} mismatches")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
