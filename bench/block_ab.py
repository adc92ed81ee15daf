"""A/B of the block path's kernel (ops/select_block.py): an older copy of the module against the
working tree's, timed in one process (CUDA-graph replay), every cell checked bit for bit against
the GPU tests' ``ref_packed``; then the new kernel (``--fuzz-old``: the first old one) fuzzed
with ``tools/fuzz_select.py``'s generator (N capped at ``select_block.MAX_N``; a third of the
cases in shorter chunks than the default, where the merge holds them) against the same reference.

    git show REF:ops/select_block.py > old_select_block.py
    python3 bench/block_ab.py --old old_select_block.py [--old variant.py ...] --out ab.json [--fuzz-seconds 70]

With one ``--old`` its column is ``old``; with several, each is named by its file. ``--paths
row,staged`` adds a column for each Triton path named (``triton_ordered_select(path=...)``: the
row kernel, which the dispatcher picks at 9 rows and more beyond 32768 candidates; the staged
path, at 1-4 rows, timed up to 8 rows only), timed only.

A column that raises (a launch the runtime refuses, a kernel that does not compile) is recorded in
its cell as ``<column>_error`` and the run goes on to the other columns and cells; the exit status
is 1 where any column raised, any module was not exact or the fuzz found a mismatch.

Figures: docs/benchmarks_select_kernel.md, session 22 (the tie levels narrowed).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from bench_select_kernel import make_inputs, time_graph, write_record  # noqa: E402
import fuzz_select  # noqa: E402  (its generator, mismatch and the tests' ref_packed)
from block_on_cpu import load_module  # noqa: E402  (tests/: a copy of the module from a file)

from tpflare.ops import select_block as new  # noqa: E402
from tpflare.ops import select_kernel  # noqa: E402

CELLS = [(16384, 64), (16384, 1024), (16384, 4096), (8192, 1024), (4096, 1024)]


def exact(mod, sets, k) -> bool:
    return all(fuzz_select.mismatch(mod.block_select(s, i, k), fuzz_select.ref_packed(s, i, k)) is None for s, i in sets)


@contextlib.contextmanager
def column(cell: dict, name: str):
    """A column's error (a launch the runtime refuses, a compile that fails) goes into the cell as
    ``<name>_error`` and the other columns go on."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 (any error of one column: recorded, not fatal to the run)
        cell[name + "_error"] = f"{type(e).__name__}: {e}"[:2000]
        print(f"  {name} ({cell['pattern']} {cell['q']} x {cell['n']}): {cell[name + '_error'][:300]}", flush=True)
        if torch.cuda.is_available():
            try:  # a sticky CUDA error poisons every later launch: say so once, here
                torch.cuda.synchronize()
            except Exception as sticky:  # noqa: BLE001
                cell[name + "_error"] += f" (then synchronize: {type(sticky).__name__}: {sticky})"[:500]


def fuzz(seconds: float, seed: int, mod=new) -> dict:
    rng = random.Random(seed)
    t_end = time.time() + seconds
    cases, chunked, bad = 0, 0, []
    while time.time() < t_end:
        c = fuzz_select.draw_block_case(rng, 1 << 22, mod, "cuda")  # a third in shorter chunks than the default
        q, n, k, chunk, info = c["q"], c["n"], c["k"], c["chunk"], c["info"]
        s, i = c["scores"].contiguous(), c["ids"].contiguous()
        why = fuzz_select.mismatch(mod.block_select(s, i, k, chunk=chunk), fuzz_select.ref_packed(s, i, k))
        cases += 1
        chunked += mod.chunking(n, k, chunk)[0] > 1
        if why:
            bad.append(dict(q=q, n=n, k=k, chunk=chunk, info=info, why=why))
            print(f"MISMATCH q={q} n={n} k={k} chunk={chunk} {info}: {why}", flush=True)
    return dict(cases=cases, chunked=chunked, mismatches=len(bad), first=bad[:5])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, action="append",
                    help="an older copy (or a variant) of ops/select_block.py; again for more")
    ap.add_argument("--out", required=True)
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--cells", default=",".join(f"{n}x{q}" for n, q in CELLS), help="N x Q, comma-separated")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--fuzz-seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--fuzz-old", action="store_true", help="fuzz the first --old module, not the working tree's")
    ap.add_argument("--paths", default="", help="Triton paths to time as columns too: row, staged (comma-separated)")
    a = ap.parse_args(argv)
    olds = {("old" if len(a.old) == 1 else os.path.splitext(os.path.basename(p))[0]): load_module(p) for p in a.old}
    rec: dict = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, old=a.old, cells=[])
    failed = False
    for n, q in [tuple(int(x) for x in c.split("x")) for c in a.cells.split(",")]:
        for pat in a.patterns.split(","):
            sets = [make_inputs(q, n, pat, seed) for seed in (1, 2)]
            cell = dict(n=n, q=q, pattern=pat)
            for name, mod in list(olds.items()) + [("new", new)]:
                with column(cell, name):
                    cell[name + "_exact"] = exact(mod, sets, a.k)
                    cell[name] = time_graph(lambda s, i, m=mod: m.block_select(s, i, a.k), sets, 20, 10)
            with column(cell, "topk"):
                cell["topk"] = time_graph(lambda s, i: torch.topk(s, a.k, dim=1), sets, 20, 10)
            base = ["topk"]
            for path in filter(None, a.paths.split(",")):
                if path == "staged" and q > 8:  # (a path for a few rows: the dispatcher's up to 4)
                    continue
                with column(cell, path):
                    cell[path] = time_graph(lambda s, i, p=path: select_kernel.triton_ordered_select(s, i, a.k, path=p),
                                            sets, 20, 10)
                base.append(path)
            times = "  ".join(f"{name} {cell[name] * 1e3:8.1f}" if name in cell else f"{name} {'error':>8s}"
                              for name in list(olds) + ["new"] + base)
            exact_all = " ".join(str(cell.get(name + "_exact", "error")) for name in list(olds) + ["new"])
            print(f"{pat:6s} {q:5d} x {n:6d}  {times} us  exact {exact_all}", flush=True)
            failed |= any(key.endswith("_error") for key in cell) or not all(cell.get(name + "_exact")
                                                                             for name in list(olds) + ["new"])
            rec["cells"].append(cell)
            write_record(a.out, rec)  # (after each cell: a run cut short keeps what it timed)
    if a.fuzz_seconds:
        rec["fuzz"] = fuzz(a.fuzz_seconds, a.seed, olds[next(iter(olds))] if a.fuzz_old else new)
        rec["fuzzed"] = a.old[0] if a.fuzz_old else "new"
        print("fuzz:", {k: v for k, v in rec["fuzz"].items() if k != "first"}, flush=True)
        failed |= rec["fuzz"]["mismatches"] > 0
    write_record(a.out, rec)
    return 1 if failed else 0  # (a module's error, a mismatch: the record says which)


if __name__ == "__main__":
    sys.exit(main())
