"""Timing on the GPU as DESIGN.md section 5 prescribes.

A cell is timed as a CUDA graph of back-to-back calls over rotating input sets whose total size
is at least 4x the L2 cache (so no call finds its state in cache, and launch gaps are out), and
reported as the median over replays of (replay time / calls per replay).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

COPY_BYTES = 1 << 30


def _median_event_ms(run: Callable[[], None], repeats: int) -> float:
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def copy_bandwidth(repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    ms = _median_event_ms(lambda: dst.copy_(src), repeats)
    del src, dst
    return 2 * COPY_BYTES / (ms * 1e-3)


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 << 20))


def rotating_sets(set_bytes: int, *, minimum: int = 2, maximum: int = 256) -> int:
    """How many input sets make at least 4x L2 together."""
    need = -(-4 * l2_bytes() // max(set_bytes, 1))
    return max(minimum, min(maximum, need))


#: graph replays before timing run for at least this long: after a compile the GPU has idled
#: and its clocks need tens of milliseconds to come back, longer than a few replays of a small cell
WARMUP_SECONDS = 0.25


def time_calls(calls: list[Callable[[], None]], *, replays: int = 25, warmup: int = 3) -> float:
    """Microseconds per call: median over graph replays of one pass over ``calls``, after at
    least ``warmup`` replays and WARMUP_SECONDS of them."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # eager warm-up: compiles and per-shape set-up stay out of the graph
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    started = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - started < WARMUP_SECONDS:
        graph.replay()
        torch.cuda.synchronize()
        done += 1
    ms = _median_event_ms(graph.replay, replays)
    del graph
    return ms * 1e3 / len(calls)
