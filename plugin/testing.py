"""Run a function on W local processes joined by a gloo group (tests, benches, demo).

``run_ranks(fn, world)`` starts one process per rank, initialises
``torch.distributed`` (gloo on CPU by default, NCCL if ``backend="nccl"``),
calls ``fn(rank, world, *args)`` and returns every rank's return value in rank
order.  It never hangs: a rank that raises makes the call raise (with that
rank's traceback) after the others are stopped, and the whole run is killed at
``timeout`` seconds.  ``fn`` must be importable (a module-level function) and
return plain picklable values: a tensor cannot be returned (its storage would
travel as a file descriptor of a process that has already exited); return
``t.tolist()`` or a comparison result instead.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence


class RankFailure(RuntimeError):
    pass


def _child(fn, rank, world, args, init_file, backend, env, q) -> None:
    try:
        os.environ.clear()  # the caller's environment at the call, as a spawned process starts with
        os.environ.update({k: str(v) for k, v in env.items()})
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=float(os.environ.get("TPFLARE_TEST_PG_TIMEOUT", "120"))),
        )
        try:
            out = fn(rank, world, *args)
        finally:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        q.put((rank, "ok", out))
    except BaseException as e:  # reported to the parent
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# Environment variables that ``import torch`` may read (TORCH_LOGS, TORCH_TRACE, OpenMP, CUDA,
# the loader): a rank forked from the server sees torch as imported under the server's values.
# Only the caller's own environment counts: ``env`` / ``rank_env`` are applied in the rank after
# torch is imported, with spawn as well (unpickling the rank's function imports tpflare, torch).
_IMPORT_ENV = ("TORCH", "PYTORCH", "OMP_", "MKL", "KMP_", "GOMP_", "CUDA", "LD_", "PYTHON")
_server_env: dict[str, str] | None = None


def _import_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_IMPORT_ENV)}


def _context():
    """Forkserver with torch preloaded (a rank then starts without importing torch: about a
    third of a small multi-rank test on 2 CPU cores) where the environment that ``import
    torch`` reads is what it was when this process first started the server; spawn otherwise,
    and where there is no forkserver."""
    global _server_env
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    if _server_env is None:
        _server_env = _import_env()
    elif _import_env() != _server_env:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    return ctx


def run_ranks(
    fn: Callable[..., Any],
    world: int,
    args: Sequence[Any] = (),
    *,
    timeout: float = 180.0,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
    rank_env: dict[int, dict[str, str]] | None = None,
    grace: float = 20.0,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` processes; results in rank order."""
    ctx = _context()
    q = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="tpflare_pg_")
    os.close(fd)
    os.unlink(init_file)
    procs = []
    for r in range(world):
        e = dict(os.environ)
        e.update(env or {})
        e.update((rank_env or {}).get(r, {}))
        p = ctx.Process(target=_child, args=(fn, r, world, tuple(args), init_file, backend, e, q),
                        daemon=True)
        p.start()
        procs.append(p)
    results: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    first_error_at = None
    try:
        while len(results) < world:
            now = time.monotonic()
            limit = deadline if first_error_at is None else min(deadline, first_error_at + grace)
            if now >= limit:
                break
            try:
                rank, status, payload = q.get(timeout=min(1.0, limit - now))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if not p.is_alive() and i not in results
                        and p.exitcode not in (0, None)]
                if dead and first_error_at is None:
                    first_error_at = time.monotonic()
                    for i in dead:
                        results[i] = ("error", f"process exited with code {procs[i].exitcode}")
                continue
            results[rank] = (status, payload)
            if status == "error" and first_error_at is None:
                first_error_at = time.monotonic()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        try:
            os.unlink(init_file)
        except OSError:
            pass
    errors = {r: v for r, (s, v) in results.items() if s == "error"}
    missing = [r for r in range(world) if r not in results]
    if errors or missing:
        parts = [f"--- rank {r} ---\n{msg}" for r, msg in sorted(errors.items())]
        if missing:
            parts.append(f"ranks {missing} did not finish within the limit "
                         f"({timeout:.0f}s, or {grace:.0f}s after another rank failed) and were killed")
        raise RankFailure("\n".join(parts))
    return [results[r][1] for r in range(world)]
