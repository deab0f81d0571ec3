"""A quantized state's later row passes, copied into shared memory as the kernel starts
(docs/design.md, "Row passes in the stepwise solve", the knob async_tiles).

A pass kernel loads pass p + 1's tile into registers after pass p (or, with prefetch, during
it, for a second register tile); either way a lane has one pass's bytes in flight at a time,
and the registers a tile holds cap the warps an SM keeps. Here every lane copies its rows of
every later pass, values and scales, from global to shared memory with ``cp.async`` before its
first token, one commit group a pass, and reads pass p's from there once its group has
landed. Each lane copies and reads only its own bytes, so no barrier is needed: ``cp.async.
wait_group`` orders a thread's copies before its own later reads.

Shared memory holds ``ROW_PASSES - 1`` tiles a lane, laid out so that a warp's reads of one
row are consecutive (lane-major per row: a row's ``VEC`` bytes of each lane side by side) and
its scales likewise (a lane's ``ILP`` scales side by side, lanes one after another).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


def ahead_tiles(smem, passes_ahead: int, ilp: int, vec: int, threads: int):
    """Shared memory for ``passes_ahead`` tiles of every lane of the CTA: ``(words, scales)``,
    words ``(pass, row, lane, word)`` of a tile's 8-bit values, four a word, and scales
    ``(pass, lane, row)``."""
    words = vec // 4
    tiles = smem.allocate_tensor(
        Int32,
        cute.make_layout(
            (passes_ahead, ilp, threads, words),
            stride=(ilp * threads * words, threads * words, words, 1),
        ),
        16,
    )
    scales = smem.allocate_tensor(
        Float32,
        cute.make_layout((passes_ahead, threads, ilp), stride=(threads * ilp, ilp, 1)),
        16,
    )
    return tiles, scales


@cute.jit
def copy_tile_async(
    tiles: cute.Tensor,
    scales: cute.Tensor,
    ahead,
    tidx,
    src: cute.Tensor,
    scale_rows: cute.Tensor,
    first_row,
    ilp: cutlass.Constexpr[int],
    vec: cutlass.Constexpr[int],
):
    """Start copying the lane's ``(ilp, vec)`` tile ``src`` of 8-bit values and its rows' scales
    (rows ``first_row ..`` of ``scale_rows``) into slot ``ahead`` of :func:`ahead_tiles`'s
    ``tiles`` and ``scales``: one ``cp.async`` a row and one a scale, not yet committed."""
    rows = cute.make_tensor(src.iterator, cute.flatten(src.layout))
    for i in cutlass.range_constexpr(ilp):
        row = src.iterator + cute.crd2idx((i, 0), rows.layout)
        dst = tiles.iterator + cute.crd2idx((ahead, i, tidx, 0), tiles.layout)
        _copy_async(dst.toint(), row.toint(), vec)
        scale = scale_rows.iterator + cute.crd2idx(first_row + i, scale_rows.layout)
        scale_dst = scales.iterator + cute.crd2idx((ahead, tidx, i), scales.layout)
        _copy_async(scale_dst.toint(), scale.toint(), 4)


@cute.jit
def read_tile(
    raw: cute.Tensor,
    raw_scales: cute.Tensor,
    tiles: cute.Tensor,
    scales: cute.Tensor,
    ahead,
    tidx,
    ilp: cutlass.Constexpr[int],
):
    """The raw tile ``raw`` (a word tile, ``(ilp, vec / 4)``) and ``raw_scales`` = slot
    ``ahead`` of the lane's copies, which must have landed (``cp.async.wait_group``)."""
    for i in cutlass.range_constexpr(ilp):
        raw[i, None].store(tiles[ahead, i, tidx, None].load())
    raw_scales.store(scales[ahead, tidx, None].load())


@dsl_user_op
def _copy_async(dst, src, size: int, *, loc=None, ip=None) -> None:
    """``cp.async`` of ``size`` bytes (4, 8 or 16) from the global address ``src`` to the shared
    address ``dst``; 16 bytes bypass L1 (``.cg``), the state being read once."""
    cache = "cg" if size == 16 else "ca"
    llvm.inline_asm(
        None,
        [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .u64 g;\n\tcvta.to.global.u64 g, $1;\n\t"
        f"cp.async.{cache}.shared.global [$0], [g], {size};\n\t}}",
        "r,l", has_side_effects=True, loc=loc, ip=ip,
    )  # fmt: skip
