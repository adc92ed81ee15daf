"""What tpflare decided, and why: every rewrite site and every race.

Records go to ``logging.getLogger("tpflare.report")`` (INFO; ``TORCH_LOGS=tpflare``
shows them), to an in-process list (``tpflare.report()``), to PyTorch's
structured trace as ``tpflare_latent_gather`` / ``tpflare_race`` artifacts
(``TORCH_TRACE=DIR``, read by tlparse; see ``tpflare.observe``), and, when ``TPFLARE_REPORT=FILE`` is set, as
JSON lines appended to FILE (``python -m tpflare report FILE`` prints them).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from . import observe

log = logging.getLogger("tpflare.report")
observe.register_torch_logs()   # TORCH_LOGS=tpflare / +tpflare

_records: list[dict[str, Any]] = []
_lock = threading.Lock()


def record(kind: str, decision: str, **fields: Any) -> dict[str, Any]:
    """Add one decision record: ``kind`` (latent_gather / select / ...),
    ``decision`` (rewritten / skipped / bound / ...), plus free-form fields
    (``reason`` for skips, shapes, memory, timings)."""
    rec = {"kind": kind, "decision": decision, "time": time.time()}
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rec["rank"] = dist.get_rank()
    except Exception:
        pass
    rec.update(fields)
    with _lock:
        _records.append(rec)
    log.info("%s", format_record(rec))
    observe.trace(rec)
    path = os.environ.get("TPFLARE_REPORT", "")
    try:
        from .config import config

        path = config.report or path
    except Exception:
        pass
    if path:
        try:
            with open(path, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
        except OSError as e:
            log.warning("tpflare: cannot append report to %s: %s", path, e)
    return rec


def records(kind: str | None = None) -> list[dict[str, Any]]:
    with _lock:
        return [dict(r) for r in _records if kind is None or r["kind"] == kind]


def clear() -> None:
    with _lock:
        _records.clear()


def format_record(rec: dict[str, Any]) -> str:
    skip = {"kind", "decision", "time", "site", "reason", "rank"}
    head = f"[{rec['kind']}] {rec.get('site', '?')}: {rec['decision']}"
    if "rank" in rec:
        head = f"rank {rec['rank']} " + head
    if rec.get("reason"):
        head += f" ({rec['reason']})"
    extra = ", ".join(f"{k}={v}" for k, v in rec.items() if k not in skip)
    return head + (f" — {extra}" if extra else "")


def format_report(recs: list[dict[str, Any]] | None = None) -> str:
    recs = records() if recs is None else recs
    if not recs:
        return "tpflare: no sites seen"
    return "\n".join(format_record(r) for r in recs)
