"""Differential fuzzing of the selection compositions across ranks (gloo, one process a rank).

    python tools/fuzz_compositions.py [--worlds 2,3,4] [--cases 200] [--compiled 0] [--seed S] [--out fuzz.json]

Each world size runs ``--cases`` seeded cases in one spawn of its ranks. A case draws ``Q`` rows
(fewer than the ranks too, and counts the ranks do not divide), ``C`` candidates a rank and ``k``
from 1 to ``W x C``, then the whole ``[Q, W x C]`` candidate set from
``tools/fuzz_select.make_inputs`` (NaN payloads, ``+-0``, ``+-inf``, ties, duplicated and
invalid ids, a cutoff bin at a threshold, ...), so duplicates and ties also fall across ranks;
rank ``r`` holds columns ``r x C .. (r + 1) x C``. Every rank runs the replicated composition,
the owner composition with both id-replication plans and the model-facing ``tpflare::select``,
each with and without scores, and compares them with ``reference_select`` of
``tests/test_select_ordering.py`` (plain Python, on the concatenated candidates): ids equal,
score bits equal except where DESIGN leaves them open (an id held twice in its row whose
copies are both NaN). Cases are drawn from the seed alone, so every rank runs the same ones;
a rank that raises or hangs fails the run (``run_ranks`` stops every rank at its timeout).
Exit status 1 on any mismatch.

``--compiled N`` adds N cases a world size on the path a model takes: ``tpflare.select_topk``
compiled with ``backend="tpflare"`` (the compositions raced on the ranks, the winner bound; under
``dynamic=True``, drawn at times, a table raced at row counts 1 and 4), called at two row counts
on inputs drawn as above, each against the reference (a quick race, a composition cache of its
own a run); a rank that binds other compositions than rank 0 is a mismatch too.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (_HERE, os.path.join(_HERE, "..", "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

from test_select_ranks import COMPOSITIONS, call_composition  # noqa: E402  (what the rank tests run)


def draw_case(seed: int, world: int, index: int) -> tuple[int, int, int, int]:
    """(Q, C, k, the inputs' seed) of case ``index``: the same on every rank."""
    rng = random.Random(f"{seed}/{world}/{index}")
    q = rng.choice((1, max(1, world - 1), world, world + 1, 2 * world + 1, rng.randint(1, 9)))
    c = rng.choice((1, 2, 3, 7, 16, 33, rng.randint(1, 48)))
    n = world * c
    k = rng.choice((1, 2, c, c + 1, n - 1, n, rng.randint(1, n)))
    return q, c, max(1, min(k, n)), rng.randrange(2**31)


def rank_cases(rank: int, world: int, seed: int, cases: int) -> list:
    """What one rank runs: every case's compositions against the reference; its mismatches."""
    import tpflare  # noqa: F401  (registers the ops)
    from fuzz_select import make_inputs, mismatch
    from test_select_ordering import from_bits, reference_select
    from tpflare.distributed import group_name_of

    g = group_name_of(None)
    bad = []
    for index in range(cases):
        q, c, k, case_seed = draw_case(seed, world, index)
        s_all, i_all, drawn = make_inputs(q, world * c, k, case_seed, "cpu")
        s, i = s_all[:, rank * c:(rank + 1) * c], i_all[:, rank * c:(rank + 1) * c]
        ref_ids, ref_bits = reference_select([s_all], [i_all], k)
        want = (torch.tensor(ref_ids, dtype=torch.int32), from_bits(ref_bits))
        for comp, plan in COMPOSITIONS:
            for with_scores in (False, True):
                out = call_composition(comp, plan, s, i, k, g, with_scores)
                got = (out[0], out[1] if with_scores else want[1])
                msg = mismatch(got, want, i_all)
                if msg:
                    bad.append(dict(index=index, q=q, c=c, k=k, seed=case_seed, composition=comp, plan=plan,
                                    with_scores=with_scores, rank=rank, mismatch=msg, **drawn))
    return bad


def draw_compiled(seed: int, world: int, index: int) -> tuple[int, int, int, int, int, bool, bool]:
    """A compiled case: ``draw_case``'s (Q, C, k, seed), a second row count, scores or not, dynamic or not."""
    q, c, k, case_seed = draw_case(seed, world, index)
    rng = random.Random(f"compiled/{seed}/{world}/{index}")
    q2 = rng.choice((1, world, world + 1, rng.randint(1, 9)))
    return q, c, k, case_seed, q2, rng.random() < 0.5, rng.random() < 0.4


def rank_compiled_cases(rank: int, world: int, seed: int, cases: int, cache_dir: str) -> tuple[list, list]:
    """What one rank runs in the compiled mode: each case's ``tpflare.select_topk`` compiled with
    ``backend="tpflare"`` (a race, the winner bound; under ``dynamic=True`` a table by rows) and
    called at two row counts on the drawn inputs; its mismatches, and the decisions seen."""
    import tpflare
    from fuzz_select import make_inputs, mismatch
    from test_select_ordering import from_bits, reference_select

    for name, value in dict(race_iters=3, race_warmup=1, race_holdout=2, cache_dir=cache_dir,
                            select_rows="1,4").items():  # a quick race, as the tests run it
        setattr(tpflare.config, name, value)
    # each rank's candidates are a view at rank * C into the row: the offsets differ by rank, and where
    # one equals a size duck sizing shares their symbol, so a second row count may fail one rank's
    # guards alone (tpflare warns at compile); torch's guard collectives recompile every rank then
    if hasattr(torch.compiler, "set_enable_guard_collectives"):  # (torch >= 2.8)
        torch.compiler.set_enable_guard_collectives(True)
    bad, seen = [], []
    for index in range(cases):
        q, c, k, case_seed, q2, with_scores, dynamic = draw_compiled(seed, world, index)
        torch._dynamo.reset()
        tpflare.clear_report()

        def f(s, i):
            return tpflare.select_topk(s, i, k, with_scores=with_scores)

        cf = torch.compile(f, backend="tpflare", fullgraph=True, dynamic=dynamic or None)
        for qq in dict.fromkeys((q, q2)):
            s_all, i_all, drawn = make_inputs(qq, world * c, k, case_seed + qq, "cpu")
            s, i = s_all[:, rank * c:(rank + 1) * c], i_all[:, rank * c:(rank + 1) * c]
            ref_ids, ref_bits = reference_select([s_all], [i_all], k)
            want = (torch.tensor(ref_ids, dtype=torch.int32), from_bits(ref_bits))
            out = cf(s, i)
            got = (out[0], out[1]) if with_scores else (out, want[1])
            msg = mismatch(got, want, i_all)
            if msg:
                bad.append(dict(index=index, q=qq, c=c, k=k, seed=case_seed + qq, with_scores=with_scores,
                                dynamic=dynamic, rank=rank, mismatch=msg, **drawn))
        seen.append(dict(index=index, q=[q, q2], c=c, k=k, with_scores=with_scores, dynamic=dynamic,
                         bound=sorted({f"{r['composition']} ({r['source']})" for r in tpflare.report()
                                       if r["kind"] == "select"}),
                         warned=sum(r["kind"] == "compile" for r in tpflare.report())))
    return bad, seen


def run(worlds, cases: int, seed: int, timeout: float, compiled: int = 0) -> dict:
    import tempfile

    from tpflare.testing import run_ranks

    res = dict(seed=seed, cases=cases, compiled=compiled, torch=torch.__version__, worlds={}, mismatches=[],
               compiled_seen={})
    for world in worlds:
        t0 = time.time()
        per_rank = run_ranks(rank_cases, world, (seed, cases), timeout=timeout)
        res["worlds"][world] = round(time.time() - t0, 1)
        for bad in per_rank:
            res["mismatches"].extend(bad)
        if compiled:
            with tempfile.TemporaryDirectory(prefix="tpflare_fuzz_cache_") as cache_dir:
                per_rank = run_ranks(rank_compiled_cases, world, (seed, compiled, cache_dir), timeout=timeout)
            res["compiled_seen"][world] = per_rank[0][1]
            for bad, _ in per_rank:
                res["mismatches"].extend(dict(b, mode="compiled") for b in bad)
            for rank, (_, seen) in enumerate(per_rank[1:], 1):  # every rank must bind what rank 0 bound
                for mine, first in zip(seen, per_rank[0][1]):
                    if mine["bound"] != first["bound"]:
                        res["mismatches"].append(dict(mode="compiled", rank=rank, index=mine["index"],
                                                      mismatch=f"bound {mine['bound']}, rank 0 bound {first['bound']}"))
            res["worlds"][world] = round(time.time() - t0, 1)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,3,4", help="world sizes, comma-separated")
    ap.add_argument("--cases", type=int, default=200, help="cases a world size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compiled", type=int, default=0,
                    help="cases a world size compiled with backend='tpflare' (raced, bound, called at two row counts)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a world size's ranks may take")
    ap.add_argument("--out", help="write the summary (JSON) here")
    a = ap.parse_args(argv)
    res = run([int(w) for w in a.worlds.split(",")], a.cases, a.seed, a.timeout, a.compiled)
    for m in res["mismatches"][:20]:
        print("MISMATCH", m)
    print(f"{a.cases} cases (and {a.compiled} compiled) at each world size {list(res['worlds'])} "
          f"(seconds {list(res['worlds'].values())}); {len(res['mismatches'])} mismatches")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
