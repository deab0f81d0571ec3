"""A quantized (int8 or fp8 e4m3) state pool for the tests, and the check of what a call left in
it (docs/design.md, "Quantized state").

A stored row is within half its format's step of the exact state (round to nearest); the kernel
and the reference each round once, from fp32 and float64 states that differ by fp32 arithmetic,
so their dequantized rows are within half of each one's step, plus that arithmetic, of each
other. An int8 step is the row's scale; an e4m3 step is 2^-3 of the value (3 mantissa bits), so
half of it at most 2^-4 of the value, and 2^-9 scales among the subnormals near zero. Their
scales (amax over the format's largest value, of those states) agree to fp32 arithmetic.
"""

import torch

from gdngen.problem import verify_cache
from gdngen.reference.state_formats import store
from gdngen.runtime.pool_checks import STATE_DTYPES
from gdngen.terms import SCALED_STATE_FORMATS, SCALED_STATE_MAX

#: fp32 arithmetic over a few tokens of 128-term sums, relative to a row's amax
FP32_ROW_TOL = 2e-5


def quantized_pool(args: dict, state_dtype: str = "int8") -> dict:
    """``args`` (gdn_decode's, with a pool) with its pool stored in ``state_dtype`` (int8 or
    fp8_e4m3) rows and their scales; a verify cache in its args becomes one in that format,
    with its scales (gdngen.problem.verify_cache: poisoned)."""
    name = "initial_state" if args.get("initial_state") is not None else "state"
    stored = store(args[name].float(), SCALED_STATE_FORMATS[state_dtype])
    pool = stored.values.contiguous()
    quantized = dict(args, **{name: pool}, state_scales=stored.scales.contiguous())
    cache = args.get("intermediate_states_buffer")
    if cache is not None:
        quantized.update(verify_cache(tuple(cache.shape), pool))
    return quantized


def _half_steps(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Half of each stored value's rounding step, in the state's units (float64)."""
    if values.dtype == torch.int8:
        return 0.5 * scale.expand(values.shape)
    units = values.double().abs()
    return (2.0**-4 * units + 2.0**-10) * scale


def assert_quantized_pool(
    values, scales, expected_values, expected_scales, before_values, before_scales
):
    """The pool a call left (values int8 or fp8, scales fp32) against the reference's, every
    slot: the slots the reference wrote within the rounding bound above, every other slot
    untouched."""
    written = ((expected_values.view(torch.int8) != before_values.view(torch.int8)).flatten(1)).any(
        1
    ) | ((expected_scales != before_scales).flatten(1).any(1))
    untouched = ~written
    assert torch.equal(
        values[untouched].view(torch.int8), before_values[untouched].view(torch.int8)
    ), "a slot not written changed"
    assert torch.equal(scales[untouched], before_scales[untouched]), "a scale not written changed"
    if not written.any():
        return
    got_scale, ref_scale = scales[written].double(), expected_scales[written].double()
    assert torch.allclose(got_scale, ref_scale, rtol=FP32_ROW_TOL, atol=0), (
        f"scales: max relative difference "
        f"{float(((got_scale - ref_scale).abs() / ref_scale).max()):.3g}"
    )
    got_values, ref_values = values[written], expected_values[written]
    got = got_values.double() * got_scale[..., None]
    ref = ref_values.double() * ref_scale[..., None]
    top = SCALED_STATE_MAX[STATE_DTYPES[values.dtype]]
    bound = (
        _half_steps(got_values, got_scale[..., None])
        + _half_steps(ref_values, ref_scale[..., None])
        + FP32_ROW_TOL * top * ref_scale[..., None]
    )
    worst = float(((got - ref).abs() - bound).max())
    assert worst <= 0, f"state: a value is {worst:.3g} past half of both rounding steps"
