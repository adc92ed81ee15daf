"""Compile time: plain Inductor vs tpflare with a cold and a warm composition cache.

    python bench/compile_time.py --world 2 --repeat 3 --json compile.json      # CPU + gloo
    python bench/compile_time.py --world 2 --backend nccl --repeat 3           # GPUs + NCCL
    python bench/compile_time.py --world 2 --model sites                       # the two sites alone

``--model demo`` (default) compiles the demo's LatentMoE layer
(``tpflare.demo_model.LatentMoETP``: a latent-gather site with its registered
row shard, router, experts, expert all-reduce, RMS norm, up-projection) and one
selection site, in one graph; ``--layers N`` stacks N such layers (N latent and N
selection sites).  ``--model sites`` compiles the two sites alone
(K-sliced GEMM + all-reduce, selection): a graph in which plain Inductor
generates no kernel at all, so any kernel the rewrite needs carries Inductor's
whole per-process first-kernel cost (see docs/benchmarks.md).

Each variant compiles in a fresh process per rank with Inductor's FX-graph cache
off (which also bypasses AOTAutograd's cache: every variant traces, lowers and
generates code) and Inductor imported before the timer; the ranks meet at a
barrier just before the timed call, so start skew is not timed.  The C++/Triton
kernel binaries are built once in a priming round and then loaded from
Inductor's cache: the figures compare graph work plus tpflare's preparation,
not the host compiler (on a 2-core CPU one g++ build of a small kernel costs
seconds and would swamp both); ``--no-prime`` times a cold kernel cache instead.
The figure is the max over ranks of (first call - steady call), the median over
``--repeat`` rounds; "CPU s" is the same for CPU seconds (the rank's process and
its finished subprocesses: far less sensitive than wall time to other jobs on a
shared machine, blind to time spent waiting).  tpflare cold = empty composition cache (the race runs);
warm = the cache the same round's cold run filled (no race).  Further columns
(first call under cProfile, slowest rank; profiling adds overhead to every
variant alike): kernels Inductor generated, Inductor's codegen + kernel load
(``GraphLowering.compile_to_module``), and tpflare's own preparation: time inside
the tpflare backend but outside Inductor's ``compile_fx``, plus the latent gather's
preparation inside it (``tpflare.latent_prep``, outside ``compile_fx_inner``), of which in
preparation-time agreement collectives (waits for the other ranks included).
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

VARIANTS = ("inductor", "tpflare_cold", "tpflare_warm")


def _build(model_kind, layers, rank, world, rows, hidden, latent, q, c, k, dev):
    """The compiled function and its example arguments."""
    import tpflare
    from tpflare import race

    s, i = race.make_candidates(q, c, rank, world, 1, "trial", dev)
    if model_kind == "sites":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from replay_stress import _site_fns

        x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=dev)
        w_col = torch.randn(latent, hidden // world, dtype=torch.bfloat16, device=dev)
        return _site_fns(rank, world, hidden, latent, q, c, k), (x, w_col, s, i)
    from tpflare.demo_model import LatentMoETP, LatentMoEWeights

    fulls = [LatentMoEWeights.create(hidden, latent, seed=n) for n in range(layers)]
    stack = [LatentMoETP(full, rank, world).to(dev) for full in fulls]
    for layer in stack:
        layer.register_row_shards()
    cands = [t for n in range(layers) for t in race.make_candidates(q, c, rank, world, 1 + n, "trial", dev)]

    def model(x, *cands):
        outs = []
        for n, layer in enumerate(stack):  # each layer: its latent site and its own selection site
            x = layer(x)
            outs += tpflare.select_topk(cands[2 * n], cands[2 * n + 1], k, with_scores=True)
        return (x, *outs)

    return model, (fulls[0].inputs(rows).to(dev), *cands)


def _variant(rank, world, variant, model_kind, layers, cache_dir, inductor_dir, rows, hidden, latent, q, c, k,
             device_kind):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{inductor_dir}/rank{rank}"
    import cProfile

    import torch._inductor.config as ic
    import torch._inductor.metrics as metrics
    import torch.distributed as dist
    from torch._inductor.compile_fx import compile_fx  # noqa: F401  (import cost outside the timer)

    import tpflare
    from tpflare import race

    ic.fx_graph_cache = False
    tpflare.config.cache_dir = cache_dir
    tpflare.config.latent_gather = True
    dev = torch.device("cuda", torch.cuda.current_device()) if device_kind == "nccl" else torch.device("cpu")
    model, args = _build(model_kind, layers, rank, world, rows, hidden, latent, q, c, k, dev)
    backend = "inductor" if variant == "inductor" else "tpflare"
    cf = torch.compile(model, backend=backend, fullgraph=True)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    prof = cProfile.Profile()
    dist.barrier()
    with torch.no_grad():
        t0, c0 = time.perf_counter(), _cpu_seconds()
        prof.enable()
        cf(*args)
        sync()
        prof.disable()
        first, first_cpu = time.perf_counter() - t0, _cpu_seconds() - c0
        steady = []
        c0 = _cpu_seconds()
        for _ in range(5):
            t0 = time.perf_counter()
            cf(*args)
            sync()
            steady.append(time.perf_counter() - t0)
        steady_cpu = (_cpu_seconds() - c0) / 5
    own, collectives = _tpflare_own_seconds(prof)
    return dict(compile_s=first - statistics.median(steady), cpu_s=first_cpu - steady_cpu, races=race.stats["races"],
                cache_hits=race.stats["cache_hits"], kernels=metrics.generated_kernel_count,
                codegen_s=_cumulative(prof, "graph.py", "compile_to_module"),
                own_prep_s=own, collectives_s=collectives)


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished subprocesses (Inductor's probes, g++)."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _cumulative(prof, file_suffix: str, name: str) -> float:
    """Largest cumulative seconds of function ``name`` defined in a file ending in ``file_suffix``."""
    import pstats

    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, cumtime, callers)
    return max([v[3] for (f, _, n), v in stats.items() if n == name and f.endswith(file_suffix)], default=0.0)


def _tpflare_own_seconds(prof) -> tuple[float | None, float | None]:
    """Seconds inside the tpflare backend but outside Inductor's compile_fx, and of those the
    seconds in preparation-time agreement collectives (cProfile)."""
    backend = _cumulative(prof, "backend.py", "tpflare_backend")
    if not backend:
        return None, None
    # the latent gather prepares inside Inductor's compile_fx (tpflare.latent_prep is its inner compiler)
    latent = _cumulative(prof, "latent_prep.py", "__call__") - _cumulative(prof, "compile_fx.py", "compile_fx_inner")
    own = backend - _cumulative(prof, "compile_fx.py", "compile_fx") + max(latent, 0.0)
    return own, _cumulative(prof, "distributed.py", "agree")


def _summary(rounds: list[dict]) -> dict:
    """Median over rounds of each variant's slowest-rank figures."""
    out = {}
    for v in VARIANTS:
        per = [r[v] for r in rounds]

        def med(key):
            xs = [p[key] for p in per if p[key] is not None]
            return statistics.median(xs) if xs else None

        out[v] = dict(compile_s=med("compile_s"), rounds_s=[p["compile_s"] for p in per], cpu_s=med("cpu_s"),
                      races=per[0]["races"],
                      cache_hits=per[0]["cache_hits"], kernels=per[0]["kernels"], codegen_s=med("codegen_s"),
                      own_prep_s=med("own_prep_s"), collectives_s=med("collectives_s"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--model", default="demo", choices=["demo", "sites"])
    ap.add_argument("--layers", type=int, default=1, help="demo model: LatentMoE layers, each with a selection site")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--latent", type=int, default=512)
    ap.add_argument("--q", type=int, default=8)
    ap.add_argument("--c", type=int, default=256)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=1, help="measured rounds (median reported)")
    ap.add_argument("--no-prime", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    from tpflare.testing import run_ranks

    inductor_dir = tempfile.mkdtemp(prefix="tpflare_compile_bench_inductor_")

    def run(variant, cache_dir):
        res = run_ranks(_variant, a.world, args=(variant, a.model, a.layers, cache_dir, inductor_dir, a.rows, a.hidden,
                                                 a.latent, a.q, a.c, a.k, a.backend), backend=a.backend, timeout=900)

        def slowest(key):
            xs = [r[key] for r in res if r[key] is not None]
            return max(xs) if xs else None

        return dict(compile_s=slowest("compile_s"), cpu_s=slowest("cpu_s"), races=res[0]["races"],
                    cache_hits=res[0]["cache_hits"], kernels=slowest("kernels"), codegen_s=slowest("codegen_s"),
                    own_prep_s=slowest("own_prep_s"), collectives_s=slowest("collectives_s"))

    if not a.no_prime:
        for variant in ("inductor", "tpflare_cold"):
            run(variant, tempfile.mkdtemp(prefix="tpflare_compile_bench_prime_"))
    rounds = []
    for _ in range(a.repeat):
        cache_dir = tempfile.mkdtemp(prefix="tpflare_compile_bench_")  # cold, then warm from the same cache
        rounds.append({v: run(v, cache_dir) for v in VARIANTS})
    out = _summary(rounds)
    base = out["inductor"]["compile_s"]
    name = f"demo x{a.layers}" if a.model == "demo" else a.model
    print(f"model: {name}, W={a.world} {a.backend}, median of {a.repeat} round(s)")
    cpu_base = out["inductor"]["cpu_s"]
    print(f"{'variant':<14} {'compile s':>10} {'vs inductor':>12} {'CPU s':>7} {'vs inductor':>12} {'races':>6} "
          f"{'cache hits':>11} {'kernels':>8} {'codegen s':>10} {'tpflare own s':>14} {'collectives s':>14}")
    for v, r in out.items():
        own = "-" if r["own_prep_s"] is None else f"{r['own_prep_s']:.3f}"
        coll = "-" if r["collectives_s"] is None else f"{r['collectives_s']:.3f}"
        print(f"{v:<14} {r['compile_s']:>10.2f} {r['compile_s'] / base:>12.2f} {r['cpu_s']:>7.2f} "
              f"{r['cpu_s'] / cpu_base:>12.2f} {r['races']:>6} {r['cache_hits']:>11} {r['kernels']:>8} "
              f"{r['codegen_s']:>10.2f} {own:>14} {coll:>14}")
    print("rounds (s):", {v: [round(x, 2) for x in r["rounds_s"]] for v, r in out.items()})
    race_s = out["tpflare_cold"]["compile_s"] - out["tpflare_warm"]["compile_s"]
    print(f"race cost (cold - warm): {race_s:.2f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), results=out, rounds=rounds), f, indent=1)


if __name__ == "__main__":
    main()
