"""Cache-key identity: every field counts, code identity follows the source."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tpflare.cache import code_identity, device_fields, make_key, site_key_fields, version_fields

DEVICE = {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}
VERSIONS = {"torch": "2.11.0", "cuda": "13.0", "triton": "3.5.0", "nccl": "2.28.9",
            "flashinfer": None, "tpflare": "0.1.0"}


def base_fields(**over) -> dict:
    kw = dict(op="tpflare::select", shapes=[torch.Size([1, 2048]), (1, 2048)],
              dtypes=[torch.float32, torch.int32], k=2048, world=16, group_ranks=list(range(16)),
              knobs={"select": "auto", "race_near_tie": 0.03},
              compositions={"replicated": "aaaa", "owner": "bbbb"},
              child_plans={"owner": {"id_replication": "bf16"}},
              device=DEVICE, versions=VERSIONS)
    kw.update(over)
    return site_key_fields(**kw)


def test_fields_are_plain_json_and_stable():
    f = base_fields()
    assert f["shapes"] == [[1, 2048], [1, 2048]]
    assert f["dtypes"] == ["torch.float32", "torch.int32"]
    assert json.loads(json.dumps(f)) == f
    assert make_key(f) == make_key(base_fields())
    assert make_key(json.loads(json.dumps(f))) == make_key(f)


@pytest.mark.parametrize("change", [
    dict(op="tpflare::select_other"),
    dict(shapes=[[2, 2048], [2, 2048]]),
    dict(dtypes=[torch.bfloat16, torch.int32]),
    dict(k=1024),
    dict(world=8),
    dict(group_ranks=list(range(16, 32))),
    dict(knobs={"select": "auto", "race_near_tie": 0.05}),
    dict(compositions={"replicated": "aaaa", "owner": "bbbc"}),
    dict(child_plans={"owner": {"id_replication": "allgather"}}),
    dict(device={**DEVICE, "capability": "12.0"}),
    dict(device={**DEVICE, "name": "NVIDIA RTX PRO 6000"}),
], ids=lambda c: next(iter(c)))
def test_key_changes_with_each_field(change):
    assert make_key(base_fields(**change)) != make_key(base_fields())


@pytest.mark.parametrize("lib", sorted(VERSIONS))
def test_key_changes_with_each_version(lib):
    versions = dict(VERSIONS, **{lib: "999"})
    assert make_key(base_fields(versions=versions)) != make_key(base_fields())


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_code_identity_follows_source(tmp_path):
    src = "def compose(x):\n    return x + 1\n\ndef helper():\n    return 0\n"
    (tmp_path / "comp_a.py").write_text(src)
    (tmp_path / "comp_b.py").write_text(src)
    (tmp_path / "comp_c.py").write_text(src.replace("x + 1", "x + 2"))
    a, b, c = (_load(tmp_path / f"comp_{n}.py", f"comp_{n}") for n in "abc")
    # modules: whole file bytes
    assert code_identity(a) == code_identity(b)
    assert code_identity(a) != code_identity(c)
    # functions: their own source (and name)
    assert code_identity(a.compose) != code_identity(c.compose)
    assert code_identity(a.compose) != code_identity(a.helper)
    # several objects: order and content both count; strings are salts
    assert code_identity(a, a.compose) != code_identity(a.compose, a)
    assert code_identity(a, "plan-v1") != code_identity(a, "plan-v2")
    # the key follows: same version strings, changed code -> different key
    k1 = make_key(base_fields(compositions={"owner": code_identity(a)}))
    k2 = make_key(base_fields(compositions={"owner": code_identity(c)}))
    assert k1 != k2


def test_code_identity_refuses_what_has_no_source():
    with pytest.raises(TypeError, match="no source"):
        code_identity(len)
    with pytest.raises(TypeError):
        code_identity()


def test_site_key_fields_rejects_non_plain_data():
    with pytest.raises(TypeError, match="shapes"):
        base_fields(shapes=[object()])
    with pytest.raises(ValueError):
        base_fields(compositions={})


def test_local_environment_fields():
    v = version_fields()
    assert v["torch"] == torch.__version__ and set(v) == set(VERSIONS)
    assert v["tpflare"]
    d = device_fields()
    if torch.cuda.is_available():
        assert d["type"] == "cuda" and d["name"] and "." in d["capability"]
    else:
        assert d == {"type": "cpu"}
    assert device_fields("cpu") == {"type": "cpu"}
    f = base_fields(device=None, versions=None)
    assert f["device"] == d and f["versions"] == v
