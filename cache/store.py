"""The composition cache: one JSON file per key, written atomically under a file lock.

Layout of a cache directory::

    <dir>/<key>.json          one entry per key (key = sha256 of the key fields)
    <dir>/tpflare-cache.lock  the filelock every writer holds
    <dir>/quarantine/         bad files moved aside by ``verify()``

Readers take no lock: a writer writes a temp file in the same directory, fsyncs
it and ``os.replace``-s it over the entry, so a reader sees the old entry or the
new one, never a part.  Writers (put / remove / clear / verify) hold the
directory's lock for their read-modify-write.  A corrupt, truncated or foreign
file is a miss (logged) that the next ``put`` replaces.  A directory that cannot
be created or written means racing without caching: one warning per process and
directory, ``put`` returns False.  See docs/cache.md.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import filelock

from tpflare.errors import TpflareError

log = logging.getLogger("tpflare.cache")

FORMAT = "tpflare.composition-cache"
VERSION = 1
LOCK_NAME = "tpflare-cache.lock"
QUARANTINE = "quarantine"
LOCK_KNOB = "TPFLARE_CACHE_LOCK_TIMEOUT"
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_TMP_SUFFIX = ".tmp"

_warned: set[str] = set()
_warned_lock = threading.Lock()


class CacheLockTimeout(TpflareError):
    """The cache directory's lock was not acquired within the lock timeout."""


class _Unwritable(Exception):
    """Internal: the directory cannot be created or written."""


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj`` that keys are hashed from.

    Sorted keys, no whitespace, no NaN/inf; tuples become lists and non-string
    dict keys become strings *before* sorting, so the text is the same after a
    JSON round trip (what is stored in clear hashes to the same key)."""
    once = json.loads(json.dumps(obj, allow_nan=False))
    return json.dumps(once, sort_keys=True, separators=(",", ":"), allow_nan=False)


def make_key(fields: dict) -> str:
    """sha256 (hex) of the canonical JSON of the key fields."""
    if not isinstance(fields, dict):
        raise TypeError(f"cache key fields must be a dict, not {type(fields).__name__}")
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()


def new_entry(fields: dict, winner: str, timings: dict, validation: dict | None = None,
              **extra: Any) -> dict:
    """The entry ``put`` takes: the key fields, the winner, per-composition timings
    (ms; None for one that failed validation), validation counts per composition
    (e.g. ``{"passed": 4, "failed": 0}``) and any extra plain data (``measured``
    entries such as ``devices`` are merged with the when/where that put records)."""
    return {"fields": fields, "winner": winner, "timings": dict(timings),
            "validation": dict(validation or {}), **extra}


def default_directory() -> Path:
    """``tpflare.config.cache_dir`` or ``$XDG_CACHE_HOME/tpflare`` (``~/.cache/tpflare``)."""
    from tpflare.config import config

    if config.cache_dir:
        return Path(config.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpflare"


def _warn_once(directory: Path, message: str) -> None:
    with _warned_lock:
        first = str(directory) not in _warned
        _warned.add(str(directory))
    if first:
        log.warning("%s", message)
    else:
        log.debug("%s", message)


def _check_record(rec: Any, key: str) -> str | None:
    """Why ``rec`` is not a valid entry for ``key`` (None if it is)."""
    if not isinstance(rec, dict):
        return f"not a JSON object ({type(rec).__name__})"
    if rec.get("format") != FORMAT:
        return f"foreign file (format {rec.get('format')!r}, expected {FORMAT!r})"
    if rec.get("version") != VERSION:
        return f"schema version {rec.get('version')!r} (this tpflare reads {VERSION})"
    if rec.get("key") != key:
        return f"key mismatch (entry says {str(rec.get('key'))[:16]}…)"
    fields = rec.get("fields")
    try:
        if not isinstance(fields, dict) or make_key(fields) != key:
            return "key mismatch (its fields do not hash to its key)"
    except (TypeError, ValueError) as e:
        return f"fields are not canonical JSON ({e})"
    problem = _entry_problem(rec)
    return f"malformed entry ({problem})" if problem else None


def _entry_problem(entry: dict) -> str | None:
    timings = entry.get("timings")
    if not isinstance(entry.get("winner"), str):
        return "'winner' must be a string"
    if not isinstance(timings, dict) or entry["winner"] not in timings:
        return "'timings' must be a dict that names the winner"
    if not isinstance(entry.get("validation", {}), dict):
        return "'validation' must be a dict"
    if not isinstance(entry.get("measured", {}), dict):
        return "'measured' must be a dict"
    return None


def _where() -> dict[str, Any]:
    now = time.time()
    where = {
        "time": now,
        "utc": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    dist = sys.modules.get("torch.distributed")  # no torch import: none means no process group
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            where["rank"] = dist.get_rank()
    except Exception:
        pass
    return where


class CompositionCache:
    """Race winners by key.  ``get`` / ``put`` / ``entries`` / ``remove`` / ``clear`` / ``verify``."""

    make_key = staticmethod(make_key)

    def __init__(self, directory: str | Path | None = None, lock_timeout: float = 30.0,
                 *, enabled: bool = True) -> None:
        if directory is None or str(directory) == "":
            directory = default_directory()
        self.directory = Path(directory).expanduser()
        self.lock_timeout = float(lock_timeout)
        self.enabled = bool(enabled)

    @classmethod
    def from_settings(cls, settings: Any) -> "CompositionCache":
        """The cache a ``tpflare.config.resolve()`` snapshot asks for (disabled when
        ``settings.cache`` is False: every get misses, every put returns False)."""
        return cls(settings.cache_dir or None, settings.cache_lock_timeout, enabled=settings.cache)

    def __repr__(self) -> str:
        state = "" if self.enabled else ", disabled"
        return f"CompositionCache({str(self.directory)!r}{state})"

    # --- paths ---------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.directory / LOCK_NAME

    def path(self, key: str) -> Path:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
        return self.directory / f"{key}.json"

    def keys(self) -> list[str]:
        """Keys of every ``<key>.json`` file present (valid or not), sorted."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and _KEY_RE.match(n[:-5]))

    # --- reading (no lock) ---------------------------------------------------
    def _read(self, key: str) -> tuple[dict | None, str | None]:
        """(entry, None) if valid; (None, problem) if bad; (None, None) if absent."""
        try:
            raw = self.path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except OSError as e:
            return None, f"unreadable ({e.strerror or e})"
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            return None, f"corrupt or truncated ({len(raw)} bytes: {e})"
        problem = _check_record(rec, key)
        return (None, problem) if problem else (rec, None)

    def get(self, key: str) -> dict | None:
        """The valid entry for ``key``, or None (absent, disabled, or bad: logged)."""
        if not self.enabled:
            return None
        rec, problem = self._read(key)
        if problem:
            log.warning("tpflare cache: %s: %s; treated as a miss (the next put replaces it)",
                        self.path(key), problem)
        return rec

    def entries(self) -> list[dict]:
        """Every valid entry, sorted by key (bad files are logged and skipped)."""
        out = []
        for key in self.keys():
            rec, problem = self._read(key)
            if rec is not None:
                out.append(rec)
            elif problem:
                log.warning("tpflare cache: %s: %s (skipped)", self.path(key), problem)
        return out

    # --- writing (under the lock) --------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _Unwritable(f"cannot create {self.directory}: {e.strerror or e}") from e
        lock = filelock.FileLock(str(self.lock_path), timeout=self.lock_timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise CacheLockTimeout(
                f"tpflare: the composition cache lock {self.lock_path} was not acquired within "
                f"{self.lock_timeout:g} s: another process holds it (a running compile, or a hung "
                f"one: find it with `fuser {self.lock_path}`). Raise the wait with {LOCK_KNOB}=SECONDS, "
                f"or race without the cache with TPFLARE_CACHE=0.") from None
        except OSError as e:
            raise _Unwritable(f"cannot lock {self.lock_path}: {e.strerror or e}") from e
        try:
            yield
        finally:
            lock.release()

    def _unwritable(self, why: Any) -> None:
        _warn_once(self.directory, f"tpflare cache: {why}; racing without caching "
                                   f"(set TPFLARE_CACHE_DIR to a writable directory)")

    def _write_atomic(self, path: Path, text: str) -> None:
        tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}{_TMP_SUFFIX}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        # The directory is not fsynced: after a power cut the rename may be lost,
        # which is a cache miss (a new race), never a partial entry.

    def put(self, key: str, entry: dict) -> bool:
        """Store ``entry`` under ``key``; True if written, False if the cache is
        disabled or its directory is not writable (one warning per process).

        ``entry`` needs ``fields`` (the key fields: ``make_key(fields) == key``),
        ``winner`` (a name in ``timings``), ``timings`` (name -> ms, None for a
        composition that failed validation) and usually ``validation`` (name ->
        counts); ``measured`` (when / where) is filled in.  Bad input raises
        ValueError / TypeError."""
        if not self.enabled:
            return False
        path = self.path(key)
        if not isinstance(entry, dict):
            raise TypeError(f"cache entry must be a dict, not {type(entry).__name__}")
        if not isinstance(entry.get("fields"), dict) or make_key(entry["fields"]) != key:
            raise ValueError(f"entry['fields'] must be the fields that hash to key {key[:16]}…")
        problem = _entry_problem(entry)
        if problem:
            raise ValueError(f"bad cache entry: {problem}")
        rec = dict(entry, format=FORMAT, version=VERSION, key=key)
        rec["validation"] = dict(entry.get("validation", {}))
        rec["measured"] = {**_where(), **entry.get("measured", {})}
        try:
            with self._locked():
                old, _ = self._read(key)
                rec["revision"] = int(old.get("revision", 0)) + 1 if old else 1
                if old and old.get("winner") != rec["winner"]:
                    rec["previous_winner"] = old.get("winner")
                text = json.dumps(rec, indent=1, sort_keys=True, allow_nan=False)
                self._write_atomic(path, text + "\n")
        except _Unwritable as e:
            self._unwritable(e)
            return False
        except OSError as e:  # disk full, directory made read-only meanwhile, ...
            self._unwritable(f"cannot write {path}: {e.strerror or e}")
            return False
        return True

    def remove(self, key: str) -> bool:
        """Delete one entry; True if it existed."""
        path = self.path(key)
        try:
            with self._locked():
                path.unlink()
        except (_Unwritable, OSError) as e:
            if not isinstance(e, FileNotFoundError):
                self._unwritable(e)
            return False
        return True

    def _leftovers(self) -> list[Path]:
        try:
            return [p for p in self.directory.iterdir()
                    if p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX)]
        except OSError:
            return []

    def clear(self) -> int:
        """Delete every entry (valid or not), temp leftovers and the quarantine;
        returns how many entry files were removed."""
        removed = 0
        try:
            with self._locked():
                for key in self.keys():
                    with contextlib.suppress(FileNotFoundError):
                        self.path(key).unlink()
                        removed += 1
                for p in self._leftovers():
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                quarantine = self.directory / QUARANTINE
                if quarantine.is_dir():
                    for p in quarantine.iterdir():
                        p.unlink()
                    quarantine.rmdir()
        except (_Unwritable, OSError) as e:
            self._unwritable(e)
        return removed

    def verify(self, repair: bool = True) -> list[str]:
        """Check every file; returns one line per problem.  With ``repair`` (and a
        writable directory) bad entries are moved to ``quarantine/`` and temp files
        left by interrupted writers are deleted (a live writer holds the lock, so
        any temp file seen under the lock is a leftover)."""
        if not self.directory.is_dir():
            return []
        try:
            ctx = self._locked() if repair else contextlib.nullcontext()
            with ctx:
                return self._verify(repair)
        except _Unwritable as e:
            return [f"{e} (not repaired)"] + self._verify(False)

    def _verify(self, repair: bool) -> list[str]:
        problems = []
        for key in self.keys():
            _, problem = self._read(key)
            if problem is None:
                continue
            line = f"{key}.json: {problem}"
            if repair:
                qdir = self.directory / QUARANTINE
                qdir.mkdir(exist_ok=True)
                dest = qdir / f"{key}.json.{int(time.time())}.{os.getpid()}"
                os.replace(self.path(key), dest)
                line += f" -> moved to {QUARANTINE}/{dest.name}"
            problems.append(line)
        for p in self._leftovers():
            line = f"{p.name}: temp file of an interrupted write"
            if repair:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                line += " -> deleted"
            problems.append(line)
        return problems

