"""Communication of the latent gather vs the down_reduce all-reduce it replaces.

    python bench/latent_comm.py [--worlds 2 4] [--backend gloo|nccl] [--rows 1024 3072]
                                [--site-rows 1024] [--json PATH]

Per world size W (``tpflare.testing.run_ranks``: one process per rank; gloo on
CPU, or NCCL with one GPU per rank timed with CUDA events), N=3584, BF16:

* ``all_reduce``: ``dist.all_reduce`` of ``[M, N]`` (today's down_reduce);
* ``column_gather``: ``torch.ops.tpflare.column_gather`` of ``[M, N/W]`` given as
  the transposed view of a contiguous ``[N/W, M]`` (what the rewrite's GEMM makes;
  no copy in, none out);
* ``functional_ag``: ``_c10d_functional.all_gather_into_tensor`` of ``[N/W, M]`` +
  ``wait_tensor`` (what the rewrite emits);
* ``gather_layout_copy``: rank-major all-gather of ``[M, N/W]`` + the layout copy
  to ``[M, N]`` (the copy the rewrite avoids; priced for reference).

Then the whole site at K=7168: the original (K-slice GEMM ``[M, K/W] x [K/W, N]``
+ all-reduce) vs the rewritten one (row-shard GEMM ``[N/W, K] x [K, M]`` + gather).

Every timing: warm-up, a barrier before each timed run, the per-rank median,
then the max over ranks (a collective is as slow as its slowest rank).  The
ideal traffic ratio gather/all-reduce is ((W-1)/W * N) / (2 (W-1)/W * N) = 0.5
bytes per row (a ring all-reduce is a reduce-scatter plus an all-gather).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

BF16 = torch.bfloat16


def rank_fn(rank: int, world: int, cfg: dict) -> dict:
    import torch.distributed as dist
    import torch.nn.functional as F

    import tpflare  # noqa: F401  registers torch.ops.tpflare.*
    from tpflare.timing import median_ms
    from tpflare.distributed import group_name_of
    from tpflare.ops.gather import column_gather_reference_layout

    c10d = torch.ops._c10d_functional
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    gname = group_name_of(None)
    n, k = cfg["n"], cfg["k"]
    ns, ks = n // world, k // world
    g = torch.Generator().manual_seed(100 + rank)

    def timed(fn, warmup, iters, before=None):
        return median_ms(fn, warmup, iters, device, before)
    out: dict = {"comm": [], "site": []}
    for m in cfg["rows"]:
        src = torch.randn(m, n, generator=g).to(BF16).to(device)
        buf = torch.empty_like(src)
        block_t = torch.randn(ns, m, generator=g).to(BF16).to(device)   # [N/W, M] contiguous
        block = block_t.t()                                              # [M, N/W] view
        block_c = block.contiguous()
        # correctness of what is timed: rank r's block lands at columns r*N/W
        got = torch.ops.tpflare.column_gather(block, world, gname)
        mine = torch.equal(got[:, rank * ns:(rank + 1) * ns].cpu(), block.cpu())
        fag = c10d.wait_tensor(c10d.all_gather_into_tensor(block_t, world, gname))
        same = torch.equal(fag.t().cpu(), got.cpu())
        w, it = cfg["warmup"], cfg["iters"]
        t = dict(
            M=m, N=n, W=world, check_block=mine, check_functional_equals_op=same,
            all_reduce=timed(lambda: dist.all_reduce(buf), w, it, before=lambda: buf.copy_(src)),
            column_gather=timed(lambda: torch.ops.tpflare.column_gather(block, world, gname), w, it),
            functional_ag=timed(
                lambda: c10d.wait_tensor(c10d.all_gather_into_tensor(block_t, world, gname)), w, it),
            gather_layout_copy=timed(lambda: column_gather_reference_layout(block_c, world, gname), w, it),
        )
        out["comm"].append(t)
    for m in cfg["site_rows"]:
        full_w = torch.randn(n, k, generator=torch.Generator().manual_seed(7)).div_(k ** 0.5).to(BF16)
        w_col = full_w[:, rank * ks:(rank + 1) * ks].contiguous().to(device)
        w_rows = full_w[rank * ns:(rank + 1) * ns].contiguous().to(device)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(8)).to(BF16).to(device)

        def original():
            y = F.linear(x[:, rank * ks:(rank + 1) * ks], w_col)
            dist.all_reduce(y)
            return y

        def rewritten():
            yt = torch.mm(w_rows, x.t())                                    # [N/W, M], full K
            return c10d.wait_tensor(c10d.all_gather_into_tensor(yt, world, gname)).t()

        w, it = cfg["site_warmup"], cfg["site_iters"]
        out["site"].append(dict(M=m, N=n, K=k, W=world, original=timed(original, w, it),
                                rewritten=timed(rewritten, w, it),
                                gemm_kslice=timed(lambda: F.linear(x[:, rank * ks:(rank + 1) * ks], w_col), w, it),
                                gemm_rows=timed(lambda: torch.mm(w_rows, x.t()), w, it)))
    out["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return out


def _max_over_ranks(per_rank: list[dict], section: str) -> list[dict]:
    rows = []
    for i, first in enumerate(per_rank[0][section]):
        row = {}
        for key, v in first.items():
            vals = [r[section][i][key] for r in per_rank]
            if isinstance(v, bool):
                row[key] = all(vals)
            elif isinstance(v, float):
                row[key] = max(vals)
                row[key + "_per_rank"] = vals
            else:
                row[key] = v
        rows.append(row)
    return rows


def format_tables(results: list[dict]) -> str:
    lines = ["| backend | W | M | all_reduce [M,N] ms | column_gather [M,N/W] ms | functional AG ms "
             "| gather+layout copy ms | column_gather / all_reduce | functional / all_reduce | ideal | check |",
             "| --- " * 11 + "|"]
    for res in results:
        for r in res["comm"]:
            lines.append(
                f"| {res['backend']} | {r['W']} | {r['M']} | {r['all_reduce']:.3f} | {r['column_gather']:.3f} "
                f"| {r['functional_ag']:.3f} | {r['gather_layout_copy']:.3f} "
                f"| {r['column_gather'] / r['all_reduce']:.2f} | {r['functional_ag'] / r['all_reduce']:.2f} | 0.50 "
                f"| {'ok' if r['check_block'] and r['check_functional_equals_op'] else 'FAIL'} |")
    site = [s for res in results for s in res["site"]]
    if site:
        lines += ["", "| backend | W | M | K | original: K-slice GEMM + all-reduce ms | rewritten: row GEMM + gather ms "
                  "| rewritten / original | K-slice GEMM ms | row-shard GEMM ms |", "| --- " * 9 + "|"]
        for res in results:
            for s in res["site"]:
                lines.append(f"| {res['backend']} | {s['W']} | {s['M']} | {s['K']} | {s['original']:.2f} "
                             f"| {s['rewritten']:.2f} | {s['rewritten'] / s['original']:.2f} "
                             f"| {s['gemm_kslice']:.2f} | {s['gemm_rows']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=None, help="default: 2 4 (gloo); every GPU count (nccl)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--rows", type=int, nargs="+", default=[1024, 3072])
    p.add_argument("--n", type=int, default=3584)
    p.add_argument("--k", type=int, default=7168)
    p.add_argument("--site-rows", type=int, nargs="*", default=None,
                   help="M for the whole-site timing (default: 1024 on gloo, the --rows on nccl; none: skip)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--site-iters", type=int, default=None, help="default 3 (gloo), --iters (nccl)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from tpflare.testing import run_ranks

    nccl = args.backend == "nccl"
    if nccl:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < 2:
            raise SystemExit(f"--backend nccl needs >= 2 CUDA devices (found {gpus})")
        worlds = args.worlds or [w for w in (2, 4, 8) if w <= gpus]
        if max(worlds) > gpus:
            raise SystemExit(f"W={max(worlds)} needs {max(worlds)} GPUs (found {gpus}): one GPU per rank")
    else:
        worlds = args.worlds or [2, 4]
    site_rows = args.site_rows if args.site_rows is not None else (args.rows if nccl else [1024])
    cfg = dict(rows=args.rows, n=args.n, k=args.k, site_rows=site_rows, warmup=args.warmup, iters=args.iters,
               site_warmup=1 if not nccl else args.warmup,
               site_iters=args.site_iters or (args.iters if nccl else 3))
    results = []
    t0 = time.perf_counter()
    for world in worlds:
        if args.n % world or args.k % world:
            raise SystemExit(f"N={args.n} and K={args.k} must divide by W={world}")
        per_rank = run_ranks(rank_fn, world, args=(cfg,), backend=args.backend, timeout=args.timeout)
        results.append(dict(backend=args.backend, W=world, device=per_rank[0]["device"],
                            comm=_max_over_ranks(per_rank, "comm"), site=_max_over_ranks(per_rank, "site")))
    elapsed = time.perf_counter() - t0
    print(f"latent comm: N={args.n} BF16, {args.backend}, median of {args.iters} (site: {cfg['site_iters']}) "
          f"per rank, max over ranks; torch {torch.__version__}; {elapsed:.0f} s")
    print(format_tables(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, args=vars(args), cfg=cfg, seconds=elapsed, results=results),
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
