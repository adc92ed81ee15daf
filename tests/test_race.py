"""The composition race and its cache, across real gloo ranks."""
import json
from pathlib import Path

import pytest
import torch

from tpflare.testing import run_ranks

pytestmark = pytest.mark.multiproc

Q, C, K = 6, 24, 16      # Q not divisible by W=4, k < W*C


def quick_race_knobs(**more):
    """Set the knobs of a quick race (few runs, few holdouts) in a test rank, plus ``more``."""
    import tpflare

    for name, value in {"race_iters": 3, "race_warmup": 1, "race_holdout": 2, **more}.items():
        setattr(tpflare.config, name, value)


def _compiled_site(rank, world, cache_dir, select):
    import tpflare
    from tpflare import race

    quick_race_knobs(cache_dir=cache_dir, select=select)

    def f(s, i):
        ids, scores = tpflare.select_topk(s, i, K, with_scores=True)
        return ids, scores

    s, i = race.make_candidates(Q, C, rank, world, 11, "holdout", torch.device("cpu"))
    ids, scores = torch.compile(f, backend="tpflare", fullgraph=True)(s, i)
    exp_ids, _ = race.expected_selection(Q, C, K, world, 11, "holdout")
    bound = [r for r in tpflare.report() if r["kind"] == "select"]
    return dict(stats=dict(race.stats), exact=torch.equal(ids, exp_ids),
                composition=bound[0]["composition"], source=bound[0]["source"])


def test_race_then_cache_hit_in_new_processes(tmp_path):
    first = run_ranks(_compiled_site, 2, args=(str(tmp_path), "auto"), timeout=180)
    assert len({r["composition"] for r in first}) == 1            # one winner on every rank
    for r in first:
        assert r["exact"] and r["source"] == "race" and r["stats"]["trials"] > 0
    entries = list(Path(tmp_path).glob("*.json"))
    assert len(entries) == 1
    entry = json.loads(entries[0].read_text())
    assert json.dumps(entry).count("max_rank_ms") >= 3          # every composition's timing kept
    second = run_ranks(_compiled_site, 2, args=(str(tmp_path), "auto"), timeout=180)
    for r in second:
        assert r["exact"] and r["source"] == "cache"
        assert r["stats"] == {"races": 0, "trials": 0, "cache_hits": 1}
        assert r["composition"] == first[0]["composition"]


def _dynamic_site(rank, world, cache_dir):
    import tpflare
    from tpflare import race

    quick_race_knobs(cache_dir=cache_dir, select_rows="1,4")

    def f(s, i):
        return tpflare.select_topk(s, i, K, with_scores=True)

    cf = torch.compile(f, backend="tpflare", fullgraph=True, dynamic=True)
    exact = {}
    # 7: beyond the table's last row count; C // 2: other candidates a rank (C is specialised: a recompile)
    for q, c in ((3, C), (1, C), (4, C), (2, C), (7, C), (3, C // 2)):
        s, i = race.make_candidates(q, c, rank, world, 5, "holdout", torch.device("cpu"))
        ids, scores = cf(s, i)
        exact[(q, c)] = race.same_selection(ids, scores, *race.expected_selection(q, c, K, world, 5, "holdout"))
    tables = [r for r in tpflare.report() if r["kind"] == "select" and r["composition"] == "by rows"]
    rungs = [r for r in tpflare.report() if r["kind"] == "select" and "@rows=" in r.get("site", "")]
    return dict(exact=exact, tables=[(sorted(r["table"].items()), r["sources"]) for r in tables],
                rungs=sorted((r["Q"], r["source"]) for r in rungs), stats=dict(race.stats))


def test_symbolic_rows_get_a_table_raced_at_each_row_count(tmp_path):
    """dynamic=True: the site's row count is symbolic; it is raced at each of TPFLARE_SELECT_ROWS
    (1, 4), bound as a table (select_by_rows), exact at every row count (between the listed ones
    and beyond them); a second start takes every row count from the cache."""
    first = run_ranks(_dynamic_site, 2, args=(str(tmp_path),), timeout=240)
    for r in first:
        assert all(r["exact"].values()), r["exact"]
        assert len(r["tables"]) == 2, r["tables"]              # C and C // 2: a table each
        (table, sources), _ = r["tables"]
        assert [q for q, _ in table] == [1, 4] and len(sources) == 2
        assert [q for q, _ in r["rungs"]] == [1, 1, 4, 4]
        assert r["stats"]["races"] >= 1
    assert first[0]["tables"] == first[1]["tables"]       # the same table on every rank
    second = run_ranks(_dynamic_site, 2, args=(str(tmp_path),), timeout=240)
    for r in second:
        assert all(r["exact"].values()), r["exact"]
        assert r["stats"]["races"] == 0 and r["stats"]["cache_hits"] >= 2
        assert r["tables"][0][0] == first[0]["tables"][0][0]
        assert r["tables"][0][1] == ["cache", "cache"]


def _decide(rank, world, cache_root, per_rank_dirs, select, seed_entries):
    import tpflare
    from tpflare import race
    from tpflare.cache.store import CompositionCache, make_key, new_entry

    cache_dir = f"{cache_root}/r{rank}" if per_rank_dirs else cache_root
    quick_race_knobs(cache_dir=cache_dir, select=select)
    settings = tpflare.config.resolve()
    comps = race.compositions(settings)
    if seed_entries and rank in seed_entries:                   # pre-seed this rank's cache
        fields = race._site_key(Q, C, K, "0", False, torch.device("cpu"), comps, settings)
        CompositionCache(cache_dir).put(make_key(fields), new_entry(fields, seed_entries[rank], {seed_entries[rank]: {"max_rank_ms": 1.0}}))
    d = race.decide(Q, C, K, "0", False, torch.device("cpu"), settings, site="t")
    return dict(name=d.composition.name, source=d.source, stats=dict(race.stats))


@pytest.mark.parametrize("world", [2, 3])  # (3: a world that is no power of two)
def test_same_winner_everywhere_and_forced_skip(tmp_path, world):
    res = run_ranks(_decide, world, args=(str(tmp_path), False, "auto", None), timeout=180)
    assert len({r["name"] for r in res}) == 1 and all(r["source"] == "race" for r in res)
    forced = run_ranks(_decide, world, args=(str(tmp_path / "f"), False, "owner", None), timeout=120)
    for r in forced:
        assert r["source"] == "forced" and r["name"].startswith("owner/") and r["stats"]["trials"] == 0


@pytest.mark.parametrize("seeds", [{0: "owner/bf16"}, {0: "owner/bf16", 1: "replicated"}],
                         ids=["entry-on-one-rank", "different-entries"])
def test_disagreeing_cache_state_ends_in_one_decision(tmp_path, seeds):
    res = run_ranks(_decide, 2, args=(str(tmp_path), True, "auto", seeds), timeout=180)
    assert len({r["name"] for r in res}) == 1
    assert all(r["source"] == "race" and r["stats"]["races"] == 1 for r in res)


def _broken_rejected(rank, world):
    import torch.distributed as dist

    import tpflare
    from tpflare import race

    def fp32_topk_only(scores, ids, k, group_name, with_scores):
        # wrong on purpose: plain fp32 topk ignores the id tie rule, NaN and padding order
        all_s = [torch.empty_like(scores) for _ in range(world)]
        all_i = [torch.empty_like(ids) for _ in range(world)]
        dist.all_gather(all_s, scores)
        dist.all_gather(all_i, ids)
        s, i = torch.cat(all_s, 1), torch.cat(all_i, 1)
        top, idx = torch.topk(s, k, dim=1)
        return i.gather(1, idx), top

    tpflare.config.race_iters = 2
    tpflare.config.race_warmup = 0
    settings = tpflare.config.resolve()
    comps = race.compositions(settings)[:1] + [race.Composition("broken", "select", (), (), fp32_topk_only)]
    winner, timings, validation, _why = race.run_race(Q, C, K, "0", False, torch.device("cpu"), comps, settings)
    return winner, timings["broken"], validation["broken"]


def test_wrong_composition_is_rejected_by_holdout():
    for winner, broken_timing, broken_validation in run_ranks(_broken_rejected, 2, timeout=120):
        assert winner == "replicated"
        assert broken_timing["max_rank_ms"] is None and broken_timing["rejected"]
        assert broken_validation["failed_ranks"] == [0, 1]


def test_reference_select_matches_plain_python_sort():
    import math
    import random

    from tpflare.race import reference_select

    rnd = random.Random(0)
    pool = [0.5, -0.0, 0.0, 1.0, float("-inf"), float("nan"), 2.0]
    scores = torch.tensor([[rnd.choice(pool) for _ in range(40)] for _ in range(5)])
    ids = torch.tensor([[rnd.choice([-1, rnd.randrange(1000)]) for _ in range(40)] for _ in range(5)],
                       dtype=torch.int32)

    def key(p):
        s, i = p
        if math.isnan(s):
            return (i < 0, 1, 0.0, 0, i)
        return (i < 0, 0, -s, 1 if math.copysign(1.0, s) < 0 else 0, i)   # -0.0 below +0.0

    got, _ = reference_select(scores, ids, 12)
    for row in range(5):
        exp = [i if i >= 0 else -1 for s, i in sorted(zip(scores[row].tolist(), ids[row].tolist()), key=key)[:12]]
        assert got[row].tolist() == exp


def _trial_tensors_released(rank, world):
    import gc
    import weakref

    import tpflare
    from tpflare import race

    made = []
    original = race.make_candidates

    def tracked(*args, **kwargs):
        s, i = original(*args, **kwargs)
        made.extend([weakref.ref(s), weakref.ref(i)])
        return s, i

    race.make_candidates = tracked
    tpflare.config.race_iters = 2
    tpflare.config.race_warmup = 1
    settings = tpflare.config.resolve()
    winner, *_ = race.run_race(Q, C, K, "0", True, torch.device("cpu"), race.compositions(settings), settings)
    gc.collect()
    return len(made), sum(r() is not None for r in made)


def test_trial_and_holdout_tensors_are_released_after_the_race():
    for made, alive in run_ranks(_trial_tensors_released, 2, timeout=120):
        assert made > 0 and alive == 0
