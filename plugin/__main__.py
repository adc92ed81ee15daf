"""``python -m tpflare`` (and the ``tpflare`` console script).

    tpflare knobs                      the knob table (README.md carries it)
    tpflare report FILE                a TPFLARE_REPORT file, readable
    tpflare cache list [--dir DIR]     every cached race winner
    tpflare cache show KEY [--dir DIR] one entry (a unique key prefix is enough)
    tpflare cache clear [--dir DIR]    delete every entry
    tpflare cache verify [--dir DIR]   check every file, quarantine bad ones
    tpflare demo [ARGS...]             the demo (tpflare.demo)
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Sequence


def _cmd_knobs(args: argparse.Namespace) -> int:
    from tpflare.config import knobs_markdown

    print(knobs_markdown())
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tpflare.reporting import format_report

    try:
        with open(args.file, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        print(f"tpflare: cannot read report {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    recs, bad = [], 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "kind" not in rec or "decision" not in rec:
                raise ValueError("not a tpflare report record")
        except ValueError as e:
            bad += 1
            print(f"tpflare: {args.file}:{n}: skipped ({e})", file=sys.stderr)
            continue
        recs.append(rec)
    print(format_report(recs))
    return 1 if bad else 0


# --- cache ---------------------------------------------------------------------
def _open_cache(args: argparse.Namespace):
    from tpflare.cache import CompositionCache
    from tpflare.config import config

    settings = config.resolve()
    # The CLI inspects the cache even when TPFLARE_CACHE=0 turns it off for compiles.
    return CompositionCache(args.dir or settings.cache_dir or None, settings.cache_lock_timeout)


def _fmt_ms(v: Any) -> str:
    """A timing: a number of ms, or the race's dict of statistics (ms)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.4f} ms"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt_ms(x) if k.endswith('_ms') else x}" for k, x in v.items())
    return "failed validation" if v is None else str(v)


def _site_line(fields: dict) -> str:
    parts = [str(fields.get("op", "?"))]
    for name in ("shapes", "dtypes", "k", "world", "group_ranks"):
        if name in fields:
            parts.append(f"{name}={json.dumps(fields[name], separators=(',', ':'))}")
    dev = fields.get("device")
    if isinstance(dev, dict):
        parts.append(dev.get("name") or dev.get("type", "?"))
    return " ".join(parts)


def _where_line(measured: dict) -> str:
    when = measured.get("utc") or measured.get("time", "?")
    where = measured.get("host", "?")
    if "rank" in measured:
        where += f" rank {measured['rank']}"
    return f"{when} on {where}"


def _describe(rec: dict, full: bool) -> list[str]:
    lines = [f"{rec['key'] if full else rec['key'][:16]}  {_site_line(rec.get('fields', {}))}"]
    lines.append(f"  winner: {rec['winner']}" + (
        f" (was {rec['previous_winner']})" if rec.get("previous_winner") else ""))
    validation = rec.get("validation", {})
    for name, ms in sorted(rec.get("timings", {}).items()):
        mark = "*" if name == rec["winner"] else " "
        val = validation.get(name)
        val_s = f"  validation {json.dumps(val, separators=(',', ':'))}" if val is not None else ""
        lines.append(f"  {mark} {name}: {_fmt_ms(ms)}{val_s}")
    lines.append(f"  measured: {_where_line(rec.get('measured', {}))} (revision {rec.get('revision', 1)})")
    if full:
        lines.append("  fields:")
        lines += ["    " + l for l in json.dumps(rec.get("fields", {}), indent=2, sort_keys=True).splitlines()]
    return lines


def _cmd_cache(args: argparse.Namespace) -> int:
    from tpflare.cache import CacheLockTimeout

    cache = _open_cache(args)
    try:
        return _CACHE_CMDS[args.cache_cmd](cache, args)
    except CacheLockTimeout as e:
        print(str(e), file=sys.stderr)
        return 3


def _cache_list(cache, args) -> int:
    recs = cache.entries()
    print(f"{cache.directory}: {len(recs)} entr{'y' if len(recs) == 1 else 'ies'}")
    for rec in recs:
        print("\n".join(_describe(rec, full=False)))
    return 0


def _cache_show(cache, args) -> int:
    matches = [k for k in cache.keys() if k.startswith(args.key.lower())]
    if len(matches) != 1:
        what = "no entry" if not matches else f"{len(matches)} entries"
        print(f"tpflare: {what} with key prefix {args.key!r} in {cache.directory}", file=sys.stderr)
        return 1
    rec = cache.get(matches[0])
    if rec is None:
        print(f"tpflare: {matches[0]}.json is not a valid entry (see `tpflare cache verify`)",
              file=sys.stderr)
        return 1
    print("\n".join(_describe(rec, full=True)))
    return 0


def _cache_clear(cache, args) -> int:
    n = cache.clear()
    print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {cache.directory}")
    return 0


def _cache_verify(cache, args) -> int:
    problems = cache.verify(repair=not args.no_repair)
    for p in problems:
        print(p)
    print(f"{cache.directory}: {len(cache.entries())} valid entries, {len(problems)} problem(s)")
    return 1 if problems else 0


_CACHE_CMDS = {"list": _cache_list, "show": _cache_show, "clear": _cache_clear,
               "verify": _cache_verify}


def _cmd_demo(args: argparse.Namespace) -> int:
    import importlib

    try:
        demo = importlib.import_module("tpflare.demo")
    except ModuleNotFoundError as e:
        if e.name != "tpflare.demo":  # the demo exists but something it imports is missing
            raise
        print("tpflare: the demo (tpflare.demo) is not part of this build yet", file=sys.stderr)
        return 2
    rc = demo.main(list(args.args))
    return rc if isinstance(rc, int) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpflare", description="tpflare command line tools")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sub.add_parser("knobs", help="print the knob table (markdown)").set_defaults(fn=_cmd_knobs)

    rp = sub.add_parser("report", help="print a TPFLARE_REPORT JSON-lines file")
    rp.add_argument("file", metavar="FILE")
    rp.set_defaults(fn=_cmd_report)

    cp = sub.add_parser("cache", help="inspect or manage the composition cache")
    csub = cp.add_subparsers(dest="cache_cmd", required=True, metavar="ACTION")
    dir_help = "cache directory (default: TPFLARE_CACHE_DIR or ~/.cache/tpflare)"
    for name, help_ in (("list", "every entry: site, winner, timings"),
                        ("show", "one entry in full"),
                        ("clear", "delete every entry"),
                        ("verify", "check every file; quarantine bad ones")):
        ap = csub.add_parser(name, help=help_)
        if name == "show":
            ap.add_argument("key", metavar="KEY", help="the key or a unique prefix of it")
        if name == "verify":
            ap.add_argument("--no-repair", action="store_true", help="report only, move nothing")
        ap.add_argument("--dir", default=None, help=dir_help)
    cp.set_defaults(fn=_cmd_cache)

    dp = sub.add_parser("demo", help="run the demo (arguments are passed on)")
    dp.add_argument("args", nargs=argparse.REMAINDER)
    dp.set_defaults(fn=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # tpflare's loggers have a NullHandler; show the cache's warnings on stderr here
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if argv[:1] == ["demo"]:  # everything after `demo` is the demo's, options included
        return _cmd_demo(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
