"""Where the time of the staged selection path goes, and how its tile options move it (H200).

    python bench/bench_select_breakdown.py --out breakdown.json
    python bench/bench_select_breakdown.py --out b.json --n 131072 --patterns ties,short --rows 1 --stages-only
    python bench/bench_select_breakdown.py --out o.json --patterns ties,short --rows 1 --options 1x131072,1x32768

Prefixes of the staged path's launch sequence are captured in CUDA graphs and replayed (each
prefix ends in a consistent state, so replays are safe): workspace memset, + histogram, +
compact (finish fused up to 3 rows), + finish kernel, + ordering. Differences between prefixes
are the stages' costs. Then tile options of both paths at a few shapes (graph replay).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_select_kernel import make_inputs, time_graph  # noqa: E402

from tpflare.ops import radix, select_kernel as sk, select_staged as st  # noqa: E402


def staged_prefix(scores, ids, k, stop: int, play=None):
    """The staged path's launches up to stage ``stop`` (0 memset .. 4 ordering), as staged_select
    (stage 3, the finish: the walk kernel, where rows of more than ``SPREAD_MIN`` spread it, and the
    finish kernel)."""
    q, n = scores.shape
    kb = max(2, st.next_pow2(k))
    n_sm = sk._num_sms(0)
    ca, fuse, fw = st.plan(q, n, kb, n_sm)
    binned, pr = st.rank_layout(q, kb, None, play)
    wb, zs, span = st.workspace_layout(k, n, binned, pr)
    nw_a = max(1, min(8, ca // 256))
    z = torch.zeros((q, zs), dtype=torch.int32, device=scores.device)
    if stop == 0:
        return z
    wk, wv, wo, cnt, pl = radix.winner_workspace(q, wb, st.play_slots(n), scores.device)
    grid = (q, -(-n // ca))
    fr1, fr2 = st.finish_tiers(binned, pr)
    fin = dict(HB=st.HIST_BITS, ZS=zs, KB=wb, D=5, CH=2048, FR1=fr1, FR2=fr2, ZN=st.narrow_offset(binned))
    st._hist_kernel[grid](scores, ids, z, n, scores.stride(0), ids.stride(0), CA=ca, HB=st.HIST_BITS, ZS=zs,
                          ZN=fin["ZN"], num_warps=nw_a)
    if stop == 1:
        return z
    spread = n > st.SPREAD_MIN
    st._compact_kernel[grid](scores, ids, z, pl, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0), pr,
                             CA=ca, FUSED=fuse, BINNED=binned, SPREAD=spread, num_warps=fw if fuse else nw_a, **fin)
    if stop >= 3 and spread:
        p2 = torch.empty_like(pl)
        st._walk_kernel[(q, -(-n // st.WALK_CHUNK))](scores, ids, z, pl, p2, wk, wv, wo, cnt, n, scores.stride(0),
                                                     ids.stride(0), WCH=st.WALK_CHUNK, num_warps=fw, **fin)
    if stop >= 3 and not fuse:
        st._finish_kernel[(q,)](scores, ids, z, pl, wk, wv, wo, cnt, n, k, scores.stride(0), ids.stride(0), pr,
                                SPREAD=spread, num_warps=fw, **fin)
    if stop >= 4:
        out_ids = torch.empty((q, k), dtype=torch.int32, device=scores.device)
        out_sc = torch.empty((q, k), dtype=torch.float32, device=scores.device)
        return radix.order_winners(wk, wv, wo, cnt, out_ids, out_sc, k, wb, n_sm, None, st.rank_tile(q, kb, n_sm, binned),
                                   binned=(z, zs, st.HIST_BITS) if binned else None, span=span, scores=scores)
    return z


OPTIONS = {
    (1, 16384): [dict(path="staged", staged=dict(ca=c)) for c in (256, 1024, 2048)]
    + [dict(path="staged", staged=dict(fin_warps=4)), dict(path="staged", staged=dict(radix_bits=5)),
       dict(path="staged", staged=dict(radix_bits=6)), dict(path="staged", staged=dict(fin_resident=1024)),
       dict(path="staged", staged=dict(rank_rows=8)), dict(path="staged", staged=dict(rank_rows=32)),
       dict(path="staged", staged=dict(rank_rows=64)), dict(path="staged", staged=dict(rank_play=0)),
       dict(path="staged", staged=dict(rank_play=2048)), dict(path="staged", staged=dict(rank_play=8192)),
       dict(path="staged", staged=dict(rank_cols=128)), dict(path="staged", staged=dict(rank_cols=1024))],
    (8, 16384): [dict(path="staged", staged=dict(ca=c)) for c in (256, 1024)]
    + [dict(path="staged", staged=dict(rank_rows=32)), dict(path="staged", order="sort")],
    (64, 16384): [dict(path="row", num_warps=8), dict(path="row", radix_bits=4), dict(path="row", radix_bits=6),
                  dict(path="staged", staged=dict(ca=2048)), dict(path="staged", staged=dict(ca=4096))],
    (1024, 16384): [dict(path="row", num_warps=8), dict(path="row", radix_bits=6)],
    (1, 131072): [dict(path="staged", staged=dict(fin_warps=8)), dict(path="staged", staged=dict(fin_chunk=4096)),
                  dict(path="staged", staged=dict(fin_chunk=8192)), dict(path="staged", staged=dict(fin_warps=8, fin_chunk=4096)),
                  dict(path="staged", staged=dict(fin_warps=32, fin_chunk=8192)),
                  dict(path="staged", staged=dict(rank_play=0)), dict(path="staged", staged=dict(rank_play=8192))],
    # the narrowing pass's chunk and warps on a tie group of about 31000 (`short`; 8 warps by default)
    (1, 32768): [dict(path="staged", staged=dict(fin_warps=16)), dict(path="staged", staged=dict(fin_chunk=4096)),
                 dict(path="staged", staged=dict(fin_chunk=8192)), dict(path="staged", staged=dict(fin_warps=16, fin_chunk=4096))],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=16384, help="candidates a row of the stage costs")
    ap.add_argument("--patterns", default="random,ties", help="of bench_select_kernel.make_inputs")
    ap.add_argument("--rows", default="1,1:0,8", help="Q (Q:rank_play) of the stage costs")
    ap.add_argument("--stages-only", action="store_true", help="no tile options")
    ap.add_argument("--options", default="", help="only these shapes' tile options (QxN, comma-separated)")
    a = ap.parse_args(argv)
    k, n = a.k, a.n
    recs = []
    rows = [(int(r.split(":")[0]), int(r.split(":")[1]) if ":" in r else None) for r in a.rows.split(",")]
    for pattern in a.patterns.split(","):
        for q, play in rows:  # play 0: the finish picks the cutoff bin's winners
            sets = [make_inputs(q, n, pattern, seed=i) for i in range(3)]
            prev = 0.0
            for stop, name in enumerate(("memset", "+hist", "+compact", "+finish", "+order")):
                ms = time_graph(lambda s, i: staged_prefix(s, i, k, stop, play), sets, 10, 10)
                recs.append(dict(kind="prefix", pattern=pattern, q=q, n=n, stage=name, graph_ms=ms,
                                 stage_ms=ms - prev, rank_play=play))
                prev = ms
                print(json.dumps(recs[-1]), flush=True)
    only = {tuple(int(x) for x in o.split("x")) for o in a.options.split(",") if o}
    for (q, n), opts in ({} if a.stages_only else OPTIONS).items():
        if only and (q, n) not in only:
            continue
        for pattern in a.patterns.split(","):
            sets = [make_inputs(q, n, pattern, seed=i) for i in range(3)]
            ref = sk.triton_ordered_select(*sets[0], k)
            for kw in [{}] + opts:
                got = sk.triton_ordered_select(*sets[0], k, **kw)
                exact = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1].view(torch.int32),
                                                                          ref[1].view(torch.int32)))
                ms = time_graph(lambda s, i, kw=kw: sk.triton_ordered_select(s, i, k, **kw), sets, 10, 10)
                recs.append(dict(kind="option", pattern=pattern, q=q, n=n, option=json.dumps(kw) if kw else "default",
                                 graph_ms=ms, exact=exact))
                print(json.dumps(recs[-1]), flush=True)
            del sets
    with open(a.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), records=recs), f, indent=1)
    print("\nstage costs (graph replay ms):")
    for r in recs:
        if r["kind"] == "prefix":
            print(f"{r['pattern']:7} N={r['n']:<6} Q={r['q']:<5} play={r['rank_play']} {r['stage']:9} total {r['graph_ms']:.4f}  "
                  f"stage {r['stage_ms']:.4f}")
    print("\noptions (graph replay ms):")
    for r in recs:
        if r["kind"] == "option":
            print(f"{r['pattern']:7} Q={r['q']:<5} N={r['n']:<6} {r['graph_ms']:.4f} exact={r['exact']} {r['option']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
