"""CUDA-graph replay stress: a compiled tpflare site captured once, replayed thousands of times.

One process per GPU (NCCL, NCCL_NVLS_ENABLE=0), any W:

    python bench/replay_stress.py --world 1 --replays 2000 --rows 1024 3072 --json out.json

Per configuration: compile (backend="tpflare", latent gather on, selection
bound by the race), capture the compiled callable in a ``torch.cuda.CUDAGraph``
over static input buffers, then for every replay: write a *new* input into the
static buffers, poison the static outputs (NaN / id 0x7fffffff), replay, and
compare bit for bit with the same compiled callable run uncaptured on the same
input (and with an eager reference within tolerance).  Outputs are also
compared across ranks.  Prints the mismatch counts; JSON with ``--json``.

At W=1 the latent-gather site is a group of size 1 and keeps its all-reduce
(nothing to gather); W >= 2 exercises the rewrite.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def _site_fns(rank, world, k_hidden, n_latent, q, c, topk):
    import torch.distributed as dist
    import torch.nn.functional as F

    import tpflare

    ks = k_hidden // world

    def model(x, w_col, scores, ids):
        y = F.linear(x[..., rank * ks:(rank + 1) * ks], w_col)
        dist.all_reduce(y)
        sel_ids, sel_scores = tpflare.select_topk(scores, ids, topk, with_scores=True)
        return y, sel_ids, sel_scores

    return model


def _worker(rank, world, rows_list, replays, k_hidden, n_latent, q, c, topk):
    import torch._dynamo

    import tpflare
    from tpflare import race

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dev = torch.device("cuda", torch.cuda.current_device())
    tpflare.config.latent_gather = True
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(n_latent, k_hidden, generator=g) / k_hidden ** 0.5).to(torch.bfloat16)
    ks = k_hidden // world
    w_col = w[:, rank * ks:(rank + 1) * ks].contiguous().to(dev)
    model = _site_fns(rank, world, k_hidden, n_latent, q, c, topk)
    results = []
    for rows in rows_list:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="tpflare", fullgraph=True, dynamic=False)
        static_x = torch.randn(rows, k_hidden, generator=g).to(torch.bfloat16).to(dev)
        s0, i0 = race.make_candidates(q, c, rank, world, 1, "holdout", dev)
        static_s, static_i = s0.clone(), i0.clone()
        for _ in range(3):                                   # compile + warm up outside capture
            compiled(static_x, w_col, static_s, static_i)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = compiled(static_x, w_col, static_s, static_i)
        mism = {"latent": 0, "ids": 0, "scores": 0, "eager_tol": 0, "cross_rank": 0}
        gx = torch.Generator(device=dev).manual_seed(1000)       # inputs made on the GPU (fast)
        for step in range(replays):
            static_x.copy_(torch.randn(rows, k_hidden, generator=gx, device=dev).to(torch.bfloat16))
            s, i = race.make_candidates(q, c, rank, world, 2000 + step, "holdout" if step % 2 else "ties", dev)
            static_s.copy_(s)
            static_i.copy_(i)
            outs[0].fill_(float("nan"))
            outs[1].fill_(0x7FFFFFFF)
            outs[2].fill_(float("nan"))
            graph.replay()
            ref = compiled(static_x, w_col, static_s, static_i)  # same compiled code, uncaptured
            mism["latent"] += int(not torch.equal(outs[0], ref[0]))
            mism["ids"] += int(not torch.equal(outs[1], ref[1]))
            mism["scores"] += int(not torch.equal(outs[2].view(torch.int32), ref[2].view(torch.int32)))
            if step % 100 == 0:
                eager = model(static_x, w_col, static_s, static_i)
                mism["eager_tol"] += int(not (torch.allclose(outs[0].float(), eager[0].float(), atol=2e-2, rtol=2e-2)
                                              and torch.equal(outs[1], eager[1])))
                if world > 1:
                    import torch.distributed as dist

                    bits = outs[0].contiguous().view(torch.int16).to(torch.int32)
                    allb = [torch.empty_like(bits) for _ in range(world)]
                    dist.all_gather(allb, bits)
                    mism["cross_rank"] += int(not all(torch.equal(allb[0], b) for b in allb))
        torch.cuda.synchronize()
        del graph
        results.append(dict(rows=rows, replays=replays, mismatches=mism,
                            report=[(r["kind"], r["decision"], r.get("composition"), r.get("reason"))
                                    for r in tpflare.report()]))
        tpflare.clear_report()
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 3072])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--latent", type=int, default=3584)
    ap.add_argument("--q", type=int, default=8)
    ap.add_argument("--c", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.device_count() < a.world:
        print(f"needs {a.world} CUDA devices", file=sys.stderr)
        return 2
    from tpflare.testing import run_ranks

    res = run_ranks(_worker, a.world, args=(a.rows, a.replays, a.hidden, a.latent, a.q, a.c, a.k),
                    backend="nccl", timeout=3000, env={"NCCL_NVLS_ENABLE": "0"})
    for rank, per_rank in enumerate(res):
        for r in per_rank:
            print(f"rank {rank} rows {r['rows']}: {r['replays']} replays, mismatches {r['mismatches']}")
    print("report (rank 0):", res[0][0]["report"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    bad = sum(sum(r["mismatches"].values()) for per in res for r in per)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
