"""Benchmark: tpflare's exact Triton ordered selection against the torch paths, and its compile time.

    python bench/bench_select_kernel.py --out bench.json                       # the goal table
    python bench/bench_select_kernel.py --out bench.json --cold                # + cold compile seconds
    python bench/bench_select_kernel.py --out c.json --cold --no-bench --cold-shapes 64x16384 --cold-repeats 5 --capacities ""
    python bench/bench_select_kernel.py --out v.json --variants --grid small   # + both paths / options
    python bench/bench_select_kernel.py --out s.json --grid staged --variants --only staged_finish,staged_play2k

Methods (k = 2048 unless --k; every call returns ids and score bits of the whole op):
  kernel       tpflare.ops.select_kernel.triton_ordered_select, the path ``choose_path`` picks
  torch_path   tpflare.ops.ordering.torch_ordered_select: packed int64 key + torch.topk +
               gathers (what TPFLARE_SELECT_KERNEL=torch runs)
  topk_fp32    plain torch.topk(scores, k) on fp32 (not exact under the Order rule: ties and
               NaN unordered; the speed bar)
  (--baselines names those two timed beside the kernel: ``--baselines topk_fp32`` leaves out the
  packed torch path, which takes the most device time at many rows; exactness is checked against
  it either way)
Patterns (--patterns): ``random`` (randn scores, distinct ids), ``ties`` (scores in {0, 1, 2, 3}: the
cutoff inside a tie group of a quarter of the row), ``ties8`` (scores in {0, ..., 7}: an eighth),
``short`` (5 % finite scores, the rest -inf with valid ids: a short context in a padded buffer,
the cutoff inside the -inf tie).
Timing: CUDA-graph replay of --reps captured calls, median over --replays, divided by --reps
(how serving runs the selection); eager: CUDA events around one call, median of --iters. Inputs
rotate over three sets so that small shapes do not time a warm L2 only. ``exact``: the kernel's
ids and score bits equal the torch path's. Bandwidth: the bytes the op must move (scores and
ids read once, ids and scores written once) over the graph time.

Cold compile (--cold): for each shape (--cold-shapes) a fresh process with an empty TRITON_CACHE_DIR and an
empty CUDA driver JIT cache (CUDA_CACHE_PATH in the same folder: the block path's NVRTC kernels are PTX that
the driver compiles as they load and keeps, by default in ~/.nv/ComputeCache; up to session 32 that cache,
warm from earlier processes, hid about 0.7 s a kernel) times its first call (compile included) minus a
steady call; again in --cold-repeats processes that first ran a tiny
Triton kernel of their own (as one that compiled a model with Inductor has: Triton's driver module
built, its cost not the selection's; the median, since one process's seconds vary by up to 40 %);
then one process times ``precompile`` of a server's capacities (--capacities; empty: not) from an
empty cache, and the first call of a shape it did not name. The --out file is written after each
shape.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

GOALS_MS = {1: 0.015, 64: 0.030, 1024: 0.100}  # issue 13, N = 16384, k = 2048, graph replay

GRIDS = {
    # (pattern, N, Q) cells: Q sweep at N = 16384, N sweep at a few Q
    "full": [(n, q) for q in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) for n in (16384,)]
    + [(n, q) for n in (8192, 32768, 65536, 131072) for q in (1, 8, 64, 256, 1024)],
    "staged": [(n, q) for n in (8192, 16384, 32768, 65536, 131072) for q in (1, 2, 4)],  # with --variants
    "small": [(16384, q) for q in (1, 8, 64, 256, 1024)] + [(n, q) for n in (32768, 131072) for q in (1, 64)],
    "large": [(16384, q) for q in (64, 256, 1024, 4096)] + [(65536, q) for q in (256, 1024)],
    # rows re-read in chunks (the sampled cutoff), with --variants
    "sampled": [(n, q) for n in (32768, 65536, 131072) for q in (16, 64, 256, 1024)],
    # rows of 4097..16384 at many rows: the tiles row_config picks against chunks with the sampled
    # cutoff (row_sample1k, row_sampled), with --variants
    "mid": [(n, q) for n in (8192, 12000, 16384) for q in (64, 256, 1024, 4096)],
    # long rows at few rows: the staged path against the row kernel (choose_path), with --variants
    "long": [(n, q) for n in (32768, 65536, 131072) for q in (4, 8, 16, 32, 64)],
    # choose_path's edge for long rows (staged up to STAGED_LONG_ROWS), with --variants --only row,staged
    "edge": [(n, q) for n in (32768, 65536, 131072) for q in (5, 6, 7, 8, 9, 12)],
    # the same edge in N since the spread pass (session 18: staged up to 24576), and 1-4 rows
    # (always staged), with --variants --only row,staged
    "edge_n": [(n, q) for n in (20000, 24576, 28000, 32768) for q in (5, 8)]
    + [(n, q) for n in (20000, 32768, 65536, 131072) for q in (1, 2, 4)],
    # the register tiles at many rows: 16 warps, 4 (the 4096 tile's default up to session 17) and 8
    # capped at 128 registers a thread; with --variants --only row_w8r128,row_w4r128,row_w16,row_w4
    "occupancy8k": [(n, q) for n in (2500, 4096, 6000, 8192, 16384) for q in (64, 128, 192, 256, 1024, 4096)],
    # the 8192 tile's refinement threshold under its capped 8 warps (beyond FEW_ROWS_MAX rows), with
    # --variants --only row_refine2k,row_refine4k
    "refine8k": [(8192, q) for q in (256, 1024, 4096)] + [(6000, 1024)],
    # rows re-read in chunks at many rows, with --variants --only row_c8r128
    "occupancy_long": [(n, q) for n in (20000, 32768, 65536, 131072) for q in (64, 192, 256, 1024)],
    # rows re-read in chunks: the sampled cutoff and its pass before the row kernel, the pass spread
    # over the row's programs (spread_sample, session 18), with --variants --only row_inline_sample,...
    "spread": [(n, q) for n in (20000, 32768, 65536, 131072) for q in (5, 8, 16, 64, 256, 1024)],
    # spread_pass's row boundary (SPREAD_ROWS_MAX), with --variants --only row_inline_sample,row_spread
    "spread_edge": [(n, q) for n in (20000, 65536, 131072) for q in (96, 128, 160, 192)],
    # rows of 4097..16384 at few rows as a sampled tile of 4096 / 1024 (chunks, the sampled pass
    # spread up to SPREAD_ROWS_MAX rows) against the register tiles, with --variants --only
    # row_s4k_w4,row_s4k_w8,row_s4k_w16,row_s1k_w4
    "spread_tile": [(n, q) for n in (8192, 12000, 16384) for q in (8, 16, 32, 64)],
    # many rows: one 16-warp program an SM (the 16384 tile) against smaller programs on a sampled
    # tile of 4096 (row_s4k_*), with --variants
    "occupancy": [(n, q) for n in (8192, 16384) for q in (64, 1024, 4096)] + [(65536, q) for q in (64, 1024)],
    # mass ties (thousands of candidates in play) and random scores across the row paths' tiles
    # and the staged path, with --variants (record select_kernel_h200_finish_*.json)
    "finish": [(n, q) for n in (8192, 16384) for q in (64, 1024)] + [(65536, 1024), (131072, 8)]
    + [(n, 1) for n in (32768, 65536, 131072)],
    # the 8192 register tile (rows of 4097..8192) against the chunks it replaced, and rows of
    # 12000 and 16384; with --variants (record select_kernel_h200_tile8k.json, where the
    # variant row_fin8k was the row kernel's option fin_resident=8192, dropped since)
    "tile8k": [(n, q) for n in (6000, 8192) for q in (8, 64, 256, 1024, 4096)]
    + [(n, q) for n in (12000, 16384) for q in (64, 1024, 4096)],
    # the row-kernel tiles (select_kernel.row_config): rows of 4097..8192 (chunks until the 8192
    # tile: grid tile8k) and of 8193..16384 (registers), rows around 32768, the 4096 tile's warps
    # around FEW_ROWS_MAX; with --variants
    # rows beyond a block's 16384 candidates on the block path (its chunks and their merge, session
    # 23) against the row kernel and the staged path, with --variants --only block,block_c4k,block_c8k,row,staged
    "block_long": [(n, q) for n in (20000, 24576, 32768, 65536, 131072) for q in (5, 8, 64, 256, 1024)]
    + [(n, q) for n in (20000, 32768, 131072) for q in (1, 4)],
    # rows beyond a block at 9-63 rows (session 32): the row kernel against the chunks and merge (one wave of
    # chunks, BLOCK_LONG_WAVES, and beyond) and the sampled keep below SAMPLED_MIN_ROWS, with --variants --only
    # row,block,block_sampled
    "long_mid": [(n, q) for n in (49152, 65536, 131072) for q in (12, 16, 24, 33, 48, 63)],
    # the 512 tile at two blocks an SM where a launch has more blocks than SMs (session 32:
    # select_block.PAIRED_TILES), against one block an SM, with --variants --only block_unpaired
    "paired": [(8192, q) for q in (64, 128, 133, 192, 1024, 4096)] + [(4097, 1024), (6000, 1024), (32768, 40),
                                                                       (32768, 63), (20000, 1024), (65536, 256)],
    "tiles": [(n, q) for n in (6000, 8192) for q in (8, 16, 32, 64, 128)]
    + [(n, q) for n in (2500, 4096) for q in (8, 64, 128, 256, 1024)]
    + [(n, q) for n in (12000, 16384) for q in (8, 64, 1024)]
    + [(n, q) for n in (32768, 40000, 65536) for q in (33, 64, 256)],
}


def make_inputs(q: int, n: int, pattern: str, seed: int, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randperm(4 * n, generator=g, device=device)[:n].to(torch.int32).expand(q, n).contiguous()
    if pattern == "random":
        scores = torch.randn(q, n, generator=g, device=device)
    elif pattern == "ties":  # cutoff inside a large tie group: the id tie-break runs on every row
        scores = torch.randint(0, 4, (q, n), generator=g, device=device).float()
    elif pattern == "ties8":  # scores in {0, ..., 7}: a tie group of an eighth of the row at the cutoff
        scores = torch.randint(0, 8, (q, n), generator=g, device=device).float()
    elif pattern == "short":  # a short context in a padded buffer: 5 % finite, the rest -inf with valid ids,
        # so the cutoff falls in the -inf tie and the id tie-break runs over most of the row
        u = torch.rand(q, n, generator=g, device=device)
        scores = torch.where(u < 0.05, torch.randn(q, n, generator=g, device=device), float("-inf"))
    else:
        raise ValueError(pattern)
    return scores, ids


def time_eager(fn, sets, iters: int, warmup: int = 5) -> float:
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(*sets[i % len(sets)])
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def write_record(path: str, rec: dict) -> None:
    """A benchmark's JSON record, replaced whole (a run cut short leaves the last complete one)."""
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)


def time_graph(fn, sets, reps: int, replays: int) -> float:
    for args in sets:
        fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(*sets[i % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ms = statistics.median(a.elapsed_time(b) for a, b in ev) / reps
    del g
    return ms


def variants(q: int, n: int, k: int = 2048) -> dict:
    """Options of the production paths timed with --variants (names -> triton_ordered_select kwargs)."""
    v = {"row": dict(path="row"), "row_sort": dict(path="row", order="sort"),
         # the finish's digit width (radix_bits, default 5)
         "row_d4": dict(radix_bits=4), "row_d6": dict(radix_bits=6), "row_d8": dict(radix_bits=8),
         # the 8192 / 16384 tiles refine cutoff bins of more than 4096 candidates (the finish's
         # registers; default select_kernel.refine_min: 4096 / 8192), every bin (no finish
         # compiled), or none (the finish's chunks)
         "row_refine4k": dict(refine=4096), "row_refine_all": dict(refine=0), "row_norefine": dict(refine=16384),
         # (bins of 1025 / 2049 .. 4096 refined too, not put in the finish's registers)
         "row_refine1k": dict(refine=1024), "row_refine2k": dict(refine=2048),
         # the row kernel's ordering over as many buckets as winner slots (default twice as many)
         "row_ob1x": dict(order_buckets=max(2, 1 << (k - 1).bit_length())),
         "staged_d4": dict(path="staged", staged=dict(radix_bits=4)),
         "staged_d6": dict(path="staged", staged=dict(radix_bits=6)),
         "staged_d8": dict(path="staged", staged=dict(radix_bits=8))}
    if q <= 64:
        v.update(staged=dict(path="staged"), staged_bucket=dict(path="staged", order="bucket"),
                 staged_sort=dict(path="staged", order="sort"), row_rank=dict(path="row", order="rank"))
    if q <= 8:
        v["staged_unfused"] = dict(path="staged", staged=dict(fuse=False))
    if q <= 4:  # the cutoff bin picked by the finish, or (up to rank_play candidates) ranked whole;
        # the binned rank kernel's steps (rank_cols)
        v.update(staged_finish=dict(path="staged", staged=dict(rank_play=0)),
                 staged_play2k=dict(path="staged", staged=dict(rank_play=2048)),
                 staged_play8k=dict(path="staged", staged=dict(rank_play=8192)),
                 staged_cols128=dict(path="staged", staged=dict(rank_cols=128)),
                 staged_cols1024=dict(path="staged", staged=dict(rank_cols=1024)),
                 staged_rows16=dict(path="staged", staged=dict(rank_rows=16)),
                 # a cutoff bin beyond the finish's registers walked by the finish whole (no narrowing)
                 staged_nonarrow=dict(path="staged", staged=dict(narrow=False)),
                 # that walk in the finish's one program, or spread over the row's programs (the
                 # default beyond select_staged.SPREAD_MIN)
                 staged_nospread=dict(path="staged", staged=dict(spread=False)),
                 staged_spread=dict(path="staged", staged=dict(spread=True)))
    if q >= 64:  # row kernel tiles: registers with 8 warps, or chunks re-read with 4 / 8 warps
        v.update(row_w8=dict(num_warps=8), row_w32=dict(num_warps=32), row_c4=dict(resident=False, num_warps=4, chunk=1024),
                 row_c8=dict(resident=False, num_warps=8, chunk=2048))
    if q > 4:  # the tiles row_config chooses between, forced (its thresholds: --grid tiles; row_regs,
        # the register tile forced, in the records up to ce9952e, is every row's default up to 16384 since)
        if n <= 4096:  # the 4096 register tile with 4 or 16 warps
            v.update(row_w4=dict(resident=True, num_warps=4), row_w16=dict(resident=True, num_warps=16))
        v.update(row_c16=dict(resident=False, num_warps=16, chunk=4096),
                 row_c32=dict(resident=False, num_warps=32, chunk=8192))
    if q >= 64 and n > 16384:  # rows re-read in chunks, 8 warps capped at 128 registers (two programs an SM)
        v["row_c8r128"] = dict(resident=False, num_warps=8, maxnreg=128)
    if q > 4 and n > 16384:  # the sampled cutoff and its pass in the row kernel's program (before session 18)
        v["row_inline_sample"] = dict(spread_sample=False)
        v["row_spread"] = dict(spread_sample=True)  # (select_kernel.spread_pass's default up to SPREAD_ROWS_MAX rows)
        # the spread pass's programs: 8 warps, or 8192 candidates with 8 warps (default 4096 with 4)
        v["row_spread_w8"] = dict(path="row", consts=dict(SPREAD_WARPS=8))
        v["row_spread_c8k"] = dict(path="row", consts=dict(SPREAD_CHUNK=8192, SPREAD_WARPS=8))
        # rows re-read in chunks: without the sampled cutoff (the histogram passes)
        v.update(row_nosample=dict(resident=False, sample=0),
                 row_c16n=dict(resident=False, num_warps=16, chunk=4096, sample=0),
                 row_c32n=dict(resident=False, num_warps=32, chunk=8192, sample=0))
    if q > 4 and 4096 < n <= 8192:  # chunks with a sampled cutoff where row_config holds the 8192 tile
        v["row_sample1k"] = dict(resident=False, sample=1024, sample_cap=4096)
    if q > 4 and 8192 < n <= 16384:  # chunks with the sampled cutoff where row_config holds the row in registers
        v["row_sampled"] = dict(resident=False, sample=2048)
    if q >= 64 and n <= 16384:  # register tiles capped at 128 registers a thread, so that two 8-warp
        # programs (four 4-warp ones) share an SM (row_config's default for the 4096 and 8192 tiles
        # beyond FEW_ROWS_MAX rows), and 16 warps uncapped (the 8192 tile's default up to session 17)
        v["row_w8r128"] = dict(resident=True, num_warps=8, maxnreg=128)
        if n > 4096:
            v["row_w16"] = dict(resident=True, num_warps=16)
        if n <= 4096:
            v["row_w4r128"] = dict(resident=True, num_warps=4, maxnreg=128)
    if q > 4 and n > 4096:  # a sampled tile of 4096 (chunks): smaller programs, several an SM
        for w in (4, 8, 16):
            v[f"row_s4k_w{w}"] = dict(resident=False, num_warps=w, chunk=256 * w, sample=2048, sample_cap=4096)
        v["row_s1k_w4"] = dict(resident=False, num_warps=4, chunk=1024, sample=1024, sample_cap=4096)
    from tpflare.ops import select_block

    if n <= select_block.MAX_N:  # the block path (select_block): a block a row, or its chunks' and their merge's
        v["block"] = dict(path="block")
        v["block_unpaired"] = dict(path="block", block_consts=dict(PAIRED_TILES=()))  # (every tile one block an SM)
        if n > select_block.TILE_N:  # the sampled keep at any rows (select_block.SAMPLED_MIN_ROWS set to 1 for the call)
            v["block_sampled"] = dict(path="block", block_consts=dict(SAMPLED_MIN_ROWS=1))
        for c in (4096, 8192):  # shorter chunks than select_block.chunking's default (more blocks a row)
            if c < n and -(-n // c) * min(k, c) <= select_block.TILE_N:
                v[f"block_c{c // 1024}k"] = dict(path="block", block_chunk=c)
    return v


def select_with(sk, scores, ids, k, kw: dict):
    """triton_ordered_select with a variant's options; its ``consts`` (module constants of
    select_kernel, such as SPREAD_WARPS) and ``block_consts`` (of select_block, such as
    SAMPLED_MIN_ROWS) set for the call (the launches read them), then restored; ``block_chunk``:
    select_block.block_select with that chunk."""
    from tpflare.ops import select_block

    kw = dict(kw)
    if "block_chunk" in kw:
        return select_block.block_select(scores, ids, k, chunk=kw["block_chunk"])
    consts = [(sk, c, v) for c, v in kw.pop("consts", {}).items()]
    consts += [(select_block, c, v) for c, v in kw.pop("block_consts", {}).items()]
    saved = [(m, c, getattr(m, c)) for m, c, _ in consts]
    try:
        for m, c, v in consts:
            setattr(m, c, v)
        return sk.triton_ordered_select(scores, ids, k, **kw)
    finally:
        for m, c, v in saved:
            setattr(m, c, v)


def bench(args) -> list[dict]:
    from tpflare.ops import select_kernel as sk
    from tpflare.ops.ordering import torch_ordered_select

    k = args.k
    records = []
    for pattern in args.patterns.split(","):
        for n, q in GRIDS[args.grid]:
            try:
                sets = [make_inputs(q, n, pattern, seed=1000 * q + n + i) for i in range(3)]
            except torch.cuda.OutOfMemoryError:
                continue
            ref = torch_ordered_select(*sets[0], k)
            methods = {"kernel": lambda s, i: sk.triton_ordered_select(s, i, k)}
            if args.variants:
                for name, kw in variants(q, n, k).items():
                    if args.only and name not in args.only.split(","):
                        continue
                    methods[name] = lambda s, i, kw=kw: select_with(sk, s, i, k, kw)
            baselines = dict(torch_path=lambda s, i: torch_ordered_select(s, i, k),
                             topk_fp32=lambda s, i: torch.topk(s, k, dim=1))
            methods.update((b, baselines[b]) for b in args.baselines.split(",") if b)
            for name, fn in methods.items():
                rec = dict(pattern=pattern, n=n, q=q, k=k, method=name)
                try:
                    if name not in ("torch_path", "topk_fp32"):
                        got = fn(*sets[0])
                        rec["exact"] = bool(torch.equal(got[0], ref[0]) and torch.equal(
                            got[1].view(torch.int32), ref[1].view(torch.int32)))
                        if name == "kernel":
                            rec["path"] = sk.choose_path(q, n, k, sk._num_sms(0))
                        kw = {} if name == "kernel" else variants(q, n, k)[name]
                        resident = sk.row_config(n, q, kw.get("num_warps"), kw.get("chunk"), kw.get("resident"))[3]
                        if (kw.get("path", rec.get("path", "row")) == "row"
                                and sk.sample_config(n, resident, kw.get("sample"))[0]):
                            hits = torch.zeros(q, dtype=torch.int32, device="cuda")  # rows the sampled cutoff held
                            select_with(sk, *sets[0], k, dict(kw, path="row", sample_hits=hits))
                            rec["sample_hit_rows"] = int(hits.sum())
                    rec["graph_ms"] = time_graph(fn, sets, args.reps, args.replays)
                    rec["eager_ms"] = time_eager(fn, sets, args.iters)
                except Exception as ex:  # keep the rest of the table
                    rec["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
                rec["gbps"] = (q * n * 8 + q * k * 8) / (rec["graph_ms"] * 1e6) if rec.get("graph_ms") else None
                records.append(rec)
                print(json.dumps(rec), flush=True)
            del sets, ref
            torch.cuda.empty_cache()
    return records


_COLD = r"""
import json, sys, time, torch
from tpflare.ops import select_kernel as sk
q, n, k = (int(x) for x in sys.argv[1:4])
sk.PARALLEL_COMPILE = sys.argv[5] != "serial"  # (--serial-compile: the kernels one after another)
s = torch.randn(q, n, device="cuda"); i = torch.randperm(n, device="cuda").to(torch.int32).expand(q, n).contiguous()
if sys.argv[4] == "1":  # a process that ran a Triton kernel already (an Inductor-compiled model)
    import triton, triton.language as tl
    @triton.jit
    def _touch(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1.0)
    _touch[(1,)](torch.zeros(1, device="cuda"))
torch.cuda.synchronize()
t0 = time.perf_counter(); sk.triton_ordered_select(s, i, k); torch.cuda.synchronize(); first = time.perf_counter() - t0
t0 = time.perf_counter(); sk.triton_ordered_select(s, i, k); torch.cuda.synchronize(); steady = time.perf_counter() - t0
print(json.dumps(dict(q=q, n=n, k=k, path=sk.choose_path(q, n, k, sk._num_sms(0)), first_s=first, steady_s=steady,
                      cold_compile_s=first - steady)))
"""

_PRE = r"""
import json, sys, time, torch
from tpflare.ops import select_kernel as sk
caps = [int(x) for x in sys.argv[1].split(",")]; n, k, extra_q, extra_n = (int(x) for x in sys.argv[2:6])
sk.PARALLEL_COMPILE = sys.argv[6] != "serial"
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter(); per = sk.precompile(caps, k=k, n=n); total = time.perf_counter() - t0
s = torch.randn(extra_q, extra_n, device="cuda")
i = torch.randperm(extra_n, device="cuda").to(torch.int32).expand(extra_q, extra_n).contiguous(); torch.cuda.synchronize()
t0 = time.perf_counter(); sk.triton_ordered_select(s, i, k); torch.cuda.synchronize(); first = time.perf_counter() - t0
t0 = time.perf_counter(); sk.triton_ordered_select(s, i, k); torch.cuda.synchronize(); steady = time.perf_counter() - t0
print(json.dumps(dict(capacities=caps, n=n, k=k, precompile_s=total, per_shape_s={f"{a}x{b}": v for (a, b), v in per.items()},
                      new_shape=[extra_q, extra_n], new_shape_first_s=first, new_shape_steady_s=steady)))
"""


def _run(code: str, argv: list[str], cache_dir: str) -> dict:
    # cache_dir holds Triton's cache and the CUDA driver's JIT cache (the block path's NVRTC kernels are PTX
    # that the driver compiles as they load, and keeps for later processes; session 33): a new folder,
    # both empty; the folder of an earlier process, both as it left them
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, CUDA_CACHE_PATH=os.path.join(cache_dir, "cuda_jit"))
    env.pop("CUDA_CACHE_DISABLE", None)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:  # a file: triton.jit reads its source
        f.write(code)
    try:
        out = subprocess.run([sys.executable, f.name, *argv], env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(f.name)
    if out.returncode:
        return dict(argv=argv, error=out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fresh_run(code: str, argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="triton_cold_") as d:
        return _run(code, argv, d)


def cold(args, save=None) -> dict:
    """Per shape: a process with an empty Triton cache and CUDA JIT cache, then a second process
    on the caches the first one filled (a server restart: kernels loaded from disk, nothing
    compiled), then
    ``--cold-repeats`` processes, each with an empty cache, that ran a Triton kernel of their own
    first (``after_triton_cold_compile_s``: their median; ``_all``: each). The compile seconds of
    one process vary by up to 40 % on the H200 host, so take several. ``save(result)`` after
    each shape (a run cut short keeps what it measured)."""
    shapes = [tuple(int(x) for x in c.split("x")) for c in args.cold_shapes.split(",") if c]  # ("": precompile only)
    mode = "serial" if args.serial_compile else "parallel"
    per = []
    res = dict(per_shape=per, precompile=None, compile=mode)
    for q, n in shapes:
        with tempfile.TemporaryDirectory(prefix="triton_cold_") as d:
            r = _run(_COLD, [str(q), str(n), str(args.k), "0", mode], d)
            warm = _run(_COLD, [str(q), str(n), str(args.k), "0", mode], d)
        after = []
        for _ in range(max(1, args.cold_repeats)):
            with tempfile.TemporaryDirectory(prefix="triton_cold_") as d:  # Triton's driver built by another kernel
                after.append(_run(_COLD, [str(q), str(n), str(args.k), "1", mode], d).get("cold_compile_s"))
        ok = [a for a in after if a is not None]
        r["after_triton_cold_compile_s"] = statistics.median(ok) if ok else None
        r["after_triton_cold_compile_s_all"] = after
        r["disk_cache_first_call_s"] = warm.get("first_s")
        per.append(r)
        print(json.dumps(r), flush=True)
        if save:
            save(res)
    if args.capacities:
        res["precompile"] = _fresh_run(_PRE, [args.capacities, "16384", str(args.k), "49", "12000", mode])
        print(json.dumps(res["precompile"]), flush=True)
    return res


def table(records: list[dict], cold_res: dict | None) -> str:
    def get(p, n, q, m, col="graph_ms"):
        for r in records:
            if (r["pattern"], r["n"], r["q"], r["method"]) == (p, n, q, m):
                return r.get(col)
        return None

    lines = ["| pattern | N | Q | path | kernel ms | torch path ms | fp32 topk ms | x torch path | x fp32 | "
             "GB/s | exact | goal |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    seen = []
    for r in records:
        key = (r["pattern"], r["n"], r["q"])
        if key in seen:
            continue
        seen.append(key)
        p, n, q = key
        kms, tms, fms = get(p, n, q, "kernel"), get(p, n, q, "torch_path"), get(p, n, q, "topk_fp32")
        goal = GOALS_MS.get(q) if n == 16384 else None
        fmt = lambda x: "-" if x is None else f"{x:.4f}"
        ratio = lambda a, b: "-" if a is None or b is None else f"{b / a:.2f}"
        gb = get(p, n, q, "kernel", "gbps")
        mark = "" if goal is None or kms is None else (f"<= {goal} {'met' if kms <= goal else 'MISSED'}")
        if fms is not None and kms is not None and kms > fms:
            mark += " (slower than fp32 topk)"
        lines.append(f"| {p} | {n} | {q} | {get(p, n, q, 'kernel', 'path')} | {fmt(kms)} | {fmt(tms)} | {fmt(fms)} | "
                     f"{ratio(kms, tms)} | {ratio(kms, fms)} | {'-' if gb is None else f'{gb:.0f}'} | "
                     f"{get(p, n, q, 'kernel', 'exact')} | {mark} |")
    if cold_res:
        lines += ["", "| Q | N | path | cold compile s (empty Triton cache: first call - steady call) | "
                      "the same after another Triton kernel ran (Triton's driver built) | "
                      "first call s, next process (Triton's disk cache) |", "| --- | --- | --- | --- | --- | --- |"]
        for r in cold_res["per_shape"]:
            dc, at = r.get("disk_cache_first_call_s"), r.get("after_triton_cold_compile_s")
            lines.append(f"| {r.get('q')} | {r.get('n')} | {r.get('path')} | {r.get('cold_compile_s', float('nan')):.2f} | "
                         f"{'-' if at is None else f'{at:.2f}'} | {'-' if dc is None else f'{dc:.3f}'} |"
                         if "error" not in r else f"| error | {r['error'][-200:]} |")
        pre = cold_res["precompile"]
        if pre is None:
            pass
        elif "error" not in pre:
            lines.append(f"\nprecompile(capacities={pre['capacities']}, n={pre['n']}, k={pre['k']}) from an empty "
                         f"cache: {pre['precompile_s']:.2f} s; then a new shape {pre['new_shape']}: first call "
                         f"{pre['new_shape_first_s'] * 1e3:.1f} ms (steady {pre['new_shape_steady_s'] * 1e3:.2f} ms)")
        else:
            lines.append(f"precompile: error {pre['error'][-300:]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--grid", default="full", choices=sorted(GRIDS))
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--patterns", default="random,ties")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--variants", action="store_true", help="also time both paths and their options")
    ap.add_argument("--only", default="", help="with --variants: only these (comma-separated names)")
    ap.add_argument("--baselines", default="torch_path,topk_fp32",
                    help="the baselines timed beside the kernel (comma-separated; '' for none)")
    ap.add_argument("--cold", action="store_true", help="also measure cold compile seconds (fresh processes)")
    ap.add_argument("--no-bench", action="store_true", help="only --cold")
    ap.add_argument("--cold-shapes", default="1x16384,4x16384,64x16384,1024x16384,1x131072,64x131072",
                    help="--cold: QxN shapes, each in fresh processes")
    ap.add_argument("--capacities", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096",
                    help="--cold: then time precompile of these Q at N = 16384 (empty: not)")
    ap.add_argument("--serial-compile", action="store_true",
                    help="--cold: a plan's kernels compiled one after another (select_kernel.PARALLEL_COMPILE off)")
    ap.add_argument("--cold-repeats", type=int, default=1,
                    help="--cold: processes a shape for the compile seconds after Triton's setup (median)")
    args = ap.parse_args(argv)
    unknown = set(args.baselines.split(",")) - {"", "torch_path", "topk_fp32"}
    if unknown:
        ap.error(f"--baselines: unknown {sorted(unknown)} (torch_path, topk_fp32)")
    from tpflare.ops import select_kernel as sk

    if not sk.available():
        print("kernel not available (needs triton + CUDA)", file=sys.stderr)
        return 2
    import triton

    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                k=args.k, reps=args.reps, replays=args.replays, iters=args.iters, argv=sys.argv[1:])
    def save(cold_res, records=()):
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, records=list(records), cold=cold_res), f, indent=1)

    cold_res = cold(args, save) if args.cold else None
    records = [] if args.no_bench else bench(args)
    save(cold_res, records)
    print(f"\n{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, k={args.k}; CUDA-graph replay")
    print(table(records, cold_res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
