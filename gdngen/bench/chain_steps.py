"""The steps of the decode core as an engine runs them today, one kernel each, for the core bench
(gdngen.bench.core): the causal conv1d update and the gated RMSNorm from FLA (torch where FLA does
not import). The recurrence between them is gdn_decode without its fused features, or a peer's.

Every step returns its output the way the engine receives it (a new tensor where the kernel
allocates one), so that the chain is charged no copy the engine does not make.
"""

from __future__ import annotations

import torch

from gdngen.measure.core_cell import EPS


def torch_gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``RMSNorm(o) * weight * silu(z)`` over the last dim, in fp32 (the engines' fallback)."""
    x = o.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    return (x * weight.float() * torch.nn.functional.silu(z.float())).to(o.dtype)


def fla_gated_rmsnorm():
    """FLA's fused gated RMSNorm as ``norm(o, z, weight) -> output``, or None without FLA."""
    try:
        from fla.modules.fused_norm_gate import rms_norm_gated
    except ImportError:
        return None

    def norm(o, z, weight):
        return rms_norm_gated(
            o.reshape(-1, o.shape[-1]), z.reshape(-1, z.shape[-1]), weight, None,
            activation="swish", eps=EPS,
        )  # fmt: skip

    return norm


def fla_conv1d():
    """FLA's causal conv1d as ``conv(x [B, T, D], cache [B, D, W], weight [D, W], bias) -> y``,
    or None without FLA.

    FLA keeps a dense ``[B, D, W]`` cache whose last W - 1 columns are the window (gdngen's
    ``conv_state`` holds those W - 1 columns only). One token per sequence runs its update kernel,
    which shifts the cache in place; more tokens run its sequence kernel from the cache as the
    initial state, which returns the final window as a new tensor (the chain keeps it as an
    engine would keep the kernel's output, with no copy back).
    """
    try:
        from fla.modules.causal_conv1d.ops import causal_conv1d, causal_conv1d_update
    except ImportError:
        return None

    def conv(x, cache, weight, bias):
        if x.shape[1] == 1:
            y, _ = causal_conv1d_update(x, cache, weight=weight, bias=bias, activation="silu")
            return y
        y, _ = causal_conv1d(
            x, weight=weight, bias=bias, initial_state=cache, output_final_state=True,
            activation="silu",
        )  # fmt: skip
        return y

    return conv
