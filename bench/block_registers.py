"""Registers a thread and spilled bytes of the block path's kernel (ops/select_block.py) and of
copies of its module (variants: bench/block_variants.py), for every tile and kind, from nvcc's
``-Xptxas -v`` report for sm_90 (no GPU needed; nvcc on the path).

    python3 bench/block_registers.py [--seconds] [variant.py ...]

One line a module: ``tile/kind:registers`` and, where something spilled, ``,sp<stores>/<loads>``
bytes; with ``--seconds``, ``@`` nvcc's wall seconds for the kernel (this machine's, not NVRTC's on
the GPU host). A kind a module launches at one block size only (a variant's ``KIND_THREADS``) is
compiled at that size.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from block_on_cpu import load_module  # noqa: E402


def report(path: str, work: str, seconds: bool = False) -> str:
    mod = load_module(path)
    fixed = getattr(mod, "KIND_THREADS", {})
    cells = []
    for t in mod.TILES:
        for kind in mod.KINDS:
            if fixed.get(kind, t) != t:
                continue
            src = os.path.join(work, "k.cu")
            with open(src, "w") as f:
                f.write(mod.source(t, kind))
            t0 = time.perf_counter()
            r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", os.path.join(work, "k.cubin"),
                                src], capture_output=True, text=True)
            took = f"@{time.perf_counter() - t0:.2f}s" if seconds else ""
            if r.returncode:
                cells.append(f"{t}/{kind}:FAILED")
                continue
            regs = re.search(r"Used (\d+) registers", r.stderr).group(1)
            sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
            spill = f",sp{sp.group(1)}/{sp.group(2)}" if sp and (sp.group(1), sp.group(2)) != ("0", "0") else ""
            cells.append(f"{t}/{kind}:{regs}r{spill}{took}")
    return f"{os.path.basename(path)} " + " ".join(cells)


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    seconds = "--seconds" in args
    paths = [os.path.join(HERE, "..", "ops", "select_block.py")] + [a for a in args if a != "--seconds"]
    with tempfile.TemporaryDirectory() as work:
        for p in paths:
            print(report(p, work, seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
