"""The block path's GPU benchmark scripts (bench/block_ab.py, bench/launch_phases.py) run end to
end on the CPU before a device call spends minutes on them: their kernels built for the CPU
(tests/block_on_cpu.py), CPU inputs, and each timing replaced by one call (the figures are
meaningless here; the records, the exactness checks and the launch cuts are what is tested)."""
from __future__ import annotations

import functools
import json
import os
import re
import sys

import pytest
import torch

import cuda_on_cpu
from block_on_cpu import BlockOnCpu, load_module

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_select_kernel  # noqa: E402
import block_ab  # noqa: E402
import block_variants  # noqa: E402
import launch_phases  # noqa: E402

pytestmark = pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")


def _on_cpu(monkeypatch, script):
    """The script's GPU pieces on the CPU: modules it loads launch through the CPU runner."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu")
    monkeypatch.setattr(script, "make_inputs", functools.partial(bench_select_kernel.make_inputs, device="cpu"))
    monkeypatch.setattr(script, "time_graph", lambda fn, sets, reps, replays: (fn(*sets[0]), 1e-3)[1])
    load = script.load_module

    def load_on_cpu(path):
        mod = load(path)
        mod.compile_tile = BlockOnCpu(mod).compile_tile
        return mod
    monkeypatch.setattr(script, "load_module", load_on_cpu)


def test_block_ab_times_every_column_and_checks_every_module(tmp_path, monkeypatch):
    _on_cpu(monkeypatch, block_ab)
    monkeypatch.setattr(block_ab.new, "compile_tile", BlockOnCpu(block_ab.new).compile_tile)
    monkeypatch.setattr(block_ab.select_kernel, "triton_ordered_select",
                        lambda s, i, k, path=None: torch.topk(s, k, dim=1))  # (a timing column only)
    variant = block_variants.write("match", str(tmp_path))
    out = tmp_path / "ab.json"
    assert block_ab.main(["--old", variant, "--cells", "20000x1,300x9", "--k", "40", "--patterns", "short",
                          "--paths", "row,staged", "--fuzz-seconds", "0", "--out", str(out)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert [(c["n"], c["q"], c["pattern"]) for c in cells] == [(20000, 1, "short"), (300, 9, "short")]
    for c in cells:
        assert c["old_exact"] is True and c["new_exact"] is True
        assert {"old", "new", "topk", "row"} <= set(c) and ("staged" in c) == (c["q"] <= 8)


def test_block_ab_records_a_column_that_raises_and_goes_on(tmp_path, monkeypatch):
    """A variant whose launch the runtime refuses (session 27: 64 KiB of dynamic shared memory)
    costs its own column, not the run: the error is in the cell, the shipped kernel and topk are
    timed in every cell, and the exit status says a column failed."""
    _on_cpu(monkeypatch, block_ab)
    monkeypatch.setattr(block_ab.new, "compile_tile", BlockOnCpu(block_ab.new).compile_tile)
    load = block_ab.load_module

    def refused(path):
        mod = load(path)

        def compile_tile(threads, device, kind="row"):
            raise RuntimeError(f"too many resources requested for launch ({kind}, {threads} threads)")
        mod.compile_tile = compile_tile
        return mod
    monkeypatch.setattr(block_ab, "load_module", refused)
    out = tmp_path / "ab.json"
    assert block_ab.main(["--old", block_variants.write("match", str(tmp_path)), "--cells", "300x3,500x2",
                          "--k", "40", "--patterns", "random", "--fuzz-seconds", "0", "--out", str(out)]) == 1
    cells = json.loads(out.read_text())["cells"]
    assert [(c["n"], c["q"]) for c in cells] == [(300, 3), (500, 2)]
    for c in cells:
        assert "too many resources" in c["old_error"] and "old" not in c and "old_exact" not in c
        assert c["new_exact"] is True and {"new", "topk"} <= set(c) and "new_error" not in c


@pytest.mark.parametrize("variant,cells,sets,kinds", [
    ("shipped", "20000x2", ["--set", "SAMPLED_MIN_ROWS=1"], ["sample", "keep", "chunks_gated", "merge_gated"]),
    ("spread", "9000x2", [], ["hist", "compact", "finish", "rank"])])
def test_launch_phases_cut_a_call_after_each_kernel(tmp_path, monkeypatch, variant, cells, sets, kinds):
    _on_cpu(monkeypatch, launch_phases)
    launched = []
    real_time = launch_phases.time_graph

    def count(fn, sets, reps, replays):  # the kernels each timed call launched
        before = len(runs)
        real_time(fn, sets, reps, replays)
        launched.append(len(runs) - before)
        return 1e-3 * len(launched)
    runs = []
    monkeypatch.setattr(launch_phases, "time_graph", count)
    monkeypatch.setattr(cuda_on_cpu.Kernel, "__call__",
                        lambda self, *a, _real=cuda_on_cpu.Kernel.__call__, **kw: (runs.append(1), _real(self, *a, **kw)))
    path = block_variants.SHIPPED if variant == "shipped" else block_variants.write(variant, str(tmp_path))
    out = tmp_path / "phases.json"
    assert launch_phases.main(["--module", path, "--cells", cells, "--k", "100", "--patterns", "random", *sets,
                               "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["set"] == sets[1:] and len(rec["cells"]) == 1
    cell = rec["cells"][0]
    assert cell["exact"] is True and cell.get("rows_chunks", 0) == 0 and cell["kinds"] == kinds
    assert launched == [1, 2, 3, 4]  # the call cut after its first, second, third kernel, then whole


def test_the_profiled_kernels_take_the_phase_stamps(tmp_path, monkeypatch):
    """bench/block_phases.py's stamps find their anchors in the shipped kernel and in the variant the
    GPU script profiles by default, every tile (session 27's default, with rank_keys, missed one:
    found here, not on the device)."""
    import block_phases
    with open(os.path.join(ROOT, "bench", "block_variants_gpu.sh")) as f:
        profile = re.search(r"PROFILE=\$\{PROFILE-([^}]+)\}", f.read()).group(1)
    shipped = block_phases.sb
    for mod in (shipped, load_module(block_variants.write(profile, str(tmp_path)))):
        monkeypatch.setattr(block_phases, "sb", mod)
        for t in mod.TILES:
            src = block_phases.stamped_source(t)
            assert all(f"STAMP({i});" in src for i in range(len(block_phases.STAMPS) + 1)), (profile, t)
    # --kind filter: the filter kind's stamps in the shipped module's filter source
    monkeypatch.setattr(block_phases, "sb", shipped)
    monkeypatch.setattr(block_phases, "STAMPS", block_phases.FILTER_STAMPS)
    monkeypatch.setattr(block_phases, "NS", len(block_phases.FILTER_STAMPS) + 1)
    monkeypatch.setattr(block_phases, "KIND", "filter")
    src = block_phases.stamped_source(shipped.FILTER_THREADS)
    assert all(f"STAMP({i});" in src for i in range(len(block_phases.FILTER_STAMPS) + 1)) and "FI * THREADS" in src


def test_ncu_functions_sums_each_line_under_the_function_it_follows(tmp_path, capsys):
    """bench/ncu_row_kernel.py functions: a source line's instructions and samples go to the last
    function defined before it (the kernel's own lines under the kernel's name, not its
    __launch_bounds__), from a plain or gzipped CSV of ncu's source page."""
    import gzip

    import ncu_row_kernel

    src = tmp_path / "block.cu"
    src.write_text('__device__ int twice(int x) {\n  return 2 * x;\n}\n'
                   'extern "C" __global__ void __launch_bounds__(512, 2)\nk(int* p) {\n  p[0] = twice(p[0]);\n}\n')
    head = ["Line No", "Source", "Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    lines = [head, ["2", "return 2 * x;", "-", "-", "30", "1,000"], ["", "", "0x10", "IMAD", "30", "1000"],
             ["6", "p[0] = twice(p[0]);", "-", "-", "10", "3000"]]
    text = "\n".join(",".join(f'"{c}"' for c in r) for r in [["File Path", "/tmp/block.cu"]] + lines) + "\n"
    (tmp_path / "s.csv").write_text(text)
    with gzip.open(tmp_path / "s.csv.gz", "wt") as f:
        f.write(text)
    for name in ("s.csv", "s.csv.gz"):
        ncu_row_kernel.functions(str(tmp_path / name), str(src), rows=10)
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "4000 warp instructions, 400 a row; 40 samples"
        assert out[1].split()[:4] == ["k", "instructions", "75.0%", "300"]
        assert out[2].split()[:4] == ["twice", "instructions", "25.0%", "100"]
        assert out[2].split()[-1] == "75.0%"
