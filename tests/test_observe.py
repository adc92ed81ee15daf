"""tpflare in torch._logging: TORCH_LOGS=tpflare / +tpflare, and the registered alias."""
import os
import subprocess
import sys

import pytest

SNIPPET = """
import logging, torch, tpflare
from torch._logging._internal import log_registry
assert log_registry.is_log("tpflare"), "tpflare is not a registered torch log"
tpflare.reporting.record("latent_gather", "skipped", site="g9:all_reduce", reason="a reason")
logging.getLogger("tpflare.observe").debug("a debug line")
print("done")
"""


def _run(torch_logs):
    env = dict(os.environ)
    env.pop("TORCH_LOGS", None)
    env.pop("TORCH_TRACE", None)
    if torch_logs is not None:
        env["TORCH_LOGS"] = torch_logs
    p = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "done" in p.stdout, p.stderr
    return p.stderr


@pytest.mark.parametrize("setting,info,debug", [(None, False, False), ("tpflare", True, False),
                                                ("+tpflare", True, True)])
def test_torch_logs_turns_tpflare_logging_on(setting, info, debug):
    err = _run(setting)
    assert ("[latent_gather] g9:all_reduce: skipped (a reason)" in err) == info, err
    assert ("a debug line" in err) == debug, err


def test_set_logs_uses_the_registered_alias():
    code = """
import logging, torch, tpflare
torch._logging.set_logs(modules={"tpflare": logging.INFO})
tpflare.reporting.record("select", "bound", site="g1:select", composition="replicated", source="cache")
print("done")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "[select] g1:select: bound" in p.stderr, p.stderr
