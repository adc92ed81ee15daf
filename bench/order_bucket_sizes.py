"""The largest bucket of the row kernel's ordering (``radix.order_row``'s first level), on the CPU.

    python bench/order_bucket_sizes.py [--n 16384] [--k 2048] [--rows 64] [--patterns random,ties,short]

For each row of ``bench_select_kernel.make_inputs`` the k winners' packed keys (``ordering.order_keys``)
are mapped as the kernel maps them: ``(hi - key) >> sh`` with ``sh`` the bit length of
``(hi - lo) // NB``, for NB = KB and 2 KB buckets (``select_kernel.ORDER_BUCKETS``). The in-bucket
count takes as many steps as the largest bucket holds (past ``radix.SPLIT``, the kernel splits
every bucket again, which this script does not follow: it prints those rows' count).

``three parts`` (2 KB buckets): what ``radix.part_counts`` does where one map crowds a bucket
past ``SPLIT`` (production since session 16): the winners of a positive score key, those of a
negative one, and the tie at the smallest score key, each mapped over its own key range into
buckets in proportion to its winners. Printed: the rows that map again, their largest bucket,
and the rows still past ``SPLIT`` (those take the second level).

``two parts`` (2 KB buckets): the first level measured and dropped in session 15
(docs/benchmarks_select_kernel.md): the winners above the cutoff bin (the 12-bit prefix of the
k-th key) and the bin's own winners, where the bin gave more than ``SPLIT`` and was not taken
whole, each mapped over its own key range into buckets in proportion to its winners. Printed:
the rows that took it, the largest bucket of each part, and the rows still past ``SPLIT``.

``block rank`` (``--threads``, 512: the filter kind): the block path's first level (``ops/select_block.py``,
``order_winners``: always three parts, each part's shift the smallest that maps its range into its buckets)
and the steps of its rank count, the winners in row order (winner ``i`` is thread ``i % threads``'s): the
buckets that hold a winner, the members a winner's bucket holds on average, the steps a thread takes (the sum
over its winners of their buckets' sizes) and a warp (the sum over its winners of its lanes' largest).
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


def buckets(key: torch.Tensor, nb: int) -> torch.Tensor:
    """Each key's bucket among ``nb`` over the keys' range, highest first: ``(hi - key) >> sh``, ``sh`` the
    smallest shift that maps the range into them (the block path's ``bitlen_div``, the same number)."""
    hi, lo = int(key.max()), int(key.min())
    return (hi - key) >> ((hi - lo) // nb).bit_length()


def largest_bucket(key: torch.Tensor, nb: int) -> int:
    return int(torch.bincount(buckets(key, nb), minlength=nb).max())


def largest_in_parts(key: torch.Tensor, row_keys: torch.Tensor, nb: int) -> tuple[int, int] | None:
    """The two-part first level of a row's winners ``key`` (descending) among the row's keys:
    (largest bucket of the part above the cutoff bin, of the bin's part; each part mapped over
    its own range, largest_bucket), or None where the row keeps one map (the bin gave at most
    SPLIT winners, or every candidate of it won)."""
    prefix = key >> 51  # the score key's top 12 bits (ordering.order_keys: score key << 31)
    cut = int(prefix[-1])
    seg = int((prefix > cut).sum())
    in_bin = int(((row_keys >> 51) == cut).sum())
    if seg == 0 or len(key) - seg <= SPLIT.value or in_bin == len(key) - seg:
        return None
    nb_a = min(max(nb * seg // len(key), 1), nb - 1)
    return largest_bucket(key[:seg], nb_a), largest_bucket(key[seg:], nb - nb_a)


def three_part_buckets(key: torch.Tensor, nb: int, at_least_one: bool = False) -> torch.Tensor:
    """Each of a row's winners ``key``'s bucket in radix.part_counts' map: positive score keys (packed key
    >= 2**62), negative ones, the tie at the smallest score key, each part over its own range into
    ``nb * part // len(key)`` buckets (``at_least_one``: at least 1, as the block path's order_winners; the
    tie: the rest)."""
    lo = int(key.min())
    tie = (key >> 31) == (lo >> 31)
    pos = (key >= 1 << 62) & ~tie
    neg = ~pos & ~tie
    out = torch.empty_like(key)
    base = 0
    for part in (pos, neg, tie):
        c = int(part.sum())
        if c:
            nb_part = nb - base if part is tie else nb * c // len(key)
            nb_part = max(1, nb_part) if at_least_one else nb_part
            out[part] = base + buckets(key[part], nb_part)
            base += nb_part
    return out


def largest_in_three_parts(key: torch.Tensor, nb: int) -> int:
    """The largest bucket of three_part_buckets' map."""
    return int(torch.bincount(three_part_buckets(key, nb)).max())


def block_rank_steps(key: torch.Tensor, nb: int, threads: int) -> tuple[int, float, float, float]:
    """order_winners' first level of a row's winners ``key`` (ops/select_block.py): (buckets holding a
    winner, mean size of a winner's bucket, mean steps a thread, mean steps a warp) of its rank count."""
    nsel = len(key)
    bucket = three_part_buckets(key, nb, at_least_one=True)
    count = torch.bincount(bucket, minlength=nb)
    size = count[bucket].float()
    lane = torch.zeros(threads).index_add_(0, torch.arange(nsel) % threads, size)
    per_round = torch.nn.functional.pad(size, (0, -nsel % threads)).view(-1, threads // 32, 32)
    warp = per_round.amax(2).sum(0)
    return int((count > 0).sum()), float(size.mean()), float(lane.mean()), float(warp.mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--threads", type=int, default=512, help="the block path's threads a block (block rank)")
    a = ap.parse_args(argv)
    kb = max(2, 1 << (a.k - 1).bit_length())
    for pattern in a.patterns.split(","):
        scores, ids = make_inputs(a.rows, a.n, pattern, seed=a.n + a.k, device="cpu")
        keys = order_keys(scores, ids)
        top = torch.topk(keys, a.k, dim=1).values
        for nb in (kb, 2 * kb):
            big = [largest_bucket(row, nb) for row in top]
            print(f"{pattern:7s} N={a.n} k={a.k} {nb} buckets: largest bucket median {statistics.median(big):g}, "
                  f"max {max(big)}; rows past SPLIT ({SPLIT.value}): {sum(b > SPLIT.value for b in big)} of {a.rows}")
        again = [largest_in_three_parts(row, 2 * kb) for row in top if largest_bucket(row, 2 * kb) > SPLIT.value]
        if again:
            print(f"{pattern:7s} N={a.n} k={a.k} {2 * kb} buckets in three parts (production, past SPLIT): {len(again)} "
                  f"of {a.rows} rows; largest bucket median {statistics.median(again):g} (max {max(again)}); "
                  f"rows still past SPLIT: {sum(b > SPLIT.value for b in again)}")
        parts = [largest_in_parts(row, keys[r], 2 * kb) for r, row in enumerate(top)]
        took = [p for p in parts if p is not None]
        if took:
            print(f"{pattern:7s} N={a.n} k={a.k} {2 * kb} buckets in two parts: {len(took)} of {a.rows} rows; largest "
                  f"bucket above the bin median {statistics.median(p[0] for p in took):g} (max {max(p[0] for p in took)}), "
                  f"in the bin median {statistics.median(p[1] for p in took):g} (max {max(p[1] for p in took)}); "
                  f"rows past SPLIT: {sum(max(p) > SPLIT.value for p in took)}")
        else:
            print(f"{pattern:7s} N={a.n} k={a.k} {2 * kb} buckets in two parts: no row takes them")
        steps = [block_rank_steps(row, 2048, a.threads) for row in top]
        print(f"{pattern:7s} N={a.n} k={a.k} block rank, 2048 buckets, {a.threads} threads (median of rows): "
              + ", ".join(f"{what} {statistics.median(x[i] for x in steps):.1f}" for i, what in enumerate(
                  ("buckets holding a winner", "a winner's bucket's size", "steps a thread", "steps a warp"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
