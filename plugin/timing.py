"""The one way tpflare times a call: barrier (for collectives), then CUDA events on GPU
or ``perf_counter`` on CPU.  Used by the race, the demo and the benches."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def time_once_ms(fn: Callable[[], Any], device: torch.device, group: Any = None,
                 barrier: bool = True) -> float:
    """Milliseconds of one ``fn()``; with ``barrier``, every rank of ``group`` starts together."""
    if barrier:
        import torch.distributed as dist

        dist.barrier(group=group)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def median_ms(fn: Callable[[], Any], warmup: int, iters: int, device: torch.device,
              before: Callable[[], Any] | None = None, group: Any = None, barrier: bool = True) -> float:
    """Median ms per call: ``warmup`` untimed calls, then ``iters`` timed ones
    (``before()``, untimed, runs ahead of each call)."""
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        times.append(time_once_ms(fn, device, group, barrier))
    return statistics.median(times)
