"""Where a block of the block path's kernel (ops/select_block.py) spends its time, phase by phase.

A copy of the kernel's source gets clock stamps (thread 0 reads ``clock64()`` after the block's
barriers at the phase boundaries below) and writes them, with its SM and its start and end on the
global timer, to a buffer; the module's own launch (``shipped``) is timed beside it (CUDA-graph
replay) so the stamps' own cost shows. Each cell is checked against the GPU tests' reference.

    python3 bench/block_phases.py --out phases.json [--cells 16384x64,16384x1024] [--patterns random,ties,short]
                                  [--module variant.py]   (a variant of bench/block_variants.py)
                                  [--kind filter]   (the filter kind, rows of 8193-16384, at every row count)

Per cell it prints each phase's median cycles over the blocks, the median block duration (ns),
how many blocks shared an SM at once (the most blocks whose [start, end] overlap on one SM), how the
block scheduler placed the first wave (``first_wave``: which blocks shared an SM), and
the function's registers and local-memory bytes a thread. Bench only: the stamps go in by text edits
of ``select_block.SOURCE`` at anchors that must be found once each, or the script stops.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from bench_select_kernel import make_inputs, time_graph  # noqa: E402
import fuzz_select  # noqa: E402  (the tests' ref_packed and mismatch)
from block_on_cpu import load_module  # noqa: E402

from tpflare.ops import select_block as sb  # noqa: E402

# (phase name, anchor or its spellings (one must be found, once), "before" / "after"): the stamp goes there
STAMPS = [
    ("load+count", "  const int nsel = min(K, nvalid);\n", "after"),
    ("level1", "    int rem = nsel - ab;\n", "before"),
    ("levels2-3", "  // the winners to shared memory: packed key", "before"),
    ("winners", "  if (mode & UNORDERED) {  // a chunk's winners", "before"),
    ("ord:lohi", "  const u64 ut = sm.ulo;", "before"),  # (since session 32 taken with the winners: no pass)
    ("ord:parts", "  int nb[3], base[3], shp[3];", "before"),
    ("ord:buckets", ("  int big = scan2048(sm.off, sm);", "  int big = scan2048(sm.hm, sm);"), "before"),
    ("ord:scan", ("  int* offs = sm.off;\n", "  int* offs = sm.hm;\n"), "before"),
    ("ord:level2", tuple("#pragma unroll\n  for (int w = 0; w < WPER; ++w) {\n    int i = w * THREADS + tid;\n"
                         f"    if (i < nsel) {m}" for m in ("sm.mem[offs", "sm.hm[NB + offs", "{\n      sm.mem[offs")),
     "before"),  # (the last: rank_keys, bench/block_variants.py)
    ("ord:members", "  int rank[WPER];\n", "before"),
    ("ord:rank", "  __syncthreads();  // (the member list's space takes the output order)", "before"),
    ("ordered", "  int* orow = out_ids + row * s_oi;\n  int* osrow", "before"),
]
# the filter kind's (--kind filter: select_block.FILTER_KERNEL; session 34), the ordering's as the row kind's
FILTER_STAMPS = [
    ("load", "  int nnan = 0;\n", "before"),  # (session 42: the load and its counts, before the NaN count)
    ("count", "  const int nsel = min(K, nvalid);\n", "after"),  # (the NaN count; count_after's first digit)
    ("level1", "    int rem = nsel - ab;\n", "before"),
    ("winners1", "    if (eq > rem) {  // a tie at the exact score key T1", "before"),
    ("levels2-3", "  for (int i = tid; i < NB; i += THREADS) hist[i] = 0;  // (the ordering", "before"),
] + STAMPS[4:-1] + [("ordered", "  int* out_row = out_ids + row * s_oi;", "before")]
KIND = "row"  # the kind profiled (--kind)
NS = len(STAMPS) + 1  # stamp 0: the block's start
END = r"""
  __syncthreads();
  if (tid == 0) {
    long long t1 = clock64();
    u64 g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    u32 smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    int* st = out_pos + row * 32;
    for (int i = 1; i < NSTAMP; ++i) st[i] = _ts[i] ? (int)(_ts[i] - _ts[0]) : -1;
    st[NSTAMP] = (int)(t1 - _ts[0]);
    st[NSTAMP + 1] = (int)smid;
    st[NSTAMP + 2] = (int)(_g0 & 0xffffffffu);
    st[NSTAMP + 3] = (int)(_g0 >> 32);
    st[NSTAMP + 4] = (int)(g1 & 0xffffffffu);
    st[NSTAMP + 5] = (int)(g1 >> 32);
    u32 nsm;
    asm volatile("mov.u32 %0, %%nsmid;" : "=r"(nsm));
    st[NSTAMP + 6] = (int)nsm;
  }
}
"""


def stamped_source(tile) -> str:
    """The profiled kind's (``KIND``: the row kind, or the filter) source for a tile (threads, or
    (threads, items) where the module's tiles are pairs) with the stamps in."""
    src = sb.source(tile, KIND)
    head = (f"#define NSTAMP {NS}\n__shared__ long long _ts[NSTAMP];\n"
            "#define STAMP(i) do { if (threadIdx.x == 0) _ts[i] = clock64(); } while (0)\n")
    starts = [a for a in ("  const int lane = tid & 31;\n  const i64 row = blockIdx.x;\n",
                          "  const int tid = threadIdx.x;\n  const i64 row = blockIdx.x;\n") if a in src]
    assert len(starts) == 1 and src.count(starts[0]) == 1, "anchor: the kernel's start"
    start = starts[0]
    src = src.replace(start, start + "  if (tid == 0) { for (int i = 0; i < NSTAMP; ++i) _ts[i] = 0; }\n"
                      "  STAMP(0);\n  u64 _g0 = 0;\n  if (tid == 0) asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(_g0));\n")
    for i, (name, anchors, where) in enumerate(STAMPS, 1):
        found = [a for a in ((anchors,) if isinstance(anchors, str) else anchors) if a in src]
        assert len(found) == 1 and src.count(found[0]) == 1, f"anchor of {name}: {found}"
        anchor = found[0]
        stamp = f"  STAMP({i});\n"
        src = src.replace(anchor, anchor + stamp if where == "after" else stamp + anchor)
    tail = src.rstrip()
    assert tail.endswith("}"), "the kernel's end"
    src = tail[:-1] + END
    return head + src


def threads(t) -> int:
    """A tile's threads a block: a pair's first, or the tile itself, or where the module launches a
    named tile on other threads (a variant's ``SHAPE``: name -> (threads, items)), those."""
    if not isinstance(t, int):
        return t[0]
    shape = getattr(sb, "SHAPE", None)
    return shape[t][0] if shape else t


def tile_name(t) -> str:
    return str(t) if isinstance(t, int) else "%dx%d" % t


def func_attrs(kern) -> dict:
    lib = sb._driver_library()()
    out = {}
    for key, attr in (("regs", 4), ("local_bytes", 3), ("static_smem", 1)):
        v = ctypes.c_int()
        lib.cuFuncGetAttribute(ctypes.byref(v), attr, kern.func)
        out[key] = v.value
    return out


def dyn() -> int:
    return sb.dyn_bytes(KIND) if hasattr(sb, "dyn_bytes") else sb.DYN_BYTES


def compile_src(src: str):
    kern = torch.cuda._compile_kernel(src, "tpflare_select_rows")
    rc = sb._driver_library()().cuFuncSetAttribute(kern.func, 8, dyn())
    assert rc == 0, rc
    if dyn() >= 48 * 1024:
        kern.set_shared_memory_config(dyn())
    return kern


def run_stamped(kern, t, s, i, k):
    q, n = s.shape
    out_ids = torch.empty((q, k), dtype=torch.int32, device=s.device)
    out_sc = torch.empty((q, k), dtype=torch.float32, device=s.device)
    st = torch.zeros((q, 32), dtype=torch.int32, device=s.device)
    kern(grid=(q, 1, 1), block=(threads(t), 1, 1), shared_mem=dyn(),
         args=[s, i, i, out_ids, out_sc, st, n, k, n, s.stride(0), i.stride(0), 0, out_ids.stride(0), out_sc.stride(0), 32,
               out_ids])  # (the last: the gated kinds' status, which the row kind does not read)
    return out_ids, out_sc, st


def overlap(st) -> int:
    # the most blocks running at once on one SM, from their global-timer spans
    g0 = (st[:, NS + 2].long() & 0xffffffff) | (st[:, NS + 3].long() << 32)
    g1 = (st[:, NS + 4].long() & 0xffffffff) | (st[:, NS + 5].long() << 32)
    best = 0
    for sm in st[:, NS + 1].unique().tolist():
        m = st[:, NS + 1] == sm
        ev = sorted([(a, 1) for a in g0[m].tolist()] + [(b, -1) for b in g1[m].tolist()], key=lambda e: (e[0], e[1]))
        cur = 0
        for _, d in ev:
            cur += d
            best = max(best, cur)
    return best


def first_wave(st, n_sm: int) -> dict:
    """How the block scheduler placed the first wave (blocks below 2 x n_sm): the share of blocks i < n_sm
    whose SM also ran block i + n_sm, and of even blocks i whose SM also ran block i + 1; and %nsmid."""
    sm = st[:, NS + 1].tolist()
    w = min(len(sm), 2 * n_sm)
    plus_n = [sm[i] == sm[i + n_sm] for i in range(0, w - n_sm)]
    plus_1 = [sm[i] == sm[i + 1] for i in range(0, w - 1, 2)]
    return dict(same_sm_i_i_plus_nsm=sum(plus_n) / max(len(plus_n), 1),
                same_sm_even_odd=sum(plus_1) / max(len(plus_1), 1), nsmid=int(st[0, NS + 6]),
                first_smids=sm[:8])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="16384x64,16384x1024,8192x1024,4096x1024")
    ap.add_argument("--patterns", default="random,ties,short")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--module", help="a copy of ops/select_block.py (a variant of bench/block_variants.py) to profile "
                    "instead of the shipped one")
    ap.add_argument("--tiles", default="", help="more tiles to run each cell on where they hold it (1024, or 1024x16 where "
                    "the module's tiles are pairs), beside the one block_select runs")
    ap.add_argument("--kind", default="row", choices=("row", "filter"),
                    help="the kind profiled: row (a tile's own), or filter (rows of 8193-16384 on 512 threads)")
    a = ap.parse_args(argv)
    global sb, STAMPS, NS, KIND
    if a.module:
        sb = load_module(a.module)
    if a.kind == "filter":
        STAMPS, NS, KIND = FILTER_STAMPS, len(FILTER_STAMPS) + 1, "filter"
    pairs = not isinstance(sb.TILES[0], int)
    extra = [tuple(int(x) for x in t.split("x")) if pairs else int(t) for t in a.tiles.split(",") if t]
    rec: dict = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, module=a.module or "ops/select_block.py",
                     phases=["start"] + [s[0] for s in STAMPS],
                     cells=[], attrs={})
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count

    def module_tile(n: int, q: int):  # the tile block_select runs for the cell (where tiles are pairs, by rows and SMs)
        if KIND == "filter":
            return sb.FILTER_THREADS
        return sb.plan_kernels(n, a.k, None, q, n_sm)[0][1] if pairs else sb.tile(n)

    kerns = {}
    for t in dict.fromkeys([sb.FILTER_THREADS] if KIND == "filter" else list(sb.TILES) + extra):
        kerns[t] = compile_src(stamped_source(t))
        rec["attrs"][tile_name(t)] = dict(shipped=func_attrs(sb.compile_tile(t, kind=KIND)), stamped=func_attrs(kerns[t]))
        print(f"tile {tile_name(t)}: {rec['attrs'][tile_name(t)]}", flush=True)
    for cell in a.cells.split(","):
        n, q = (int(x) for x in cell.split("x"))
        tiles = dict.fromkeys([module_tile(n, q)] + [e for e in extra if n <= (e[0] * e[1] if pairs else e * sb.ITEMS)])
        for t, pat in [(t, p) for t in tiles for p in a.patterns.split(",")]:
            sets = [make_inputs(q, n, pat, seed) for seed in (1, 2)]
            ref = [fuzz_select.ref_packed(s, i, a.k) for s, i in sets]
            force = dict(n_sm=0) if KIND == "filter" else {}  # (the filter at every row count)
            shipped = (time_graph(lambda s, i: sb.block_select(s, i, a.k, **force), sets, 20, 10) if t == module_tile(n, q)
                       else float("nan"))
            stamped = time_graph(lambda s, i: run_stamped(kerns[t], t, s, i, a.k), sets, 20, 10)
            exact = True
            rows = []
            for (s, i), r in zip(sets, ref):
                oi, osc, st = run_stamped(kerns[t], t, s, i, a.k)
                exact &= fuzz_select.mismatch((oi, osc), r) is None
                rows.append(st.cpu())
            st = torch.cat(rows)
            cyc = st[:, 1:NS + 1].clone()
            for j in range(1, cyc.shape[1]):  # a phase not run: its stamp is the one before's
                cyc[:, j] = torch.where(cyc[:, j] < 0, cyc[:, j - 1], cyc[:, j])
            total = cyc[:, -1]
            g0 = (st[:, NS + 2].long() & 0xffffffff) | (st[:, NS + 3].long() << 32)
            g1 = (st[:, NS + 4].long() & 0xffffffff) | (st[:, NS + 5].long() << 32)
            dur = statistics.median((g1 - g0).tolist())
            prev = torch.zeros_like(total)
            phases = {}
            for j, phase in enumerate([s[0] for s in STAMPS] + ["output"]):
                phases[phase] = statistics.median((cyc[:, j] - prev).tolist())
                prev = cyc[:, j]
            c = dict(n=n, q=q, pattern=pat, tile=tile_name(t), exact=exact, shipped_us=shipped * 1e3, stamped_us=stamped * 1e3,
                     block_cycles=statistics.median(total.tolist()), block_ns=dur, per_sm=overlap(rows[0]),
                     phases=phases, first_wave=first_wave(rows[0], n_sm))
            rec["cells"].append(c)
            print(f"{pat:6s} {q:5d} x {n:6d} tile {tile_name(t)}  shipped {c['shipped_us']:7.1f} us  stamped {c['stamped_us']:7.1f}  "
                  f"exact {exact}  block {c['block_cycles']:.0f} cyc {dur / 1e3:.1f} us  per SM {c['per_sm']}", flush=True)
            print("    " + "  ".join(f"{k} {v:.0f}" for k, v in phases.items()), flush=True)
            print(f"    first wave: {c['first_wave']}", flush=True)
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
