"""Where a block-path variant's time goes, kernel by kernel (bench/block_variants.py's ``sampled``
and ``spread`` variants, on a GPU): a call's launches run in order (``plan_kernels``: sample,
keep, chunks_gated, merge_gated; or hist, compact, finish, rank); each cell is timed in CUDA-graph
replay with only the first 1, 2, ... of them launched, so the differences are each kernel's time
there. A call cut short computes nothing useful; the whole call is checked bit for bit against
the GPU tests' ``ref_packed`` and, where the variant counts them, the rows its chunks served.

    python3 bench/block_variants.py --out /tmp/v sampled_rows spread
    python3 bench/launch_phases.py --module /tmp/v/sampled_rows.py --out phases.json \
        [--cells 32768x1024,131072x64,16384x1024,16384x1,16384x4] [--patterns random,ties,short] [--set SAMPLED_MIN_ROWS=1]

``--set NAME=VALUE`` sets a module global of the variant (an int), for example ``SAMPLED_MIN_ROWS=1`` (rows in chunks through the sampled keep at any row count):
rows of one block take the sampled keep from one row, to weigh the chain against the staged path.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from bench_select_kernel import make_inputs, time_graph, write_record  # noqa: E402
import fuzz_select  # noqa: E402  (mismatch, and the tests' ref_packed)
from block_on_cpu import load_module  # noqa: E402


class Upto:
    """The module's compile_tile, whose kernels launch only while fewer than ``n`` launches of the
    current call ran (``n`` None: all); ``kinds``: the kinds the last whole call launched."""

    def __init__(self, mod):
        self.mod, self.real, self.n, self.seen, self.kinds = mod, mod.compile_tile, None, 0, []

    def __call__(self, threads, device=None, kind="row"):
        kern = self.real(threads, device, kind)

        def launch(**kw):
            self.seen += 1
            if self.n is None:
                self.kinds.append(kind)
            if self.n is None or self.seen <= self.n:
                kern(**kw)
        return launch

    def run(self, n, s, i, k):
        self.n, self.seen = n, 0
        if n is None:
            self.kinds = []
        return self.mod.block_select(s, i, k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True, help="a variant of ops/select_block.py (bench/block_variants.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="32768x1024,131072x64,16384x1024,16384x1,16384x4", help="N x Q, comma-separated")
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a module global (an int)")
    a = ap.parse_args(argv)
    mod = load_module(a.module)
    for item in a.set:
        name, _, value = item.partition("=")
        if not hasattr(mod, name):
            raise SystemExit(f"the module has no {name}")
        setattr(mod, name, int(value))
    up = Upto(mod)
    mod.compile_tile = up
    counts = "STATS" in vars(mod)  # (sampled variants: each call's rows' status)
    rec: dict = dict(device=torch.cuda.get_device_name(), module=a.module, set=a.set, cells=[])
    for n, q in [tuple(int(x) for x in c.split("x")) for c in a.cells.split(",")]:
        for pat in a.patterns.split(","):
            sets = [make_inputs(q, n, pat, seed) for seed in (1, 2)]
            if counts:
                mod.STATS = []
            exact = all(fuzz_select.mismatch(up.run(None, s, i, a.k), fuzz_select.ref_packed(s, i, a.k)) is None
                        for s, i in sets)
            kinds = list(up.kinds)
            cell = dict(n=n, q=q, pattern=pat, exact=exact, kinds=kinds, launches=[])
            if counts:
                cell["rows_chunks"] = int(sum((st[:, 3] < 0).sum() for st in mod.STATS))
                mod.STATS = None
            for upto in range(1, len(kinds) + 1):
                cell["launches"].append(time_graph(lambda s, i, u=upto: up.run(u, s, i, a.k), sets, 20, 10))
            ms = cell["launches"]
            parts = "  ".join(f"{kd} {(ms[j] - (ms[j - 1] if j else 0)) * 1e3:7.1f}" for j, kd in enumerate(kinds))
            extra = f"  chunks served {cell['rows_chunks']} of {2 * q} rows" if counts else ""
            print(f"{pat:6s} {q:5d} x {n:6d}  {parts}  total {ms[-1] * 1e3:7.1f} us  exact {exact}{extra}", flush=True)
            rec["cells"].append(cell)
            write_record(a.out, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
