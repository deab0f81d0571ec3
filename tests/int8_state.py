"""An int8 state pool for the tests, and the check of what a call left in it (docs/design.md,
"Quantized state").

A stored int8 row is within half its scale step of the exact state (round to nearest); the kernel
and the reference each round once, from fp32 and float64 states that differ by fp32 arithmetic,
so their dequantized rows are within half of each one's step, plus that arithmetic, of each
other. Their scales (amax / 127 of those states) agree to fp32 arithmetic.
"""

import torch

from gdngen.reference.state_formats import store

#: fp32 arithmetic over a few tokens of 128-term sums, relative to a row's amax
FP32_ROW_TOL = 2e-5


def int8_pool(args: dict) -> dict:
    """``args`` (gdn_decode's, with a pool) with its pool stored as int8 rows and their scales."""
    name = "initial_state" if args.get("initial_state") is not None else "state"
    stored = store(args[name].float(), "int8_row")
    return dict(args, **{name: stored.values.contiguous()}, state_scales=stored.scales.contiguous())


def assert_int8_pool(
    values, scales, expected_values, expected_scales, before_values, before_scales
):
    """The pool a call left (values int8, scales fp32) against the reference's, every slot: the
    slots the reference wrote within the rounding bound above, every other slot untouched."""
    written = ((expected_values != before_values).flatten(1).any(1)) | (
        (expected_scales != before_scales).flatten(1).any(1)
    )
    untouched = ~written
    assert torch.equal(values[untouched], before_values[untouched]), "a slot not written changed"
    assert torch.equal(scales[untouched], before_scales[untouched]), "a scale not written changed"
    if not written.any():
        return
    got_scale, ref_scale = scales[written].double(), expected_scales[written].double()
    assert torch.allclose(got_scale, ref_scale, rtol=FP32_ROW_TOL, atol=0), (
        f"scales: max relative difference "
        f"{float(((got_scale - ref_scale).abs() / ref_scale).max()):.3g}"
    )
    got = values[written].double() * got_scale[..., None]
    ref = expected_values[written].double() * ref_scale[..., None]
    bound = 0.5 * (got_scale + ref_scale)[..., None] + FP32_ROW_TOL * 127 * ref_scale[..., None]
    worst = float(((got - ref).abs() - bound).max())
    assert worst <= 0, f"state: a value is {worst:.3g} past half of both rounding steps"
