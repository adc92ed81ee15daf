"""The one way tpflare times a call: barrier (for collectives), then CUDA events on GPU
or ``perf_counter`` on CPU.  Used by the race, the demo and the benches.
``capture_graph`` turns a call into a CUDA graph whose ``replay`` can be timed the same way."""
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


def capture_graph(fn: Callable[[], Any], warmup: int = 1) -> "torch.cuda.CUDAGraph":
    """A ``torch.cuda.CUDAGraph`` of one ``fn()`` on the current device.

    ``warmup`` (at least 1) eager calls run first on a side stream, as torch requires
    (lazy initialisation must not happen under capture).  The outputs are not kept:
    replays write them into the graph's private pool, which ``release_graph`` frees.  A
    failed capture is reset (and the current stream restored) before the error propagates.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    stream = torch.cuda.current_stream()
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except BaseException:
        torch.cuda.set_stream(stream)      # a failed capture_end skips restoring it
        graph.reset()
        raise
    return graph


def release_graph(graph: "torch.cuda.CUDAGraph", device: torch.device | None = None) -> None:
    """Wait for the graph's replays on ``device``, then free it and its memory pool."""
    torch.cuda.synchronize(device)
    graph.reset()
