"""Per Dynamo frame: sites whose hidden row the check found not replicated (skipped again on
recompiles), and sites a compile rewrote (a later failed check there is warned about).

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

Rewrites are remembered too, the same way (pairs of the weight's source name and a graph input
the rewritten site's hidden row is computed from, with the compile's index), because the sticky
skip cannot reach back: a replicated 100-row call first (graph A, static: checked, rewritten),
then a non-replicated 64-row call (graph B, dynamic: skipped, sticky), and A keeps its rewrite
(no API evicts one Dynamo cache entry).  ``rewrote_earlier`` lets ``latent_prep`` say so, once
per frame and site (``warned`` / ``mark_warned``); the ranks agree on both flags as on the
sticky one.  Pairs, not weights alone: one weight can serve two sites, one of them rewritten
and the other found unreplicated in the same graph.  ``clear`` forgets these too.
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


_Pairs = dict[tuple[str, str], "int | None"]      # (weight, input) -> index of the compile that recorded it


@dataclasses.dataclass
class _History:
    """What the compiles of one frame recorded: pairs found not replicated, pairs of rewritten
    sites, and the weights whose earlier-rewrite warning was logged."""

    found: _Pairs = dataclasses.field(default_factory=dict)
    rewrote: _Pairs = dataclasses.field(default_factory=dict)
    warned: set[str] = dataclasses.field(default_factory=set)


_frames: dict[str, _History] = {}   # frame key -> its history
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


def _history_of(frame: Frame) -> _History:
    """This frame's history (lock held; not stored until written); dropped when Dynamo's counter
    for the frame went back below a compile that recorded something (a reset that missed ``clear``)."""
    h = _frames.get(frame.key)
    if h is None:
        return _History()
    indices = list(h.found.values()) + list(h.rewrote.values())
    if frame.compile_index is not None and any(i is not None and i > frame.compile_index for i in indices):
        log.info("tpflare latent gather: %s compiles again from #%d (torch._dynamo.reset() ran): "
                 "what its earlier compiles found and rewrote is forgotten", frame.key, frame.compile_index)
        _frames.pop(frame.key, None)
        return _History()
    return h


def _earlier(frame: Frame, at: int | None) -> bool:
    """Whether a pair recorded by compile ``at`` comes from a compile before ``frame``'s (unknown: yes)."""
    return at is None or frame.compile_index is None or at < frame.compile_index


def _add(frame: Frame, field: str, weight: str, inputs: Iterable[str]) -> None:
    """Record ``(weight, input)`` pairs in ``field`` of ``frame``'s history (the first index stays)."""
    with _lock:
        h = _history_of(frame)
        pairs = getattr(h, field)
        for name in inputs:
            pairs.setdefault((weight, name), frame.compile_index)
        if pairs:
            _frames[frame.key] = h


def found_earlier(frame: Frame, weight: str, inputs: Iterable[str]) -> str | None:
    """The first of ``inputs`` an *earlier* compile of ``frame`` found differing across ranks at the
    site of ``weight``; None when there is none (a pair found by this same compile does not count)."""
    with _lock:
        pairs = _history_of(frame).found
        for name in sorted(inputs):
            if (weight, name) in pairs and _earlier(frame, pairs[(weight, name)]):
                return name
    return None


def remember(frame: Frame, weight: str, inputs: Iterable[str]) -> None:
    """Record that this compile of ``frame`` found ``inputs`` differing across ranks at ``weight``'s site."""
    inputs = list(inputs)
    _add(frame, "found", weight, inputs)
    log.debug("tpflare latent gather: %s: %s not replicated at %s; later compiles skip the site",
              frame.key, ", ".join(inputs), weight)


def remember_rewrite(frame: Frame, weight: str, inputs: Iterable[str]) -> None:
    """Record that this compile of ``frame`` rewrote ``weight``'s site, whose hidden row is computed
    from graph inputs ``inputs`` (a site proven by a collective, with no such input, records nothing:
    no bits check can fail there later)."""
    _add(frame, "rewrote", weight, inputs)


def rewrote_earlier(frame: Frame, weight: str, inputs: Iterable[str]) -> bool:
    """Whether an *earlier* compile of ``frame`` rewrote a site of ``weight`` whose hidden row was
    computed from one of ``inputs``."""
    with _lock:
        pairs = _history_of(frame).rewrote
        return any((weight, name) in pairs and _earlier(frame, pairs[(weight, name)]) for name in inputs)


def warned(frame: Frame, weight: str) -> bool:
    """Whether the earlier-rewrite warning for ``weight``'s site of ``frame`` was logged already."""
    with _lock:
        return weight in _history_of(frame).warned


def mark_warned(frame: Frame, weight: str) -> None:
    """Record that the earlier-rewrite warning for ``weight``'s site of ``frame`` was logged."""
    with _lock:
        h = _history_of(frame)
        h.warned.add(weight)
        _frames[frame.key] = h


def clear() -> None:
    """Forget every frame (``torch._dynamo.reset()`` calls this through the tpflare backend)."""
    with _lock:
        _frames.clear()


def describe() -> list[dict[str, object]]:
    """The pairs found not replicated: one entry per (frame, weight, input), for tests and debugging."""
    with _lock:
        return [dict(frame=k, weight=w, input=n, compile_index=i)
                for k, h in _frames.items() for (w, n), i in h.found.items()]


def describe_rewrites() -> list[dict[str, object]]:
    """The rewritten sites: one entry per (frame, weight, input), with whether their warning was logged."""
    with _lock:
        return [dict(frame=k, weight=w, input=n, compile_index=i, warned=w in h.warned)
                for k, h in _frames.items() for (w, n), i in h.rewrote.items()]


__all__ = ["Frame", "current_frame", "found_earlier", "remember", "remember_rewrite", "rewrote_earlier",
           "warned", "mark_warned", "clear", "describe", "describe_rewrites"]
