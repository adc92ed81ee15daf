"""The rewrite's output layout: what a graph output costs vs a value consumed in the graph.

    python bench/latent_layout.py [--world 2] [--rows 1024] [--hidden 2048] [--latent 1024] [--json PATH]

The rewritten site's value is the column-major view of the all-gather's rank-major
blocks.  Two graphs, latent gather on, gloo ranks (or NCCL with ``--backend nccl``):

* ``graph output``: the gathered latent is returned; Inductor restores the row-major
  strides eager code produced, with one transposing copy;
* ``consumed``: the latent feeds ``silu`` and a GEMM inside the graph; the consumer
  reads the column-major view in place.

Reported per graph: the output's strides and the median step time, next to the time of
the same transposing copy done eagerly (``[N, M] -> [M, N]`` contiguous).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _ranks(rank, world, rows, hidden, latent, iters, device):
    import torch.distributed as dist
    import torch.nn.functional as F
    import torch._inductor.config as ic
    from torch._inductor.utils import run_and_get_code

    import tpflare
    from tpflare.timing import median_ms

    ic.fx_graph_cache = False
    ks = hidden // world
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(latent, hidden, generator=g) / hidden ** 0.5).bfloat16().to(device)
    up = (torch.randn(latent, latent, generator=g) / latent ** 0.5).bfloat16().to(device)
    c = w[:, rank * ks:(rank + 1) * ks].contiguous()
    x = torch.randn(rows, hidden, generator=g).bfloat16().to(device)

    def graph_output(x, c):
        y = F.linear(x[..., rank * ks:(rank + 1) * ks], c)
        dist.all_reduce(y)
        return y

    def consumed(x, c, up):
        y = F.linear(x[..., rank * ks:(rank + 1) * ks], c)
        dist.all_reduce(y)
        return F.linear(F.silu(y), up)

    device = torch.device(device)
    out = {}
    with tpflare.config.patch(latent_gather=True):
        for name, fn, args in [("graph output", graph_output, (x, c)), ("consumed", consumed, (x, c, up))]:
            torch._dynamo.reset()
            tpflare.clear_report()
            cf = torch.compile(fn, backend="tpflare", fullgraph=True)
            y, _code = run_and_get_code(cf, *args)
            rewritten = [r["decision"] for r in tpflare.report() if r["kind"] == "latent_gather"]
            out[name] = dict(rewritten=rewritten, out_strides=list(y.stride()),
                             ms=median_ms(lambda: cf(*args), iters=iters, warmup=2, device=device))
    t = torch.empty(latent, rows, dtype=torch.bfloat16, device=device)
    out["eager transposing copy"] = dict(ms=median_ms(lambda: t.t().contiguous(), iters=iters, warmup=2,
                                                      device=device))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--latent", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from tpflare.testing import run_ranks

    t0 = time.perf_counter()
    device = "cuda" if args.backend == "nccl" else "cpu"
    res = run_ranks(_ranks, args.world, args=(args.rows, args.hidden, args.latent, args.iters, device),
                    backend=args.backend, timeout=600)
    print(f"latent layout: W={args.world} {args.backend} M={args.rows} K={args.hidden} N={args.latent} BF16, "
          f"torch {torch.__version__}, median of {args.iters}, slowest rank, {time.perf_counter() - t0:.0f} s")
    print("| graph | rewritten | output strides | ms |")
    print("| --- | --- | --- | --- |")
    for name in ("graph output", "consumed", "eager transposing copy"):
        r0 = res[0][name]
        ms = max(r[name]["ms"] for r in res)
        print(f"| {name} | {r0.get('rewritten', '-')} | {r0.get('out_strides', '-')} | {ms:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), torch=torch.__version__, ranks=res), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
