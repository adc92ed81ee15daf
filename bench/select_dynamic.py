"""Which selection decisions one frame gets across row counts, per ``dynamic`` setting (gloo, CPU).

    python bench/select_dynamic.py [--world 2] [--rows 1 8 64 32] [--c 64] [--k 16]

Compiles one ``tpflare.select_topk`` frame with ``torch.compile(backend="tpflare", dynamic=D)``
for D in (None, False, True), calls it at each row count in order, and prints rank 0's select
records: (Q, composition, source, reason). ``dynamic=None`` is Dynamo's default (automatic
dynamic shapes: a frame's second shape compiles a graph of symbolic row count). Fresh
composition cache a setting.
"""
from __future__ import annotations

import argparse
import tempfile


def _frame(rank, world, dynamic, rows, c, k):
    import torch
    import torch.distributed as dist

    import tpflare

    def model(s, i):
        return tpflare.select_topk(s, i, k, group=dist.group.WORLD, with_scores=True)

    cm = torch.compile(model, backend="tpflare", dynamic=dynamic)
    for q in rows:
        s = torch.randn(q, c, generator=torch.Generator().manual_seed(q * 10 + rank))
        i = torch.arange(q * c, dtype=torch.int32).view(q, c) + rank * 10_000_000
        cm(s, i)
    return [(r.get("Q"), r["composition"], r["source"], (r.get("reason") or "")[:60])
            for r in tpflare.reporting.records("select")]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 32])
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    a = ap.parse_args(argv)
    from tpflare.testing import run_ranks

    for dynamic in (None, False, True):
        out = run_ranks(_frame, a.world, args=(dynamic, a.rows, a.c, a.k), timeout=600,
                        env={"TPFLARE_CACHE_DIR": tempfile.mkdtemp(prefix="tpflare_dyn_")})
        print(f"dynamic={dynamic}, rows called {a.rows}:")
        for rec in out[0]:
            print("  ", rec)


if __name__ == "__main__":
    main()
