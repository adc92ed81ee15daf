"""Candidate-selection compositions on CPU gloo: time per call and bytes moved per rank.

    python bench/bench_select_cpu.py --json select_cpu.json [--worlds 2 4] [--qs 1 8 64 256]

(``--backend nccl`` runs the same on CUDA, one GPU per rank, on a GPU machine.)

For each world size W and query count Q (C candidates per rank, k selected), every
composition runs ``--warmup`` untimed calls, then ``--iters`` timed calls, each
after a barrier.  A call's time is the slowest rank's; the table shows the median
over calls.  Bytes are computed analytically (what one rank receives, ring
algorithms for the all-reduce), not measured.  Every composition's ids are
checked against the replicated one's before timing.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

COMPOSITIONS = ("replicated", "owner/allgather", "owner/bf16")


def bytes_received_per_rank(comp: str, q: int, c: int, k: int, world: int) -> int:
    """Bytes one rank receives for one call (ids only, no scores)."""
    rows = -(-q // world)                     # padded owner block
    if comp == "replicated":                  # all-gather of (score bits, id) pairs
        return (world - 1) * q * c * 8
    a2a = (world - 1) * rows * c * 8          # candidate blocks from the other ranks
    if comp == "owner/allgather":             # int32 all-gather of padded owner blocks
        return a2a + (world - 1) * rows * k * 4
    # bf16: 4 bytes/id as 4 bf16 values = 8 bytes/id over all Q rows, ring all-reduce
    return a2a + 2 * (world - 1) * q * k * 8 // world


def _call(comp: str, s, i, k: int, g: str):
    import tpflare  # the ops take the kernel as an argument: TPFLARE_SELECT_KERNEL read here, as preparation does

    ops = torch.ops.tpflare
    kernel = tpflare.config.select_kernel
    if comp == "replicated":
        return ops.select_replicated(s, i, k, g, False, kernel)[0]
    return ops.select_owner(s, i, k, g, False, comp.split("/")[1], kernel)[0]


def _bench_rank(rank, world, qs, c, k, warmup, iters, backend="gloo", graph=False):
    import torch.distributed as dist

    import tpflare  # noqa: F401
    from tpflare.distributed import group_name_of

    g = group_name_of(None)
    cuda = backend == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {}
    for q in qs:
        gen = torch.Generator().manual_seed(1000 + q)
        s_all = torch.randn(world, q, c, generator=gen)
        i_all = torch.randperm(world * q * c, generator=gen).to(torch.int32).view(world, q, c)
        s, i = s_all[rank].to(dev).contiguous(), i_all[rank].to(dev).contiguous()
        ref = _call("replicated", s, i, k, g)
        for comp in COMPOSITIONS:
            if not torch.equal(_call(comp, s, i, k, g), ref):
                raise AssertionError(f"{comp} ids differ from replicated at Q={q}")
            for _ in range(warmup):
                _call(comp, s, i, k, g)
            step = lambda: _call(comp, s, i, k, g)  # noqa: E731
            if graph:                                # time CUDA-graph replays instead
                sync()
                cg = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cg):
                    _call(comp, s, i, k, g)
                step = cg.replay
                for _ in range(warmup):
                    step()
            times = []
            for _ in range(iters):
                sync()
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                step()
                sync()
                times.append(time.perf_counter() - t0)
            out[(q, comp)] = times
    return out


def run(worlds, qs, c, k, warmup, iters, timeout, backend="gloo", graph=False):
    from tpflare.testing import run_ranks

    rows = []
    for world in worlds:
        per_rank = run_ranks(_bench_rank, world, (tuple(qs), c, k, warmup, iters, backend, graph),
                             timeout=timeout, backend=backend)
        for q in qs:
            for comp in COMPOSITIONS:
                slowest = [max(r[(q, comp)][j] for r in per_rank) for j in range(iters)]
                rows.append(dict(world=world, q=q, c=c, k=k, composition=comp,
                                 median_ms=statistics.median(slowest) * 1e3,
                                 min_ms=min(slowest) * 1e3,
                                 bytes_per_rank=bytes_received_per_rank(comp, q, c, k, world)))
    return rows


def table(rows) -> str:
    lines = ["| W | Q | composition | median ms | min ms | KiB received / rank |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['world']} | {r['q']} | {r['composition']} | {r['median_ms']:.2f} | "
                     f"{r['min_ms']:.2f} | {r['bytes_per_rank'] / 1024:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the results here")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--qs", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--c", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="nccl: CUDA tensors, one GPU per rank (GPU machine)")
    p.add_argument("--graph", action="store_true",
                   help="with nccl: capture each composition in a CUDA graph and time replays")
    a = p.parse_args(argv)
    if a.graph and a.backend != "nccl":
        p.error("--graph needs --backend nccl")
    rows = run(a.worlds, a.qs, a.c, a.k, a.warmup, a.iters, a.timeout, a.backend, a.graph)
    print(table(rows))
    meta = dict(command=" ".join([sys.executable.rsplit("/", 1)[-1]] + sys.argv),
                torch=torch.__version__, machine=platform.machine(), python=platform.python_version(),
                cpus=__import__("os").cpu_count(), backend=a.backend, threads_per_rank=1,
                gpu=torch.cuda.get_device_name() if a.backend == "nccl" else None,
                cuda_graph=a.graph)
    with open(a.json, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
