"""Knobs: parsing, code overrides, the README table, the decision hash."""
from pathlib import Path

import pytest

import tpflare
from tpflare.config import KNOBS, Config, ConfigError


def test_env_parsing_and_overrides():
    c = Config()
    s = c.resolve({"TPFLARE_LATENT_GATHER": "1", "TPFLARE_LATENT_GATHER_MIN_ROWS": "17",
                   "TPFLARE_SELECT": "Owner"})
    assert s.latent_gather is True and s.latent_gather_min_rows == 17 and s.select == "owner"
    c.latent_gather = False                     # code beats env
    assert c.resolve({"TPFLARE_LATENT_GATHER": "1"}).latent_gather is False
    with c.patch(latent_gather_align=32):
        assert c.resolve({}).latent_gather_align == 32
    assert c.resolve({}).latent_gather_align == 64


@pytest.mark.parametrize("env,msg", [
    ({"TPFLARE_LATENT_GATHER": "maybe"}, "TPFLARE_LATENT_GATHER"),
    ({"TPFLARE_LATENT_GATHER_ALIGN": "0"}, ">= 1"),
    ({"TPFLARE_SELECT": "fastest"}, "replicated"),
    ({"TPFLARE_RACE_ITERS": "ten"}, "integer"),
])
def test_bad_values_name_the_knob(env, msg):
    with pytest.raises(ConfigError, match=msg):
        Config().resolve(env)


def test_unknown_knob_is_an_error():
    with pytest.raises(AttributeError, match="no knob"):
        tpflare.config.latent_gahter = True


def test_decision_hash_tracks_only_decision_knobs():
    c = Config()
    base = c.resolve({}).decision_hash()
    assert c.resolve({"TPFLARE_CACHE_DIR": "/elsewhere"}).decision_hash() == base
    assert c.resolve({"TPFLARE_LATENT_GATHER": "1"}).decision_hash() != base
    assert {k.field for k in KNOBS if k.decision} >= {"latent_gather", "select", "race_near_tie"}


def test_readme_knob_table_matches_code():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table = readme.split("<!-- knobs:begin -->")[1].split("<!-- knobs:end -->")[0].strip()
    assert table == tpflare.knobs_markdown(), "run `python -m tpflare knobs` and paste into README.md"
