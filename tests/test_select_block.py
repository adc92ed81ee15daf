"""The block path's dispatch and its CUDA source, on any machine (the kernel's exactness: on the
CPU, tests/test_select_block_cpu.py; on the GPU, tests/test_select_kernel_gpu.py, every test with a
``block`` case)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

from tpflare.ops import select_block
from tpflare.ops import select_kernel as sk

SHIPPED = select_block.__name__ == "tpflare.ops.select_block"  # (else a variant in its place: --block-module)


def _plan(q, n, k, chunk, shipped):
    """A long row's kernels, its chunks then their merge, on 132 SMs: as written for the shipped
    module, else the variant's own."""
    return shipped if SHIPPED else select_block.plan_kernels(n, k, chunk, q, keep=False, n_sm=132)


def test_tiles_hold_their_rows():
    assert [select_block.tile(n) for n in (0, 1, 4096, 4097, 8192, 8193, 16384)] == [256, 256, 256, 512, 512, 1024,
                                                                                      1024]
    with pytest.raises(ValueError, match="at most 16384"):
        select_block.tile(16385)
    assert select_block.MAX_N == sk.MAX_CANDIDATES == 131072  # (triton_ordered_select's bound is the block path's)
    assert select_block.supports(131072, 2048) and select_block.supports(16385, 1) and select_block.supports(0, 1)
    assert not select_block.supports(131073, 1) and not select_block.supports(100, 0)
    assert not select_block.supports(100, 2049)


def test_long_rows_are_cut_into_chunks_a_merge_holds():
    """Rows beyond a block's 16384 candidates: the fewest chunks of equal size, each keeping its
    best min(k, chunk) for one merge block (at most 16384 candidates: 8 chunks of k = 2048)."""
    assert select_block.chunking(16384, 2048) == (1, 16384, 2048)
    assert select_block.chunking(16385, 2048) == (2, 8193, 2048)
    assert select_block.chunking(131072, 2048) == (8, 16384, 2048)
    assert select_block.chunking(100000, 5) == (7, 14286, 5)
    assert select_block.chunking(0, 7) == (1, 1, 1)
    if SHIPPED:
        assert select_block.plan_kernels(9000, 2048) == (("row", 1024),)
        # two chunks of 8193 (1024 threads), a merge of 4096 (256)
        assert select_block.plan_kernels(16385, 2048) == (("chunks", 1024), ("merge", 256))
        assert select_block.plan_kernels(131072, 2048) == (("chunks", 1024), ("merge", 1024))
        assert select_block.plan_kernels(131072, 64) == (("chunks", 1024), ("merge", 256))
        # from SAMPLED_MIN_ROWS rows a call: the sample, the keep, the chunks where the keep may miss a
        # winner, the merge of a workspace row of max(chunks x kc, 4 k) (at most 16384)
        rows = select_block.SAMPLED_MIN_ROWS
        assert select_block.plan_kernels(16385, 2048, q=rows - 1) == (("chunks", 1024), ("merge", 256))
        assert select_block.plan_kernels(16385, 2048, q=rows) == (
            ("sample", 256), ("keep", 256), ("chunks_gated", 1024), ("merge_gated", 512))
        assert select_block.plan_kernels(131072, 2048, q=rows) == (
            ("sample", 256), ("keep", 256), ("chunks_gated", 1024), ("merge_gated", 1024))
        assert select_block.plan_kernels(9000, 2048, q=4096) == (("row", 1024),)
    for n in (1, 2, 16383, 16384, 16385, 40000, 98305, 131071, 131072):
        for k in (1, 7, 2048):
            chunks, chunk, kc = select_block.chunking(n, k)
            assert chunks == -(-n // chunk) and chunk <= select_block.TILE_N and (chunks - 1) * chunk < n
            assert chunks == 1 or chunks * kc <= select_block.TILE_N
    # a shorter chunk, where the merge holds what the chunks keep
    assert select_block.chunking(1000, 5, chunk=3) == (334, 3, 3)
    assert select_block.chunking(32768, 1024, chunk=4096) == (8, 4096, 1024)
    with pytest.raises(ValueError, match="more than a block's 16384"):
        select_block.chunking(32768, 2048, chunk=4000)  # 9 chunks of 2048: 18432
    with pytest.raises(ValueError, match="chunk must be in 1..16384"):
        select_block.chunking(32768, 8, chunk=16385)
    with pytest.raises(ValueError, match="chunk must be in 1..16384"):
        select_block.chunking(100, 8, chunk=0)


def _order(scores: list[float], bits: list[int], ids: list[int], positions) -> list[int]:
    """The candidates at ``positions`` under the Order rule (the plain-sort reference's rank, then
    position), as positions."""
    from test_select_kernel_gpu import _py_rank

    return sorted(positions, key=lambda p: _py_rank(scores[p], bits[p] & 0xFFFFFFFF, ids[p]) + (p,))


@pytest.mark.parametrize("kind", ["random", "ties", "equal", "special", "padding", "dups", "nandups"])
def test_a_rows_best_are_among_its_chunks_best(kind):
    """The block path's long rows, in plain Python: each chunk of ``chunking``'s cut keeps its first
    ``kc`` (as the chunks kernel does), and the first k of their union are the row's first k
    (the merge), position for position; the row's order itself equals the tests' plain-sort
    reference (tests/test_select_kernel_gpu.py's ref_python) in ids and score bits."""
    from test_select_kernel_gpu import make_case, ref_python

    for n, k, chunk in [(37, 5, 4), (300, 64, None), (300, 1, 7), (1000, 300, 100), (1000, 2048, 333), (50, 50, 8)]:
        scores, ids = make_case(kind, 3, n, k, seed=n + k)
        ref_ids, ref_sc = ref_python(scores, ids, k)
        chunks, chunk, kc = select_block.chunking(n, k, chunk)
        for r in range(3):
            sl, bits, idl = scores[r].tolist(), scores[r].view(torch.int32).tolist(), ids[r].tolist()
            row = [p for p in _order(sl, bits, idl, range(n))[:k] if idl[p] >= 0]
            kept = [p for c in range(chunks)
                    for p in _order(sl, bits, idl, range(c * chunk, min(n, (c + 1) * chunk)))[:kc]]
            merged = [p for p in _order(sl, bits, idl, kept)[:k] if idl[p] >= 0]
            assert merged == row, (kind, n, k, chunk, r)
            assert [idl[p] for p in row] == ref_ids[r, :len(row)].tolist(), (kind, n, k, r)
            assert [bits[p] for p in row] == ref_sc[r, :len(row)].view(torch.int32).tolist(), (kind, n, k, r)
            assert (ref_ids[r, len(row):] == -1).all()


@pytest.fixture
def block_runs(monkeypatch):
    """The dispatcher as on a machine where the block path runs."""
    monkeypatch.setattr(select_block, "available", lambda: True)
    sk._first_call_plan.cache_clear()
    yield
    sk._first_call_plan.cache_clear()


def test_dispatcher_takes_the_block_path_beyond_the_staged_rows(block_runs, monkeypatch):
    assert sk.choose_path(5, 16384, 2048, 132) == "block"
    assert sk.choose_path(4096, 100, 1, 132) == "block"
    assert sk.choose_path(4, 16384, 2048, 132) == "staged"  # few rows: the staged path
    # a long row, any row count beyond the staged path's: the block path (the row kernel only where it
    # does not run)
    for q, n in ((1024, 32768), (63, 16385), (8, 131072), (17, 131072), (63, 131072), (64, 131072), (34, 65536)):
        assert sk.choose_path(q, n, 2048, 132) == "block", (q, n)
    monkeypatch.setattr(select_block, "available", lambda: False)
    assert sk.choose_path(17, 131072, 2048, 132) == "row" and sk.choose_path(5, 16384, 2048, 132) == "row"
    monkeypatch.setattr(select_block, "available", lambda: True)
    # its chunks, then their merge (up to 8 rows, in 2 chunks, or while the rows' chunks fit one wave
    # of blocks: a block an SM); else (from SAMPLED_MIN_ROWS (64) rows, or beyond one wave) the sampled keep
    keep = [(16, 131072, 132), (33, 65536, 132), (44, 32769, 132), (8, 131072, 64), (63, 32768, 32), (63, 16385, 32)]
    assert not any(sk.block_keep(q, n, 2048, n_sm) for q, n, n_sm in keep)
    beyond = [(17, 131072, 132), (34, 65536, 132), (45, 32769, 132), (16, 131072, 114), (63, 131072, 132),
              (9, 131072, 64)]
    assert all(sk.block_keep(q, n, 2048, n_sm) for q, n, n_sm in beyond)  # (114 SMs: an H100 PCIe's)
    assert sk.block_keep(64, 32768, 2048, 132) and not sk.block_keep(1024, 16384, 2048, 132)
    assert sk.launch_plan(17, 131072, 2048) == sk.launch_plan(64, 131072, 2048)
    assert sk.launch_plan(16, 131072, 2048) == ("block", 2048, ("chunks", 1024), ("merge", 1024))
    assert sk.launch_plan(64, 131072, 2048) == ("block", 2048, ("sample", 256), ("keep", 256), ("chunks_gated", 1024),
                                                ("merge_gated", 1024))
    assert sk.block_chunk(64, 40000, 100, 132) is None  # (the sampled keep's chunks: the fewest, as timed)
    assert sk.launch_plan(64, 9000, 1500) == ("block", 2048, ("row", 1024))
    assert sk.launch_plan(64, 4000, 2048) == ("block", 2048, ("row", 256))
    # chunks of 8192 where they make at most 2 blocks an SM and the merge holds their best
    assert sk.block_chunk(8, 65536, 100, 132) == 8192
    assert sk.launch_plan(8, 65536, 100) == ("block", 128) + _plan(8, 65536, 100, 8192, (("chunks", 512), ("merge", 256)))
    assert sk.block_chunk(63, 32768, 2048, 132) == 8192
    assert sk.launch_plan(63, 32768, 2048) == ("block", 2048) + _plan(63, 32768, 2048, 8192, (("chunks@2", 512), ("merge", 512)))
    assert sk.block_chunk(67, 32768, 2048, 132) is None  # 268 blocks of 8192: more than 2 an SM
    assert sk.block_chunk(8, 131072, 2048, 132) is None  # 16 chunks' 2048 each: more than a merge holds
    assert sk.launch_plan(8, 131072, 2048) == ("block", 2048) + _plan(8, 131072, 2048, None, (("chunks", 1024), ("merge", 1024)))
    assert sk.block_chunk(1000, 16384, 2048, 132) is None
    monkeypatch.setattr(sk, "BLOCK_PATH", False)
    assert sk.choose_path(5, 16384, 2048, 132) == "row"


def test_the_512_tile_runs_two_blocks_an_sm_where_a_launch_has_more_blocks_than_sms(block_runs):
    """select_block.paired: a kind of the 512 tile compiles for two blocks an SM (kind + "@2",
    __launch_bounds__(512, 2)) where its launch has more blocks than the device has SMs; the other
    tiles, fewer blocks, or no SM count given: one block an SM."""
    if not SHIPPED:
        pytest.skip("the shipped module's tiles")
    plan = select_block.plan_kernels
    assert plan(8192, 2048, q=132, n_sm=132) == (("row", 512),) and plan(8192, 2048, q=133, n_sm=132) == (("row@2", 512),)
    assert plan(8192, 2048, q=4096) == (("row", 512),)  # (no SM count)
    assert plan(4096, 2048, q=4096, n_sm=132) == (("row", 256),)
    # a long row: the chunks' blocks (rows x chunks) and the merge's (rows), each against the SMs
    assert plan(20000, 2048, q=1024, n_sm=132) == (("sample", 256), ("keep", 256), ("chunks_gated", 1024),
                                                   ("merge_gated@2", 512))
    assert plan(32768, 2048, 8192, q=40, n_sm=132) == (("chunks@2", 512), ("merge", 512))
    assert plan(32768, 2048, 8192, q=33, n_sm=132) == (("chunks", 512), ("merge", 512))
    assert sk.launch_plan(1024, 8192, 2048, 132) == ("block", 2048, ("row@2", 512))
    assert sk.launch_plan(64, 8192, 2048, 132) == ("block", 2048, ("row", 512))
    for kind in ("row", "chunks", "merge", "chunks_gated", "merge_gated"):
        one, two = select_block.source(512, kind), select_block.source(512, kind + select_block.PAIRED)
        assert "#define MINB 1\n" in one and "#define MINB 2\n" in two
        assert one.replace("#define MINB 1\n", "#define MINB 2\n") == two
    assert "__launch_bounds__(THREADS, MINB)" in select_block.SOURCE


def test_the_1024_tiles_rows_take_the_filter_kind_beyond_one_wave(block_runs):
    """Rows of 8193-16384 candidates: one 1024-thread block a row (kind row) while the rows are at
    most the SMs (FILTER_OVER_SMS), the filter kind (512 threads, two blocks an SM) beyond; with no SM
    count given, the row kind. The filter compiles for two blocks an SM at 512 threads only."""
    if not SHIPPED:
        pytest.skip("the shipped module's tiles")
    plan = select_block.plan_kernels
    assert plan(16384, 2048, q=132, n_sm=132) == (("row", 1024),)
    assert plan(16384, 2048, q=133, n_sm=132) == (("filter", 512),) == plan(8193, 1, q=4096, n_sm=132)
    assert plan(8192, 2048, q=4096, n_sm=132) == (("row@2", 512),) and plan(16384, 2048, q=4096) == (("row", 1024),)
    assert sk.launch_plan(1024, 16384, 2048, 132) == ("block", 2048, ("filter", 512))
    src = select_block.source(512, "filter")
    assert "#define MINB 2\n" in src and "#define THREADS 512\n" in src and select_block.FILTER_KERNEL in src
    assert select_block.KIND_THREADS["filter"] == 512 and select_block.dyn_bytes("filter") == 65536


def test_dispatcher_keeps_the_row_kernel_where_the_block_path_cannot_run(monkeypatch):
    monkeypatch.setattr(select_block, "available", lambda: False)
    assert sk.choose_path(64, 16384, 2048, 132) == "row"


def test_block_path_refuses_what_it_does_not_take():
    cases = [(dict(path="block", order="sort"), "no option"), (dict(path="block", refine=0), "no option"),
             (dict(path="block", staged=dict(fuse=False)), "no option")]
    s, i = torch.zeros(8, 100), torch.zeros(8, 100, dtype=torch.int32)
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg if os.environ.get("TRITON_INTERPRET") == "1" else "CUDA|no option"):
            sk.triton_ordered_select(s, i, 5, **kw)
    with pytest.raises(ValueError, match="CUDA|unsupported shape"):
        sk.triton_ordered_select(torch.zeros(8, 131073), torch.zeros(8, 131073, dtype=torch.int32), 5, path="block")


def test_block_path_is_off_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert not select_block.available()
    assert sk.choose_path(64, 16384, 2048, 132) == "row"


@pytest.mark.parametrize("kind", list(select_block.KINDS))
@pytest.mark.parametrize("threads", select_block.TILES)
def test_source_compiles_for_every_tile(tmp_path, threads, kind):
    """The kernel's CUDA source, as NVRTC gets it, compiles for sm_90 with nvcc for every tile and
    kind (a kind of one block size, KIND_THREADS, at that size), where nvcc is installed (the GPU
    tests run it)."""
    if select_block.KIND_THREADS.get(kind, threads) != threads:
        pytest.skip(f"kind {kind} runs {select_block.KIND_THREADS[kind]} threads only")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    src = tmp_path / "block.cu"
    src.write_text(select_block.source(threads, kind))
    out = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "b.cubin"), str(src)],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "tpflare_select_rows" in out.stderr, out.stderr
    # (every shipped kind uses shared memory but the keep, a warp's candidates in its registers)
    assert "bytes smem" in out.stderr or kind == "keep" or not SHIPPED, out.stderr


def test_a_failed_compile_turns_the_block_path_off_with_one_warning(monkeypatch, caplog):
    """torch's NVRTC wrapper raises where it finds no CUDA toolkit (OSError: CUDA_HOME is not
    set, on a machine with CUDA wheels and no toolkit): compile_tile says why, once, in a
    warning and a RuntimeError (which the dispatcher answers with the Triton row kernel,
    tests/test_select_kernel_gpu.py), and the block path is off for the process."""
    import contextlib
    import logging

    calls = []

    def no_toolkit(src, name):
        calls.append(name)
        raise OSError("CUDA_HOME environment variable is not set")

    monkeypatch.setattr(select_block, "_KERNELS", {})
    monkeypatch.setattr(select_block, "_FAILED", [])
    monkeypatch.setattr(torch.cuda, "_compile_kernel", no_toolkit, raising=False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    with caplog.at_level(logging.WARNING, logger="tpflare.select_block"):
        with pytest.raises(RuntimeError, match="compile failed: OSError: CUDA_HOME"):
            select_block.compile_tile(256, device=0)
    assert calls == ["tpflare_select_rows"]
    assert "did not compile (OSError: CUDA_HOME" in caplog.text
    assert not select_block.available()


def test_a_plans_kernels_compile_at_once_each_once(monkeypatch):
    """compile_kernels compiles the kernels of a plan not compiled yet, each once and all at once
    (a thread each: the fake compile below passes its barrier only when the plan's four distinct
    kernels compile together), nothing on a second call; two threads asking for one kernel compile
    it once; a failed compile raises."""
    import collections
    import contextlib
    import threading

    compiled = collections.Counter()
    together = threading.Barrier(4, timeout=30)

    class Kern:
        func = None

    def fake_compile(src, name):
        compiled[src] += 1
        together.wait()  # (BrokenBarrierError, which the test reports, unless four compile at once)
        return Kern()

    current = []  # the contexts the compiling threads made current

    class Driver:
        retained = released = 0

        def cuFuncSetAttribute(self, *args):
            return 0

        def cuDeviceGet(self, dev, ordinal):
            return 0

        def cuDevicePrimaryCtxRetain(self, ctx, dev):
            Driver.retained += 1
            ctx._obj.value = 1234
            return 0

        def cuDevicePrimaryCtxRelease_v2(self, dev):
            Driver.released += 1
            return 0

        def cuCtxSetCurrent(self, ctx):
            current.append(ctx.value)
            return 0

    monkeypatch.setattr(select_block, "_KERNELS", {})
    monkeypatch.setattr(select_block, "_KEY_LOCKS", {})
    monkeypatch.setattr(select_block, "_FAILED", [])
    monkeypatch.setattr(torch.cuda, "_compile_kernel", fake_compile, raising=False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(select_block, "_driver_library", lambda: Driver)
    plan = select_block.plan_kernels(131072, 2048, None, 64, keep=True, n_sm=132)
    kinds = [kind.split(select_block.PAIRED)[0] for kind, _ in plan]
    assert kinds == ["sample", "keep", "chunks_gated", "merge_gated"], plan
    select_block.compile_kernels(plan + plan[:1], device=0)  # (a kernel named twice compiles once)
    assert sorted(select_block._KERNELS) == sorted((0, t, kind) for kind, t in plan)
    assert sorted(compiled.values()) == [1, 1, 1, 1]
    assert current == [1234] * 4 and Driver.retained == Driver.released == 1  # (each thread on the primary context)
    select_block.compile_kernels(plan, device=0)  # compiled: nothing to do (the barrier is not met again)
    assert sum(compiled.values()) == 4

    # one kernel asked for by two threads at once: one compile, the other waits for it
    two = threading.Barrier(2, timeout=30)
    monkeypatch.setattr(select_block, "_KERNELS", {})
    monkeypatch.setattr(torch.cuda, "_compile_kernel", lambda src, name: (compiled.update([src]), Kern())[1])
    compiled.clear()
    got = []

    def ask():
        two.wait()
        got.append(select_block.compile_tile(512, 0, "row"))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 2 and got[0] is got[1] and sum(compiled.values()) == 1

    def fails(src, name):
        raise OSError("no toolkit")

    monkeypatch.setattr(select_block, "_KERNELS", {})
    monkeypatch.setattr(torch.cuda, "_compile_kernel", fails)
    with pytest.raises(RuntimeError, match="compile failed: OSError: no toolkit"):
        select_block.compile_kernels(plan, device=0)
    assert not select_block.available()
