"""A serving-style loop with tpflare: compile once, prepare capacities, capture, replay.

    python examples/serve.py                          # W=1, one process (CUDA if present, else CPU)
    torchrun --nproc-per-node 2 examples/serve.py     # W=2 (NCCL, one GPU per rank; gloo on CPU)
    python examples/serve.py --json serve.json        # the figures, for tools

What a server does with tpflare, on one decoder layer (``tpflare.demo_model``:
sparse attention with an indexer whose candidates go through
``tpflare.select_topk``, then a LatentMoE block):

1. build this rank's share of the layer and register its row shard;
2. compile once: ``torch.compile(model, backend="tpflare", dynamic=False)``,
   latent gather on;
3. prepare every capacity (decode: 1 row, a speculative step: 8 rows, a prefill
   chunk): the first call of each shape is tpflare's preparation (the selection
   race, or a composition-cache hit; the latent-gather rewrite) and Inductor's
   kernel compile; a progress line marks each step;
4. on CUDA, capture each capacity in a ``torch.cuda.CUDAGraph`` over static input
   buffers (the race's trial tensors are gone by then); on CPU there is no
   capture and the same loop calls the compiled callable;
5. serve a stream of requests: pick the smallest capacity that holds the rows,
   copy the new rows and positions into its static buffers (spare rows padded),
   replay, read the rows back.  Every ``--check-every``-th step the replayed
   output is compared bit for bit with the uncaptured compiled call on the same
   buffers.

Printed per capacity: preparation (compile s, of which race), winner, latent
gather decision, capture s, median ms of an uncaptured compiled call and of a
replay, replays served, mismatches.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

import tpflare
from tpflare import observe
from tpflare.demo import DemoConfig, default_capacities, resolve_backend
from tpflare.demo_model import DecoderLayerTP
from tpflare.timing import median_ms

SIZES = {
    # the demo's layer (CPU-friendly)
    "demo": dict(),
    # tiny: the CPU test
    "tiny": dict(hidden=256, latent=128, expert_hidden=128, positions=64, heads=2, head_dim=32,
                 index_heads=2, index_dim=32, top_k=8),
    # closer to the seeds' widths (H=7168, L=3584), k=512 of 4096 positions
    "wide": dict(hidden=7168, latent=3584, experts=8, expert_hidden=1024, positions=4096, heads=8,
                 head_dim=64, index_heads=4, index_dim=64, top_k=512),
}


@dataclasses.dataclass
class Prepared:
    """One capacity, ready to serve: static buffers, the compiled callable's outputs, a graph."""

    name: str
    rows: int
    x: torch.Tensor
    pos: torch.Tensor
    out: torch.Tensor | None = None
    graph: Any = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def run(self, cm) -> torch.Tensor:
        """Serve the static buffers: replay the graph, or (no capture) call the compiled model."""
        if self.graph is not None:
            self.graph.replay()
            return self.out
        return cm(self.x, self.pos)


def capture(fn, warmup: int = 2):
    """``(torch.cuda.CUDAGraph, static output)`` of ``fn()``; warm-up calls on a side stream first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def prepare(cm, full, capacities, device, use_graphs: bool, iters: int) -> list[Prepared]:
    """Compile (tpflare preparation + Inductor) and capture every capacity, in order."""
    prepared = []
    for cap in capacities:
        p = Prepared(cap.name, cap.rows, full.inputs(cap.rows, seed=cap.rows).to(device),
                     torch.arange(cap.start, cap.start + cap.rows, device=device))
        tpflare.clear_report()
        with observe.step(f"prepare {cap.name} M={cap.rows}: compile (race or cache, latent gather, "
                          "Inductor kernels)") as prog:
            cm(p.x, p.pos)
        recs = tpflare.report()
        sel = next((r for r in recs if r["kind"] == "select"), {})
        p.info = dict(compile_s=prog["seconds"], race_s=sel.get("race_s", 0.0), winner=sel.get("composition"),
                      source=sel.get("source"), trials=sel.get("trials"),
                      timings={n: t.get("max_rank_ms") for n, t in sel.get("timings", {}).items()},
                      latent_gather=[{k: r.get(k) for k in ("site", "decision", "reason")} for r in recs
                                     if r["kind"] == "latent_gather" and r["decision"] in ("rewritten", "skipped")])
        p.info["compiled_call_ms"] = median_ms(lambda: cm(p.x, p.pos), 2, iters, device)
        if use_graphs:
            with observe.step(f"prepare {cap.name} M={cap.rows}: capture a CUDA graph") as prog:
                p.graph, p.out = capture(lambda: cm(p.x, p.pos))
            p.info["capture_s"] = prog["seconds"]
            p.info["replay_ms"] = median_ms(p.graph.replay, 2, iters, device)
        prepared.append(p)
    return prepared


def requests(capacities, steps: int, positions: int, seed: int = 0):
    """A request stream: ``(rows, first position, input seed)``; row counts up to each capacity."""
    g = torch.Generator().manual_seed(seed)
    sizes = sorted({c.rows for c in capacities} | {max(1, c.rows // 2 + 1) for c in capacities})
    for step in range(steps):
        rows = sizes[step % len(sizes)]
        start = int(torch.randint(0, positions - rows + 1, (1,), generator=g))
        yield rows, start, 1000 + step


def serve(cm, full, prepared: list[Prepared], steps: int, check_every: int) -> dict[str, dict[str, int]]:
    """Serve ``steps`` requests; per capacity: replays and bit mismatches against the uncaptured call."""
    counts = {p.name: {"served": 0, "checked": 0, "mismatches": 0} for p in prepared}
    positions = full.attention.positions
    for rows, start, seed in requests(prepared, steps, positions):
        p = next(c for c in sorted(prepared, key=lambda c: c.rows) if c.rows >= rows)
        p.x.zero_()
        p.x[:rows].copy_(full.inputs(rows, seed=seed))
        p.pos.fill_(start)
        p.pos[:rows].copy_(torch.arange(start, start + rows))
        if p.out is not None:
            p.out.fill_(float("nan"))        # a replay that writes nothing shows up
        got = p.run(cm)[:rows].clone()
        counts[p.name]["served"] += 1
        if counts[p.name]["served"] % check_every == 1 or check_every == 1:   # the first, then every N-th
            want = cm(p.x, p.pos)[:rows]
            counts[p.name]["checked"] += 1
            counts[p.name]["mismatches"] += int(not torch.equal(got.view(torch.int16), want.view(torch.int16)))
    return counts


def _init(backend: str) -> tuple[int, int, torch.device]:
    """Join torchrun's process group, or make a one-rank group."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        backend = resolve_backend(backend, world)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    else:
        backend = resolve_backend(backend, 1)
        if backend == "nccl":
            torch.cuda.set_device(0)
        fd, path = tempfile.mkstemp(prefix="tpflare_serve_pg_")
        os.close(fd)
        os.unlink(path)
        dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="demo", help="layer sizes (default: the demo's)")
    ap.add_argument("--prefill-rows", type=int, default=64, help="prefill chunk rows (default 64)")
    ap.add_argument("--steps", type=int, default=200, help="requests to serve (default 200)")
    ap.add_argument("--check-every", type=int, default=10, help="compare with the uncaptured call every N steps")
    ap.add_argument("--iters", type=int, default=20, help="timed calls / replays per capacity (default 20)")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    ap.add_argument("--no-graphs", action="store_true", help="no CUDA-graph capture (always on CPU)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON (rank 0)")
    args = ap.parse_args(argv)

    rank, world, device = _init(args.backend)
    if rank == 0:
        observe.print_progress()
    use_graphs = device.type == "cuda" and not args.no_graphs
    cfg = DemoConfig(**SIZES[args.size], capacities=default_capacities(args.prefill_rows))
    full = cfg.weights()
    model = DecoderLayerTP(full, rank, world).to(device)
    model.register_row_shards()
    tpflare.config.latent_gather = True
    t0 = time.perf_counter()
    with torch.no_grad():
        cm = torch.compile(model, backend="tpflare", dynamic=False, fullgraph=True)
        prepared = prepare(cm, full, cfg.capacities, device, use_graphs, args.iters)
        prep_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        counts = serve(cm, full, prepared, args.steps, args.check_every)
        if device.type == "cuda":
            torch.cuda.synchronize()
        serve_s = time.perf_counter() - t1
    result = dict(world=world, device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  torch=torch.__version__, size=args.size, graphs=use_graphs, prepare_s=prep_s, serve_s=serve_s,
                  steps=args.steps, capacities=[dict(name=p.name, rows=p.rows, **p.info, **counts[p.name])
                                                for p in prepared])
    if rank == 0:
        print(format_result(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2, default=str)
    bad = sum(c["mismatches"] for c in counts.values())
    dist.destroy_process_group()
    return 1 if bad else 0


def format_result(r: dict[str, Any]) -> str:
    mode = "CUDA-graph replay" if r["graphs"] else "compiled calls (no capture)"
    lines = [f"tpflare serving example: W={r['world']} on {r['device']}, torch {r['torch']}, sizes '{r['size']}', {mode}",
             f"prepared {len(r['capacities'])} capacities in {r['prepare_s']:.1f} s; served {r['steps']} requests "
             f"in {r['serve_s']:.2f} s",
             "| capacity | rows | compile s (of which race) | selection | latent gather | capture s "
             "| compiled call ms | replay ms | served | checked | mismatches |", "| --- " * 11 + "|"]
    for c in r["capacities"]:
        lg = ", ".join(f"{x['site']} {x['decision']}" for x in c["latent_gather"]) or "-"
        sel = f"{c['winner']} ({'cache hit, 0 trials' if c['source'] == 'cache' else c['source']})"
        cap_s = f"{c['capture_s']:.2f}" if "capture_s" in c else "-"
        replay = f"{c['replay_ms']:.3f}" if "replay_ms" in c else "-"
        lines.append(f"| {c['name']} | {c['rows']} | {c['compile_s']:.1f} ({c['race_s']:.2f}) | {sel} | {lg} "
                     f"| {cap_s} | {c['compiled_call_ms']:.3f} | {replay} | {c['served']} | {c['checked']} "
                     f"| {c['mismatches']} |")
    if any(not c["latent_gather"] for c in r["capacities"]):
        lines.append("latent gather '-': no site records; they come from the post-grad pass, which does not run "
                     "when Inductor serves the graph from its FX-graph cache")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
