"""Exact ordered selection: the one routine every selection composition uses.

``ordered_select(scores, ids, k)`` takes candidates ``scores`` fp32 ``[Q, N]`` and
``ids`` int32 ``[Q, N]`` and returns the top ``k`` of each row under the **Order**
rule of DESIGN.md, as ``(ids int32 [Q, k], scores fp32 [Q, k])``:

1. valid (``id >= 0``) before invalid;
2. then score descending under a total order: the IEEE-754 ``totalOrder`` of the
   bits for non-NaN values (``+inf > finite > -inf``, and ``+0.0`` ranks **above**
   ``-0.0``), with every NaN (any sign, any payload) ranking equal, below ``-inf``;
3. then lower id first.

(The Triton kernel in ``select_kernel.py`` implements the same rule; the zero
choice is shared on purpose: every path must agree bit for bit.)

Output slots that hold no valid candidate (fewer than ``k`` valid in the row) are
padding: id ``-1`` and score ``-inf``.  Every other slot carries the selected
candidate's original score bits (NaN payloads included) and id bits.  Valid ids are expected to be unique
within a row (global KV ids); if a valid id appears twice with two NaN scores of
different payloads, either copy's bits may be returned.

The torch implementation packs the rule into one exact int64 key per candidate::

    valid:   bit 63 = 0 | bits 62..31 = ordered score (32 bits) | bits 30..0 = 0x7FFFFFFF - id
    invalid: INT64_MIN (all padding ties; its output is the constant -1 / -inf)

where "ordered score" maps the fp32 bit pattern ``u`` to ``~u`` for negatives and
``u | 0x80000000`` otherwise (order-preserving as unsigned: ``-0.0`` -> ``0x7FFFFFFF``
just below ``+0.0`` -> ``0x80000000``), and every NaN mapped to 0 (below ``-inf``,
whose code is ``0x007FFFFF``).
Valid keys are non-negative and distinct for distinct valid ids, so a sorted
``torch.topk`` on them is deterministic; its indices gather the original bits.
No ``.item()``, no data-dependent shape: CUDA graphs can capture it.

On CUDA, ``kernel="triton"`` / ``"auto"`` (the selection ops' argument, resolved at
preparation from ``TPFLARE_SELECT_KERNEL`` by ``resolve_kernel``) routes to
``ops/select_kernel.py``'s ``triton_ordered_select`` when it imports, reports
``available()`` and supports the shape; it must honour exactly this contract.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

import torch
from torch import Tensor

log = logging.getLogger("tpflare.select")

PAD_ID = -1
PAD_SCORE = float("-inf")

_U32 = 0xFFFFFFFF
_SIGN32 = 0x80000000
_ID_MASK = 0x7FFFFFFF


def check_candidates(scores: Tensor, ids: Tensor, k: int, where: str,
                     n_total: Optional[int] = None, *, upper: bool = True) -> None:
    """Raise ``ValueError`` naming the argument if the candidates break the format.

    Checks metadata only (never reads values): fp32 ``scores`` and int32 ``ids``,
    both 2-D, same shape, same device, ``1 <= k <= n_total`` (``n_total`` = the
    candidates a row has after any exchange; defaults to this tensor's columns;
    ``upper=False`` skips that bound, for tracing without a live group).
    """
    if not isinstance(scores, Tensor):
        raise ValueError(f"{where}: scores must be a tensor, got {type(scores).__name__}")
    if not isinstance(ids, Tensor):
        raise ValueError(f"{where}: ids must be a tensor, got {type(ids).__name__}")
    if scores.dtype != torch.float32:
        raise ValueError(f"{where}: scores must be float32, got {scores.dtype}")
    if ids.dtype != torch.int32:
        raise ValueError(f"{where}: ids must be int32, got {ids.dtype}")
    if scores.dim() != 2:
        raise ValueError(f"{where}: scores must be 2-D [Q, C], got shape {tuple(scores.shape)}")
    if ids.shape != scores.shape:
        raise ValueError(f"{where}: ids shape {tuple(ids.shape)} must equal scores shape "
                         f"{tuple(scores.shape)}")
    if ids.device != scores.device:
        raise ValueError(f"{where}: ids on {ids.device} but scores on {scores.device}")
    if isinstance(k, bool) or not isinstance(k, (int, torch.SymInt)):
        raise ValueError(f"{where}: k must be an int, got {k!r}")
    n = scores.shape[1] if n_total is None else n_total
    if k < 1 or (upper and k > n):
        raise ValueError(f"{where}: k={k} must be in [1, {n}] (candidates per row)")


def order_keys(scores: Tensor, ids: Tensor) -> Tensor:
    """The packed int64 key of every candidate (larger key = earlier in the order)."""
    bits = scores.contiguous().view(torch.int32).to(torch.int64) & _U32
    ordered = torch.where(bits >= _SIGN32, _U32 - bits, bits | _SIGN32)
    is_nan = (bits & _ID_MASK) > 0x7F800000
    ordered = torch.where(is_nan, torch.zeros_like(ordered), ordered)
    ids64 = ids.to(torch.int64)
    key = (ordered << 31) | (_ID_MASK - ids64)
    return torch.where(ids64 >= 0, key, torch.full_like(key, torch.iinfo(torch.int64).min))


def torch_ordered_select(scores: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The torch implementation (CPU and CUDA): packed key + sorted ``torch.topk``."""
    key = order_keys(scores, ids)
    top, idx = torch.topk(key, k, dim=1, largest=True, sorted=True)
    valid = top >= 0
    out_ids = torch.where(valid, ids.gather(1, idx), torch.full_like(idx, PAD_ID, dtype=torch.int32))
    out_scores = torch.where(valid, scores.gather(1, idx),
                             torch.full_like(idx, PAD_SCORE, dtype=torch.float32))
    return out_ids, out_scores


KERNELS = ("torch", "triton", "auto")


@functools.lru_cache(maxsize=1)
def _triton_impl() -> Optional[tuple[Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]],
                                     Callable[[int, int], bool]]]:
    """``(triton_ordered_select, supports(n, k))`` when the kernel can run here, else None."""
    try:
        from . import select_kernel
        from .select_kernel import available, triton_ordered_select
    except ImportError as e:
        log.debug("tpflare.ops.select_kernel not importable (%s): torch ordered selection", e)
        return None
    if not available():
        log.debug("tpflare.ops.select_kernel reports unavailable: torch ordered selection")
        return None
    return triton_ordered_select, select_kernel.supports


def check_kernel(kernel: str, where: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"{where}: kernel={kernel!r}: expected one of {', '.join(KERNELS)}")


def resolve_kernel(choice: str, device: Any, n: int, k: int) -> str:
    """The kernel (``"torch"`` or ``"triton"``) that a selection of ``k`` out of rows of ``n``
    candidates on ``device`` gets under the knob value ``choice`` (``TPFLARE_SELECT_KERNEL``).

    Called at preparation; the result travels as the selection ops' ``kernel`` argument, so a
    compiled graph keeps the kernel it was prepared (and raced) with. ``auto``: Triton where it
    runs (CUDA, Triton importable) and supports the shape; CPU and rows beyond the kernel's
    limits: torch. ``triton``: the same, but an error where Triton cannot run at all.
    """
    check_kernel(choice, "resolve_kernel")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if choice == "torch" or dev.type != "cuda":
        return "torch"
    impl = _triton_impl()
    if impl is None:
        if choice == "triton":
            raise RuntimeError("TPFLARE_SELECT_KERNEL=triton but the Triton selection kernel "
                               "(tpflare.ops.select_kernel) is not importable or not available; "
                               "use 'auto' or 'torch'")
        return "torch"
    if not impl[1](int(n), int(k)):
        log.info("tpflare: ordered selection of k=%d out of %d candidates a row is beyond the Triton "
                 "kernel's limits: torch path", k, n)
        return "torch"
    return "triton"


def ordered_select(scores: Tensor, ids: Tensor, k: int, *, kernel: str = "torch") -> tuple[Tensor, Tensor]:
    """Top ``k`` candidates of every row under the Order rule: ``(ids [Q,k] int32, scores [Q,k] fp32)``.

    ``kernel`` (a value decided at preparation, see ``resolve_kernel``; nothing global is read
    here): ``torch``; ``triton``, the Triton kernels where the row length is within their
    limits (else torch); ``auto``, the same where Triton can run at all (else torch). It only
    matters on CUDA (CPU always uses torch).
    """
    check_candidates(scores, ids, k, "ordered_select")
    check_kernel(kernel, "ordered_select")
    scores, ids = scores.contiguous(), ids.contiguous()
    if scores.is_cuda and kernel != "torch":
        impl = _triton_impl()
        if impl is None and kernel == "triton":
            raise RuntimeError("ordered_select: kernel='triton' but the Triton selection kernel "
                               "(tpflare.ops.select_kernel) is not importable or not available")
        if impl is not None and impl[1](scores.shape[1], k):
            return impl[0](scores, ids, k)
    return torch_ordered_select(scores, ids, k)


__all__ = ["ordered_select", "torch_ordered_select", "resolve_kernel", "order_keys", "check_candidates",
           "check_kernel", "KERNELS", "PAD_ID", "PAD_SCORE"]
