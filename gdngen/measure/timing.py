"""Timing on the GPU as docs/design.md ("Measuring") prescribes.

A cell is timed as a CUDA graph of back-to-back calls over rotating input sets whose total size
is at least 4x the L2 cache (so no call finds its state in cache, and launch gaps are out), and
reported as the median over replays of (replay time / calls per replay). Implementations
compared in a cell are timed side by side: their replays interleaved, after one shared warm-up.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

import torch

COPY_BYTES = 1 << 30


def _event_ms(run: Callable[[], None], repeats: int) -> list[float]:
    """Milliseconds of each of ``repeats`` back-to-back runs, by CUDA events."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    events[0].record()
    for index in range(repeats):
        run()
        events[index + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(repeats)]


def copy_bandwidth(repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    ms = statistics.median(_event_ms(lambda: dst.copy_(src), repeats))
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
#: timed replays of one entry are spread over this many rounds (see time_side_by_side)
ROUNDS = 5


def _capture(calls: list[Callable[[], None]]) -> torch.cuda.CUDAGraph:
    """One CUDA graph of ``calls`` in order, after one eager pass (compiles and per-shape set-up
    stay out of the graph)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return graph


def time_side_by_side(
    runs: Mapping[str, list[Callable[[], None]]],
    *,
    replays: int = 25,
    rounds: int = ROUNDS,
    warmup: int = 3,
) -> dict[str, float]:
    """Microseconds per call of each entry of ``runs``, timed interleaved.

    Each entry is one CUDA graph of its calls. After a shared warm-up (round-robin replays for at
    least WARMUP_SECONDS and ``warmup`` replays of each), the timed replays are spread over
    ``rounds`` rounds that visit every entry once, starting one entry later each round: clock and
    thermal drift during a cell then lands on every entry alike, so entries timed side by side
    compare within the cell's noise, not the drift between two separate timings. An entry's time
    is the median over all its replays of (replay time / calls in its graph).
    """
    names = list(runs)
    graphs = {name: _capture(runs[name]) for name in names}
    started = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - started < WARMUP_SECONDS:
        for name in names:
            graphs[name].replay()
        torch.cuda.synchronize()
        done += 1
    per_round = max(1, -(-replays // rounds))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name] += _event_ms(graphs[name].replay, per_round)
    del graphs
    return {name: statistics.median(samples[name]) * 1e3 / len(runs[name]) for name in names}
