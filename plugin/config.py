"""Every tpflare knob, in one place.

A knob has an environment variable (``TPFLARE_*``), a type, a default and a line
of documentation.  ``tpflare.config`` is the process-wide object: attributes can
be set in code (``tpflare.config.latent_gather = True``) or temporarily with
``tpflare.config.patch(...)``; anything not set in code comes from the
environment, read when a graph is *prepared* (compiled), never at replay.

``decision=True`` knobs change what tpflare decides (rewrite or not, which
composition); they are part of every pass's ``uuid()`` and are checked to be
identical on all ranks before anything is decided (see ``distributed.py``).

``python -m tpflare knobs`` prints the table that README.md carries.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Iterator


class ConfigError(ValueError):
    """A knob has a value tpflare cannot use."""


def _parse_bool(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={raw!r}: expected 0/1 (or true/false)")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected an integer") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None


def _choice(*options: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        v = raw.strip().lower()
        if v not in options:
            raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(options)}")
        return v

    parse.options = options  # type: ignore[attr-defined]
    return parse


def _parse_str(name: str, raw: str) -> str:
    return raw


def _parse_rows(name: str, raw: str) -> tuple[int, ...]:
    """Ascending distinct positive row counts, comma-separated (brackets allowed); "" = none."""
    parts = [p for p in raw.strip().strip("[]()").replace(" ", "").split(",") if p]
    try:
        rows = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected comma-separated row counts") from None
    if any(r < 1 for r in rows) or list(rows) != sorted(set(rows)):
        raise ConfigError(f"{name}={raw!r}: row counts must be ascending, distinct and >= 1")
    return rows


@dataclasses.dataclass(frozen=True)
class Knob:
    field: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    decision: bool = True
    minimum: float | None = None

    @property
    def env(self) -> str:
        return "TPFLARE_" + self.field.upper()

    def coerce(self, value: Any) -> Any:
        """Validate a value given in code (same rules as the env var)."""
        if isinstance(value, str) or value is None:
            value = self.parse(self.env, "" if value is None else value)
        elif self.parse is _parse_bool:
            value = bool(value)
        elif self.parse is _parse_int:
            if isinstance(value, bool) or int(value) != value:
                raise ConfigError(f"{self.field}={value!r}: expected an integer")
            value = int(value)
        elif self.parse is _parse_float:
            value = float(value)
        else:
            value = self.parse(self.env, str(value))
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{self.env}={value!r}: must be >= {self.minimum}")
        return value


KNOBS: tuple[Knob, ...] = (
    # --- latent gather -------------------------------------------------------
    Knob("latent_gather", _parse_bool, False,
         "Rewrite down_reduce sites (K-sliced GEMM + all-reduce) into a full-K GEMM "
         "with the row shard + column all-gather. Off by default: it changes bits "
         "(more exact, identical on all ranks, but not equal to the reduce path)."),
    Knob("latent_gather_align", _parse_int, 64,
         "Width gate: rewrite only when N % (align * W) == 0 (N = full output width).",
         minimum=1),
    Knob("latent_gather_min_rows", _parse_int, 9,
         "Rows gate: rewrite only graphs whose row count is known to be >= this "
         "(decode graphs of <= 8 rows keep the all-reduce).", minimum=1),
    Knob("latent_gather_channel_rows", _parse_int, 0,
         "Gather in chunks of at most this many rows (bounds each message and its "
         "staging); 0 = one message.", minimum=0),
    Knob("latent_gather_reshard", _choice("auto", "never"), "auto",
         "Row-shard source when none is registered: auto = build it once at "
         "preparation (a DTensor weight redistributed over its mesh, else one all-to-all "
         "of every rank's column shard; memory reported); never = skip such sites."),
    Knob("latent_gather_dtypes", _parse_str, "bfloat16,float16",
         "Dtypes the rewrite applies to (comma-separated). FP32 is left out by default: "
         "the traffic still halves, but an FP32 all-reduce of FP32-accumulated partials "
         "is already about as exact as one full-K dot product (measured 2.89e-7 vs "
         "3.33e-7 rel RMS), so the exactness gain is gone; add float32 to opt in."),
    Knob("latent_gather_replication", _choice("check", "trust"), "check",
         "How the hidden row's replication is established where the graph does not prove "
         "it (an all-reduce/all-gather or a DTensor Replicate input upstream proves it): "
         "check = compare the graph inputs it is computed from across ranks once at "
         "preparation (a hash of their bits) and skip the site if they differ (and in every "
         "later compile of the same Dynamo frame; a graph that rewrote the site before the "
         "failed check keeps its rewrite, and every rank then logs one warning: results "
         "depend on call history); "
         "trust = the user asserts those inputs are replicated (no check)."),
    # --- candidate selection ---------------------------------------------------
    Knob("select", _choice("auto", "replicated", "owner"), "auto",
         "Selection composition: auto = race at compile time (cached); "
         "replicated / owner = force one, no race."),
    Knob("select_id_replication", _choice("auto", "allgather", "bf16"), "auto",
         "Owner composition's id replication child plan: auto = race both; "
         "allgather = int32 all-gather; bf16 = exact BF16 byte encoding in an all-reduce."),
    Knob("select_kernel", _choice("auto", "torch", "triton"), "auto",
         "Ordered-selection kernel, decided at preparation and bound into the compiled graph "
         "(the race times what will run): auto = tpflare's exact kernels on CUDA where Triton "
         "runs and the row has at most 131072 candidates (k <= 2048): Triton's, and beyond 4 rows "
         "CUDA thread blocks compiled by NVRTC (torch.cuda._compile_kernel; where it does not "
         "compile, Triton's): one a row of up to 16384 candidates (rows of 8193-16384 beyond one "
         "wave of rows: 512 threads a row, two blocks an SM, the row's keys in shared memory); "
         "a longer row's chunks and "
         "their merge up to 8 rows, 2 chunks, or as many rows as make one wave of chunks (a "
         "block an SM); beyond, and from 64 rows, a sampled keep "
         "(a sampled cutoff keeps the candidates above it, the chunks only where it may miss "
         "a winner); else the torch path; "
         "torch = packed-key torch.topk; triton = like auto, but an error where Triton cannot run. "
         "Under CUDA-graph replay the kernels are faster than plain fp32 torch.topk in every cell "
         "of the full grid (66 cells, random scores and mass ties: on an H200, session 33, "
         "1.27-6.6x its speed; on an H100, session 34, 1.28-6.4x, 1024 x 16384 in 128 us; rows of "
         "32768-131072 at 4-63 rows, on an H100: 1.1-2.7x); faster "
         "than the torch path wherever measured (1.8-16x, up to session 22). A new launch plan "
         "compiles on its first call: on the block path in 0.9-1.6 s where the CUDA driver's JIT "
         "cache (~/.nv/ComputeCache) does not hold its kernels yet (a plan's kernels compile at "
         "once, a thread each), under 0.1 s once it does; in a few seconds for a Triton plan "
         "(about 0.5 s in a later process that finds Triton's disk cache); nothing for a new "
         "shape of a compiled plan; tpflare.ops.select_kernel.precompile(capacities) compiles a "
         "server's plans at preparation. Figures and commands: "
         "docs/benchmarks_select_kernel.md. CPU always uses torch."),
    Knob("select_rows", _parse_rows, (1, 4, 16, 64, 256, 1024, 4096),
         "Row counts at which a selection site whose row count is symbolic (dynamic=True, or "
         "Dynamo's automatic dynamic shapes from a frame's second shape) is raced at preparation; "
         "the bound op (tpflare::select_by_rows) runs, per call, the winner at the smallest listed "
         "count >= its rows (the largest's beyond them); the site's candidates a rank and k, if "
         "symbolic, are specialised (shape guards: other values recompile). Each listed count is "
         "raced at preparation (its buffers: about rows x W x C x 8 bytes a rank at the largest), so "
         "a server short of memory lists its own capacities; a count where no composition passes "
         "validation on any rank is dropped from the table. Empty = no race there: the default composition (replicated). "
         "A site of static shape races its own row count."),
    Knob("race_warmup", _parse_int, 3, "Race: untimed warm-up runs per composition.", minimum=0),
    Knob("race_iters", _parse_int, 10, "Race: timed runs per composition (median taken).",
         minimum=1),
    Knob("race_timing", _choice("auto", "eager", "graph"), "auto",
         "Race: how trials are timed: graph = median of CUDA-graph replays (how serving "
         "runs; where capture fails on any rank or the device is not CUDA, every rank times "
         "that composition eagerly and the report says why); eager = eager calls (host "
         "launch overhead included); auto = graph on CUDA, eager elsewhere."),
    Knob("race_holdout", _parse_int, 4,
         "Race: holdout inputs per composition checked for exact ids (never timed).",
         minimum=1),
    Knob("race_near_tie", _parse_float, 0.03,
         "Race: a challenger must beat the default (replicated) by more than this "
         "fraction to win, so choices stay stable.", minimum=0.0),
    # --- preparation / cache / reporting (do not change decisions) ------------
    Knob("prep_timeout", _parse_float, 300.0,
         "Seconds a preparation-time collective (knob check, race, reshard "
         "agreement) may wait before every rank fails with a clear error.",
         decision=False, minimum=1.0),
    Knob("cache", _parse_bool, True, "Use the composition cache (0 = always race).",
         decision=False),
    Knob("cache_dir", _parse_str, "",
         "Composition cache directory; empty = $XDG_CACHE_HOME/tpflare "
         "(~/.cache/tpflare).", decision=False),
    Knob("cache_lock_timeout", _parse_float, 30.0,
         "Seconds to wait for the cache's file lock before failing with the "
         "lock file's name.", decision=False, minimum=0.0),
    Knob("report", _parse_str, "",
         "Append every rewrite / race decision as a JSON line to this file "
         "(read it with `python -m tpflare report FILE`).", decision=False),
)

_BY_FIELD = {k.field: k for k in KNOBS}


@dataclasses.dataclass(frozen=True)
class Settings:
    """An immutable snapshot of every knob, taken at preparation."""

    values: tuple[tuple[str, Any], ...]

    def __getattr__(self, name: str) -> Any:
        for k, v in object.__getattribute__(self, "values"):
            if k == name:
                return v
        raise AttributeError(name)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def decision_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.values if _BY_FIELD[k].decision}

    def decision_hash(self) -> str:
        blob = json.dumps(self.decision_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


class Config:
    """Process-wide knobs: code overrides on top of ``TPFLARE_*`` env vars."""

    def __init__(self) -> None:
        object.__setattr__(self, "_overrides", {})
        object.__setattr__(self, "generation", 0)  # bumped on every code override change

    def __getattr__(self, name: str) -> Any:
        if name not in _BY_FIELD:
            raise AttributeError(f"tpflare.config has no knob {name!r}; knobs: {sorted(_BY_FIELD)}")
        return self._value(_BY_FIELD[name], os.environ)

    def __setattr__(self, name: str, value: Any) -> None:
        knob = _BY_FIELD.get(name)
        if knob is None:
            raise AttributeError(f"tpflare.config has no knob {name!r}; knobs: {sorted(_BY_FIELD)}")
        self._overrides[name] = knob.coerce(value)
        self._bump()

    def _bump(self) -> None:
        object.__setattr__(self, "generation", self.generation + 1)

    def reset(self, name: str | None = None) -> None:
        """Forget code overrides (one knob or all): env vars apply again."""
        if name is None:
            self._overrides.clear()
        else:
            self._overrides.pop(name, None)
        self._bump()

    @contextlib.contextmanager
    def patch(self, **values: Any) -> Iterator["Config"]:
        saved = dict(self._overrides)
        try:
            for k, v in values.items():
                setattr(self, k, v)
            yield self
        finally:
            self._overrides.clear()
            self._overrides.update(saved)
            self._bump()

    def _value(self, knob: Knob, env) -> Any:
        if knob.field in self._overrides:
            return self._overrides[knob.field]
        if knob.env in env:
            return knob.coerce(env[knob.env])
        return knob.default

    def resolve(self, environ: dict[str, str] | None = None) -> Settings:
        """Every knob at once (what preparation takes); ``config.<knob>`` reads just one."""
        env = os.environ if environ is None else environ
        return Settings(tuple((knob.field, self._value(knob, env)) for knob in KNOBS))


config = Config()


def knobs_markdown() -> str:
    """The knob table for README.md (``python -m tpflare knobs``)."""
    rows = ["| env var | default | decides | meaning |", "| --- | --- | --- | --- |"]
    for k in KNOBS:
        default = k.default
        if isinstance(default, bool):
            default = int(default)
        elif isinstance(default, tuple):  # as the env var takes it
            default = ",".join(map(str, default))
        opts = getattr(k.parse, "options", None)
        doc = k.doc + (f" ({'/'.join(opts)})" if opts else "")
        rows.append(f"| `{k.env}` | `{default!s}` | {'yes' if k.decision else 'no'} | {doc} |")
    return "\n".join(rows)
