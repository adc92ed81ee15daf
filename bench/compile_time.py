"""Compile time: plain Inductor vs tpflare with a cold and a warm composition cache.

    python bench/compile_time.py --world 2 --json compile.json        # CPU + gloo
    python bench/compile_time.py --world 1 --backend nccl             # GPUs + NCCL

The model is one latent-gather site (K-sliced GEMM + all-reduce) and one
selection site.  Each variant compiles in a fresh process per rank with
Inductor's FX-graph cache off (every variant traces, lowers and generates code)
and Inductor imported before the timer.  The C++/Triton kernel binaries are
built once in a priming round and then loaded from Inductor's cache: the figures
compare graph work plus tpflare's preparation, not the host compiler (on a
2-core CPU one g++ build of a small kernel costs seconds and would swamp both);
``--no-prime`` times a cold kernel cache instead.  The figure
is the max over ranks of (first call - steady call).  tpflare cold = empty
composition cache (the race runs); warm = the same cache again (no race).
The last column is tpflare's own preparation: time inside the tpflare backend
but outside Inductor's ``compile_fx`` (cProfile, slowest rank; profiling adds
overhead to every variant alike).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch


def _variant(rank, world, variant, cache_dir, inductor_dir, rows, hidden, latent, q, c, k, device_kind):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{inductor_dir}/rank{rank}"
    import torch._inductor.config as ic
    from torch._inductor.compile_fx import compile_fx  # noqa: F401  (import cost outside the timer)

    import tpflare
    from tpflare import race

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from replay_stress import _site_fns

    ic.fx_graph_cache = False
    tpflare.config.cache_dir = cache_dir
    tpflare.config.latent_gather = True
    dev = torch.device("cuda", torch.cuda.current_device()) if device_kind == "nccl" else torch.device("cpu")
    model = _site_fns(rank, world, hidden, latent, q, c, k)
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=dev)
    w_col = torch.randn(latent, hidden // world, dtype=torch.bfloat16, device=dev)
    s, i = race.make_candidates(q, c, rank, world, 1, "trial", dev)
    backend = "inductor" if variant == "inductor" else "tpflare"
    cf = torch.compile(model, backend=backend, fullgraph=True)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    import cProfile

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    cf(x, w_col, s, i)
    sync()
    prof.disable()
    first = time.perf_counter() - t0
    steady = []
    for _ in range(5):
        t0 = time.perf_counter()
        cf(x, w_col, s, i)
        sync()
        steady.append(time.perf_counter() - t0)
    return dict(compile_s=first - statistics.median(steady), races=race.stats["races"],
                cache_hits=race.stats["cache_hits"], own_prep_s=_tpflare_own_seconds(prof))


def _tpflare_own_seconds(prof) -> float | None:
    """Seconds inside the tpflare backend but outside Inductor's compile_fx (cProfile)."""
    import pstats

    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, cumtime, callers)
    backend = [v[3] for (f, _, name), v in stats.items() if name == "tpflare_backend"]
    inductor = [v[3] for (f, _, name), v in stats.items()
                if name == "compile_fx" and f.endswith("compile_fx.py")]
    if not backend:
        return None
    return max(backend) - (max(inductor) if inductor else 0.0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--latent", type=int, default=512)
    ap.add_argument("--q", type=int, default=8)
    ap.add_argument("--c", type=int, default=256)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--no-prime", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    from tpflare.testing import run_ranks

    cache_dir = tempfile.mkdtemp(prefix="tpflare_compile_bench_")
    inductor_dir = tempfile.mkdtemp(prefix="tpflare_compile_bench_inductor_")
    if not a.no_prime:
        for variant in ["inductor", "tpflare_cold"]:
            run_ranks(_variant, a.world, args=(variant, tempfile.mkdtemp(), inductor_dir, a.rows, a.hidden,
                                               a.latent, a.q, a.c, a.k, a.backend), backend=a.backend, timeout=900)
    out = {}
    for variant in ["inductor", "tpflare_cold", "tpflare_warm"]:
        res = run_ranks(_variant, a.world, args=(variant, cache_dir, inductor_dir, a.rows, a.hidden, a.latent, a.q, a.c,
                                                 a.k, a.backend), backend=a.backend, timeout=900)
        own = [r["own_prep_s"] for r in res if r["own_prep_s"] is not None]
        out[variant] = dict(compile_s=max(r["compile_s"] for r in res), races=res[0]["races"],
                            cache_hits=res[0]["cache_hits"], own_prep_s=max(own) if own else None)
    base = out["inductor"]["compile_s"]
    print(f"{'variant':<14} {'compile s':>10} {'vs inductor':>12} {'races':>6} {'cache hits':>11} "
          f"{'tpflare outside compile_fx s':>29}")
    for v, r in out.items():
        own = "-" if r["own_prep_s"] is None else f"{r['own_prep_s']:.3f}"
        print(f"{v:<14} {r['compile_s']:>10.2f} {r['compile_s'] / base:>12.2f} {r['races']:>6} "
              f"{r['cache_hits']:>11} {own:>29}")
    print(f"race cost per site (cold - warm): {out['tpflare_cold']['compile_s'] - out['tpflare_warm']['compile_s']:.2f} s")
    if a.json:
        json.dump(dict(args=vars(a), results=out), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
