"""Numerics of the latent gather vs the down_reduce it replaces (no processes).

    python bench/latent_numerics.py [--rows 128] [--k 7168] [--n 3584] [--worlds 2 4 8]
                                    [--dtype bfloat16|float16|float32] [--json PATH]

One down projection ``y = x @ W.T`` (x ``[M, K]``, W ``[N, K]``, both BF16
values), simulated for W ranks in one process, against a float64 reference of
the same BF16 inputs:

* **reduce** (today's down_reduce, the seed's exact two-rounding reduce): rank r
  computes its K/W-slice dot product with FP32 accumulation and rounds it to BF16;
  the W BF16 partials are summed in FP32 (rank order) and rounded to BF16 again.
* **ring** (what a BF16 ring all-reduce does): the same BF16 partials, but the
  running sum is rounded to BF16 after every add; column chunk c is accumulated
  in ring order starting at rank c+1 (as in a ring reduce-scatter).
* **gather** (the rewrite): rank r computes its N/W output rows with the full-K
  dot product (FP32 accumulation), rounded to BF16 once; the blocks are copied.

An FP32 matmul of BF16-valued inputs is a BF16 GEMM with FP32 accumulation up to
summation order: every product of two BF16 values (8-bit significands) is exact
in FP32 (24-bit significand), so only the order (and FMA use) of the FP32
additions may differ from a BF16 tensor-core GEMM.

Metrics per path: relative RMS error ``||y - ref|| / ||ref||``, the ratio
gather/reduce (target <= 0.75; the seed measured 0.71 on real weights), and the
share of outputs that are not the correctly rounded value (float64 reference
rounded once to BF16, round-to-nearest-even; target < 0.1 % for gather; seed
0.015 % vs 41 %).

Inputs: ``gaussian`` (x ~ N(0, 1), W ~ N(0, std 1/sqrt(K))) and ``cancelling``
(adversarial: rank pairs (2i, 2i+1) see the same hidden values and nearly
opposite weights, so each rank's partial is large and they cancel: the true
value is ~1/64 of a partial).

``--dtype float16 / float32`` runs the same three paths in that dtype (partials
and outputs rounded to it; the accumulation stays FP32), to show what the rewrite
gains per dtype (docs/latent_gather.md, "Numerics per dtype").
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from tpflare.demo import correctly_rounded

BF16 = torch.bfloat16


def make_inputs(kind: str, m: int, k: int, n: int, seed: int, pair_world: int = 2, dtype=BF16):
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        x = torch.randn(m, k, generator=g).to(dtype)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
        return x, w
    if kind == "cancelling":
        # K is cut into 2*pairs blocks; for every block pair (2i, 2i+1) the hidden
        # values are equal and the weights nearly opposite (w_odd = -w_even + d, d ~ w/64).
        # With W >= 2 ranks whose K-slices are whole blocks, partials of ranks holding
        # the two halves cancel.  pair_world is the block count (use the largest W).
        blocks = pair_world
        kb = k // blocks
        xb = torch.randn(m, kb * blocks // 2, generator=g)
        wb = torch.randn(n, kb * blocks // 2, generator=g) / k ** 0.5
        d = torch.randn(n, kb * blocks // 2, generator=g) / k ** 0.5 / 64
        xs, ws = [], []
        for i in range(blocks // 2):
            sl = slice(i * kb, (i + 1) * kb)
            xs += [xb[:, sl], xb[:, sl]]
            ws += [wb[:, sl], -wb[:, sl] + d[:, sl]]
        # all "+" blocks first, all "-" blocks last: for every W dividing `blocks`, the
        # ranks of the first half hold the "+" halves and those of the second half cancel them.
        plus = list(range(0, blocks, 2))
        minus = list(range(1, blocks, 2))
        order = plus + minus
        x = torch.cat([xs[j] for j in order], dim=1).to(dtype)
        w = torch.cat([ws[j] for j in order], dim=1).to(dtype)
        return x, w
    raise ValueError(kind)


def reduce_path(x: torch.Tensor, w: torch.Tensor, world: int, ring: bool) -> torch.Tensor:
    k = x.shape[1]
    ks = k // world
    dt = x.dtype
    partials = [(x[:, r * ks:(r + 1) * ks].float() @ w[:, r * ks:(r + 1) * ks].float().T).to(dt)
                for r in range(world)]
    if not ring:
        acc = partials[0].float()
        for p in partials[1:]:
            acc = acc + p.float()
        return acc.to(dt)
    n = w.shape[0]
    out = torch.empty(x.shape[0], n, dtype=dt)
    bounds = [(c * n // world, (c + 1) * n // world) for c in range(world)]
    for c, (c0, c1) in enumerate(bounds):
        order = [(c + 1 + j) % world for j in range(world)]
        acc = partials[order[0]][:, c0:c1]
        for r in order[1:]:
            acc = (acc.float() + partials[r][:, c0:c1].float()).to(dt)
        out[:, c0:c1] = acc
    return out


def gather_path(x: torch.Tensor, w: torch.Tensor, world: int) -> torch.Tensor:
    n = w.shape[0]
    ns = n // world
    xf = x.float()
    return torch.cat([(xf @ w[r * ns:(r + 1) * ns].float().T).to(x.dtype) for r in range(world)], dim=1)


def metrics(y: torch.Tensor, ref: torch.Tensor, rounded: torch.Tensor) -> dict:
    d = y.double() - ref
    return dict(rel_rms=(d.norm() / ref.norm()).item(),
                max_abs=d.abs().max().item(),
                not_correctly_rounded=(y != rounded).double().mean().item())


def run(rows: int, k: int, n: int, worlds: list[int], seed: int, dtype=BF16) -> list[dict]:
    results = []
    for kind in ("gaussian", "cancelling"):
        x, w = make_inputs(kind, rows, k, n, seed, pair_world=max(worlds), dtype=dtype)
        ref = x.double() @ w.double().T
        rounded = correctly_rounded(ref, dtype)
        for world in worlds:
            if k % world or n % world:
                raise SystemExit(f"K={k} and N={n} must divide by W={world}")
            red = metrics(reduce_path(x, w, world, ring=False), ref, rounded)
            ring = metrics(reduce_path(x, w, world, ring=True), ref, rounded)
            gat = metrics(gather_path(x, w, world), ref, rounded)
            results.append(dict(input=kind, W=world, M=rows, K=k, N=n, reduce=red, ring=ring, gather=gat,
                                ratio_gather_reduce=gat["rel_rms"] / red["rel_rms"],
                                ratio_gather_ring=gat["rel_rms"] / ring["rel_rms"]))
    return results


def format_table(results: list[dict]) -> str:
    head = ("| input | W | rel RMS reduce | rel RMS ring | rel RMS gather | gather/reduce | gather/ring "
            "| not corr. rounded: reduce | ring | gather |")
    lines = [head, "| --- " * 10 + "|"]
    for r in results:
        lines.append(
            f"| {r['input']} | {r['W']} | {r['reduce']['rel_rms']:.3e} | {r['ring']['rel_rms']:.3e} "
            f"| {r['gather']['rel_rms']:.3e} | {r['ratio_gather_reduce']:.3f} | {r['ratio_gather_ring']:.3f} "
            f"| {100 * r['reduce']['not_correctly_rounded']:.3f} % | {100 * r['ring']['not_correctly_rounded']:.3f} % "
            f"| {100 * r['gather']['not_correctly_rounded']:.4f} % |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128, help="M (default 128)")
    p.add_argument("--k", type=int, default=7168, help="hidden width K (default 7168)")
    p.add_argument("--n", type=int, default=3584, help="latent width N (default 3584)")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = run(args.rows, args.k, args.n, args.worlds, args.seed, getattr(torch, args.dtype))
    elapsed = time.perf_counter() - t0
    print(f"latent numerics: M={args.rows} K={args.k} N={args.n}, {args.dtype} inputs, float64 reference, "
          f"torch {torch.__version__}, {elapsed:.1f} s")
    print(format_table(results))
    g = [r for r in results if r["input"] == "gaussian"]
    worst = max(r["ratio_gather_reduce"] for r in g)
    miss = max(r["gather"]["not_correctly_rounded"] for r in g)
    print(f"gaussian: worst gather/reduce ratio {worst:.3f} (target <= 0.75, seed 0.71); "
          f"worst gather miss rate {100 * miss:.4f} % (target < 0.1 %, seed 0.015 %)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, machine=platform.machine(), python=sys.version.split()[0],
                           threads=torch.get_num_threads(), seconds=elapsed, args=vars(args), results=results),
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
