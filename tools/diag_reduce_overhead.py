"""Diagnose mode="reduce-overhead" on a race-bound selection site (GPU machine only).

    python tools/diag_reduce_overhead.py --world 1 --dump-after 60

Runs the selection site of tests/test_gpu_capture.py under cudagraph trees on W ranks
(NCCL) and, if a rank is still running after --dump-after seconds, dumps every thread's
Python stack to stderr (faulthandler), so a hang shows where it waits. Prints the
per-step progress of each rank.
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
import time

import torch


def _rank(rank, world, dump_after, steps, q, c, k):
    faulthandler.dump_traceback_later(dump_after, repeat=True, file=sys.stderr)
    import tpflare
    from tpflare import race

    dev = torch.device("cuda", torch.cuda.current_device())
    tpflare.config.race_iters = 5

    def f(s, i):
        return tpflare.select_topk(s, i, k, with_scores=True)

    cf = torch.compile(f, backend="tpflare", mode="reduce-overhead", fullgraph=True)
    log, bad = [], 0
    t0 = time.perf_counter()
    for step in range(steps):
        s, i = race.make_candidates(q, c, rank, world, 50 + step, "ties" if step % 2 else "holdout", dev)
        got = [t.clone() for t in cf(s, i)]
        torch.cuda.synchronize()
        expected = race.expected_selection(q, c, k, world, 50 + step, "ties" if step % 2 else "holdout")
        ok = race.same_selection(got[0], got[1], *expected)
        bad += int(not ok)
        log.append(f"rank{rank} step{step} {time.perf_counter() - t0:.2f}s ok={ok}")
        print(log[-1], file=sys.stderr, flush=True)
    faulthandler.cancel_dump_traceback_later()
    return dict(bad=bad, log=log, bound=[r.get("composition") for r in tpflare.report() if r["kind"] == "select"])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=max(1, torch.cuda.device_count()))
    ap.add_argument("--dump-after", type=float, default=60)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=180)
    a = ap.parse_args(argv)
    from tpflare.testing import run_ranks

    out = run_ranks(_rank, a.world, args=(a.dump_after, a.steps, 8, 2048, 2048), backend="nccl",
                    timeout=a.timeout, env={"NCCL_NVLS_ENABLE": "0"})
    for r in out:
        print(r)


if __name__ == "__main__":
    main()
