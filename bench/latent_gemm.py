"""GEMM shapes of the latent-gather rewrite, one GPU (no communication).

    python bench/latent_gemm.py --json gemm.json          # M in {1024, 3072}, K=7168, N=3584, W=8

Rows:
  kslice      the GEMM the rewrite replaces: x[:, K_r] [M, K/W] @ W_col^T [K/W, N]
  rows_rm     full-K GEMM with the row shard, row-major output: x [M, K] @ R^T [K, N/W]
  rows_rm+cp  rows_rm + the layout copy a rank-major all-gather needs ([W, M, N/W] -> [M, N])
  tpflare     what the rewrite emits: R [N/W, K] @ x^T -> [N/W, M]; the all-gather of these
              blocks *is* the column-major [M, N] result, so there is no layout copy
Target: tpflare within 1.10x of kslice.  CUDA events, 10 warm-up calls, median of --iters.
"""
from __future__ import annotations

import argparse
import json

import torch

from tpflare.timing import median_ms


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 3072])
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--n", type=int, default=3584)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    dev, bf = torch.device("cuda"), torch.bfloat16
    k, n, w = a.k, a.n, a.world
    wcol = torch.randn(n, k // w, device=dev, dtype=bf)
    rows = torch.randn(n // w, k, device=dev, dtype=bf)
    res = []

    def _time(fn, iters):  # one GPU, no collective: no barrier
        return median_ms(fn, 10, iters, dev, barrier=False)

    print(f"{'M':>6} {'kslice':>9} {'rows_rm':>9} {'rows_rm+cp':>11} {'tpflare':>9} {'tpflare/kslice':>15}  (ms, {torch.cuda.get_device_name()})")
    for m in a.rows:
        x = torch.randn(m, k, device=dev, dtype=bf)
        xs = x[:, : k // w]
        gathered = torch.empty(w, m, n // w, device=dev, dtype=bf)
        t_k = _time(lambda: torch.mm(xs, wcol.t()), a.iters)
        t_r = _time(lambda: torch.mm(x, rows.t()), a.iters)
        t_c = _time(lambda: gathered.permute(1, 0, 2).reshape(m, n), a.iters)
        t_t = _time(lambda: torch.mm(rows, x.t()), a.iters)
        row = dict(M=m, K=k, N=n, W=w, kslice_ms=t_k, rows_rowmajor_ms=t_r, layout_copy_ms=t_c,
                   rows_rowmajor_plus_copy_ms=t_r + t_c, tpflare_ms=t_t, tpflare_over_kslice=t_t / t_k)
        res.append(row)
        print(f"{m:>6} {t_k:>9.4f} {t_r:>9.4f} {t_r + t_c:>11.4f} {t_t:>9.4f} {t_t / t_k:>15.3f}")
    if a.json:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=res),
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
