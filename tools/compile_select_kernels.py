"""Compile the selection kernels ahead of time for a GPU target, on any machine with Triton.

    python tools/compile_select_kernels.py [--arch 90] [--stages] [--threads] [--sass [--sass-out DIR]] [--num-warps W]
                                           [--maxnreg R] [--consts NAME=INT,...] [--ptxas='OPTS;OPTS'] [name ...]

Runs Triton's whole pipeline (TTIR, TTGIR, LLVM IR, PTX, cubin with the bundled ptxas) for
each kernel of ``ops/select_staged.py``, ``ops/select_kernel.py`` and ``ops/radix.py`` at the
tile classes of k = 2048, without a GPU, and prints each one's compile seconds, cubin size
(a lower bound on what a cold first call costs on the GPU host) and shared memory a program,
and, from the bundled ptxas's ``-v`` on the same PTX, the registers a thread and the spill
bytes (what bounds how many programs share an SM). It checks code generation only; the Triton interpreter (``TRITON_INTERPRET=1``, tests/test_select_kernel_gpu.py) checks
what the kernels compute. Names select kernels by substring. ``--stages`` adds the seconds of
each stage of the pipeline (the rest of the total is Triton's Python front end). Every run
compiles into a fresh temporary Triton cache, so the seconds are always those of a cold
compile. ``--functions`` adds the PTX instruction lines of the kernel and of each noinline
device function. ``--sass`` adds the SASS's instruction count, a digest of its text (instructions without
addresses and encodings: two trees whose digests are equal compiled the same code, so a timing
of one holds for the other), a digest of the kernel's body alone (up to its first noinline
device function: a change inside a device function that leaves it equal left the body's
register allocation as it was) and its spill stores / loads (STL / LDL, from the bundled
cuobjdump); ``--sass-out DIR`` writes each kernel's SASS text there, for a diff; ``--num-warps``
compiles with other warps than each kernel's own, ``--maxnreg`` with Triton's cap on a thread's
registers;
``--consts OB=2048,REFINE=16384`` overrides constexprs (a variant against the production kernel).
``--ptxas='-;--split-compile 0;-O1'`` (with ``=``: the value starts with ``-``) runs each
kernel's PTX through the bundled ptxas again with each set of extra options and prints its
seconds and SASS digest (which options change the code). ``--profile`` adds where Triton's Python front end spent the compile (cProfile: the code
generator's seconds, the jit functions it generated, the functions with most time of their own).
``--threads`` compiles the selected kernels at once, one thread each, and prints the
wall time against the sum (what a parallel warm-up of a launch plan's kernels could save:
Triton releases the GIL in parts of its pipeline).
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpflare_compile_")  # cold compiles, every run

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource  # noqa: E402

from tpflare.ops import radix as rx  # noqa: E402
from tpflare.ops import select_kernel as sk  # noqa: E402
from tpflare.ops import select_staged as st  # noqa: E402

_TYPES = dict(sc_ptr="*fp32", id_ptr="*i32", z_ptr="*i32", p_ptr="*i32", p2_ptr="*i32", wk_ptr="*i64", wv_ptr="*i32",
              wo_ptr="*i32", cnt_ptr="*i32", sb_ptr="*i32", hit_ptr="*i32", oid_ptr="*i32", osc_ptr="*fp32", key_ptr="*i64", pos_ptr="*i64",
              N="i32", K="i32", play_max="i32", s_sq="i32", s_iq="i32", s_oi="i32", s_os="i32")
_WB, _ZSB, _ = st.workspace_layout(2048, 16384, True, st.RANK_PLAY)  # the binned W of k = 2048
_W, _ZS, _ = st.workspace_layout(2048, 16384, False, 0)
_FR1, _FR2 = st.finish_tiers(True, st.RANK_PLAY)  # the binned W's tiers (no first tier)
_RF1, _RF2 = st.finish_tiers(False, 0)  # the row kernel's
_FIN = dict(HB=st.HIST_BITS, ZS=_ZSB, KB=_WB, D=5, CH=2048, FR1=_FR1, FR2=_FR2, ZN=st.narrow_offset(True))
KERNELS = {
    "staged hist": (st._hist_kernel, dict(CA=512, HB=st.HIST_BITS, ZS=_FIN["ZS"], ZN=_FIN["ZN"]), 2),
    "staged compact+finish (fused)": (st._compact_kernel, dict(CA=512, FUSED=True, BINNED=True, SPREAD=False, **_FIN), 8),
    "staged compact": (st._compact_kernel, dict(CA=4096, FUSED=False, BINNED=False, SPREAD=True,
                                                **dict(_FIN, KB=_W, ZS=_ZS, ZN=st.narrow_offset(False))), 8),
    "staged finish": (st._finish_kernel, dict(_FIN, SPREAD=False), 8),
    "staged walk": (st._walk_kernel, dict(_FIN, WCH=st.WALK_CHUNK), 16),
    "rank": (rx._rank_kernel, dict(KB=_WB, SL=8, JB=256, BINNED=True, ZS=_ZSB, HB=st.HIST_BITS), 4),
    "decode runs": (rx._decode_runs_kernel, dict(KB=2048), 8),
    "bucket order": (rx.bucket_kernel, dict(KB=2048), 8),
}
_ROW = dict(KB=2048, D=5, CH=sk.FIN_CHUNK, FR1=_RF1, FR2=_RF2, ORDER=True, REFINE=0, OB=sk.ORDER_BUCKETS * 2048)
# the 16384 tile's refinement threshold, its early zeroing and ordering (as triton_ordered_select decides them)
_R16 = dict(_ROW, REFINE=sk.refine_min(16384, _RF2), ZF=sk.zero_first(16384, True), PARTS=sk.parts_first(16384, True))
KERNELS.update({
    "row kernel (registers 16384)": (sk._row_kernel, dict(BLOCK=16384, CHUNK=4096, RESIDENT=True, **_R16), 16),
    "row kernel (registers 16384, refine all)": (sk._row_kernel, dict(BLOCK=16384, CHUNK=4096, RESIDENT=True,
                                                                      **dict(_ROW, ZF=True)), 16),
    "row kernel (registers 8192)": (sk._row_kernel, dict(BLOCK=8192, CHUNK=4096, RESIDENT=True,
                                                         **dict(_ROW, REFINE=sk.refine_min(8192, _RF2),
                                                                ZF=sk.zero_first(8192, True),
                                                                PARTS=sk.parts_first(8192, True))), 16),
    "row kernel (registers 16384, parts first)": (sk._row_kernel, dict(BLOCK=16384, CHUNK=4096,
                                                                                RESIDENT=True, **dict(_R16, PARTS=True)), 16),
    "row kernel (registers 16384, zeroing in the ordering)": (sk._row_kernel, dict(BLOCK=16384, CHUNK=4096,
                                                                                  RESIDENT=True, **dict(_R16, ZF=False)), 16),
    "row kernel (registers 16384, finish 8192)": (sk._row_kernel, dict(BLOCK=16384, CHUNK=4096, RESIDENT=True,
                                                                       **dict(_R16, FR2=2 * _RF2)), 16),
    "row kernel (registers 4096)": (sk._row_kernel, dict(BLOCK=4096, CHUNK=1024, RESIDENT=True, **_ROW), 4),
    "row kernel (chunks)": (sk._row_kernel, dict(BLOCK=4096, CHUNK=4096, RESIDENT=False, **_ROW), 16),
    "row kernel (chunks, sampled)": (sk._row_kernel, dict(BLOCK=4096, CHUNK=4096, RESIDENT=False, SAMPLE=sk.SAMPLE,
                                                          CAP=sk.SAMPLE_CAP, SB=sk.SAMPLE_BITS, SPREAD=True, **_ROW), 16),
    "row kernel (chunks, sampled inline)": (sk._row_kernel, dict(BLOCK=4096, CHUNK=4096, RESIDENT=False,
                                                                 SAMPLE=sk.SAMPLE, CAP=sk.SAMPLE_CAP, SB=sk.SAMPLE_BITS,
                                                                 **_ROW), 16),
    "sampled cutoff": (sk._sample_kernel, dict(CAP=sk.SAMPLE_CAP, S=sk.SAMPLE, SB=sk.SAMPLE_BITS), sk.SPREAD_WARPS),
    "sampled pass (spread)": (sk._spread_pass_kernel, dict(CAP=sk.SAMPLE_CAP, FCH=sk.SPREAD_CHUNK), sk.SPREAD_WARPS),
    "row kernel (registers 16384, unordered)": (sk._row_kernel, dict(BLOCK=16384, CHUNK=4096, RESIDENT=True,
                                                                     **dict(_R16, ORDER=False, ZF=False)), 16),
})
for _fn, _c, _w in KERNELS.values():  # the finish's largest bin, as triton_ordered_select gives it
    if _fn is sk._row_kernel:
        _c.setdefault("FMAX", sk.finish_max(_c["BLOCK"], _c["RESIDENT"], _c["REFINE"], _c["FR2"]))


def run_ptxas(ptx: str, arch: int, *options: str):
    """``ptx`` through the bundled ptxas with ``options`` for ``sm_<arch>`` (``a`` from sm_90):
    (the finished process, the cubin's bytes or None where ptxas failed, its seconds)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        f, b = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(f, "w") as fh:
            fh.write(ptx)
        t0 = time.perf_counter()
        r = subprocess.run([get_ptxas(arch).path, *options, f"--gpu-name=sm_{arch}{'a' if arch >= 90 else ''}", f,
                            "-o", b], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        cubin = None
        if r.returncode == 0:
            with open(b, "rb") as fh:
                cubin = fh.read()
    return r, cubin, dt


def ptxas_usage(ptx: str, arch: int) -> str:
    """Registers a thread and spill bytes of the kernel in ``ptx`` (its body and its noinline
    functions together), from the bundled ptxas -v."""
    out, _, _ = run_ptxas(ptx, arch, "-v")
    regs = re.search(r"Used (\d+) registers", out.stderr)  # (the entry's: ptxas reports it first)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", out.stderr)]  # the entry's, then each function's
    if not spills:
        return f"{regs.group(1) if regs else '?'} registers, ? bytes spilled"
    return (f"{regs.group(1) if regs else '?'} registers, {sum(spills)} bytes spilled"
            + (f" ({spills[0]} in the kernel's body, the rest in its noinline functions)" if len(spills) > 1 else ""))


def ptxas_variants(ptx: str, arch: int, option_sets: list[str]) -> str:
    """The kernel's PTX through the bundled ptxas again, once per set of extra options ("-" for
    none: Triton's own call but for its line table): seconds, SASS instructions and the digest of
    their text (``sass_text``) for each: which options change the code, and what they cost."""
    out = []
    for opts in option_sets:
        r, cubin, dt = run_ptxas(ptx, arch, "-lineinfo", *([] if opts.strip() in ("", "-") else opts.split()))
        if cubin is None:
            out.append(f"[{opts}] ptxas failed: {r.stderr.strip()[-300:]}")
            continue
        lines = sass_instructions(cubin)
        out.append(f"[{opts}] {dt:.2f} s, {len(lines)} instructions, text sha1 {_sha(sass_text(lines))}")
    return "; ".join(out)


def compile_one(fn, consts: dict, num_warps: int, arch: int, stage_seconds: dict | None = None, maxnreg=None):
    """Triton's whole pipeline for ``fn`` at ``consts``; ``stage_seconds`` (a dict) receives the
    seconds of each of the backend's stages (ttir, ttgir, llir, ptx, cubin); ``maxnreg``: Triton's
    register cap a thread (None: ptxas's choice)."""
    names = fn.arg_names
    consts = dict({p.name: p.default for p in fn.params  # constexprs left out take their defaults
                   if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty}, **consts)
    sig = {n: "constexpr" if n in consts else _TYPES[n] for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()})
    target = GPUTarget("cuda", arch, 32)
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    if stage_seconds is None:
        return triton.compile(src, target=target, options=options)
    from triton.backends.nvidia.compiler import CUDABackend

    add_stages = CUDABackend.add_stages

    def timed(self, stages, *args, **kwargs):
        add_stages(self, stages, *args, **kwargs)
        for name, stage in list(stages.items()):
            def run(*a, _stage=stage, _name=name, **k):
                t0 = time.perf_counter()
                try:
                    return _stage(*a, **k)
                finally:
                    stage_seconds[_name] = stage_seconds.get(_name, 0.0) + time.perf_counter() - t0
            stages[name] = run

    CUDABackend.add_stages = timed
    try:
        return triton.compile(src, target=target, options=options)
    finally:
        CUDABackend.add_stages = add_stages


def compile_threaded(names: list, arch: int) -> int:
    """Compile ``names`` (KERNELS keys) in one thread each; print each one's seconds and the wall."""
    import threading

    secs, errors = {}, {}

    def one(name):
        fn, consts, nw = KERNELS[name]
        t0 = time.perf_counter()
        try:
            compile_one(fn, dict(consts), nw, arch)
        except Exception as e:  # reported below
            errors[name] = f"{type(e).__name__}: {str(e)[:500]}"
        secs[name] = time.perf_counter() - t0

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for n in names:
        print(f"{'FAIL' if n in errors else 'ok  '} {n}: {secs[n]:.1f} s in its thread {errors.get(n, '')}")
    print(f"{len(names)} kernels in threads: {wall:.2f} s wall ({os.cpu_count()} CPUs)")
    return 1 if errors else 0


def sass_instructions(cubin: bytes) -> list[str]:
    """The kernel's SASS instructions, one line each, from the bundled cuobjdump."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "k.cubin")
        with open(f, "wb") as fh:
            fh.write(cubin)
        sass = subprocess.run([tool, "-sass", f], capture_output=True, text=True).stdout
    return [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/", ln)]


def sass_text(lines: list[str]) -> str:
    """SASS instructions without their addresses and encodings, one a line: two trees compiled
    the same code where these texts are equal."""
    return "".join(re.sub(r"^\s+/\*[0-9a-f]+\*/\s+", "", ln).split(";")[0].rstrip() + "\n" for ln in lines)


def sass_spills(cubin: bytes, out: str | None = None) -> str:
    """Instructions of the kernel's SASS, a digest of their text (``sass_text``) and its
    local-memory (spill) stores and loads; ``out``: a file that receives the text."""
    lines = sass_instructions(cubin)
    text = sass_text(lines)
    if out:
        with open(out, "w") as fh:
            fh.write(text)
    stl = sum(" STL" in ln for ln in lines)
    ldl = sum(" LDL" in ln for ln in lines)
    body = sass_text(sass_regions(lines)[0])
    return (f"SASS {len(lines)} instructions (text sha1 {_sha(text)}; the kernel's body, up to its first "
            f"device function, sha1 {_sha(body)}), {stl} STL / {ldl} LDL")


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def sass_regions(lines: list[str]) -> list[list[str]]:
    """The SASS lines cut at each call target (the kernel's body first, then its noinline device
    functions, which cuobjdump lists in the kernel's one section): a change inside a device
    function that leaves the body's text as it was leaves the body's register allocation too."""
    targets = sorted({int(m.group(1), 16) for ln in lines if (m := re.search(r"CALL\.REL\S* (0x[0-9a-f]+)", ln))})
    regions, cur, cuts = [], [], iter(targets + [None])
    cut = next(cuts)
    for ln in lines:
        addr = int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16)
        while cut is not None and addr >= cut:
            regions.append(cur)
            cur, cut = [], next(cuts)
        cur.append(ln)
    return regions + [cur]


def ptx_functions(ptx: str) -> str:
    """Instruction lines of each function in ``ptx`` (the kernel and its noinline device
    functions), largest first: where the code (and so LLVM's and ptxas's time) is."""
    sizes, cur = {}, None
    for ln in ptx.splitlines():
        t = ln.strip()
        m = re.search(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)\(", t)
        if m:
            cur = re.sub(r"^tpflare_\$_ops_\$_", "", m.group(1)).split("__")[0].replace("_$_", ".")
            sizes[cur] = sizes.get(cur, 0)
        elif cur and t.endswith(";") and not t.startswith((".reg", ".loc", ".param", ".local", ".shared", "//")):
            sizes[cur] += 1
    return ", ".join(f"{n} {c}" for n, c in sorted(sizes.items(), key=lambda x: -x[1]))


def front_end_profile(prof, top: int = 6) -> str:
    """Where Triton's Python front end spent a compile (``--profile``): the code generator's
    seconds (``ast_to_ttir``), how many jit functions it generated (``call_JitFunction``), and the
    functions with the most time of their own."""
    import pstats

    st = pstats.Stats(prof)
    gen = {name: (nc, tt, ct) for (path, _, name), (_, nc, tt, ct, _) in st.stats.items()
           if path.endswith("code_generator.py") and name in ("ast_to_ttir", "call_JitFunction")}
    own = sorted(((tt, f"{path.rsplit('/', 1)[-1]}:{name}") for (path, _, name), (_, _, tt, _, _) in st.stats.items()
                  if path != "~"), reverse=True)[:top]  # (Python functions; "~": C calls, the backend's stages)
    ast_s = gen.get("ast_to_ttir", (0, 0.0, 0.0))[2]
    calls = gen.get("call_JitFunction", (0, 0.0, 0.0))[0]
    return (f"     front end: code generator (ast_to_ttir) {ast_s:.2f} s, {calls} jit-function calls; most own time: "
            + ", ".join(f"{n} {t:.2f} s" for t, n in own))


def sass_file(folder: str, name: str) -> str | None:
    """The file in ``folder`` (created) for kernel ``name``'s SASS text; None without a folder."""
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, re.sub(r"[^\w]+", "_", name).strip("_") + ".sass")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability as one number (H100/H200: 90)")
    ap.add_argument("--stages", action="store_true", help="also the seconds of each pipeline stage")
    ap.add_argument("--threads", action="store_true", help="compile the selected kernels in parallel threads")
    ap.add_argument("--sass", action="store_true", help="also the SASS size, a digest of its text and its spill "
                                                       "stores / loads")
    ap.add_argument("--sass-out", default="", help="a folder that receives each kernel's SASS text (for a diff "
                                                  "against another tree's; implies --sass)")
    ap.add_argument("--num-warps", type=int, default=None, help="compile with these warps instead of each kernel's")
    ap.add_argument("--maxnreg", type=int, default=None, help="cap a thread's registers (Triton's maxnreg option)")
    ap.add_argument("--functions", action="store_true", help="also the PTX instruction lines of each function")
    ap.add_argument("--consts", default="", help="NAME=INT,... constexprs that override each selected kernel's "
                                                "(a kernel without such a parameter is compiled as it is)")
    ap.add_argument("--profile", action="store_true", help="also where the Python front end's time goes (cProfile)")
    ap.add_argument("--ptxas", default="", help="'OPTS;OPTS;...': also each kernel's PTX through the bundled ptxas "
                                               "with each set of extra options ('-': none), timed, with its SASS "
                                               "digest (ptxas_variants)")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args(argv)
    a.sass = a.sass or bool(a.sass_out)
    over = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.consts.split(",") if kv)
    if a.threads:
        return compile_threaded([n for n in KERNELS if not a.names or any(x in n for x in a.names)], a.arch)
    failed = 0
    for name, (fn, consts, nw) in KERNELS.items():
        if a.names and not any(x in name for x in a.names):
            continue
        t0 = time.time()
        stages = {} if a.stages else None
        prof = None
        if a.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        try:
            k = compile_one(fn, dict(consts, **{c: v for c, v in over.items() if c in fn.arg_names}),
                            a.num_warps or nw, a.arch, stages, a.maxnreg)
            dt = time.time() - t0
            if prof is not None:
                prof.disable()
                print(front_end_profile(prof), flush=True)
            by_stage = ""
            if stages:
                by_stage = " (" + ", ".join(f"{n} {v:.2f}" for n, v in stages.items()) + \
                    f", front end {dt - sum(stages.values()):.2f})"
            print(f"ok   {name}: {dt:.1f} s{by_stage}, cubin {len(k.asm['cubin'])} bytes, "
                  f"{k.metadata.shared} bytes of shared memory, "
                  f"{ptxas_usage(k.asm['ptx'], a.arch)}" + (f", {sass_spills(k.asm['cubin'], sass_file(a.sass_out, name))}"
                                                            if a.sass else "")
                  + (f"; PTX lines: {ptx_functions(k.asm['ptx'])}" if a.functions else ""), flush=True)
            if a.ptxas:
                print(f"     ptxas: {ptxas_variants(k.asm['ptx'], a.arch, a.ptxas.split(';'))}", flush=True)
        except Exception as e:  # report every kernel, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
