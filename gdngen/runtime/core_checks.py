"""The decode core's checks: the options, q, k, v, the gates, A_log, dt_bias, the geometry, the
output, the devices and the scale. Messages as gdngen.runtime.checks says.
"""

from __future__ import annotations

import math

import torch

from .arg_checks import (
    VECTOR_ALIGN,
    dtype_name,
    require_aligned,
    require_contiguous,
    require_dims,
    require_dtype,
    require_inner_contiguous,
    require_int,
    shape_text,
)
from .form_checks import Tokens
from .info import TargetInfo

GATE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DT_BIAS_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
LAYOUTS = ("k_last", "v_last")
#: the ``backend`` values gdngen honours: "auto", FlashInfer's default, is gdngen's own dispatch
BACKENDS = ("auto",)
#: FlashInfer's other ``backend`` values (gated_delta_rule_decode_pretranspose, 0.7.2), each a
#: request for one of FlashInfer's own kernels, which gdngen does not have
FLASHINFER_BACKENDS = {
    "flashinfer": "FlashInfer's generic kernels",
    "cake_gdn": "FlashInfer's Cake GDN kernels",
    "rubin": "FlashInfer's Rubin-tuned (SM 10.7) T = 1 kernel",
}


def check_options(use_qk_l2norm, disable_state_update, uniform_seqlen, state_layout, null_slot):
    """The flags and the layout; returns ``null_slot`` as an int."""
    for flag_name, flag in (
        ("use_qk_l2norm", use_qk_l2norm),
        ("disable_state_update", disable_state_update),
        ("uniform_seqlen", uniform_seqlen),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{flag_name}: expected a bool, got {type(flag).__name__}")
    if state_layout not in LAYOUTS:
        raise ValueError(f"state_layout: expected one of {LAYOUTS}; got {state_layout!r}")
    return require_int(
        "null_slot", null_slot, -1, None, "slots <= null_slot are padding; -1 or more"
    )


def check_enable_pdl(enable_pdl) -> bool | None:
    """``enable_pdl``, FlashInfer's keyword: True or False, or None (the default), FlashInfer's
    choice: on where the device supports programmatic dependent launch (compute capability 9.0
    and newer, which every target gdngen generates is), except where the dispatch rule says the
    PDL kernel measured slower (its ``pdl``)."""
    if enable_pdl is None:
        return None
    if not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl: expected a bool or None, got {type(enable_pdl).__name__}")
    return enable_pdl


def check_backend(backend) -> None:
    """FlashInfer's ``backend`` keyword: "auto" runs gdngen's dispatch; FlashInfer's other values
    ask for its own kernels, which a gdngen call cannot run, so they are refused rather than
    ignored (a caller pinning a backend expects that backend's numbers)."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, one of {BACKENDS}; got {type(backend).__name__}")
    if backend in BACKENDS:
        return
    accepted = "gdngen accepts backend='auto' (its own dispatch)"
    if backend in FLASHINFER_BACKENDS:
        raise ValueError(
            f"backend: {backend!r} asks for {FLASHINFER_BACKENDS[backend]}, which gdngen cannot "
            f"run; {accepted}. For FlashInfer's kernels call "
            "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose itself"
        )
    raise ValueError(
        f"backend: {accepted}; FlashInfer's other values ({', '.join(map(repr, FLASHINFER_BACKENDS))}) "
        f"name FlashInfer's own kernels; got {backend!r}"
    )


def token_dims(tokens: Tokens, q) -> tuple:
    """The leading dims every per-token tensor shares with q."""
    return (1, tokens.total_tokens) if tokens.packed else (tokens.rows, q.shape[1])


def check_core_tensors(tokens: Tokens, q, k, v, a, b, A_log, dt_bias) -> tuple[str, str]:
    """k, v, a, b, A_log and dt_bias against q; returns the gates' and dt_bias's dtypes."""
    lead, dims, H, K = tokens.lead, token_dims(tokens, q), tokens.H, tokens.K
    if k.dtype != q.dtype:
        raise TypeError(
            f"k: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(k.dtype)}"
        )
    require_dims("k", k, dims + (H, K), f"[{lead}, H, K] (as q)")
    if v.dtype != q.dtype:
        raise TypeError(
            f"v: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(v.dtype)}"
        )
    require_dims("v", v, dims + (None, None), f"[{lead}, HV, V]")
    HV = v.shape[2]
    if q.shape[0] < 1 or q.shape[1] < 1:
        raise ValueError(f"q: batch and token counts must be >= 1; got shape {shape_text(q)}")
    gate_dtype = require_dtype("a", a, GATE_DTYPES)
    require_dims("a", a, dims + (HV,), f"[{lead}, HV]")
    if b.dtype != a.dtype:
        raise TypeError(
            f"b: expected dtype {dtype_name(a.dtype)} (as a); got {dtype_name(b.dtype)}"
        )
    require_dims("b", b, dims + (HV,), f"[{lead}, HV]")
    if A_log.dtype != torch.float32:
        raise TypeError(f"A_log: expected dtype float32; got {dtype_name(A_log.dtype)}")
    require_dims("A_log", A_log, (HV,), "[HV]")
    dt_bias_dtype = require_dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    require_dims("dt_bias", dt_bias, (HV,), "[HV]")
    require_contiguous("A_log", A_log)
    require_contiguous("dt_bias", dt_bias)
    return gate_dtype, dt_bias_dtype


def check_geometry(info: TargetInfo, tokens: Tokens, HV: int, V: int) -> None:
    """The target serves the call's head counts and dims, and its T."""
    H, K, T = tokens.H, tokens.K, tokens.T
    if not info.serves_geometry(H, HV, K, V):
        served = info.served_geometries()
        line = f"`- {{name: <model>, H: {H}, HV: {HV}, K: {K}, V: {V}}}` under `geometries:`"
        message = (
            f"q/v: geometry H={H}, HV={HV}, K={K}, V={V} was not generated for target "
            f"{info.name}; it serves {served}. {info.add_to_spec(line)}"
        )
        head_dims = sorted({(g.K, g.V) for g in info.geometries})
        if (K, V) not in head_dims:
            dims = ", ".join(f"K={k}, V={v}" for k, v in head_dims)
            message += (
                f" Its kernels are built for {dims}: head dims K={K}, V={V} also need, for each "
                f"layout and state dtype, a variant built for them (K = k_splits * "
                f"threads_per_group * vec, V a multiple of tile_v) and dispatch rules with "
                f'`head_dims: [{K}, {V}]` (docs/design.md, "Head dims").'
            )
        raise ValueError(message)
    if T > info.max_tokens:
        raise ValueError(
            f"q: T={T} tokens per call; target {info.name} was generated for T <= {info.max_tokens}"
        )


def check_core_layout(q, k, v, a, b) -> None:
    """q, k, v rows are vector-loaded: inner dims dense, outer strides whole vectors."""
    for name, tensor, inner, meaning in (
        ("q", q, 2, "[H, K]"),
        ("k", k, 2, "[H, K]"),
        ("v", v, 2, "[HV, V]"),
    ):
        require_inner_contiguous(name, tensor, inner, meaning)
        require_aligned(name, tensor, VECTOR_ALIGN // tensor.element_size(), outer_dims=2)
    require_inner_contiguous("a", a, 1, "[HV]")
    require_inner_contiguous("b", b, 1, "[HV]")


def check_output(tokens: Tokens, q, output, HV: int, V: int) -> None:
    if output is None:
        return
    if output.dtype != q.dtype:
        raise TypeError(
            f"output: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(output.dtype)}"
        )
    require_dims("output", output, token_dims(tokens, q) + (HV, V), f"[{tokens.lead}, HV, V]")
    require_contiguous("output", output)
    require_aligned("output", output, 1, outer_dims=0)


def check_devices(q, named: list[tuple[str, torch.Tensor | None]]) -> None:
    """q is on a CUDA device, and every other tensor given is on it too."""
    device = q.device
    if device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor; got a tensor on {device}")
    for name, tensor in named:
        if tensor is not None and tensor.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (as q); got {tensor.device}")


def check_scale(scale, K: int) -> float:
    """The scale of q, 1 / sqrt(K) when not given."""
    if scale is None:
        return K**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float or None; got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number; got {scale}")
    return float(scale)
