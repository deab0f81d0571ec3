"""Checking the gated RMSNorm epilogue's arguments (docs/design.md, "The fused decode core").

``z`` is the gate projection in the output's form (``[B, T, HV, V]``, ``[1, total_tokens, HV, V]``
packed), in q's dtype; its rows are vector-loaded like v's, so a strided view of the projection
output serves as long as each token's ``[HV, V]`` is dense and 16-byte aligned. ``norm_weight``
``[V]`` is shared by every head; ``norm_eps`` a positive float; ``norm_activation`` "silu" or
"sigmoid". Errors name the argument, as gdngen.runtime.checks does, before anything is launched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gdngen.terms import NORM_ACTIVATIONS

from .arg_checks import (
    VECTOR_ALIGN,
    dtype_name,
    require_aligned,
    require_dims,
    require_dtype,
    require_inner_contiguous,
    require_tensor,
)
from .info import TargetInfo

NORM_WEIGHT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True)
class GatedNorm:
    z: torch.Tensor
    weight: torch.Tensor
    eps: float
    activation: str
    weight_dtype: str


def check_gated_norm(
    info: TargetInfo,
    *,
    z,
    norm_weight,
    norm_eps,
    norm_activation,
    q: torch.Tensor,
    token_dims: tuple[int, int],
    lead: str,
    HV: int,
    V: int,
) -> GatedNorm | None:
    """The epilogue's checked arguments, or None when the call has no epilogue (neither ``z``
    nor ``norm_weight`` given)."""
    if z is None and norm_weight is None:
        return None
    if not info.gated_rmsnorm:
        raise ValueError(
            f"z/norm_weight: target {info.name} was generated without the gated RMSNorm "
            f"epilogue. {info.add_to_spec('`gated_rmsnorm: true` under `features:` and rules with `gated_norm: true`')}"
        )
    for name, given, other in (("z", z, "norm_weight"), ("norm_weight", norm_weight, "z")):
        if given is None:
            raise ValueError(
                f"{name}: the gated RMSNorm needs both z and norm_weight; got {other} only"
            )
    z = require_tensor("z", z)
    norm_weight = require_tensor("norm_weight", norm_weight)
    if z.dtype != q.dtype:
        raise TypeError(
            f"z: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(z.dtype)}"
        )
    require_dims("z", z, token_dims + (HV, V), f"[{lead}, HV, V] (as the output)")
    require_inner_contiguous("z", z, 2, "[HV, V]")
    require_aligned("z", z, VECTOR_ALIGN // z.element_size(), outer_dims=2)
    weight_dtype = require_dtype("norm_weight", norm_weight, NORM_WEIGHT_DTYPES)
    require_dims("norm_weight", norm_weight, (V,), "[V]")
    if norm_weight.stride(0) != 1:
        raise ValueError(f"norm_weight: must be contiguous; got stride {norm_weight.stride(0)}")
    require_aligned("norm_weight", norm_weight, 1, outer_dims=0)
    for name, tensor in (("z", z), ("norm_weight", norm_weight)):
        if tensor.device != q.device:
            raise ValueError(f"{name}: expected a tensor on {q.device} (as q); got {tensor.device}")
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)):
        raise TypeError(f"norm_eps: expected a float; got {type(norm_eps).__name__}")
    if not (math.isfinite(norm_eps) and norm_eps > 0):
        raise ValueError(f"norm_eps: expected a finite number > 0; got {norm_eps}")
    if norm_activation not in NORM_ACTIVATIONS:
        raise ValueError(
            f"norm_activation: expected one of {NORM_ACTIVATIONS}; got {norm_activation!r}"
        )
    return GatedNorm(z, norm_weight, float(norm_eps), norm_activation, weight_dtype)
