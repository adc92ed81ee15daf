"""``python -m tpflare demo``: the latent gather on a small LatentMoE layer, W ranks.

Every rank builds ``tpflare.demo_model.LatentMoETP`` from the same seeded full
weights, registers its ``latent_down_rows`` row shard, and compiles the layer
with ``torch.compile(model, backend="tpflare", dynamic=False)`` twice: latent
gather off, then on (``torch._dynamo.reset()`` between), each for a prefill
batch (>= ``TPFLARE_LATENT_GATHER_MIN_ROWS`` rows: rewritten) and a decode batch
(4 rows: kept by the rows gate).  Rank 0's rewrite report is printed, then
everything measured on the prefill batch, nothing assumed:

* numerics of the latent (down projection + all-reduce vs the rewritten gather)
  and of the layer output against a float64 reference on the same inputs:
  relative RMS error per path and their ratio, and the share of latent values
  that are not the correctly rounded float64 value;
* cross-rank identity: every rank's output bits are all-gathered and compared;
* median time per forward (per rank; the slowest rank is shown).

Inductor's FX-graph cache is switched off in the demo's ranks: on a cache hit
the post-grad pass does not run, so nothing would be reported.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Sequence

import torch

from tpflare.timing import median_ms

BF16 = torch.bfloat16


# --- numerics helpers (shared with bench/latent_numerics.py) -------------------------------------
def correctly_rounded_bf16(ref: torch.Tensor) -> torch.Tensor:
    """float64 -> BF16 with one round-to-nearest-even (``.to(bfloat16)`` goes through float32)."""
    m, e = torch.frexp(ref.double())                 # ref = m * 2**e, |m| in [0.5, 1)
    q = torch.round(m * 256.0) / 256.0               # 8 significant bits; round half to even
    return torch.ldexp(q, e.double()).to(BF16)       # exact: representable in BF16


def rel_rms(y: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((y.double().cpu() - ref).norm() / ref.norm()).item()


def not_correctly_rounded(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of BF16 outputs that differ from the correctly rounded float64 reference."""
    want = correctly_rounded_bf16(ref).view(torch.int16)
    return (y.cpu().contiguous().view(torch.int16) != want).double().mean().item()


# --- the demo's core --------------------------------------------------------------------------------
@dataclasses.dataclass
class DemoConfig:
    hidden: int = 1024
    latent: int = 512
    experts: int = 4
    expert_hidden: int = 512
    prefill_rows: int = 64
    decode_rows: int = 4
    iters: int = 10
    warmup: int = 2
    seed: int = 0
    decode_both_paths: bool = True   # False: compile/time decode only with the gather on


def _bits_identical_across_ranks(t: torch.Tensor) -> bool:
    import torch.distributed as dist

    bits = t.contiguous().view(torch.int16).to(torch.int32)
    everyone = [torch.empty_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, bits)
    return all(torch.equal(everyone[0], o) for o in everyone)


def core(rank: int, world: int, cfg: DemoConfig) -> dict[str, Any]:
    """One rank of the demo (run under ``tpflare.testing.run_ranks``)."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.distributed as dist

    import tpflare
    from tpflare.demo_model import LatentMoETP, LatentMoEWeights

    inductor_config.fx_graph_cache = False   # a cache hit skips the pass (and its report)
    try:
        import torch._functorch.config as functorch_config

        functorch_config.enable_autograd_cache = False
    except (ImportError, AttributeError):
        pass
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    full = LatentMoEWeights.create(cfg.hidden, cfg.latent, cfg.experts, cfg.expert_hidden, seed=cfg.seed)
    x_pre = full.inputs(cfg.prefill_rows, seed=cfg.seed + 1).to(device)
    x_dec = full.inputs(cfg.decode_rows, seed=cfg.seed + 2).to(device)

    model = LatentMoETP(full, rank, world).to(device)
    model.register_row_shards()
    res: dict[str, Any] = dict(rank=rank, device=str(device), paths={})
    for path, on in (("reduce", False), ("gather", True)):
        # Dynamo's guards do not cover tpflare's knobs: without a reset the second
        # torch.compile would silently reuse the first path's graphs.
        torch._dynamo.reset()
        tpflare.clear_report()
        with tpflare.config.patch(latent_gather=on), torch.no_grad():
            cm = torch.compile(model, backend="tpflare", dynamic=False, fullgraph=True)
            t0 = time.perf_counter()
            out, lat, experts = cm(x_pre, with_latent=True)
            out_dec = cm(x_dec) if on or cfg.decode_both_paths else None
            compile_s = time.perf_counter() - t0
            n_compiled = len(tpflare.report())
            pre_ms = median_ms(lambda: cm(x_pre, with_latent=True), cfg.warmup, cfg.iters, device)
            dec_ms = (median_ms(lambda: cm(x_dec), cfg.warmup, cfg.iters, device)
                      if on or cfg.decode_both_paths else float("nan"))
        recs = [{k: v for k, v in r.items() if k != "time"} for r in tpflare.report()]
        res["paths"][path] = dict(
            records=recs[:n_compiled], recompiled_while_timing=len(recs) - n_compiled,
            compile_s=compile_s, prefill_ms=pre_ms, decode_ms=dec_ms,
            latent_identical=_bits_identical_across_ranks(lat),
            out_identical=_bits_identical_across_ranks(out),
            decode_identical=None if out_dec is None else _bits_identical_across_ranks(out_dec),
            latent=lat.cpu(), out=out.cpu(), experts=experts.cpu(),
            decode_out=None if out_dec is None else out_dec.cpu())
    ref_out, ref_lat, ref_experts = full.reference(x_pre.cpu())
    ref_dec = full.reference(x_dec.cpu())[0]
    for p in res["paths"].values():
        p["latent_rel_rms"] = rel_rms(p["latent"], ref_lat)
        p["latent_not_correctly_rounded"] = not_correctly_rounded(p["latent"], ref_lat)
        p["out_rel_rms"] = rel_rms(p["out"], ref_out)
        # rows whose expert pair differs from float64's (near-tie router logits)
        p["routing_flips"] = int((p["experts"].sort(-1).values != ref_experts.sort(-1).values).any(-1).sum())
        # the output against float64 with this path's expert choice: no routing flips
        p["out_rel_rms_same_routing"] = rel_rms(p["out"], full.reference(x_pre.cpu(), p["experts"])[0])
        p["decode_rel_rms"] = None if p["decode_out"] is None else rel_rms(p["decode_out"], ref_dec)
    paths = res["paths"]
    res["latent_bitwise_equal_between_paths"] = torch.equal(
        paths["gather"]["latent"].view(torch.int16), paths["reduce"]["latent"].view(torch.int16))
    for p in paths.values():  # no tensors through run_ranks' queue (fd sharing races the exit)
        for k in ("latent", "out", "experts", "decode_out"):
            p.pop(k)
    return res


def summarize(results: list[dict[str, Any]], cfg: DemoConfig, world: int, backend: str) -> dict[str, Any]:
    """Aggregate the ranks' results (JSON-able; tensors dropped)."""
    r0 = results[0]
    paths = {}
    for name in ("reduce", "gather"):
        p0 = r0["paths"][name]
        paths[name] = dict(
            latent_rel_rms=p0["latent_rel_rms"], latent_not_correctly_rounded=p0["latent_not_correctly_rounded"],
            out_rel_rms=p0["out_rel_rms"], out_rel_rms_same_routing=p0["out_rel_rms_same_routing"],
            routing_flips=p0["routing_flips"], decode_rel_rms=p0["decode_rel_rms"],
            latent_identical_across_ranks=all(r["paths"][name]["latent_identical"] for r in results),
            out_identical_across_ranks=all(r["paths"][name]["out_identical"] for r in results),
            decode_identical_across_ranks=all(r["paths"][name]["decode_identical"] is not False for r in results),
            prefill_ms_per_rank=[r["paths"][name]["prefill_ms"] for r in results],
            decode_ms_per_rank=[r["paths"][name]["decode_ms"] for r in results],
            prefill_ms=max(r["paths"][name]["prefill_ms"] for r in results),
            decode_ms=max(r["paths"][name]["decode_ms"] for r in results),  # nan if not timed
            compile_s=max(r["paths"][name]["compile_s"] for r in results),
            records=p0["records"])
    g, r = paths["gather"], paths["reduce"]
    same_latent = all(res["latent_bitwise_equal_between_paths"] for res in results)
    recompiled = max(p["recompiled_while_timing"] for res in results for p in res["paths"].values())
    return dict(world=world, backend=backend, device=r0["device"], config=dataclasses.asdict(cfg),
                torch=torch.__version__, paths=paths,
                latent_ratio_gather_reduce=g["latent_rel_rms"] / r["latent_rel_rms"],
                latent_bitwise_equal_between_paths=same_latent, recompiled_while_timing=recompiled)


def run_demo(world: int = 2, backend: str = "auto", cfg: DemoConfig | None = None,
             timeout: float = 600.0) -> dict[str, Any]:
    """Run the demo's core on ``world`` ranks and return ``summarize``'s dict."""
    from tpflare.testing import run_ranks

    cfg = cfg or DemoConfig()
    backend = resolve_backend(backend, world)
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    results = run_ranks(core, world, args=(cfg,), backend=backend, timeout=timeout, env=env)
    return summarize(results, cfg, world, backend)


def resolve_backend(backend: str, world: int) -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < world):
        raise SystemExit(f"--backend nccl needs {world} CUDA devices, found "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    return backend


# --- printing ----------------------------------------------------------------------------------------
def _site_lines(records: list[dict[str, Any]], label: str) -> list[str]:
    from tpflare.reporting import format_record

    lines = [f"  {label}:"]
    lines += [f"    {format_record(r)}" for r in records if r["kind"] == "latent_gather"] or ["    (no sites)"]
    return lines


def format_summary(s: dict[str, Any]) -> str:
    cfg = s["config"]
    g, r = s["paths"]["gather"], s["paths"]["reduce"]
    yn = {True: "yes", False: "NO"}
    out = [f"tpflare demo: LatentMoE layer H={cfg['hidden']} L={cfg['latent']} E={cfg['experts']} "
           f"F={cfg['expert_hidden']} BF16, W={s['world']} ({s['backend']}, {s['device']}), "
           f"prefill M={cfg['prefill_rows']}, decode M={cfg['decode_rows']}, torch {s['torch']}",
           "", "rewrite report (rank 0; each compile = prefill graph g*, then decode graph):"]
    out += _site_lines(r["records"], "latent gather off")
    out += _site_lines(g["records"], "latent gather on")
    out += ["", f"numerics on the prefill batch vs float64 (same BF16 inputs, {cfg['prefill_rows']}x{cfg['latent']} latent values):",
            "| path | latent rel RMS | latent not correctly rounded | output rel RMS (float64 routing) "
            "| routing flips | output rel RMS (same routing) | latent bits same on all ranks "
            "| output bits same on all ranks |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in (("down_reduce (off)", r), ("latent gather (on)", g)):
        out.append(f"| {name} | {p['latent_rel_rms']:.3e} | {100 * p['latent_not_correctly_rounded']:.3f} % "
                   f"| {p['out_rel_rms']:.3e} | {p['routing_flips']}/{cfg['prefill_rows']} rows "
                   f"| {p['out_rel_rms_same_routing']:.3e} | {yn[p['latent_identical_across_ranks']]} "
                   f"| {yn[p['out_identical_across_ranks']]} |")
    ratio = s["latent_ratio_gather_reduce"]
    out.append(f"latent error ratio gather/reduce: {ratio:.3f} (target <= 0.75: "
               f"{'met' if ratio <= 0.75 else 'NOT met'}); latent bitwise equal between paths: "
               f"{yn[s['latent_bitwise_equal_between_paths']].lower()} (not expected: the rewrite changes bits)")
    out += ["", f"median time per forward (ms, slowest rank; per-rank medians of {cfg['iters']} runs):",
            "| batch | latent gather off | latent gather on | on/off |", "| --- | --- | --- | --- |"]
    for batch in ("prefill", "decode"):
        a, b = r[f"{batch}_ms"], g[f"{batch}_ms"]
        rows = cfg[f"{batch}_rows"]
        note = " (kept: same graph both ways)" if batch == "decode" else ""
        out.append(f"| {batch} M={rows}{note} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
    if s["recompiled_while_timing"]:
        out.append(f"WARNING: {s['recompiled_while_timing']} site(s) recompiled while timing")
    out.append(f"compile time (prefill + decode graphs, slowest rank): off {r['compile_s']:.1f} s, "
               f"on {g['compile_s']:.1f} s")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tpflare demo", description="latent gather on a small LatentMoE layer")
    p.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--rows", type=int, default=DemoConfig.prefill_rows, help="prefill rows (default 64)")
    p.add_argument("--decode-rows", type=int, default=DemoConfig.decode_rows, help="decode rows (default 4)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto = NCCL, one GPU per rank, when CUDA has >= world devices; else gloo on CPU")
    p.add_argument("--iters", type=int, default=DemoConfig.iters, help="timed forwards per batch (default 10)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the summary as JSON")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are killed")
    args = p.parse_args(list(argv) if argv is not None else None)
    cfg = DemoConfig(prefill_rows=args.rows, decode_rows=args.decode_rows, iters=args.iters)
    if cfg.hidden % args.world or cfg.latent % (64 * args.world):
        raise SystemExit(f"--world {args.world}: H={cfg.hidden} and L={cfg.latent} need H % W == 0 and L % (64*W) == 0")
    t0 = time.perf_counter()
    s = run_demo(args.world, args.backend, cfg, timeout=args.timeout)
    s["wall_s"] = time.perf_counter() - t0
    print(format_summary(s))
    print(f"\ntotal {s['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
