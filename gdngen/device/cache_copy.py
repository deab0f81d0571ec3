"""Trace-time helpers of kernels whose state loads and stores carry cache operators.

A plain tensor ``load()`` / ``store()`` vectorises its global-memory access itself but takes no
cache operator. :func:`load_through` and :func:`store_through` do the same through a given copy
atom (one that carries ``ld.global.cs``, ``st.global.cs`` and the like), with the same register
staging as the plain calls, so that a 16-bit tile stays in registers.
"""

from __future__ import annotations

import cutlass.cute as cute


def _copy(atom, src, dst, vector: int) -> None:
    """``src`` -> ``dst`` through ``atom``, ``vector`` elements per instruction, over the largest
    layout both share contiguously (each vector is one instruction on both sides)."""
    common = cute.max_common_layout(src, dst)
    vectors = cute.make_layout(vector)
    cute.copy(
        atom,
        cute.logical_divide(cute.logical_divide(src, common), vectors),
        cute.logical_divide(cute.logical_divide(dst, common), vectors),
    )


def load_through(atom, src, vector: int):
    """``src.load()``, with ``atom``'s loads of ``vector`` elements."""
    staged = cute.make_rmem_tensor_like(src, src.element_type)
    _copy(atom, src, staged, vector)
    return staged.load()


def store_through(atom, data, dst, vector: int) -> None:
    """``dst.store(data)`` (``data`` in ``dst``'s dtype), with ``atom``'s stores of ``vector``
    elements. The register tile is filled element by element, as the plain store does: a whole
    16-bit vector stored into it would go through local memory."""
    staged = cute.make_rmem_tensor_like(dst, dst.element_type)
    for i in range(cute.size(staged)):
        staged[i] = data[i]
    _copy(atom, staged, dst, vector)
