"""The causal depthwise conv1d update of an engine's decode step, in float64.

Each of the D channels of the packed ``mixed_qkv`` rows (q, k, v side by side) is convolved with
its own W taps over the last W inputs of its sequence: the W - 1 inputs kept in the conv state
from earlier calls, then this call's T tokens. Output token t of channel c is

    act(bias[c] + sum_{w < W} weight[c, w] * window[c, t + w])

where ``window`` is the state's W - 1 columns (oldest first) followed by the T new inputs, and
the state afterwards holds the last W - 1 columns of the window. A slot may keep more columns
than W - 1; the window is its first W - 1 and the rest stay as they are. In the per-token form
of speculative decoding (``accepted``), the window starts at column ``accepted - 1`` instead, and
the state afterwards holds the window's positions 1 .. W - 2 + T from column 0: the newest W - 2
columns read, then every input, so that the next call can start at any accepted token. Nothing is rounded here: the
inputs are read as float64, and the new state is rounded to the state's dtype where it is stored.
"""

from __future__ import annotations

import torch

#: how a conv state slot is laid out: "channels_first" [D, W - 1] (each channel's window
#: contiguous), "channels_last" [W - 1, D] (each time step's channels contiguous)
CONV_STATE_LAYOUTS = ("channels_first", "channels_last")
CONV_ACTIVATIONS = (None, "silu")


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    slots: torch.Tensor | None = None,
    null_slot: int = -1,
    state_layout: str = "channels_first",
    accepted: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call on ``x`` [B, T, D]: returns the outputs [B, T, D] (float64) and the whole conv
    state pool after the call (a new tensor in the pool's dtype).

    ``conv_state`` is [P, D, columns] (channels_first) or [P, columns, D] (channels_last), with
    columns >= W - 1 (>= W - 2 + T with ``accepted``); batch row n uses slot ``slots[n]`` (slot n
    without ``slots``). A row whose slot is ``<= null_slot`` is padding: its outputs are zero and
    no state is read or written. ``weight`` is [D, W]. ``accepted`` [B]: the per-token form (see
    the module docstring)."""
    if state_layout not in CONV_STATE_LAYOUTS:
        raise ValueError(
            f"state_layout: expected one of {CONV_STATE_LAYOUTS}; got {state_layout!r}"
        )
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"activation: expected one of {CONV_ACTIVATIONS}; got {activation!r}")
    B, T, D = x.shape
    width = weight.shape[1]
    new_pool = conv_state.clone()
    out = torch.zeros(B, T, D, dtype=torch.float64, device=x.device)
    taps = weight.double()
    for n in range(B):
        slot = n if slots is None else int(slots[n])
        if slots is not None and slot <= null_slot:
            continue
        held, window = _row_window(x, conv_state, n, slot, width, state_layout, accepted)
        for t in range(T):
            out[n, t] = (window[:, t : t + width] * taps).sum(dim=1)
        if bias is not None:
            out[n] += bias.double()
        if accepted is None:
            stored = window[:, window.shape[1] - (width - 1) :]
        else:
            stored = window[:, 1:]
        slot_after = held.clone()
        slot_after[:, : stored.shape[1]] = stored
        slot_after = slot_after if state_layout == "channels_first" else slot_after.transpose(0, 1)
        new_pool[slot] = slot_after.to(conv_state.dtype)
    if activation == "silu":
        out = torch.nn.functional.silu(out)
    return out, new_pool


def conv_windows(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    width: int,
    *,
    slots: torch.Tensor | None = None,
    null_slot: int = -1,
    state_layout: str = "channels_first",
    accepted: torch.Tensor | None = None,
) -> torch.Tensor:
    """The window after each token of a call on ``x`` [B, T, D], as the verify cache keeps it:
    [B, T, D, W - 1] float64, step t holding the W - 1 newest inputs once token t is in (the
    window's positions t + 1 .. t + W - 1), oldest first. Arguments as causal_conv1d_update's;
    a padded row's windows are zeros."""
    B, T, D = x.shape
    windows = torch.zeros(B, T, D, width - 1, dtype=torch.float64, device=x.device)
    for n in range(B):
        slot = n if slots is None else int(slots[n])
        if slots is not None and slot <= null_slot:
            continue
        _, window = _row_window(x, conv_state, n, slot, width, state_layout, accepted)
        for t in range(T):
            windows[n, t] = window[:, t + 1 : t + width]
    return windows


def _row_window(x, conv_state, n: int, slot: int, width: int, state_layout: str, accepted):
    """Row n's slot as [D, columns] float64, and its window [D, W - 1 + T]: the kept columns
    (from column ``accepted[n] - 1`` in the per-token form), then the row's inputs."""
    held = conv_state[slot].double()
    held = held if state_layout == "channels_first" else held.transpose(0, 1)  # [D, cols]
    offset = 0 if accepted is None else int(accepted[n]) - 1
    kept = held[:, offset : offset + width - 1]
    return held, torch.cat([kept, x[n].double().transpose(0, 1)], dim=1)
