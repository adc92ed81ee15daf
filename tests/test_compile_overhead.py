"""Preparation work the backend does once per graph, not once per layer (gloo ranks)."""
import pytest
import torch

from tpflare.testing import run_ranks

pytestmark = pytest.mark.multiproc

Q, C, K = 6, 24, 16


def _layers(rank, world, cache_dir, ks):
    """One compiled graph with a selection site per entry of ``ks`` (a layer each)."""
    import tpflare
    from tpflare import race

    for name, value in {"race_iters": 3, "race_warmup": 1, "race_holdout": 2, "cache_dir": cache_dir}.items():
        setattr(tpflare.config, name, value)
    tpflare.clear_report()

    def f(s, i):
        outs = []
        for k in ks:
            ids, scores = tpflare.select_topk(s, i, k, with_scores=True)
            outs.append(ids)
            s = s + 1.0                                   # every layer selects from new scores
        return outs

    s, i = race.make_candidates(Q, C, rank, world, 11, "holdout", torch.device("cpu"))
    got = torch.compile(f, backend="tpflare", fullgraph=True)(s, i)
    parts = [race.make_candidates(Q, C, r, world, 11, "holdout", torch.device("cpu")) for r in range(world)]
    all_s, all_i = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
    exact = []
    for k, ids in zip(ks, got):
        exact.append(torch.equal(ids, race.reference_select(all_s, all_i, k)[0]))
        all_s = all_s + 1.0
    bound = [r for r in tpflare.report() if r["kind"] == "select"]
    return dict(stats=dict(race.stats), exact=exact, compositions=[r["composition"] for r in bound],
                reasons=[r["reason"] for r in bound], sources=[r["source"] for r in bound])


def test_identical_sites_share_one_decision(tmp_path):
    cold = run_ranks(_layers, 2, args=(str(tmp_path), [K, K, K]), timeout=240)
    for r in cold:
        assert all(r["exact"])
        assert r["stats"]["races"] == 1 and r["stats"]["cache_hits"] == 0   # one race for three layers
        assert len(set(r["compositions"])) == 1 and r["sources"] == ["race"] * 3
        assert all("same (Q, C, k, group, with_scores) as" in why for why in r["reasons"][1:])
    warm = run_ranks(_layers, 2, args=(str(tmp_path), [K, K, K]), timeout=240)
    for r in warm:
        assert all(r["exact"]) and r["sources"] == ["cache"] * 3
        assert r["stats"] == {"races": 0, "trials": 0, "cache_hits": 1}       # one lookup, one agreement


def test_distinct_sites_decide_separately(tmp_path):
    res = run_ranks(_layers, 2, args=(str(tmp_path), [K, K - 4, K]), timeout=240)
    for r in res:
        assert all(r["exact"])
        assert r["stats"]["races"] == 2                                       # k=16 and k=12
        assert "same (Q, C, k, group, with_scores) as" in r["reasons"][2]
