"""A CUDA C++ kernel source, compiled by the host's C++ compiler and run on the CPU (tests only).

``build(source, entry)`` gives a callable with the interface of ``torch.cuda._compile_kernel``'s
kernels, ``kernel(grid=, block=, args=, shared_mem=)``, whose tensors are CPU tensors. With it a
test runs a CUDA block kernel (``ops/select_block.py``) on a machine without a GPU: every thread
of a block is a fiber with its own registers, ``__syncthreads`` and the warp functions wait for
the threads they wait for on a GPU, and a seed picks the order in which threads run between them
and the starting bytes of shared memory (``cuda_on_cpu.h`` says what is emulated and what is not).

How a source becomes C++: ``__shared__`` declarations of one object or one array and ``extern
__shared__ T name[];`` are replaced by references into the block's shared memory (any other
spelling raises); ``entry``'s parameters (pointers and 32/64-bit integers) are read off its
signature for the launch. Compiled objects are cached by content under the temporary directory.
"""
from __future__ import annotations

import ctypes
import faulthandler
import hashlib
import os
import pickle
import re
import select
import shutil
import subprocess
import signal
import tempfile
import time
from pathlib import Path

import torch

HEADER = Path(__file__).with_name("cuda_on_cpu.h")
CXX = os.environ.get("CXX", "g++")
# (-fsanitize=bounds: an index past an array of known size, a shared struct's member included,
# stops the launch with SIGILL instead of writing into the next member)
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-Wno-unknown-pragmas", "-fno-strict-aliasing", "-U_FORTIFY_SOURCE",
         "-fsanitize=bounds", "-fsanitize-undefined-trap-on-error"]
_INTS = {"int": "int", "unsigned": "unsigned", "unsigned int": "unsigned", "long long": "long long",
         "i64": "long long", "u32": "unsigned", "size_t": "size_t", "int64_t": "int64_t"}


def compiler() -> str | None:
    """The C++ compiler's path, or None where there is none."""
    return shutil.which(CXX)


def _shared_to_cpu(src: str) -> str:
    src = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\s*\[\s*\]\s*;",
                 r"\1* \2 = reinterpret_cast<\1*>(::cuda_on_cpu::dynamic_shared());", src)
    src = re.sub(r"__shared__\s+(\w+)\s+(\w+)\s*\[([^\]]+)\]\s*;",
                 r"auto& \2 = *reinterpret_cast<\1(*)[\3]>(::cuda_on_cpu::static_shared(sizeof(\1[\3])));", src)
    src = re.sub(r"__shared__\s+(\w+)\s+(\w+)\s*;",
                 r"\1& \2 = *reinterpret_cast<\1*>(::cuda_on_cpu::static_shared(sizeof(\1)));", src)
    if "__shared__" in src:
        raise ValueError("cuda_on_cpu: a __shared__ declaration it does not know how to place")
    return src


def _parameters(src: str, entry: str) -> list[tuple[str, bool]]:
    """``entry``'s parameters as (C type, is a pointer), from its definition."""
    m = re.search(r"\b" + re.escape(entry) + r"\s*\(", src)
    if m is None:
        raise ValueError(f"cuda_on_cpu: no function {entry} in the source")
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    params = []
    for p in src[m.end():i - 1].split(","):
        p = " ".join(p.replace("__restrict__", "").split())
        ctype = re.sub(r"\s*\b\w+$", "", p).strip()  # less the name
        if "*" in ctype:
            params.append((ctype, True))
        else:
            base = " ".join(w for w in ctype.split() if w != "const")
            if base not in _INTS:
                raise ValueError(f"cuda_on_cpu: parameter {p!r}: pointers and integers only")
            params.append((_INTS[base], False))
    return params


def _driver(src: str, entry: str) -> str:
    params = _parameters(src, entry)
    call = ", ".join(f"({t})(uintptr_t)a[{i}]" if ptr else f"({t})(long long)a[{i}]"
                     for i, (t, ptr) in enumerate(params))
    return (f'#include "{HEADER}"\n#line 1 "kernel.cu"\n{_shared_to_cpu(src)}\n'
            f'extern "C" int cuda_on_cpu_nargs() {{ return {len(params)}; }}\n'
            'extern "C" int cuda_on_cpu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,\n'
            '    unsigned bz, unsigned long long dyn, unsigned seed, const unsigned long long* a, char* err, int nerr) {\n'
            f'  std::string e = cuda_on_cpu::launch(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, dyn, seed, [a] {{ {entry}({call}); }});\n'
            '  std::snprintf(err, nerr, "%s", e.c_str());\n'
            '  return e.empty() ? 0 : 1;\n}\n')


class Kernel:
    """One compiled kernel; call it as torch's NVRTC kernels are called, with CPU tensors."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.nargs = self.lib.cuda_on_cpu_nargs()
        f = self.lib.cuda_on_cpu_launch
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_ulonglong, ctypes.c_uint, ctypes.POINTER(ctypes.c_ulonglong),
                                             ctypes.c_char_p, ctypes.c_int]
        self.seed = 0  # 0: threads in order, shared memory random; else a random schedule too
        self.timeout = 120.0  # seconds a launch may take (in a forked process: a crash or a hang is an error)

    def __call__(self, grid, block, args, shared_mem: int = 0, seed: int | None = None):
        if len(args) != self.nargs:
            raise TypeError(f"the kernel takes {self.nargs} arguments, got {len(args)}")
        vals, tensors = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu":
                    raise ValueError("cuda_on_cpu runs on CPU tensors")
                vals.append(a.data_ptr())
                tensors.append(a)
            else:
                vals.append(int(a) & 0xFFFFFFFFFFFFFFFF)
        launch = (tuple(grid) + (1,) * (3 - len(grid)) + tuple(block) + (1,) * (3 - len(block))
                  + (int(shared_mem), self.seed if seed is None else int(seed)))
        err = _in_child(lambda: self._launch(launch, vals), tensors, self.timeout)
        if err:
            raise RuntimeError(f"cuda_on_cpu: {err}")

    def _launch(self, launch, vals) -> str:
        arr = (ctypes.c_ulonglong * max(1, len(vals)))(*vals)
        err = ctypes.create_string_buffer(512)
        rc = self.lib.cuda_on_cpu_launch(*launch, arr, err, len(err))
        return err.value.decode() if rc else ""


def _storages(tensors) -> list[tuple[int, int]]:
    """(address, bytes) of the tensors' storages, each once."""
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        out[s.data_ptr()] = s.nbytes()
    return list(out.items())


def _in_child(run, tensors, timeout: float) -> str:
    """``run()`` in a forked process, whose memory the kernel's bugs may break instead of this
    one's; the tensors' storages come back. A crash or a timeout is an error like the others."""
    storages = _storages(tensors)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: launch, send the storages back, exit without cleanup
        try:
            os.close(rfd)
            faulthandler.disable()  # (a crash is the parent's to report, in one line)
            err = run()
            blob = pickle.dumps((err, [ctypes.string_at(ptr, nbytes) for ptr, nbytes in storages]))
            with os.fdopen(wfd, "wb") as f:
                f.write(blob)
        finally:
            os._exit(0)
    os.close(wfd)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(rfd, "rb") as f:
        while True:
            ready, _, _ = select.select([f], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"the launch ran past {timeout:.0f} s (killed)"
            b = os.read(f.fileno(), 1 << 20)
            if not b:
                break
            chunks.append(b)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        why = " (an index out of an array's bounds)" if sig == "SIGILL" else ""
        return f"the kernel crashed: {sig}{why}"
    if not chunks:
        return "the launch's process exited without a result"
    err, data = pickle.loads(b"".join(chunks))
    for (ptr, _), d in zip(storages, data):
        ctypes.memmove(ptr, d, len(d))
    return err


def build(src: str, entry: str, cache_dir: str | None = None) -> Kernel:
    """Compiles ``src`` (CUDA C++) with the host compiler, once for a given text; raises
    RuntimeError with the compiler's message where it fails."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(f"cuda_on_cpu: no C++ compiler ({CXX})")
    text = _driver(src, entry)
    digest = hashlib.sha256((text + HEADER.read_text() + " ".join(FLAGS)).encode()).hexdigest()[:20]
    out_dir = Path(cache_dir or os.path.join(tempfile.gettempdir(), "tpflare_cuda_on_cpu"))
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"{entry}_{digest}.so"
    if not so.exists():
        fd, tmp_cpp = tempfile.mkstemp(suffix=".cpp", dir=out_dir)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp_so = tmp_cpp[:-4] + ".so"
        try:
            r = subprocess.run([cxx, *FLAGS, "-o", tmp_so, tmp_cpp], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"cuda_on_cpu: {cxx} failed:\n{r.stderr[-4000:]}")
            os.replace(tmp_so, so)  # atomic: concurrent builders of one text agree
        finally:
            for p in (tmp_cpp, tmp_so):
                if os.path.exists(p):
                    os.unlink(p)
    return Kernel(str(so))
