"""The demo at W=2, tiny sizes: two starts (new processes, one composition cache), TORCH_TRACE on.

One module-scoped run (4 spawned processes in all) serves every test here.
"""
import math
import struct

import pytest
import torch

pytestmark = pytest.mark.multiproc

K = 8


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from tpflare.demo import Capacity, DemoConfig, run_demo

    trace_dir = tmp_path_factory.mktemp("torch_trace")
    cfg = DemoConfig(hidden=256, latent=128, experts=4, expert_hidden=128, positions=64, heads=2, head_dim=32,
                     index_heads=2, index_dim=32, top_k=K,
                     capacities=[Capacity("decode", 1, 40), Capacity("prefill", 16, 0)],
                     iters=1, warmup=1, knobs=dict(race_iters=2, race_warmup=1, race_holdout=2),
                     return_selection=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_TRACE", str(trace_dir))   # inherited by the spawned ranks
        s = run_demo(2, "gloo", cfg, timeout=400, cache_dir=str(tmp_path_factory.mktemp("cache")),
                     fresh_inductor_cache=False)
    return s, trace_dir


def _order_key(score: float, id_: int):
    """The Order rule from the fp32 bits: IEEE totalOrder, every NaN below -inf, invalid last."""
    if id_ < 0:
        return (2, 0, 0)
    if score != score:
        return (1, 0, id_)
    bits = struct.unpack("<i", struct.pack("<f", score))[0]
    monotone = bits if bits >= 0 else -(bits & 0x7FFFFFFF) - 1
    return (0, -monotone, id_)


def test_selected_ids_equal_independent_reference_on_every_rank(demo):
    s, _ = demo
    for cap in s["starts"][0]["served"]:
        per_rank = cap["selection_per_rank"]
        world = len(per_rank)
        own = [per_rank[r]["candidates"][r] for r in range(world)]   # each rank's own candidates
        positions = per_rank[0]["positions"]
        for r in range(world):
            for m, got in enumerate(per_rank[r]["selected"]):
                pairs = [(sc, i) for rank_scores, rank_ids in own for sc, i in zip(rank_scores[m], rank_ids[m])]
                want = [i if i >= 0 else -1 for _, i in sorted(pairs, key=lambda p: _order_key(*p))[:K]]
                want += [-1] * (K - len(want))
                assert got == want, (cap["capacity"], r, m)
                # causal: only positions <= the row's own, all distinct, padded when fewer than k
                valid = [i for i in got if i >= 0]
                assert len(valid) == min(K, positions[m] + 1) == len(set(valid))
                assert max(valid) <= positions[m]


def test_second_start_hits_the_cache_with_the_same_winners(demo):
    from tpflare.demo import format_summary

    s, _ = demo
    first, second = (st["served"] for st in s["starts"])
    for a, b in zip(first, second):
        assert a["select"]["source"] == "race" and a["trials"] > 0
        assert b["select"]["source"] == "cache" and b["trials"] == 0 and b["races"] == 0 and b["cache_hits"] == 1
        assert b["winner"] == a["winner"] and len(set(b["winners_per_rank"])) == 1
        assert b["out_digest"] == a["out_digest"]
    assert s["second_start"] == dict(all_cache_hits=True, same_winners=True, same_output_bits=True)
    text = format_summary(s)
    assert "cache hit" in text and "0 trials" in text and "| capacity | Q | replicated |" in text


def test_race_table_has_every_composition_validated(demo):
    s, _ = demo
    for cap in s["starts"][0]["served"]:
        sel = cap["select"]
        assert set(sel["timings"]) == {"replicated", "owner/allgather", "owner/bf16"}
        assert all(t["max_rank_ms"] > 0 for t in sel["timings"].values())
        assert all(v["holdouts"] == 2 and v["failed_ranks"] == [] for v in sel["validation"].values())


def test_prefill_rewritten_decode_kept(demo):
    s, _ = demo
    served = {c["capacity"]["name"]: c for c in s["starts"][0]["served"]}
    assert [r["decision"] for r in served["prefill"]["latent_gather"]].count("rewritten") == 1
    sites = served["decode"]["latent_gather"]
    assert sites and all(r["decision"] == "skipped" for r in sites)
    assert any(r["reason"].startswith("rows") for r in sites), sites
    assert set(s["starts"][0]["off"]) == {"prefill"}   # the only capacity with a rewrite


def test_layer_exact_where_promised_and_close_to_float64(demo):
    s, _ = demo
    st = s["starts"][0]
    for p in st["served"] + list(st["off"].values()):
        assert p["selection_exact_every_rank"] and p["identical_across_ranks"], p["capacity"]
        assert p["recompiled_while_timing"] == 0
        assert p["out_rel_rms_same_choices"] < 1e-2, p
        assert p["latent_rel_rms"] < 6e-3, p
    on, off = next(c for c in st["served"] if c["capacity"]["name"] == "prefill"), st["off"]["prefill"]
    assert on["latent_rel_rms"] <= off["latent_rel_rms"]
    assert on["latent_not_correctly_rounded"] < 0.01 < off["latent_not_correctly_rounded"]
    assert on["latent_digest"] != off["latent_digest"]   # opt-in: the rewrite changes bits


def test_trace_artifacts_in_torch_trace(demo):
    from tpflare.observe import read_trace_artifacts

    _, trace_dir = demo
    arts = read_trace_artifacts(str(trace_dir))
    races = [a for a in arts if a["name"] == "tpflare_race"]
    gathers = [a for a in arts if a["name"] == "tpflare_latent_gather"]
    for rank in (0, 1):
        mine = [a["payload"] for a in races if a["rank"] == rank and a["payload"]["source"] != "forced"]
        assert sorted(p["source"] for p in mine) == ["cache"] * 2 + ["race"] * 2   # two starts
        forced = [a["payload"] for a in races if a["rank"] == rank and a["payload"]["source"] == "forced"]
        assert [p["Q"] for p in forced] == [16]             # start 1's latent-gather-off prefill
        assert all(set(p["timings"]) == {"replicated", "owner/allgather", "owner/bf16"} for p in mine)
        assert len({p["composition"] for p in mine if p["Q"] == 16}) == 1
        rewritten = [a for a in gathers if a["rank"] == rank and a["payload"]["decision"] == "rewritten"]
        assert len(rewritten) == 2                          # prefill, in each start
        skipped = [a["payload"] for a in gathers if a["rank"] == rank and a["payload"]["decision"] == "skipped"]
        assert skipped and all(p["reason"] for p in skipped)
    # emitted inside the compile of a frame: tlparse files them under its compile id
    assert all(a["frame_id"] is not None for a in races + gathers)


def test_python_order_matches_the_tensor_reference():
    """The demo's plain-Python checker agrees with race.reference_select on the hard patterns."""
    from tpflare import race
    from tpflare.demo import python_top_k

    for seed, pattern in ((1, "holdout"), (2, "ties"), (3, "trial")):
        scores, ids = race.make_candidates(6, 24, 0, 1, seed, pattern, torch.device("cpu"))
        want, _ = race.reference_select(scores, ids, 16)
        got = [python_top_k(s, i, 16) for s, i in zip(scores.tolist(), ids.tolist())]
        assert got == want.tolist(), pattern
    assert python_top_k([0.0, -0.0, math.nan, -math.inf], [3, 1, 2, 4], 4) == [3, 1, 4, 2]
