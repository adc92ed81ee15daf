"""Benchmark: Triton exact ordered selection vs torch.topk (packed int64 key) vs plain fp32 torch.topk.

    python bench/bench_select_kernel.py --out bench_select.json
    python bench/bench_select_kernel.py --out sweep.json --sweep      # also both paths at every Q, staged variants
    python bench/bench_select_kernel.py --out x.json --precompile-only --precompile-tests --precompile-bench
        # fill Triton's cache in parallel first (one compile is 10-70 s), then run pytest / the bench

Times with CUDA events around each call (warm-up first, median of --iters), and
again as CUDA-graph replays of --graph-reps calls (median replay / reps). Inputs
rotate over three sets so that small shapes do not time a warm L2 only.
Methods:
  kernel           tpflare.ops.select_kernel.triton_ordered_select (full op: ids + scores; the
                   path choose_path picks: staged for few rows, the row kernel beyond)
  topk_packed      torch.topk(key, k) on a prebuilt packed int64 key (the selection alone)
  torch_ordered    pack the key + torch.topk + decode ids / gather scores (a whole torch op)
  topk_fp32        torch.topk(scores, k) on fp32 scores (not exact ordering; the speed bar)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from tpflare.ops import select_kernel as sk


def packed_key(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    b = scores.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    u = torch.where(b >= 0x80000000, b ^ 0xFFFFFFFF, b | 0x80000000)
    u = torch.where(torch.isnan(scores), torch.zeros_like(u), u)
    key = (u << 31) | (0x7FFFFFFF - ids.clamp(min=0).to(torch.int64))
    return torch.where(ids >= 0, key, torch.full_like(key, -1))


def torch_ordered(scores: torch.Tensor, ids: torch.Tensor, k: int):
    key = packed_key(scores, ids)
    top, pos = torch.topk(key, k, dim=1)
    ok = top >= 0
    out_ids = torch.where(ok, 0x7FFFFFFF - (top & 0x7FFFFFFF), torch.full_like(top, -1)).to(torch.int32)
    out_sc = torch.where(ok, torch.gather(scores, 1, pos), torch.full_like(scores[:, :1], float("-inf")))
    return out_ids, out_sc


# the configurations tests/test_select_kernel_gpu.py compiles (n:k[:key=value]); --precompile-tests
TEST_SPECS = (
    "37:5,100:64,300:1,2048:64,1000:2048:split=16,6144:100,37:5:resident=0,100:64:resident=0,"
    "300:1:resident=0,2048:64:resident=0,1000:2048:resident=0:split=16,6144:100:resident=0,2048:1,"
    "2048:2048,2048:2048:split=16,16384:1,16384:64,16384:2048,16384:2048:split=16,32768:1,32768:64,"
    "32768:2048,32768:2048:split=16,6144:2048:stride=8192:split=8,6144:2048,6144:2048:split=2,"
    "6144:2048:split=16,2048:2048:order=sort,16384:2048:order=sort,32768:2048:order=sort,"
    "6144:2048:order=sort,6144:2048:radix_bits=3,6144:2048:radix_bits=7,6144:2048:radix_bits=8,"
    "6144:2048:radix_bits=3:resident=0,6144:2048:radix_bits=7:resident=0,6144:2048:radix_bits=8:resident=0,"
    "37:5:path=row,100:64:path=row,300:1:path=row,2048:64:path=row,1000:2048:path=row,6144:100:path=row,"
    "2048:1:path=row,2048:64:path=row,2048:2048:path=row,16384:1:path=row,16384:64:path=row,16384:2048:path=row,"
    "32768:1:path=row,32768:64:path=row,32768:2048:path=row,6144:2048:stride=8192:path=row,"
    # the staged path (tests: 1, 2, 3, 7 and 64 rows; tiles of test_staged_tiles)
    "37:5:path=staged,100:64:path=staged,300:1:path=staged,2048:64:path=staged,1000:2048:path=staged,"
    "6144:100:path=staged,2048:1:path=staged,2048:2048:path=staged,16384:1:path=staged,16384:64:path=staged,"
    "16384:2048:path=staged,32768:1:path=staged,32768:64:path=staged,32768:2048:path=staged,"
    "2048:1:q=64,2048:64:q=64,2048:2048:q=64,16384:1:q=64:path=staged,16384:64:q=64:path=staged,"
    "16384:2048:q=64:path=staged,32768:1:q=64,32768:64:q=64,32768:2048:q=64,6144:2048:path=staged,"
    "6144:2048:path=staged:sorder=sort,6144:2048:stride=8192:path=staged,300:64:path=staged,"
    "1000:2048:path=staged:ca=64:fin_chunk=32:fin_warps=1:fres=64:rank_rows=16,"
    "6144:2048:path=staged:ca=64:fin_chunk=32:fin_warps=1:fres=64:rank_rows=16,"
    "300:64:path=staged:ca=64:fin_chunk=32:fin_warps=1:fres=64:rank_rows=16,"
    "300:64:path=staged:ca=512:fin_chunk=64:fres=256:sbits=5:sorder=sort,"
    "1000:2048:path=staged:ca=512:fin_chunk=64:fres=256:sbits=5:sorder=sort,"
    "6144:2048:path=staged:ca=512:fin_chunk=64:fres=256:sbits=5:sorder=sort,"
    "300:64:path=staged:fin_chunk=128:sbits=3:fuse=0,1000:2048:path=staged:fin_chunk=128:sbits=3:fuse=0,"
    "6144:2048:path=staged:fin_chunk=128:sbits=3:fuse=0,300:64:path=staged:fuse=0:sorder=sort:fres=1024,"
    "1000:2048:path=staged:fuse=0:sorder=sort:fres=1024,6144:2048:path=staged:fuse=0:sorder=sort:fres=1024"
)


STAGED_KEYS = ("ca", "fin_chunk", "fin_warps", "fres", "rank_rows", "sorder", "sbits", "fuse")
_STAGED_NAMES = {"fres": "fin_resident", "sorder": "order", "sbits": "radix_bits"}


def sweep_variants(n: int) -> dict:
    """Kernel launch variants timed with --sweep (the default config is always timed as 'kernel').

    ``path=row`` is the one-program-a-row kernel (its own bitonic / torch.sort choice), with
    ``order=sort`` forced too. The others tune the staged path (``select_staged``): ``sorder``
    its final ordering (rank kernel or torch.sort), ``ca`` candidates a program, ``fres`` the
    in-play candidates the finish kernel holds in registers, ``sbits`` its digit width. ``radix_bits=8`` is the row kernel's former digit width.
    (The row kernel's ``_ablate`` variants, used for the ablation table of
    docs/benchmarks_select_kernel.md, are still accepted in ``--precompile`` specs.)
    """
    vs = [dict(path="row"), dict(path="staged"), dict(path="staged", sorder="sort"), dict(path="staged", fuse=0)]
    return {"kernel_" + "_".join(f"{a.strip('_')}{_spec_value(b)}" for a, b in v.items()): v for v in vs}


def kernel_kwargs(flat: dict) -> dict:
    """A flat variant (or spec) dict as triton_ordered_select keyword arguments."""
    kw = {a: b for a, b in flat.items() if a not in STAGED_KEYS}
    st = {_STAGED_NAMES.get(a, a): b for a, b in flat.items() if a in STAGED_KEYS}
    if st:
        kw["staged"] = st
    return kw


def _spec_value(b):
    return b if isinstance(b, str) else int(b)


def _parse_value(a: str, b: str):
    if a in ("order", "path", "sorder"):
        return b
    return bool(int(b)) if a in ("resident", "fuse") else int(b)


def _compile_one(spec: str) -> str:
    """Compile (and run once) the kernel for 'n:k[:q=rows][:stride=..][:option=value...]'."""
    import time

    parts = spec.split(":")
    n, k = int(parts[0]), int(parts[1])
    opts = dict(p.split("=") for p in parts[2:])
    stride = int(opts.pop("stride", n))
    rows = int(opts.pop("q", 2))  # the staged path's launch config depends on the rows
    cfg = {a: _parse_value(a, b) for a, b in opts.items()}
    t0 = time.time()
    s = torch.randn(rows, stride, device="cuda")[:, :n]
    i = torch.arange(rows * stride, device="cuda", dtype=torch.int32).view(rows, stride)[:, :n]
    if stride == n:
        s, i = s.contiguous(), i.contiguous()
    sk.triton_ordered_select(s, i, k, **kernel_kwargs(cfg))
    torch.cuda.synchronize()
    return f"{spec}: {time.time() - t0:.1f}s"


def precompile(specs, workers: int) -> None:
    """Fill Triton's on-disk cache for many configurations in parallel processes."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import time

    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        for msg in ex.map(_compile_one, specs):
            print("compiled", msg, flush=True)
    print(f"precompiled {len(specs)} configurations in {time.time() - t0:.1f}s", flush=True)


def make_inputs(q: int, n: int, pattern: str, seed: int, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = (torch.rand(q, n, generator=g, device=device).argsort(dim=1) * 4).to(torch.int32)
    if pattern == "random":
        scores = torch.randn(q, n, generator=g, device=device)
    elif pattern == "ties":  # cutoff inside a large tie group: phase 2 runs on every row
        scores = torch.randint(0, 4, (q, n), generator=g, device=device).float()
    else:
        raise ValueError(pattern)
    return scores.contiguous(), ids.contiguous()


def time_eager(fn, sets, iters: int, warmup: int) -> float:
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        args = sets[i % len(sets)]
        a.record()
        fn(*args)
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def time_graph(fn, sets, reps: int, replays: int) -> float:
    for args in sets:
        fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(*sets[i % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--q", default="1,8,64,256,1024")
    ap.add_argument("--n", default="16384,32768", help="candidates a row (8x2048, 16x2048)")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--patterns", default="random")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--graph-reps", type=int, default=10)
    ap.add_argument("--graph-replays", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="also time num_warps/chunk variants of the kernel")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--precompile", default="", help="comma list of n:k[:key=value] specs to compile in parallel first")
    ap.add_argument("--precompile-bench", action="store_true", help="also precompile this bench's own configs")
    ap.add_argument("--precompile-tests", action="store_true", help="also precompile the GPU tests' configs")
    ap.add_argument("--precompile-only", action="store_true", help="compile, then exit")
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args(argv)
    if not sk.available():
        print("kernel not available (needs triton + CUDA)", file=sys.stderr)
        return 2
    qs = [int(x) for x in args.q.split(",")]
    ns = [int(x) for x in args.n.split(",")]
    k = args.k
    specs = [x for x in args.precompile.split(",") if x]
    if args.precompile_tests:
        specs += TEST_SPECS.split(",")
    for n in ns if args.precompile_bench else []:
        variants = [{}] + (list(sweep_variants(n).values()) if args.sweep else [])
        for v in variants:
            for q in qs:  # every bench row count: the launch config depends on it
                w = {"q": q, **v}
                specs.append(f"{n}:{k}:" + ":".join(f"{a}={_spec_value(b)}" for a, b in w.items()))
    if specs:
        precompile(list(dict.fromkeys(specs)), args.workers)
    if args.precompile_only:
        return 0
    dev = torch.cuda.get_device_name()
    import triton

    meta = dict(device=dev, torch=torch.__version__, triton=triton.__version__, k=k,
                iters=args.iters, warmup=args.warmup, graph_reps=args.graph_reps)
    records = []
    for pattern in args.patterns.split(","):
        for n in ns:
            variants = {"kernel": {}}
            if args.sweep:
                variants.update(sweep_variants(n))
            for q in qs:
                sets = [make_inputs(q, n, pattern, seed=1000 * q + n + i) for i in range(3)]
                keys = [(packed_key(s, i),) for s, i in sets]
                ref = torch_ordered(*sets[0], k)
                methods = {}
                for name, kw in variants.items():
                    methods[name] = (lambda s, i, kw=kernel_kwargs(kw): sk.triton_ordered_select(s, i, k, **kw)), sets
                methods["topk_packed"] = (lambda key: torch.topk(key, k, dim=1)), keys
                if args.sweep:  # what ordering k packed keys a row costs in torch (cub/bitonic sort)
                    methods["sort_k_packed"] = (lambda key: torch.sort(key, dim=1, descending=True)), \
                        [(kk[0][:, :k].contiguous(),) for kk in keys]
                methods["torch_ordered"] = (lambda s, i: torch_ordered(s, i, k)), sets
                methods["topk_fp32"] = (lambda s, i: torch.topk(s, k, dim=1)), sets
                for name, (fn, fsets) in methods.items():
                    exact = None
                    try:
                        if name.startswith("kernel"):
                            got = fn(*sets[0])
                            exact = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1].view(torch.int32), ref[1].view(torch.int32)))
                        e = time_eager(fn, fsets, args.iters, args.warmup)
                        gms = None if args.no_graph else time_graph(fn, fsets, args.graph_reps, args.graph_replays)
                    except Exception as ex:  # keep the rest of the table
                        print(f"{name} n={n} q={q}: {type(ex).__name__}: {ex}", file=sys.stderr)
                        e, gms = float("nan"), None
                    rec = dict(pattern=pattern, n=n, q=q, k=k, method=name, eager_ms=e, graph_ms=gms, exact=exact)
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
                del sets, keys, ref
                torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)

    # table: default kernel vs the torch baselines
    def get(p, n, q, m, col):
        for r in records:
            if (r["pattern"], r["n"], r["q"], r["method"]) == (p, n, q, m):
                return r[col]
        return None

    print(f"\n{dev}, torch {torch.__version__}, triton {triton.__version__}, k={k}; median ms (eager events | graph replay)")
    hdr = f"{'pattern':8} {'N':>6} {'Q':>5} | {'kernel':>15} | {'topk_packed':>15} | {'torch_ordered':>15} | {'topk_fp32':>15} | {'x packed':>8} {'x fp32':>7} exact"
    print(hdr)
    print("-" * len(hdr))
    fmt = lambda a, b: f"{a:7.4f}|{b:7.4f}" if b is not None else f"{a:7.4f}|   -   "
    for pattern in args.patterns.split(","):
        for n in ns:
            for q in qs:
                cells = [(get(pattern, n, q, m, "eager_ms"), get(pattern, n, q, m, "graph_ms"))
                         for m in ("kernel", "topk_packed", "torch_ordered", "topk_fp32")]
                ke = cells[0][0]
                print(f"{pattern:8} {n:6} {q:5} | " + " | ".join(fmt(a, b) for a, b in cells)
                      + f" | {cells[1][0] / ke:8.1f} {cells[3][0] / ke:7.1f} {get(pattern, n, q, 'kernel', 'exact')}")
    if args.sweep:
        print("\nsweep (ms, eager/graph):")
        names = sorted({r["method"] for r in records if r["method"].startswith("kernel")})
        for pattern in args.patterns.split(","):
            for n in ns:
                for q in qs:
                    row = [(m, get(pattern, n, q, m, "eager_ms"), get(pattern, n, q, m, "graph_ms")) for m in names]
                    row = [(m, v, g) for m, v, g in row if v is not None]
                    print(f"{pattern:8} {n:6} {q:5} " + " ".join(
                        f"{m.replace('kernel', 'k')}={v:.4f}/{g if g is None else round(g, 4)}" for m, v, g in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
