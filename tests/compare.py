"""Error measures and tolerances shared by the tests.

Tolerances follow from the dtype a value is stored in: the kernels compute in fp32 and round once
on store, so a stored bf16 value is within half an ulp (2^-9 relative) of the exact result, plus
fp32 rounding (~1e-6) carried from the arithmetic. fp16 has 2^-11; fp32 storage leaves only the
fp32 arithmetic (sums of 128 products, a few tokens deep).
"""

import torch

#: bound on ||x - ref|| / ||ref|| for values stored in each dtype
NORM_TOL = {torch.bfloat16: 2**-8, torch.float16: 2**-10, torch.float32: 2e-5}
#: bound on max|x - ref| / max|ref| (one rounding of the largest element, with margin)
MAX_TOL = {torch.bfloat16: 2**-7, torch.float16: 2**-9, torch.float32: 1e-4}


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def assert_close(
    name: str,
    x: torch.Tensor,
    ref: torch.Tensor,
    stored_dtype: torch.dtype,
    inputs_rounded_to: torch.dtype | None = None,
) -> None:
    """``inputs_rounded_to``: the kernel rounded its own inputs (the conv step's workspace) from
    fp32 values that the reference computed in float64 and rounded the same way. Near a rounding
    boundary the two may land one ulp apart, so one element of the result may be off by about
    that ulp of an input: the max-abs bound is that dtype's where it is looser than the stored
    one's. The norm bound stays the stored dtype's (such elements are rare)."""
    assert x.shape == ref.shape, f"{name}: shape {tuple(x.shape)} != {tuple(ref.shape)}"
    if ref.numel() == 0:
        return
    xd = x.double()
    assert not torch.isnan(xd).any(), f"{name}: NaN in {int(torch.isnan(xd).sum())} element(s)"
    err = rel_error(xd, ref)
    assert (
        err <= NORM_TOL[stored_dtype]
    ), f"{name}: relative error {err:.3g} > {NORM_TOL[stored_dtype]:.3g}"
    peak = float(ref.double().abs().max().clamp_min(1e-30))
    worst = float((xd - ref.double()).abs().max())
    bound = MAX_TOL[stored_dtype]
    if inputs_rounded_to is not None:
        bound = max(bound, MAX_TOL[inputs_rounded_to])
    assert (
        worst <= bound * peak
    ), f"{name}: max abs error {worst:.3g} > {bound:.3g} * max|ref| ({peak:.3g})"
