"""Selection compositions on CUDA with NCCL (GPU machine only; skipped elsewhere).

Every composition against the Python reference, then captured in a CUDA graph and
replayed on new inputs: capture fails on any host sync, so this is the check that
the CUDA path has none.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from tpflare.testing import run_ranks
from test_select_ordering import as_bits, reference_select
from test_select_ranks import make_case

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc]

# (name, Q, C, k) at W=2; "auto" uses the Triton kernel where it runs
CASES = (("specials", 3, 64, 100), ("ties", 3, 512, 1024), ("random", 1, 2048, 2048))
KERNELS = ("torch", "auto")

CALLS = {
    "replicated": lambda s, i, k, g, w, kn: torch.ops.tpflare.select_replicated(s, i, k, g, w, kn),
    "owner/allgather": lambda s, i, k, g, w, kn: torch.ops.tpflare.select_owner(s, i, k, g, w, "allgather", kn),
    "owner/bf16": lambda s, i, k, g, w, kn: torch.ops.tpflare.select_owner(s, i, k, g, w, "bf16", kn),
}


def _nccl_compositions(rank, world):
    from tpflare.distributed import group_name_of

    g = group_name_of(None)
    dev = torch.device("cuda", torch.cuda.current_device())
    eager, graphed = {}, {}
    for (name, q, c, k), kernel in itertools.product(CASES, KERNELS):
        s_all, i_all = make_case(name, world, q, c, 0)
        s, i = s_all[rank].to(dev), i_all[rank].to(dev)
        for comp, call in CALLS.items():
            ids, sc = call(s, i, k, g, True, kernel)
            eager[(name, comp, kernel)] = (ids.cpu().tolist(), as_bits(sc.cpu()))
            # capture with static buffers, replay on the other case's data
            s_buf, i_buf = s.clone(), i.clone()
            call(s_buf, i_buf, k, g, True, kernel)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out_ids, out_sc = call(s_buf, i_buf, k, g, True, kernel)
            s2_all, i2_all = make_case(name, world, q, c, 1)
            s_buf.copy_(s2_all[rank].to(dev))
            i_buf.copy_(i2_all[rank].to(dev))
            graph.replay()
            torch.cuda.synchronize()
            graphed[(name, comp, kernel)] = (out_ids.cpu().tolist(), as_bits(out_sc.cpu()))
            del graph
    return eager, graphed


def test_nccl_compositions_and_cuda_graph_capture():
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs 2 GPUs for NCCL, found {n}")
    res = run_ranks(_nccl_compositions, 2, backend="nccl", timeout=300)
    for (name, q, c, k), kernel in itertools.product(CASES, KERNELS):
        for seed, which in ((0, 0), (1, 1)):
            s_all, i_all = make_case(name, 2, q, c, seed)
            exp = reference_select(list(s_all), list(i_all), k)
            for rank, r in enumerate(res):
                for comp in CALLS:
                    got = r[which][(name, comp, kernel)]
                    where = (name, comp, kernel, rank, "eager" if which == 0 else "graph")
                    assert got[0] == exp[0], where
                    assert got[1] == exp[1], where
