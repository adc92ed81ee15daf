"""Inductor's caches key on tpflare's source and decision knobs (the CustomGraphPass uuid)."""
from tpflare.passes import manager
from tpflare.passes.manager import TpflarePostGradPass


def test_uuid_covers_decisions_every_module_and_a_chained_pass(tmp_path, monkeypatch):
    files = {p.name for p in manager._source_files()}
    assert {"select.py", "ordering.py", "gather.py", "latent_gather.py", "collectives.py",
            "latent_prep.py", "race.py", "store.py"} <= files          # ops, passes, plugin, cache
    a = TpflarePostGradPass("k1").uuid()
    assert a == TpflarePostGradPass("k1").uuid() and a != TpflarePostGradPass("k2").uuid()
    fake = tmp_path / "select.py"
    fake.write_text("# another implementation of a custom op\n")
    monkeypatch.setattr(manager, "_source_files", lambda: [fake])
    monkeypatch.setattr(TpflarePostGradPass, "_source", None)
    assert TpflarePostGradPass("k1").uuid() != a                      # an edit of any module changes it
    assert TpflarePostGradPass("k1", chained=lambda g: None).uuid() is None   # unhashable: cache bypassed
