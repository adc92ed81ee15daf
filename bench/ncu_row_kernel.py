"""Where the row kernel's (or the block kernel's) warps stall, source line by source line (Nsight
Compute on a GPU host).

    ncu --import-source yes --set full -k regex:'^_row_kernel$' -c 1 -o row \\
        python3 bench/ncu_row_kernel.py run --q 1024 --pattern random
    ncu -i row.ncu-rep --page source --csv --print-source cuda,sass > row_src.csv
    ncu -i row.ncu-rep --page details --csv > row_details.csv
    python3 bench/ncu_row_kernel.py summary row_src.csv [--details row_details.csv] [--top 25]   # any machine
    python3 bench/ncu_row_kernel.py diff random_src.csv short_src.csv [--top 30]   # where short's extra goes
    python3 bench/ncu_row_kernel.py functions blk_src.csv[.gz] --source /tmp/block.cu [--rows 1024]   # by function

``run`` calls the production kernel (``triton_ordered_select``, N = 16384, k = 2048) twice, so
the profiled launch is a compiled one. ``summary`` adds up ncu's warp-state samples by source
line (Triton's line info points at ``ops/*.py``) and prints the lines with the most samples,
each with its three largest stall reasons: what a change should shorten; with ``--details``,
first the kernel-wide figures of ``DETAILS`` (duration, IPC, occupancy, spill requests).

The block path's kernel (``ops/select_block.py``, NVRTC; the dispatcher's pick from 5 rows of up
to 16384): ``run --block-source /tmp/block.cu`` compiles the kernel with ``-lineinfo`` behind a
``#line`` directive naming that file, and writes its source there, so ncu maps samples to its lines
(give ncu ``--clock-control none`` and ``-k regex:tpflare_select_rows``). The file holds the last
source compiled: profile a call of one kernel (a row of one block), not a long row's chunks and merge.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
import sys


def _with_line_info(path: str) -> None:
    """torch.cuda._compile_kernel, for this process: the source saved to ``path`` (the last one
    compiled) behind a ``#line`` naming it, compiled with -lineinfo."""
    import torch

    compile_kernel = torch.cuda._compile_kernel

    def compile_with_lines(src, name, *args, nvcc_options=None, **kw):
        with open(path, "w") as f:
            f.write(src)
        opts = list(nvcc_options or []) + ["-lineinfo"]
        return compile_kernel(f'#line 1 "{path}"\n' + src, name, *args, nvcc_options=opts, **kw)

    torch.cuda._compile_kernel = compile_with_lines


def run(q: int, pattern: str, n: int, k: int, block_source: str | None = None) -> None:
    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_select_kernel import make_inputs

    from tpflare.ops import select_kernel as sk

    if block_source:
        _with_line_info(block_source)
    s, i = make_inputs(q, n, pattern, seed=0)
    for _ in range(2):
        sk.triton_ordered_select(s, i, k)
    torch.cuda.synchronize()


DETAILS = ("Duration", "Executed Ipc Active", "Issue Slots Busy", "Achieved Occupancy", "Registers Per Thread",
           "Local Memory Spilling Requests")


def details(path: str) -> None:
    """The kernel-wide metrics of ``DETAILS`` from ncu's details page (CSV)."""
    rows = list(csv.reader(open(path)))
    hdr = rows[0]
    name, unit, value = (hdr.index(c) for c in ("Metric Name", "Metric Unit", "Metric Value"))
    got = {r[name]: f"{r[value]} {r[unit]}".strip() for r in rows[1:] if len(r) > value and r[name] in DETAILS}
    print("; ".join(f"{m}: {got[m]}" for m in DETAILS if m in got))


def line_samples(path: str) -> list:
    """ncu's warp-state samples by source line from its source page (CSV): (samples, file,
    line, source text, {stall reason: samples}) a line."""
    rows = list(csv.reader(open(path)))
    src, hdr, lines = None, None, []
    for r in rows:
        if len(r) == 2 and r[0] == "File Path":
            src = r[1].rsplit("/", 1)[-1]
        elif r and r[0] == "Line No":
            hdr = r
        elif hdr and len(r) >= 5 and r[0]:  # a source line (its SASS rows follow, first cell empty)
            d = dict(zip(hdr, r))
            try:
                n = int(d["Warp Stall Sampling (All Samples)"])
            except (KeyError, ValueError):
                continue
            stalls = {h[6:]: int(v) for h, v in zip(hdr, r)
                      if h.startswith("stall_") and "Not Issued" not in h and v.isdigit() and int(v)}
            lines.append((n, src, r[0], r[1].strip()[:88], stalls))
    return lines


def summary(path: str, top: int) -> None:
    lines = line_samples(path)
    total = sum(x[0] for x in lines) or 1
    by_file = collections.Counter()
    for n, f, *_ in lines:
        by_file[f] += n
    print(f"{total} samples; by file: " + ", ".join(f"{f} {100 * n / total:.1f}%" for f, n in by_file.most_common()))
    for n, f, ln, text, stalls in sorted(lines, key=lambda x: x[0], reverse=True)[:top]:
        why = ", ".join(f"{k} {v}" for k, v in sorted(stalls.items(), key=lambda x: -x[1])[:3])
        print(f"{100 * n / total:5.1f}% {f}:{ln}  {text}  [{why}]")


def functions(path: str, source: str, rows: int) -> None:
    """ncu's instructions executed and warp samples, summed by the function whose definition the
    source line follows in ``source`` (the kernel's saved text, ``run --block-source``), a row's share
    too (``rows``: the launch's rows)."""
    defs = []
    with open(source) as f:
        text = f.read().splitlines()
    for n, line in enumerate(text, 1):
        if re.match(r'(?:extern "C"\s+)?__(?:device|global)__\b', line):  # (its name: here, or the next line's)
            names = [x for x in re.findall(r"(\w+)\s*\(", line + " " + (text[n] if n < len(text) else ""))
                     if x != "__launch_bounds__"]
            defs.append((n, names[0] if names else f"(the function at line {n})"))
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows_csv = list(csv.reader(f))
    hdr, per = None, collections.defaultdict(lambda: [0, 0])
    for r in rows_csv:
        if r and r[0] == "Line No":
            hdr = r
        elif hdr and r and r[0].isdigit():
            d = dict(zip(hdr, r))
            line = int(r[0])
            name = next((fn for n, fn in reversed(defs) if n <= line), "(before any function)")
            for i, col in enumerate(("Warp Stall Sampling (All Samples)", "Instructions Executed")):
                try:
                    per[name][i] += int(d.get(col, "0").replace(",", ""))
                except ValueError:
                    pass
    samples = sum(v[0] for v in per.values()) or 1
    instr = sum(v[1] for v in per.values()) or 1
    print(f"{instr} warp instructions, {instr / rows:.0f} a row; {samples} samples")
    for name, (n, i) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:28} instructions {100 * i / instr:5.1f}% {i / rows:8.0f} a row   samples {100 * n / samples:5.1f}%")


def diff(base: str, other: str, top: int) -> None:
    """The source lines whose samples grew most from one profile to another (the same kernel on
    two inputs, say random scores and a mass tie: where the second's extra time goes)."""
    a, b = collections.Counter(), collections.Counter()
    text = {}
    for counts, path in ((a, base), (b, other)):
        for n, f, ln, t, _ in line_samples(path):
            counts[(f, ln)] += n
            text[(f, ln)] = t
    print(f"{sum(a.values())} -> {sum(b.values())} samples")
    grown = sorted(set(a) | set(b), key=lambda key: a[key] - b[key])[:top]
    for key in grown:
        print(f"{b[key] - a[key]:6d} ({a[key]:5d} -> {b[key]:5d}) {key[0]}:{key[1]}  {text[key]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--q", type=int, default=1024)
    r.add_argument("--n", type=int, default=16384)
    r.add_argument("--k", type=int, default=2048)
    r.add_argument("--pattern", default="random")
    r.add_argument("--block-source", help="save the block kernel's NVRTC source here and compile it with line info")
    s = sub.add_parser("summary")
    s.add_argument("csv")
    s.add_argument("--top", type=int, default=25)
    s.add_argument("--details", help="ncu's details page as CSV: kernel-wide figures first")
    d = sub.add_parser("diff")
    d.add_argument("base_csv")
    d.add_argument("other_csv")
    d.add_argument("--top", type=int, default=30)
    fn = sub.add_parser("functions")
    fn.add_argument("csv")
    fn.add_argument("--source", required=True, help="the kernel's source as run --block-source saved it")
    fn.add_argument("--rows", type=int, default=1024, help="the launch's rows (a row's share)")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        run(a.q, a.pattern, a.n, a.k, a.block_source)
    elif a.cmd == "diff":
        diff(a.base_csv, a.other_csv, a.top)
    elif a.cmd == "functions":
        functions(a.csv, a.source, a.rows)
    else:
        if a.details:
            details(a.details)
        summary(a.csv, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
