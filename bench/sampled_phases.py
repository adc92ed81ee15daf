"""Where the sampled keep's time goes (bench/block_variants.py's ``sampled`` variants, on a GPU):
a call's launches run in order (sample, keep, chunks_gated, merge_gated); each cell is timed in
CUDA-graph replay with only the first 1, 2, 3 and 4 of them launched, so the differences are each
kernel's time there. A call cut short computes nothing useful; the full call is checked bit for
bit against the GPU tests' ``ref_packed``, and the rows the chunks served are counted.

    python3 bench/block_variants.py --out /tmp/v sampled_rows
    python3 bench/sampled_phases.py --module /tmp/v/sampled_rows.py --out phases.json \
        [--cells 32768x1024,131072x64,16384x1024,16384x1,16384x4] [--patterns random,ties,short] [--sampled-rows 1]

``--sampled-rows R`` sets the variant's ``SAMPLED_ROWS``: rows of one block take the sampled keep
from R rows (1: a one-row call too, to weigh the chain of four launches against the staged path).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from bench_select_kernel import make_inputs, time_graph  # noqa: E402
import fuzz_select  # noqa: E402  (mismatch, and the tests' ref_packed)
from block_on_cpu import load_module  # noqa: E402

KINDS = ("sample", "keep", "chunks_gated", "merge_gated")


class Upto:
    """The module's compile_tile, whose kernels launch only while fewer than ``n`` launches of the
    current call ran (``n`` None: all)."""

    def __init__(self, mod):
        self.mod, self.real, self.n, self.seen = mod, mod.compile_tile, None, 0

    def __call__(self, threads, device=None, kind="row"):
        kern = self.real(threads, device, kind)

        def launch(**kw):
            self.seen += 1
            if self.n is None or self.seen <= self.n:
                kern(**kw)
        return launch

    def run(self, n, s, i, k):
        self.n, self.seen = n, 0
        return self.mod.block_select(s, i, k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True, help="a sampled variant of ops/select_block.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="32768x1024,131072x64,16384x1024,16384x1,16384x4", help="N x Q, comma-separated")
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--sampled-rows", type=int, help="the variant's SAMPLED_ROWS (sampled_rows' variants)")
    a = ap.parse_args(argv)
    mod = load_module(a.module)
    if a.sampled_rows is not None:
        mod.SAMPLED_ROWS = a.sampled_rows
    up = Upto(mod)
    mod.compile_tile = up
    rec: dict = dict(device=torch.cuda.get_device_name(), module=a.module, sampled_rows=getattr(mod, "SAMPLED_ROWS", None),
                     cells=[])
    for n, q in [tuple(int(x) for x in c.split("x")) for c in a.cells.split(",")]:
        for pat in a.patterns.split(","):
            sets = [make_inputs(q, n, pat, seed) for seed in (1, 2)]
            mod.STATS = []
            exact = all(fuzz_select.mismatch(up.run(None, s, i, a.k), fuzz_select.ref_packed(s, i, a.k)) is None
                        for s, i in sets)
            fallback = int(sum((st[:, 3] < 0).sum() for st in mod.STATS))
            mod.STATS = None
            cell = dict(n=n, q=q, pattern=pat, exact=exact, rows_chunks=fallback, launches=[])
            for upto in range(1, len(KINDS) + 1):
                cell["launches"].append(time_graph(lambda s, i, u=upto: up.run(u, s, i, a.k), sets, 20, 10))
            ms = cell["launches"]
            parts = "  ".join(f"{kd} {(ms[j] - (ms[j - 1] if j else 0)) * 1e3:7.1f}" for j, kd in enumerate(KINDS))
            print(f"{pat:6s} {q:5d} x {n:6d}  {parts}  total {ms[-1] * 1e3:7.1f} us  exact {exact}  "
                  f"chunks served {fallback} of {2 * q} rows", flush=True)
            rec["cells"].append(cell)
            with open(a.out, "w") as f:
                json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
