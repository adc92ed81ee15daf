"""Process-group helpers and *agreed* preparation-time collectives.

Rule: every decision that could differ between ranks is taken from data every
rank has seen.  ``agree`` all-gathers one small object per rank over a private
gloo group with a timeout (``TPFLARE_PREP_TIMEOUT``): if a rank raised during
its local step, every rank raises with that rank's message; if a rank never
arrives, every waiting rank raises ``PreparationError`` instead of hanging.
"""
from __future__ import annotations

import datetime
import logging
import threading
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from .errors import KnobMismatchError, PreparationError

log = logging.getLogger("tpflare.distributed")

_side_groups: dict[tuple[int, ...], Any] = {}
_lock = threading.Lock()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def group_name_of(group: Any = None) -> str:
    """The string name custom ops take for a group (None = the default group)."""
    if isinstance(group, str):
        return group
    if group is None:
        group = dist.group.WORLD
    return group.group_name


def resolve_group(group_name: str):
    """ProcessGroup of a group name given to a custom op."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def group_ranks(group_name: str) -> list[int]:
    """Global ranks of a group, in group-rank order."""
    return dist.get_process_group_ranks(resolve_group(group_name))


def group_size(group_name: str) -> int:
    return dist.get_world_size(resolve_group(group_name))


def group_rank(group_name: str) -> int:
    return dist.get_rank(resolve_group(group_name))


def _side_group(ranks: Sequence[int], timeout_s: float):
    """A private gloo group over ``ranks`` used only for preparation agreement.

    Created with ``use_local_synchronization`` so only the member ranks take part;
    one per rank set, with the timeout of its first use (ranks may not disagree on
    which groups exist, so the timeout is not part of the identity).
    """
    key = tuple(ranks)
    with _lock:
        g = _side_groups.get(key)
        if g is None:
            kwargs = dict(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            try:
                g = dist.new_group(list(ranks), use_local_synchronization=True, **kwargs)
            except TypeError:  # very old torch without use_local_synchronization
                g = dist.new_group(list(ranks), **kwargs)
            _side_groups[key] = g
    return g


def agree(
    what: str,
    local: Callable[[], Any] | Any,
    *,
    ranks: Sequence[int] | None = None,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Run ``local`` (or take a value) on every rank and return every rank's result.

    Exceptions in ``local`` are not raised alone: they are shared, and every
    rank raises ``PreparationError`` naming the failing rank(s).  A rank that
    does not arrive within ``timeout_s`` makes the others raise too.
    """
    try:
        payload = ("ok", local() if callable(local) else local)
    except Exception as e:  # shared with the other ranks, re-raised below
        payload = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
        local_exc: BaseException | None = e
    else:
        local_exc = None
    if not is_distributed():
        if local_exc is not None:
            raise local_exc
        return [payload[1]]
    if ranks is None:
        ranks = list(range(dist.get_world_size()))
    if len(ranks) == 1:
        if local_exc is not None:
            raise local_exc
        return [payload[1]]
    gathered: list[Any] = [None] * len(ranks)
    try:
        group = _side_group(ranks, timeout_s)
        dist.all_gather_object(gathered, payload, group=group)
    except Exception as e:
        raise PreparationError(
            f"tpflare preparation step {what!r} on rank {dist.get_rank()}: the collective "
            f"failed or timed out after {timeout_s:.0f}s (TPFLARE_PREP_TIMEOUT) — another "
            f"rank crashed, diverged (compiled a different graph) or never arrived: {e}"
        ) from e
    failed = [(r, p) for r, p in zip(ranks, gathered) if p[0] == "error"]
    if failed:
        msg = "; ".join(f"rank {r}: {p[1]}" for r, p in failed)
        raise PreparationError(f"tpflare preparation step {what!r} failed on {msg}") from local_exc
    return [p[1] for p in gathered]


def input_signature(example_inputs: Sequence[Any]) -> list[str]:
    """How Dynamo specialised each graph input: a tensor's sizes, strides and storage offset as
    their expressions (a symbol where dynamic, a number where specialised; equal values under
    duck sizing share a symbol), an integer's expression. Ranks whose signatures differ compiled
    under different guards."""
    def expr(v: Any) -> str:
        return str(v.node.expr) if isinstance(v, torch.SymInt) else str(v)

    def describe(x: Any) -> str:
        if not isinstance(x, torch.Tensor):
            return f"{type(x).__name__} {expr(x)}"
        try:
            layout = f"stride ({', '.join(map(expr, x.stride()))}) offset {expr(x.storage_offset())}"
        except Exception:  # a tensor subclass without strides or storage (its sizes still say much)
            layout = "layout unknown"
        return f"{type(x).__name__} {x.dtype} size ({', '.join(map(expr, x.size()))}) {layout}"

    return [describe(x) for x in example_inputs]


def check_compile_agrees(settings, example_inputs: Sequence[Any], *, ranks: Sequence[int] | None = None,
                         timeout_s: float) -> list[str]:
    """One preparation collective a compile: fail on every rank, naming the knob, if decision
    knobs differ across ranks; return how the graph's inputs were specialised differently across
    ranks (``input_signature``; empty where every rank's is the same). Where they differ, so do
    Dynamo's guards: a later call may recompile on some ranks only, and their collectives then
    wait on each other until a timeout."""
    mine = {"knobs": settings.decision_dict(), "inputs": input_signature(example_inputs)}
    every = agree("knob check", mine, ranks=ranks, timeout_s=timeout_s)
    ranks = list(ranks) if ranks is not None else list(range(len(every)))
    diffs = []
    for name in sorted(mine["knobs"]):
        values = {r: theirs["knobs"].get(name) for r, theirs in zip(ranks, every)}
        if len({repr(v) for v in values.values()}) > 1:
            env = "TPFLARE_" + name.upper()
            diffs.append(f"{env} differs across ranks: " + ", ".join(
                f"rank {r}={v!r}" for r, v in values.items()))
    if diffs:
        raise KnobMismatchError(
            "tpflare knobs must be identical on every rank (they decide rewrites and "
            "compositions): " + "; ".join(diffs))
    inputs = []
    for i in range(len(mine["inputs"])):
        values = {r: theirs["inputs"][i] if i < len(theirs["inputs"]) else "absent"
                  for r, theirs in zip(ranks, every)}
        if len(set(values.values())) > 1:
            inputs.append(f"input {i}: " + "; ".join(f"rank {r} {v}" for r, v in values.items()))
    if any(len(theirs["inputs"]) != len(mine["inputs"]) for theirs in every):
        inputs.append("input count: " + ", ".join(f"rank {r} {len(t['inputs'])}" for r, t in zip(ranks, every)))
    return inputs


def device_of_backend(group_name: str) -> torch.device:
    """Device collectives of this group run on (cuda for NCCL, else cpu)."""
    pg = resolve_group(group_name)
    backend = dist.get_backend(pg)
    if "nccl" in str(backend).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
