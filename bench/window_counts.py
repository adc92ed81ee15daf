"""How much of a row the ``window`` variant (bench/block_variants.py, session 42) counts with shared atomics at the
filter kind's load, and how often its cutoff falls outside the window (a second, full count). No GPU: the variant's
own kernel text, with two ``printf`` lines added, runs on the CPU runner (tests/block_on_cpu.py) on the benchmark's
inputs (bench/bench_select_kernel.py's ``make_inputs``), every row checked against the packed-key reference.

    python3 bench/window_counts.py [--rows 16] [--patterns random,ties,ties8] [--k 2048] [--n 16384]

Per pattern: rows, the window's keys a row (mean; of N), the rows whose cutoff fell outside it. A row whose cutoff is
decided from the counts alone (a short context's -inf) takes no level-1 pass and prints nothing.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

# the counts, printed by the variant's level-1 first pass (thread 0): the keys still wanted below those above the
# window, and the window's keys; then whether the whole digit was counted again
_PRINTS = [
    ("    if (pass == 0 && primed) {  // (window",
     "    if (pass == 0 && primed && tid == 0) {  // (window_counts)\n"
     "      int w = 0;\n      for (int i = 0; i < 2048; ++i) w += hist[i];\n"
     "      printf(\"WINDOW %d %d\\n\", need - above0, w);\n    }\n", "before"),
    ("        primed = false;\n", "        if (tid == 0) printf(\"OUTSIDE\\n\");  // (window_counts)\n", "after"),
]


def counted_text() -> str:
    import block_variants
    text = block_variants.module_text("window")
    for anchor, add, where in _PRINTS:
        if text.count(anchor) != 1:
            raise SystemExit(f"window_counts: the window variant changed under {anchor!r}")
        text = text.replace(anchor, add + anchor if where == "before" else anchor + add)
    return text


def one(path: str, pattern: str, rows: int, n: int, k: int) -> None:
    """(in a child process: the runner's printf goes to its stdout) one pattern's rows, checked."""
    from block_on_cpu import BlockOnCpu, load_module
    from bench_select_kernel import make_inputs
    import fuzz_select
    scores, ids = make_inputs(rows, n, pattern, 7, device="cpu")
    got = BlockOnCpu(load_module(path))(scores, ids, k, None, 1, n_sm=0)
    why = fuzz_select.mismatch(got, fuzz_select.ref_packed(scores, ids, k))
    print(f"MISMATCH {why}" if why else "EXACT", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--patterns", default="random,ties,ties8")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        one(args.child[0], args.child[1], args.rows, args.n, args.k)
        return 0
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "window_counts.py")
        with open(path, "w") as f:
            f.write(counted_text())
        bad = 0
        for pattern in args.patterns.split(","):
            out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--n", str(args.n), "--k",
                                  str(args.k), "--child", path, pattern], capture_output=True, text=True, check=True).stdout
            lines = out.splitlines()
            w = [int(x.split()[2]) for x in lines if x.startswith("WINDOW ")]
            outside = sum(x == "OUTSIDE" for x in lines)
            exact = "EXACT" in lines
            bad += not exact
            mean = f"{sum(w) / len(w):.0f}" if w else "-"
            print(f"{pattern}: rows {args.rows}, level-1 passes {len(w)}, window keys a row {mean} of {args.n}, "
                  f"outside the window {outside}, {'exact' if exact else 'MISMATCH'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
