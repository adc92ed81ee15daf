"""Eight processes write and read one cache directory at once.

Every process puts its own keys and, over and over, one shared key, and reads
the shared key and others' keys in between.  At the end every key written must
be readable with a valid entry, and the shared key's revision must equal the
number of puts made to it (a lost read-modify-write would leave it short).

The spawned workers load ``tpflare.cache`` without running ``tpflare/__init__``
(which imports torch: seconds per process, times eight): the cache itself needs
only the standard library, filelock and ``tpflare.errors``.
"""
from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import traceback
import types

import pytest

PROCS = 8
OWN_KEYS = 4
SHARED_PUTS = 6
READS = 40


def _fields(name: str) -> dict:
    return {"op": "select", "site": name, "k": 2048, "world": PROCS}


def _entry(fields: dict, winner: str, writer: int) -> dict:
    from tpflare.cache import new_entry

    return new_entry(fields, winner, {"owner": 1.0 + writer, "replicated": 2.0},
                     {"owner": {"passed": 4, "failed": 0}}, writer=writer)


def light_import_cache() -> None:
    """Make ``import tpflare.cache`` skip the package's __init__ (and torch).
    Also used by test_cache_store's child process."""
    if "tpflare" in sys.modules:
        return
    spec = importlib.util.find_spec("tpflare")  # finds, does not execute
    pkg = types.ModuleType("tpflare")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["tpflare"] = pkg


def _worker(directory: str, idx: int, barrier, errors) -> None:
    try:
        light_import_cache()
        from tpflare.cache import CompositionCache, make_key

        assert "torch" not in sys.modules  # (else each of the eight imports it: slow)

        cache = CompositionCache(directory, lock_timeout=60.0)
        shared = _fields("shared")
        shared_key = make_key(shared)
        others = [_fields(f"p{j}-k{i}") for j in range(PROCS) for i in range(OWN_KEYS)]
        barrier.wait(timeout=120)  # everybody has imported torch: start together
        for step in range(max(OWN_KEYS, SHARED_PUTS)):
            if step < OWN_KEYS:
                own = _fields(f"p{idx}-k{step}")
                assert cache.put(make_key(own), _entry(own, "owner", idx))
                assert cache.get(make_key(own))["writer"] == idx
            if step < SHARED_PUTS:
                winner = "owner" if (idx + step) % 2 else "replicated"
                assert cache.put(shared_key, _entry(shared, winner, idx))
            for _ in range(READS):  # while others replace it; it exists from the start
                got = cache.get(shared_key)
                assert got is not None and got["key"] == shared_key and got["fields"] == shared, got
            for f in others[step::7]:
                e = cache.get(make_key(f))
                assert e is None or (e["fields"] == f and e["winner"] == "owner"), e
    except BaseException:
        errors.put(f"process {idx}:\n{traceback.format_exc()}")
        raise


@pytest.mark.multiproc
def test_eight_processes_no_lost_or_corrupt_entry(tmp_path):
    from tpflare.cache import CompositionCache, make_key

    # tmpfs when there is one: every put fsyncs (~0.1 s each on a VM disk)
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    directory = tempfile.mkdtemp(prefix="tpflare-cache-mp-", dir=base)
    try:
        _run_workers(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_workers(directory: str) -> None:
    from tpflare.cache import CompositionCache, make_key

    cache = CompositionCache(directory)
    shared = _fields("shared")
    assert cache.put(make_key(shared), _entry(shared, "replicated", -1))

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCS)
    errors = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(directory, i, barrier, errors), daemon=True)
             for i in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join(timeout=10)
    reports = []
    while not errors.empty():
        reports.append(errors.get(timeout=5))
    assert not hung, f"{len(hung)} process(es) did not finish; kept: {reports}"
    assert [p.exitcode for p in procs] == [0] * PROCS, "\n".join(reports)

    for idx in range(PROCS):
        for i in range(OWN_KEYS):
            f = _fields(f"p{idx}-k{i}")
            e = cache.get(make_key(f))
            assert e is not None and e["fields"] == f and e["writer"] == idx
    e = cache.get(make_key(shared))
    assert e["revision"] == 1 + PROCS * SHARED_PUTS
    assert len(cache.entries()) == 1 + PROCS * OWN_KEYS
    assert cache.verify(repair=False) == []
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
