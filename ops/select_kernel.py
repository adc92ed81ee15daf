"""Exact ordered top-k selection of (score, id) candidates on CUDA, in Triton.

``triton_ordered_select(scores, ids, k)`` returns the first ``k`` candidates of
each row under DESIGN.md's **Order** rule, bit for bit:

1. valid (``id >= 0``) before invalid;
2. score descending under a total order: the IEEE-754 bit order (so ``+0.0``
   ranks before ``-0.0``) with every NaN (any sign, any payload) below ``-inf``;
3. then lower id first.

Output: ``(ids int32 [Q, k], scores fp32 [Q, k])``. Score bits of the selected
candidates are copied, never recomputed (NaN payloads survive). When a row has
fewer than ``k`` valid candidates the tail is padded with id ``-1`` and score
``-inf`` (the ids are the contract; the pad score is ``-inf`` by choice).
Invalid candidates are never returned as such: every output slot past the valid
ones is a pad, whatever score the invalid candidate carried.

Three paths, chosen by ``choose_path`` (the one dispatcher; measured on an H200, graph replay):
the *staged* path of ``select_staged.py`` (each row spread over many programs; up to 4 rows, and
up to 8 rows of 16385..24576 candidates where the block path does not run), the *block* path of
``select_block.py`` (CUDA thread blocks compiled by NVRTC, where it runs: beyond 4 rows, one a row
of up to 16384 candidates; a longer row in chunks, a block each, and one block merging their best,
up to 8 rows or 2 chunks) and the *row* kernel of this module (one program a row: the rest, and
the block path's shapes where it does not run).

Row kernel design (one program per row, no host synchronisation, CUDA-graph capturable):

* Score key ``s``: an int32 whose signed order is the total order above
  (``bits`` if the sign bit is clear, ``bits ^ 0x7fffffff`` otherwise; NaN is
  ``INT_MIN + 1``, an invalid candidate ``INT_MIN``). Rows of up to ``RESIDENT_MAX`` candidates
  stay in registers (tiles of 4096, 8192 or 16384); longer rows are re-read in chunks
  (``row_config``).
* Sampled cutoff (rows re-read in chunks beyond ``RESIDENT_MAX``; ``sample_config``): 2048
  evenly spaced candidates give a cutoff (a score key, and an id where the samples tie at it)
  that very likely keeps between ``min(k, valid)`` and ``SAMPLE_CAP`` candidates; one pass keeps
  them, and when their count says they hold the winners the steps below run on them as one
  register tile (positions kept), not on the row in chunks; else, or where the sample predicts
  too many, the row takes the chunked passes. Exact either way. Up to ``SPREAD_ROWS_MAX`` rows
  (``spread_pass``) the cutoff and the pass run before the row kernel, in kernels of their own:
  ``_sample_kernel`` (a program a row) and ``_spread_pass_kernel`` (``SPREAD_CHUNK`` candidates a
  program; one atomic add a program reserves its kept candidates' slots, so they are kept in
  any order, which no step depends on: every tie-break carries the position).
* Cutoff prefix ``P`` (the top 12 bits of ``s``: sign, exponent, 3 mantissa bits) of the
  ``min(k, n_valid)``-th key: by bisection over a tile in registers (``cutoff_search``, twelve
  counts, eleven of them on pairs of prefixes packed in an int32), by two ``tl.histogram``
  passes of 6-bit digits over chunks.
* Compaction, once: one prefix sum sends the candidates above ``P`` to the winner list ``W``
  (a packed 63-bit key ``(s ^ INT_MIN) << 31 | (0x7fffffff - id)`` and the position; the raw
  score bits only for an ordering after the kernel) and the positions of those on ``P`` to the
  in-play list (random scores: a few hundred of 16384; every one of them when all are needed).
  The slots come from ``radix.scan_slots`` (sums down the columns of a ``[T / 512, 512]`` view, one scan of the
  column totals), so the lists are in column order, which no reader depends on.
* Finish (``select_finish.finish_row``, shared with the staged path): a radix select over the
  in-play list on the score key, then the id, then the position, appends the still-needed
  winners to ``W``. The 8192 and 16384 tiles refine a cutoff bin of more than ``refine_min``
  (1024 / 4096) on the tile instead (``refine_row``: the same three keys by bisection, one count over the
  tile a bit, in the 8192 tile two candidates a compare for the id and the position,
  ``smallest_cut``; such a bin is not put in play): a mass tie, such as a short context padded
  with ``-inf`` scores and valid ids.
* Ordering in the same program (``radix.order_row``): bucket rank of the winners (offsets,
  sizes and the members' keys from registers, ``tl.gather``; a crowded bucket map made again in
  parts by score sign above the tie at the lowest score, ``radix.part_counts``, then, where still
  crowded, a second level), so no ``torch.sort`` runs after
  the kernel; the output in order (coalesced stores), the score bits rebuilt from the keys (a
  NaN's payload read from the row at its position).

Compile time: ``Q`` is the grid and ``N``, ``k`` and the strides are runtime arguments that
Triton does not specialise, so one compiled kernel serves every shape of a tile class
(``launch_plan`` names them; ``precompile`` compiles those a server's capacities need). The
phases that take and return scalars only (``sample_cutoff``, ``sample_pass``, ``refine_row``,
``select_finish.finish_row`` / ``finish_in_play``, ``radix.order_row``) are noinline device
functions: Triton's Coalesce pass walks, for each load and store, the pointer's slice through
the whole function, so inlined phases cost (memory ops) x (kernel size). H200 host, Triton 3.6,
16384 tile: the TTGIR stage 1.4-1.7 -> 0.3-0.4 s, 0.94-1.01x the time, fewer spill stores (SASS)
(docs/benchmarks_select_kernel.md, "Phases as noinline device functions").

Workspace of the row path (``torch.empty``, no zeroing): ``W`` (16 bytes a winner slot), the
in-play list ``[Q, N]`` int32 (as large as the scores: the torch path's packed key is twice
that), the ordering's scratch (``radix.ORDER_SCRATCH`` x KB int32 a row) and, with a sampled
cutoff, its kept list (``SAMPLE_CAP`` int32 a row, after ``SPREAD_HEAD`` int32 of the cutoff and
the counts where the pass is spread; the sampled cutoff's kernel zeroes the counts); every part
on a 16-byte boundary (``radix.winner_workspace``; a kept list's row of 8200 int32), since
Triton specialises pointers on alignment.

Limits: ``N <= MAX_CANDIDATES`` (131072) candidates a row and ``k <= MAX_K`` (2048)
(``supports(n, k)``); beyond, ``ordering.ordered_select`` uses the torch path.

This module imports without Triton or CUDA; ``available()`` says whether the
kernel can run here.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time
from typing import Iterable

import torch

from . import select_block, select_staged
from .select_compile import collecting, compile_in_parallel, launch

__all__ = ["available", "supports", "choose_path", "block_chunk", "block_keep", "block_options", "row_config", "sample_config", "launch_plan", "precompile", "triton_ordered_select",
           "MAX_CANDIDATES", "MAX_K", "PAD_SCORE"]

log = logging.getLogger("tpflare.select_kernel")

MAX_CANDIDATES = 131072
MAX_K = 2048
PAD_SCORE = float("-inf")
RESIDENT_MAX = 16384  # rows up to this many candidates keep their score keys in registers
STAGED_MAX_ROWS = 4  # choose_path: the staged path up to this many rows,
STAGED_LONG_ROWS = (8, 24576)  # and up to 8 rows of SPREAD_MIN + 1 .. 24576 candidates
# the register tiles refine a cutoff bin of more candidates than this on the tile (refine_min): the
# 8192 tile from the finish's first register tier, the 16384 tile from its second
REFINE_FROM = {8192: 1024, 16384: 4096}
# register tiles whose finish keeps its chunks compiled although their refinement leaves it none
# to read (finish_max: the kernel's body as ptxas allocated it before)
FINISH_CHUNKS_KEPT = (16384,)
FEW_ROWS_MAX = 128  # row_config: up to this many rows (each its own SM on an H200) the 4096 tile takes 16 warps,
# and beyond, the 4096 and 8192 tiles take 8 warps capped at 128 registers a thread (two programs an SM)
MANY_ROWS = (8, 128)  # (num_warps, maxnreg)
SAMPLE = 2048  # sample_config: rows re-read in chunks beyond RESIDENT_MAX sample this many candidates for a cutoff,
SAMPLE_CAP = 8192  # and keep at most this many at or above it (a register tile); else the histogram passes
SAMPLE_BITS = 16  # the sampled cutoff's bits found by bisection (from the highest bit in which the samples differ)
# spread_pass: up to SPREAD_ROWS_MAX rows, the sampled cutoff in a kernel of its own (one program a
# row), then its pass over the row spread over programs of SPREAD_CHUNK candidates (SPREAD_WARPS
# warps), before the row kernel
SPREAD_ROWS_MAX = 64
SPREAD_CHUNK = 4096
SPREAD_WARPS = 4
SPREAD_HEAD = 8  # int32 a row of the kept list's buffer before the positions: T, V, over, -, the counts (int64)
FIN_CHUNK = 2048  # the row kernel's finish reads an in-play list beyond its registers in chunks of this many
ORDER_BUCKETS = 2  # the row kernel's ordering (radix.order_row) spreads its KB winners over this many KB buckets
# a launch plan's first call (outside capture) and precompile compile their kernels at once
# (select_compile.compile_in_parallel); False: one after another as they launch
PARALLEL_COMPILE = True
BLOCK_PATH = True  # choose_path takes the block path (select_block) where it runs and holds the row
BLOCK_LONG = (8, 2)  # block_keep: rows beyond a block in chunks and their merge up to 8 rows, or in at most 2 chunks,
BLOCK_LONG_WAVES = 1  # or where the rows' chunks make at most this many blocks an SM (session 31); else the sampled keep
BLOCK_SHORT_CHUNK = 8192  # block_chunk: chunks this short where the row's chunks make at most
BLOCK_SHORT_WAVES = 2  # this many blocks an SM (more blocks in flight at few rows)
_WARMED: set = set()  # (device, launch plan, options) whose kernels a first call warmed

try:  # Triton is optional: the module must import on CPU-only machines.
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    _HAVE_TRITON = False


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    if not _HAVE_TRITON:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover
        return False


def supports(n: int, k: int) -> bool:
    """True when a row of ``n`` candidates and ``k`` outputs is within the kernel's limits."""
    return 0 <= n <= MAX_CANDIDATES and 1 <= k <= MAX_K


def choose_path(q: int, n: int, k: int, n_sm: int) -> str:
    """The staged path (a row over many programs), the block path (``select_block``: one CUDA
    thread block a row, or a block a chunk of a longer row and one merging them) or the
    one-program-a-row Triton kernel.

    The block path takes every row of up to 131072 candidates beyond ``STAGED_MAX_ROWS`` rows
    where it runs (``select_block.available()``: torch's NVRTC entry point; ``BLOCK_PATH``): rows
    of up to 16384 candidates one block a row; longer rows in chunks and their merge
    (``select_block.chunking``, ``block_chunk``), or through the sampled keep (``block_keep``:
    from 64 rows, or beyond one wave of chunks). Until session 32 the row kernel took rows beyond
    a block at 9-63 rows beyond one wave of chunks; ``block_keep`` gives the times that moved them.
    The wave rule (session 31): at 5-8 rows of 65536 and 131072 (32-64 blocks, one wave) the
    chunks and merge took 0.62-1.00x the row kernel's time, at 64 rows of 65536 (256 blocks, two
    waves on an H200) 0.85-1.10x, at 64 rows of 131072 (four waves) 1.12-1.67x (H200, session 23,
    records select_kernel_h200_s23_block_long.json and _block_long_variants.json); a block's time
    does not grow with the rows while they fit one wave (session 24: the same cycles a block at 64
    rows as at 1024).
    H200, graph replay, k = 2048 (docs/benchmarks_select_kernel.md, sessions 22 and 23): 8-4096
    rows of 4096, 8192 and 16384 candidates took 0.49-0.88x the Triton row kernel's time (64 x
    16384: 24.2 against 30.1 µs; 1024 x 16384: 189-194 against 244); one row 0.70-1.73x the
    staged path's (it runs on one SM; faster on a short context only), so up to
    ``STAGED_MAX_ROWS`` the staged path stays. Longer rows (session 23, ``--grid block_long``,
    record select_kernel_h200_s23_block_long.json), the block path's time over the row kernel's:
    at 5-8 rows of 20000-131072, 0.77-0.86x with random scores, 0.49-0.84x with mass ties (a
    quarter of the row tied at the cutoff) and 0.59-1.0x on a short context (30.9-55.5 µs
    against 39.0-88.9); at 64-1024 rows of 20000-32768 (two chunks) 0.89-0.99x random,
    0.71-0.81x short, 0.63-1.04x ties; at 64 rows and more of 65536 and 131072 0.86-2.0x (the row
    kernel's sampled cutoff reads the row once), so the row kernel kept those until session 30: from
    ``select_block.SAMPLED_MIN_ROWS`` (64) rows the block path's sampled keep takes every row of up
    to 131072 (H200, k = 2048, ``bench/block_variants_gpu.sh``, record
    select_kernel_h200_s30_sampled.json: at 64-1024 rows of 65536 and 131072 its time over the row
    kernel's was 0.97-1.02x random, 0.69-0.78x mass ties, 0.74-1.12x short; at 1024 rows of 20000-32768
    0.67-0.78x ties, 1.01-1.02x random). At 4 rows of
    20000-131072 the block path took 0.68-1.28x the staged path's time (faster on mass ties,
    slower on random scores at 20000-32768 and on a short context at 131072), at one row
    0.90-2.4x; the staged path keeps 1-4 rows.
    Elsewhere, or where the block path does not run, the Triton kernels as below.

    From the H200 runs in docs/benchmarks_select_kernel.md (CUDA-graph replay, which is how
    serving runs the selection): the staged path is faster up to 4 rows; beyond, its global
    histogram (atomics on a few hot bins) costs more. Where the block path does not run, rows of
    more than SPREAD_MIN (16384) up to 24576 candidates take it up to 8 rows (``STAGED_LONG_ROWS``): since the narrowing walk
    runs over the row's programs (session 9), at 8 rows of 32768 and 65536 it took 43.0 / 64.7
    µs with random scores against the row kernel's 47.0 / 61.1, and 50.4-63.4 against 66.4-87.8
    µs on mass ties (a quarter of the row tied at the cutoff; a short context padded with -inf
    and valid ids), where the row kernel was 0.78-0.94x fp32 topk (``--grid long``, record
    select_kernel_h200_s9_long_9abd78b.json; the boundary at Q = 5-9 and 12: ``--grid edge``,
    session 10 of docs/benchmarks_select_kernel.md). Since the row kernel's sampled pass is
    spread over the row's programs (``spread_pass``, session 18), 5 and 8 rows of 32768 and
    65536 take the row kernel: 40.6-44.5 against 43.2-67.3 µs (random), 58.8-63.1 against
    59.8-67.0 (short), 57.0-68.1 against 48.9-58.6 (ties, where fp32 topk took 61.7-68.2);
    up to 24576 staged stays (ties 46.8-48.9 against 69.0-85.8; random 38.0-40.9 against
    38.9-40.3), from 28000 the row kernel (random 40.6-40.9 against 40.5-42.1, short 62.1-62.5
    against 64.9-66.1, ties 56.0-56.9 against 48.1-49.3, fp32 topk 62.4-64.5) (``--grid spread``,
    ``--grid edge_n --variants --only row,staged``). The
    choice does not depend on whether a stream is capturing, so the first call outside capture
    compiles what capture will launch.
    """
    if q <= STAGED_MAX_ROWS:
        return "staged"
    if BLOCK_PATH and select_block.supports(n, k) and select_block.available():
        return "block"
    rows, n_max = STAGED_LONG_ROWS
    return "staged" if q <= rows and select_staged.SPREAD_MIN < n <= n_max else "row"  # (k: unused)


def block_keep(q: int, n: int, k: int, n_sm: int) -> bool:
    """Whether the block path runs rows beyond a block (``select_block.TILE_N``) through the sampled
    keep (``select_block``'s sample, keep, gated chunks and merge) rather than their chunks and
    merge: from ``select_block.SAMPLED_MIN_ROWS`` (64) rows a call (``select_block.sampled``), and
    beyond ``BLOCK_LONG`` (8 rows; 2 chunks) where the rows' chunks (the fewest) make more than
    ``BLOCK_LONG_WAVES`` (1) block an SM (``n_sm``).
    H100, graph replay, k = 2048 (session 32, ``--grid long_mid --variants --only row,block,block_sampled``,
    record select_kernel_h100_s32_long_mid.json; docs/benchmarks_select_kernel.md): within one wave
    (12-16 rows of 131072, 12-33 of 49152-65536) the chunks took 0.77-0.94x the row kernel's time on
    random scores, 0.63-0.95x on a short context, 0.61-1.03x on mass ties, and 0.73-0.94x the sampled
    keep's on random scores (1.0-1.26x on mass ties); beyond it (24-63 rows of 131072, 48-63 of
    49152-65536), where the row kernel ran until then, the sampled keep took 0.95-1.07x the row
    kernel's time on random scores, 0.62-0.83x on mass ties, 0.75-0.81x on a short context up to
    65536 and 1.05-1.20x at 131072 (0.46-0.69x fp32 topk's everywhere), the chunks 0.84-1.40x."""
    if n <= select_block.TILE_N:
        return False
    if select_block.sampled(q):
        return True
    rows, chunks = BLOCK_LONG
    n_chunks = select_block.chunking(n, k)[0]
    return q > rows and n_chunks > chunks and q * n_chunks > BLOCK_LONG_WAVES * n_sm


def block_options(q: int, n: int, k: int, n_sm: int) -> dict:
    """``select_block.block_select``'s options for a call the dispatcher sends to the block path
    (``chunk``: ``block_chunk``; ``keep``: ``block_keep``; ``n_sm``), which its plan
    (``launch_plan``), precompile and the call itself share."""
    return dict(chunk=block_chunk(q, n, k, n_sm), keep=block_keep(q, n, k, n_sm), n_sm=n_sm)


def block_chunk(q: int, n: int, k: int, n_sm: int) -> int | None:
    """The block path's chunk for rows beyond a block (``select_block.chunking``): None (the
    fewest chunks, 16384 at most), or ``BLOCK_SHORT_CHUNK`` where the row's chunks of that size
    make at most ``BLOCK_SHORT_WAVES`` blocks an SM and their merge holds their best. H200, graph
    replay, k = 2048 (session 23's first run, ``--grid block_long --variants``, before the kernel's
    last changes; record select_kernel_h200_s23_block_long_variants.json): chunks of 8192 at 5-64
    rows of 20000-65536 took 0.71-0.94x the time of the fewest chunks; at 256 and 1024 rows,
    0.99-1.26x. None where the sampled keep serves the rows (``select_block.sampled``: from
    ``SAMPLED_MIN_ROWS`` rows, or beyond one wave of chunks: ``block_keep``; its chunks serve only
    rows it may miss a winner in), as timed."""
    if n <= select_block.TILE_N or block_keep(q, n, k, n_sm):
        return None
    chunks = -(-n // BLOCK_SHORT_CHUNK)
    if q * chunks <= BLOCK_SHORT_WAVES * n_sm and chunks * min(k, BLOCK_SHORT_CHUNK) <= select_block.TILE_N:
        return BLOCK_SHORT_CHUNK
    return None


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    if _interpret() or not torch.cuda.is_available():
        return 132
    return select_block.sm_count(index)


def _check_tile(name: str, v) -> None:
    # a chunk, sample or tile of the row kernel: a power of two of 16..16384 (the compaction's
    # scan counts two fields of 16 bits)
    if int(v) < 16 or int(v) > 16384 or int(v) & (int(v) - 1):
        raise ValueError(f"{name} must be a power of two in 16..16384, got {v}")


def zero_first(block: int, resident: bool) -> bool:
    """Whether the row kernel zeroes its ordering's bucket sizes after the compaction (``ZF``):
    the 16384 register tile. H200, graph replay, 64-4096 rows (two rounds, alternating;
    docs/benchmarks_select_kernel.md, session 13): 0.990-0.995x the time at N = 12000 and 16384
    with random scores (64 x 16384: 30.11 and 29.97 against 30.30 and 30.25 µs), 1.00-1.008x with
    a short context (the kernel spills 196 against 156 bytes a thread, most of it in refine_row:
    tools/compile_select_kernels.py --sass "registers 16384" on Triton 3.6); the 8192 tile 1.00-1.01x
    (random), so it keeps the ordering's own zeroing, as do rows read in chunks (not measured)."""
    return resident and block > 8192


def parts_first(block: int, resident: bool) -> bool:
    """Whether the row kernel's ordering maps its winners in parts at once (radix.part_counts,
    not one map first) after the kernel refined its cutoff bin (``PARTS``; a runtime flag says
    whether it refined: a mass tie, whose winners crowd one map): the 8192 register tile. H200,
    graph replay, 64-4096 rows, two rounds alternating (docs/benchmarks_select_kernel.md,
    session 16), against one map first: a short context at N = 8192 0.945-0.949x the time, ties
    0.98-0.995x, random scores 0.993-0.996x; compiled into the 16384 tile too, short took
    0.94-0.96x there but random scores 1.022-1.031x at N = 12000 and 16384 (64 x 16384: 31.3
    against 30.4 µs), so that tile maps once first. (Up to session 15 the 8192 tile sent the
    first level's atomic adds by groups of 32 W slots after a refinement instead; the parts
    leave no crowded bucket to group. The 4096 tile never refines; rows read in chunks neither.)"""
    return resident and 4096 < block <= 8192


def register_tile(n: int) -> int:
    """The register tile of a row of ``n <= RESIDENT_MAX`` candidates: 4096, 8192 or 16384 keys."""
    return 4096 if n <= 4096 else 8192 if n <= 8192 else RESIDENT_MAX


def refine_min(block: int, fr2: int) -> int:
    """The default ``refine`` of a register tile of ``block`` keys whose finish holds ``fr2``
    in-play candidates in registers: the tile refines a cutoff bin of more candidates than this
    on itself (``REFINE_FROM``), and the finish takes the smaller bins. H200, graph replay, 64-4096
    rows, two rounds (docs/benchmarks_select_kernel.md, session 17): the 16384 tile refining bins
    beyond 4096 instead of 8192 took 0.81-0.92x the time with a tie group of a quarter of the
    row at N = 16384 (bins about 4096, half of them beyond), from 1024 or 2048 1.20-1.33x where
    the bins hold 1500-3000 (the refinement counts the whole tile a step, the finish the bin); the
    8192 tile refining beyond 1024 instead of 4096 took 0.89-0.997x with bins of about 1024 and
    2048, from 2048 1.00-1.03x. Where no table entry fits (a tile of at most ``fr2``): every bin
    beyond the finish's registers, which is none."""
    return REFINE_FROM.get(block, min(fr2, block))


def finish_max(block: int, resident: bool, refine: int, fr2: int) -> int:
    """The finish's ``MMAX`` in the row kernel (constexpr ``FMAX``, given the kernel's ``REFINE``):
    the most candidates a cutoff bin that reaches the finish holds, 0 for any; its chunks are
    compiled unless that fits its registers (``fr2``). A tile that refines the bins beyond
    ``refine <= fr2`` leaves the finish nothing beyond its registers; but the 16384 tile
    compiles the chunks all the same: without them ptxas allocates the kernel's body otherwise,
    and random rows, which never reach that code, took 1.02-1.03x the time (session 15, H200);
    with them the kernel is the SASS of the 8192 threshold but for that threshold's immediate
    (``python tools/compile_select_kernels.py --sass``, Triton 3.6)."""
    if not resident:
        return 0
    if block <= fr2 or refine >= block:  # no refinement compiled: the finish sees the whole bin
        return block
    return fr2 if refine <= fr2 and block not in FINISH_CHUNKS_KEPT else 0


def row_config(n: int, q: int, num_warps=None, chunk=None, resident=None, maxnreg=None):
    """(block, num_warps, chunk, resident, maxnreg) of the row kernel for ``q`` rows of ``n``
    candidates (``maxnreg``: Triton's cap on a thread's registers, None: ptxas's choice; warps
    given by the caller take no cap unless ``maxnreg`` is given too).

    Register tiles of 4096, 8192 or 16384 keys (``register_tile``; so a new ``N`` reuses a
    compiled kernel) up to ``RESIDENT_MAX``; beyond, chunks re-read from memory (4096 with 16
    warps). A chunk is a power of two of at most 16384 candidates (the compaction counts two
    fields of 16 bits in one scan). The register tiles take 16 warps (a row's latency spread over
    more threads) up to ``FEW_ROWS_MAX`` rows; beyond, the 4096 and 8192 tiles take 8 warps
    capped at 128 registers a thread (``MANY_ROWS``), so that two programs share an SM (16 warps
    take the whole register file at 128 registers, one program an SM), and the 16384 tile keeps
    16. H200, k = 2048, graph replay, two rounds (``--grid occupancy8k --variants``, session 17 of
    docs/benchmarks_select_kernel.md): from 256 rows the capped 8 warps took 0.77-0.85x the time
    of 16 at N = 6000 and 8192 on every pattern, 0.94-0.99x (random), 0.62-0.91x (a short
    context) and 0.73-0.98x (ties) that of 4 uncapped at N = 2500 and 4096; at 64 rows, an SM a
    row, 1.04-1.12x that of 16. (Until then the 4096 tile took 4 warps beyond ``FEW_ROWS_MAX``.)

    H200, k = 2048, graph replay (bench_select_kernel.py --variants --grid tile8k, record
    select_kernel_h200_tile8k.json): at N = 6000 and 8192, 8 to 4096 rows, the 8192 tile took
    0.86-0.92x the time of chunks of 4096 (the default before) with random scores, 0.63-0.78x
    with a short context padded with -inf (its cutoff bin refined on the tile), 0.91-0.95x with
    a quarter of the row tied; with 8 warps 1.01-1.19x its time with 16. (Before, the 16384
    tile had taken 1.02-1.06x the chunks' time there: records select_kernel_h200_tiles_*5e5e4c2*.)
    At N = 2500 and 4096 16 warps took
    0.79-0.94x the time of 4 up to 128 rows, 0.99-1.11x from 256. Rows beyond 32768 took 32
    warps and chunks of 8192 up to 01c5110 (0.85-0.97x the 16 warps' time with three passes over
    the row, d38c0dd's record); with the sampled cutoff (``sample_config``) 16 warps take
    0.46-0.53x the time of 32 (random scores, N = 65536 and 131072, Q = 16-1024; record
    select_kernel_h200_sampled_grid_83ddd4e.json), where 32 warps' 64 registers a thread spill.
    """
    if resident is None:
        resident = n <= RESIDENT_MAX
    if resident and n > RESIDENT_MAX:
        raise ValueError(f"resident=True holds at most {RESIDENT_MAX} candidates a row in registers, got N={n}")
    if chunk is not None:
        _check_tile("chunk", chunk)
    block = register_tile(n) if resident else max(16, select_staged.next_pow2(n))
    if num_warps is None:
        num_warps = 16
        if resident and block <= 8192 and q > FEW_ROWS_MAX:
            num_warps = MANY_ROWS[0]
            maxnreg = MANY_ROWS[1] if maxnreg is None else maxnreg
    if chunk is None:
        chunk = 256 * num_warps
    chunk = min(block, int(chunk))
    if not resident:
        block = chunk  # the tile a pass holds: one chunk
    if maxnreg is not None and not 16 <= int(maxnreg) <= 255:
        raise ValueError(f"maxnreg must be in 16..255, got {maxnreg}")
    return int(block), int(num_warps), chunk, bool(resident), None if maxnreg is None else int(maxnreg)


def spread_pass(q: int, sampled: bool) -> bool:
    """Whether a call of ``q`` rows with a sampled cutoff (``sample_config``) runs the cutoff and
    its pass over the row before the row kernel, the pass spread over the row's programs
    (``_sample_kernel``, ``_spread_pass_kernel``), rather than both in the row kernel's program:
    up to ``SPREAD_ROWS_MAX`` rows, where the row kernel's one program a row leaves half the SMs
    of an H200 idle or more. H200, k = 2048, graph replay (``--grid spread`` and ``--grid
    spread_edge`` with ``--variants``, session 18 of docs/benchmarks_select_kernel.md): at 5-16
    rows of 65536-131072 the one-program pass took 1.28-1.79x the time of the spread one (8 rows
    of 131072, random: 87.4 against 52.3 µs), at 20000-32768 1.03-1.17x, at 64 rows 0.99-1.20x;
    at 96-128 rows, one wave of the row kernel's programs, 0.90-1.06x; at 256 and 1024 rows,
    where those programs overlap one row's reads with another's work, 0.90-0.97x on random
    scores (0.94-1.11x on mass ties). (At 160-192 rows, a second wave of few programs, it took
    0.99-1.16x: not taken, a rule by waves measured in one round.)"""
    return sampled and q <= SPREAD_ROWS_MAX


def sample_config(n: int, resident: bool, sample=None, cap=None) -> tuple[int, int]:
    """(candidates sampled a row, tile kept) of the row kernel's sampled cutoff; (0, 0): none.

    Rows re-read in chunks beyond ``RESIDENT_MAX`` (by default) first read ``SAMPLE`` evenly
    spaced candidates and take a score key ``T`` that enough of them reach that, very likely, at
    least ``min(k, valid)`` of the row's candidates do (about ``k + 4 sd + 8 N / SAMPLE``; see
    ``sample_cutoff``); one pass keeps the positions of those at or above ``T``, and when they
    number at most ``SAMPLE_CAP`` and at least ``min(k, valid)`` the selection runs on them as a
    register tile: one pass over the row instead of three (two histogram passes and the
    compaction). Otherwise (an unlucky or adversarial sample) the row takes the histogram passes
    after that pass; where the sample itself predicts more than 3/4 of ``SAMPLE_CAP`` (a mass tie
    at the cutoff) it takes them without the pass. The ids are exact either way: the sample only
    decides how fast."""
    if sample:  # (0: none)
        _check_tile("sample", sample)
    if cap is not None:
        _check_tile("sample_cap", cap)
    if resident:
        if sample:
            raise ValueError("sample needs a row re-read in chunks (resident=False)")
        return 0, 0
    sample = (SAMPLE if n > RESIDENT_MAX else 0) if sample is None else int(sample)
    return (sample, SAMPLE_CAP if cap is None else int(cap)) if sample else (0, 0)


if _HAVE_TRITON:
    from .radix import (ORDER_SCRATCH, SPLIT, bit_length, generic_jit, load_chunk, order_row, order_winners, pick_digit,
                        put_keys, put_winners, scan_slots, score_key, shared_bits, top_digit, winner_workspace)
    from .select_finish import finish_row

    # refine_row cuts a tie at the cutoff score by id (and duplicates by position) with
    # smallest_cut, two values a compare, in register tiles up to this size, and with bisect_cut
    # beyond. H200, graph replay, 64-4096 rows, N = 8192 (docs/benchmarks_select_kernel.md,
    # session 15): a short context 0.968-0.972x the time, random scores 0.996-0.998x, ties
    # 1.002-1.006x; in the 16384 tile short took 0.965-0.974x but random 1.017-1.039x (the
    # kernel's body allocated otherwise; 64 x 16384: 31.0 against 29.8 µs), so that tile keeps
    # bisect_cut (the same SASS as before, Triton 3.6). refine_row chooses at its two cuts
    # inline: a helper that chose changed the 16384 tile's SASS (python
    # tools/compile_select_kernels.py --sass prints a digest of it).
    PACKED_CUT_MAX = tl.constexpr(8192)
    HEAD = tl.constexpr(SPREAD_HEAD)

    @triton.jit
    def top12_valid(s):
        # the top 12 bits of a valid candidate's score key (sign, exponent, 3 mantissa bits), -1 for an invalid one
        return tl.where(s != -2147483648, top_digit(s, 12), -1)

    @triton.jit
    def digit_hist(u, d1, PASS: tl.constexpr):
        # histogram of the first (PASS 0: bits 11..6 of u) or second (PASS 1: bits 5..0, among
        # the candidates whose first digit is d1) 6-bit digit of the top-12 bits u (-1: invalid)
        if PASS == 0:
            return tl.histogram(u >> 6, 64, mask=u >= 0)
        return tl.histogram(u & 63, 64, mask=(u >> 6) == d1)

    @triton.jit
    def cutoff_search(s, K):
        # what the two histogram passes find, for a tile held in registers, by bisection over
        # the top 12 bits u of the score keys s (-2**31: invalid): nsel = min(valid, K), the
        # largest 12-bit prefix P with count(u >= P) >= nsel, how many are above it (up: the
        # count at the end of P's range) and how many on it. Twelve counts, one sum each (a
        # tile holds < 2**16). The first (the valid, u >= 2048) compares s; the other eleven
        # compare two candidates at once: the u of candidates c and c + T / 2 (one thread holds
        # both: a [2, T / 2] view, no layout conversion) in the 16-bit halves of an int32 x,
        # each with a guard bit above it (bit 12), so x - (c | c << 16) leaves each half's bit
        # 12 set where its u >= c (no borrow crosses the halves: 2**12 + u - c >= 1). The phase
        # is issue-bound on these compares, not on the sums' barrier rounds: 66 SASS
        # instructions a step against 113 comparing s (16384 tile, 16 warps, bench/cutoff_sass.py);
        # H200, 1024 rows of 16384 (bench/bench_row_phases.py, variant halving): 0.069 against
        # 0.088 ms to the end of the search, the kernel 0.928-0.94x at N = 16384 (session 7 of
        # 2026-12-02, docs/benchmarks_select_kernel.md).
        T: tl.constexpr = s.shape[0]
        c = tl.sum((s != -2147483648).to(tl.int32) + ((s >= 0).to(tl.int32) << 16), 0)  # valid; u >= 2048
        nsel = tl.minimum(c & 0xFFFF, K)
        hit = (c >> 16) >= nsel
        P = tl.where(hit, 2048, 0)
        ge = tl.where(hit, c >> 16, c & 0xFFFF)  # count(u >= P)
        up = tl.where(hit, 0, c >> 16)  # count(u >= the end of P's range)
        # (an invalid s has u 0, below every c >= 1 of the steps)
        ua, ub = tl.split(tl.permute(tl.reshape(top_digit(s, 12), [2, T // 2]), (1, 0)))
        x = ua | (ub << 16) | 0x10001000
        for t in range(1, 12):
            cand = P | (1 << (11 - t))
            n = tl.sum(((x - (cand | (cand << 16))) >> 12) & 0x10001, 0)
            n = (n & 0xFFFF) + (n >> 16)
            hit = n >= nsel
            P = tl.where(hit, cand, P)
            ge = tl.where(hit, n, ge)
            up = tl.where(hit, up, n)
        return nsel, P, up, ge - up

    @triton.jit
    def chunk_hist(sc_row, id_row, N, d1, CHUNK: tl.constexpr, PASS: tl.constexpr):
        h = tl.zeros([64], dtype=tl.int32)
        b, i = load_chunk(sc_row, id_row, 0, N, CHUNK)
        for c0 in range(0, N, CHUNK):
            u = top12_valid(score_key(b, i))
            b, i = load_chunk(sc_row, id_row, c0 + CHUNK, N, CHUNK)  # the next chunk's reads, in flight meanwhile
            h += digit_hist(u, d1, PASS)
        return h

    @triton.jit
    def compact_tile(s, b, i, o, P, all_in, keep, wk_row, wv_row, wo_row, p_row, wbase, pbase, T: tl.constexpr,
                     WV: tl.constexpr):
        # candidates above the 12-bit cutoff prefix P to W, those on it to P (in play), or to
        # W too when all of them are needed (all_in), or nowhere (keep 0: the row kernel refines
        # the bin on its tile, refine_row); one scan for both counts (a tile holds < 2**16),
        # slots in the scan's column order (radix.scan_slots). WV: W gets the score bits too
        # (an ordering after the kernel reads them; the kernel's own takes them from the keys,
        # radix.score_bits: one scattered store less a winner, H200 1024 rows of 16384
        # 0.165 against 0.183 ms to the end of the finish, bench/bench_row_phases.py)
        u = top_digit(s, 12)
        valid = s != -2147483648
        on = valid & (u == P)
        whole = (u * 0 + all_in) != 0  # all_in as a tensor (a scalar bool in a mask trips the interpreter)
        win = valid & ((u > P) | (on & whole))
        play = on & (whole == 0) & ((u * 0 + keep) != 0)
        incl, tot = scan_slots(win.to(tl.int32) + (play.to(tl.int32) << 16), T)
        slot = wbase + (incl & 0xFFFF) - 1
        v = 2147483647 - tl.maximum(i, 0)
        if WV:
            put_winners(wk_row, wv_row, wo_row, slot, win, s, v, b, o)
        else:
            put_keys(wk_row, wo_row, slot, win, s, v, o)
        tl.store(p_row + pbase + (incl >> 16) - 1, o, mask=play)
        return wbase + (tot & 0xFFFF), pbase + (tot >> 16)

    @triton.jit
    def bisect_cut(x, lo, hi, base, need, MODE: tl.constexpr):
        # the need-th largest key of a phase (need >= 1, at most the candidates in it) whose
        # smallest and largest keys are lo and hi: bit by bit from the highest bit in which lo
        # and hi differ (the bits above are shared), each step one count over the tile x.
        # MODE 0: x = the score keys, the phase a cutoff bin (base: the candidates above it, so
        # count(x >= c) - base counts the bin's at or above c: no mask tile is held). MODE 1:
        # x = the ids of the phase's candidates, a negative for the others; the key is the inverted
        # id 0x7fffffff - id (so the count is of ids <= 0x7fffffff - c). Returns the key.
        top, t = shared_bits(lo, hi)
        for j in range(0, top):
            cand = t | (tl.full((), 1, tl.int64) << (top - 1 - j))
            c = (cand - 2147483648).to(tl.int32)
            if MODE == 0:
                n = tl.sum((x >= c).to(tl.int32), 0) - base
            else:  # (as uint32 the others' negatives are above every id: one compare an element)
                n = tl.sum((x.to(tl.uint32, bitcast=True) <= (2147483647 - c).to(tl.uint32, bitcast=True)).to(tl.int32),
                           0)
            t = tl.where(n >= need, cand, t)
        return (t - 2147483648).to(tl.int32)

    @triton.jit
    def smallest_cut(x, need):
        # the need-th smallest of the x >= 0 (the ids or positions of a phase's candidates; -1 for
        # the others; 1 <= need <= their count), as bisect_cut MODE 1 finds it, in fewer
        # compares: with d = x - min over the phase, the largest t with count(d < t) < need, bit
        # by bit from the highest bit of the range. The steps above the lowest 14 bits count d
        # directly; the last 14 (all of them for ids or positions spanning < 2**14) count two
        # candidates a compare, as cutoff_search does: e = d - base (base: t's bits above the
        # 14; 0x3FFF for d outside the window, never counted) of candidates c and c + T / 2 in
        # the 16-bit halves of an int32, so (0x3FFF + c) - e has bit 14 set where e < c; the
        # candidates below the window are counted once (below).
        T: tl.constexpr = x.shape[0]
        xmin = tl.min(tl.where(x >= 0, x, 2147483647), 0)
        d = tl.where(x >= 0, x - xmin, 2147483647)
        nb = bit_length(tl.max(x, 0) - xmin).to(tl.int32)  # (one too many at worst: a step that keeps t)
        t = xmin * 0
        below = t  # count(d < t)
        for j in range(0, nb - 14):
            cand = t | (1 << (nb - 1 - j))
            n = tl.sum((d < cand).to(tl.int32), 0)
            t = tl.where(n < need, cand, t)
            below = tl.where(n < need, n, below)
        base = t
        e = tl.where((d >= base) & (d - base < 16383), d - base, 16383)
        ea, eb = tl.split(tl.permute(tl.reshape(e, [2, T // 2]), (1, 0)))
        xe = ea | (eb << 16)
        lb = tl.minimum(nb, 14)
        for j in range(0, lb):
            cand = t | (1 << (lb - 1 - j))
            v = 16383 + (cand - base)
            n = tl.sum(((v | (v << 16)) - xe) >> 14 & 0x10001, 0)
            n = (n & 0xFFFF) + (n >> 16) + below
            t = tl.where(n < need, cand, t)
        return xmin + t

    @triton.jit
    def inverted_range(x):
        # the smallest and largest inverted key 0x7fffffff - x of the x >= 0 (ids, positions)
        return 2147483647 - tl.max(x, 0), 2147483647 - tl.min(tl.where(x >= 0, x, 2147483647), 0)

    @triton.jit(noinline=True)  # (noinline: the module docstring's Compile time)
    def sample_cutoff(sc_row, id_row, N, K, CAP, S: tl.constexpr, SB: tl.constexpr):
        # a cutoff (score key T, id V) such that, very likely, at least min(K, valid) of the
        # row's candidates come first in the order down to (T, V) (score key > T, or = T with
        # id <= V), and not many more: S evenly spaced candidates are read, and r of them (K S / N
        # expected before the row's K-th, plus 4 standard deviations and 8) must reach it. First
        # T <= the r-th largest sampled score key (its SB highest bits from the highest bit in
        # which the sampled keys differ, by bisection; the bits below clear), V = INT_MAX. When
        # the samples at or above T predict more than 3/4 of the tile (a mass tie at the cutoff
        # score: a padded short context, quantised scores), T is the r-th largest sampled score
        # key exactly and V the id that the samples tied at T need (both by bisection), so that a
        # tie is cut by id as the order cuts it. Fewer than r valid samples: T the lowest valid
        # key (every valid candidate). Returns T, V and whether the samples reaching them still
        # predict more than 3/4 of the tile (duplicate ids at the cutoff). Any cutoff gives
        # exact ids; the caller checks the count.
        o = (tl.arange(0, S) * N) // S  # (< 2**31: S <= 16384, N <= MAX_CANDIDATES)
        b = tl.load(sc_row + o, mask=o < N, other=0.0).to(tl.int32, bitcast=True)
        i = tl.load(id_row + o, mask=o < N, other=-1)
        s = score_key(b, i)
        valid = s != -2147483648
        nv = tl.sum(valid.to(tl.int32), 0)
        rf = (tl.full((), 0.0, tl.float32) + K) * S / (tl.full((), 0.0, tl.float32) + N)
        r = (rf + 4.0 * tl.sqrt(rf) + 8.0).to(tl.int32) + 1
        lo = tl.min(tl.where(valid, s, 2147483647), 0)
        hi = tl.max(s, 0)
        top, t = shared_bits(lo, hi)
        for j in range(0, SB):
            bit = top - 1 - j
            cand = t | (tl.full((), 1, tl.int64) << tl.maximum(bit, 0))
            n = tl.sum((s >= (cand - 2147483648).to(tl.int32)).to(tl.int32), 0)
            t = tl.where((bit >= 0) & (n >= r), cand, t)
        T = tl.where(nv >= r, (t - 2147483648).to(tl.int32), -2147483647)
        V = tl.full((), 2147483647, tl.int32)
        over = 4 * tl.sum((s >= T).to(tl.int32), 0).to(tl.int64) * N > 3 * CAP * S
        if over & (nv >= r):  # a mass tie: the cutoff by score key exactly, then by id
            T = bisect_cut(s, lo, hi, 0, r, 0)
            x = tl.where(s == T, i, -1)
            need = r - tl.sum((s > T).to(tl.int32), 0)  # (>= 1: T is the r-th largest)
            vlo, vhi = inverted_range(x)
            V = 2147483647 - bisect_cut(x, vlo, vhi, 0, need, 1)
            kept = tl.sum(((s > T) | ((s == T) & (i <= V))).to(tl.int32), 0)
            over = 4 * kept.to(tl.int64) * N > 3 * CAP * S
        return T, V, over

    @triton.jit
    def kept_at(s, i, T, V):
        # the candidates (score keys s, ids i) that come first in the order down to the sampled
        # cutoff (T, V): score key > T, or = T with id <= V
        return (s > T) | ((s == T) & (i <= V))

    @triton.jit(noinline=True)  # (noinline: the module docstring's Compile time)
    def sample_pass(sc_row, id_row, sb_row, N, T, V, CHUNK: tl.constexpr, CAP: tl.constexpr):
        # the positions of the row's candidates that come first in the order down to (T, V)
        # (score key > T, or = T with id <= V; T > the invalid key) to sb_row, the first CAP of
        # them: one pass over the chunks, each chunk's reads issued before the previous chunk
        # is scanned. Returns how many were found (> CAP: not all kept) and how many valid
        # candidates the row holds
        cnt = T * 0
        nv = T * 0
        b, i = load_chunk(sc_row, id_row, 0, N, CHUNK)
        for c0 in range(0, N, CHUNK):
            s = score_key(b, i)
            sel = kept_at(s, i, T, V)
            b, i = load_chunk(sc_row, id_row, c0 + CHUNK, N, CHUNK)  # the next chunk
            incl, tot = scan_slots(sel.to(tl.int32) + ((s != -2147483648).to(tl.int32) << 16), CHUNK)
            slot = cnt + (incl & 0xFFFF) - 1
            tl.store(sb_row + slot, c0 + tl.arange(0, CHUNK), mask=sel & (slot < CAP))
            cnt += tot & 0xFFFF
            nv += tot >> 16
        return cnt, nv

    @generic_jit
    def _sample_kernel(sc_ptr, id_ptr, sb_ptr, N, K, s_sq, s_iq, CAP: tl.constexpr, S: tl.constexpr,
                       SB: tl.constexpr):
        # grid (Q,): a row's sampled cutoff (sample_cutoff) to the head of its kept-list row
        # (HEAD int32: T, V, over, -, then the int64 counts the pass adds to, zeroed here)
        row = tl.program_id(0).to(tl.int64)
        head = sb_ptr + row * (CAP + HEAD)
        T, V, over = sample_cutoff(sc_ptr + row * s_sq, id_ptr + row * s_iq, N, K, CAP, S, SB)
        tl.store(head, T)
        tl.store(head + 1, V)
        tl.store(head + 2, over.to(tl.int32))
        tl.store((head + 4).to(tl.pointer_type(tl.int64)), tl.full((), 0, tl.int64))

    @generic_jit
    def _spread_pass_kernel(sc_ptr, id_ptr, sb_ptr, N, s_sq, s_iq, CAP: tl.constexpr, FCH: tl.constexpr):
        # grid (Q, N / FCH): sample_pass spread over a row's programs, FCH candidates each: the
        # positions of those that come first in the order down to the row's sampled cutoff (T, V)
        # to its kept list, the first CAP of them (slots in any order: one atomic add a program
        # reserves its kept candidates' slots, and counts them and the valid ones, packed in an
        # int64); nothing where the sample predicted too many (over)
        row = tl.program_id(0).to(tl.int64)
        c0 = tl.program_id(1) * FCH
        head = sb_ptr + row * (CAP + HEAD)
        if tl.load(head + 2) == 0:
            T = tl.load(head)
            V = tl.load(head + 1)
            b, i = load_chunk(sc_ptr + row * s_sq, id_ptr + row * s_iq, c0, N, FCH)
            s = score_key(b, i)
            sel = kept_at(s, i, T, V)
            incl, tot = scan_slots(sel.to(tl.int32) + ((s != -2147483648).to(tl.int32) << 16), FCH)
            old = tl.atomic_add((head + 4).to(tl.pointer_type(tl.int64)),
                                (tot & 0xFFFF).to(tl.int64) | ((tot >> 16).to(tl.int64) << 32), sem="relaxed")
            slot = (old & 0xFFFFFFFF).to(tl.int32) + (incl & 0xFFFF) - 1
            tl.store(head + HEAD + slot, c0 + tl.arange(0, FCH), mask=sel & (slot < CAP))

    @triton.jit
    def spread_counts(head, CAP: tl.constexpr):
        # what sample_pass returns, from a row's head after the spread pass: the kept candidates
        # (CAP + 1 where the sample predicted too many: no pass ran) and the valid ones
        over = tl.load(head + 2)
        c = tl.load((head + 4).to(tl.pointer_type(tl.int64)))
        cnt = tl.where(over != 0, CAP + 1, (c & 0xFFFFFFFF).to(tl.int32))
        return cnt, tl.where(over != 0, cnt, (c >> 32).to(tl.int32))

    @triton.jit
    def sampled_tile(sc_row, id_row, sb_row, cnt, CAP: tl.constexpr):
        # the cnt candidates sample_pass kept, as a register tile of CAP (positions, score bits,
        # ids, score keys; the lanes past cnt invalid)
        j = tl.arange(0, CAP)
        mj = j < cnt
        o = tl.load(sb_row + j, mask=mj, other=0, cache_modifier=".cg")  # written by the program's other threads
        b = tl.load(sc_row + o, mask=mj, other=0.0).to(tl.int32, bitcast=True)
        i = tl.load(id_row + o, mask=mj, other=-1)
        return o, b, i, score_key(b, i)

    @triton.jit
    def read_keys(sc_row, id_row, o, N):
        # score keys and ids of a row's candidates at o, read again (volatile: not merged with the
        # kernel's first read of the row, which would keep that tile live through the finish)
        b = tl.load(sc_row + o, mask=o < N, other=0.0, volatile=True).to(tl.int32, bitcast=True)
        i = tl.load(id_row + o, mask=o < N, other=-1, volatile=True)
        return b, i, score_key(b, i)

    @triton.jit(noinline=True)  # (noinline: the module docstring's Compile time)
    def refine_row(sc_row, id_row, p_row, wk_row, wv_row, wo_row, cnt_ptr, row, N, nsel, above, P,
                   BLOCK: tl.constexpr, KB: tl.constexpr):
        # the finish of a row that fits the row kernel's register tile when its cutoff bin (the
        # 12-bit prefix P; above: the candidates above it, in W) holds more candidates than the
        # finish's registers: instead of passes over the in-play list in chunks, the row is read
        # again as a tile and the cutoff found on it by bisection: the score key TS among the
        # bin's candidates; when more tie at TS than are wanted, the id IV among those; when
        # duplicates of IV tie, the position OP (up to PACKED_CUT_MAX by smallest_cut, two
        # candidates a compare, else by bisect_cut). The row is read once: the score keys and the
        # ids are held through the score key's bisection, then the score keys and the ids at TS
        # (the winners' mask needs no other id), then their positions. (Up to session 6 of
        # 2026-12-02 one tile was held at a time and the row read three times: the ids at TS,
        # and the row again for the mask.) The bin's winners go to P (their positions), then to
        # W after the others.
        tl.store(cnt_ptr + row, nsel)
        need = nsel - above
        o = tl.arange(0, BLOCK) + (nsel >> 31)  # (+ 0: not merged with the kernel's positions, kept live to here)
        b, i, s = read_keys(sc_row, id_row, o, N)
        on = (s != -2147483648) & (top_digit(s, 12) == P)
        lo = tl.min(tl.where(on, s, 2147483647), 0)
        hi = tl.max(tl.where(on, s, -2147483648), 0)
        TS = bisect_cut(s, lo, hi, above, need, 0)
        c = tl.sum((s >= TS).to(tl.int32) + ((s > TS).to(tl.int32) << 16), 0)  # a tile holds < 2**16
        rem = need - ((c >> 16) - above)  # wanted among those at TS
        tie = (c & 0xFFFF) - (c >> 16)
        IV = tl.full((), 2147483647, tl.int32)  # rem == tie: every candidate at TS wins
        OP = IV
        x = tl.where(s == TS, i, -1)  # the ids at TS (valid, so >= 0), -1 elsewhere
        if rem < tie:
            if BLOCK <= PACKED_CUT_MAX:
                IV = smallest_cut(x, rem)
            else:
                vlo, vhi = inverted_range(x)
                IV = 2147483647 - bisect_cut(x, vlo, vhi, 0, rem, 1)
            xu = x.to(tl.uint32, bitcast=True)  # (the others' -1 above every id)
            ivu = IV.to(tl.uint32, bitcast=True)
            c = tl.sum((xu <= ivu).to(tl.int32) + ((xu < ivu).to(tl.int32) << 16), 0)
            rem = rem - (c >> 16)
            tie = (c & 0xFFFF) - (c >> 16)
            if rem < tie:  # duplicates (score key TS, id IV): by position
                xp = tl.where(x == IV, o, -1)
                if BLOCK <= PACKED_CUT_MAX:
                    OP = smallest_cut(xp, rem)
                else:
                    plo, phi = inverted_range(xp)
                    OP = 2147483647 - bisect_cut(xp, plo, phi, 0, rem, 1)
        win = (s != -2147483648) & (top_digit(s, 12) == P)
        win = win & ((s > TS) | ((s == TS) & ((x < IV) | ((x == IV) & (o <= OP)))))
        incl, tot = scan_slots(win.to(tl.int32), BLOCK)
        tl.store(p_row + incl - 1, o, mask=win)
        tl.debug_barrier()  # P, written by the program's threads, read by others
        j = tl.arange(0, KB)
        mj = j < tot
        oj = tl.load(p_row + j, mask=mj, other=0, cache_modifier=".cg")
        bj, ij, sj = read_keys(sc_row, id_row, tl.where(mj, oj, N), N)
        put_winners(wk_row, wv_row, wo_row, above + j, mj, sj, 2147483647 - tl.maximum(ij, 0), bj, oj)

    @generic_jit
    def _row_kernel(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, z_ptr, oid_ptr, osc_ptr, sb_ptr, hit_ptr,
                    N, K, s_sq, s_iq, s_oi, s_os,
                    BLOCK: tl.constexpr, CHUNK: tl.constexpr, KB: tl.constexpr, RESIDENT: tl.constexpr,
                    D: tl.constexpr, CH: tl.constexpr, FR1: tl.constexpr, FR2: tl.constexpr,
                    ORDER: tl.constexpr, REFINE: tl.constexpr, OB: tl.constexpr, SAMPLE: tl.constexpr = 0,
                    CAP: tl.constexpr = 16, SB: tl.constexpr = 16, HITS: tl.constexpr = False,
                    ZF: tl.constexpr = False, PARTS: tl.constexpr = False, FMAX: tl.constexpr = 0,
                    SPREAD: tl.constexpr = False):
        # grid (Q,): one program a row. The 12-bit prefix of the cutoff: by bisection over the
        # tile in registers (cutoff_search), or two 6-bit histogram passes over chunks; one
        # compaction sends the candidates above it to W and those on it to P; the finish picks
        # the still-needed winners in P; ORDER: the program orders its winners too (over OB
        # buckets). SAMPLE (chunks only): first a sampled cutoff (sample_config), whose kept
        # candidates (sb_ptr, CAP a row), when they hold the row's winners, replace the histogram
        # passes and the compaction pass by a register tile; HITS: hit_ptr[row] = 1 where they
        # did, else 0; ZF (with ORDER): the ordering's bucket sizes are zeroed after the
        # compaction, not by the ordering (its store and barrier before the atomics); PARTS
        # (with ORDER): after a refinement the ordering maps its winners in parts at once (parts_first);
        # FMAX: the most candidates a cutoff bin that reaches the finish holds, 0: any (finish_max);
        # SPREAD (with SAMPLE): the sampled cutoff and its pass ran before, in _sample_kernel and
        # _spread_pass_kernel (sb_ptr's rows: HEAD int32, then CAP kept positions)
        row = tl.program_id(0).to(tl.int64)
        sc_row = sc_ptr + row * s_sq
        id_row = id_ptr + row * s_iq
        wk_row = wk_ptr + row * KB
        wv_row = wv_ptr + row * KB
        wo_row = wo_ptr + row * KB
        p_row = p_ptr + row * N
        if RESIDENT:  # the row stays in registers for every pass
            b, i = load_chunk(sc_row, id_row, 0, N, BLOCK)
            s = score_key(b, i)
            nsel, P, above, m = cutoff_search(s, K)
            all_in = (nsel - above == m).to(tl.int32)
            # a cutoff bin of more than REFINE candidates in the 8192 or 16384 tile is refined on the
            # tile (refine_row), not put in play
            if FR2 < BLOCK and REFINE < BLOCK:
                refine = (nsel - above < m) & (m > REFINE)
            else:
                refine = m < 0
            refined = 0
            if PARTS:  # the ordering's first level in parts at once after a refinement (radix.part_counts)
                refined = refine.to(tl.int32)
            compact_tile(s, b, i, tl.arange(0, BLOCK), P, all_in, 1 - refine.to(tl.int32), wk_row, wv_row, wo_row,
                         p_row, 0, 0, BLOCK, not ORDER)
        else:  # every pass re-reads the row
            refined = 0
            fast = 0
            if SAMPLE > 0 and SPREAD:  # the sampled cutoff's kept candidates, from the kernels before
                sb_row = sb_ptr + row * (CAP + HEAD) + HEAD
                cnt, nv = spread_counts(sb_row - HEAD, CAP)
            elif SAMPLE > 0:  # the candidates at or above a sampled cutoff, when they hold the winners
                sb_row = sb_ptr + row * CAP
                T, V, over = sample_cutoff(sc_row, id_row, N, K, CAP, SAMPLE, SB)
                # no pass where the sample says more than 3/4 of the tile would be kept
                cnt = tl.where(over, CAP + 1, 0)
                if cnt == 0:
                    cnt, nv = sample_pass(sc_row, id_row, sb_row, N, T, V, CHUNK, CAP)
                else:
                    nv = cnt
            if SAMPLE > 0:
                fast = (cnt <= CAP) & (cnt >= tl.minimum(K, nv))
                if HITS:
                    tl.store(hit_ptr + row, fast.to(tl.int32))
                tl.debug_barrier()  # sb_row, written by the program's threads, read by others
            if SAMPLE > 0 and fast:  # one register tile of at most CAP: every candidate at or above T
                o, b, i, s = sampled_tile(sc_row, id_row, sb_row, cnt, CAP)
                nsel, P, above, m = cutoff_search(s, K)
                all_in = (nsel - above == m).to(tl.int32)
                compact_tile(s, b, i, o, P, all_in, 1, wk_row, wv_row, wo_row, p_row, 0, 0, CAP, not ORDER)
            else:  # two histogram passes (not twelve), then the compaction pass
                h1 = chunk_hist(sc_row, id_row, N, 0, CHUNK, 0)
                nsel = tl.minimum(tl.sum(h1, 0), K)
                d1, ab1, _ = pick_digit(h1, nsel, 64)
                h2 = chunk_hist(sc_row, id_row, N, d1, CHUNK, 1)
                d2, ab2, m = pick_digit(h2, nsel - ab1, 64)
                above = ab1 + ab2
                P = (d1 << 6) | d2
                all_in = (nsel - above == m).to(tl.int32)
                wbase = nsel * 0
                pbase = nsel * 0
                bn, i_n = load_chunk(sc_row, id_row, 0, N, CHUNK)
                for c0 in range(0, N, CHUNK):
                    bc = bn
                    ic = i_n
                    bn, i_n = load_chunk(sc_row, id_row, c0 + CHUNK, N, CHUNK)  # the next chunk
                    wbase, pbase = compact_tile(score_key(bc, ic), bc, ic, c0 + tl.arange(0, CHUNK), P, all_in, 1,
                                                wk_row, wv_row, wo_row, p_row, wbase, pbase, CHUNK, not ORDER)
        if ORDER and ZF:  # the ordering's bucket sizes zeroed now (before its atomics: the barriers below)
            tl.store(z_ptr + row * (ORDER_SCRATCH * KB) + tl.arange(0, OB), tl.zeros([OB], dtype=tl.int32))
        tl.debug_barrier()  # P and W, written by the program's threads, read by others below
        if RESIDENT and FR2 < BLOCK and REFINE < BLOCK:  # a bin beyond the finish's registers: refined on the tile
            if refine:
                refine_row(sc_row, id_row, p_row, wk_row, wv_row, wo_row, cnt_ptr, row, N, nsel, above, P, BLOCK, KB)
            elif REFINE == 0:  # every bin refined: no finish compiled
                tl.store(cnt_ptr + row, nsel)
            else:  # (FMAX: the finish's chunks compiled or not, finish_max)
                finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel, above,
                           m, KB, D, CH, FR1, FR2, FMAX)
        else:
            finish_row(sc_ptr, id_ptr, p_ptr, wk_ptr, wv_ptr, wo_ptr, cnt_ptr, row, N, s_sq, s_iq, nsel, above, m,
                       KB, D, CH, FR1, FR2, FMAX)
        if ORDER:
            tl.debug_barrier()
            order_row(wk_row, wo_row, nsel, z_ptr + row * (ORDER_SCRATCH * KB), sc_row, oid_ptr + row * s_oi,
                      osc_ptr + row * s_os, K, refined, KB, SPLIT, OB, ZF, PARTS)


def launch_plan(q: int, n: int, k: int, n_sm: int = 132) -> tuple:
    """What a call with ``Q`` rows of ``n`` candidates compiles: (path, tile class). Two calls
    with one plan share every compiled kernel (the shapes themselves are runtime values)."""
    kb = max(2, select_staged.next_pow2(k))
    path = choose_path(q, n, k, n_sm)
    if path == "block":  # one NVRTC function a tile: the row's, or its chunks' and their merge's
        opts = block_options(q, n, k, n_sm)
        return (path, kb) + select_block.plan_kernels(n, k, opts["chunk"], q, keep=opts["keep"], n_sm=n_sm)
    if path == "row":  # the row kernel orders its own winners
        cfg = row_config(n, q)
        smp = sample_config(n, cfg[3])
        return (path, kb, "bucket") + cfg + smp + (spread_pass(q, smp[0] > 0),)
    order = "rank" if q <= select_staged.RANK_MAX_ROWS else "bucket"
    tile = select_staged.rank_tile(q, kb, n_sm, True) if order == "rank" else ()
    tiers = select_staged.finish_tiers(*select_staged.rank_layout(q, kb))
    spread = (n > select_staged.SPREAD_MIN,)  # (the narrowing walk's own kernel: staged_select's spread)
    return (path, kb, order) + tile + select_staged.plan(q, n, kb, n_sm) + spread + tiers


@functools.lru_cache(maxsize=1024)
def _first_call_plan(q: int, n: int, k: int, n_sm: int) -> tuple:
    # launch_plan, memoised: every eager call asks whether its plan's first call has run
    return launch_plan(q, n, k, n_sm)


def _compiles(scores: torch.Tensor) -> bool:
    # whether a call on scores compiles Triton kernels (CUDA; the interpreter compiles nothing)
    return scores.device.type == "cuda"


def triton_ordered_select(scores: torch.Tensor, ids: torch.Tensor, k: int, *,
                          path: str | None = None, order: str | None = None, num_warps: int | None = None,
                          chunk: int | None = None, resident: bool | None = None, radix_bits: int | None = None,
                          refine: int | None = None, sample: int | None = None, sample_cap: int | None = None,
                          order_buckets: int | None = None, sample_hits: torch.Tensor | None = None,
                          staged: dict | None = None, maxnreg: int | None = None, spread_sample: bool | None = None):
    """Exact ordered top-``k`` of each row: ``(ids int32 [Q, k], scores fp32 [Q, k])``.

    ``scores`` fp32 ``[Q, N]`` and ``ids`` int32 ``[Q, N]`` (``-1`` = padding) on one CUDA
    device (it runs there: a device guard when that is not the current device). No host
    synchronisation; safe to capture in a CUDA graph (after a first, compiling call outside
    capture). ``path``: ``"row"``, ``"staged"`` or ``"block"`` (rows of up to 16384
    candidates; no option of the other paths) (default ``choose_path``; where it chose the block
    path and that does not compile here, the call runs on the Triton kernels). ``order``: the final ordering, ``"rank"`` or ``"sort"`` (default by Q,
    ``radix.order_winners``). Tuning options of the row kernel: ``num_warps``, ``maxnreg``
    (Triton's cap on a thread's registers; default ``row_config``'s), ``chunk``,
    ``resident`` (keys in registers), ``radix_bits`` (digit width, 2..8, default 5), ``refine``
    (the 8192 and 16384 register tiles refine a cutoff bin of more candidates than this on the
    tile, default ``refine_min``; smaller bins go to the finish, in registers up to 4096, in
    chunks beyond; 0: every bin refined, no finish compiled; the tile's size or more: none, and
    no refinement compiled), ``sample`` and ``sample_cap`` (rows re-read
    in chunks: the sampled cutoff's sample and tile, ``sample_config``; ``sample=0``: none),
    ``order_buckets`` (the buckets of the row kernel's ordering, ``radix.order_row``: k rounded
    up to a power of two, or twice that; default ``ORDER_BUCKETS`` times the first), and
    ``sample_hits`` (an int32 ``[Q]`` tensor that receives 1 for each row whose sampled cutoff
    held, 0 for the others; a report, not an option of the selection), ``spread_sample``
    (with a sampled cutoff: the cutoff and its pass over the row run before the row kernel, in
    kernels of their own, the pass spread over programs of ``SPREAD_CHUNK`` candidates; False:
    both in the row kernel's program; default ``spread_pass``; no effect where the row takes no
    sampled cutoff); of the
    staged path: ``staged`` (``select_staged.staged_select``'s keywords).
    """
    # the caller's options as given, for the calls again below (a device guard; the first call's
    # parallel compile), before any is resolved
    given = dict(path=path, order=order, num_warps=num_warps, chunk=chunk, resident=resident, radix_bits=radix_bits,
                 refine=refine, sample=sample, sample_cap=sample_cap, order_buckets=order_buckets,
                 sample_hits=sample_hits, staged=staged, maxnreg=maxnreg, spread_sample=spread_sample)
    if not _HAVE_TRITON:
        raise RuntimeError("triton_ordered_select needs Triton (pip install triton)")
    if scores.dim() != 2 or ids.shape != scores.shape:
        raise ValueError(f"scores and ids must be [Q, N] of one shape, got {tuple(scores.shape)} and {tuple(ids.shape)}")
    if scores.dtype != torch.float32 or ids.dtype != torch.int32:
        raise ValueError(f"need fp32 scores and int32 ids, got {scores.dtype} and {ids.dtype}")
    if scores.device != ids.device:
        raise ValueError("scores and ids must be on one device")
    if scores.device.type != "cuda" and not _interpret():
        raise ValueError("triton_ordered_select needs CUDA tensors")
    if scores.device.type == "cuda" and scores.device.index != torch.cuda.current_device():
        # Triton launches on the current device, whatever device the tensors are on
        with torch.cuda.device(scores.device):
            return triton_ordered_select(scores, ids, k, **given)
    k = int(k)
    q, n = scores.shape
    if not supports(n, k):
        raise ValueError(f"unsupported shape: N={n} (max {MAX_CANDIDATES}), k={k} (1..{MAX_K})")
    row_opts = (num_warps, chunk, resident, radix_bits, refine, sample, sample_cap, order_buckets, maxnreg,
                spread_sample, sample_hits)
    n_sm = _num_sms(scores.device.index or 0) if scores.device.type == "cuda" else 132
    if path is None:  # an option of one path asks for that path; else the dispatcher decides
        if any(o is not None for o in row_opts):
            path = "row"
        else:
            path = "staged" if staged else choose_path(q, n, k, n_sm)
    if path not in ("row", "staged", "block"):
        raise ValueError(f"path must be row, staged or block, got {path!r}")
    if path == "block":
        if any(o is not None for o in row_opts) or staged or order is not None:
            raise ValueError("path='block' takes no option of the row or staged path, nor an order")
        if scores.device.type != "cuda":
            raise ValueError("path='block' needs CUDA tensors (the interpreter runs Triton kernels only)")
        chosen = given["path"] is None
        try:
            if collecting():  # a parallel compile of plans (precompile): the block kernel compiles now (NVRTC)
                if q > 0:
                    opts = block_options(q, n, k, n_sm)
                    select_block.compile_kernels(select_block.plan_kernels(n, k, opts["chunk"], q, keep=opts["keep"],
                                                                           n_sm=n_sm), scores.device.index)
                return (torch.empty((q, k), dtype=torch.int32, device=scores.device),
                        torch.empty((q, k), dtype=torch.float32, device=scores.device))
            return select_block.block_select(scores if scores.stride(1) == 1 else scores.contiguous(),
                                             ids if ids.stride(1) == 1 else ids.contiguous(), k,
                                             **block_options(q, n, k, n_sm))
        except RuntimeError:
            if not chosen or select_block.available():
                raise
            # the block kernel did not compile here (logged once): the Triton kernels serve the call
            return triton_ordered_select(scores, ids, k, **given)
    if order not in (None, "rank", "bucket", "sort"):
        raise ValueError(f"order must be rank, bucket or sort, got {order!r}")
    if path == "staged" and any(o is not None for o in row_opts):
        raise ValueError("row kernel options given with path='staged'")
    if path == "row" and staged:
        raise ValueError("staged options given with path='row'")
    digits = 5 if radix_bits is None else int(radix_bits)
    if not 2 <= digits <= 8:
        raise ValueError(f"radix_bits must be in 2..8, got {radix_bits}")
    kb = max(2, select_staged.next_pow2(k))
    ob = ORDER_BUCKETS * kb if order_buckets is None else int(order_buckets)
    if ob not in (kb, 2 * kb):  # (radix.order_row's scratch holds 2 KB bucket sizes)
        raise ValueError(f"order_buckets must be {kb} or {2 * kb} (k rounded up to a power of two, or twice that), "
                         f"got {order_buckets}")
    if PARALLEL_COMPILE and q > 0 and _compiles(scores) and not collecting():
        # a plan's first call: its kernels compiled at once, then launched below (select_compile)
        opts = row_opts[:-1] + (sample_hits is not None, tuple(sorted((staged or {}).items())))
        key = (scores.device.index, _first_call_plan(q, n, k, n_sm), path, order, opts)
        if key not in _WARMED and not torch.cuda.is_current_stream_capturing():
            _WARMED.add(key)
            compile_in_parallel([lambda: triton_ordered_select(scores, ids, k, **given)])
    out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
    if q == 0:
        return out_ids, out_sc
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    if ids.stride(1) != 1:
        ids = ids.contiguous()
    if path == "staged":
        return select_staged.staged_select(scores, ids, k, out_ids, out_sc, n_sm, order=order, **dict(staged or {}))
    block, nw, chunk, resident, maxnreg = row_config(n, q, num_warps, chunk, resident, maxnreg)
    n_sample, cap = sample_config(n, resident, sample, sample_cap)
    if sample_hits is not None and (sample_hits.shape != (q,) or sample_hits.dtype != torch.int32
                                    or sample_hits.device != scores.device or not sample_hits.is_contiguous()):
        raise ValueError(f"sample_hits must be a contiguous int32 [Q] tensor on {scores.device}")
    fused = order in (None, "bucket")  # the row kernel orders its own winners (radix.order_row)
    wk, wv, wo, cnt, p_list = winner_workspace(q, kb, n, scores.device)
    spread = spread_pass(q, bool(n_sample)) if spread_sample is None else bool(n_sample) and bool(spread_sample)
    # the sampled cutoff's kept positions, CAP a row (after SPREAD_HEAD int32 of the cutoff and the
    # counts where spread; else a placeholder)
    sb = torch.empty((q * (cap + SPREAD_HEAD * spread),) if n_sample else (1,), dtype=torch.int32, device=scores.device)
    if sample_hits is not None and not n_sample:
        sample_hits.zero_()
    z = torch.empty((q * ORDER_SCRATCH.value * kb,) if fused else (1,), dtype=torch.int32, device=scores.device)
    fr1, fr2 = select_staged.finish_tiers(False, 0)
    refine = refine_min(block, fr2) if refine is None else int(refine)
    if refine < 0:
        raise ValueError(f"refine must be >= 0, got {refine}")
    hits = sample_hits is not None and n_sample > 0
    ref = min(refine, RESIDENT_MAX) if resident and block > fr2 else 0  # (0 elsewhere: one kernel)
    if spread:  # the sampled cutoff, then its pass spread over the row's programs
        launch(_sample_kernel, (q,), scores, ids, sb, n, k, scores.stride(0), ids.stride(0), CAP=cap, S=n_sample,
               SB=SAMPLE_BITS, num_warps=SPREAD_WARPS)
        launch(_spread_pass_kernel, (q, -(-n // SPREAD_CHUNK)), scores, ids, sb, n, scores.stride(0), ids.stride(0),
               CAP=cap, FCH=SPREAD_CHUNK, num_warps=SPREAD_WARPS)
    launch(_row_kernel, (q,), scores, ids, p_list, wk, wv, wo, cnt, z, out_ids, out_sc, sb,
           sample_hits if hits else sb, n, k, scores.stride(0), ids.stride(0),
           out_ids.stride(0), out_sc.stride(0), BLOCK=block, CHUNK=chunk, KB=kb, RESIDENT=resident,
           D=digits, CH=FIN_CHUNK, FR1=fr1, FR2=fr2, ORDER=fused,
           REFINE=ref, OB=ob, SAMPLE=n_sample, CAP=max(cap, 16), SB=SAMPLE_BITS, HITS=hits,
           ZF=fused and zero_first(block, resident), PARTS=fused and parts_first(block, resident),
           FMAX=finish_max(block, resident, ref, fr2), SPREAD=spread, num_warps=nw,
           **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    if fused:
        return out_ids, out_sc
    return order_winners(wk, wv, wo, cnt, out_ids, out_sc, k, kb, n_sm, order, scores=scores)


def precompile(capacities: Iterable, k: int = 2048, n: int | None = None, *, device=None,
               progress: bool = True) -> dict:
    """Compile, once, every kernel the given shapes will launch (call it at preparation).

    ``capacities``: row counts ``Q`` (with ``n`` candidates a row) or ``(Q, N)`` pairs. Shapes
    that share a ``launch_plan`` share compiled kernels, so each plan is compiled once (a call on
    that shape, outside any capture). Logs one INFO line a plan on ``tpflare.select_kernel`` and,
    with ``progress``, prints it to stderr. Returns ``{(Q, N): seconds}`` of the shapes that
    compiled something (0 s for those whose plan was compiled already).
    """
    if not available():
        log.info("tpflare.select_kernel.precompile: Triton or CUDA not available, nothing to compile")
        return {}
    shapes = []
    for c in capacities:
        q_, n_ = (c, n) if isinstance(c, int) else tuple(c)
        if n_ is None:
            raise ValueError("precompile: give n= or (Q, N) pairs")
        if supports(int(n_), k) and int(q_) >= 1:
            shapes.append((int(q_), int(n_)))
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    n_sm = _num_sms(dev.index or 0)
    plans: dict = {}
    for shape in shapes:
        plans.setdefault(launch_plan(shape[0], shape[1], k, n_sm), shape)
    out = {}
    t_all = time.perf_counter()

    def inputs(q_, n_):
        s = torch.randn(q_, n_, device=dev)
        return s, torch.randperm(n_, device=dev, dtype=torch.int64).to(torch.int32).expand(q_, n_).contiguous()

    with torch.cuda.device(dev):
        if PARALLEL_COMPILE and len(plans) > 1:  # every plan's kernels at once (select_compile), then each plan's call
            # (each call's inputs live only while its launches are collected)
            warmed = compile_in_parallel([lambda q_=q_, n_=n_: triton_ordered_select(*inputs(q_, n_), k)
                                          for q_, n_ in plans.values()])
            msg = (f"tpflare.select_kernel: compiled the kernels of {len(plans)} launch plans at once "
                   f"({warmed} launches) in {time.perf_counter() - t_all:.2f} s")
            log.info(msg)
            if progress:
                print(msg, file=sys.stderr, flush=True)
        for i, (plan, (q_, n_)) in enumerate(plans.items()):
            t0 = time.perf_counter()
            s, ids = inputs(q_, n_)
            triton_ordered_select(s, ids, k)
            torch.cuda.synchronize(dev)
            del s, ids
            out[(q_, n_)] = time.perf_counter() - t0
            msg = (f"tpflare.select_kernel: precompiled {i + 1}/{len(plans)} (Q={q_}, N={n_}, k={k}, {plan[0]} path) "
                   f"in {out[(q_, n_)]:.2f} s")
            log.info(msg)
            if progress:
                print(msg, file=sys.stderr, flush=True)
    log.info("tpflare.select_kernel: %d shapes, %d launch plans compiled in %.2f s", len(shapes), len(plans),
             time.perf_counter() - t_all)
    return out
