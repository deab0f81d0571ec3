"""Programmatic dependent launch in the kernels (docs/design.md, "Programmatic dependent
launch").

A kernel compiled with ``pdl`` may start while the grid before it on the stream is still
running. It first issues the loads of what that grid cannot have written (its slots and index
tables, the state, ``A_log`` and ``dt_bias``, the conv state's window, the conv and norm
weights), then :func:`wait_for_producer`, then reads its inputs (q, k, v, a, b, z: what the
producer writes) and writes anything at all.
"""

from __future__ import annotations

import cutlass.cute as cute


def wait_for_producer(pdl: bool) -> None:
    """With ``pdl``: wait until the grid before this one has completed and its writes are
    visible, then let the grid after this one start. It is released only after the wait, so
    that while its loads before its own wait run, no grid but this one is still running: what
    this kernel writes, it writes after its wait. Without ``pdl``, nothing (the kernel is the
    one compiled before PDL existed)."""
    if pdl:
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
