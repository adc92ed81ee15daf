import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--block-module", default=None, metavar="PATH",
                     help="run the block path's tests on this copy of ops/select_block.py (a variant: "
                          "bench/block_variants.py) instead of the shipped module: tests/test_select_block_cpu.py, "
                          "and on a GPU every test that reaches the block path through tpflare.ops")


def pytest_configure(config):
    path = config.getoption("--block-module", default=None)
    if path:  # the variant stands in for tpflare.ops.select_block everywhere, before test modules import it
        import sys

        import tpflare.ops
        from block_on_cpu import load_module  # (tests/, on the path as conftest's folder)
        from tpflare.ops import select_kernel

        variant = load_module(path)
        sys.modules["tpflare.ops.select_block"] = variant
        tpflare.ops.select_block = variant
        select_kernel.select_block = variant


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (GPU test; run on the GPU machine)")
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    for item in items:
        if "gpu" in item.keywords:
            if interpret and item.path.name == "test_select_kernel_gpu.py":
                continue  # the kernel's tests run in the Triton interpreter on the CPU
            item.add_marker(skip)


@pytest.fixture(params=["chunks", "sampled"])
def chunked(request, monkeypatch):
    """The two ways the block path (ops/select_block.py, or the variant ``--block-module`` puts in
    its place) runs rows in chunks: the chunks then their merge (calls of fewer than
    ``SAMPLED_MIN_ROWS`` rows), or the sampled keep, the chunks serving only the rows where it may
    miss a winner; each test of rows in chunks (CPU runner and GPU) runs both."""
    from tpflare.ops import select_block

    if hasattr(select_block, "SAMPLED_MIN_ROWS"):
        monkeypatch.setattr(select_block, "SAMPLED_MIN_ROWS", 1 if request.param == "sampled" else 1 << 30)
    elif request.param == "sampled":
        pytest.skip("this module has no sampled keep")
    return request.param
