"""tpflare in PyTorch's own observability: ``TORCH_LOGS``, ``TORCH_TRACE`` / tlparse, progress.

* **Logs.** ``tpflare`` is registered with ``torch._logging`` the way PyTorch
  registers its own subsystems (``register_log`` in ``torch/_logging/_registrations.py``):
  ``TORCH_LOGS=tpflare`` shows tpflare's INFO records (every decision, every
  progress line), ``TORCH_LOGS=+tpflare`` adds DEBUG, and
  ``torch._logging.set_logs(modules={"tpflare": logging.INFO})`` does the same in
  code.  (When ``TORCH_LOGS`` names ``tpflare`` at ``import torch`` time, before
  tpflare could register, torch resolves the name as a module: same loggers,
  same result.)
* **Structured trace.** Every decision record (``tpflare.reporting.record``) is
  also a ``torch._logging.trace_structured("artifact", ...)`` entry with
  ``encoding="json"`` and the record as payload, named ``tpflare_latent_gather``
  (site rewritten / skipped and why), ``tpflare_race`` (composition bound: race
  timings per composition, holdout validation, winner, or a cache hit) or
  ``tpflare_<kind>``.  With ``TORCH_TRACE=DIR`` they land in each rank's trace
  file beside Inductor's own entries, under the compile id of the frame being
  compiled, so ``tlparse`` shows them with that frame.
* **Progress.** ``step("race ...")`` logs a start line and a done line with the
  seconds taken on ``logging.getLogger("tpflare.progress")`` (INFO), for the
  preparation steps that take long (race, kernel compile, model compile).
  ``print_progress()`` sends them to stderr (the demo and the example do, on
  rank 0).

Everything here is feature-detected: a torch without one of these APIs loses
that channel, never the decision.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import sys
import time
from typing import Any, Iterator

log = logging.getLogger("tpflare.observe")
progress_log = logging.getLogger("tpflare.progress")

ARTIFACT_NAMES = {"latent_gather": "tpflare_latent_gather", "select": "tpflare_race"}


def artifact_name(kind: str) -> str:
    """The trace artifact name of a record ``kind``."""
    return ARTIFACT_NAMES.get(kind, f"tpflare_{kind}")


def register_torch_logs() -> bool:
    """Register the ``tpflare`` log alias with ``torch._logging`` (idempotent).

    Returns False on a torch without ``torch._logging._internal.register_log``.
    """
    try:
        from torch._logging._internal import log_registry, register_log
    except ImportError:
        return False
    if not log_registry.is_log("tpflare"):
        register_log("tpflare", ["tpflare"])
    return True


def trace(rec: dict[str, Any]) -> None:
    """Emit one decision record as a structured trace artifact (no-op without ``TORCH_TRACE``)."""
    try:
        from torch._logging import trace_structured
    except ImportError:
        return
    name = artifact_name(str(rec.get("kind", "record")))
    kwargs = dict(metadata_fn=lambda: {"name": name, "encoding": "json"},
                  payload_fn=lambda: json.dumps(rec, default=str, sort_keys=True))
    if _takes_expect_trace_id(trace_structured):
        kwargs["expect_trace_id"] = False  # also outside a compile (a race called directly)
    try:
        trace_structured("artifact", **kwargs)
    except Exception as e:  # observability never breaks a compile
        log.debug("tpflare: trace artifact %s not written: %s", name, e)


@functools.lru_cache(maxsize=None)
def _takes_expect_trace_id(fn: Any) -> bool:
    """Whether this torch's ``trace_structured`` has ``expect_trace_id`` (older ones do not)."""
    try:
        return "expect_trace_id" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def read_trace_artifacts(trace_dir: str, prefix: str = "tpflare_") -> list[dict[str, Any]]:
    """Every tpflare artifact in a ``TORCH_TRACE`` directory (all ranks' files), in file order:
    ``{"name", "rank", "file", "frame_id", "frame_compile_id", "payload"}``.

    The trace format: one JSON object per entry line; its payload follows on lines
    that start with a tab.
    """
    import os

    out: list[dict[str, Any]] = []
    for fname in sorted(os.listdir(trace_dir)):
        path = os.path.join(trace_dir, fname)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("\t"):
                continue
            try:  # "V1201 08:41:53.046000 5292 path/to/file.py:70] {...}"
                entry = json.loads(line.split("] ", 1)[1])
            except (IndexError, ValueError):
                continue
            art = entry.get("artifact") if isinstance(entry, dict) else None
            if not isinstance(art, dict) or not str(art.get("name", "")).startswith(prefix):
                continue
            payload = []
            for nxt in lines[i + 1:]:
                if not nxt.startswith("\t"):
                    break
                payload.append(nxt[1:])
            try:
                body = json.loads("\n".join(payload))
            except ValueError:
                body = "\n".join(payload)
            out.append(dict(name=art["name"], rank=entry.get("rank"), file=fname,
                            frame_id=entry.get("frame_id"), frame_compile_id=entry.get("frame_compile_id"),
                            payload=body))
    return out


# --- progress ------------------------------------------------------------------------------------
@contextlib.contextmanager
def step(what: str) -> Iterator[dict[str, Any]]:
    """Log ``what ...`` now and ``what: done in X s`` (or ``failed``) at the end.

    The yielded dict may receive a ``"result"`` string, appended to the done line.
    """
    info: dict[str, Any] = {}
    progress_log.info("%s ...", what)
    t0 = time.perf_counter()
    try:
        yield info
    except BaseException as e:
        progress_log.info("%s: failed after %.1f s (%s)", what, time.perf_counter() - t0, type(e).__name__)
        raise
    info["seconds"] = time.perf_counter() - t0
    tail = f" — {info['result']}" if info.get("result") else ""
    progress_log.info("%s: done in %.1f s%s", what, info["seconds"], tail)


class _ProgressFormatter(logging.Formatter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix, self.t0 = prefix, time.perf_counter()

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prefix}[{time.perf_counter() - self.t0:6.1f} s] {record.getMessage()}"


def print_progress(prefix: str = "", stream: Any = None) -> logging.Handler | None:
    """Show ``tpflare.progress`` lines on ``stream`` (stderr); returns the handler, or None when
    ``TORCH_LOGS`` (or other logging set up on ``tpflare``) shows them already."""
    parent = logging.getLogger("tpflare")
    if parent.isEnabledFor(logging.INFO) and any(not isinstance(h, logging.NullHandler) for h in parent.handlers):
        return None
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_ProgressFormatter(prefix))
    handler.setLevel(logging.INFO)
    progress_log.addHandler(handler)
    if progress_log.getEffectiveLevel() > logging.INFO:
        progress_log.setLevel(logging.INFO)
    return handler


__all__ = ["register_torch_logs", "trace", "read_trace_artifacts", "step", "print_progress",
           "artifact_name", "ARTIFACT_NAMES"]
