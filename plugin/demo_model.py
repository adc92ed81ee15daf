"""A small LatentMoE-style layer for the demo, tests and benches.

The model and its parallelism are kept apart:

* ``LatentMoEWeights`` is the full-weight description (seeded, deterministic,
  BF16 by default) plus a float64 reference forward of the whole layer.
* ``LatentMoETP`` is the tensor-parallel module of one rank, built from it for
  ``(rank, world, group)``:

  ``x [M, H]`` (replicated) -> ``latent_down`` (``nn.Linear`` layout, column shard
  ``[L, H/W]``) on this rank's K-slice ``x[..., r*H/W:(r+1)*H/W]`` ->
  ``all_reduce`` (**down_reduce**) -> router (replicated, top-2, softmax over the
  two) -> dense dispatch over E experts (``w_in [E, F/W, L]``, ``w_out [E, L, F/W]``:
  sharded over the expert hidden dim F) -> ``all_reduce`` (**expert_reduce**) ->
  RMS norm -> ``latent_up`` (``[H, L]``, replicated) + residual.

  It also holds ``latent_down_rows`` (``[L/W, H]``, this rank's row shard of the
  same weight, like the seed's decode copy); ``register_row_shards()`` hands it
  to ``tpflare.register_row_shard`` so the latent gather needs no new memory.

Default sizes (H=1024, L=512, E=4, F=512) satisfy ``H % W == 0`` and
``L % (64*W) == 0`` for W in {2, 4, 8}.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class LatentMoEWeights:
    """Full (unsharded) weights of one layer; identical on every rank for a seed."""

    latent_down: torch.Tensor   # [L, H]
    router: torch.Tensor        # [E, L]
    w_in: torch.Tensor          # [E, F, L]
    w_out: torch.Tensor         # [E, L, F]
    norm: torch.Tensor          # [L]
    latent_up: torch.Tensor     # [H, L]
    top_k: int = 2
    eps: float = 1e-6

    @property
    def hidden(self) -> int:
        return self.latent_down.shape[1]

    @property
    def latent(self) -> int:
        return self.latent_down.shape[0]

    @property
    def experts(self) -> int:
        return self.router.shape[0]

    @property
    def expert_hidden(self) -> int:
        return self.w_in.shape[1]

    @classmethod
    def create(cls, hidden: int = 1024, latent: int = 512, experts: int = 4, expert_hidden: int = 512,
               seed: int = 0, dtype: torch.dtype = torch.bfloat16, top_k: int = 2) -> "LatentMoEWeights":
        g = torch.Generator().manual_seed(seed)

        def init(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / fan_in ** 0.5).to(dtype)

        return cls(
            latent_down=init(latent, hidden, fan_in=hidden),
            router=init(experts, latent, fan_in=latent),
            w_in=init(experts, expert_hidden, latent, fan_in=latent),
            w_out=init(experts, latent, expert_hidden, fan_in=expert_hidden),
            norm=(1.0 + 0.1 * torch.randn(latent, generator=g)).to(dtype),
            latent_up=init(hidden, latent, fan_in=latent),
            top_k=top_k,
        )

    def inputs(self, rows: int, seed: int = 1) -> torch.Tensor:
        """A replicated hidden batch ``[rows, H]`` (same on every rank for a seed)."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(rows, self.hidden, generator=g).to(self.latent_down.dtype)

    def reference(self, x: torch.Tensor, experts: torch.Tensor | None = None):
        """Float64 forward of the whole layer: ``(output, latent, expert ids [M, top_k])``.

        ``experts`` forces each row's expert choice (e.g. the one a BF16 path made),
        so that outputs can be compared without near-tie routing flips.
        """
        d = torch.float64
        return _forward_math(x.to(d), self.latent_down.to(d).T, self.router.to(d), self.w_in.to(d),
                             self.w_out.to(d), self.norm.to(d), self.latent_up.to(d), self.top_k,
                             self.eps, experts)


def _acc(t: torch.Tensor) -> torch.Tensor:
    """FP32 for low-precision tensors; float64 stays float64 (the reference)."""
    return t if t.dtype == torch.float64 else t.float()


def _route(lat: torch.Tensor, router: torch.Tensor, top_k: int, experts: torch.Tensor | None = None):
    """Dense gate weights ``[M, E]`` (softmax over each row's top-k router logits, 0
    elsewhere) and the chosen expert ids ``[M, top_k]`` (``experts`` forces them)."""
    logits = _acc(F.linear(lat, router))
    idx = torch.topk(logits, top_k, dim=-1).indices if experts is None else experts.to(logits.device)
    vals = logits.gather(-1, idx)
    return torch.zeros_like(logits).scatter(-1, idx, torch.softmax(vals, dim=-1)), idx


def _experts(lat: torch.Tensor, gates: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    h = F.silu(torch.einsum("ml,efl->emf", lat, w_in))
    y = torch.einsum("emf,elf->eml", h, w_out)
    return (gates.T.to(y.dtype).unsqueeze(-1) * y).sum(0)


def _rms_norm(t: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    tf = _acc(t)
    out = tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + eps)
    return out.to(t.dtype) * weight


def _forward_math(x, down_t, router, w_in, w_out, norm, up, top_k, eps, experts=None):
    """The unsharded layer (used by the float64 reference)."""
    lat = x @ down_t
    gates, idx = _route(lat, router, top_k, experts)
    moe = _experts(lat, gates, w_in, w_out)
    return x + F.linear(_rms_norm(moe, norm, eps), up), lat, idx


class LatentMoETP(nn.Module):
    """One rank's tensor-parallel LatentMoE layer (see the module docstring)."""

    def __init__(self, full: LatentMoEWeights, rank: int, world: int, group: Any = None) -> None:
        super().__init__()
        h, lat, fh = full.hidden, full.latent, full.expert_hidden
        if h % world or lat % world or fh % world:
            raise ValueError(f"H={h}, L={lat}, F={fh} must all divide by W={world}")
        self.rank, self.world, self.group = rank, world, group
        self.top_k, self.eps = full.top_k, full.eps
        ks, ls, fs = h // world, lat // world, fh // world
        self.k_lo, self.k_hi = rank * ks, (rank + 1) * ks

        def p(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.contiguous().clone(), requires_grad=False)

        self.latent_down = p(full.latent_down[:, self.k_lo:self.k_hi])            # [L, H/W] column shard
        self.latent_down_rows = p(full.latent_down[rank * ls:(rank + 1) * ls])    # [L/W, H] row shard
        self.router = p(full.router)                                               # replicated
        self.w_in = p(full.w_in[:, rank * fs:(rank + 1) * fs])                     # [E, F/W, L]
        self.w_out = p(full.w_out[:, :, rank * fs:(rank + 1) * fs])                # [E, L, F/W]
        self.norm = p(full.norm)
        self.latent_up = p(full.latent_up)                                         # replicated

    def register_row_shards(self) -> None:
        """Tell tpflare that ``latent_down_rows`` is this rank's row shard of ``latent_down``."""
        import tpflare

        tpflare.register_row_shard(self.latent_down, self.latent_down_rows, name="latent_down_rows",
                                   world=self.world)

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        return t

    def forward(self, x: torch.Tensor, with_latent: bool = False):
        """``x [M, H]`` -> output ``[M, H]``; with ``with_latent`` also the reduced latent
        ``[M, L]`` and the chosen expert ids ``[M, top_k]``."""
        lat = F.linear(x[..., self.k_lo:self.k_hi], self.latent_down)   # K-slice partials
        lat = self._all_reduce(lat)                                      # down_reduce
        gates, idx = _route(lat, self.router, self.top_k)
        moe = self._all_reduce(_experts(lat, gates, self.w_in, self.w_out))  # expert_reduce
        out = x + F.linear(_rms_norm(moe, self.norm, self.eps), self.latent_up)
        return (out, lat, idx) if with_latent else out


__all__ = ["LatentMoEWeights", "LatentMoETP"]
