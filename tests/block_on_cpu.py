"""The block path's ``block_select`` (ops/select_block.py, or a copy of the module: a variant of
bench/block_variants.py) with its kernels built for the CPU by tests/cuda_on_cpu.py: the same
source, tile and kind it would launch on a GPU, under a schedule a seed picks."""
from __future__ import annotations

import importlib.util

import cuda_on_cpu


def load_module(path: str):
    """A copy of ops/select_block.py loaded from ``path``."""
    spec = importlib.util.spec_from_file_location(f"select_block_at_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BlockOnCpu:
    """``run(scores, ids, k, chunk=None, seed=0)``: ``module.block_select`` on CPU tensors.
    ``launched``: the (threads, kind) of every launch so far."""

    _built: dict = {}  # kernel source -> cuda_on_cpu.Kernel, shared by every instance

    def __init__(self, module):
        self.module = module
        self.launched: list = []
        self._seed = 0

    def compile_tile(self, threads, device=None, kind="row"):
        src = self.module.source(threads, kind)
        kern = self._built.get(src)
        if kern is None:
            kern = self._built[src] = cuda_on_cpu.build(src, "tpflare_select_rows")
        self.launched.append((int(threads), kind))
        seed = self._seed
        return lambda **launch: kern(seed=seed, **launch)

    def __call__(self, scores, ids, k, chunk=None, seed=0, **kw):
        """``kw``: more of block_select's keywords (``n_sm``, ``keep``)."""
        saved = self.module.compile_tile
        self.module.compile_tile = self.compile_tile
        self._seed = seed
        try:
            return self.module.block_select(scores, ids, k, chunk=chunk, **kw)
        finally:
            self.module.compile_tile = saved
