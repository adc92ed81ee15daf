"""Compile the selection kernels of one or more calls at once (a plan's first call, ``precompile``).

A call of ``select_kernel.triton_ordered_select`` launches one to four Triton kernels (the
staged path: histogram, compact, the narrowing walk, the ordering), and the first call of a
launch plan compiles each of them in turn, in the calling thread. (The block path launches no
Triton kernel: ``select_block`` compiles its CUDA function through NVRTC at its first call, or,
inside ``collect``, when the call is collected.) Every launch of those modules
goes through ``launch``. ``compile_in_parallel(calls)`` runs each call once with its launches
collected instead of launched (the host code runs, nothing reaches the GPU but the workspace's
allocations), then hands every collected kernel to Triton's ``warmup`` (compile, no launch)
inside Triton's ``AsyncCompileMode`` with a pool of threads, and waits for them all. Triton
releases the GIL in parts of its pipeline (LLVM's code generation; ptxas is a subprocess), so
the compiles overlap. Then, in the same pool, each compiled kernel is made ready to launch
(``load``: its launcher built, its module loaded on the device), which Triton otherwise does at
the kernel's first launch, one kernel after another: Triton 3.6 compiles a C launcher a kernel
with the host's C compiler (a subprocess, about 0.25 s each on the H200 host,
docs/benchmarks_select_kernel.md, session 11). The calls that follow find every kernel compiled
and loaded.

A launcher's C source depends on the kernel's argument types only (which are pointers, which
integers of 32 or 64 bits, which constexprs), and Triton keeps built launchers in its cache by
their source. So where this Triton builds one launcher a kernel (3.6; from 3.8 one generic
launcher serves every kernel), each kernel's *stand-in* (``stand_in``: the kernel's parameters,
an empty body) is compiled and loaded in the pool while the kernels compile: a compile of a few
tenths of a second, whose launcher build then lands in the cache, so a kernel's own load finds
its launcher built. Before, that build came after the last compile, on the first call's
critical path (0.33 s of a row plan's 3.40 s in session 11's timeline).

Nothing here is needed for correctness: where this Triton has no ``AsyncCompileMode``, inside
a CUDA-graph capture, or when a warm-up fails (logged on ``tpflare.select_compile``), the
calls compile as they launch, as before.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import inspect
import linecache
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

log = logging.getLogger("tpflare.select_compile")

__all__ = ["launch", "collecting", "collect", "async_compile_mode", "compile_in_parallel", "load", "builds_launchers",
           "stand_in"]

MAX_THREADS = 16  # compile threads at most (one a kernel, up to the machine's CPUs)

_collect: contextvars.ContextVar = contextvars.ContextVar("tpflare_select_collect", default=None)
_STAND_INS: dict = {}  # id(kernel) -> (kernel, its stand-in or None)
_STAND_INS_LOCK = threading.Lock()


def launch(kernel, grid, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, or, inside ``collect``, record the launch instead."""
    pending = _collect.get()
    if pending is not None:
        pending.append((kernel, grid, args, kwargs))
        return
    kernel[grid](*args, **kwargs)


def collecting() -> bool:
    """Whether launches are being collected (a call inside ``collect``)."""
    return _collect.get() is not None


def _as_warmup_arg(a):
    # a tensor as Triton's specialisation sees it: its dtype (``warmup`` takes a torch dtype for a
    # tensor whose data pointer is 16-byte aligned), so no collected launch keeps memory alive; a
    # tensor off that alignment stays itself (it specialises otherwise)
    if hasattr(a, "data_ptr") and hasattr(a, "dtype") and a.data_ptr() % 16 == 0:
        return a.dtype
    return a


def collect(call: Callable[[], object]) -> list:
    """The launches ``call()`` makes, as ``(kernel, grid, args, kwargs)``, none of them launched;
    tensors given as their dtypes where ``warmup`` specialises them alike (``_as_warmup_arg``)."""
    token = _collect.set([])
    try:
        call()
        return [(kernel, grid, tuple(_as_warmup_arg(a) for a in args), kwargs)
                for kernel, grid, args, kwargs in _collect.get()]
    finally:
        _collect.reset(token)


def async_compile_mode():
    """Triton's ``AsyncCompileMode`` class where this Triton has it (3.5 and later), else None."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except Exception:  # older Triton, or none
        return None
    return AsyncCompileMode


def load(compiled, device=None) -> bool:
    """Make a kernel that ``warmup`` returned ready to launch, on CUDA device ``device`` (an index;
    None: the thread's current one): Triton builds a compiled kernel's launcher and loads its
    module on the first access of its ``run`` (a ``FutureKernel`` of the async mode first gives
    its result). Returns whether it did; a failure is logged, and the first launch then does it."""
    try:
        kernel = _result(compiled)
        if kernel is None:  # (a warm-up that compiled nothing)
            return False
        with _on_device(device):
            getattr(kernel, "run")
        return True
    except Exception as e:  # the kernel's first launch loads it, as without this
        log.debug("tpflare.select_compile: loading a kernel failed (%s: %s)", type(e).__name__, str(e)[:300])
        return False


def _on_device(device):
    # CUDA device ``device`` (an index) current in this thread, None: the thread's own (a pool
    # thread's is device 0 whatever the caller's, so everything a pool thread asks of the
    # device runs under this)
    if device is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(device)


def _result(compiled):
    # the compiled kernel behind the async mode's FutureKernel (the idiom of Triton's own launch)
    return compiled.result() if hasattr(compiled, "result") else compiled


def _leave(active) -> None:
    # Triton's async mode stays active where a compile in it failed: its __exit__ (Triton 3.5-3.6)
    # re-raises the compile's error before it clears the mode, and every later compile of this
    # context would then go to the closed pool ("cannot schedule new futures after shutdown");
    # cleared here when it is still the mode this module entered (Triton 3.9 clears it first)
    try:
        from triton.runtime import _async_compile

        if _async_compile.active_mode.get() is active:
            _async_compile.active_mode.set(None)
    except Exception:  # pragma: no cover - a Triton without that module has no such mode
        pass


def builds_launchers() -> bool:
    """Whether this Triton compiles a C launcher for each kernel (Triton 3.6's CUDA driver has
    ``make_launcher``; from 3.8 one generic launcher serves every kernel)."""
    try:
        from triton.backends.nvidia import driver
    except Exception:  # no Triton, or no CUDA backend
        return False
    return callable(getattr(driver, "make_launcher", None))


def _stand_in_source(kernel, name: str) -> str | None:
    # ``def name(<kernel's parameters>): pass``, or None where a parameter is not one a stand-in
    # can copy (keyword-only, annotated other than tl.constexpr, a default that is not a literal)
    sig = inspect.signature(kernel.fn)
    parts = []
    for p in kernel.params:
        prm = sig.parameters[p.name]
        if prm.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            return None
        if p.is_constexpr:
            part = f"{p.name}: tl.constexpr"
        elif prm.annotation is inspect.Parameter.empty:
            part = p.name
        else:
            return None
        if prm.default is not inspect.Parameter.empty:
            text = repr(prm.default)
            try:
                if ast.literal_eval(text) != prm.default:
                    return None
            except (ValueError, SyntaxError):
                return None
            part += f" = {text}"
        parts.append(part)
    return f"def {name}({', '.join(parts)}):\n    pass\n"


def stand_in(kernel):
    """A Triton kernel with ``kernel``'s parameters (names, order, constexprs and their defaults,
    those not specialised) and an empty body, made once a kernel; None where ``kernel`` is not a
    plain ``triton.jit`` kernel or has a parameter a stand-in cannot copy. Launched with the
    kernel's arguments it has the kernel's argument types, so Triton builds it the launcher the
    kernel will use (the module docstring)."""
    key = id(kernel)
    with _STAND_INS_LOCK:
        hit = _STAND_INS.get(key)
        if hit is not None and hit[0] is kernel:
            return hit[1]
        made = None
        try:
            import triton
            import triton.language as tl

            if isinstance(kernel, triton.runtime.jit.JITFunction):
                name = f"tpflare_stand_in_{kernel.fn.__name__}"
                src = _stand_in_source(kernel, name)
                if src is not None:
                    filename = f"<tpflare stand-in of {kernel.fn.__module__}.{kernel.fn.__qualname__}>"
                    # (Triton's jit reads a kernel's source through inspect, which finds it here)
                    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
                    namespace = {"tl": tl}
                    exec(compile(src, filename, "exec"), namespace)
                    made = triton.jit(namespace[name], do_not_specialize=list(kernel.do_not_specialize),
                                      do_not_specialize_on_alignment=list(kernel.do_not_specialize_on_alignment))
        except Exception as e:  # no stand-in: the kernel's load builds its launcher, as before
            log.debug("tpflare.select_compile: no stand-in for %r (%s: %s)", kernel, type(e).__name__, str(e)[:200])
            made = None
        _STAND_INS[key] = (kernel, made)
        return made


def _build_launcher_ahead(ahead, grid, args, kwargs, device) -> bool:
    # a stand-in compiled (in this pool thread: no async mode here; on the caller's device, whose
    # target Triton reads) and loaded, which builds the launcher its kernel will find in Triton's cache
    try:
        with _on_device(device):
            return load(ahead.warmup(*args, grid=grid, **kwargs), device)
    except Exception as e:
        log.debug("tpflare.select_compile: a stand-in failed (%s: %s)", type(e).__name__, str(e)[:300])
        return False


def _current_device():
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None


def compile_in_parallel(calls: Iterable[Callable[[], object]], threads: int | None = None) -> int:
    """Compile every kernel the ``calls`` launch, at once; return how many launches were warmed
    (0 where nothing was: no ``AsyncCompileMode``, or a failure, logged; the calls then compile
    as they launch). Kernels compiled already are found in Triton's cache and cost nothing."""
    mode = async_compile_mode()
    if mode is None:
        log.debug("tpflare.select_compile: this Triton has no AsyncCompileMode; kernels compile as they launch")
        return 0
    t0 = time.perf_counter()
    try:
        launches = [one for call in calls for one in collect(call)]
        if not launches:
            return 0
        ahead = {}  # id(kernel) -> its stand-in and first launch (launchers built during the compiles)
        if builds_launchers():
            for kernel, grid, args, kwargs in launches:
                if id(kernel) not in ahead and (twin := stand_in(kernel)) is not None:
                    ahead[id(kernel)] = (twin, grid, args, kwargs)
        workers = threads or max(1, min(len(launches) + len(ahead), os.cpu_count() or 1, MAX_THREADS))
        device = _current_device()
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tpflare-compile") as pool:
            active = mode(pool)
            try:
                with active:
                    compiled = [kernel.warmup(*args, grid=grid, **kwargs) for kernel, grid, args, kwargs in launches]
                    built = [pool.submit(_build_launcher_ahead, *one, device) for one in ahead.values()]
            finally:
                _leave(active)
            # (the mode's exit waited for every compile; a stand-in's compile is short, so its
            # launcher is built by now, except in a pool of fewer threads than tasks: one not
            # started is dropped, and its kernel's load builds the launcher, as without it);
            # each compiled kernel once (launches of one specialisation share it), loaded at once
            for f in built:
                f.cancel()
            kernels = {id(k): k for k in map(_result, compiled) if k is not None}
            loaded = sum(pool.map(lambda k: load(k, device), kernels.values()))
            ahead_built = sum(f.result() for f in built if not f.cancelled())
    except Exception as e:  # the real launches compile (and raise) as they would have
        log.warning("tpflare.select_compile: parallel compile failed (%s: %s); kernels compile as they launch",
                    type(e).__name__, str(e)[:300])
        return 0
    log.info("tpflare.select_compile: %d launches warmed, %d kernels loaded (%d launchers built ahead), in %.2f s "
             "(%d threads)", len(launches), loaded, ahead_built, time.perf_counter() - t0, workers)
    return len(launches)
