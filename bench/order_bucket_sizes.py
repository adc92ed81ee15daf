"""The largest bucket of the row kernel's ordering (``radix.order_row``'s first level), on the CPU.

    python bench/order_bucket_sizes.py [--n 16384] [--k 2048] [--rows 64] [--patterns random,ties,short]

For each row of ``bench_select_kernel.make_inputs`` the k winners' packed keys (``ordering.order_keys``)
are mapped as the kernel maps them: ``(hi - key) >> sh`` with ``sh`` the bit length of
``(hi - lo) // NB``, for NB = KB and 2 KB buckets (``select_kernel.ORDER_BUCKETS``). The in-bucket
count takes as many steps as the largest bucket holds (past ``radix.SPLIT``, the kernel splits
every bucket again, which this script does not follow: it prints those rows' count).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_select_kernel import make_inputs  # noqa: E402

from tpflare.ops.ordering import order_keys  # noqa: E402
from tpflare.ops.radix import SPLIT  # noqa: E402  (radix needs Triton installed, not a GPU)


def largest_bucket(key: torch.Tensor, nb: int) -> int:
    hi, lo = int(key.max()), int(key.min())
    sh = ((hi - lo) // nb).bit_length()
    return int(torch.bincount((hi - key) >> sh, minlength=nb).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--patterns", default="random,ties,short")
    a = ap.parse_args(argv)
    kb = max(2, 1 << (a.k - 1).bit_length())
    for pattern in a.patterns.split(","):
        scores, ids = make_inputs(a.rows, a.n, pattern, seed=a.n + a.k, device="cpu")
        top = torch.topk(order_keys(scores, ids), a.k, dim=1).values
        for nb in (kb, 2 * kb):
            big = [largest_bucket(row, nb) for row in top]
            print(f"{pattern:7s} N={a.n} k={a.k} {nb} buckets: largest bucket median {statistics.median(big):g}, "
                  f"max {max(big)}; rows past SPLIT ({SPLIT.value}): {sum(b > SPLIT.value for b in big)} of {a.rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
