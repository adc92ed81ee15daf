"""SASS instructions a step of the row kernel's cutoff search, without a GPU.

    python bench/cutoff_sass.py [--block 16384] [--num-warps 16] [--arch 90] [--halving]

Compiles, with Triton's bundled ptxas, a kernel that loads a register tile and runs only
``select_kernel.cutoff_search`` on it, disassembles it (tools/compile_select_kernels.py's
``sass_instructions``: the bundled cuobjdump) and prints the
instructions between consecutive barriers: each step of the search is one sum, so one
stretch between barrier rounds. The phase is issue-bound (docs/benchmarks_select_kernel.md,
session 7), so these counts predict its cost: H200, 16384 tile, 16 warps, about 0.17 us a round
plus 0.003 us an instruction a thread. At session 7's end: 66 instructions a step (113 when
every count compared the score keys themselves: --halving, bench_row_phases' variant halving).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# (importing it points TRITON_CACHE_DIR at a fresh folder: a cold compile, every run)
from compile_select_kernels import sass_instructions  # noqa: E402
from bench_row_phases import cutoff_search_halving  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tpflare.ops import select_kernel as sk  # noqa: E402
from tpflare.ops.radix import load_chunk, score_key  # noqa: E402


@triton.jit
def _cutoff_only(sc, idp, out, N, K, BLOCK: tl.constexpr, HALVING: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b, i = load_chunk(sc + row * N, idp + row * N, 0, N, BLOCK)
    if HALVING:
        nsel, P, above, m = cutoff_search_halving(score_key(b, i), K)
    else:
        nsel, P, above, m = sk.cutoff_search(score_key(b, i), K)
    tl.store(out + row * 4, nsel)
    tl.store(out + row * 4 + 1, P)
    tl.store(out + row * 4 + 2, above)
    tl.store(out + row * 4 + 3, m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block", type=int, default=16384)
    ap.add_argument("--num-warps", type=int, default=16)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--halving", action="store_true",
                    help="the search as it was up to session 7 (bench_row_phases.cutoff_search_halving)")
    a = ap.parse_args(argv)
    src = ASTSource(fn=_cutoff_only, signature={"sc": "*fp32", "idp": "*i32", "out": "*i32", "N": "i32", "K": "i32",
                                                "BLOCK": "constexpr", "HALVING": "constexpr"},
                    constexprs={(5,): a.block, (6,): a.halving})
    c = triton.compile(src, target=GPUTarget("cuda", a.arch, 32), options={"num_warps": a.num_warps})
    ins = sass_instructions(c.asm["cubin"])
    bars = [j for j, ln in enumerate(ins) if "BAR.SYNC" in ln]
    print(f"cutoff_search{' (halving)' if a.halving else ''}, tile {a.block}, {a.num_warps} warps, sm_{a.arch}: {len(ins)} SASS instructions, "
          f"{len(bars)} barriers")
    gaps = [q - p for p, q in zip(bars, bars[1:])]
    print("instructions between consecutive barriers:", " ".join(map(str, gaps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
