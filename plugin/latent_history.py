"""Sites whose hidden row the replication check found not replicated: skipped again on recompiles.

Why.  The replication check (``tpflare.latent_prep``) reads the first call's inputs of each
compiled graph.  A Dynamo frame can be compiled several times (recompiles: automatic
dynamic, guard failures), and a later graph is served to inputs an earlier one saw.  Under
automatic dynamic, a 64-row call whose row is *not* replicated (site skipped, graph A static),
then a replicated 100-row call (graph B, symbolic rows: checked, would be rewritten), then the
first 64-row input again: Dynamo serves it with B, whose rewritten result for that input
differs from eager's.  Bits would depend on call history.  So once a check found a site's
hidden row not replicated, every *later* compile of the same frame skips that site too.

What is kept, per Dynamo frame: pairs of strings (the weight's source name, the source name of
a graph input found differing across ranks, e.g. ``("L['c']", "L['x']")``), and the index of
the compile that found it.  Source names, not placeholder indices or node names, which change
between recompiles.  No tensors, no graphs.

A frame is Dynamo's ``CompileId.frame_id`` (stable across recompiles of one code object,
reassigned by ``torch._dynamo.reset()``) plus the frame code's name and location (so a frame id
reused after a reset that did not reach ``clear`` never names another function).  Where no
compile id is known (a torch without ``CompileContext``, a graph compiled outside Dynamo), all
such graphs share one conservative bucket: a pair found there is skipped in every later graph
of the bucket (the cost is a kept all-reduce, never a rewrite on an unchecked row).

Every rank consults its own copy and the ranks agree on it (``latent_prep`` puts the flag in the
per-rank record it all-gathers: one rank that has it makes every rank skip).
``torch._dynamo.reset()`` clears it (through the tpflare backend's ``reset``, which Dynamo calls);
a stack that owns its backend calls ``tpflare.latent_history.clear`` from its own ``reset``.
Should that not happen, a frame whose Dynamo compile counter went back below a compile that
found a pair (a reset) drops its pairs; a pair found by the frame's first compile cannot be told
from a fresh one that way and stays (conservative: a kept all-reduce).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Iterable

log = logging.getLogger("tpflare.latent_history")

UNKNOWN = "<no Dynamo compile id>"


@dataclasses.dataclass(frozen=True)
class Frame:
    """The Dynamo frame a graph is compiled for: ``key`` names it, ``compile_index`` orders its compiles
    (None: unknown, then every later lookup applies)."""

    key: str
    compile_index: int | None = None


_found: dict[str, dict[tuple[str, str], int | None]] = {}   # frame key -> (weight, input) -> compile index
_lock = threading.Lock()


def _code_label() -> str:
    """Name and location of the code object Dynamo traces (its first traced code), or ''."""
    try:
        from torch._guards import TracingContext

        codes = TracingContext.get_traced_code() if hasattr(TracingContext, "get_traced_code") else None
    except Exception:
        codes = None
    if not codes:
        return ""
    code = codes[0]
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name} at {code.co_filename}:{code.co_firstlineno}"


def current_frame() -> Frame:
    """The frame of the graph being compiled now (call inside the backend)."""
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
    except Exception:      # a torch without CompileContext: the conservative bucket
        cid = None
    frame_id = getattr(cid, "frame_id", None)
    if frame_id is None:
        return Frame(UNKNOWN)
    return Frame(f"frame {frame_id} ({_code_label()})", getattr(cid, "frame_compile_id", None))


def _pairs_of(frame: Frame) -> dict[tuple[str, str], int | None]:
    """This frame's pairs (lock held); drops them when Dynamo's counter for the frame went back."""
    pairs = _found.get(frame.key, {})
    if frame.compile_index is not None and any(
            i is not None and i > frame.compile_index for i in pairs.values()):
        log.info("tpflare latent gather: %s compiles again from #%d (torch._dynamo.reset() ran): "
                 "its non-replicated sites are forgotten", frame.key, frame.compile_index)
        pairs = {}
        _found.pop(frame.key, None)
    return pairs


def found_earlier(frame: Frame, weight: str, inputs: Iterable[str]) -> str | None:
    """The first of ``inputs`` an *earlier* compile of ``frame`` found differing across ranks at the
    site of ``weight``; None when there is none (a pair found by this same compile does not count)."""
    with _lock:
        pairs = _pairs_of(frame)
        for name in sorted(inputs):
            if (weight, name) not in pairs:
                continue
            at = pairs[(weight, name)]
            if at is None or frame.compile_index is None or at < frame.compile_index:
                return name
    return None


def remember(frame: Frame, weight: str, inputs: Iterable[str]) -> None:
    """Record that this compile of ``frame`` found ``inputs`` differing across ranks at ``weight``'s site."""
    inputs = list(inputs)
    with _lock:
        pairs = _pairs_of(frame)
        for name in inputs:
            pairs.setdefault((weight, name), frame.compile_index)
        if pairs:
            _found[frame.key] = pairs
    log.debug("tpflare latent gather: %s: %s not replicated at %s; later compiles skip the site",
              frame.key, ", ".join(inputs), weight)


def clear() -> None:
    """Forget every frame (``torch._dynamo.reset()`` calls this through the tpflare backend)."""
    with _lock:
        _found.clear()


def describe() -> list[dict[str, object]]:
    """What is remembered: one entry per (frame, weight, input), for tests and debugging."""
    with _lock:
        return [dict(frame=k, weight=w, input=n, compile_index=i)
                for k, pairs in _found.items() for (w, n), i in pairs.items()]


__all__ = ["Frame", "current_frame", "found_earlier", "remember", "clear", "describe"]
