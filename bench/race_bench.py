"""The selection race per Q: winner, both compositions' times, holdout counts, cache hit on restart.

    python bench/race_bench.py --world 2 --backend nccl --json race.json     # one GPU per rank
    python bench/race_bench.py --world 2                                     # CPU + gloo

First start: an empty composition cache, every Q races (all ranks, max-rank medians).
Second start (new processes, same cache): every Q must be a cache hit with no trial.
"""
from __future__ import annotations

import argparse
import json
import tempfile

import torch


def _start(rank, world, qs, c, k, cache_dir, device_kind, iters):
    import tpflare
    from tpflare import race

    tpflare.config.cache_dir = cache_dir
    tpflare.config.race_iters = iters
    settings = tpflare.config.resolve()
    dev = torch.device("cuda", torch.cuda.current_device()) if device_kind == "nccl" else torch.device("cpu")
    out = []
    for q in qs:
        d = race.decide(q, c, k, "0", False, dev, settings, site=f"Q={q}")
        out.append(dict(Q=q, winner=d.composition.name, source=d.source, timings=d.timings,
                        validation={n: v for n, v in d.validation.items() if not n.startswith("_")},
                        memory=d.validation.get("_memory")))
    return dict(results=out, stats=dict(race.stats))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--q", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
    ap.add_argument("--c", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    from tpflare.testing import run_ranks

    cache_dir = tempfile.mkdtemp(prefix="tpflare_race_bench_")
    env = {"NCCL_NVLS_ENABLE": "0"}
    first = run_ranks(_start, a.world, args=(a.q, a.c, a.k, cache_dir, a.backend, a.iters),
                      backend=a.backend, timeout=1800, env=env)
    second = run_ranks(_start, a.world, args=(a.q, a.c, a.k, cache_dir, a.backend, a.iters),
                       backend=a.backend, timeout=600, env=env)
    print(f"W={a.world} {a.backend} C={a.c} k={a.k}; times = slowest rank's median (ms)")
    names = sorted({n for r in first[0]["results"] for n in r["timings"]})
    print(f"{'Q':>5} " + " ".join(f"{n:>16}" for n in names) + f" {'winner':>16} {'holdouts ok':>12} {'2nd start':>10}"
          f" {'timing':>7} {'rank0 bytes before/after race':>30}")
    for r, r2 in zip(first[0]["results"], second[0]["results"]):
        cells = " ".join(f"{(r['timings'][n]['max_rank_ms'] or float('nan')):>16.3f}" for n in names)
        ok = all(not v["failed_ranks"] for v in r["validation"].values())
        timing = "/".join(sorted({t.get("timing", "?") for t in r["timings"].values()}))
        mem = r["memory"] or {}
        mem_cell = f"{mem.get('allocated_before', '-')}/{mem.get('allocated_after', '-')}"
        print(f"{r['Q']:>5} {cells} {r['winner']:>16} {str(ok):>12} {r2['source']:>10} {timing:>7} {mem_cell:>30}")
    print("second start stats per rank:", [s["stats"] for s in second])
    agree = all(len({f["results"][i]["winner"] for f in first}) == 1 for i in range(len(a.q)))
    print("same winner on every rank:", agree)
    if a.json:
        json.dump(dict(args=vars(a), first=first, second=second), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
