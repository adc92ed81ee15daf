"""Fuzzing of the latent gather on TP code spelt many ways, on real gloo ranks (CPU).

    python tools/fuzz_latent.py [--world 2] [--cases 40] [--seed S] [--out fuzz.json]

Each case draws one down_reduce site from choices users make: the K-slice (``x[..., a:b]``,
``narrow``, ``chunk``, ``split``, ``tensor_split``, ``index_select`` of an ``arange``), the GEMM
(``F.linear``, ``@`` with the transposed column shard, ``torch.matmul`` / ``@`` of an
``[in, out]`` weight, ``torch.mm``; a 3-D hidden row at times), the reduction
(``dist.all_reduce`` in place, the functional ``all_reduce`` and its wait, torch's TP API: an
``nn.Linear`` under ``RowwiseParallel(input_layouts=Replicate())``, where DTensor spells the
K-slice and the GEMM, and a serving stack's own ops, out-of-place and in-place, registered with
``tpflare.register_all_reduce``), a bias after the
reduction or inside the partial, a pointwise op after it, the dtype, the rows ``M`` and the
output width ``N`` (one that the gather's alignment does not divide at times), a hidden row
that differs across ranks, and ``dynamic=True``. It compiles the site with
``backend="tpflare"`` and ``latent_gather`` on and calls it at two row counts.

Every call is checked exactly: where the report says *rewritten*, the output must hold the
bits of the gather's eager emulation (every rank's full-K GEMM with its row shard, the column
blocks side by side, then the same bias and pointwise op) and the same bits on every rank;
where it says *skipped*, the bits plain Inductor's compile of the same code gives (not
eager's: Inductor may fuse a bias into the GEMM); every site gets one record, and a skipped
one its reason. A compile that raises counts as a failure when plain Inductor
compiles the same function, and so does a warning that plain Inductor's compile and calls of
the same function do not give (torch 2.13 warns of a size object put in a node's arguments). Cases are drawn from the seed alone, so every rank runs the same
ones; ``run_ranks`` stops every rank at its timeout, so a hang fails the run too. Exit status
1 on any failure.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import sys
import time
import traceback
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_latent_gather_real_tp import (_define_stack_ops, gather_bits,  # noqa: E402  (the tests' emulation,
                                       same_everywhere)  # check and a stack's ops)

SLICES = ("getitem", "narrow", "chunk", "split", "tensor_split", "index_select")
GEMMS = ("linear", "matmul_t", "in_out", "mm", "linear_3d")
REDUCES = ("dist", "functional", "dtensor", "stack", "stack_inplace")  # dtensor: torch's TP API (RowwiseParallel
# of an nn.Linear); stack, stack_inplace: a serving stack's own ops, registered (its group name "tp:0")
BIASES = ("none", "after", "inside")
POSTS = ("none", "relu", "scale", "float")


def draw_case(seed: int, world: int, index: int) -> dict:
    """One site's spelling, sizes and inputs' seed: the same on every rank."""
    rng = random.Random(f"{seed}/{world}/{index}")
    return dict(slice=rng.choice(SLICES), gemm=rng.choice(GEMMS), reduce=rng.choice(REDUCES),
                bias=rng.choices(BIASES, weights=(3, 2, 1))[0], post=rng.choice(POSTS),
                dtype=rng.choices(("bfloat16", "float16", "float32"), weights=(4, 2, 1))[0],
                rows=rng.choice(((64, 100), (100, 64), (3, 64), (64, 1), (128, 128))),
                k=64 * world * rng.choice((1, 2)), n=rng.choice((128 * world, 256 * world, 128 * world + 64)),
                replicated=rng.random() < 0.85, dynamic=rng.random() < 0.3, data=rng.randrange(2**31))


def _site(case: dict, rank: int, world: int, group):
    """The site's function, its weight arguments, the full weight and bias (for the emulation)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F

    dt = getattr(torch, case["dtype"])
    k, n = case["k"], case["n"]
    ks = k // world
    g = torch.Generator().manual_seed(case["data"])
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dt)
    b = torch.randn(n, generator=g).to(dt)
    col = w[:, rank * ks:(rank + 1) * ks].contiguous()  # this rank's column shard [N, K/W]
    io = col.T.contiguous()  # the same as [in, out] storage [K/W, N]
    spelling, gemm = case["slice"], case["gemm"]

    def kslice(x):
        if spelling == "getitem":
            return x[..., rank * ks:(rank + 1) * ks]
        if spelling == "narrow":
            return x.narrow(-1, rank * ks, ks)
        if spelling == "chunk":
            return x.chunk(world, -1)[rank]
        if spelling == "split":
            return x.split(ks, -1)[rank]
        if spelling == "tensor_split":
            return torch.tensor_split(x, world, -1)[rank]
        return torch.index_select(x, -1, torch.arange(rank * ks, (rank + 1) * ks))

    def partial(x, wt, bias):
        xs = kslice(x)
        if gemm in ("linear", "linear_3d"):
            return F.linear(xs, wt, bias if case["bias"] == "inside" else None)
        y = xs @ wt.T if gemm == "matmul_t" else torch.matmul(xs, wt) if gemm == "in_out" else torch.mm(xs, wt.T)
        return y + bias if case["bias"] == "inside" else y

    def post(y, bias):
        if case["bias"] == "after":
            y = y + bias
        if case["post"] == "relu":
            y = torch.relu(y)
        elif case["post"] == "scale":
            y = y * 0.5
        elif case["post"] == "float":
            y = y.float()
        return y

    if case["reduce"] == "dtensor":  # torch's TP API: DTensor slices the Replicate row and reduces the Partial
        return _dtensor_site(case, world, w, b, post)

    def fn(x, wt, bias):
        y = partial(x, wt, bias)
        if case["reduce"] == "dist":
            dist.all_reduce(y)
        elif case["reduce"] == "stack":
            y = _define_stack_ops().all_reduce(y, "tp:0")
        elif case["reduce"] == "stack_inplace":
            _define_stack_ops().inplace_all_reduce(y, "tp:0")
        else:
            y = funcol.wait_tensor(funcol.all_reduce(y, "sum", group))
        return post(y, bias)

    def emulation(x):
        return post(gather_bits(x.reshape(-1, k), w, world).reshape(*x.shape[:-1], n), b)

    return fn, (io if gemm == "in_out" else col, b), emulation


def _dtensor_site(case: dict, world: int, w, b, post):
    """The site as torch's TP API writes it: an ``nn.Linear`` (with the bias inside where the case
    says so) under ``RowwiseParallel(input_layouts=Replicate())``; the slice and the GEMM's spelling
    are DTensor's. The emulation of a bias inside: each rank's row shard GEMM adds its bias rows in
    one ``addmm``, as the rewrite does (DTensor gives the reduce ``bias / W`` a rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    n, k = w.shape
    inside = case["bias"] == "inside"
    lin = torch.nn.Linear(k, n, bias=inside, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if inside:
            lin.bias.copy_(b)
    parallelize_module(lin, init_device_mesh("cpu", (world,)), RowwiseParallel(input_layouts=Replicate()))

    def fn(x, wt, bias):
        return post(lin(x), bias)

    def emulation(x):
        x2 = x.reshape(-1, k)
        if inside:
            y = torch.cat([torch.addmm(br.view(-1, 1), wr, x2.T).T for wr, br in zip(w.chunk(world, 0), b.chunk(world))], 1)
        else:
            y = gather_bits(x2, w, world)
        return post(y.reshape(*x.shape[:-1], n), b)

    return fn, (None, b), emulation


def _inputs(case: dict, rank: int, rows: int, world: int):
    g = torch.Generator().manual_seed(case["data"] + rows)
    shape = (2, rows, case["k"]) if case["gemm"] == "linear_3d" else (rows, case["k"])
    x = torch.randn(*shape, generator=g).to(getattr(torch, case["dtype"]))
    return x if case["replicated"] else x + rank


@contextlib.contextmanager
def _warnings():
    """The texts of the warnings raised inside (each one, every time it is raised), but those of
    an API's deprecation: a module's first import gives them, in whichever compile runs first."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        texts: list[str] = []
        yield texts
    texts.extend(f"{w.category.__name__}: {w.message}" for w in got
                 if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)))


def rank_cases(rank: int, world: int, seed: int, cases: int) -> list:
    """What one rank runs: every case's compile and calls, checked; its findings."""
    import torch._inductor.config as ic
    import torch.distributed as dist

    import tpflare

    ic.fx_graph_cache = False
    ic.emulate_precision_casts = True  # Inductor rounds what eager rounds (a bias add before .float()), so
    # the emulation's bits are the compiled code's
    group = dist.group.WORLD
    found = []
    ops = _define_stack_ops()  # a stack's own all-reduce ops, as a stack registers them
    tpflare.register_all_reduce(ops.all_reduce, resolve_group={"tp:0": group}, all_gather=ops.all_gather)
    tpflare.register_all_reduce(ops.inplace_all_reduce, resolve_group=lambda name: group)
    with torch.no_grad(), _warnings():  # a process's first compile may warn once (an import, a lazy set-up)
        torch.compile(lambda t: t.relu() + 1, backend="inductor", fullgraph=True)(torch.ones(4))
    for index in range(cases):
        case = draw_case(seed, world, index)
        if case["gemm"] == "mm" and case["slice"] == "index_select":
            case["slice"] = "narrow"
        fn, wargs, emulation = _site(case, rank, world, group)
        tpflare.clear_report()
        torch._dynamo.reset()
        rec = dict(index=index, rank=rank, **case)
        try:
            with torch.no_grad(), tpflare.config.patch(latent_gather=True), _warnings() as ours:
                cf = torch.compile(fn, backend="tpflare", fullgraph=True, dynamic=case["dynamic"] or None)
                calls = [(rows, cf(_inputs(case, rank, rows, world), *wargs)) for rows in case["rows"]]
        except Exception as e:  # a crash counts where plain Inductor compiles the function
            torch._dynamo.reset()
            try:
                with torch.no_grad():
                    torch.compile(fn, backend="inductor", fullgraph=True)(_inputs(case, rank, case["rows"][0], world),
                                                                           *wargs)
                found.append(dict(rec, finding="crash", error=f"{type(e).__name__}: {e}"[:500],
                                  trace=traceback.format_exc()[-1500:]))
            except Exception as e2:
                found.append(dict(rec, finding="inductor fails too", error=f"{type(e2).__name__}: {e2}"[:300]))
            continue
        records = [r for r in tpflare.report() if r["kind"] == "latent_gather"]
        torch._dynamo.reset()
        with torch.no_grad(), _warnings() as theirs:
            plain = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=case["dynamic"] or None)
            plain_out = {rows: plain(_inputs(case, rank, rows, world), *wargs) for rows in case["rows"]}
        extra = sorted(set(ours) - set(theirs))
        if extra:  # (torch 2.13: "Raw SymInt value ... passed as argument", a rewrite's view of a size object)
            found.append(dict(rec, finding="a warning plain Inductor does not give", warnings=extra[:5]))
        decisions = collections.Counter(r["decision"] for r in records)
        rec["decisions"] = dict(decisions)
        rec["reasons"] = sorted({r.get("reason") or "" for r in records if r["decision"] == "skipped"})
        if not records:
            found.append(dict(rec, finding="no record for the site"))
            continue
        if any(r["decision"] == "skipped" and not r.get("reason") for r in records):
            found.append(dict(rec, finding="a skip without its reason"))
        for rows, y in calls:
            x = _inputs(case, rank, rows, world)
            with torch.no_grad():
                emul = emulation(x)
            same = same_everywhere(y)
            is_plain, is_emul = torch.equal(y, plain_out[rows]), torch.equal(y, emul)
            if decisions.get("rewritten") and not decisions.get("skipped"):
                ok = is_emul and same
            elif not decisions.get("rewritten"):
                ok = is_plain
            else:  # rewritten at one size, skipped at another (a guard: rows)
                ok = is_emul and same or is_plain
            if not ok:
                found.append(dict(rec, finding="bits", rows=rows, is_plain_inductor=is_plain, is_emulation=is_emul,
                                  same_on_every_rank=same))
        found.append(dict(rec, finding=None))
    dist.barrier()
    return found


def run(world: int, cases: int, seed: int, timeout: float) -> dict:
    from tpflare.testing import run_ranks

    t0 = time.time()
    per_rank = run_ranks(rank_cases, world, (seed, cases), timeout=timeout)
    findings = [f for r in per_rank for f in r if f["finding"]]
    seen = [f for f in per_rank[0] if not f["finding"]]
    decisions = collections.Counter()
    for f in seen:
        decisions["rewritten" if f["decisions"].get("rewritten") else "skipped"] += 1
    reasons = collections.Counter(why.split(":")[0][:60] for f in seen for why in f["reasons"])
    keys = ("index", "slice", "gemm", "reduce", "bias", "post", "dtype", "rows", "n", "replicated", "dynamic",
            "decisions", "reasons")
    return dict(world=world, cases=cases, seed=seed, torch=torch.__version__, seconds=round(time.time() - t0, 1),
                sites=dict(decisions), skip_reasons=dict(reasons.most_common()), findings=findings,
                cases_seen=[{k: f[k] for k in keys} for f in seen])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", help="write the summary (JSON) here")
    a = ap.parse_args(argv)
    res = run(a.world, a.cases, a.seed, a.timeout)
    for f in res["findings"][:20]:
        print("FINDING", {k: v for k, v in f.items() if k != "trace"})
    print(json.dumps({k: v for k, v in res.items() if k != "findings"}, indent=1))
    print(f"{a.cases} cases at W={a.world} in {res['seconds']} s; {len(res['findings'])} findings")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
