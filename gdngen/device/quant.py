"""A quantized state's rows as the kernels load and store them (docs/design.md, "Quantized
state"): int8 or fp8 e4m3 values ``[.., V, K]`` with one fp32 scale per row, ``state_scales
[.., V]``; the format is the pool's element type, a trace-time constant.

A row is loaded as it is, four values a word, dequantized at its first use (``value * scale``)
and computed with in fp32 like any state; it is quantized once, where it is stored: its scale is
the row's amax over its K values divided by the format's largest value, 127 or 448 (1 for an
all-zero row, so that nothing divides by 0), each value ``h / scale`` rounded to the format,
to nearest (ties to even). Those are ``gdngen.reference.state_formats``'s ``int8_row`` and
``fp8_e4m3_row``, the formats the drift record measured. A row's K values are spread over its
group's lanes, which reduce the amax with the butterfly of the group's other sums; one lane of
the group stores the scale.

Both directions are written for instruction issue, which bound the first int8 kernels, not
bytes (docs/perf/h200-2026-11-28-int8-tune.md):

- the values stay packed as loaded, four a word (:func:`packed_words`: as 8-bit elements,
  each was unpacked into a register of its own at the load, and packed again for the
  conversion); an int8 value is dequantized by one I2F that selects its byte
  (``cvt.rn.f32.s32`` of ``bfe.s32``) and a multiply by its row's scale;
- an int8 value is quantized without a conversion instruction, through the float ``MAGIC`` =
  1.5 * 2^23, whose ulp is 1 and whose low mantissa byte is 0: ``fma(h, 1 / scale, MAGIC)``
  rounds ``h / scale`` to the nearest integer (ties to even, one rounding of the exact product)
  into the low mantissa bits, whose low byte is then the two's complement int8 (``|h / scale| <=
  127`` by the scale's definition, so nothing saturates); three byte permutes pack four of them
  into a word;
- the row's amax is one FMNMX a value (the absolute value is its operand modifier);
- an fp8 e4m3 value is converted by the SM's own instructions (sm_89 and later): two values to
  two halves (``cvt.rn.f16x2.e4m3x2``) and each half to fp32 as loaded; two fp32 values to two
  e4m3 (``cvt.rn.satfinite.e4m3x2.f32``) as stored.

A kernel that solves one token (T = 1, the stepwise solve) keeps its tile in units of its rows'
scales instead: h[i, :] is ``units[i] * t[i, :]``, t the values as loaded (one I2F each, no
multiply). The dots take t and multiply their sums by ``units``, the update ``h' = g h + c k``
becomes ``t += (c / units') k`` with ``units' = g units`` (a row's multiply, not a value's), and
the store quantizes t against its own amax: ``round(t * MAX / amax(t))``, scale ``units' *
amax(t) / MAX``. That is the same row as ``round(h' / (amax(h') / MAX))`` but for rounding, with
one multiply a value fewer on each side (:data:`UNITS_FLOOR` bounds ``units'`` from below).

Dequantizing through MAGIC as well (a byte permute, an add and a multiply a value) timed 5%
slower at B = 512, HV = 64, T = 1 than the I2F; an I2F and a float-to-int conversion a value
each way, the values unpacked, took 1.34-1.41x as long.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int8, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from gdngen.terms import SCALED_STATE_MAX

#: The least ``units`` of a row kept in units of its scale. ``g * units`` is 0 where the gate
#: underflowed (exp(-400), say) or the row is all zeros, and ``c / units`` would be infinite.
#: Clamped to 2^-64, a row keeps ``2^-64 * t`` of a smaller decay: at most 127 * 2^-64 (448 *
#: 2^-64 for e4m3), about 1e-17, off each value. ``c * k`` may then reach 2^128 / 2^64, about
#: 1.8e19, before ``c / units * k`` overflows.
UNITS_FLOOR = 2.0**-64
#: fp32's smallest normal value, 2^-126
SMALLEST_NORMAL = 2.0**-126


@cute.jit
def load_scaled_rows(
    h: cute.Tensor,
    src: cute.Tensor,
    scale_rows: cute.Tensor,
    first_row,
    ilp: cutlass.Constexpr[int],
    vec: cutlass.Constexpr[int],
):
    """h (the lane's ``(ilp, vec)`` fp32 tile) = the quantized tile ``src`` times its rows'
    scales, rows ``first_row ..`` of ``scale_rows`` (one head's ``[V]`` scales)."""
    scales = cute.make_rmem_tensor((ilp,), Float32)
    load_row_scales(scales, scale_rows, first_row, ilp)
    dequantize_rows(h, packed_words(src), scales, ilp, vec, src.element_type)


def word_tile(ilp: int, vec: int) -> cute.Tensor:
    """A lane's ``(ilp, vec)`` tile of 8-bit values in registers, as :func:`packed_words` has
    it: ``(ilp, vec / 4)`` words, row-major (uninitialised)."""
    return cute.make_rmem_tensor(cute.make_layout((ilp, vec // 4), stride=(vec // 4, 1)), Int32)


def packed_words(tile: cute.Tensor) -> cute.Tensor:
    """An ``(ilp, vec)`` tile of 8-bit values (its rows' values contiguous) as ``(ilp, vec / 4)``
    words: loaded and stored so, the values stay packed in registers as they came, four a word
    (as 8-bit elements, each would be unpacked into a register of its own at the load)."""
    return cute.recast_tensor(tile, Int32)


@cute.jit
def load_row_scales(
    scales: cute.Tensor, scale_rows: cute.Tensor, first_row, ilp: cutlass.Constexpr[int]
):
    """``scales`` (``ilp`` fp32 registers) = rows ``first_row ..`` of ``scale_rows``."""
    for i in cutlass.range_constexpr(ilp):
        scales[i] = Float32(scale_rows[first_row + i])


@cute.jit
def dequantize_rows(
    h: cute.Tensor,
    words: cute.Tensor,
    scales: cute.Tensor,
    ilp: cutlass.Constexpr[int],
    vec: cutlass.Constexpr[int],
    fmt: cutlass.Constexpr,
):
    """h (the lane's ``(ilp, vec)`` fp32 tile) = the tile ``words`` (:func:`packed_words`, in
    registers or where it is loaded from) of format ``fmt`` (Int8 or Float8E4M3FN) times
    ``scales``, one a row; with ``scales`` None, the values as they are (a tile kept in units
    of its rows' scales)."""
    held = word_tile(ilp, vec)
    held.store(words.load())
    for i in cutlass.range_constexpr(ilp):
        for w in cutlass.range_constexpr(vec // 4):
            for byte in cutlass.range_constexpr(4):
                if cutlass.const_expr(fmt is Int8):
                    value = _signed_byte(held[i, w], byte)
                else:
                    value = _e4m3_byte(held[i, w], byte)
                if cutlass.const_expr(scales is None):
                    h[i, 4 * w + byte] = value
                else:
                    h[i, 4 * w + byte] = value * scales[i]


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
    units=None,
):
    """Quantize the lane's ``(ilp, vec)`` fp32 tile h into the tile ``dst`` (int8 or fp8 e4m3,
    its element type), each row with its group's scale; the lane where ``writer`` holds stores
    the rows' scales into ``scale_rows[first_row ..]``. Every lane of the group must take part
    (the butterfly). With ``units`` (``ilp`` registers), row i of the tile is ``units[i] *
    h[i, :]`` (a tile kept in units of its rows' scales)."""
    words = word_tile(ilp, vec)
    scales = cute.make_rmem_tensor((ilp,), Float32)
    quantize_rows(h, words, scales, ilp, vec, butterfly, dst.element_type, units)
    store_quantized_rows(words, scales, dst, scale_rows, first_row, writer, ilp)


@cute.jit
def quantize_rows(
    h: cute.Tensor,
    words: cute.Tensor,
    scales: cute.Tensor,
    ilp: cutlass.Constexpr[int],
    vec: cutlass.Constexpr[int],
    butterfly: cutlass.Constexpr,
    fmt: cutlass.Constexpr,
    units=None,
):
    """``words`` (a :func:`word_tile`) and ``scales`` (``ilp`` fp32 registers) = the lane's
    ``(ilp, vec)`` fp32 tile h quantized to format ``fmt`` (Int8 or Float8E4M3FN), each row
    with its group's scale, as :func:`store_scaled_rows` stores it. Every lane of the group
    must take part (the butterfly). Apart from the store, it serves where the tile is quantized
    ahead of its store's branch (the compilers do not schedule across one): each token's, in
    the late-stores kernels (docs/design.md, "Late stores"), and the final state's."""
    is_int8 = fmt is Int8
    largest = SCALED_STATE_MAX["int8" if is_int8 else "fp8_e4m3"]
    for i in cutlass.range_constexpr(ilp):
        amax = Float32(0.0)
        for j in cutlass.range_constexpr(vec):
            amax = _max_abs(amax, h[i, j])
        for offset in butterfly:
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=offset))
        # No division: the approximate reciprocal (MUFU.RCP, within an ulp of 1 / amax) can
        # round h * inverse differently from h / scale only where that is within two ulps of a
        # tie, which moves the value by one step at most there. A row whose amax is below the
        # smallest normal float (which the reciprocal flushes to zero) stores as zeros.
        nonzero = amax >= Float32(SMALLEST_NORMAL)
        inverse = Float32(
            cutlass.select_(nonzero, largest * cute.arch.rcp_approx(amax), Float32(1.0))
        )
        if cutlass.const_expr(units is not None):
            amax = units[i] * amax
        scales[i] = Float32(cutlass.select_(nonzero, amax * (1.0 / largest), Float32(1.0)))
        for w in cutlass.range_constexpr(vec // 4):
            if cutlass.const_expr(is_int8):
                rounded = [_rounded_over_magic(h[i, 4 * w + byte], inverse) for byte in range(4)]
                words[i, w] = _low_bytes(*rounded)
            else:
                words[i, w] = _e4m3_word(*[h[i, 4 * w + byte] * inverse for byte in range(4)])


@cute.jit
def store_quantized_rows(
    words: cute.Tensor,
    scales: cute.Tensor,
    dst: cute.Tensor,
    scale_rows: cute.Tensor,
    first_row,
    writer,
    ilp: cutlass.Constexpr[int],
):
    """Store a tile :func:`quantize_rows` made into the tile ``dst``; the lane where ``writer``
    holds stores its rows' scales into ``scale_rows[first_row ..]``."""
    packed_words(dst).store(words.load())
    if writer:
        for i in cutlass.range_constexpr(ilp):
            scale_rows[first_row + i] = scales[i]


#: 1.5 * 2^23: a float whose ulp is 1 and whose low mantissa byte is 0
MAGIC = 12582912.0


@dsl_user_op
def _max_abs(amax, x, *, loc=None, ip=None):
    """max(amax, |x|) in one instruction (the abs is an operand modifier of FMNMX)."""
    value = llvm.inline_asm(
        Float32.mlir_type,
        [Float32(v).ir_value(loc=loc, ip=ip) for v in (amax, x)],
        "{\n\t.reg .f32 a;\n\tabs.f32 a, $2;\n\tmax.f32 $0, $1, a;\n\t}", "=f,f,f",
        has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Float32(value)


@dsl_user_op
def _signed_byte(word, byte: int, *, loc=None, ip=None):
    """Byte ``byte`` of ``word`` as a signed integer, in a float (PTX ``cvt.rn.f32.s8`` of the
    byte: one I2F with a byte selector)."""
    value = llvm.inline_asm(
        Float32.mlir_type,
        [Int32(word).ir_value(loc=loc, ip=ip)],
        f"{{\n\t.reg .b32 t;\n\tbfe.s32 t, $1, {8 * byte}, 8;\n\tcvt.rn.f32.s32 $0, t;\n\t}}",
        "=f,r", has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Float32(value)


@dsl_user_op
def _e4m3_byte(word, byte: int, *, loc=None, ip=None):
    """Byte ``byte`` of ``word`` as an e4m3 value, in a float: its pair of bytes to two halves
    (``cvt.rn.f16x2.e4m3x2``, exact), the one half to fp32 (exact). The two of a pair convert
    the same half word, which ptxas converts once."""
    value = llvm.inline_asm(
        Float32.mlir_type,
        [Int32(word).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b16 lo, hi;\n\t.reg .b32 pair;\n\t.reg .b16 a, b;\n\t"
        "mov.b32 {lo, hi}, $1;\n\t"
        f"cvt.rn.f16x2.e4m3x2 pair, {'lo' if byte < 2 else 'hi'};\n\t"
        "mov.b32 {a, b}, pair;\n\t"
        f"cvt.f32.f16 $0, {'a' if byte % 2 == 0 else 'b'};\n\t}}",
        "=f,r", has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Float32(value)


@dsl_user_op
def _e4m3_word(a, b, c, d, *, loc=None, ip=None):
    """Four fp32 values rounded to e4m3 (to nearest, ties to even, saturated to +-448) as one
    word, ``a`` in its lowest byte (``cvt.rn.satfinite.e4m3x2.f32`` puts its first operand in
    the upper byte)."""
    value = llvm.inline_asm(
        Int32.mlir_type,
        [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
        "{\n\t.reg .b16 lo, hi;\n\tcvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\tmov.b32 $0, {lo, hi};\n\t}",
        "=r,f,f,f,f", has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Int32(value)


@dsl_user_op
def _rounded_over_magic(x, inverse, *, loc=None, ip=None):
    """``MAGIC + x * inverse`` rounded once (PTX ``fma.rn.f32``): ``x * inverse`` rounded to the
    nearest integer, ties to even, in the float's low mantissa bits."""
    value = llvm.inline_asm(
        Float32.mlir_type,
        [Float32(v).ir_value(loc=loc, ip=ip) for v in (x, inverse, MAGIC)],
        "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Float32(value)


@dsl_user_op
def _low_bytes(a, b, c, d, *, loc=None, ip=None):
    """The low bytes of four 32-bit values (floats' bits) as one word, ``a``'s lowest (PTX
    ``prmt``, three of them)."""
    value = llvm.inline_asm(
        Int32.mlir_type,
        [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
        "{\n\t.reg .b32 lo, hi;\n\tprmt.b32 lo, $1, $2, 0x0040;\n\tprmt.b32 hi, $3, $4, 0x0040;"
        "\n\tprmt.b32 $0, lo, hi, 0x5410;\n\t}",
        "=r,f,f,f,f", has_side_effects=False, loc=loc, ip=ip,
    )  # fmt: skip
    return Int32(value)
