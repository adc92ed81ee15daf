"""``python -m tpflare``: knobs, report, cache list/show/clear/verify, demo."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from tpflare.__main__ import main
from tpflare.cache import CompositionCache, make_key, new_entry


def _populate(directory) -> list[str]:
    cache = CompositionCache(directory)
    keys = []
    for q in (1, 64):
        f = {"op": "tpflare::select", "shapes": [[q, 2048]], "k": 2048, "world": 16,
             "device": {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}}
        key = make_key(f)
        winner = "owner" if q == 1 else "replicated"
        assert cache.put(key, new_entry(f, winner, {"owner": 0.412, "replicated": 0.463},
                                        {"owner": {"passed": 4, "failed": 0}}))
        keys.append(key)
    return keys


def test_python_m_tpflare_cache_list(tmp_path):
    keys = _populate(tmp_path)
    out = subprocess.run([sys.executable, "-m", "tpflare", "cache", "list", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{tmp_path}: 2 entries" in out.stdout
    for key in keys:
        assert key[:16] in out.stdout
    assert "winner: owner" in out.stdout and "winner: replicated" in out.stdout
    assert "0.4120 ms" in out.stdout and "NVIDIA H200" in out.stdout
    assert 'validation {"failed":0,"passed":4}' in out.stdout


def test_cache_show_clear_verify(tmp_path, capsys):
    keys = _populate(tmp_path)
    assert main(["cache", "show", keys[0][:10], "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert keys[0] in out and '"capability": "9.0"' in out and "measured:" in out
    assert main(["cache", "show", "ffffffffff", "--dir", str(tmp_path)]) == 1
    assert "no entry" in capsys.readouterr().err

    assert main(["cache", "verify", "--dir", str(tmp_path)]) == 0
    assert "2 valid entries, 0 problem(s)" in capsys.readouterr().out
    (tmp_path / f"{'0' * 64}.json").write_text("{truncated")
    assert main(["cache", "verify", "--no-repair", "--dir", str(tmp_path)]) == 1
    assert (tmp_path / f"{'0' * 64}.json").exists()
    assert main(["cache", "verify", "--dir", str(tmp_path)]) == 1
    assert "quarantine" in capsys.readouterr().out
    assert main(["cache", "verify", "--dir", str(tmp_path)]) == 0

    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert main(["cache", "list", "--dir", str(tmp_path)]) == 0
    assert ": 0 entries" in capsys.readouterr().out


def test_cache_dir_defaults_to_the_knob(tmp_path, capsys, monkeypatch):
    _populate(tmp_path)
    monkeypatch.setenv("TPFLARE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TPFLARE_CACHE", "0")  # the CLI still inspects the cache
    assert main(["cache", "list"]) == 0
    assert f"{tmp_path}: 2 entries" in capsys.readouterr().out


def test_knobs(capsys):
    assert main(["knobs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| env var |") and "`TPFLARE_CACHE_LOCK_TIMEOUT`" in out


def test_report(tmp_path, capsys):
    path = tmp_path / "report.jsonl"
    recs = [{"kind": "select", "decision": "bound", "site": "attn.0", "winner": "owner", "time": 1.0},
            {"kind": "latent_gather", "decision": "skipped", "site": "moe.3", "reason": "rows < 9",
             "time": 2.0, "rank": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["[select] attn.0: bound — winner=owner",
                   "rank 1 [latent_gather] moe.3: skipped (rows < 9)"]
    with open(path, "a") as f:
        f.write("{not json\n")
    assert main(["report", str(path)]) == 1
    captured = capsys.readouterr()
    assert "report.jsonl:3: skipped" in captured.err and "attn.0" in captured.out
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


def test_demo_forwards_arguments(monkeypatch):
    seen = []
    fake = types.ModuleType("tpflare.demo")
    fake.main = lambda args: seen.append(args) or 7
    monkeypatch.setitem(sys.modules, "tpflare.demo", fake)
    assert main(["demo", "--world", "2", "-v"]) == 7
    assert seen == [["--world", "2", "-v"]]


def test_demo_missing_is_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tpflare.demo", None)  # import raises ModuleNotFoundError
    assert main(["demo"]) == 2
    assert "tpflare.demo" in capsys.readouterr().err


def test_console_script_entry_point():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="console_scripts") if ep.name == "tpflare"]
    if not eps:
        pytest.skip("tpflare is not installed as a distribution here (no console script)")
    assert eps[0].value == "tpflare.__main__:main" and eps[0].load() is main
