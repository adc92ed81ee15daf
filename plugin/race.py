"""The compile-time composition race for candidate selection.

For one selection site (static ``Q``, ``C``, ``k``, group), on every rank of the
group in lockstep:

1. build the cache key (shapes, dtypes, k, world, group layout, device, versions,
   decision knobs, the source identity of every composition's code and the child
   plans raced); look it up; **agree** on hit/miss: only if every rank hit the
   same entry is the race skipped, otherwise every rank races;
2. race: private seeded trial inputs (ties at the cutoff, padding, -inf), each
   complete composition (packing, transport, selection, replication together)
   warmed up, then timed with a barrier before every timed run; per-rank median;
   a composition's time is its slowest rank's median (all-gathered, so every
   rank computes the same winner).  On CUDA (``TPFLARE_RACE_TIMING``) the timed
   run is a replay of a CUDA graph of the composition, as serving runs it; if
   capture fails on any rank, every rank times that composition eagerly;
3. holdout inputs (never timed; NaN, -inf, mass ties, all-padding rows) check
   every composition's ids (and score bits) against an independent reference
   (a stable lexicographic sort); a composition failing on any rank is rejected;
4. winner = fastest valid; a challenger must beat the default (replicated) by
   more than ``TPFLARE_RACE_NEAR_TIE`` or the default wins; trial tensors are
   released; the entry is written to the composition cache.

Every step that can diverge goes through ``tpflare.distributed.agree`` (a
private gloo group with ``TPFLARE_PREP_TIMEOUT``): no rank decides alone.

A race logs a start and a done line on ``tpflare.progress`` (``tpflare.observe.step``);
its record (``tpflare.report()``, trace artifact ``tpflare_race``) carries every
composition's timings and holdout validation, ``trials`` (0 on a cache hit) and ``race_s``.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import logging
from typing import Any, Callable, Sequence

import torch

from . import observe, reporting
from .config import Settings
from .distributed import agree, group_rank, group_ranks, group_size, resolve_group
from .timing import capture_graph, median_ms, release_graph

log = logging.getLogger("tpflare.race")

DEFAULT = "replicated"

# counters a user (or a test) can read: how much racing this process did
stats = {"races": 0, "trials": 0, "cache_hits": 0}


@dataclasses.dataclass(frozen=True)
class Composition:
    """One complete composition: name, child plan, and how to run it."""

    name: str                                   # "replicated" | "owner/allgather" | "owner/bf16"
    op: str                                     # the op the binding puts in the graph
    extra_args: tuple = ()                      # appended after the model-facing op's args
    code: tuple[Any, ...] = ()                  # objects whose source identifies its code
    impl: Callable[..., Any] | None = None       # run this instead of the op (tests, experiments)

    def run(self, scores, ids, k: int, group_name: str, with_scores: bool):
        fn = self.impl or getattr(torch.ops.tpflare, self.op)
        return fn(scores, ids, k, group_name, with_scores, *self.extra_args)


def compositions(settings: Settings, kernel: str = "torch") -> list[Composition]:
    """The compositions a race considers under the current knobs.

    ``kernel``: the ordered-selection kernel they run (``resolve_kernel`` of the site), an op
    argument of each, so the race times what the bound graph will run."""
    from tpflare.cache.identity import selection_code

    code = selection_code()
    plans = ["allgather", "bf16"] if settings.select_id_replication == "auto" else [settings.select_id_replication]
    out = [Composition(DEFAULT, "select_replicated", (kernel,), code)]
    out += [Composition(f"owner/{p}", "select_owner", (p, kernel), code) for p in plans]
    return out


def site_kernel(settings: Settings, c: int, k: int, group_name: str, device: torch.device) -> str:
    """The ordered-selection kernel of a site (``TPFLARE_SELECT_KERNEL`` resolved for its rows of
    ``W * C`` candidates on ``device``), decided once at preparation."""
    from tpflare.ops.ordering import resolve_kernel

    return resolve_kernel(settings.select_kernel, device, group_size(group_name) * c, k)


def forced(settings: Settings, kernel: str = "torch") -> Composition | None:
    """The composition a knob forces (no race), or None for ``select=auto``."""
    if settings.select == "auto":
        return None
    comps = {c.name: c for c in compositions(settings, kernel)}
    if settings.select == "replicated":
        return comps[DEFAULT]
    plan = "allgather" if settings.select_id_replication == "auto" else settings.select_id_replication
    return comps[f"owner/{plan}"]


@dataclasses.dataclass
class Decision:
    composition: Composition
    source: str                                 # "forced" | "cache" | "race"
    key: str | None = None
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)
    validation: dict[str, Any] = dataclasses.field(default_factory=dict)
    why: str = ""


# --- trial and holdout inputs -----------------------------------------------------------
def make_candidates(q: int, c: int, rank: int, world: int, seed: int, pattern: str,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s candidates of a seeded input; every rank can rebuild every rank's.

    Ids are distinct global KV ids (rank-interleaved); scores are quantised so
    many exact ties straddle the top-k cutoff.  Patterns add -inf, NaN, +-0.0,
    padding rows and fewer-than-k valid candidates.
    """
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    levels = {"trial": 64, "ties": 4}.get(pattern, 16)
    scores = torch.randint(-levels, levels, (q, c), generator=g).to(torch.float32) / 8
    ids = (torch.randperm(c * 4, generator=g)[:c] * world + rank).to(torch.int32).repeat(q, 1)
    ids = ids[:, torch.randperm(c, generator=g)].contiguous()
    if pattern in ("holdout", "ties"):
        u = torch.rand(q, c, generator=g)
        scores[u < 0.05] = float("-inf")
        scores[(u >= 0.05) & (u < 0.08)] = float("nan")
        scores[(u >= 0.08) & (u < 0.10)] = -0.0
        ids[u > 0.93] = -1                                   # padding
        if q > 1:
            ids[q // 2] = -1                                 # an all-padding row
            scores[q - 1, c // 3:] = float("-inf")
    return scores.to(device), ids.to(device)


def reference_select(scores: torch.Tensor, ids: torch.Tensor, k: int):
    """Independent reference: stable lexicographic sort by (valid, score desc, id asc).

    Scores compare under IEEE totalOrder (``-0.0`` below ``+0.0``) with every NaN
    below ``-inf``: the fp32 bits mapped to a monotone int64, not a float compare.
    """
    scores, ids = scores.cpu(), ids.cpu()
    bits = scores.view(torch.int32).to(torch.int64)
    total = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF) - 1)   # monotone in totalOrder
    nan = torch.isnan(scores)
    order = torch.argsort(ids.to(torch.int64), dim=1, stable=True)            # id ascending
    for key in (-total,                                                        # score descending
                nan.to(torch.int8),                                            # NaN below -inf
                (ids < 0).to(torch.int8)):                                     # valid first
        col = key.gather(1, order)
        order = order.gather(1, torch.argsort(col, dim=1, stable=True))
    top = order[:, :k]
    out_ids = ids.gather(1, top)
    out_scores = scores.gather(1, top)
    pad = out_ids < 0
    return out_ids.masked_fill(pad, -1), out_scores.masked_fill(pad, float("-inf"))


def expected_selection(q: int, c: int, k: int, world: int, seed: int, pattern: str):
    """``reference_select`` of the whole site: every rank's ``make_candidates`` share (CPU),
    concatenated along the candidates. What every rank's composition output must equal."""
    parts = [make_candidates(q, c, r, world, seed, pattern, torch.device("cpu")) for r in range(world)]
    return reference_select(torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1), k)


def same_selection(ids: torch.Tensor, scores: torch.Tensor, exp_ids: torch.Tensor, exp_scores: torch.Tensor) -> bool:
    """Ids equal and score bits equal (so NaN payloads and signed zeros count)."""
    return torch.equal(ids.cpu(), exp_ids.cpu()) and torch.equal(
        scores.cpu().view(torch.int32), exp_scores.cpu().view(torch.int32))


def run_race(q: int, c: int, k: int, group_name: str, with_scores: bool, device: torch.device,
             comps: Sequence[Composition], settings: Settings) -> tuple[str, dict, dict, str]:
    """Race ``comps`` on every rank; returns (winner name, timings, validation, why)."""
    world, rank = group_size(group_name), group_rank(group_name)
    ranks = group_ranks(group_name)
    group = resolve_group(group_name)
    stats["races"] += 1

    # holdout validation (never timed): exact ids and score bits on every rank
    failures: dict[str, list[str]] = {cm.name: [] for cm in comps}
    for h in range(settings.race_holdout):
        pattern = "ties" if h % 2 else "holdout"
        s, i = make_candidates(q, c, rank, world, 100 + h, pattern, device)
        exp_ids, exp_scores = expected_selection(q, c, k, world, 100 + h, pattern)
        for cm in comps:
            try:
                got_ids, got_scores = cm.run(s, i, k, group_name, True)
                if not same_selection(got_ids, got_scores, exp_ids, exp_scores):
                    failures[cm.name].append(f"holdout {h} ({pattern}): ids or score bits differ")
            except Exception as e:  # a composition that raises is rejected, not fatal
                failures[cm.name].append(f"holdout {h}: {type(e).__name__}: {e}")
            got_ids = got_scores = None
    everyone = agree("race validation", {n: len(f) for n, f in failures.items()}, ranks=ranks,
                     timeout_s=settings.prep_timeout)
    valid = {cm.name: all(e[cm.name] == 0 for e in everyone) for cm in comps}
    validation = {cm.name: {"holdouts": settings.race_holdout,
                            "failed_ranks": [r for r, e in zip(ranks, everyone) if e[cm.name]],
                            "first_failure": (failures[cm.name][:1] or [None])[0]} for cm in comps}

    # timing (only valid compositions), same order on every rank
    s, i = make_candidates(q, c, rank, world, 7, "trial", device)
    method = timing_method(settings, device)
    medians: dict[str, float] = {}
    how: dict[str, dict[str, str]] = {}
    for cm in comps:
        if not valid[cm.name]:
            continue
        call = functools.partial(cm.run, s, i, k, group_name, with_scores)
        medians[cm.name], how[cm.name] = _time_trial(cm.name, call, method, device, group, ranks, settings)
        stats["trials"] += settings.race_warmup + settings.race_iters
    all_medians = agree("race timings", medians, ranks=ranks, timeout_s=settings.prep_timeout)
    timings = {n: {"max_rank_ms": max(m[n] for m in all_medians),
                   "per_rank_median_ms": [round(m[n], 4) for m in all_medians], **how[n]}
               for n in medians}
    for cm in comps:
        if not valid[cm.name]:
            timings[cm.name] = {"max_rank_ms": None, "rejected": validation[cm.name]["first_failure"]
                                or f"failed on ranks {validation[cm.name]['failed_ranks']}"}
    ok = [n for n in medians]
    if not ok:
        from .errors import NoValidComposition

        raise NoValidComposition(f"tpflare race: no composition passed holdout validation: {validation}")
    best = min(ok, key=lambda n: (timings[n]["max_rank_ms"], n))
    why = (f"fastest valid ({timings[best]['max_rank_ms']:.4f} ms, slowest rank's median, "
           f"{timings[best]['timing']} timing)")
    if best != DEFAULT and DEFAULT in ok:
        base = timings[DEFAULT]["max_rank_ms"]
        if timings[best]["max_rank_ms"] > base * (1 - settings.race_near_tie):
            why = (f"{best} within TPFLARE_RACE_NEAR_TIE={settings.race_near_tie} of the default "
                   f"({timings[best]['max_rank_ms']:.4f} vs {base:.4f} ms, slowest rank's medians, "
                   f"{timings[DEFAULT]['timing']} timing): default kept")
            best = DEFAULT
    return best, timings, validation, why


def timing_method(settings: Settings, device: torch.device) -> str:
    """How the race times trials: "graph" (CUDA-graph replays) or "eager" (``TPFLARE_RACE_TIMING``)."""
    if settings.race_timing == "auto":
        return "graph" if device.type == "cuda" else "eager"
    return settings.race_timing


def _capture(call: Callable[[], Any], device: torch.device, warmup: int):
    """A CUDA graph of ``call``; raises where there can be none."""
    if device.type != "cuda":
        raise RuntimeError(f"CUDA-graph timing needs a CUDA device, the race runs on {device.type}")
    with torch.cuda.device(device):
        return capture_graph(call, warmup)


def _time_trial(name: str, call: Callable[[], Any], method: str, device: torch.device, group: Any,
                ranks: Sequence[int], settings: Settings) -> tuple[float, dict[str, str]]:
    """This rank's median ms of ``call`` and how it was timed ({"timing": "graph" | "eager", ...}).

    With ``method="graph"`` every rank captures (same order on every rank), then all agree
    on whether every capture worked: a rank whose capture failed still enters every
    collective the others enter, and if any failed, every rank times ``call`` eagerly and
    records why.  The graph and its memory pool are freed before this returns.
    """
    graph, how = None, {"timing": "eager"}
    if method == "graph":
        try:
            graph, failure = _capture(call, device, settings.race_warmup), None
        except Exception as e:  # shared below: every rank falls back together
            failure = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        everyone = agree(f"race graph capture of {name}", failure, ranks=ranks, timeout_s=settings.prep_timeout)
        failed = "; ".join(f"rank {r}: {f}" for r, f in zip(ranks, everyone) if f)
        if failed:
            if graph is not None:
                release_graph(graph, device)
                graph = None
            how["graph_fallback"] = f"capture failed on {failed}"
            log.warning("tpflare race: %s timed with eager calls: %s", name, how["graph_fallback"])
        else:
            how["timing"] = "graph"
    try:
        ms = median_ms(graph.replay if graph is not None else call, settings.race_warmup,
                       settings.race_iters, device, group=group)
    finally:
        if graph is not None:
            release_graph(graph, device)
    return ms, how


def _allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


# --- the decision, cache included ------------------------------------------------------------
def _site_key(q, c, k, group_name, with_scores, device, comps, settings):
    from tpflare.cache.identity import code_identity, site_key_fields

    return site_key_fields(
        op="tpflare.select", shapes={"scores": [q, c], "ids": [q, c]},
        dtypes={"scores": "float32", "ids": "int32", "with_scores": bool(with_scores)}, k=k,
        world=group_size(group_name), group_ranks=group_ranks(group_name),
        knobs=settings.decision_dict(),
        compositions={cm.name: code_identity(*cm.code) for cm in comps},
        child_plans={cm.name: list(cm.extra_args) for cm in comps},
        device=device if device.type == "cuda" else None)


def decide(q: int, c: int, k: int, group_name: str, with_scores: bool, device: torch.device,
           settings: Settings, *, site: str = "", comps: Sequence[Composition] | None = None) -> Decision:
    """The composition every rank binds for this site (collective on the site's group)."""
    from tpflare.cache.store import CompositionCache, make_key, new_entry

    kernel = site_kernel(settings, c, k, group_name, device)
    pinned = forced(settings, kernel)
    if pinned is not None:
        d = Decision(pinned, "forced", why=f"TPFLARE_SELECT={settings.select}")
        reporting.record("select", "bound", site=site, composition=pinned.name, source="forced",
                         reason=d.why, Q=q, C=c, k=k, kernel=kernel)
        return d
    comps = list(comps) if comps is not None else compositions(settings, kernel)
    by_name = {cm.name: cm for cm in comps}
    ranks = group_ranks(group_name)
    fields = _site_key(q, c, k, group_name, with_scores, device, comps, settings)
    key = make_key(fields)
    cache = CompositionCache.from_settings(settings)
    entry = cache.get(key)
    mine = entry["winner"] if entry and entry.get("winner") in by_name else None
    shapes = (q, c, k, bool(with_scores))
    both = agree("composition cache hit/miss", (shapes, mine), ranks=ranks, timeout_s=settings.prep_timeout)
    if len({b[0] for b in both}) > 1:  # never race (or select) with mismatched sizes: gloo aborts, NCCL hangs
        from .errors import PreparationError

        raise PreparationError("tpflare selection site " + site + ": ranks disagree on (Q, C, k, with_scores): "
                               + ", ".join(f"rank {r}: {b[0]}" for r, b in zip(ranks, both)))
    seen = [b[1] for b in both]
    if all(s is not None for s in seen) and len(set(seen)) == 1:
        stats["cache_hits"] += 1
        race_s, trials = 0.0, 0
        observe.progress_log.info("tpflare race %s: Q=%d C=%d k=%d: cache hit, 0 trials, winner %s",
                                  site or "select", q, c, k, seen[0])
        d = Decision(by_name[seen[0]], "cache", key, entry.get("timings", {}), entry.get("validation", {}),
                     why="every rank hit the same cache entry")
    else:
        why_race = ("cache miss on ranks " + str([r for r, s in zip(ranks, seen) if s is None])
                    if any(s is None for s in seen) else f"ranks' cache entries differ: {seen}")
        mem0 = _allocated(device)
        trials0 = stats["trials"]
        with observe.step(f"tpflare race {site or 'select'}: Q={q} C={c} k={k}, {len(comps)} compositions "
                          f"({', '.join(cm.name for cm in comps)}), {settings.race_holdout} holdouts") as prog:
            winner, timings, validation, why = run_race(q, c, k, group_name, with_scores, device, comps, settings)
            prog["result"] = f"winner {winner}"
        race_s, trials = prog["seconds"], stats["trials"] - trials0
        gc.collect()  # the race's trial and holdout tensors are gone once run_race returns
        if mem0 is not None:
            validation["_memory"] = {"allocated_before": mem0, "allocated_after": _allocated(device)}
        d = Decision(by_name[winner], "race", key, timings, validation, why=f"{why}; raced because {why_race}")
        try:  # the winner is agreed already: a cache that cannot be written only costs a later race
            cache.put(key, new_entry(fields, winner, timings, validation, why=why))
        except Exception as e:
            log.warning("tpflare: composition cache entry not written (%s); the decision stands", e)
    reporting.record("select", "bound", site=site, composition=d.composition.name, source=d.source,
                     reason=d.why, Q=q, C=c, k=k, kernel=kernel, timings=d.timings, key=key[:16],
                     validation={n: v for n, v in d.validation.items() if not n.startswith("_")},
                     trials=trials, race_s=round(race_s, 3))
    return d
