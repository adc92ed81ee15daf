"""Where a launch plan's cold first call goes: a timeline of Triton's steps, in a fresh process.

    python bench/cold_call_timeline.py --shapes 64x16384,1x16384 [--k 2048] [--out t.json]

For each shape, a fresh process with an empty ``TRITON_CACHE_DIR`` first runs a tiny Triton
kernel (Triton's driver built, as in a process that ran an Inductor kernel), then times
``triton_ordered_select``'s first call. Triton's functions are wrapped (those this Triton has):
``compiler.compile`` (a kernel's whole code generation), ``CompiledKernel._init_handles``
(the cubin loaded, the launcher built), ``runtime.build`` helpers (a C launcher compiled with
the host's C compiler, where this Triton builds one a kernel), and each backend stage; and the
``tpflare`` log records of the call. Each
wrapped call is printed with its thread, start and end, in seconds from the first call's start,
so the serial parts of the call (those not overlapped by the parallel compile) show. Where
Triton builds a launcher a kernel (3.6), each kernel's stand-in (``select_compile.stand_in``)
shows as a short compile and a ``build:_build`` in another pool thread during the kernel's
compile, and the kernel's own ``init_handles`` then takes milliseconds (its launcher cached).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import functools, json, logging, sys, threading, time, torch
logs = []
class _Keep(logging.Handler):
    def emit(self, rec):
        logs.append(f"{rec.levelname} {rec.name}: {rec.getMessage()}")
logging.getLogger("tpflare").addHandler(_Keep()); logging.getLogger("tpflare").setLevel(logging.INFO)
q, n, k = (int(x) for x in sys.argv[1:4])
events = []
T0 = [None]

def wrap(owner, name, label):
    f = getattr(owner, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def w(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            if T0[0] is not None:
                events.append(dict(what=label, thread=threading.current_thread().name,
                                   start=round(t - T0[0], 4), end=round(time.perf_counter() - T0[0], 4)))
    setattr(owner, name, w)

import triton, triton.language as tl
import triton.compiler.compiler as cc
import triton.runtime.build as rb
wrap(cc, "compile", "compile")
wrap(triton, "compile", "compile")
wrap(cc.CompiledKernel, "_init_handles", "init_handles")
for nm in ("compile_module_from_src", "_build", "compile_so_from_src", "_compile_so", "compile_module_from_file"):
    wrap(rb, nm, "build:" + nm)
try:
    from triton.backends.nvidia import driver as nd
    for nm in ("compile_module_from_src", "compile_module_from_file", "make_launcher"):
        wrap(nd, nm, "driver:" + nm)
except Exception:
    pass
try:
    from triton.backends.nvidia.compiler import CUDABackend
    add = CUDABackend.add_stages
    def add_stages(self, stages, *a, **kw):
        add(self, stages, *a, **kw)
        for sn, st in list(stages.items()):
            def run(*x, _st=st, _sn=sn, **y):
                t = time.perf_counter()
                try:
                    return _st(*x, **y)
                finally:
                    if T0[0] is not None:
                        events.append(dict(what="stage:" + _sn, thread=threading.current_thread().name,
                                           start=round(t - T0[0], 4), end=round(time.perf_counter() - T0[0], 4)))
            stages[sn] = run
    CUDABackend.add_stages = add_stages
except Exception:
    pass

from tpflare.ops import select_kernel as sk, select_compile as sc
wrap(sc, "collect", "tpflare:collect")
s = torch.randn(q, n, device="cuda"); i = torch.randperm(n, device="cuda").to(torch.int32).expand(q, n).contiguous()

@triton.jit
def _touch(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)
_touch[(1,)](torch.zeros(1, device="cuda"))
torch.cuda.synchronize()
T0[0] = time.perf_counter()
sk.triton_ordered_select(s, i, k); torch.cuda.synchronize(); first = time.perf_counter() - T0[0]
t = time.perf_counter(); sk.triton_ordered_select(s, i, k); torch.cuda.synchronize(); steady = time.perf_counter() - t
print(json.dumps(dict(q=q, n=n, k=k, path=sk.choose_path(q, n, k, sk._num_sms(0)), first_s=first, steady_s=steady,
                      triton=triton.__version__, logs=logs, events=sorted(events, key=lambda e: e["start"]))))
"""


def run_shape(q: int, n: int, k: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="triton_cold_") as d, \
            tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_CHILD)
        f.close()
        try:
            out = subprocess.run([sys.executable, f.name, str(q), str(n), str(k)], capture_output=True, text=True,
                                 timeout=300, env=dict(os.environ, TRITON_CACHE_DIR=d))
        finally:
            os.unlink(f.name)
    if out.returncode:
        return dict(q=q, n=n, error=out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x16384,1x16384")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = []
    for shape in a.shapes.split(","):
        q, n = (int(x) for x in shape.split("x"))
        for _ in range(a.repeats):
            r = run_shape(q, n, a.k)
            res.append(r)
            if "error" in r:
                print(f"{shape}: FAILED {r['error']}")
                continue
            print(f"{shape} ({r['path']}, Triton {r['triton']}): first call {r['first_s']:.2f} s, steady "
                  f"{r['steady_s'] * 1e3:.2f} ms")
            for line in r["logs"]:
                print(f"  log: {line}")
            for e in r["events"]:
                print(f"  {e['start']:7.3f} -> {e['end']:7.3f}  ({e['end'] - e['start']:6.3f} s)  {e['thread']:<22} "
                      f"{e['what']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
