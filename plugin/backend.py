"""The ``tpflare`` torch.compile backend.

    model = torch.compile(model, backend="tpflare")

Per Dynamo graph, on every rank in lockstep:

1. snapshot the knobs and check they are identical on every rank (collective);
2. on a *copy* of Dynamo's graph: bind each selection site to its composition
   (``tpflare.passes.select_binding``), and give each down_reduce weight a row
   shard input (registered, or resharded once) when the latent gather is on;
3. ``compile_fx`` with ``TpflarePostGradPass`` (uuid = pass sources + knobs + plan);
4. return a callable that appends the row-shard inputs and checks, on every
   call, that no weight it depends on changed in place (host-side counters).
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import fx

from . import reporting, row_shards
from .config import Settings, config
from .distributed import agree, check_knobs_agree, group_rank, group_size, is_distributed

log = logging.getLogger("tpflare.backend")

_graph_counter = itertools.count()

_ALL_REDUCE = {torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.all_reduce.default}
_SCAN_DEPTH = 6


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of Dynamo's graph we may edit (editing Dynamo's own graph breaks Dynamo).

    Made as Dynamo makes its own (``_make_graph_module``): inside a Dynamo compile
    that is a lazy graph module, whose Python code is generated only when something
    calls it, not at construction and at every ``recompile()`` after an edit
    (AOTAutograd traces the graph with an interpreter).
    """
    try:
        from torch.fx._lazy_graph_module import _make_graph_module
    except ImportError:  # pragma: no cover
        _make_graph_module = fx.GraphModule
    new = _make_graph_module(gm, copy.deepcopy(gm.graph))
    new.meta.update(gm.meta)
    for src, dst in zip(gm.graph.find_nodes(op="placeholder"), new.graph.find_nodes(op="placeholder")):
        if hasattr(src, "_dynamo_source"):
            dst._dynamo_source = src._dynamo_source
    for attr in ("_param_name_to_source",):
        if hasattr(gm, attr):
            setattr(new, attr, getattr(gm, attr))
    return new


def _example(node: fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


def _input_name(node: fx.Node) -> str:
    src = getattr(node, "_dynamo_source", None)
    return src.name if src is not None and hasattr(src, "name") else node.name


def _weight_candidates(gm: fx.GraphModule, example_inputs: Sequence[Any], settings: Settings):
    """Dynamo-level scan: which 2-D inputs feed a reduced GEMM, with the gates pre-applied.

    Returns ``[(input index, name, group name, N, reason or None)]`` (sorted,
    deduplicated).  The post-grad pass does the exact match; this only decides
    which row shards to provide.
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    index = {n: i for i, n in enumerate(placeholders)}
    out: dict[int, tuple] = {}
    for ar in gm.graph.nodes:
        if ar.op != "call_function" or ar.target not in _ALL_REDUCE or len(ar.args) < 3:
            continue
        reduced = _example(ar.args[0]) if isinstance(ar.args[0], fx.Node) else None
        if reduced is None or reduced.dim() < 1:
            continue
        group_name = str(ar.args[2])
        try:
            world = group_size(group_name)
        except Exception:
            continue
        n = reduced.shape[-1]
        rows = reduced.numel() // n if n else 0
        frontier, seen = [ar.args[0]], set()
        weights: list[fx.Node] = []
        widths: set = set()          # last dims seen upstream: a full hidden row is [.., K/W * W]
        for _ in range(_SCAN_DEPTH):
            nxt = []
            for node in frontier:
                if not isinstance(node, fx.Node) or node in seen:
                    continue
                seen.add(node)
                val = _example(node)
                if isinstance(val, torch.Tensor) and val.dim() >= 1:
                    widths.add(val.shape[-1])
                if node.op == "placeholder":
                    t = example_inputs[index[node]]
                    if (isinstance(t, torch.Tensor) and t.dim() == 2 and t.is_floating_point()
                            and t.shape[0] == n):
                        weights.append(node)
                    continue
                nxt.extend(a for a in node.all_input_nodes)
            frontier = nxt
        for node in weights:
            kw = example_inputs[index[node]].shape[1]
            reason = None
            if world == 1:
                reason = "group of size 1"
            elif kw * world not in widths:
                reason = f"no replicated [.., {kw * world}] hidden row upstream (not replicated input)"
            elif n % (settings.latent_gather_align * world):
                reason = f"width: N={n} % (align {settings.latent_gather_align} * W {world}) != 0"
            elif not statically_known_true(rows >= settings.latent_gather_min_rows):
                reason = f"rows: {rows} not known to be >= {settings.latent_gather_min_rows}"
            prev = out.get(index[node])
            if prev is None or (prev[4] is not None and reason is None):
                out[index[node]] = (index[node], _input_name(node), group_name, int(n), reason)
    return [out[k] for k in sorted(out)]


def _add_input(gm: fx.GraphModule, name: str, value: torch.Tensor) -> int:
    """Append a graph input (a live tensor, never a baked constant); return its index."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    with gm.graph.inserting_after(placeholders[-1]):
        node = gm.graph.placeholder(name)
    node._dynamo_source = None  # AOTAutograd wants the attribute on every placeholder
    node.meta["tensor_dict"] = {"_dynamo_static_input_type": "unguarded"}  # cudagraphs: static address
    try:
        from torch._guards import detect_fake_mode

        fake_mode = detect_fake_mode([_example(p) for p in placeholders if _example(p) is not None])
        if fake_mode is not None:
            node.meta["example_value"] = fake_mode.from_tensor(value, static_shapes=True)
    except Exception:  # meta is a nicety for the pass; AOT fakeifies the real input itself
        pass
    return len(placeholders)


def _prepare_latent_gather(gm: fx.GraphModule, example_inputs: list, settings: Settings, graph_id: str):
    from tpflare.passes.latent_gather import LatentGatherPlan, RowSource

    groups = _all_groups_of(gm)  # every reduce's group: the pass reports skipped sites too
    rows_for_input: dict[int, RowSource] = {}
    extra: list[torch.Tensor] = []
    bindings: list[RowBinding] = []
    candidates = _weight_candidates(gm, example_inputs, settings) if settings.latent_gather else []
    if candidates and is_distributed():
        # every rank must provide (and reshard) the same row shards in the same order
        mine = [(i, name, g, n, r, tuple(example_inputs[i].shape), row_shards.lookup(example_inputs[i]) is not None)
                for i, name, g, n, r in candidates]
        everyone = agree("latent gather row shards", mine, timeout_s=settings.prep_timeout)
        if any([c[:6] for c in other] != [c[:6] for c in mine] for other in everyone):
            from .errors import PreparationError

            raise PreparationError("tpflare latent gather: ranks compiled different down_reduce sites "
                                   f"(this rank: {mine}); every rank must compile the same model")
        registered_everywhere = [all(o[k][6] for o in everyone) for k in range(len(mine))]
    else:
        registered_everywhere = [row_shards.lookup(example_inputs[c[0]]) is not None for c in candidates]
    for (idx, name, g, n, reason), reg_all in zip(candidates, registered_everywhere):
        if reason is not None:
            rows_for_input[idx] = RowSource(None, reason)
            continue
        col = example_inputs[idx]
        world = groups[g][1]
        entry = row_shards.lookup(col)
        if entry is not None and entry.origin == "registered" and reg_all:
            rows, origin, added = entry.rows, "registered", 0
            if tuple(rows.shape) != (n // world, col.shape[1] * world):
                raise ValueError(f"{entry.name} for {name}: shape {tuple(rows.shape)}, expected "
                                 f"{(n // world, col.shape[1] * world)}")
        elif settings.latent_gather_reshard == "auto":
            rows, added = row_shards.resharded(col, name, world, g)
            origin = "resharded"
        else:
            rows_for_input[idx] = RowSource(None, "not registered and TPFLARE_LATENT_GATHER_RESHARD=never")
            continue
        row_idx = _add_input(gm, f"tpflare_rows_{idx}", rows)
        extra.append(rows)
        bindings.append(RowBinding(idx, col, rows, name, g, world, settings.latent_gather_reshard == "auto"))
        rows_for_input[idx] = RowSource(row_idx, "", origin, added)
    plan = LatentGatherPlan(
        enabled=settings.latent_gather, align=settings.latent_gather_align,
        min_rows=settings.latent_gather_min_rows, channel_rows=settings.latent_gather_channel_rows,
        rank_in_group={g: v[0] for g, v in groups.items()},
        world_of_group={g: v[1] for g, v in groups.items()},
        rows_for_input=rows_for_input, graph_id=graph_id)
    return plan, extra, bindings


def _all_groups_of(gm: fx.GraphModule) -> dict[str, tuple[int, int]]:
    groups = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _ALL_REDUCE and len(node.args) >= 3:
            g = str(node.args[2])
            try:
                groups[g] = (group_rank(g), group_size(g))
            except Exception:
                pass
    return groups


def _inductor_patches(mode: str | None, options: dict | None) -> dict[str, Any]:
    """``torch.compile(..., mode=, options=)`` as Inductor config patches (as Inductor does)."""
    patches: dict[str, Any] = {}
    if mode and mode != "default":
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(mode))
    patches.update(options or {})
    return patches


def tpflare_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
                    options: dict | None = None):
    """torch.compile backend: tpflare's graph preparation, then Inductor.

    ``mode`` / ``options`` are Inductor's (``mode="reduce-overhead"`` = CUDA graphs).
    """
    from torch._inductor.compile_fx import compile_fx

    from tpflare.passes import select_binding
    from tpflare.passes.manager import TpflarePostGradPass

    settings = config.resolve()
    if is_distributed() and dist.get_world_size() > 1:
        check_knobs_agree(settings, timeout_s=settings.prep_timeout)
    graph_id = f"g{next(_graph_counter)}"
    work = _copy_graph_module(gm)
    inputs = list(example_inputs)
    bound = select_binding.bind_select_sites(work, inputs, settings, graph_id=graph_id, recompile=False)
    plan, extra, bindings = _prepare_latent_gather(work, inputs, settings, graph_id)
    if bound or extra:
        work.recompile()  # once for both edits (lazy: the code is generated if and when it is called)
    import torch._inductor.config as inductor_config

    post_pass = TpflarePostGradPass(plan, settings.decision_hash(),
                                    chained=inductor_config.post_grad_custom_post_pass)
    if plan.rows_for_input:
        # always recorded, also when Inductor's FX-graph cache serves the graph and the
        # post-grad pass (which records each site) does not run
        reporting.record("latent_gather", "prepared", site=graph_id, row_shards={
            i: (src.origin or None, src.reason or None) for i, src in plan.rows_for_input.items()})
    patches = _inductor_patches(mode, options)
    patches["post_grad_custom_post_pass"] = post_pass
    compiled = compile_fx(work, inputs + extra, config_patches=patches)
    if extra:
        compiled = _with_row_inputs(compiled, bindings)
    return _warn_on_knob_change(compiled, settings, graph_id)


@dataclasses.dataclass(frozen=True)
class RowBinding:
    """Input ``col_index`` (a column shard) is served by the appended input ``rows``."""

    col_index: int
    col: torch.Tensor
    rows: torch.Tensor
    name: str
    group_name: str
    world: int
    may_reshard: bool

    def rows_for(self, col: torch.Tensor) -> torch.Tensor:
        """The row shard for the column weight this call actually passes.

        Dynamo may serve one compiled graph to another module instance (weights
        are graph inputs, not guards): its row shard is looked up (registered or
        resharded earlier) or resharded now — a collective that every rank makes
        at the same call, since every rank runs the same model.
        """
        if col is self.col:
            return self.rows
        entry = row_shards.lookup(col)
        expect = (col.shape[0] // self.world, col.shape[1] * self.world)
        if entry is not None and tuple(entry.rows.shape) == expect and entry.rows.dtype == col.dtype:
            return entry.rows
        if not self.may_reshard:
            from .errors import TpflareError

            raise TpflareError(
                f"tpflare latent gather: a compiled graph is called with another weight at input "
                f"{self.name} that has no registered row shard (and TPFLARE_LATENT_GATHER_RESHARD=never); "
                "call tpflare.register_row_shard for it")
        return row_shards.resharded(col, self.name, self.world, self.group_name)[0]


def _with_row_inputs(compiled, bindings: list[RowBinding]):
    def run(*args):
        cols = [args[b.col_index] for b in bindings]
        rows = [b.rows_for(c) for b, c in zip(bindings, cols)]
        row_shards.check_fresh(cols)
        return compiled(*args, *rows)

    return run


def _warn_on_knob_change(compiled, settings: Settings, graph_id: str):
    """Compiled graphs keep the decisions they were compiled with (knobs are not Dynamo
    guards): warn once if decision knobs set in code changed since, instead of silently
    running the old decision."""
    state = {"gen": config.generation, "warned": False}
    compiled_hash = settings.decision_hash()

    def run(*args):
        if config.generation != state["gen"] and not state["warned"]:
            state["gen"] = config.generation
            now = config.resolve()
            if now.decision_hash() != compiled_hash:
                state["warned"] = True
                changed = sorted(k for k, v in now.decision_dict().items()
                                 if settings.decision_dict()[k] != v)
                log.warning("tpflare: graph %s was compiled with other values of %s; it keeps its "
                            "compiled decisions (call torch._dynamo.reset() to recompile)",
                            graph_id, ", ".join("TPFLARE_" + k.upper() for k in changed))
        return compiled(*args)

    return run


def register() -> None:
    """Register the backend name with Dynamo (idempotent; also an entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "tpflare" not in _BACKENDS or _BACKENDS.get("tpflare") is None:
        register_backend(name="tpflare")(tpflare_backend)


__all__ = ["tpflare_backend", "register"]
