"""The whole GDN decode core of an engine, in float64: conv1d update of the packed q/k/v, the
recurrence, the gated RMSNorm (docs/design.md, "The math").

Both states of a sequence live at the same slot: the conv state pool's and the recurrent state
pool's. A padded row (slot ``<= null_slot``) outputs zeros and touches neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .conv import causal_conv1d_update
from .decode import reference_decode
from .norm import gated_rmsnorm


@dataclass
class CoreResult:
    output: torch.Tensor  # [B, T, HV, V] float64: the normed, gated output
    pool: torch.Tensor  # the recurrent state pool after the call (state dtype)
    conv_pool: torch.Tensor  # the conv state pool after the call (its dtype)
    live: torch.Tensor  # [B] bool: rows that are not padded


def split_mixed_qkv(mixed: torch.Tensor, H: int, K: int, HV: int, V: int):
    """The q [.., H, K], k [.., H, K] and v [.., HV, V] of packed rows [.., 2*H*K + HV*V], in that
    order along the row (the layout of the engines' in-projection)."""
    width = 2 * H * K + HV * V
    if mixed.shape[-1] != width:
        raise ValueError(f"mixed_qkv: rows of 2*H*K + HV*V = {width}; got {mixed.shape[-1]}")
    lead = mixed.shape[:-1]
    q, k, v = mixed.split([H * K, H * K, HV * V], dim=-1)
    return q.reshape(*lead, H, K), k.reshape(*lead, H, K), v.reshape(*lead, HV, V)


def reference_decode_core(
    mixed_qkv: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    z: torch.Tensor,
    pool: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    norm_weight: torch.Tensor,
    *,
    H: int,
    K: int,
    eps: float,
    norm_activation: str = "silu",
    conv_activation: str | None = "silu",
    conv_state_layout: str = "channels_first",
    slots: torch.Tensor | None = None,
    null_slot: int = -1,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    disable_state_update: bool = False,
    state_layout: str = "k_last",
) -> CoreResult:
    """One decode-core call on ``mixed_qkv`` [B, T, 2*H*K + HV*V] (pre-conv), ``z`` [B, T, HV, V],
    with the recurrent ``pool`` and ``conv_state`` both indexed by ``slots``.

    ``disable_state_update`` leaves both states unwritten (``conv_pool`` is then the input's)."""
    HV, V = z.shape[2], z.shape[3]
    conv_out, conv_pool = causal_conv1d_update(
        mixed_qkv, conv_state, conv_weight, conv_bias, activation=conv_activation, slots=slots,
        null_slot=null_slot, state_layout=conv_state_layout,
    )  # fmt: skip
    if disable_state_update:
        conv_pool = conv_state.clone()
    q, k, v = split_mixed_qkv(conv_out, H, K, HV, V)
    if slots is not None:  # reference_decode's padding sentinel is any negative slot
        slots = torch.where(slots.long() <= null_slot, -1, slots.long())
    result = reference_decode(
        q, k, v, pool, A_log, a, dt_bias, b, scale=scale, use_qk_l2norm=use_qk_l2norm,
        read_slots=slots, disable_state_update=disable_state_update, state_layout=state_layout,
    )  # fmt: skip
    live = result.live
    output = gated_rmsnorm(result.output, z, norm_weight, eps=eps, activation=norm_activation)
    output = torch.where(live[:, None, None, None], output, torch.zeros_like(output))
    return CoreResult(output=output, pool=result.pool, conv_pool=conv_pool, live=live)
