"""``tpflare.compile_fx``: Inductor's ``compile_fx`` with tpflare's preparation in front.

The integration surface for serving stacks that own their torch.compile backend
(vLLM-style): call it where the backend would call
``torch._inductor.compile_fx.compile_fx``; ``backend="tpflare"`` is this plus
``mode=`` / ``options=``.  Per Dynamo graph, on every rank in lockstep:

1. snapshot the knobs and check they are identical on every rank (collective);
2. on a copy of Dynamo's graph, bind each selection site to its composition
   (``tpflare.passes.select_binding``; the winner becomes an op argument);
3. ``compile_fx`` with ``inner_compile = LatentGatherCompiler`` (``latent_prep``):
   latent-gather sites are found, decided and rewritten on the AOT forward graph,
   with their row shards appended as live inputs; ``TpflarePostGradPass`` keys
   Inductor's caches on tpflare's source and decision knobs.

While the rewrite can apply, AOTAutograd's own cache is bypassed for the graph: a
hit there would skip the inner compiler, which appends the row shards.
Inductor's FX-graph cache still serves the compiled code (its key covers the
rewritten graph), and every compile reports its sites.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import logging
from typing import Any, Callable, Sequence

import torch.distributed as dist
from torch import fx

from .config import Settings, config
from .distributed import check_compile_agrees, is_distributed
from .reporting import record

log = logging.getLogger("tpflare.inductor")

_graph_counter = itertools.count()


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of Dynamo's graph we may edit (editing Dynamo's own graph breaks Dynamo).

    Made as Dynamo makes its own (``_make_graph_module``): inside a Dynamo compile
    that is a lazy graph module, whose code is generated only when called.
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


def _aot_cache_off():
    """AOTAutograd's cache skips the inner compiler on a hit: off while the rewrite may apply."""
    try:
        import torch._functorch.config as fconfig
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    if not hasattr(fconfig, "enable_autograd_cache"):
        return contextlib.nullcontext()
    return fconfig.patch(enable_autograd_cache=False)


def compile_fx(gm: fx.GraphModule, example_inputs: Sequence[Any], *, config_patches: dict | None = None,
               inner_compile: Callable[..., Any] | None = None, settings: Settings | None = None,
               **compile_fx_kwargs: Any) -> Any:
    """Drop-in for ``torch._inductor.compile_fx.compile_fx`` with tpflare's preparation.

    ``inner_compile`` (default Inductor's ``compile_fx_inner``) is what the latent
    gather hands the rewritten graph to, so a stack's own inner compiler stays in
    the chain.  ``settings`` defaults to the knobs now (``tpflare.config.resolve()``).
    """
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    from tpflare.passes import select_binding

    from .latent_prep import LatentGatherCompiler

    settings = settings or config.resolve()
    multi_rank = is_distributed() and dist.get_world_size() > 1
    graph_id = f"g{next(_graph_counter)}"
    if multi_rank:
        traced = [n.meta.get("val", n.meta.get("example_value"))  # (as Dynamo traced them)
                  for n in gm.graph.nodes if n.op == "placeholder"]
        differs = check_compile_agrees(settings, traced, timeout_s=settings.prep_timeout)
        if differs:
            _warn_inputs_differ(graph_id, differs)
    work = _copy_graph_module(gm)
    inputs = list(example_inputs)
    select_binding.bind_select_sites(work, inputs, settings, graph_id=graph_id)
    latent = LatentGatherCompiler(settings, work, inputs, graph_id, inner=inner_compile)
    import torch._inductor.config as inductor_config

    from tpflare.passes.manager import TpflarePostGradPass

    patches = dict(config_patches or {})
    chained = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
    patches["post_grad_custom_post_pass"] = TpflarePostGradPass(settings.decision_hash(), chained)
    may_rewrite = settings.latent_gather and multi_rank
    try:
        with _aot_cache_off() if may_rewrite else contextlib.nullcontext():
            compiled = inductor_compile_fx(work, inputs, inner_compile=latent,
                                           config_patches=patches, **compile_fx_kwargs)
    finally:
        latent.release()
    return _warn_on_knob_change(compiled, settings, graph_id)


def _warn_inputs_differ(graph_id: str, differs: list[str]) -> None:
    """Ranks compiled this graph with inputs specialised differently (sizes, strides, storage
    offsets; a value one rank shares with another size under duck sizing): Dynamo's guards differ,
    so a later call may recompile on some ranks only while the others enter the graph's
    collectives. Plain Inductor compiles it too: a warning and a report record, not a refusal."""
    reason = ("inputs specialised differently across ranks, so Dynamo's guards differ and a later call "
              "may recompile on some ranks only (their collectives then wait until a timeout): "
              + " | ".join(differs))
    advice = ("give every rank inputs of the same sizes, strides and storage offsets, or call "
              "torch.compiler.set_enable_guard_collectives(True) so that every rank recompiles when one does")
    record("compile", "warned", site=graph_id, reason=reason, advice=advice)
    log.warning("tpflare: graph %s: %s; %s", graph_id, reason, advice)


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


__all__ = ["compile_fx"]
