"""bench/block_variants.py: every variant (and every combination the GPU call times) still applies
to the shipped module, and the combination of all three kinds of edit runs exactly on the CPU
(the whole CPU suite runs on any variant with ``--block-module``)."""
from __future__ import annotations

import os
import re
import sys

import pytest

import cuda_on_cpu
from block_on_cpu import BlockOnCpu, load_module
from test_select_kernel_gpu import _mass_tie, check_equal, make_case, ref_packed, ref_python

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import block_variants  # noqa: E402


def _gpu_call_variants() -> list[str]:
    with open(os.path.join(ROOT, "bench", "block_variants_gpu.sh")) as f:
        return re.search(r'VARIANTS=\$\{VARIANTS:-"([^"]+)"\}', f.read()).group(1).split()


def test_every_variant_applies_to_the_shipped_module():
    names = list(block_variants.VARIANTS) + _gpu_call_variants()
    assert {"scan+match+smem_keys", "scan+digits11+smem_keys+rank_keys"} <= set(names)
    with open(block_variants.SHIPPED) as f:
        shipped = f.read()
    for name in names:
        text = block_variants.module_text(name)
        compile(text, f"{name}.py", "exec")  # (the module's Python still parses)
        assert text != shipped, name
    with pytest.raises(KeyError, match="no variant 'nope'"):
        block_variants.module_text("scan+nope")


def test_an_edit_whose_text_moved_raises(tmp_path):
    moved = tmp_path / "select_block.py"
    with open(block_variants.SHIPPED) as f:
        moved.write_text(f.read().replace("u32 bal = __ballot_sync(FULL, win);", "u32 bal = __ballot_sync(FULL, win != 0);"))
    with pytest.raises(ValueError, match="variant scan: 0 lines of the module hold"):
        block_variants.module_text("scan", shipped=str(moved))


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
def test_combined_variant_is_exact_on_the_cpu(tmp_path):
    run = BlockOnCpu(load_module(block_variants.write("scan+match+smem_keys", str(tmp_path))))
    scores, ids = make_case("nandups", 2, 16384, 2048, seed=4)  # the 512 x 32 tile, ids twice
    check_equal(run(scores, ids, 2048, seed=3), ref_packed(scores, ids, 2048), "nandups 16384")
    scores, ids = _mass_tie("equal", 1, 20000, seed=5)  # chunks and their merge, one score
    check_equal(run(scores, ids, 1500, seed=4), ref_packed(scores, ids, 1500), "equal 20000")
    scores, ids = make_case("special", 2, 3000, 700, seed=6)
    check_equal(run(scores, ids, 700, seed=5), ref_python(scores, ids, 700), "special 3000")
    # the row kernel of tiles 1024 and 256; chunks of 1024 (10000 a chunk), their merge in 256
    assert sorted(set(run.launched)) == [(256, "merge"), (256, "row"), (1024, "chunks"), (1024, "row")]


# a slip planted in a variant's own code (the shipped kernel's slips: test_select_block_cpu.py),
# and a case it breaks: the CPU runner's check fails, so the variants do not pass by default
SLIPS = {
    # the 11-bit bin test one short: the bin whose top offset equals the wanted count is missed
    "digits11": ("if (lo < rem && rem <= hi) {", "if (lo < rem && rem < hi) {", "ties"),
    # equal keys (one id twice) ranked by <=: two winners take one output slot
    "rank_keys": ("          r += sm.wpos[j] < pp ? 1 : 0;", "          r += sm.wpos[j] <= pp ? 1 : 0;", "nandups"),
}


@pytest.mark.skipif(cuda_on_cpu.compiler() is None, reason="no C++ compiler for the CPU runner")
@pytest.mark.parametrize("variant", list(SLIPS))
def test_a_slip_in_a_variant_fails_on_the_cpu(tmp_path, variant):
    good, bad, kind = SLIPS[variant]
    text = block_variants.module_text(variant)
    assert text.count(good) == 1
    path = tmp_path / f"{variant}_slip.py"
    path.write_text(text.replace(good, bad))
    run = BlockOnCpu(load_module(str(path)))
    scores, ids = make_case(kind, 2, 3000, 700, seed=8)
    with pytest.raises((AssertionError, RuntimeError)):
        check_equal(run(scores, ids, 700, seed=2), ref_python(scores, ids, 700), f"{variant} slip")
