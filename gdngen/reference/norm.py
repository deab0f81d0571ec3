"""The gated RMSNorm of the recurrence's output, in float64.

Per value head, over its V elements: ``o / sqrt(mean(o * o) + eps) * weight * act(z)``, where
``z`` is the gate projection's row of that head and ``weight`` [V] is shared by every head
(Qwen3-Next's RMSNormGated; FLA's FusedRMSNormGated with ``silu`` or ``sigmoid``).
"""

from __future__ import annotations

import torch

from gdngen.terms import NORM_ACTIVATIONS


def gated_rmsnorm(
    o: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    activation: str = "silu",
) -> torch.Tensor:
    """``o`` and ``z`` [..., HV, V], ``weight`` [V]: the normalised, gated output in float64."""
    if activation not in NORM_ACTIVATIONS:
        raise ValueError(f"activation: expected one of {NORM_ACTIVATIONS}; got {activation!r}")
    o = o.double()
    gate = z.double()
    gate = torch.nn.functional.silu(gate) if activation == "silu" else torch.sigmoid(gate)
    inverse_rms = torch.rsqrt((o * o).mean(dim=-1, keepdim=True) + eps)
    return o * inverse_rms * weight.double() * gate
