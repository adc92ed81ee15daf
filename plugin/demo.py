"""``python -m tpflare demo``: both halves of tpflare on one decoder layer, W ranks.

The layer (``tpflare.demo_model.DecoderLayerTP``): a DeepSeek-V3.2-style sparse
attention block (each rank scores every query row against its shard of the KV
positions, keeps its top-C (score, id) candidates; ``tpflare.select_topk``
picks the global top-k; attention runs over the selected positions), then a
LatentMoE block (down_reduce, experts, expert_reduce).  One process per rank
(gloo on CPU, NCCL with one GPU per rank), the same seeded weights everywhere.

**Start 1** (new processes, a fresh composition cache directory):

1. an Inductor warm-up compile of a tiny function, timed and shown apart (the
   first compile in a process pays Inductor's own start-up);
2. the served model, ``torch.compile(model, backend="tpflare")`` with the latent
   gather on, compiled per capacity (decode: 1 row, a speculative step: 8 rows,
   a prefill chunk): each compile races the selection compositions for its
   ``Q`` (every composition's time is its slowest rank's median; holdout inputs
   validate exact ids), binds the winner, and rewrites (or skips, with the
   reason) each down_reduce;
3. per capacity: numerics of the whole layer against a float64 reference, the
   selected ids against a plain-Python ordering of every rank's candidates, bit
   identity across ranks, median time per forward;
4. where a capacity's graph rewrote a site, the same capacity compiled with the
   latent gather off (and the same composition, forced): numerics, time and
   compile time beside the served path (both compiles warm).

**Start 2**: new processes on the same cache directory: every capacity is
compiled again and must be served by the composition cache (``cache hit``,
``0 trials``, the same winners, the same output bits).

Inductor's FX-graph cache is switched off in the ranks, so each start's compile
times measure the whole compile (site records are produced on a cache hit too).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
import time
from typing import Any, Sequence

import torch

from tpflare.timing import median_ms

BF16 = torch.bfloat16


# --- numerics helpers (shared with bench/latent_numerics.py) -------------------------------------
_SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11}


def correctly_rounded(ref: torch.Tensor, dtype: torch.dtype = BF16) -> torch.Tensor:
    """float64 -> ``dtype`` with one round-to-nearest-even (``.to(bfloat16)`` goes through
    float32, so it may round twice).  BF16 / FP16 in their normal range; FP32 by a direct cast."""
    if dtype == torch.float32:
        return ref.double().to(torch.float32)       # a double -> float cast rounds once
    scale = float(2 ** _SIGNIFICAND_BITS[dtype])
    m, e = torch.frexp(ref.double())                 # ref = m * 2**e, |m| in [0.5, 1)
    q = torch.round(m * scale) / scale               # the dtype's significant bits; half to even
    return torch.ldexp(q, e.double()).to(dtype)      # exact: representable in dtype


def rel_rms(y: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((y.double().cpu() - ref).norm() / ref.norm()).item()


def not_correctly_rounded(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of BF16 outputs that differ from the correctly rounded float64 reference."""
    want = correctly_rounded(ref, BF16).view(torch.int16)
    return (y.cpu().contiguous().view(torch.int16) != want).double().mean().item()


def python_top_k(scores: list[float], ids: list[int], k: int) -> list[int]:
    """The Order rule in plain Python: valid before invalid, score descending (+0.0 above
    -0.0, NaN below -inf), lower id first; padded with -1."""
    def key(pair):
        s, i = pair
        if i < 0:
            return (1, 0, 0.0, 0, 0)
        if math.isnan(s):
            return (0, 1, 0.0, 0, i)
        return (0, 0, -s, 1 if math.copysign(1.0, s) < 0 else 0, i)

    top = sorted(zip(scores, ids), key=key)[:k]
    return [i if i >= 0 else -1 for _, i in top] + [-1] * (k - len(top))


# --- configuration -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Capacity:
    """One compiled batch shape a server captures: ``rows`` query rows at positions
    ``start .. start + rows - 1``."""

    name: str
    rows: int
    start: int

    def label(self) -> str:
        return f"{self.name} M={self.rows}"


def default_capacities(prefill_rows: int = 64, spec_rows: int = 8, position: int = 300) -> list[Capacity]:
    return [Capacity("decode", 1, position), Capacity("speculative", spec_rows, position),
            Capacity("prefill", prefill_rows, 0)]


@dataclasses.dataclass
class DemoConfig:
    hidden: int = 1024
    latent: int = 512
    experts: int = 4
    expert_hidden: int = 512
    positions: int = 512
    heads: int = 4
    head_dim: int = 64
    index_heads: int = 4
    index_dim: int = 64
    top_k: int = 32
    capacities: list[Capacity] = dataclasses.field(default_factory=default_capacities)
    iters: int = 10
    warmup: int = 2
    seed: int = 0
    knobs: dict[str, Any] = dataclasses.field(default_factory=dict)   # tpflare.config overrides
    compare_off: bool = True          # compile the latent gather off where the served graph rewrote
    return_selection: bool = False    # tests: every rank's candidates and selected ids in the result

    def weights(self):
        from tpflare.demo_model import DecoderWeights

        return DecoderWeights.create(self.hidden, self.latent, self.experts, self.expert_hidden,
                                     self.positions, self.heads, self.head_dim, self.index_heads,
                                     self.index_dim, self.top_k, seed=self.seed)


# --- one rank -------------------------------------------------------------------------------------
def _gather_objects(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _bits_identical_across_ranks(t: torch.Tensor) -> bool:
    everyone = _gather_objects(_digest(t))
    return len(set(everyone)) == 1


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _selection_exact(cand_scores: torch.Tensor, cand_ids: torch.Tensor, selected: torch.Tensor, k: int):
    """Selected ids vs ``python_top_k`` of every rank's candidates (all-gathered)."""
    parts = _gather_objects((cand_scores.cpu().tolist(), cand_ids.cpu().tolist()))
    rows = selected.cpu().tolist()
    for m, got in enumerate(rows):
        scores = [s for p in parts for s in p[0][m]]
        ids = [i for p in parts for i in p[1][m]]
        if python_top_k(scores, ids, k) != got:
            return False, parts
    return True, parts


def _warm_up_inductor() -> float:
    """Compile and run a tiny function with Inductor; seconds (the process's first compile)."""
    t0 = time.perf_counter()
    f = torch.compile(lambda a, b: torch.nn.functional.silu(a @ b).sum(-1), backend="inductor", fullgraph=True)
    f(torch.randn(8, 16, dtype=BF16), torch.randn(16, 8, dtype=BF16))
    return time.perf_counter() - t0


def _forced_knobs(composition: str) -> dict[str, str]:
    """The knobs that force ``composition`` (no race)."""
    if composition == "replicated":
        return {"select": "replicated"}
    return {"select": "owner", "select_id_replication": composition.split("/", 1)[1]}


def _run_capacity(cm, full, cap: Capacity, cfg: DemoConfig, device) -> dict[str, Any]:
    """Compile (first call), check and time one capacity of one compiled model."""
    import tpflare
    from tpflare import observe, race

    x = full.inputs(cap.rows, seed=cfg.seed + 1 + cap.rows).to(device)
    pos = torch.arange(cap.start, cap.start + cap.rows, device=device)
    tpflare.clear_report()
    stats0 = dict(race.stats)
    with torch.no_grad():
        with observe.step(f"compile {cap.label()} (Dynamo, tpflare preparation, Inductor)") as prog:
            outs = cm(x, pos, internals=True)
        n_records = len(tpflare.report())
        ms = median_ms(lambda: cm(x, pos, internals=True), cfg.warmup, cfg.iters, device)
    records = [{k: v for k, v in r.items() if k != "time"} for r in tpflare.report()[:n_records]]
    out, h, lat, experts, cand_scores, cand_ids, selected = (t.cpu() for t in outs)
    exact, parts = _selection_exact(cand_scores, cand_ids, selected, full.attention.top_k)
    x_cpu, pos_cpu = x.cpu(), pos.cpu()
    ref_out, _, _, ref_sel = full.reference(x_cpu, pos_cpu)                       # float64's own choices
    same_sel = full.reference(x_cpu, pos_cpu, selected=selected)                  # this path's selection
    same_both = full.reference(x_cpu, pos_cpu, selected=selected, experts=experts)
    ref_lat = full.moe.reference(h, experts)[1]     # the latent from this path's BF16 MoE input
    res = dict(
        capacity=dataclasses.asdict(cap), compile_s=prog["seconds"], forward_ms=ms, records=records,
        recompiled_while_timing=len(tpflare.report()) - n_records,
        race_stats={k: race.stats[k] - stats0[k] for k in race.stats},
        selection_exact=exact,
        selection_flips=int((selected.long().sort(-1).values != ref_sel.sort(-1).values).any(-1).sum()),
        routing_flips=int((experts.sort(-1).values != same_sel[2].sort(-1).values).any(-1).sum()),
        out_rel_rms=rel_rms(out, ref_out), out_rel_rms_same_choices=rel_rms(out, same_both[0]),
        latent_rel_rms=rel_rms(lat, ref_lat), latent_not_correctly_rounded=not_correctly_rounded(lat, ref_lat),
        out_identical=_bits_identical_across_ranks(out), selected_identical=_bits_identical_across_ranks(selected),
        latent_identical=_bits_identical_across_ranks(lat), out_digest=_digest(out), latent_digest=_digest(lat))
    if cfg.return_selection:
        res["selection"] = dict(candidates=parts, selected=selected.tolist(), positions=pos_cpu.tolist())
    return res


def _select_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The capacity's selection decision (one selection site per layer)."""
    return next((r for r in records if r["kind"] == "select"), None)


def _winner(records: list[dict[str, Any]]) -> str | None:
    rec = _select_record(records)
    return rec["composition"] if rec else None


def _rewrote(records: list[dict[str, Any]]) -> bool:
    return any(r["kind"] == "latent_gather" and r["decision"] == "rewritten" for r in records)


def core(rank: int, world: int, cfg: DemoConfig, start: int) -> dict[str, Any]:
    """One rank of one start of the demo (run under ``tpflare.testing.run_ranks``)."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.distributed as dist

    import tpflare
    from tpflare import observe
    from tpflare.demo_model import DecoderLayerTP

    inductor_config.fx_graph_cache = False   # a cache hit skips the pass (and its report)
    try:
        import torch._functorch.config as functorch_config

        functorch_config.enable_autograd_cache = False
    except (ImportError, AttributeError):
        pass
    if rank == 0:
        observe.print_progress(prefix=f"  start {start} ")
    for name, value in cfg.knobs.items():
        setattr(tpflare.config, name, value)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    res: dict[str, Any] = dict(rank=rank, device=str(device), start=start)
    with observe.step("Inductor warm-up (a tiny function: the process's first compile)") as prog:
        _warm_up_inductor()
    res["warmup_s"] = prog["seconds"]
    full = cfg.weights()
    model = DecoderLayerTP(full, rank, world).to(device)
    model.register_row_shards()

    torch._dynamo.reset()
    with tpflare.config.patch(latent_gather=True):
        cm = torch.compile(model, backend="tpflare", dynamic=False, fullgraph=True)
        res["served"] = [_run_capacity(cm, full, cap, cfg, device) for cap in cfg.capacities]
    res["off"] = {}
    if cfg.compare_off:
        for cap, served in zip(cfg.capacities, res["served"]):
            if not all(_gather_objects(_rewrote(served["records"]))):
                continue    # nothing rewritten: the off graph is the served graph
            torch._dynamo.reset()   # tpflare's knobs are not Dynamo guards
            with tpflare.config.patch(latent_gather=False, **_forced_knobs(_winner(served["records"]))):
                cm = torch.compile(model, backend="tpflare", dynamic=False, fullgraph=True)
                res["off"][cap.name] = _run_capacity(cm, full, cap, cfg, device)
    return res


# --- both starts --------------------------------------------------------------------------------------
def run_demo(world: int = 2, backend: str = "auto", cfg: DemoConfig | None = None, timeout: float = 600.0,
             cache_dir: str | None = None, second_start: bool = True,
             fresh_inductor_cache: bool = True) -> dict[str, Any]:
    """Start 1 (and start 2, new processes, same cache directory); returns ``summarize``'s dict.

    ``fresh_inductor_cache``: each start gets an empty Inductor cache directory, so that compile
    times compare like with like (False: Inductor's usual one; faster, for tests)."""
    from tpflare.testing import run_ranks

    cfg = cfg or DemoConfig()
    backend = resolve_backend(backend, world)
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="tpflare_demo_cache_")
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "TPFLARE_CACHE_DIR": cache_dir}
    starts = []
    for start in (1, 2) if second_start else (1,):
        if fresh_inductor_cache:   # each start compiles its kernels from scratch: like with like
            env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"tpflare_demo_inductor_{start}_")
        print(f"start {start}: {world} new processes ({backend}), composition cache {cache_dir}",
              file=sys.stderr, flush=True)
        start_cfg = cfg if start == 1 else dataclasses.replace(cfg, compare_off=False)
        starts.append(run_ranks(core, world, args=(start_cfg, start), backend=backend, timeout=timeout, env=env))
    return dict(summarize(starts, cfg, world, backend, cache_dir), fresh_inductor_cache=fresh_inductor_cache)


def resolve_backend(backend: str, world: int) -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < world):
        raise SystemExit(f"--backend nccl needs {world} CUDA devices, found "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    return backend


def _capacity_summary(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One capacity of one path, over the ranks (rank 0's records and numerics)."""
    r0 = per_rank[0]
    return dict(
        capacity=r0["capacity"], winner=_winner(r0["records"]),
        winners_per_rank=[_winner(r["records"]) for r in per_rank],
        select=_select_record(r0["records"]),
        latent_gather=[{k: r.get(k) for k in ("site", "decision", "reason")} for r in r0["records"]
                       if r["kind"] == "latent_gather" and r["decision"] in ("rewritten", "skipped")],
        trials=max(r["race_stats"]["trials"] for r in per_rank),
        races=max(r["race_stats"]["races"] for r in per_rank),
        cache_hits=min(r["race_stats"]["cache_hits"] for r in per_rank),
        forward_ms=max(r["forward_ms"] for r in per_rank),
        forward_ms_per_rank=[r["forward_ms"] for r in per_rank],
        compile_s=max(r["compile_s"] for r in per_rank),
        race_s=max((_select_record(r["records"]) or {}).get("race_s", 0.0) for r in per_rank),
        selection_exact_every_rank=all(r["selection_exact"] for r in per_rank),
        identical_across_ranks=all(r["out_identical"] and r["selected_identical"] and r["latent_identical"]
                                   for r in per_rank),
        recompiled_while_timing=max(r["recompiled_while_timing"] for r in per_rank),
        out_digest=r0["out_digest"], latent_digest=r0["latent_digest"],
        **{k: r0[k] for k in ("selection_flips", "routing_flips", "out_rel_rms", "out_rel_rms_same_choices",
                              "latent_rel_rms", "latent_not_correctly_rounded")},
        **({"selection_per_rank": [r["selection"] for r in per_rank]} if "selection" in r0 else {}))


def summarize(starts: list[list[dict[str, Any]]], cfg: DemoConfig, world: int, backend: str,
              cache_dir: str) -> dict[str, Any]:
    """Aggregate every start's ranks (JSON-able)."""
    out = dict(world=world, backend=backend, device=starts[0][0]["device"], torch=torch.__version__,
               config=dataclasses.asdict(cfg), cache_dir=cache_dir, starts=[])
    for ranks in starts:
        served = [_capacity_summary([r["served"][i] for r in ranks]) for i in range(len(cfg.capacities))]
        off = {name: _capacity_summary([r["off"][name] for r in ranks]) for name in ranks[0]["off"]}
        out["starts"].append(dict(start=ranks[0]["start"], warmup_s=max(r["warmup_s"] for r in ranks),
                                  served=served, off=off))
    first = out["starts"][0]["served"]
    if len(out["starts"]) > 1:
        second = out["starts"][1]["served"]
        out["second_start"] = dict(
            all_cache_hits=all(s["cache_hits"] == 1 and s["trials"] == 0 and s["races"] == 0 for s in second),
            same_winners=[a["winner"] for a in first] == [b["winner"] for b in second],
            same_output_bits=all(a["out_digest"] == b["out_digest"] for a, b in zip(first, second)))
    return out


# --- printing ----------------------------------------------------------------------------------------
_YN = {True: "yes", False: "NO"}


def _race_table(served: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for s in served:
        for n in (s["select"] or {}).get("timings", {}):
            if n not in names:
                names.append(n)
    lines = ["| capacity | Q | " + " | ".join(names) + " | holdout validation | winner | source | trials | race s |",
             "| --- " * (len(names) + 7) + "|"]
    for s in served:
        sel = s["select"] or {}
        cells = []
        for n in names:
            t = sel.get("timings", {}).get(n, {})
            cells.append("rejected" if t.get("max_rank_ms") is None else f"{t['max_rank_ms']:.3f}")
        val = sel.get("validation", {})
        failed = {n: v for n, v in val.items() if v.get("failed_ranks")}
        held = next((v.get("holdouts") for v in val.values()), "?")
        vtxt = (f"{held} holdouts, all passed" if not failed else
                "; ".join(f"{n} failed on ranks {v['failed_ranks']}" for n, v in failed.items()))
        source = "cache hit" if sel.get("source") == "cache" else sel.get("source", "-")
        lines.append(f"| {s['capacity']['name']} | {s['capacity']['rows']} | " + " | ".join(cells)
                     + f" | {vtxt} | {s['winner']} | {source} | {s['trials']} trials | {s['race_s']:.2f} |")
    return lines


def format_summary(s: dict[str, Any]) -> str:
    cfg = s["config"]
    caps = cfg["capacities"]
    st1 = s["starts"][0]
    served, off = st1["served"], st1["off"]
    per_rank = cfg["positions"] // s["world"]
    out = [f"tpflare demo: one decoder layer, W={s['world']} ({s['backend']}, {s['device']}), torch {s['torch']}",
           f"  sparse attention: T={cfg['positions']} KV positions ({per_rank} per rank, round-robin), "
           f"{cfg['heads']} heads x {cfg['head_dim']}; indexer {cfg['index_heads']} heads x {cfg['index_dim']}; "
           f"each rank keeps C={cfg['top_k']} candidates, tpflare.select_topk picks k={cfg['top_k']}",
           f"  LatentMoE: H={cfg['hidden']} L={cfg['latent']} E={cfg['experts']} F={cfg['expert_hidden']}, BF16",
           "  capacities: " + ", ".join(f"{c['name']} M={c['rows']} (positions {c['start']}.."
                                        f"{c['start'] + c['rows'] - 1})" for c in caps),
           f"  composition cache: {s['cache_dir']}", "",
           f"start 1 (new processes): Inductor warm-up {st1['warmup_s']:.1f} s (a tiny function, the first "
           "compile in each process; shown apart, not in any figure below)", "",
           "selection race per capacity (time per composition = slowest rank's median, ms; "
           f"{'eager calls' if s['backend'] == 'gloo' else 'CUDA-graph replays where capture works'}):"]
    out += _race_table(served)
    out += ["", "latent gather decisions (rank 0; every rank decides the same):",
            "| capacity | site | decision | reason |", "| --- | --- | --- | --- |"]
    for sv in served:
        for r in sv["latent_gather"] or [{"site": "-", "decision": "(no sites)", "reason": ""}]:
            out.append(f"| {sv['capacity']['name']} | {r['site']} | {r['decision']} | {r.get('reason') or ''} |")
    out += ["", "numerics of the whole layer vs float64 (same BF16 weights and inputs):",
            "| capacity | path | selected ids = plain-Python order of all candidates (every rank) "
            "| rows selecting other positions than float64 | output rel RMS | output rel RMS, float64 with "
            "this path's selection+routing | latent rel RMS | latent not correctly rounded "
            "| bits same on all ranks |", "| --- " * 9 + "|"]
    rows = [(sv, "latent gather on") for sv in served]
    rows += [(o, "latent gather off") for o in off.values()]
    rows.sort(key=lambda t: [c["name"] for c in caps].index(t[0]["capacity"]["name"]))
    for p, label in rows:
        out.append(f"| {p['capacity']['name']} | {label} | {_YN[p['selection_exact_every_rank']]} "
                   f"| {p['selection_flips']}/{p['capacity']['rows']} | {p['out_rel_rms']:.3e} "
                   f"| {p['out_rel_rms_same_choices']:.3e} | {p['latent_rel_rms']:.3e} "
                   f"| {100 * p['latent_not_correctly_rounded']:.2f} % | {_YN[p['identical_across_ranks']]} |")
    out += ["", f"time per forward (ms, slowest rank's median of {cfg['iters']}):",
            "| capacity | latent gather on | off | on/off |", "| --- | --- | --- | --- |"]
    for sv in served:
        o = off.get(sv["capacity"]["name"])
        offs = (f"{o['forward_ms']:.3f} | {sv['forward_ms'] / o['forward_ms']:.2f}" if o else
                "same graph (nothing rewritten) | -")
        out.append(f"| {sv['capacity']['name']} M={sv['capacity']['rows']} | {sv['forward_ms']:.3f} | {offs} |")
    warn = [p for p, _ in rows if p["recompiled_while_timing"]]
    if warn:
        out.append(f"WARNING: recompiled while timing in {', '.join(p['capacity']['name'] for p in warn)}")
    if len(s["starts"]) > 1:
        st2 = s["starts"][1]
        out += ["", f"start 2 (new processes, same composition cache): Inductor warm-up {st2['warmup_s']:.1f} s",
                "| capacity | composition cache | trials | winner | same winner as start 1 "
                "| output bits same as start 1 | compile s, start 1 (of which race) | compile s, start 2 |",
                "| --- " * 8 + "|"]
        for a, b in zip(served, st2["served"]):
            hit = "cache hit" if b["cache_hits"] == 1 and b["races"] == 0 else "MISS (raced)"
            out.append(f"| {b['capacity']['name']} | {hit} | {b['trials']} trials | {b['winner']} "
                       f"| {_YN[a['winner'] == b['winner']]} | {_YN[a['out_digest'] == b['out_digest']]} "
                       f"| {a['compile_s']:.1f} ({a['race_s']:.2f}) | {b['compile_s']:.1f} |")
        out.append("compile times: served model, slowest rank, after the warm-up; " + (
            "each start with its own empty Inductor cache directory (like with like: they differ by the race "
            "vs the cache hit)" if s.get("fresh_inductor_cache") else
            "start 2 may reuse kernels start 1 left in Inductor's cache directory (not like with like)"))
    out += ["", "summary:"] + _summary_lines(s)
    return "\n".join(out)


def _summary_lines(s: dict[str, Any]) -> list[str]:
    st1 = s["starts"][0]
    served, off = st1["served"], st1["off"]
    sites = [(sv["capacity"]["name"], r) for sv in served for r in sv["latent_gather"]]
    rewritten = [f"{name} {r['site']}" for name, r in sites if r["decision"] == "rewritten"]
    lines = [f"  latent gather rewrote {len(rewritten)} of {len(sites)} all-reduce sites: "
             + (", ".join(rewritten) or "none") + "; the others kept their all-reduce (reasons above)",
             "  selection winners: " + ", ".join(f"{sv['capacity']['name']} {sv['winner']}" for sv in served)]
    if "second_start" in s:
        ss = s["second_start"]
        lines.append("  second start: " + ("cache hit, 0 trials at every capacity" if ss["all_cache_hits"]
                                            else "NOT every capacity was a cache hit")
                     + f"; same winners: {_YN[ss['same_winners']]}; same output bits: {_YN[ss['same_output_bits']]}")
    exact = all(p["selection_exact_every_rank"] for p in served + list(off.values()))
    same = all(p["identical_across_ranks"] for p in served + list(off.values()))
    lines.append(f"  exactness: selected ids exact on every rank at every capacity: {_YN[exact]}; "
                 f"outputs, latents and ids bit-identical across ranks: {_YN[same]}")
    for name, o in off.items():
        sv = next(p for p in served if p["capacity"]["name"] == name)
        ratio = sv["latent_rel_rms"] / o["latent_rel_rms"]
        lines.append(f"  {name}: latent rel RMS gather {sv['latent_rel_rms']:.3e} vs reduce {o['latent_rel_rms']:.3e} "
                     f"(ratio {ratio:.2f}, target <= 0.75: {'met' if ratio <= 0.75 else 'NOT met'}); not correctly "
                     f"rounded {100 * sv['latent_not_correctly_rounded']:.2f} % vs "
                     f"{100 * o['latent_not_correctly_rounded']:.2f} %; time per forward on/off "
                     f"{sv['forward_ms'] / o['forward_ms']:.2f} ({s['backend']} on {s['device']}: says nothing about GPUs)"
                     if s["backend"] == "gloo" else
                     f"  {name}: latent rel RMS gather/reduce {ratio:.2f}; time per forward on/off "
                     f"{sv['forward_ms'] / o['forward_ms']:.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tpflare demo", description="sparse attention + LatentMoE layer: the "
                                "selection race, the composition cache and the latent gather")
    p.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--rows", type=int, default=64, help="prefill chunk rows (default 64)")
    p.add_argument("--spec-rows", type=int, default=8, help="speculative step rows (default 8)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto = NCCL, one GPU per rank, when CUDA has >= world devices; else gloo on CPU")
    p.add_argument("--iters", type=int, default=DemoConfig.iters, help="timed forwards per capacity (default 10)")
    p.add_argument("--cache-dir", default=None, help="composition cache directory (default: a fresh temporary one)")
    p.add_argument("--no-second-start", action="store_true", help="skip the second start")
    p.add_argument("--json", default=None, metavar="FILE", help="write the summary as JSON")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before one start's ranks are killed")
    args = p.parse_args(list(argv) if argv is not None else None)
    cfg = DemoConfig(capacities=default_capacities(args.rows, args.spec_rows), iters=args.iters)
    if cfg.hidden % args.world or cfg.latent % (64 * args.world) or cfg.positions // args.world < cfg.top_k:
        raise SystemExit(f"--world {args.world}: needs H={cfg.hidden} % W == 0, L={cfg.latent} % (64*W) == 0 "
                         f"and T/W >= k ({cfg.positions}/W >= {cfg.top_k})")
    t0 = time.perf_counter()
    s = run_demo(args.world, args.backend, cfg, timeout=args.timeout, cache_dir=args.cache_dir,
                 second_start=not args.no_second_start)
    s["wall_s"] = time.perf_counter() - t0
    print(format_summary(s))
    print(f"\ntotal {s['wall_s']:.1f} s; inspect the cache: python -m tpflare cache list --dir {s['cache_dir']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
