"""Checking the conv1d prologue's arguments (docs/design.md, "The conv1d prologue").

With ``conv_state`` and ``conv_weight`` given, q, k and v (or ``mixed_qkv``) are the projections
before the engine's causal depthwise convolution, whose D = 2*H*K + HV*V channels are q's, k's and
v's in that order (the rows of the engines' ``mixed_qkv``).

- ``conv_state`` ``[slots, D, columns]``: a pool indexed by the same slots as the recurrent
  state (as many slots; without indices, one per batch row), in q's dtype. Both layouts engines
  use are served by one kernel: channels-first (each channel's columns contiguous) and the
  transposed view of a ``[slots, columns, D]`` buffer (each column's channels contiguous).
  The window is the first W - 1 columns; more may follow (vLLM sizes every slot for speculative
  decoding) and are left as they are. With per-token slots (``initial_state_indices [N, 1 + S]``)
  a row's conv state is the slot in column 0 of its row, its window starts at column
  ``num_accepted_tokens - 1``, and the call writes W - 2 + (its tokens) columns from column 0,
  so it needs W - 2 + (1 + S) columns (docs/design.md, "The conv1d prologue").
- ``conv_weight`` ``[D, W]`` (or a conv module's ``[D, 1, W]``), contiguous, in q's dtype; W one
  of the target's ``conv1d_widths``.
- ``conv_bias`` ``[D]`` or None; ``conv_activation`` "silu" or "identity".

- ``intermediate_conv_windows`` ``[R, cache_steps, D, W - 1]``, with the verify cache
  (``intermediate_states_buffer``) and only with it: the window after each token, at the
  recurrent cache's row (R and cache_steps as the buffer's), in q's dtype, any strides (SGLang's
  deduplicated view, whose consecutive steps overlap, included).

The prologue serves every call form: dense or pooled rows, T tokens each, packed sequences,
separate write slots (the conv state read from the read slot and written to the write slot),
``disable_state_update`` (the conv state is not written either), per-token slots, and the verify
cache with its windows. Errors name the argument, before any launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdngen.terms import CONV_ACTIVATIONS

from .arg_checks import dtype_name, require_aligned, require_dims, require_tensor, shape_text
from .info import TargetInfo


@dataclass(frozen=True)
class ConvPrologue:
    state: torch.Tensor
    #: [D, W], a view of the caller's weight
    weight: torch.Tensor
    bias: torch.Tensor | None
    width: int
    activation: str
    #: the verify cache's windows [R, cache_steps, D, W - 1]; None without the cache
    windows: torch.Tensor | None = None


def conv_weight_view(weight: torch.Tensor) -> torch.Tensor:
    """``[D, W]`` from a conv module's ``[D, 1, W]`` (no copy); other shapes as they are."""
    if weight.dim() == 3 and weight.size(1) == 1:
        return weight.view(weight.size(0), weight.size(2))
    return weight


def check_conv(
    info: TargetInfo,
    *,
    conv_state,
    conv_weight,
    conv_bias,
    conv_activation,
    q: torch.Tensor,
    pool: torch.Tensor,
    pool_name: str,
    H: int,
    K: int,
    HV: int,
    V: int,
    per_token_tokens: int | None,
    conv_windows=None,
    cache_buffer: torch.Tensor | None = None,
) -> ConvPrologue | None:
    """The prologue's checked arguments, or None when the call has none (neither ``conv_state``
    nor ``conv_weight``). ``per_token_tokens``: with per-token slots, the most tokens a row may
    have (the table's columns, 1 + S, or T if more); ``conv_windows``: the call's
    ``intermediate_conv_windows``; ``cache_buffer``: its checked verify cache, or None."""
    if conv_state is None and conv_weight is None:
        for name, given in (("conv_bias", conv_bias), ("intermediate_conv_windows", conv_windows)):
            if given is not None:
                raise ValueError(f"{name}: given without conv_state and conv_weight")
        return None
    if not info.conv1d_widths:
        raise ValueError(
            f"conv_state/conv_weight: target {info.name} was generated without the conv1d "
            f"prologue. {info.add_to_spec('`conv1d_widths: [4]` under `features:`')}"
        )
    for name, given, other in (
        ("conv_state", conv_state, "conv_weight"),
        ("conv_weight", conv_weight, "conv_state"),
    ):
        if given is None:
            raise ValueError(f"{name}: the conv1d prologue needs conv_state and conv_weight")
    conv_state = require_tensor("conv_state", conv_state)
    conv_weight = conv_weight_view(require_tensor("conv_weight", conv_weight))
    channels = 2 * H * K + HV * V
    if conv_weight.dim() != 2 or conv_weight.size(0) != channels:
        raise ValueError(
            f"conv_weight: expected [D, W] or [D, 1, W] with D = 2*H*K + HV*V = {channels}; "
            f"got {shape_text(conv_weight)}"
        )
    width = conv_weight.size(1)
    if width not in info.conv1d_widths:
        raise ValueError(
            f"conv_weight: a width of {width} taps; target {info.name} serves "
            f"{list(info.conv1d_widths)}. "
            + info.add_to_spec(f"{width} to `conv1d_widths` under `features:`")
        )
    for name, tensor in (("conv_state", conv_state), ("conv_weight", conv_weight)):
        if tensor.dtype != q.dtype:
            raise TypeError(
                f"{name}: expected dtype {dtype_name(q.dtype)} (as q); got "
                f"{dtype_name(tensor.dtype)}"
            )
    kept = width - 1
    columns = kept if per_token_tokens is None else kept - 1 + per_token_tokens
    if per_token_tokens is None:
        needs = f"W - 1 = {kept} or more"
    else:
        needs = f"W - 2 + (1 + S) = {columns} or more, with per-token slots"
    require_dims(
        "conv_state", conv_state, (pool.size(0), channels, None),
        f"[slots, D, columns] with {pool.size(0)} slots (as {pool_name}), D = {channels}, "
        f"columns {needs}",
    )  # fmt: skip
    if conv_state.size(2) < columns:
        raise ValueError(
            f"conv_state: expected [slots, D, columns] with columns {needs}; got "
            f"{shape_text(conv_state)}"
        )
    held = conv_state.size(2)
    inner = conv_state.stride()[1:]
    if inner not in ((held, 1), (1, channels)):
        raise ValueError(
            f"conv_state: expected each slot channels-first (strides [.., {held}, 1]) or "
            f"channels-last (strides [.., 1, {channels}]); got strides {tuple(conv_state.stride())}"
        )
    if conv_state.size(0) > 1 and conv_state.stride(0) < channels * held:
        raise ValueError(
            f"conv_state: slots overlap (slot stride {conv_state.stride(0)} < D * columns = "
            f"{channels * held})"
        )
    if conv_weight.stride() != (width, 1):
        raise ValueError(
            f"conv_weight: must be contiguous; got strides {tuple(conv_weight.stride())}"
        )
    require_aligned("conv_weight", conv_weight, 1, outer_dims=0)
    if conv_bias is not None:
        conv_bias = require_tensor("conv_bias", conv_bias)
        if conv_bias.dtype != q.dtype:
            raise TypeError(
                f"conv_bias: expected dtype {dtype_name(q.dtype)} (as q); got "
                f"{dtype_name(conv_bias.dtype)}"
            )
        require_dims("conv_bias", conv_bias, (channels,), f"[D] with D = {channels}")
        if conv_bias.stride(0) != 1:
            raise ValueError(f"conv_bias: must be contiguous; got stride {conv_bias.stride(0)}")
        require_aligned("conv_bias", conv_bias, 1, outer_dims=0)
    if conv_activation not in CONV_ACTIVATIONS:
        raise ValueError(
            f"conv_activation: expected one of {CONV_ACTIVATIONS}; got {conv_activation!r}"
        )
    windows = _check_windows(conv_windows, cache_buffer, q, channels, kept)
    for name, tensor in (
        ("conv_state", conv_state), ("conv_weight", conv_weight), ("conv_bias", conv_bias),
        ("intermediate_conv_windows", windows),
    ):  # fmt: skip
        if tensor is not None and tensor.device != q.device:
            raise ValueError(f"{name}: expected a tensor on {q.device} (as q); got {tensor.device}")
    return ConvPrologue(conv_state, conv_weight, conv_bias, width, conv_activation, windows)


def _check_windows(windows, cache_buffer, q, channels: int, kept: int) -> torch.Tensor | None:
    """``intermediate_conv_windows``: given exactly when the call has the verify cache."""
    meaning = f"[R, cache_steps, D = {channels}, W - 1 = {kept}]"
    if cache_buffer is None:
        if windows is not None:
            raise ValueError(
                "intermediate_conv_windows: the verify cache's conv windows, given without its "
                "intermediate_states_buffer"
            )
        return None
    if windows is None:
        raise ValueError(
            "intermediate_conv_windows: the verify cache (intermediate_states_buffer) with the "
            "conv1d prologue caches every token's conv window as well, for the roll-back to an "
            f"accepted token; pass intermediate_conv_windows {meaning} (R and cache_steps as "
            "the buffer's)"
        )
    windows = require_tensor("intermediate_conv_windows", windows)
    if windows.dtype != q.dtype:
        raise TypeError(
            f"intermediate_conv_windows: expected dtype {dtype_name(q.dtype)} (as q); got "
            f"{dtype_name(windows.dtype)}"
        )
    rows, steps = cache_buffer.shape[:2]
    require_dims(
        "intermediate_conv_windows", windows, (rows, steps, channels, kept),
        f"[R, cache_steps, D, W - 1] with R = {rows} and cache_steps = {steps} (as "
        f"intermediate_states_buffer), D = {channels}, W - 1 = {kept}",
    )  # fmt: skip
    return windows
