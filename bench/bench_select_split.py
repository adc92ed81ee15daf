"""A row split in parts, then the parts' winners merged: timed against the kernel's one call.

    python bench/bench_select_split.py --out split.json [--patterns random,ties,short] [--parts 16384,8192]

The selection of ``k`` from a row equals the selection of ``k`` from the union of each part's
first ``k`` (the order is total: score key, id, position; the parts' outputs keep their
candidates' position order on equal keys, and the merge's positions follow the parts' order). So
``Q`` long rows can run as ``Q x N / P`` rows of ``P`` (every SM busy where ``Q`` alone leaves
most idle), then ``Q`` rows of ``N / P x k``: two calls of ``triton_ordered_select``. Each cell
is checked exact against the torch path and timed in CUDA-graph replay with the kernel's one call
and fp32 ``torch.topk``. A measurement, not a path of the dispatcher (docs/benchmarks_select_kernel.md,
session 11). ``--launch-rows`` adds what one more launch costs in a graph (pattern ``launch``: the
kernel's call at N = 16384 alone, and followed by a no-op Triton kernel of Q programs), the price
of a second kernel such as the merge.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_select_kernel import make_inputs, time_graph  # noqa: E402


@triton.jit
def _nop(x_ptr):
    # launch_cost's second kernel: no work, one launch of Q programs (at module level, as when
    # the record was taken)
    pass

SHAPES = [(5, 131072), (8, 131072), (12, 131072), (16, 131072), (32, 131072), (64, 131072),
          (8, 65536), (16, 65536), (32, 65536), (16, 32768), (32, 32768)]


def split_select(scores, ids, k: int, part: int):
    """The first ``k`` of each row through parts of ``part`` candidates (``N`` a multiple of it)."""
    from tpflare.ops import select_kernel as sk

    q, n = scores.shape
    p = n // part
    pi, ps = sk.triton_ordered_select(scores.view(q * p, part), ids.view(q * p, part), k)
    return sk.triton_ordered_select(ps.view(q, p * k), pi.view(q, p * k), k)


def launch_cost(rows: list, k: int) -> list:
    """The kernel's call at N = 16384 in a graph, alone and followed by a no-op Triton kernel of
    Q programs: what one more launch costs."""
    from tpflare.ops import select_kernel as sk

    z = torch.zeros(1, device="cuda")
    recs = []
    for q in rows:
        sets = [make_inputs(q, 16384, "random", seed=j) for j in range(3)]

        def plus_nop(s, i, q=q):
            out = sk.triton_ordered_select(s, i, k)
            _nop[(q,)](z)
            return out

        for name, fn in (("alone", lambda s, i: sk.triton_ordered_select(s, i, k)), ("plus_nop", plus_nop)):
            r = dict(pattern="launch", q=q, n=16384, k=k, method=name, graph_us=round(time_graph(fn, sets, 10, 30) * 1e3, 2))
            recs.append(r)
            print(json.dumps(r), flush=True)
    return recs


def main(argv=None) -> int:
    from tpflare.ops import select_kernel as sk
    from tpflare.ops.ordering import torch_ordered_select

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--parts", default="16384,8192")
    ap.add_argument("--shapes", default="", help="QxN,... (default: SHAPES)")
    ap.add_argument("--launch-rows", default="8,64,1024", help="Q,... of the launch-cost cells (empty: none)")
    a = ap.parse_args(argv)
    k = a.k
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s] or SHAPES
    recs = []
    for pattern in a.patterns.split(","):
        for q, n in shapes:
            sets = [make_inputs(q, n, pattern, seed=1000 * q + n + j) for j in range(3)]
            ref = torch_ordered_select(*sets[0], k)
            methods = {"kernel": lambda s, i: sk.triton_ordered_select(s, i, k)}
            for part in (int(x) for x in a.parts.split(",")):
                if n % part == 0 and n > part:
                    methods[f"split{part}"] = lambda s, i, part=part: split_select(s, i, k, part)
            methods["topk_fp32"] = lambda s, i: torch.topk(s, k, dim=1)
            for name, fn in methods.items():
                r = dict(pattern=pattern, q=q, n=n, k=k, method=name)
                if name != "topk_fp32":
                    got = fn(*sets[0])
                    r["exact"] = bool(torch.equal(got[0], ref[0])
                                      and torch.equal(got[1].view(torch.int32), ref[1].view(torch.int32)))
                r["graph_us"] = round(time_graph(fn, sets, 10, 30) * 1e3, 2)
                recs.append(r)
                print(json.dumps(r), flush=True)
    recs += launch_cost([int(x) for x in a.launch_rows.split(",") if x], k)
    with open(a.out, "w") as f:
        json.dump(dict(meta=dict(torch=torch.__version__, device=torch.cuda.get_device_name(0)), records=recs), f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
