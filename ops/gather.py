"""Column gather and row reshard: the collectives of the latent-gather rewrite.

``column_gather``: every rank holds ``[M, n]`` (its output columns); every rank
gets ``[M, W*n]`` with rank r's block at columns ``r*n:(r+1)*n``.  A copy, so
all ranks hold identical bits.  The transport gathers the *transposed* blocks
(``[n, M]`` per rank, rank-major into ``[W*n, M]``), which is exactly the
column-major layout of ``[M, W*n]``: the result is returned as that transposed
view, so no rank-major-to-column layout copy is ever made.  When the input is
itself a transposed view of a contiguous ``[n, M]`` (what the rewrite's GEMM
produces) nothing is copied on the way in either.

``reshard_rows`` (preparation only): from every rank's column shard
``W[:, K_r]`` (``[N, K/W]``) build this rank's row shard ``W[N_r, :]``
(``[N/W, K]``) with one all-to-all.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from tpflare.distributed import group_size, resolve_group

# all_gather_single replaces the deprecated all_gather_into_tensor in newer torch
_all_gather_base = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _check_world(world: int, group_name: str, op: str) -> None:
    actual = group_size(group_name)
    if actual != world:
        raise ValueError(f"tpflare.{op}: world={world} but group {group_name!r} has {actual} ranks")


@torch.library.custom_op("tpflare::column_gather", mutates_args=())
def column_gather(x: Tensor, world: int, group_name: str) -> Tensor:
    """``[M, n]`` per rank -> ``[M, world*n]`` (column-major result, no layout copy)."""
    if x.dim() != 2:
        raise ValueError(f"tpflare.column_gather: x must be 2-D [M, n], got shape {tuple(x.shape)}")
    _check_world(world, group_name, "column_gather")
    m, n = x.shape
    xt = x.t().contiguous()  # no-op when x is the transpose of a contiguous [n, M]
    out = x.new_empty((world * n, m))
    _all_gather_base(out, xt, group=resolve_group(group_name))
    return out.t()


@column_gather.register_fake
def _(x: Tensor, world: int, group_name: str) -> Tensor:
    torch._check(x.dim() == 2, lambda: "tpflare.column_gather: x must be 2-D")
    m, n = x.shape
    return x.new_empty_strided((m, world * n), (1, m))


@torch.library.custom_op("tpflare::reshard_rows", mutates_args=())
def reshard_rows(w_col: Tensor, world: int, group_name: str) -> Tensor:
    """This rank's column shard ``[N, K/W]`` -> this rank's row shard ``[N/W, K]``."""
    if w_col.dim() != 2:
        raise ValueError(
            f"tpflare.reshard_rows: w_col must be 2-D [N, K/W], got {tuple(w_col.shape)}")
    _check_world(world, group_name, "reshard_rows")
    n, kw = w_col.shape
    if n % world:
        raise ValueError(f"tpflare.reshard_rows: N={n} rows do not divide by world={world}")
    send = w_col.contiguous().view(world, n // world, kw)  # chunk r goes to rank r
    recv = torch.empty_like(send)  # chunk s came from rank s: W[N_r, K_s]
    dist.all_to_all_single(recv, send, group=resolve_group(group_name))
    return recv.permute(1, 0, 2).reshape(n // world, world * kw)


@reshard_rows.register_fake
def _(w_col: Tensor, world: int, group_name: str) -> Tensor:
    n, kw = w_col.shape
    return w_col.new_empty((n // world, world * kw))


def column_gather_reference_layout(x: Tensor, world: int, group_name: str) -> Tensor:
    """Eager helper: rank-major all-gather + layout copy (what the rewrite avoids).

    Used by benchmarks to price the copy; not used by the rewrite.
    """
    m, n = x.shape
    out = x.new_empty((world * m, n))
    _all_gather_base(out, x.contiguous(), group=resolve_group(group_name))
    return out.view(world, m, n).permute(1, 0, 2).reshape(m, world * n)


__all__ = ["column_gather", "reshard_rows", "column_gather_reference_layout"]
