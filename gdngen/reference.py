"""The one reference every test and benchmark compares with: GDN decode in float64.

It follows docs/design.md ("The math") literally (decay first, then the delta update, then the
output from the updated state) and the precision contract: the state stays in float64 across all T
tokens of a call and is rounded to the state dtype only where it is stored (each cached
intermediate state, and the final state). It runs on whatever device its inputs are on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6


@dataclass
class ReferenceResult:
    output: torch.Tensor  # [B, T, HV, V], float64
    pool: torch.Tensor  # the pool after the call, in the state dtype (a new tensor)
    final_state: torch.Tensor  # [B, HV, V, K] float64 state after the last token (K-last)
    intermediates: torch.Tensor  # [B, T, HV, V, K] float64 state after each token (K-last)
    live: torch.Tensor  # [B] bool: rows that are not padded


def softplus(x: torch.Tensor) -> torch.Tensor:
    """softplus with beta 1 and threshold 20, as a branch (never mask * log1p(exp(x)))."""
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD))))


def gates(A_log, a, dt_bias, b) -> tuple[torch.Tensor, torch.Tensor]:
    """g = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), in float64."""
    x = a.double() + dt_bias.double()
    g = torch.exp(-torch.exp(A_log.double()) * softplus(x))
    beta = torch.sigmoid(b.double())
    return g, beta


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def reference_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pool: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    read_slots: torch.Tensor | None = None,
    write_slots: torch.Tensor | None = None,
    disable_state_update: bool = False,
    state_layout: str = "k_last",
) -> ReferenceResult:
    """One call of GDN decode on T tokens.

    ``pool`` is [P, HV, V, K] (k_last) or [P, HV, K, V] (v_last); without ``read_slots`` batch row
    n uses slot n. A row whose read or write slot is negative is padded: output zeros, nothing
    read or written.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    device = q.device
    if scale is None:
        scale = K**-0.5
    rows = torch.arange(B, device=device)
    reads = rows if read_slots is None else read_slots.long()
    writes = reads if write_slots is None else write_slots.long()
    live = (reads >= 0) & (writes >= 0)

    h = pool[reads.clamp(min=0)].double()  # [B, HV, ...]
    if state_layout == "v_last":
        h = h.transpose(-1, -2)  # -> [B, HV, V, K]
    h = torch.where(live[:, None, None, None], h, torch.zeros_like(h))

    group = HV // H
    qh = q.double().repeat_interleave(group, dim=2)  # [B, T, HV, K]
    kh = k.double().repeat_interleave(group, dim=2)
    if use_qk_l2norm:
        qh, kh = l2_normalize(qh), l2_normalize(kh)
    qh = qh * scale
    g, beta = gates(A_log, a, dt_bias, b)  # [B, T, HV]

    outputs = []
    intermediates = []
    for t in range(T):
        h = g[:, t, :, None, None] * h  # decay first
        hk = torch.einsum("bhvk,bhk->bhv", h, kh[:, t])
        u = beta[:, t, :, None] * (v[:, t].double() - hk)
        h = h + u[..., None] * kh[:, t, :, None, :]
        outputs.append(torch.einsum("bhvk,bhk->bhv", h, qh[:, t]))
        intermediates.append(h)
    output = torch.stack(outputs, dim=1)
    output = torch.where(live[:, None, None, None], output, torch.zeros_like(output))

    new_pool = pool.clone()
    if not disable_state_update:
        stored = (h if state_layout == "k_last" else h.transpose(-1, -2)).to(pool.dtype)
        new_pool[writes[live]] = stored[live]
    return ReferenceResult(
        output=output,
        pool=new_pool,
        final_state=h,
        intermediates=torch.stack(intermediates, dim=1),
        live=live,
    )
