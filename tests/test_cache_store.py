"""CompositionCache in one process: round trip, atomic replace, bad files,
unwritable directories, lock timeout, settings."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

import tpflare
from tpflare.cache import CacheLockTimeout, CompositionCache, make_key, new_entry
from tpflare.cache import store


@pytest.fixture
def tmp_path(tmp_path):
    """A fresh directory on tmpfs (/dev/shm) when there is one: each put fsyncs,
    which costs ~0.1-0.2 s on a VM disk and nothing on tmpfs.  Same semantics."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    d = tempfile.mkdtemp(prefix="tpflare-cache-test-", dir="/dev/shm")
    try:
        yield pathlib.Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fields_for(i: int = 0, **over) -> dict:
    f = {"op": "select", "shapes": [[4 + i, 2048]], "k": 2048, "world": 2,
         "compositions": {"owner": "c0", "replicated": "c1"}}
    f.update(over)
    return f


def entry_for(fields: dict, winner: str = "owner") -> dict:
    return new_entry(fields, winner, {"owner": 0.9, "replicated": 1.3},
                     {"owner": {"passed": 4, "failed": 0}, "replicated": {"passed": 4, "failed": 0}})


def cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tpflare.cache" and r.levelno >= logging.WARNING]


def test_round_trip(tmp_path):
    cache = CompositionCache(tmp_path / "c")
    f = fields_for()
    key = make_key(f)
    assert cache.get(key) is None
    assert cache.put(key, entry_for(f))
    got = cache.get(key)
    assert got["winner"] == "owner"
    assert got["timings"] == {"owner": 0.9, "replicated": 1.3}
    assert got["validation"]["owner"] == {"passed": 4, "failed": 0}
    assert got["fields"] == f and make_key(got["fields"]) == key
    assert got["measured"]["pid"] == os.getpid() and got["measured"]["host"]
    assert got["revision"] == 1
    # one file per key, plain JSON
    on_disk = json.loads((tmp_path / "c" / f"{key}.json").read_text())
    assert on_disk == got
    # read-modify-write: the revision counts, the previous winner is kept
    assert cache.put(key, entry_for(f, winner="replicated"))
    got = cache.get(key)
    assert (got["revision"], got["winner"], got["previous_winner"]) == (2, "replicated", "owner")
    assert [e["key"] for e in cache.entries()] == [key]
    assert cache.remove(key) and not cache.remove(key)
    assert cache.get(key) is None


def test_make_key_is_canonical():
    a = {"b": (1, 2), "a": {"y": 1, "x": 2}}
    b = {"a": {"x": 2, "y": 1}, "b": [1, 2]}
    assert make_key(a) == make_key(b)
    # int dict keys: the key is the same after the JSON round trip of the stored fields
    f = {"plans": {2: "x", 10: "y"}}
    assert make_key(json.loads(json.dumps(f))) == make_key(f)
    assert make_key({"a": 1}) != make_key({"a": 2})
    with pytest.raises(TypeError):
        make_key({"a": object()})
    with pytest.raises(ValueError):
        make_key({"a": float("nan")})


def test_put_rejects_inconsistent_entries(tmp_path):
    cache = CompositionCache(tmp_path)
    f = fields_for()
    with pytest.raises(ValueError, match="hash to key"):
        cache.put(make_key(f), entry_for(fields_for(1)))
    with pytest.raises(ValueError, match="winner"):
        cache.put(make_key(f), entry_for(f, winner="nobody"))
    with pytest.raises(ValueError, match="cache key"):
        cache.get("../../etc/passwd")
    assert cache.entries() == []


def test_reader_during_write_sees_old_entry(tmp_path, monkeypatch):
    cache = CompositionCache(tmp_path)
    f = fields_for()
    key = make_key(f)
    assert cache.put(key, entry_for(f, "owner"))
    seen = []
    real_fsync = os.fsync

    def fsync_and_read(fd):  # the temp file's fsync: its text is written, not yet replaced
        if stat.S_ISREG(os.fstat(fd).st_mode):
            seen.append(cache.get(key))
        return real_fsync(fd)

    monkeypatch.setattr(store.os, "fsync", fsync_and_read)
    assert cache.put(key, entry_for(f, "replicated"))
    monkeypatch.undo()
    assert len(seen) == 1 and seen[0] is not None and seen[0]["winner"] == "owner"
    assert cache.get(key)["winner"] == "replicated"


def test_failed_write_leaves_old_entry_and_no_temp(tmp_path, monkeypatch):
    cache = CompositionCache(tmp_path)
    f = fields_for()
    key = make_key(f)
    assert cache.put(key, entry_for(f, "owner"))

    def no_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "replace", no_replace)
    assert cache.put(key, entry_for(f, "replicated")) is False
    monkeypatch.undo()
    assert cache.get(key)["winner"] == "owner"
    assert sorted(os.listdir(tmp_path)) == [f"{key}.json", store.LOCK_NAME]


def _valid_text(cache, key) -> str:
    return cache.path(key).read_text()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "foreign", "old_version",
                                    "key_mismatch", "not_object", "no_winner"])
def test_bad_file_is_a_miss_and_next_put_recovers(tmp_path, caplog, damage):
    cache = CompositionCache(tmp_path)
    f, g = fields_for(0), fields_for(1)
    key, other = make_key(f), make_key(g)
    assert cache.put(key, entry_for(f)) and cache.put(other, entry_for(g))
    path = cache.path(key)
    text = path.read_text()
    rec = json.loads(text)
    if damage == "garbage":
        path.write_bytes(b"\x00\xffnot json at all\x9c")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "foreign":
        path.write_text(json.dumps({**rec, "format": "someone-else"}))
    elif damage == "old_version":
        path.write_text(json.dumps({**rec, "version": store.VERSION + 1}))
    elif damage == "key_mismatch":  # another key's entry under this name
        shutil.copy(cache.path(other), path)
    elif damage == "not_object":
        path.write_text("[1, 2, 3]")
    elif damage == "no_winner":
        path.write_text(json.dumps({k: v for k, v in rec.items() if k != "winner"}))
    with caplog.at_level(logging.WARNING, logger="tpflare.cache"):
        assert cache.get(key) is None
    assert any(str(path) in m for m in cache_warnings(caplog))
    assert [e["key"] for e in cache.entries()] == [other]
    assert cache.put(key, entry_for(f, "replicated"))
    got = cache.get(key)
    assert got["winner"] == "replicated" and got["revision"] == 1
    assert cache.get(other)["key"] == other


def test_verify_quarantines_bad_files_and_leftover_temps(tmp_path):
    cache = CompositionCache(tmp_path)
    f = fields_for()
    key = make_key(f)
    assert cache.put(key, entry_for(f))
    bad = "ab" * 32
    (tmp_path / f"{bad}.json").write_text('{"format": "tpfl')
    (tmp_path / f".{bad}.json.123.456.tmp").write_text("half")
    assert cache.verify(repair=False) and (tmp_path / f"{bad}.json").exists()
    problems = cache.verify()
    assert len(problems) == 2
    assert any(bad in p and "quarantine" in p for p in problems)
    assert not (tmp_path / f"{bad}.json").exists()
    assert len(os.listdir(tmp_path / store.QUARANTINE)) == 1
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert cache.verify() == []
    assert cache.get(key)["key"] == key
    assert cache.clear() == 1
    assert cache.entries() == [] and not (tmp_path / store.QUARANTINE).exists()


def test_uncreatable_directory_races_without_caching(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cache = CompositionCache(blocker / "cache")
    f = fields_for()
    key = make_key(f)
    with caplog.at_level(logging.DEBUG, logger="tpflare.cache"):
        assert cache.put(key, entry_for(f)) is False
        assert cache.put(key, entry_for(f)) is False
        assert cache.get(key) is None
        assert cache.get(key) is None
        assert cache.entries() == [] and cache.keys() == []
    warnings = cache_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "racing without caching" in warnings[0] and str(blocker) in warnings[0]


_READONLY_SCRIPT = textwrap.dedent("""
    import json, logging, sys
    d, key, fields_json, tests = sys.argv[1:5]
    sys.path.insert(0, tests)
    from test_cache_concurrency import light_import_cache
    light_import_cache()  # no torch import: seconds saved
    from tpflare.cache import CompositionCache
    msgs = []
    class H(logging.Handler):
        def emit(self, r):
            if r.levelno >= logging.WARNING:
                msgs.append(r.getMessage())
    logging.getLogger("tpflare.cache").addHandler(H())
    cache = CompositionCache(d)
    fields = json.loads(fields_json)
    entry = {"fields": fields, "winner": "replicated", "timings": {"replicated": 1.0}}
    res = {"put1": cache.put(key, entry), "put2": cache.put(key, entry),
           "get": (cache.get(key) or {}).get("winner"), "remove": cache.remove(key),
           "warnings": msgs}
    print(json.dumps(res))
""")


def test_read_only_directory(caplog):
    """An existing directory this process cannot write: put returns False (one
    warning), entries already there are still read.  Root ignores permission
    bits, so as root the check runs in a child process as user nobody."""
    as_root = os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    if as_root and not setpriv:
        pytest.skip("running as root (permission bits do not stop root) and no setpriv to drop to nobody")
    d = tempfile.mkdtemp(prefix="tpflare-ro-")
    try:
        cache = CompositionCache(d)
        f = fields_for()
        key = make_key(f)
        assert cache.put(key, entry_for(f, "owner"))
        if as_root:
            os.chmod(d, 0o755)  # root-owned: nobody may read, not write
            cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                   sys.executable, "-c", _READONLY_SCRIPT, d, key, json.dumps(f),
                   os.path.dirname(os.path.abspath(__file__))]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "HOME": d})
            assert out.returncode == 0, out.stderr
            res = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            os.chmod(d, 0o555)
            with caplog.at_level(logging.WARNING, logger="tpflare.cache"):
                e = entry_for(f, "replicated")
                res = {"put1": cache.put(key, e), "put2": cache.put(key, e),
                       "get": cache.get(key)["winner"], "remove": cache.remove(key),
                       "warnings": cache_warnings(caplog)}
        assert res["put1"] is False and res["put2"] is False and res["remove"] is False
        assert res["get"] == "owner"
        assert len(res["warnings"]) == 1, res["warnings"]
        assert "racing without caching" in res["warnings"][0]
    finally:
        os.chmod(d, 0o755)
        shutil.rmtree(d, ignore_errors=True)
    assert cache.get(key) is None  # removed with the directory; no crash either


_HOLDER = textwrap.dedent("""
    import sys, filelock
    lock = filelock.FileLock(sys.argv[1])
    lock.acquire(timeout=30)
    print("held", flush=True)
    sys.stdin.read()   # hold until the parent closes stdin
    lock.release()
""")


def test_held_lock_times_out_naming_lock_file_and_knob(tmp_path):
    cache = CompositionCache(tmp_path, lock_timeout=0.2)
    f = fields_for()
    key = make_key(f)
    tmp_path.mkdir(exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(cache.lock_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheLockTimeout) as info:
            cache.put(key, entry_for(f))
        assert isinstance(info.value, tpflare.TpflareError)
        msg = str(info.value)
        assert str(cache.lock_path) in msg and "TPFLARE_CACHE_LOCK_TIMEOUT" in msg
        with pytest.raises(CacheLockTimeout):
            cache.clear()
        assert cache.get(key) is None  # readers do not wait for the lock
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    assert cache.put(key, entry_for(f))
    assert cache.get(key)["winner"] == "owner"


def test_from_settings_and_default_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("TPFLARE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.default_directory() == tmp_path / "xdg" / "tpflare"
    with tpflare.config.patch(cache_dir=str(tmp_path / "mine"), cache_lock_timeout=7):
        cache = CompositionCache.from_settings(tpflare.config.resolve())
        assert cache.directory == tmp_path / "mine" and cache.lock_timeout == 7.0
        assert CompositionCache().directory == tmp_path / "mine"
        f = fields_for()
        assert cache.put(make_key(f), entry_for(f))
    with tpflare.config.patch(cache=False, cache_dir=str(tmp_path / "mine")):
        off = CompositionCache.from_settings(tpflare.config.resolve())
        assert not off.enabled
        assert off.get(make_key(f)) is None
        assert off.put(make_key(f), entry_for(f)) is False
