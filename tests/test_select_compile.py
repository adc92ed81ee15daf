"""ops/select_compile.py on the CPU: launches collected (never launched), tensors handed to
``warmup`` as their dtypes where they specialise alike, every collected launch warmed inside
Triton's own ``AsyncCompileMode`` with a thread pool, and the fallbacks (no such mode, a failed
warm-up) leaving the calls to compile as they launch. Fake kernels record what they get; the
real kernels' parallel compile runs on the GPU machine (tests/test_select_kernel_gpu.py,
``test_parallel_compile_compiles_what_the_call_launches``)."""
from __future__ import annotations

import contextlib
import inspect
import logging
import threading

import pytest
import torch

from tpflare.ops import select_compile as sc


class FakeCompiled:
    """What ``warmup`` returns: a compiled kernel whose ``run`` (Triton builds the launcher and
    loads the module on its first access) records the threads that asked for it."""

    def __init__(self, fail=False):
        self.fail, self.loads = fail, []

    @property
    def run(self):
        self.loads.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("cannot load")
        return lambda *a: None


class FakeFuture:
    """The async mode's ``FutureKernel``: the compiled kernel behind ``result()``."""

    def __init__(self, compiled):
        self.compiled = compiled

    def result(self):
        return self.compiled


class FakeKernel:
    """Records launches (``kernel[grid](...)``) and warm-ups, with whether Triton's async compile
    mode was active when ``warmup`` ran; ``warmup`` returns one compiled kernel, as Triton's does
    for one specialisation (``future``: behind a ``FutureKernel``)."""

    def __init__(self, name, fail=False, future=False, load_fails=False):
        self.name, self.fail = name, fail
        self.launched, self.warmed = [], []
        self.compiled = FakeCompiled(load_fails)
        self.future = future

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launched.append((grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        from triton.runtime import _async_compile

        if self.fail:
            raise RuntimeError(f"{self.name}: cannot compile")
        self.warmed.append((grid, args, kwargs, _async_compile.active_mode.get() is not None))
        return FakeFuture(self.compiled) if self.future else self.compiled


def two_launches(a, b, x):
    sc.launch(a, (2, 3), x, 7, CA=512, num_warps=4)
    sc.launch(b, (2,), x[1:], x, K=5)  # x[1:]: 4 bytes past x's start, off the 16-byte alignment
    return "done"


def test_launch_outside_collect_launches():
    a, b = FakeKernel("a"), FakeKernel("b")
    x = torch.zeros(8, dtype=torch.int32)
    assert not sc.collecting()
    two_launches(a, b, x)
    assert a.launched == [((2, 3), (x, 7), dict(CA=512, num_warps=4))]
    assert len(b.launched) == 1 and b.launched[0][0] == (2,)


def test_collect_records_and_launches_nothing():
    a, b = FakeKernel("a"), FakeKernel("b")
    x = torch.zeros(8, dtype=torch.int32)
    got = sc.collect(lambda: two_launches(a, b, x))
    assert not a.launched and not b.launched
    assert [(k.name, g) for k, g, _, _ in got] == [("a", (2, 3)), ("b", (2,))]
    (_, _, args_a, kw_a), (_, _, args_b, kw_b) = got
    assert args_a == (torch.int32, 7) and kw_a == dict(CA=512, num_warps=4)  # aligned tensor: its dtype
    assert args_b[0] is not None and args_b[0].data_ptr() % 16 == 4  # misaligned: the tensor itself
    assert args_b[1] == torch.int32 and kw_b == dict(K=5)
    assert not sc.collecting()


def test_collect_resets_after_an_exception():
    def boom():
        sc.launch(FakeKernel("a"), (1,), 1)
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        sc.collect(boom)
    assert not sc.collecting()
    k = FakeKernel("k")
    sc.launch(k, (1,), 3)
    assert k.launched == [((1,), (3,), {})]


def test_collect_nests_and_restores():
    a = FakeKernel("a")
    inner = []

    def outer():
        sc.launch(a, (1,), 1)
        inner.extend(sc.collect(lambda: sc.launch(a, (2,), 2)))
        sc.launch(a, (3,), 3)

    got = sc.collect(outer)
    assert [g for _, g, _, _ in got] == [(1,), (3,)] and [g for _, g, _, _ in inner] == [(2,)]
    assert not a.launched


def test_compile_in_parallel_warms_every_launch_in_async_mode():
    pytest.importorskip("triton")
    if sc.async_compile_mode() is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    a, b, c = FakeKernel("a"), FakeKernel("b"), FakeKernel("c")
    x = torch.zeros(8, dtype=torch.int32)
    n = sc.compile_in_parallel([lambda: two_launches(a, b, x), lambda: sc.launch(c, (4,), x, N=9)])
    assert n == 3
    assert not a.launched and not b.launched and not c.launched
    assert [w[:3] for w in a.warmed] == [((2, 3), (torch.int32, 7), dict(CA=512, num_warps=4))]
    assert c.warmed[0][:3] == ((4,), (torch.int32,), dict(N=9))
    assert all(w[3] for k in (a, b, c) for w in k.warmed), "warmup ran outside Triton's AsyncCompileMode"
    from triton.runtime import _async_compile

    assert _async_compile.active_mode.get() is None  # the mode is closed again


def test_compile_in_parallel_loads_each_compiled_kernel_once_in_its_pool():
    """After the compiles, each compiled kernel is loaded (its ``run`` asked for: Triton builds
    the launcher then) once, however many launches share it, in the pool's threads, not at the
    first launch one after another."""
    pytest.importorskip("triton")
    if sc.async_compile_mode() is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    a, b, c = FakeKernel("a"), FakeKernel("b", future=True), FakeKernel("c")
    x = torch.zeros(8, dtype=torch.int32)
    calls = [lambda: two_launches(a, b, x), lambda: two_launches(a, b, x), lambda: sc.launch(c, (4,), x)]
    assert sc.compile_in_parallel(calls) == 5
    assert len(a.warmed) == 2 and len(b.warmed) == 2  # every launch warmed (Triton dedups the compiles)
    for k in (a, b, c):
        assert len(k.compiled.loads) == 1, f"{k.name} loaded {len(k.compiled.loads)} times"
        assert k.compiled.loads[0].startswith("tpflare-compile"), k.compiled.loads


def test_load_failure_is_logged_not_raised(caplog):
    bad = FakeCompiled(fail=True)
    with caplog.at_level(logging.DEBUG, logger="tpflare.select_compile"):
        assert sc.load(bad) is False
        assert sc.load(FakeFuture(bad)) is False
        assert sc.load(None) is False
    assert "loading a kernel failed" in caplog.text and "cannot load" in caplog.text
    good = FakeCompiled()
    assert sc.load(FakeFuture(good)) is True and len(good.loads) == 1
    if sc.async_compile_mode() is not None:  # a kernel that does not load: the parallel compile still counts
        k = FakeKernel("k", load_fails=True)
        assert sc.compile_in_parallel([lambda: sc.launch(k, (1,), 1)]) == 1 and len(k.compiled.loads) == 1


def test_compile_in_parallel_without_async_mode_does_nothing(monkeypatch):
    monkeypatch.setattr(sc, "async_compile_mode", lambda: None)
    a = FakeKernel("a")
    ran = []
    assert sc.compile_in_parallel([lambda: ran.append(1) or sc.launch(a, (1,), 1)]) == 0
    assert not ran and not a.warmed and not a.launched


def test_compile_in_parallel_failure_is_logged_not_raised(caplog):
    pytest.importorskip("triton")
    if sc.async_compile_mode() is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    bad = FakeKernel("bad", fail=True)
    with caplog.at_level(logging.WARNING, logger="tpflare.select_compile"):
        assert sc.compile_in_parallel([lambda: sc.launch(bad, (1,), 1)]) == 0
    assert "parallel compile failed" in caplog.text and "cannot compile" in caplog.text
    assert not sc.collecting()
    with caplog.at_level(logging.WARNING, logger="tpflare.select_compile"):  # a call that raises: the same
        assert sc.compile_in_parallel([lambda: 1 / 0]) == 0
    assert "ZeroDivisionError" in caplog.text


class FailingCompile(FakeKernel):
    """A kernel whose compile fails in the async mode's pool, as Triton's does (``warmup``
    submits the compile to the active mode; the error comes out of its future)."""

    def warmup(self, *args, grid, **kwargs):
        from triton.runtime import _async_compile

        def compile_fn():
            raise RuntimeError(f"{self.name}: compile error in the pool")

        mode = _async_compile.active_mode.get()
        hooks = [lambda kernel: None] * (len(inspect.signature(mode.submit).parameters) - 2)  # finalize (, cleanup)
        return mode.submit(("key", self.name), compile_fn, *hooks)


def test_compile_in_parallel_after_a_failed_compile_in_the_pool(caplog, monkeypatch):
    """A compile that fails in the pool leaves no async mode active: Triton 3.6's mode re-raised
    the error before it cleared itself, and every later compile went to the closed pool. The
    mode here is Triton's with that order of exit, so the test holds on any Triton."""
    pytest.importorskip("triton")
    base = sc.async_compile_mode()
    if base is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    from triton.runtime import _async_compile

    class ExitRaisesFirst(base):  # Triton 3.5-3.6: the futures' errors raised before the mode clears
        def __exit__(self, *exc):
            for future in self.raw_futures:
                fk = self.future_kernels[future._key]
                if getattr(fk, "future", True) is not None:  # (Triton 3.9 clears a finished one's)
                    fk.result()
            _async_compile.active_mode.set(None)

    monkeypatch.setattr(sc, "async_compile_mode", lambda: ExitRaisesFirst)
    bad = FailingCompile("bad")
    with caplog.at_level(logging.WARNING, logger="tpflare.select_compile"):
        assert sc.compile_in_parallel([lambda: sc.launch(bad, (1,), 1)]) == 0
    assert "compile error in the pool" in caplog.text
    assert _async_compile.active_mode.get() is None
    good = FakeKernel("good")  # the next plan's compile runs in a new pool, in the mode again
    assert sc.compile_in_parallel([lambda: sc.launch(good, (1,), 1)]) == 1
    assert good.warmed and good.warmed[0][3]
    assert _async_compile.active_mode.get() is None


class SlowCompile(FakeKernel):
    """A kernel whose compile runs in the async mode's pool and takes ``seconds``, as Triton's does."""

    seconds = 0.5

    def warmup(self, *args, grid, **kwargs):
        import time

        from triton.runtime import _async_compile

        mode = _async_compile.active_mode.get()
        self.warmed.append((grid, args, kwargs, mode is not None))

        def compile_fn():
            time.sleep(self.seconds)
            return self.compiled

        hooks = [lambda kernel: None] * (len(inspect.signature(mode.submit).parameters) - 2)  # finalize (, cleanup)
        return mode.submit(("key", self.name, len(self.warmed)), compile_fn, *hooks)


def _production_kernels():
    # every Triton kernel of the selection modules (what a plan's first call can launch)
    import triton

    from tpflare.ops import radix, select_finish, select_kernel, select_staged

    return {f"{m.__name__}.{n}": v for m in (radix, select_finish, select_kernel, select_staged)
            for n, v in vars(m).items() if isinstance(v, triton.runtime.jit.JITFunction)
            and not getattr(v, "noinline", False) and v.fn.__module__ == m.__name__
            and any(p.is_constexpr for p in v.params) and "_kernel" in n}


def test_stand_in_copies_each_kernels_parameters():
    """A stand-in has its kernel's parameters: names in order, which are constexprs and their
    defaults, which are not specialised (so Triton gives it the kernel's argument types, and
    Triton 3.6 the kernel's launcher), and an empty body; made once a kernel."""
    pytest.importorskip("triton")
    kernels = _production_kernels()
    assert {"tpflare.ops.select_kernel._row_kernel", "tpflare.ops.radix.bucket_kernel"} <= set(kernels), kernels
    for name, kernel in kernels.items():
        twin = sc.stand_in(kernel)
        assert twin is not None, name
        assert sc.stand_in(kernel) is twin  # once a kernel
        assert twin.arg_names == kernel.arg_names and twin.constexprs == kernel.constexprs, name
        assert [p.do_not_specialize for p in twin.params] == [p.do_not_specialize for p in kernel.params], name
        assert [p.do_not_specialize_on_alignment for p in twin.params] == \
            [p.do_not_specialize_on_alignment for p in kernel.params], name
        assert [(p.has_default, p.default if p.has_default else None) for p in twin.params] == \
            [(p.has_default, p.default if p.has_default else None) for p in kernel.params], name
        assert "pass" in twin.src and twin.src.strip().endswith("pass"), twin.src
    assert any(p.do_not_specialize for p in kernels["tpflare.ops.select_kernel._row_kernel"].params)


def test_no_stand_in_for_what_it_cannot_copy():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    marker = object()

    def with_object_default(x_ptr, B: tl.constexpr = marker):
        pass

    def with_annotation(x_ptr, n: int, B: tl.constexpr):
        pass

    def plain(x_ptr, n, B: tl.constexpr, F: tl.constexpr = 0.5):
        tl.store(x_ptr, n + B)

    assert sc.stand_in(triton.jit(with_object_default)) is None  # a default that is no literal
    assert sc.stand_in(triton.jit(with_annotation)) is None  # an annotation other than tl.constexpr
    assert sc.stand_in(FakeKernel("not jit")) is None
    twin = sc.stand_in(triton.jit(plain, do_not_specialize=["n"]))
    assert twin is not None and twin.arg_names == ["x_ptr", "n", "B", "F"] and twin.constexprs == [2, 3]
    assert [p.do_not_specialize for p in twin.params] == [False, True, False, False]
    assert twin.params[3].default == 0.5 and "tl.store" not in twin.src


def test_compile_in_parallel_builds_each_kernels_launcher_ahead(monkeypatch, caplog):
    """Where Triton builds a launcher a kernel, each kernel's stand-in is compiled (in a pool
    thread, outside the async mode: at once) and loaded while the kernels compile, once a
    kernel, with the kernel's first launch's arguments; without such a Triton, no stand-in."""
    pytest.importorskip("triton")
    if sc.async_compile_mode() is None:
        pytest.skip("this Triton has no AsyncCompileMode")
    a, b = SlowCompile("a"), SlowCompile("b")
    twins = {id(a): FakeKernel("a's stand-in"), id(b): FakeKernel("b's stand-in")}
    monkeypatch.setattr(sc, "stand_in", lambda kernel: twins.get(id(kernel)))
    on_device = threading.local()  # the device a pool thread has current (sc._on_device), by thread
    monkeypatch.setattr(sc, "_current_device", lambda: 3)

    @contextlib.contextmanager
    def fake_device(device):
        before = getattr(on_device, "d", None)
        on_device.d = device
        try:
            yield
        finally:
            on_device.d = before

    monkeypatch.setattr(sc, "_on_device", fake_device)
    t_dev = []
    for t in twins.values():  # each stand-in's warm-up records the device current in its thread
        t.warmup = (lambda w: lambda *a, grid, **kw: (t_dev.append(getattr(on_device, "d", None)),
                                                        w(*a, grid=grid, **kw))[1])(t.warmup)
    x = torch.zeros(8, dtype=torch.int32)
    monkeypatch.setattr(sc, "builds_launchers", lambda: False)
    assert sc.compile_in_parallel([lambda: two_launches(a, b, x)]) == 2
    assert not any(t.warmed for t in twins.values())
    monkeypatch.setattr(sc, "builds_launchers", lambda: True)
    with caplog.at_level(logging.INFO, logger="tpflare.select_compile"):
        # (threads: one a task, as on a GPU host; a pool of fewer drops a stand-in not started in time)
        assert sc.compile_in_parallel([lambda: two_launches(a, b, x), lambda: two_launches(a, b, x)], threads=6) == 4
    assert "(2 launchers built ahead)" in caplog.text, caplog.text
    ta, tb = twins[id(a)], twins[id(b)]
    assert [w[:3] for w in ta.warmed] == [((2, 3), (torch.int32, 7), dict(CA=512, num_warps=4))]
    assert len(tb.warmed) == 1 and tb.warmed[0][2] == dict(K=5)
    assert not ta.warmed[0][3] and not tb.warmed[0][3], "a stand-in compiled in the async mode (not at once)"
    for t in (ta, tb):
        assert len(t.compiled.loads) == 1 and t.compiled.loads[0].startswith("tpflare-compile"), t.compiled.loads
    assert t_dev == [3, 3], "a stand-in compiled off the caller's device (a pool thread's own is device 0)"
    bad = FakeKernel("bad stand-in", fail=True)  # a stand-in that fails costs nothing but the log line
    twins[id(a)] = bad
    sc._STAND_INS.clear()
    assert sc.compile_in_parallel([lambda: two_launches(a, b, x)], threads=4) == 2
    assert len(a.compiled.loads) == 3


def test_compile_in_parallel_of_no_launches():
    assert sc.compile_in_parallel([]) == 0
    assert sc.compile_in_parallel([lambda: None]) == 0


def test_every_selection_kernel_launches_through_launch():
    """No selection module launches a Triton kernel as ``kernel[grid](...)``: a launch that
    bypassed ``select_compile.launch`` would escape the parallel warm-up (and compile serially
    in every first call). Every ``@triton.jit`` function of the modules is looked for."""
    triton = pytest.importorskip("triton")
    import importlib
    import inspect
    import re

    names = ("select_kernel", "select_staged", "select_finish", "radix")
    kernels, sources = set(), {}
    for name in names:
        mod = importlib.import_module(f"tpflare.ops.{name}")
        sources[name] = inspect.getsource(mod)
        kernels |= {k for k, v in vars(mod).items() if isinstance(v, triton.runtime.JITFunction)}
    assert {"_row_kernel", "_hist_kernel", "_compact_kernel", "_walk_kernel", "_rank_kernel"} <= kernels
    direct = [(name, m.group(0)) for name, src in sources.items()
              for m in re.finditer(r"\b(\w+)\[[^\]\n]*\]\(", src) if m.group(1) in kernels]
    assert not direct, f"kernels launched without select_compile.launch: {direct}"


class _Stop(Exception):
    pass


@pytest.mark.parametrize("q, n, opts", [(1, 16384, {}), (4, 9000, {}), (8, 32768, {}), (64, 16384, {}),
                                        (64, 40000, {}), (64, 16384, dict(radix_bits=6)),
                                        (2, 16384, dict(staged=dict(radix_bits=6))), (1, 16384, dict(path="row"))])
def test_first_call_compiles_the_call_it_was_given(monkeypatch, q, n, opts):
    """A plan's first call hands select_compile a call with the caller's own options, which runs
    (collected) on every path. (Up to session 11 of 2026-12-03 it passed the digit width after
    resolving it, which the staged path rejects as a row kernel option: the parallel compile
    failed, with a warning, and every staged plan compiled its kernels one after another.) Host
    code only: the collected call launches nothing, and the call stops before it would launch."""
    triton = pytest.importorskip("triton")  # noqa: F841
    from tpflare.ops import select_kernel as sk

    if not sk._HAVE_TRITON:
        pytest.skip("the selection kernels need Triton")
    got = []

    def compile_in_parallel(calls):
        got.extend(one for call in calls for one in sc.collect(call))  # raises what the call raises
        raise _Stop

    monkeypatch.setattr(sk, "_interpret", lambda: True)  # (CPU tensors: nothing runs on a device here)
    monkeypatch.setattr(sk, "_compiles", lambda scores: True)
    monkeypatch.setattr(sk, "compile_in_parallel", compile_in_parallel)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(sk, "_WARMED", set())
    scores = torch.randn(q, n)
    ids = torch.arange(n, dtype=torch.int32).expand(q, n).contiguous()
    with pytest.raises(_Stop):
        sk.triton_ordered_select(scores, ids, 2048, **opts)
    path = opts.get("path") or ("staged" if opts.get("staged") else sk.choose_path(q, n, 2048, 132))
    names = [kernel.fn.__name__ for kernel, _, _, _ in got]
    assert names, "the first call collected no launch"
    assert ("_row_kernel" in names) == (path == "row") and ("_hist_kernel" in names) == (path == "staged"), names
