"""Programmatic dependent launch in the kernels (docs/design.md, "Programmatic dependent
launch").

A kernel compiled with ``pdl`` may start while the grid before it on the stream is still
running. Its first CTAs issue the loads of what that grid cannot have written (slots and index
tables, the state, ``A_log`` and ``dt_bias``, the conv state's window, the conv and norm
weights) and then wait for that grid (:func:`wait_for_producer`); the others wait at their start
(:func:`wait_at_start`). After its wait a CTA reads its inputs (q, k, v, a, b, z: what the
producer writes) and may write. Every CTA waits exactly once.

Why two places: ``griddepcontrol.wait`` returns only once the thread's loads issued before it
have arrived, so a CTA that loads its state before it pays that round trip again for its inputs.
That buys overlap only for the CTAs that start while the grid before is still running, the
first wave; a CTA of a later wave starts after the grid before has long finished, so it waits
first, where the wait costs nothing, and issues every load together (on an H100, fp32 state at
B = 4: 10.6 µs against 12.0 µs with every CTA waiting after its state loads, and 11.3 µs
without PDL; docs/perf/h100-2026-11-28-pdl.md).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr

#: CTAs counted as the first wave: two on each SM of an H100 (132 SMs). Any number is correct
#: (each CTA waits once, before its inputs); this one decides only where the wait pays
FIRST_WAVE_CTAS = 264


def _in_first_wave():
    x, y, z = cute.arch.block_idx()
    grid_x, grid_y, _ = cute.arch.grid_dim()
    return x + grid_x * (y + grid_y * z) < FIRST_WAVE_CTAS


@cute.jit
def wait_at_start(pdl: Constexpr[bool]):
    """With ``pdl``, at the kernel's start: a CTA past the first wave waits for the grid
    before here, before any load."""
    if cutlass.const_expr(pdl):
        if not _in_first_wave():
            cute.arch.griddepcontrol_wait()


@cute.jit
def wait_for_producer(pdl: Constexpr[bool]):
    """With ``pdl``, after the loads of what the grid before cannot have written: a CTA of the
    first wave waits for that grid to complete with its writes visible; then every CTA lets the
    grid after this one start. It is released only after every CTA's wait, so that while the
    next grid's loads before its own wait run, no grid but this one is still running. Without
    ``pdl``, nothing (the kernel is the one compiled before PDL existed)."""
    if cutlass.const_expr(pdl):
        if _in_first_wave():
            cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
