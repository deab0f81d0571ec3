"""The whole GDN decode core of an engine, in float64: conv1d update of the packed q/k/v, the
recurrence, the gated RMSNorm (docs/design.md, "The math").

Both states of a sequence live at the same slot: the conv state pool's and the recurrent state
pool's. A padded row (slot ``<= null_slot``) outputs zeros and touches neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .conv import causal_conv1d_update
from .decode import reference_call, reference_decode
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


@dataclass
class CoreCall:
    """What one packed fused-core call must leave behind (:func:`reference_core_call`)."""

    output: torch.Tensor  # [1, tokens, HV, V] float64: the normed, gated output; NaN: not checked
    pool: torch.Tensor  # the recurrent state pool after the call (state dtype)
    conv_pool: torch.Tensor  # the conv state pool after the call (its dtype)


def reference_core_call(
    args: dict,
    z: torch.Tensor,
    norm_weight: torch.Tensor,
    *,
    H: int,
    K: int,
    eps: float,
    norm_activation: str = "silu",
    conv_activation: str | None = "silu",
    sequences: list[int] | None = None,
) -> CoreCall:
    """A fused-core ``gdn_decode`` call in an engine's packed form, from its keyword ``args``
    (``mixed_qkv [1, tokens, 2*H*K + HV*V]`` before the conv, ``cu_seqlens``, ``conv_state``,
    ``conv_weight``, ``conv_bias``, the pool and its slots), with ``z [1, tokens, HV, V]``; or in
    the dense form, without ``cu_seqlens``: ``mixed_qkv [B, D]`` (one token a row) or
    ``[B, T, D]``, z with the same leading dims. The output is ``[1, tokens, HV, V]`` either way.

    Slots are ``[N]`` row slots, or vLLM's ``[N, 1 + S]`` per-token table with
    ``num_accepted_tokens``, whose conv slot is the table's column 0 and whose window starts at
    column ``num_accepted - 1`` (docs/design.md, "The conv1d prologue"). Each sequence is
    convolved on its own, then the recurrence runs on the conv outputs
    (:func:`gdngen.reference.decode.reference_call`), then the gated RMSNorm. A padded sequence
    outputs zeros and writes neither state. ``sequences``: compute these only (the others'
    outputs are NaN and their states are left as they were), to check a large call on a few."""
    mixed = args["mixed_qkv"]
    channels = mixed.shape[-1]
    x = mixed.reshape(-1, channels)
    table = args["initial_state_indices"].long()
    per_token = table.dim() == 2
    accepted = args.get("num_accepted_tokens")
    accepted = None if accepted is None else accepted.long()
    if args.get("cu_seqlens") is None:  # dense rows: row n's T tokens are [n * T, (n + 1) * T)
        T = mixed.shape[1] if mixed.dim() == 3 else 1
        cu = list(range(0, table.shape[0] * T + 1, T))
    else:
        cu = args["cu_seqlens"].long().tolist()
    null_slot = args.get("null_slot", -1)
    chosen = range(len(cu) - 1) if sequences is None else sorted(set(sequences))
    convolved = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    conv_pool = args["conv_state"].clone()
    for n in chosen:
        lo, hi = cu[n], cu[n + 1]
        column = 0 if accepted is None or not per_token else int(accepted[n]) - 1
        read = int(table[n, column]) if per_token else int(table[n])
        conv_slot = table[n : n + 1, 0] if per_token else table[n : n + 1]
        if hi == lo or read <= null_slot or int(conv_slot[0]) <= null_slot:
            continue
        out, conv_pool = causal_conv1d_update(
            x[None, lo:hi], conv_pool, args["conv_weight"], args.get("conv_bias"),
            activation=conv_activation, slots=conv_slot, null_slot=null_slot,
            accepted=accepted[n : n + 1] if per_token and accepted is not None else None,
        )  # fmt: skip
        convolved[lo:hi] = out[0]
    HV, V = z.shape[-2], z.shape[-1]
    q, k, v = split_mixed_qkv(convolved.view(1, -1, channels), H, K, HV, V)
    pick = torch.tensor(list(chosen), dtype=torch.long)
    bounds = torch.tensor(cu, dtype=torch.long)
    # The chosen sequences as one packed call of their own (their tokens, gates and slots).
    tokens = torch.cat([torch.arange(cu[n], cu[n + 1]) for n in chosen] or [pick[:0]])
    sub_cu = torch.zeros(len(pick) + 1, dtype=torch.long)
    sub_cu[1:] = (bounds[pick + 1] - bounds[pick]).cumsum(0)
    at = tokens.to(x.device)
    flat = lambda t: t.reshape(-1, *t.shape[-1:])[at][None]  # noqa: E731
    expected = reference_call(
        q[:, at], k[:, at], v[:, at], args["initial_state"], args["A_log"], flat(args["a"]),
        args["dt_bias"], flat(args["b"]), scale=args.get("scale"),
        use_qk_l2norm=args.get("use_qk_l2norm", True), read_slots=table[pick.to(table.device)],
        disable_state_update=args.get("disable_state_update", False),
        state_layout=args.get("state_layout", "k_last"), null_slot=null_slot,
        cu_seqlens=sub_cu, num_accepted=None if accepted is None else accepted[pick],
    )  # fmt: skip
    normed = gated_rmsnorm(
        expected.output, z.reshape(1, -1, HV, V)[:, at], norm_weight, eps=eps,
        activation=norm_activation,
    )  # fmt: skip
    output = torch.full((1, x.shape[0], HV, V), float("nan"), dtype=torch.float64,
                        device=x.device)  # fmt: skip
    output[:, at] = normed  # a padded row's zeros stay zeros
    if args.get("disable_state_update", False):
        conv_pool = args["conv_state"].clone()
    return CoreCall(output=output, pool=expected.pool, conv_pool=conv_pool)
