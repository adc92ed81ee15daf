"""Sparse candidate selection across TP ranks: two complete compositions as custom ops.

Every rank holds candidates ``scores`` fp32 ``[Q, C]`` and ``ids`` int32 ``[Q, C]``
(global KV ids, ``-1`` = padding) for the same ``Q`` query rows.  Every op returns,
identically on every rank, the global top-``k`` ``ids`` int32 ``[Q, k]`` under the
Order rule (``ordering.py``) and, when ``with_scores``, their fp32 scores
``[Q, k]`` with their original bits (else an empty fp32 ``[Q, 0]``).  Padding
slots: id ``-1``, score ``-inf``.

Ops (namespace ``tpflare``; the group is a plain ``str`` group name):

* ``select_replicated(scores, ids, k, group_name, with_scores, select_kernel="torch")``: one
  all-gather of every rank's ``(score bits, id)`` pairs, then every rank selects every row.
* ``select_owner(scores, ids, k, group_name, with_scores, id_replication, select_kernel="torch")``:
  query rows go to owner ranks in balanced contiguous blocks (the first
  ``Q % W`` ranks own ``ceil(Q/W)`` rows, the rest ``floor(Q/W)``; a rank may own
  none and still takes part); one all-to-all (blocks padded to ``ceil(Q/W)`` rows,
  equal splits) brings each row's candidates to its owner, the owner selects,
  and ``replicate_ids`` copies the selected rows to every rank.
* ``replicate_ids(local, q, group_name, plan)``: owner rows ``local`` int32
  ``[ceil(q/W), m]`` (the first ``rows(rank)`` meaningful) -> int32 ``[q, m]`` on
  every rank, bit-exact.  ``plan="allgather"``: an int32 all-gather.
  ``plan="bf16"``: every int32 as its 4 bytes, each byte an exact BF16 integer
  0..255, in a sum all-reduce where only the owner's rows are non-zero; decoded
  back to the same int32 bits.  Scores travel the same way as int32 bit patterns.
* ``select_by_rows(scores, ids, k, group_name, with_scores, rows, compositions, select_kernel)``:
  a site whose row count is symbolic at preparation: the composition raced at the smallest
  listed row count at or above the call's (the largest's beyond them); ``compositions`` names
  one a row count, comma-separated (``replicated``, ``owner/allgather``, ``owner/bf16``).
* ``select(scores, ids, k, group_name, with_scores, select_kernel="torch")``: what model code
  calls (``select_topk``); eagerly it is ``select_replicated``.  The compile-time
  binding replaces the node with a race winner, whose leading arguments match.

``select_kernel`` is the ordered-selection kernel (``ordering.ordered_select``: ``torch``,
``triton`` or ``auto``), a decision made at preparation (``ordering.resolve_kernel`` of
``TPFLARE_SELECT_KERNEL``) and bound into the graph by ``passes/select_binding.py``, like the
id-replication plan: nothing global is read when the op runs.

Inputs of any strides are accepted (made contiguous internally).  Arguments are
checked before any collective, from metadata only (no host sync).  What the ops
cannot see without another collective is whether every rank passes the same
``Q`` and ``C``: gloo aborts the process on such a size mismatch and NCCL may hang
or read garbage, so preparation code should call ``validate_candidates`` once.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from tpflare.distributed import agree, group_name_of, group_rank, group_size, resolve_group

from .ordering import check_kernel, check_candidates, ordered_select

log = logging.getLogger("tpflare.select")

ID_REPLICATION_PLANS = ("allgather", "bf16")

# all_gather_single replaces the deprecated all_gather_into_tensor in newer torch.
_all_gather_base = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather(x: Tensor, pg) -> Tensor:
    """``[n, ...]`` on every rank -> ``[W, n, ...]`` in rank order (concatenated-form output)."""
    world = dist.get_world_size(pg)
    out = x.new_empty((world * x.shape[0],) + tuple(x.shape[1:]))
    _all_gather_base(out, x.contiguous(), group=pg)
    return out.view((world,) + tuple(x.shape))


# --- row ownership ---------------------------------------------------------------
def owner_rows(q: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, rows)`` of the contiguous query-row block that ``rank`` owns."""
    base, rem = divmod(q, world)
    return rank * base + min(rank, rem), base + (1 if rank < rem else 0)


def rows_per_owner(q: int, world: int) -> int:
    """Rows of every padded owner block: ``ceil(q / world)``."""
    return -(-q // world)


def _to_owner_blocks(x: Tensor, world: int, fill: int) -> Tensor:
    """``[Q, ...]`` -> ``[W, ceil(Q/W), ...]``: owner r's rows in block r, padded with ``fill``."""
    q, rest = x.shape[0], tuple(x.shape[1:])
    base, rem = divmod(q, world)
    if rem == 0:
        return x.reshape((world, base) + rest)
    r = base + 1
    out = x.new_full((world, r) + rest, fill)
    out[:rem] = x[:rem * r].reshape((rem, r) + rest)
    if base:
        out[rem:, :base] = x[rem * r:].reshape((world - rem, base) + rest)
    return out


def _from_owner_blocks(g: Tensor, q: int) -> Tensor:
    """Inverse of ``_to_owner_blocks``: ``[W, ceil(Q/W), ...]`` -> ``[Q, ...]``."""
    world, rest = g.shape[0], tuple(g.shape[2:])
    base, rem = divmod(q, world)
    if rem == 0:
        return g.reshape((q,) + rest)
    parts = [g[:rem].reshape((rem * (base + 1),) + rest)]
    if base:
        parts.append(g[rem:, :base].reshape(((world - rem) * base,) + rest))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


# --- candidate packing ------------------------------------------------------------
def _pack(scores: Tensor, ids: Tensor) -> Tensor:
    """``[Q, 2, C]`` int32: score bits and ids side by side (one collective moves both)."""
    return torch.stack((scores.contiguous().view(torch.int32), ids.contiguous()), dim=1)


def _merge_sources(g: Tensor) -> tuple[Tensor, Tensor]:
    """``[W, n, 2, C]`` (one block per source rank) -> scores fp32 / ids int32 ``[n, W*C]``."""
    world, n, _, c = g.shape
    rows = g.permute(1, 2, 0, 3).reshape(n, 2, world * c)
    return rows[:, 0].contiguous().view(torch.float32), rows[:, 1].contiguous()


# --- validation ---------------------------------------------------------------------
def _check_args(scores: Tensor, ids: Tensor, k: int, group_name: str, op: str,
                world: Optional[int]) -> None:
    if not isinstance(group_name, str):
        raise ValueError(f"tpflare.{op}: group_name must be a str, got {type(group_name).__name__}")
    n_total = None if world is None else world * scores.shape[-1]
    check_candidates(scores, ids, k, f"tpflare.{op}", n_total=n_total, upper=world is not None)


def _world(group_name: str, op: str) -> int:
    try:
        return group_size(group_name)
    except Exception as e:
        raise ValueError(f"tpflare.{op}: group_name={group_name!r} is not a process group "
                         f"this rank belongs to ({e})") from None


def _check_plan(plan: str, op: str, arg: str) -> None:
    if plan not in ID_REPLICATION_PLANS:
        raise ValueError(f"tpflare.{op}: {arg}={plan!r}: expected one of {ID_REPLICATION_PLANS}")


def _no_scores(scores: Tensor) -> Tensor:
    return scores.new_empty((scores.shape[0], 0))


def _fake_outputs(scores: Tensor, ids: Tensor, k: int, with_scores: bool) -> tuple[Tensor, Tensor]:
    q = scores.shape[0]
    return ids.new_empty((q, k)), scores.new_empty((q, k if with_scores else 0))


def _fake_check(scores: Tensor, ids: Tensor, k: int, group_name: str, op: str) -> None:
    try:
        world: Optional[int] = group_size(group_name)
    except Exception:  # tracing without a live group: check what can be checked
        world = None
    _check_args(scores, ids, k, group_name, op, world)


# --- replicated composition ------------------------------------------------------------
def _replicated(scores: Tensor, ids: Tensor, k: int, group_name: str, with_scores: bool,
                op: str, kernel: str) -> tuple[Tensor, Tensor]:
    world = _world(group_name, op)
    _check_args(scores, ids, k, group_name, op, world)
    check_kernel(kernel, f"tpflare.{op}")
    packed = _pack(scores, ids)
    gathered = _all_gather(packed, resolve_group(group_name))
    all_scores, all_ids = _merge_sources(gathered)
    out_ids, out_scores = ordered_select(all_scores, all_ids, k, kernel=kernel)
    return out_ids, (out_scores if with_scores else _no_scores(scores))


def _replicated_op(name: str, doc: str):
    """Register ``tpflare::<name>`` as the replicated composition (with its fake impl)."""
    def impl(scores: Tensor, ids: Tensor, k: int, group_name: str,
             with_scores: bool, select_kernel: str = "torch") -> tuple[Tensor, Tensor]:
        return _replicated(scores, ids, k, group_name, with_scores, name, select_kernel)

    impl.__doc__ = doc
    op = torch.library.custom_op(f"tpflare::{name}", impl, mutates_args=())

    @op.register_fake
    def _(scores, ids, k, group_name, with_scores, select_kernel="torch"):
        _fake_check(scores, ids, k, group_name, name)
        check_kernel(select_kernel, f"tpflare.{name}")
        return _fake_outputs(scores, ids, k, with_scores)

    return op


select_replicated = _replicated_op(
    "select_replicated", "All-gather every rank's candidates; every rank selects every row.")


# --- exact id replication ----------------------------------------------------------------
def _replicate(local: Tensor, q: int, group_name: str, plan: str) -> Tensor:
    op = "replicate_ids"
    if not isinstance(local, Tensor) or local.dtype != torch.int32 or local.dim() != 2:
        raise ValueError(f"tpflare.{op}: local must be a 2-D int32 tensor [ceil(q/W), m], got "
                         f"{getattr(local, 'dtype', type(local))} {tuple(getattr(local, 'shape', ()))}")
    _check_plan(plan, op, "plan")
    world = _world(group_name, op)
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise ValueError(f"tpflare.{op}: q={q!r} must be a positive int")
    r = rows_per_owner(q, world)
    if local.shape[0] != r:
        raise ValueError(f"tpflare.{op}: local has {local.shape[0]} rows, expected "
                         f"ceil(q/W) = {r} (q={q}, W={world})")
    pg = resolve_group(group_name)
    local = local.contiguous()
    m = local.shape[1]
    if plan == "allgather":
        gathered = _all_gather(local, pg)
        return _from_owner_blocks(gathered, q)
    # bf16: bytes 0..255 are exact BF16 integers; only the owner's rows are non-zero,
    # so the sum is exact in any reduction order; decoded bytes give the same int32 bits.
    start, rows = owner_rows(q, world, group_rank(group_name))
    buf = local.new_zeros((q, 4 * m), dtype=torch.bfloat16)
    buf[start:start + rows] = local[:rows].view(torch.uint8).to(torch.bfloat16)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=pg)
    return buf.to(torch.uint8).view(torch.int32)


@torch.library.custom_op("tpflare::replicate_ids", mutates_args=())
def replicate_ids(local: Tensor, q: int, group_name: str, plan: str) -> Tensor:
    """Owner rows (int32 ``[ceil(q/W), m]``) -> int32 ``[q, m]`` on every rank, bit-exact."""
    return _replicate(local, q, group_name, plan)


@replicate_ids.register_fake
def _(local, q, group_name, plan):
    return local.new_empty((q, local.shape[1]))


# --- owner composition --------------------------------------------------------------------
def _owner(scores: Tensor, ids: Tensor, k: int, group_name: str, with_scores: bool,
           id_replication: str, select_kernel: str, op: str) -> tuple[Tensor, Tensor]:
    world = _world(group_name, op)
    _check_args(scores, ids, k, group_name, op, world)
    _check_plan(id_replication, op, "id_replication")
    check_kernel(select_kernel, f"tpflare.{op}")
    q = scores.shape[0]
    send = _to_owner_blocks(_pack(scores, ids), world, fill=-1)  # padding rows: id -1
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send.contiguous(), group=resolve_group(group_name))
    own_scores, own_ids = _merge_sources(recv)
    sel_ids, sel_scores = ordered_select(own_scores, own_ids, k, kernel=select_kernel)
    if not with_scores:
        return _replicate(sel_ids, q, group_name, id_replication), _no_scores(scores)
    both = _replicate(torch.cat((sel_ids, sel_scores.view(torch.int32)), dim=1), q,
                      group_name, id_replication)
    fresh = torch.contiguous_format  # two fresh tensors: outputs may not alias each other
    return (both[:, :k].clone(memory_format=fresh),
            both[:, k:].clone(memory_format=fresh).view(torch.float32))


@torch.library.custom_op("tpflare::select_owner", mutates_args=())
def select_owner(scores: Tensor, ids: Tensor, k: int, group_name: str, with_scores: bool,
                 id_replication: str, select_kernel: str = "torch") -> tuple[Tensor, Tensor]:
    """All-to-all each row's candidates to its owner; the owner selects; replicate exactly."""
    return _owner(scores, ids, k, group_name, with_scores, id_replication, select_kernel, "select_owner")


@select_owner.register_fake
def _(scores, ids, k, group_name, with_scores, id_replication, select_kernel="torch"):
    _fake_check(scores, ids, k, group_name, "select_owner")
    _check_plan(id_replication, "select_owner", "id_replication")
    check_kernel(select_kernel, "tpflare.select_owner")
    return _fake_outputs(scores, ids, k, with_scores)


# --- a table of compositions by row count (sites whose row count is symbolic) -------------
COMPOSITION_NAMES = ("replicated",) + tuple(f"owner/{p}" for p in ID_REPLICATION_PLANS)


def _check_table(rows: list[int], compositions: str, op: str) -> list[str]:
    """The table's composition names (``compositions``: comma-separated, one a row count)."""
    names = compositions.split(",") if isinstance(compositions, str) else []
    if not rows or len(rows) != len(names):
        raise ValueError(f"tpflare.{op}: rows and compositions must be non-empty and of one length, "
                         f"got {len(rows)} and {len(names)}")
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rows) or list(rows) != sorted(set(rows)):
        raise ValueError(f"tpflare.{op}: rows must be ascending distinct positive ints, got {list(rows)}")
    bad = [n for n in names if n not in COMPOSITION_NAMES]
    if bad:
        raise ValueError(f"tpflare.{op}: compositions {bad}: expected each of {COMPOSITION_NAMES}")
    return names


@functools.lru_cache(maxsize=64)
def _table_names(rows: tuple[int, ...], compositions: str) -> tuple[str, ...]:
    # a table checked once, not at every call of the op (its arguments are the graph's constants)
    return tuple(_check_table(list(rows), compositions, "select_by_rows"))


def pick_by_rows(q: int, rows: list[int], names: list[str]) -> str:
    """The composition a call of ``q`` rows runs: the one listed for the smallest row count
    ``>= q``, or for the largest where ``q`` is beyond them all."""
    for r, name in zip(rows, names):
        if q <= r:
            return name
    return names[-1]


@torch.library.custom_op("tpflare::select_by_rows", mutates_args=())
def select_by_rows(scores: Tensor, ids: Tensor, k: int, group_name: str, with_scores: bool,
                   rows: list[int], compositions: str, select_kernel: str = "torch") -> tuple[Tensor, Tensor]:
    """A composition chosen by the call's row count from a table decided at preparation
    (``rows`` ascending; ``compositions``, comma-separated, the one raced at each: ``pick_by_rows``)."""
    op = "select_by_rows"
    name = pick_by_rows(scores.shape[0], rows, _table_names(tuple(rows), compositions))
    if name == "replicated":
        return _replicated(scores, ids, k, group_name, with_scores, op, select_kernel)
    return _owner(scores, ids, k, group_name, with_scores, name.split("/", 1)[1], select_kernel, op)


@select_by_rows.register_fake
def _(scores, ids, k, group_name, with_scores, rows, compositions, select_kernel="torch"):
    _fake_check(scores, ids, k, group_name, "select_by_rows")
    _check_table(rows, compositions, "select_by_rows")
    check_kernel(select_kernel, "tpflare.select_by_rows")
    return _fake_outputs(scores, ids, k, with_scores)


# --- model-facing op --------------------------------------------------------------------
select = _replicated_op(
    "select", "Global top-k candidates on every rank (eager: the replicated composition).")


def select_topk(scores: Tensor, ids: Tensor, k: int, group: Any = None,
                with_scores: bool = False, select_kernel: Optional[str] = None):
    """Global top-``k`` ids ``[Q, k]`` int32 on every rank (``(ids, scores)`` if ``with_scores``).

    ``group``: a ProcessGroup, a group name, or None for the default group. ``select_kernel``: the
    ordered-selection kernel (``torch``/``triton``/``auto``); None: in an eager call the knob
    ``TPFLARE_SELECT_KERNEL``; under ``torch.compile(backend="tpflare")`` the binding replaces it
    with the kernel resolved for the site at preparation (the graph then reads no knob).
    """
    if select_kernel is None:
        if torch.compiler.is_compiling():
            select_kernel = "torch"  # a placeholder the binding replaces
        else:
            from tpflare.config import config

            select_kernel = config.select_kernel
    out_ids, out_scores = torch.ops.tpflare.select(scores, ids, k, group_name_of(group),
                                                   with_scores, select_kernel)
    return (out_ids, out_scores) if with_scores else out_ids


def validate_candidates(scores: Tensor, ids: Tensor, k: int, group: Any = None, *,
                        timeout_s: Optional[float] = None) -> None:
    """Preparation-time check (one agreed gloo exchange, never in the hot path).

    Checks this rank's arguments, then that every rank of the group passes the same
    ``Q``, ``C``, ``k`` and device type; every rank raises if any rank's check fails.
    """
    from tpflare.config import config

    name = group_name_of(group)
    ranks = dist.get_process_group_ranks(resolve_group(name)) if dist.is_initialized() else None

    def local() -> tuple:
        world = _world(name, "validate_candidates")
        _check_args(scores, ids, k, name, "validate_candidates", world)
        return (tuple(scores.shape), k, scores.device.type)

    seen = agree("candidate selection shapes", local, ranks=ranks,
                 timeout_s=config.prep_timeout if timeout_s is None else timeout_s)
    if len(set(seen)) > 1:
        raise ValueError("tpflare.validate_candidates: ranks disagree on (scores shape, k, "
                         "device): " + ", ".join(f"rank {r}: {s}" for r, s in
                                                 zip(ranks or range(len(seen)), seen)))


__all__ = ["select_replicated", "select_owner", "select_by_rows", "replicate_ids", "select", "select_topk",
           "validate_candidates", "owner_rows", "rows_per_owner", "pick_by_rows", "ID_REPLICATION_PLANS",
           "COMPOSITION_NAMES"]
