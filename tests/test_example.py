"""examples/serve.py on CPU (W=1, one process): prepare the capacities, serve, check."""
import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serve.py"


def test_serving_example_runs_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    env.update(TPFLARE_CACHE_DIR=str(tmp_path / "cache"), TORCHINDUCTOR_COMPILE_THREADS="1",
               CUDA_VISIBLE_DEVICES="")
    out = tmp_path / "serve.json"
    p = subprocess.run([sys.executable, str(EXAMPLE), "--size", "tiny", "--prefill-rows", "16", "--steps", "10",
                        "--check-every", "2", "--iters", "2", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "prepare prefill M=16: compile" in p.stderr      # a progress line per preparation step
    r = json.loads(out.read_text())
    assert r["graphs"] is False and r["world"] == 1
    assert [c["name"] for c in r["capacities"]] == ["decode", "speculative", "prefill"]
    for c in r["capacities"]:
        assert c["winner"] and c["source"] == "race" and c["trials"] > 0
        assert c["served"] > 0 and c["checked"] > 0 and c["mismatches"] == 0, c
