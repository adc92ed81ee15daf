"""Differential fuzzing of the block path's CUDA kernel on the CPU (no GPU needed): the kernel text
NVRTC compiles, built by tests/cuda_on_cpu.py, through ``block_select``; cases from
tools/fuzz_select.py's generator (its shapes capped, a third in shorter chunks than the default),
each under its own random thread schedule, bit for bit against the packed-key reference.

    python tools/fuzz_block_cpu.py --seconds 600 [--seed S] [--module bench-variant.py] [--max-elems N]
                                   [--sampled-min-rows R] [--filter] [--out fuzz.json] [--save DIR]

``--module``: a copy of ops/select_block.py (a variant written by bench/block_variants.py).
``--sampled-min-rows R`` sets the module's ``SAMPLED_MIN_ROWS`` (1: every call in chunks takes the
sampled keep; the shipped 64 is beyond these cases' 16 rows). The rows the sampled keep saw (the
module's ``STATS``) are counted by who served them: ``rows_kept`` (the keep), ``rows_chunks`` (the
chunks).
``--filter``: only the filter kind's rows (1-3 rows of 8193-16384, half of them a multiple of 4, which the bulk
copy loads; k of 1-2048; fuzz_select's input kinds), launched with no SM to spare so that the filter kind takes
them.
Exit status 1 when any case mismatched or a launch failed (a deadlock, a crash, a hang).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import fuzz_select  # noqa: E402
from block_on_cpu import BlockOnCpu, load_module  # noqa: E402
from test_select_kernel_gpu import ref_packed  # noqa: E402

from tpflare.ops import select_block  # noqa: E402


def _filter_case(rng: random.Random) -> dict:
    """A case of the filter kind's rows (--filter): the fields of fuzz_select.draw_block_case."""
    q, n = rng.randint(1, 3), rng.randint(8193, 16384)
    if rng.random() < 0.5:
        n = 16384 - 4 * rng.randint(0, 2047)  # (the bulk copy's rows)
    k = rng.choice([1, 2, 7, 100, 1000, 2047, 2048, rng.randint(1, 2048)])
    seed = rng.randrange(1 << 30)
    scores, ids, info = fuzz_select.make_inputs(q, n, k, seed, "cpu")
    return dict(q=q, n=n, k=k, chunk=None, seed=seed, scores=scores, ids=ids, info=info)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--module", help="a copy of ops/select_block.py to fuzz instead of the shipped one")
    ap.add_argument("--max-elems", type=int, default=1 << 18, help="at most this many candidates a case (Q x N)")
    ap.add_argument("--sampled-min-rows", type=int, help="the module's SAMPLED_MIN_ROWS (1: the sampled keep always)")
    ap.add_argument("--filter", action="store_true", help="only rows of the filter kind (8193-16384 candidates)")
    ap.add_argument("--out", help="write the summary (JSON) here")
    ap.add_argument("--save", help="write each failing case's inputs into this folder")
    a = ap.parse_args(argv)
    mod = load_module(a.module) if a.module else select_block
    run = BlockOnCpu(mod)
    if a.sampled_min_rows is not None:
        mod.SAMPLED_MIN_ROWS = a.sampled_min_rows
    counts = hasattr(mod, "STATS")  # (each sampled call's rows' status)
    if counts:
        mod.STATS = []
    rng = random.Random(a.seed)
    t0 = time.time()
    cases, chunked, bad = 0, 0, []
    while time.time() - t0 < a.seconds:
        c = _filter_case(rng) if a.filter else fuzz_select.draw_block_case(rng, a.max_elems, mod, "cpu", max_rows=16)
        q, n, k, chunk, case_seed = c["q"], c["n"], c["k"], c["chunk"], c["seed"]
        scores, ids, info = c["scores"], c["ids"], c["info"]
        try:
            got = run(scores, ids, k, chunk, case_seed % 1000 + 1, **({"n_sm": 0} if a.filter else {}))
            if a.filter and run.launched[-1][1] != "filter":
                raise RuntimeError(f"not the filter kind: {run.launched[-1]}")
            why = fuzz_select.mismatch(got, ref_packed(scores.contiguous(), ids.contiguous(), k))
        except RuntimeError as e:  # the CPU runner's report: a deadlock, a crash, a hang
            why = str(e)
        cases += 1
        chunked += mod.chunking(n, k, chunk)[0] > 1
        if why:
            case = dict(q=q, n=n, k=k, chunk=chunk, seed=case_seed, info=info, why=why)
            bad.append(case)
            print(f"MISMATCH {case}", flush=True)
            if a.save:
                os.makedirs(a.save, exist_ok=True)
                torch.save(dict(scores=scores, ids=ids, **case), os.path.join(a.save, f"case{len(bad)}.pt"))
    summary = dict(module=a.module or "ops/select_block.py", sampled_min_rows=getattr(mod, "SAMPLED_MIN_ROWS", None),
                   seconds=round(time.time() - t0, 1), seed=a.seed,
                   cases=cases, chunked=chunked, mismatches=len(bad), first=bad[:5])
    if counts:
        status = torch.cat([st[:, 3] for st in mod.STATS]) if mod.STATS else torch.zeros(0)
        summary.update(rows_kept=int((status >= 0).sum()), rows_chunks=int((status < 0).sum()))
    print(json.dumps({k: v for k, v in summary.items() if k != "first"}), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
