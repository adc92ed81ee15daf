"""The block path's compile, one plan after another, in this process: its NVRTC kernels one after
another (``--mode seq``, ``compile_tile`` a kernel) or at once (``--mode par``,
``select_block.compile_kernels``, what a plan's first call and ``precompile`` do). GPU host.

    CUDA_CACHE_DISABLE=1 python3 bench/block_compile.py --mode seq   # cold: the driver's JIT cache off
    CUDA_CACHE_DISABLE=1 python3 bench/block_compile.py --mode par
    python3 bench/block_compile.py --mode par                        # the JIT cache as the machine has it
    python3 bench/block_compile.py --mode seq --shapes 1024x16384,64x8192,24x131072   # the dispatcher's plans


NVRTC emits PTX (torch 2.11's ``torch.cuda._compile_kernel``), which the CUDA driver compiles when the
module loads and keeps in its JIT cache (``~/.nv/ComputeCache``, or ``CUDA_CACHE_PATH``), so a process
after the first compiles from that cache unless ``CUDA_CACHE_DISABLE=1``. Run each mode in a fresh
process: a process compiles a kernel once. Prints one JSON line: the first trivial NVRTC compile
(the library's load), then each plan's seconds and kernel count.
"""
from __future__ import annotations

import argparse
import json
import os
import time

# the plans of session 33's figures, as (N, Q, keep), with the fewest chunks: the sampled keep's four kernels,
# one row kernel, a long row's chunks and merge (--shapes: the plans the dispatcher picks for Q x N instead)
PLANS = {"64x131072": (131072, 64, True), "1024x16384": (16384, 1024, None), "8x65536": (65536, 8, False)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("seq", "par"), required=True)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--shapes", default="", help="Q x N, comma-separated: the dispatcher's plans (default: PLANS)")
    args = ap.parse_args(argv)
    import torch

    from tpflare.ops import select_block as sb
    from tpflare.ops import select_kernel as sk

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out = {"mode": args.mode, "CUDA_CACHE_DISABLE": os.environ.get("CUDA_CACHE_DISABLE", ""),
           "device": torch.cuda.get_device_name()}
    t0 = time.perf_counter()
    torch.cuda._compile_kernel('extern "C" __global__ void f(float* x) { x[threadIdx.x] += 1.0f; }', "f")
    out["nvrtc_first_s"] = round(time.perf_counter() - t0, 3)
    n_sm = sb.sm_count()
    plans = {}
    for name, (n, q, keep) in PLANS.items() if not args.shapes else ():
        plans[name] = sb.plan_kernels(n, args.k, None, q, keep=keep, n_sm=n_sm)
    for name in filter(None, args.shapes.split(",")):
        q, n = (int(x) for x in name.split("x"))
        opts = sk.block_options(q, n, args.k, n_sm)
        plans[name] = sb.plan_kernels(n, args.k, opts["chunk"], q, keep=opts["keep"], n_sm=n_sm)
    for name, plan in plans.items():
        t0 = time.perf_counter()
        if args.mode == "par":
            sb.compile_kernels(plan, torch.cuda.current_device())
        else:
            for kind, t in plan:
                sb.compile_tile(t, torch.cuda.current_device(), kind)
        out[name] = {"s": round(time.perf_counter() - t0, 3), "kernels": len(plan)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
