"""A quantized state's rows as the kernels load and store them (docs/design.md, "Quantized
state"): int8 values ``[.., V, K]`` with one fp32 scale per row, ``state_scales [.., V]``.

A row is dequantized as it is loaded (``value * scale``) and computed with in fp32 like any
state; it is quantized once, where it is stored: its scale is the row's amax over its K values
divided by 127 (1 for an all-zero row, so that nothing divides by 0), each value rounded to the
nearest integer of ``h / scale`` (ties to even) and saturated to [-127, 127]. That is
``gdngen.reference.state_formats``'s ``int8_row``, the format the drift record measured. A row's
K values are spread over its group's lanes, which reduce the amax with the butterfly of the
group's other sums; one lane of the group stores the scale.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int8, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

INT8_MAX = 127.0


@cute.jit
def load_scaled_rows(
    h: cute.Tensor,
    src: cute.Tensor,
    scale_rows: cute.Tensor,
    first_row,
    ilp: cutlass.Constexpr[int],
    vec: cutlass.Constexpr[int],
):
    """h (the lane's ``(ilp, vec)`` fp32 tile) = the int8 tile ``src`` times its rows' scales,
    rows ``first_row ..`` of ``scale_rows`` (one head's ``[V]`` scales)."""
    h.store(src.load().to(Float32))
    for i in cutlass.range_constexpr(ilp):
        scale = Float32(scale_rows[first_row + i])
        for j in cutlass.range_constexpr(vec):
            h[i, j] = h[i, j] * scale


@cute.jit
def store_scaled_rows(
    h: cute.Tensor,
    dst: cute.Tensor,
    scale_rows: cute.Tensor,
    first_row,
    writer,
    ilp: cutlass.Constexpr[int],
    vec: cutlass.Constexpr[int],
    butterfly: cutlass.Constexpr,
):
    """Quantize the lane's ``(ilp, vec)`` fp32 tile h into the int8 tile ``dst``, each row with
    its group's scale; the lane where ``writer`` holds stores the rows' scales into
    ``scale_rows[first_row ..]``. Every lane of the group must take part (the butterfly)."""
    quantized = cute.make_rmem_tensor(h.layout, Int8)
    for i in cutlass.range_constexpr(ilp):
        amax = Float32(0.0)
        for j in cutlass.range_constexpr(vec):
            amax = cutlass.max(amax, cutlass.max(h[i, j], -h[i, j]))
        for offset in butterfly:
            amax = cutlass.max(amax, cute.arch.shuffle_sync_bfly(amax, offset=offset))
        scale = Float32(
            cutlass.select_(amax > Float32(0.0), amax / Float32(INT8_MAX), Float32(1.0))
        )
        # One division a row; x * (1 / scale) can round differently from x / scale only where
        # x / scale is within an ulp of a tie, which moves the value by one step at most there.
        inverse = Float32(1.0) / scale
        for j in cutlass.range_constexpr(vec):
            quantized[i, j] = Int8(_round_to_int8(h[i, j] * inverse))
        if writer:
            scale_rows[first_row + i] = scale
    dst.store(quantized.load())


@dsl_user_op
def _round_to_int8(x, *, loc=None, ip=None):
    """``x`` rounded to the nearest integer (ties to even), saturated to [-128, 127], as an
    Int32 (PTX ``cvt.rni.sat.s8.f32``, its 8-bit result sign-extended in a 32-bit register)."""
    value = llvm.inline_asm(
        Int32.mlir_type, [Float32(x).ir_value(loc=loc, ip=ip)], "cvt.rni.sat.s8.f32 $0, $1;",
        "=r,f", has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Int32(value)
