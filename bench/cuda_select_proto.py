"""A measurement, not a path: exact ordered top-k by one CUDA thread block a row (bench/
cuda_select_proto.cu, compiled at run time by NVRTC through torch), against the Triton kernels
and fp32 ``torch.topk``. Issue 13 asks whether a kernel that controls shared memory (histograms
by shared atomics, the winners sorted in shared memory) beats the Triton register tile, whose
phases are bound by one program's registers and barriers.

    python3 bench/cuda_select_proto.py --out proto.json [--fuzz-seconds 60] [--grid main]
    python3 bench/cuda_select_proto.py --out v.json --grid quick --variants base,NOMATCH,NOSORT

Rows of at most 16384 candidates (the prototype keeps a row in registers). Every timed cell is
checked bit for bit against ``ref_packed`` of the GPU tests and against the Triton kernel; the
fuzz part draws shapes and inputs with ``tools/fuzz_select.py``'s generator (N <= 16384) and
checks them against the reference. Cold: the first call's NVRTC compile and module load, per tile.
Figures: docs/benchmarks_select_kernel.md, session 22.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from bench_select_kernel import make_inputs, time_graph  # noqa: E402
import fuzz_select  # noqa: E402  (its generator, mismatch and the tests' ref_packed)

from tpflare.ops import select_kernel as sk  # noqa: E402

SOURCE = os.path.join(HERE, "cuda_select_proto.cu")
ITEMS = 16
DYN_BYTES = 2048 * 8 * 2 + 2048 * 4  # (the .cu file's DYN_BYTES)
TILES = (256, 512, 1024)  # threads a block: rows of up to ITEMS x threads candidates
_KERNELS: dict = {}
COLD: dict = {}


def kernel(threads: int, flags: tuple = ()):
    key = (threads, flags)
    if not hasattr(torch.cuda, "_compile_kernel"):
        raise SystemExit("the prototype needs torch.cuda._compile_kernel (NVRTC; torch 2.8 and later)")
    if key not in _KERNELS:
        with open(SOURCE) as f:
            src = "".join(f"#define {d}\n" for d in flags) + f"#define THREADS {threads}\n#define ITEMS {ITEMS}\n" + f.read()
        t0 = time.perf_counter()
        kern = torch.cuda._compile_kernel(src, "select_rows")
        # the ordering's second level takes DYN_BYTES of dynamic shared memory beyond the static
        # 42 KB: past 48 KB a launch needs the function's opt-in
        u = torch.cuda._utils
        lib = (getattr(u, "_get_gpu_runtime_library", None) or getattr(u, "_get_cuda_library"))()
        rc = lib.cuFuncSetAttribute(kern.func, 8, DYN_BYTES)  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if rc != 0:
            raise RuntimeError(f"cuFuncSetAttribute: CUDA error {rc}")
        _KERNELS[key] = kern
        COLD[key] = time.perf_counter() - t0
    return _KERNELS[key]


def tile(n: int) -> int:
    for t in TILES:
        if n <= t * ITEMS:
            return t
    raise ValueError(f"the prototype keeps at most {TILES[-1] * ITEMS} candidates a row, got {n}")


def proto_select(scores: torch.Tensor, ids: torch.Tensor, k: int, flags: tuple = ()):
    q, n = scores.shape
    assert scores.stride(1) == 1 and ids.stride(1) == 1 and 1 <= k <= 2048
    out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
    if q:
        t = tile(n)
        kernel(t, flags)(grid=(q, 1, 1), block=(t, 1, 1),
                  args=[scores, ids, out_ids, out_sc, n, k, scores.stride(0), ids.stride(0), out_ids.stride(0),
                        out_sc.stride(0)], shared_mem=DYN_BYTES)
    return out_ids, out_sc


def check(scores, ids, k, triton: bool = True) -> str | None:
    got = proto_select(scores, ids, k)
    bad = fuzz_select.mismatch(got, fuzz_select.ref_packed(scores, ids, k))
    if bad or not triton:
        return "reference: " + bad if bad else None
    bad = fuzz_select.mismatch(got, sk.triton_ordered_select(scores, ids, k))
    return "triton: " + bad if bad else None


GRIDS = {
    "main": [(n, q) for n in (16384,) for q in (1, 8, 64, 256, 1024, 4096)]
    + [(n, q) for n in (8192, 4096) for q in (1, 64, 1024)],
    "quick": [(16384, 1), (16384, 64), (16384, 1024)],
}


def bench(grid: str, patterns: list[str], reps: int, replays: int) -> list[dict]:
    out = []
    for n, q in GRIDS[grid]:
        for pat in patterns:
            sets = [make_inputs(q, n, pat, seed) for seed in (1, 2)]
            exact = all(check(s, i, 2048) is None for s, i in sets)
            rec = dict(n=n, q=q, pattern=pat, exact=exact)
            rec["proto_ms"] = time_graph(lambda s, i: proto_select(s, i, 2048), sets, reps, replays)
            rec["triton_ms"] = time_graph(lambda s, i: sk.triton_ordered_select(s, i, 2048), sets, reps, replays)
            rec["topk_fp32_ms"] = time_graph(lambda s, i: torch.topk(s, 2048, dim=1), sets, reps, replays)
            print(f"{pat:7s} {q:5d} x {n:6d}  proto {rec['proto_ms'] * 1e3:8.1f} us  triton {rec['triton_ms'] * 1e3:8.1f}"
                  f"  topk {rec['topk_fp32_ms'] * 1e3:8.1f}  exact {exact}", flush=True)
            out.append(rec)
    return out


def variants(grid: str, patterns: list[str], names: list[str], reps: int, replays: int) -> list[dict]:
    """Timing of compile-time variants (flags of the .cu file): NOMATCH, NOSORT (unordered)."""
    out = []
    for n, q in GRIDS[grid]:
        for pat in patterns:
            sets = [make_inputs(q, n, pat, seed) for seed in (1, 2)]
            rec = dict(n=n, q=q, pattern=pat)
            for name in names:
                flags = tuple(f for f in name.split("+") if f and f != "base")
                rec[name] = time_graph(lambda s, i: proto_select(s, i, 2048, flags), sets, reps, replays)
            print(f"{pat:7s} {q:5d} x {n:6d} " + " ".join(f"{m} {rec[m] * 1e3:7.1f}" for m in names), flush=True)
            out.append(rec)
    return out


def fuzz(seconds: float, seed: int) -> dict:
    rng = random.Random(seed)
    t_end = time.time() + seconds
    cases, bad = 0, []
    while time.time() < t_end:
        q, n, k = fuzz_select.draw_shape(rng, 1 << 22)
        n = min(n, TILES[-1] * ITEMS)
        q = max(1, min(q, (1 << 22) // n))
        s, i, info = fuzz_select.make_inputs(q, n, k, rng.randrange(1 << 30), "cuda")
        s, i = s.contiguous(), i.contiguous()
        why = check(s, i, k, triton=False)  # (the reference alone: no Triton plan compiled a case)
        cases += 1
        if why:
            bad.append(dict(q=q, n=n, k=k, info=info, why=why))
            print(f"MISMATCH q={q} n={n} k={k} {info}: {why}", flush=True)
    return dict(cases=cases, mismatches=len(bad), first=bad[:5])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--grid", default="main", choices=sorted(GRIDS))
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--fuzz-seconds", type=float, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variants", default="", help="e.g. base,NOMATCH,NOSORT,NOMATCH+NOSORT: time these only")
    a = ap.parse_args(argv)
    rec: dict = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    torch.zeros(1, device="cuda")  # the CUDA context first: the cold figure is NVRTC and the module load
    t0 = time.perf_counter()
    for t in TILES:
        kernel(t)
    rec["cold_s"] = {str(t[0]): round(v, 3) for t, v in COLD.items()}
    rec["cold_all_s"] = round(time.perf_counter() - t0, 3)
    print("cold compile + load (s):", rec["cold_s"], flush=True)
    if a.variants:
        rec["variants"] = variants(a.grid, a.patterns.split(","), a.variants.split(","), a.reps, a.replays)
        with open(a.out, "w") as f:
            json.dump(rec, f, indent=1)
        return 0
    if a.fuzz_seconds:
        rec["fuzz"] = fuzz(a.fuzz_seconds, a.seed)
        print("fuzz:", {k: v for k, v in rec["fuzz"].items() if k != "first"}, flush=True)
    rec["cells"] = bench(a.grid, a.patterns.split(","), a.reps, a.replays)
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
