"""The backend in a single process (no torch.distributed): plain Inductor semantics."""
import logging

import torch

import tpflare


def test_backend_without_distributed_matches_eager():
    torch._dynamo.reset()
    tpflare.clear_report()
    f = torch.compile(lambda x: torch.relu(x @ x.T) + 1, backend="tpflare", fullgraph=True)
    x = torch.randn(8, 8)
    torch.testing.assert_close(f(x), torch.relu(x @ x.T) + 1)
    assert tpflare.report() == []                       # no sites, nothing decided


def test_knob_change_after_compile_warns_once(caplog):
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2, backend="tpflare", fullgraph=True)
    x = torch.randn(4)
    f(x)
    with caplog.at_level(logging.WARNING, logger="tpflare"):
        with tpflare.config.patch(select="owner"):
            f(x)
            f(x)
    msgs = [r.getMessage() for r in caplog.records if "compiled with other values" in r.getMessage()]
    assert len(msgs) == 1 and "TPFLARE_SELECT" in msgs[0]
