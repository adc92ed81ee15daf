"""Row shards for the latent gather: registered copies, or resharded once.

``register_row_shard(col_weight, row_weight)`` tells tpflare that the model
already holds this rank's row shard ``W[N_r, :]`` of the weight whose column
shard ``W[:, K_r]`` is ``col_weight`` (the seed's ``latent_down_rows``): no new
memory.  Otherwise, with ``TPFLARE_LATENT_GATHER_RESHARD=auto``, the backend
builds it once at preparation (one all-to-all) and keeps it per weight, so
later compiles (other row counts) reuse it.

Weights changed in place after compile: every call of a rewritten graph checks
the version counters of the tensors it depends on (a few attribute reads, no
device work).  A resharded row shard whose column weight changed raises
``StaleWeightError`` until ``refresh_row_shards()`` is called on every rank
(it re-runs the all-to-all into the same storage, so captured CUDA graphs stay
valid).  A registered pair must change together; if only one side changed the
call raises.  Tensors created under ``torch.inference_mode`` have no version
counter and cannot be checked (documented limitation).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from typing import Any

import torch

from .errors import StaleWeightError

log = logging.getLogger("tpflare.row_shards")


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except Exception:  # inference tensors track no version
        return None


@dataclasses.dataclass
class _Entry:
    col: "weakref.ref[torch.Tensor]"
    rows: torch.Tensor
    origin: str              # "registered" | "resharded" | "dtensor"
    name: str
    group_name: str | None = None
    world: int | None = None
    col_version: int | None = None
    rows_version: int | None = None
    layout: str = "out_in"
    dtensor: "weakref.ref | None" = None   # the DTensor weight a "dtensor" row shard was redistributed from


_entries: dict[int, _Entry] = {}
_lock = threading.Lock()


def _key(col: torch.Tensor) -> int:
    return id(col)


def _drop(key: int) -> None:
    with _lock:
        _entries.pop(key, None)


def register_row_shard(col_weight: torch.Tensor, row_weight: torch.Tensor, name: str | None = None,
                       world: int | None = None, layout: str = "out_in") -> None:
    """Declare ``row_weight`` as this rank's row shard of ``col_weight``.

    ``layout="out_in"`` (``nn.Linear``, ``F.linear``, ``x @ w.t()``): ``col_weight``
    is ``[N, K/W]`` and ``row_weight`` ``[N/W, K]``.  ``layout="in_out"``
    (``x @ w``): ``col_weight`` is ``[K/W, N]`` and ``row_weight`` ``[K, N/W]``.
    ``world`` defaults to the default group's size when torch.distributed is
    initialised.  The values must be those of the same full weight: tpflare
    checks shapes, dtypes and devices here, and the rewrite's tests compare it
    against the reduce path.
    """
    label = name or "registered row shard"
    if not isinstance(col_weight, torch.Tensor) or not isinstance(row_weight, torch.Tensor):
        raise TypeError("register_row_shard(col_weight, row_weight): both must be tensors")
    if layout not in ("out_in", "in_out"):
        raise ValueError(f"{label}: layout={layout!r}, expected 'out_in' ([N, K/W] weights, x @ w.t()) "
                         "or 'in_out' ([K/W, N] weights, x @ w)")
    if layout == "in_out":
        if col_weight.dim() != 2 or row_weight.dim() != 2:
            raise ValueError(f"{label}: layout 'in_out' wants a 2-D column shard [K/W, N] and a 2-D row "
                             f"shard [K, N/W]; got {tuple(col_weight.shape)} and {tuple(row_weight.shape)}")
        col_view, row_view = col_weight.t(), row_weight.t()
        _register(col_weight, col_view, row_view, label, world, "in_out")
        return
    _register(col_weight, col_weight, row_weight, label, world, "out_in")


def _register(key_tensor: torch.Tensor, col_weight: torch.Tensor, row_weight: torch.Tensor, label: str,
              world: int | None, layout: str) -> None:
    if col_weight.dim() != 2 or row_weight.dim() != 2:
        raise ValueError(f"{label}: column shard must be 2-D [N, K/W] and row shard 2-D [N/W, K]; "
                         f"got {tuple(col_weight.shape)} and {tuple(row_weight.shape)}")
    if world is None:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    if world is not None:
        n, kw = col_weight.shape
        expect = (n // world, kw * world)
        if n % world or tuple(row_weight.shape) != expect:
            raise ValueError(f"{label}: row shard has shape {tuple(row_weight.shape)}, expected "
                             f"{expect} for a column shard {tuple(col_weight.shape)} at W={world}")
    if row_weight.dtype != col_weight.dtype or row_weight.device != col_weight.device:
        raise ValueError(f"{label}: row shard is {row_weight.dtype} on {row_weight.device}, the column "
                         f"shard {col_weight.dtype} on {col_weight.device}; they must match")
    key = _key(key_tensor)
    with _lock:
        _entries[key] = _Entry(weakref.ref(key_tensor, lambda _r, k=key: _drop(k)), row_weight,
                               "registered", label, world=world,
                               col_version=_version(key_tensor), rows_version=_version(row_weight),
                               layout=layout)


def lookup(col_weight: torch.Tensor) -> _Entry | None:
    with _lock:
        e = _entries.get(_key(col_weight))
    if e is not None and e.col() is not col_weight:
        return None
    return e


def _build(col_weight: torch.Tensor, world: int, group_name: str, layout: str, dtensor) -> torch.Tensor:
    with torch.no_grad():
        if dtensor is not None:        # the DTensor weight itself, redistributed over its mesh
            from torch.distributed.tensor import Shard

            target = [Shard(0)] if layout == "out_in" else [Shard(1)]
            rows = dtensor.detach().redistribute(dtensor.device_mesh, target).to_local()
            return (rows if layout == "out_in" else rows.t()).contiguous()
        col = col_weight.detach() if layout == "out_in" else col_weight.detach().t().contiguous()
        return torch.ops.tpflare.reshard_rows(col, world, group_name)


def _rows_shape(col: torch.Tensor, world: int, layout: str) -> str:
    n, kw = col.shape if layout == "out_in" else (col.shape[1], col.shape[0])
    return f"{n // world}, {kw * world}"


def resharded(col_weight: torch.Tensor, name: str, world: int, group_name: str, layout: str = "out_in",
              dtensor: Any = None) -> tuple[torch.Tensor, int]:
    """This rank's row shard ``[N/W, K]`` of ``col_weight``, built once (collective on first use).

    ``col_weight`` is ``[N, K/W]`` (``layout="out_in"``) or ``[K/W, N]`` (``"in_out"``).
    With ``dtensor`` (the DTensor whose local tensor ``col_weight`` is), the row shard is
    that DTensor redistributed to the other dimension's sharding; else one
    ``tpflare.reshard_rows`` all-to-all.  Returns (rows, bytes added by this call: 0
    when reused).
    """
    e = lookup(col_weight)
    if (e is not None and e.origin in ("resharded", "dtensor") and e.world == world
            and e.group_name == group_name and e.layout == layout):
        return e.rows, 0
    from .observe import step

    how = "DTensor redistribute" if dtensor is not None else "all-to-all"
    with step(f"tpflare reshard {name}: row shard [{_rows_shape(col_weight, world, layout)}] ({how})"):
        rows = _build(col_weight, world, group_name, layout, dtensor)
    key = _key(col_weight)
    with _lock:
        _entries[key] = _Entry(weakref.ref(col_weight, lambda _r, k=key: _drop(k)), rows,
                               "dtensor" if dtensor is not None else "resharded",
                               name, group_name, world, _version(col_weight), None, layout,
                               weakref.ref(dtensor) if dtensor is not None else None)
    added = rows.numel() * rows.element_size()
    log.info("tpflare: resharded %s into a row shard %s (%d bytes added)", name, tuple(rows.shape), added)
    return rows, added


def check_fresh(col_weights: list[torch.Tensor]) -> None:
    """Raise StaleWeightError if a weight the compiled graph relies on changed in place."""
    for col in col_weights:
        e = lookup(col)
        if e is None:
            continue
        cv = _version(col)
        if cv == e.col_version:
            if e.origin == "registered" and _version(e.rows) != e.rows_version:
                raise StaleWeightError(
                    f"{e.name}: the registered row shard changed in place but its column weight did "
                    "not; update both (or call tpflare.register_row_shard again)")
            continue
        if e.origin == "registered":
            if _version(e.rows) != e.rows_version:
                e.col_version, e.rows_version = cv, _version(e.rows)  # both updated together
                continue
            raise StaleWeightError(
                f"{e.name}: the column weight changed in place after compile but its registered row "
                "shard did not; update both (or call tpflare.register_row_shard again)")
        raise StaleWeightError(
            f"{e.name}: the weight changed in place after compile and tpflare's resharded row copy is "
            "stale; call tpflare.refresh_row_shards() on every rank (a collective) before the next call")


def refresh_row_shards() -> int:
    """Rebuild every resharded row shard from its (changed) column weight, in place.

    A collective: call it on every rank, in the same order.  Returns the number refreshed.
    """
    with _lock:
        items = sorted(((k, e) for k, e in _entries.items() if e.origin in ("resharded", "dtensor")),
                       key=lambda kv: kv[1].name)
    n = 0
    for _k, e in items:
        col = e.col()
        if col is None:
            continue
        dtensor = e.dtensor() if e.dtensor is not None else None
        fresh = _build(col, e.world, e.group_name, e.layout, dtensor)
        with torch.no_grad():
            e.rows.copy_(fresh)
        e.col_version = _version(col)
        n += 1
    return n


def describe() -> list[dict[str, Any]]:
    with _lock:
        return [dict(name=e.name, origin=e.origin, shape=tuple(e.rows.shape),
                     bytes=(e.rows.numel() * e.rows.element_size() if e.origin != "registered" else 0))
                for e in _entries.values()]
