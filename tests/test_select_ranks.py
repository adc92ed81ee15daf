"""Both selection compositions across real gloo processes, against the Python reference.

One spawn per world size runs every case (spawns cost seconds each): replicated,
owner with both id-replication plans, the model-facing op, ``replicate_ids`` alone
(special int32 values through a real BF16 all-reduce), ``torch.compile(fullgraph=True)``
of each composition, and the preparation-time shape agreement.  The parent compares
every rank's output with ``reference_select`` on the whole candidate set.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from tpflare.testing import run_ranks
from test_select_ordering import as_bits, from_bits, reference_select, special_bits

pytestmark = pytest.mark.multiproc

INT32_SPECIALS = [0, -1, 1, 2 ** 31 - 1, -(2 ** 31), 255, 256, -256, 0x01020304, -0x01020304]


def make_case(name: str, world: int, q: int, c: int, seed: int):
    """Global candidates ``[W, Q, C]`` (scores fp32, ids int32): identical on every rank."""
    rng = random.Random(f"{name}/{world}/{q}/{c}/{seed}")
    n = world * q * c
    if name == "random":
        bits = [[struct_bits(rng.gauss(0, 1)) for _ in range(c)] for _ in range(world * q)]
    elif name == "ties":          # a handful of values: exact ties at every cutoff
        vals = [struct_bits(v) for v in (0.5, 0.25, 0.5, -1.0)]
        bits = [[rng.choice(vals) for _ in range(c)] for _ in range(world * q)]
    elif name == "dup_across_ranks":  # every rank holds the same scores for a row
        rows = [[struct_bits(rng.choice((1.0, 2.0, 3.0))) for _ in range(c)] for _ in range(q)]
        bits = [list(rows[j % q]) for j in range(world * q)]
    elif name == "specials":
        bits = [[rng.choice(special_bits) for _ in range(c)] for _ in range(world * q)]
        for row in bits:            # both zeros in every row: +0.0 must rank above -0.0
            row[0], row[-1] = struct_bits(0.0), struct_bits(-0.0)
    else:
        raise ValueError(name)
    ids = rng.sample(range(0, 2 ** 31 - 1), n) if rng.random() < 0.5 else rng.sample(range(n * 2), n)
    ids = [ids[j * c:(j + 1) * c] for j in range(world * q)]
    for row in ids:                 # padding, including other negative ids
        for j in range(c):
            if rng.random() < 0.15:
                row[j] = rng.choice((-1, -1, -3, -(2 ** 31)))
    if q > 1:                       # one all-padding row, one row with a single valid id
        for r in range(world):
            ids[r * q + 0] = [-1] * c
            ids[r * q + q - 1] = [-1] * c
        ids[q - 1][0] = 12345
    if q > 2:
        ids[1][0] = -3
    scores = from_bits(bits).view(world, q, c)
    return scores, torch.tensor(ids, dtype=torch.int32).view(world, q, c)


def struct_bits(x: float) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", x))[0]


def cases(world: int):
    """(name, q, c, k, seed) for one world size: every shape the brief lists."""
    out = []
    shapes = [(1, 4), (world - 1, 3), (world + 1, 5), (2 * world + 1, 6), (3 * world, 4)]
    for name in ("random", "ties", "dup_across_ranks", "specials"):
        for si, (q, c) in enumerate(shapes):
            q = max(q, 1)
            ks = {c + 1, world * c} | ({1, c} if name in ("ties", "specials") else set())
            for k in sorted(ks):
                out.append((name, q, c, k, si))
    return out


COMPOSITIONS = [("replicated", None), ("owner", "allgather"), ("owner", "bf16"), ("select", None),
                ("by_rows", None)]
# select_by_rows' table in these tests: Q = 1 owner/bf16, 2 replicated, 3-4 owner/allgather, and
# owner/allgather beyond (the cases' Q of 1, W - 1, W + 1, 2W + 1 and 3W reach every entry)
BY_ROWS = ([1, 2, 4], "owner/bf16,replicated,owner/allgather")


def call_composition(comp, plan, s, i, k, g, with_scores):
    """One entry of COMPOSITIONS on this rank's candidates (group name ``g``)."""
    ops = torch.ops.tpflare
    if comp == "replicated":
        return ops.select_replicated(s, i, k, g, with_scores)
    if comp == "owner":
        return ops.select_owner(s, i, k, g, with_scores, plan)
    if comp == "by_rows":
        return ops.select_by_rows(s, i, k, g, with_scores, *BY_ROWS)
    return ops.select(s, i, k, g, with_scores)


def _run_all(rank, world):
    import torch.distributed as dist

    import tpflare  # noqa: F401  registers the ops
    from tpflare.distributed import group_name_of
    from tpflare.ops.select import rows_per_owner, select_topk, validate_candidates

    g = group_name_of(None)
    ops = torch.ops.tpflare
    results = {}
    for ci, (name, q, c, k, seed) in enumerate(cases(world)):
        s_all, i_all = make_case(name, world, q, c, seed)
        s, i = s_all[rank], i_all[rank]
        if ci % 3 == 0:             # strided inputs are accepted
            s, i = s.t().contiguous().t(), i.t().contiguous().t()
        for comp, plan in COMPOSITIONS:
            for with_scores in (False, True):
                out = call_composition(comp, plan, s, i, k, g, with_scores)
                assert out[1].shape == ((q, k) if with_scores else (q, 0))
                results[(ci, comp, plan, with_scores)] = (out[0].tolist(), as_bits(out[1]))
    results["topk_helper"] = select_topk(s, i, k).tolist()

    # replicate_ids alone: special int32 values and random bits, Q < W and Q % W != 0
    rep = {}
    gen = torch.Generator().manual_seed(7)
    for q in (1, world - 1 or 1, world + 1, 3 * world):
        full = torch.randint(-(2 ** 31), 2 ** 31 - 1, (q, 13), generator=gen, dtype=torch.int64)
        full[:, :len(INT32_SPECIALS)] = torch.tensor(INT32_SPECIALS)
        full = full.to(torch.int32)
        r = rows_per_owner(q, world)
        base, rem = divmod(q, world)
        start = rank * base + min(rank, rem)
        rows = base + (1 if rank < rem else 0)
        local = torch.full((r, 13), 99, dtype=torch.int32)   # padding rows must not leak
        local[:rows] = full[start:start + rows]
        for plan in ("allgather", "bf16"):
            got = ops.replicate_ids(local, q, g, plan)
            rep[(q, plan)] = torch.equal(got, full) and got.dtype == torch.int32
    results["replicate"] = rep

    # fullgraph compile of every composition (inductor at W=2, aot_eager at W=4)
    s_all, i_all = make_case("specials", world, world + 1, 4, 3)
    s, i = s_all[rank], i_all[rank]
    k = 2 * 4
    backends = ("inductor",) if world == 2 else ("aot_eager",)
    comp_ok = {}
    for backend in backends:
        def fn(s, i):
            a = ops.select_replicated(s, i, k, g, True)
            b = ops.select_owner(s, i, k, g, True, "bf16")
            c_ = ops.select_owner(s, i, k, g, False, "allgather")
            d = select_topk(s, i, k)  # group=None resolved while tracing
            e = ops.select_by_rows(s, i, k, g, True, *BY_ROWS)
            return a, b, c_, d, e
        torch._dynamo.reset()
        a, b, c_, d, e = torch.compile(fn, fullgraph=True, backend=backend)(s, i)
        ea = ops.select_replicated(s, i, k, g, True)
        comp_ok[backend] = (torch.equal(a[0], ea[0]) and torch.equal(b[0], ea[0])
                            and torch.equal(c_[0], ea[0]) and torch.equal(d, ea[0]) and torch.equal(e[0], ea[0])
                            and torch.equal(a[1].view(torch.int32), ea[1].view(torch.int32)))
    results["compile"] = comp_ok

    # preparation-time agreement: rank 1 passes a different C -> every rank raises
    bad_c = 4 if rank == 1 else 3
    try:
        validate_candidates(torch.zeros(2, bad_c), torch.zeros(2, bad_c, dtype=torch.int32), 2,
                            timeout_s=60)
        results["validate_mismatch"] = "no error"
    except Exception as e:
        results["validate_mismatch"] = f"{type(e).__name__}: {e}"
    validate_candidates(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32), 2, timeout_s=60)
    dist.barrier()
    return results


@pytest.mark.parametrize("world", [2, 3])  # (3: owner blocks of unequal rows, Q < W, Q = W + 1)
def test_compositions_match_reference(world):
    res = run_ranks(_run_all, world, timeout=240)
    checked = 0
    for ci, (name, q, c, k, seed) in enumerate(cases(world)):
        s_all, i_all = make_case(name, world, q, c, seed)
        exp_ids, exp_bits = reference_select(list(s_all), list(i_all), k)
        for rank, r in enumerate(res):
            for comp, plan in COMPOSITIONS:
                for with_scores in (False, True):
                    ids, bits = r[(ci, comp, plan, with_scores)]
                    where = (name, q, c, k, comp, plan, with_scores, rank)
                    assert ids == exp_ids, where
                    if with_scores:
                        assert bits == exp_bits, where
                    checked += 1
    assert checked == len(cases(world)) * world * len(COMPOSITIONS) * 2
    for rank, r in enumerate(res):
        assert all(r["replicate"].values()), (rank, r["replicate"])
        assert r["compile"] and all(r["compile"].values()), (rank, r["compile"])
        assert r["topk_helper"] == res[0]["topk_helper"]
        msg = r["validate_mismatch"]
        assert msg.startswith("ValueError") and "disagree" in msg and "(2, 4)" in msg, msg


def test_fuzzed_cases_match_reference():
    """tools/fuzz_compositions.py at W = 3: 60 seeded cases (shapes, inputs drawn as
    tools/fuzz_select.py draws them), every composition against the Python reference."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import fuzz_compositions

    res = fuzz_compositions.run([3], cases=60, seed=0, timeout=240)
    assert res["mismatches"] == [], res["mismatches"][:5]
    drawn = [fuzz_compositions.draw_case(0, 3, j) for j in range(60)]
    assert any(q < 3 for q, _, _, _ in drawn) and any(q % 3 for q, _, _, _ in drawn)
    assert any(k == 3 * c for _, c, k, _ in drawn) and any(k == 1 for _, _, k, _ in drawn)


def test_fuzzed_cases_compiled_match_reference():
    """tools/fuzz_compositions.py --compiled at W = 2: seeded cases on the path a model takes
    (``tpflare.select_topk`` under ``torch.compile(backend="tpflare")``: raced, bound, and a table by
    rows where the second row count or ``dynamic=True`` makes the rows symbolic), on the drawn
    adversarial inputs, against the Python reference."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import fuzz_compositions

    res = fuzz_compositions.run([2], cases=0, seed=0, timeout=300, compiled=5)
    assert res["mismatches"] == [], res["mismatches"][:5]
    seen = res["compiled_seen"][2]
    assert len(seen) == 5 and all(s["bound"] for s in seen), seen
    assert any("by rows (table)" in s["bound"] for s in seen) and any(s["with_scores"] for s in seen), seen


def test_cases_cover_the_brief():
    for world in (2, 4):
        cs = cases(world)
        qs = {q for _, q, _, _, _ in cs}
        assert 1 in qs and any(q < world for q in qs) and any(q % world for q in qs)
        assert any(k == world * c for _, _, c, k, _ in cs)
        s, i = make_case("specials", world, 3, 6, 0)
        assert torch.isnan(s).any() and torch.isinf(s).any() and (i < -1).any()
        assert (s.view(torch.int32) == -(2 ** 31)).any()  # -0.0 present
        row0 = i[:, 0]                                    # all-padding row on every rank
        assert (row0 == -1).all() and math.isfinite(1.0)
