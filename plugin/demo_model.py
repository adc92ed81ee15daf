"""A small decoder layer for the demo, the serving example, tests and benches.

One layer = a DeepSeek-V3.2-style sparse-attention block (an indexer picks the
top-k KV positions per query row, attention runs over those only) followed by a
LatentMoE block.  The model and its parallelism are kept apart (gpt-fast /
torchtitan style): ``*Weights`` are full, seeded weights plus a float64
reference forward; ``*TP`` modules are one rank's share, built from them for
``(rank, world, group)``.

**LatentMoE block** (``LatentMoEWeights`` / ``LatentMoETP``):

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

**Sparse attention with an indexer** (``SparseAttentionWeights`` /
``SparseAttentionTP``), context-parallel over KV positions as in decode context
parallelism: KV position ``p`` lives on rank ``p % W`` (round-robin).  Per query
row (at absolute position ``pos[m]``, causal: it sees positions ``<= pos[m]``):

1. indexer: ``score[m, t] = sum_h w[m, h] * relu(q_idx[m, h] . k_idx[t])`` (fp32)
   for this rank's positions ``t``; masked positions are padding (id ``-1``);
2. this rank keeps its top-``C`` (score, global id) candidates under tpflare's
   Order rule (``torch_ordered_select``; with ``C >= k`` the global top-k of the
   union is the global top-k of every position);
3. ``tpflare.select_topk`` gives every rank the same global top-``k`` ids
   (``-1`` padded when a row sees fewer than ``k`` positions);
4. each rank attends over the selected positions it holds (all heads) and
   returns partial softmax statistics ``(max, sum, weighted V)``; one
   all-gather and a log-sum-exp combine give every rank the same bits;
5. ``x + o_proj(attention)``: the replicated hidden row of the MoE block.

``DecoderWeights`` / ``DecoderLayerTP`` chain the two blocks; ``DecoderWeights.reference``
is the float64 forward of the whole layer (its own float64 selection and routing, or
forced to the ones a BF16 path made).
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


# --- sparse attention with an indexer (DeepSeek-V3.2 style) -----------------------------------
@dataclasses.dataclass
class SparseAttentionWeights:
    """Full weights and KV cache of the sparse-attention block (A = heads * head_dim)."""

    wq: torch.Tensor            # [A, H]
    wo: torch.Tensor            # [H, A]
    wq_idx: torch.Tensor        # [I * D, H]  indexer queries: I heads of width D
    w_idx: torch.Tensor         # [I, H]      indexer head weights (per query row)
    k_idx: torch.Tensor         # [T, D]      indexer keys of the T cached positions
    k_cache: torch.Tensor       # [T, A]
    v_cache: torch.Tensor       # [T, A]
    heads: int
    index_heads: int
    top_k: int                  # positions selected per query row
    candidates: int             # C: candidates each rank keeps per row (>= top_k)

    @property
    def positions(self) -> int:
        return self.k_cache.shape[0]

    @property
    def head_dim(self) -> int:
        return self.wq.shape[0] // self.heads

    @classmethod
    def create(cls, hidden: int = 1024, positions: int = 512, heads: int = 4, head_dim: int = 64,
               index_heads: int = 4, index_dim: int = 64, top_k: int = 32, candidates: int | None = None,
               seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> "SparseAttentionWeights":
        g = torch.Generator().manual_seed(seed + 7919)
        a = heads * head_dim

        def init(*shape: int, fan_in: int = 1) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / fan_in ** 0.5).to(dtype)

        c = top_k if candidates is None else candidates
        if c < top_k:
            raise ValueError(f"candidates per rank C={c} must be >= top_k={top_k} (else the global top-k "
                             "of the candidates is not the global top-k of the positions)")
        return cls(wq=init(a, hidden, fan_in=hidden), wo=init(hidden, a, fan_in=a),
                   wq_idx=init(index_heads * index_dim, hidden, fan_in=hidden),
                   w_idx=init(index_heads, hidden, fan_in=hidden), k_idx=init(positions, index_dim),
                   k_cache=init(positions, a), v_cache=init(positions, a), heads=heads,
                   index_heads=index_heads, top_k=top_k, candidates=c)

    def reference(self, x: torch.Tensor, pos: torch.Tensor, selected: torch.Tensor | None = None):
        """Float64 block over every position: ``(output [M, H], selected ids [M, k] int64)``.

        ``selected`` forces the positions attended to (e.g. the ones a BF16 path selected),
        so outputs can be compared without near-tie selection flips.
        """
        d = torch.float64
        x = x.to(d)
        scores = index_scores(x, self.wq_idx.to(d), self.w_idx.to(d), self.k_idx.to(d), self.index_heads)
        visible = torch.arange(self.positions)[None, :] <= pos.cpu()[:, None]
        if selected is None:
            selected = _reference_top_k(scores, visible, self.top_k)
        selected = selected.cpu().long()
        m, hd = x.shape[0], self.head_dim
        take = selected.clamp(min=0)
        keys = self.k_cache.to(d)[take].view(m, self.top_k, self.heads, hd)
        values = self.v_cache.to(d)[take].view(m, self.top_k, self.heads, hd)
        q = F.linear(x, self.wq.to(d)).view(m, self.heads, hd)
        mx, total, o = attend_partial(q, keys, values, selected >= 0, hd ** -0.5)
        attn = (o / total[..., None]).reshape(m, -1)
        return x + F.linear(attn, self.wo.to(d)), selected


def _reference_top_k(scores: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    """Float64 top-k positions per row: score descending, lower position first, invisible last (-1)."""
    order = torch.sort(scores.masked_fill(~visible, float("-inf")), dim=1, descending=True, stable=True).indices
    order = order[:, :k]
    return torch.where(torch.arange(k)[None, :] < visible.sum(1, keepdim=True), order, torch.full_like(order, -1))


def index_scores(x: torch.Tensor, wq_idx: torch.Tensor, w_idx: torch.Tensor, k_idx: torch.Tensor,
                 index_heads: int) -> torch.Tensor:
    """Indexer scores ``[M, T]`` of rows ``x [M, H]`` against keys ``k_idx [T, D]`` (fp32; float64 stays):
    ``sum_h w[m, h] * relu(q[m, h] . k[t])``, scaled by ``(I * D) ** -0.5``."""
    m, dim = x.shape[0], k_idx.shape[1]
    q = _acc(F.linear(x, wq_idx)).view(m, index_heads, dim)
    w = _acc(F.linear(x, w_idx)) * (index_heads * dim) ** -0.5
    return torch.einsum("mi,mit->mt", w, F.relu(torch.einsum("mid,td->mit", q, _acc(k_idx))))


def attend_partial(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   scale: float):
    """Softmax statistics over the positions ``mask`` keeps: ``q [M, h, d]``, ``keys`` / ``values``
    ``[M, k, h, d]``, ``mask [M, k]`` -> ``(max [M, h], sum [M, h], weighted values [M, h, d])``
    of ``exp(logit - max)``; a row with nothing kept gives ``(-inf, 0, 0)``."""
    logits = torch.einsum("mhd,mkhd->mhk", _acc(q), _acc(keys)) * scale
    logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
    mx = logits.amax(-1)
    p = torch.exp(logits - torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))[..., None])
    return mx, p.sum(-1), torch.einsum("mhk,mkhd->mhd", p, _acc(values))


def combine_partials(mx: torch.Tensor, total: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp combine of W ranks' ``attend_partial`` (stacked on dim 0) -> ``[M, h, d]``."""
    scale = torch.exp(mx - mx.amax(0))                   # a rank with nothing kept: exp(-inf) = 0
    return (scale[..., None] * o).sum(0) / (scale * total).sum(0)[..., None]


# all_gather_single replaces the deprecated all_gather_into_tensor in newer torch.
_all_gather_base = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class SparseAttentionTP(nn.Module):
    """One rank's sparse-attention block: KV positions ``p`` with ``p % W == rank`` (see the module
    docstring); weights replicated."""

    def __init__(self, full: SparseAttentionWeights, rank: int, world: int, group: Any = None) -> None:
        super().__init__()
        from tpflare.distributed import group_name_of

        if full.positions % world:
            raise ValueError(f"T={full.positions} positions must divide by W={world}")
        if full.candidates > full.positions // world:
            raise ValueError(f"C={full.candidates} candidates > {full.positions // world} positions per rank")
        self.rank, self.world, self.group = rank, world, group
        self.group_name = group_name_of(group)
        self.heads, self.head_dim, self.index_heads = full.heads, full.head_dim, full.index_heads
        self.top_k, self.candidates = full.top_k, full.candidates

        def p(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.contiguous().clone(), requires_grad=False)

        self.wq, self.wo, self.wq_idx, self.w_idx = p(full.wq), p(full.wo), p(full.wq_idx), p(full.w_idx)
        for name in ("k_idx", "k_cache", "v_cache"):             # this rank's positions
            self.register_buffer(name, getattr(full, name)[rank::world].contiguous().clone())
        self.register_buffer("position_ids", torch.arange(rank, full.positions, world, dtype=torch.int32))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, internals: bool = False):
        """``x [M, H]`` (replicated), ``pos [M]`` (each row's position) -> ``x + attention``; with
        ``internals`` also ``(candidate scores [M, C], candidate ids [M, C], selected ids [M, k])``."""
        import tpflare
        from tpflare.ops.ordering import torch_ordered_select

        m = x.shape[0]
        scores = index_scores(x, self.wq_idx, self.w_idx, self.k_idx, self.index_heads)
        visible = self.position_ids[None, :] <= pos[:, None]                   # causal
        ids = torch.where(visible, self.position_ids[None, :], -1)
        cand_ids, cand_scores = torch_ordered_select(scores.masked_fill(~visible, float("-inf")), ids,
                                                     self.candidates)
        selected = tpflare.select_topk(cand_scores, cand_ids, self.top_k, group=self.group_name)
        mine = (selected >= 0) & (selected % self.world == self.rank)
        slot = torch.where(mine, selected // self.world, 0).long()
        keys = self.k_cache[slot].view(m, self.top_k, self.heads, self.head_dim)
        values = self.v_cache[slot].view(m, self.top_k, self.heads, self.head_dim)
        q = F.linear(x, self.wq).view(m, self.heads, self.head_dim)
        mx, total, o = attend_partial(q, keys, values, mine, self.head_dim ** -0.5)
        part = torch.cat((mx[..., None], total[..., None], o), dim=-1)        # [M, h, d + 2] fp32
        everyone = part.new_empty((self.world * m,) + tuple(part.shape[1:]))
        _all_gather_base(everyone, part, group=self.group)
        everyone = everyone.view((self.world,) + tuple(part.shape))
        attn = combine_partials(everyone[..., 0], everyone[..., 1], everyone[..., 2:])
        out = x + F.linear(attn.reshape(m, -1).to(x.dtype), self.wo)
        return (out, (cand_scores, cand_ids, selected)) if internals else out


# --- one decoder layer: sparse attention, then LatentMoE -------------------------------------------
@dataclasses.dataclass
class DecoderWeights:
    """Full weights of one decoder layer (identical on every rank for a seed)."""

    attention: SparseAttentionWeights
    moe: LatentMoEWeights

    @property
    def hidden(self) -> int:
        return self.moe.hidden

    @classmethod
    def create(cls, hidden: int = 1024, latent: int = 512, experts: int = 4, expert_hidden: int = 512,
               positions: int = 512, heads: int = 4, head_dim: int = 64, index_heads: int = 4,
               index_dim: int = 64, top_k: int = 32, candidates: int | None = None, seed: int = 0,
               dtype: torch.dtype = torch.bfloat16) -> "DecoderWeights":
        return cls(SparseAttentionWeights.create(hidden, positions, heads, head_dim, index_heads, index_dim,
                                                 top_k, candidates, seed, dtype),
                   LatentMoEWeights.create(hidden, latent, experts, expert_hidden, seed, dtype))

    def inputs(self, rows: int, seed: int = 1) -> torch.Tensor:
        return self.moe.inputs(rows, seed)

    def reference(self, x: torch.Tensor, pos: torch.Tensor, selected: torch.Tensor | None = None,
                  experts: torch.Tensor | None = None):
        """Float64 layer: ``(output, latent, expert ids [M, top_k], selected positions [M, k])``;
        ``selected`` / ``experts`` force the attended positions / the routing."""
        h, sel = self.attention.reference(x, pos, selected)
        out, lat, idx = self.moe.reference(h, experts)
        return out, lat, idx, sel


class DecoderLayerTP(nn.Module):
    """One rank's decoder layer: ``SparseAttentionTP`` then ``LatentMoETP``."""

    def __init__(self, full: DecoderWeights, rank: int, world: int, group: Any = None) -> None:
        super().__init__()
        self.attention = SparseAttentionTP(full.attention, rank, world, group)
        self.moe = LatentMoETP(full.moe, rank, world, group)

    def register_row_shards(self) -> None:
        self.moe.register_row_shards()

    def forward(self, x: torch.Tensor, pos: torch.Tensor, internals: bool = False):
        """``x [M, H]``, ``pos [M]`` -> output ``[M, H]``; with ``internals``: ``(output, MoE input h,
        latent, expert ids, candidate scores, candidate ids, selected ids)``."""
        h, (cand_scores, cand_ids, selected) = self.attention(x, pos, internals=True)
        if not internals:
            return self.moe(h)
        out, lat, idx = self.moe(h, with_latent=True)
        return out, h, lat, idx, cand_scores, cand_ids, selected


__all__ = ["LatentMoEWeights", "LatentMoETP", "SparseAttentionWeights", "SparseAttentionTP",
           "DecoderWeights", "DecoderLayerTP", "index_scores", "attend_partial", "combine_partials"]
