"""vLLM's own decode chain of a GDN layer (Qwen3-Next, Qwen3.5), in vLLM's call forms, as a peer
of the core bench (gdngen.bench.core; docs/design.md, "Measuring").

The kernels are vLLM's Triton kernels, loaded from a bundle of the released wheel
(gdngen.measure.vllm_kernels); the calls follow vLLM 0.33's GDN layer
(vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py):

- **T = 1** (plain decode, its packed fast path, on by default): ``causal_conv1d_update`` of the
  pre-conv ``mixed_qkv`` rows with the ``[B]`` slots as ``conv_state_indices``, then
  ``fused_recurrent_gated_delta_rule_packed_decode`` on the convolved rows, writing the output
  in place and the state in its slot;
- **T > 1** (speculative decode by Triton, vLLM's path where its CUDA MTP kernel is not built or
  not chosen): the conv update in its per-token form (the table's column 0 as the conv slot,
  ``num_accepted_tokens``, ``query_start_loc``), the rows split into contiguous q, k, v as the
  layer does (a split, each part flattened, one concatenation), then
  ``fused_sigmoid_gating_delta_rule_update`` with the ``[N, 1 + S]`` table, which reads the
  state at column ``num_accepted_tokens - 1`` and writes every token's state to its column; its
  output is a new tensor, which the layer copies into its output buffer;
- then the gated RMSNorm of the output by ``z``, by either of vLLM's two paths: the FLA-style
  Triton kernel (``rmsnorm_fn``, ``RMSNormGated.forward_cuda``), or ``forward_native`` compiled by
  Inductor, vLLM's default where its compile disables custom ops (``inductor_gated_rmsnorm``).

Slot 0 is vLLM's null block (a padded row), as in the core bench's problems. The conv state is
the bench's pool, ``[slots, D, columns]`` or vLLM's default view of a ``[slots, columns, D]``
buffer. ``a`` and ``b`` are contiguous, as the layer passes them to its core op. The conv writes
its output to a buffer of the set's (vLLM writes over its input), so that every entry of the
bench reads the same pre-conv rows; the bytes moved are the same. ``z`` is a dense tensor here;
a Qwen3.5 layer's ``z`` is a strided view, which vLLM's Triton norm first copies.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from gdngen.bench.chain_steps import EPS
from gdngen.measure.vllm_kernels import VllmKernels

#: the chain entries of the core bench, by the norm each runs
NORMS = ("triton norm", "inductor norm")
#: the norm's activation in Qwen3-Next and Qwen3.5 (``output_gate_type`` unset: silu)
ACTIVATION = "silu"


def native_gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                         activation: str = ACTIVATION) -> torch.Tensor:  # fmt: skip
    """``rms_norm(x) * weight * act(z)`` over the last dim, in fp32, returned in x's dtype.

    It mirrors the semantics of vLLM's ``RMSNormGated.forward_native`` as a GDN layer builds it
    (vllm/model_executor/layers/layernorm.py): one group (``group_size=None``, the whole head of
    V), the norm before the gate (``norm_before_gate=True``), ``silu`` or ``sigmoid`` gate, no
    bias, every operand upcast to fp32 and the result cast back to the input's dtype.
    """
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"activation: expected 'silu' or 'sigmoid'; got {activation!r}")
    x32, z32 = x.float(), z.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    gate = torch.sigmoid(z32) if activation == "sigmoid" else torch.nn.functional.silu(z32)
    return (normed * gate).to(x.dtype)


@functools.cache
def inductor_gated_rmsnorm() -> Callable:
    """``norm(o, z, weight)``: native_gated_rmsnorm compiled by Inductor (eps and activation
    fixed, as a layer's are), with the token dimension dynamic as vLLM marks it, so that one
    compiled kernel serves every batch (one token is specialised, as Dynamo does)."""

    def gated(x, z, weight):
        return native_gated_rmsnorm(x, z, weight, EPS, ACTIVATION)

    compiled = torch.compile(gated, fullgraph=True)

    def norm(o, z, weight):
        torch._dynamo.maybe_mark_dynamic(o, 0)
        torch._dynamo.maybe_mark_dynamic(z, 0)
        return compiled(o, z, weight)

    return norm


def triton_gated_rmsnorm(kernels: VllmKernels) -> Callable:
    """``norm(o, z, weight)``: vLLM's FLA-style Triton gated RMSNorm, called as
    ``RMSNormGated.forward_cuda`` calls it for a GDN layer; returns a new tensor."""

    def norm(o, z, weight):
        return kernels.rmsnorm_fn(
            o, weight, None, z=z, eps=EPS, group_size=None, norm_before_gate=True,
            activation=ACTIVATION,
        )  # fmt: skip

    return norm


def vllm_norm(kernels: VllmKernels, name: str) -> Callable:
    if name == "triton norm":
        return triton_gated_rmsnorm(kernels)
    if name == "inductor norm":
        return inductor_gated_rmsnorm()
    raise ValueError(f"norm: expected one of {NORMS}; got {name!r}")


def prepare_set(s: dict, conv: bool) -> None:
    """Add to a core bench input set what vLLM's calls take beyond it: contiguous ``a`` and
    ``b``, and the conv's output buffer (``s["vllm"]``)."""
    rows = s["args"]["mixed_qkv"][0]
    s["vllm"] = dict(
        a=s["args"]["a"].contiguous(),
        b=s["args"]["b"].contiguous(),
        conv_out=torch.empty(rows.shape, dtype=rows.dtype, device=rows.device) if conv else None,
    )


def split_heads(rows: torch.Tensor, H: int, K: int, HV: int, V: int):
    """Contiguous q [1, L, H, K], k [1, L, H, K], v [1, L, HV, V] of packed rows [L, D], made as
    vLLM's layer makes them before its speculative-decode recurrence: each part of the split
    flattened (a copy, the parts being strided), one concatenation, and views of it."""
    L = rows.shape[0]
    flat = torch.cat([part.reshape(-1) for part in rows.split([H * K, H * K, HV * V], dim=-1)])
    q, k, v = flat.split([L * H * K, L * H * K, L * HV * V])
    return q.view(1, L, H, K), k.view(1, L, H, K), v.view(1, L, HV, V)


def vllm_chain(kernels: VllmKernels, norm: Callable, *, H: int, K: int, V: int, tokens: int,
               conv: bool) -> Callable[[dict], torch.Tensor]:  # fmt: skip
    """``run(s)``: the chain on a prepared core bench set (its pool, conv pool, rows, gates),
    returning the normed output [B * T, HV, V]; the states are updated in place."""

    def convolved(s, **form):
        rows = s["args"]["mixed_qkv"][0]
        if not conv:
            return rows
        return kernels.causal_conv1d_update(
            rows, s["conv_state"], s["conv_weight"], s["conv_bias"], "silu",
            validate_data=False, out=s["vllm"]["conv_out"], **form,
        )  # fmt: skip

    def plain_decode(s):
        args, inputs = s["args"], s["vllm"]
        slots = args["initial_state_indices"]
        rows = convolved(s, conv_state_indices=slots)
        output = s["output"][0]  # [B, HV, V]
        kernels.packed_decode(
            mixed_qkv=rows, a=inputs["a"], b=inputs["b"], A_log=args["A_log"],
            dt_bias=args["dt_bias"], scale=K**-0.5, initial_state=args["initial_state"],
            out=output.unsqueeze(1), ssm_state_indices=slots, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return norm(output, s["z"][0], s["norm_weight"])

    def spec_decode(s):
        args, inputs = s["args"], s["vllm"]
        table, accepted = args["initial_state_indices"], args["num_accepted_tokens"]
        cu_seqlens = args["cu_seqlens"]
        rows = convolved(
            s, conv_state_indices=table[:, 0], num_accepted_tokens=accepted,
            query_start_loc=cu_seqlens, max_query_len=table.shape[1],
        )  # fmt: skip
        HV = inputs["a"].shape[1]
        q, k, v = split_heads(rows, H, K, HV, V)
        attended, _ = kernels.spec_decode(
            A_log=args["A_log"], a=inputs["a"], b=inputs["b"], dt_bias=args["dt_bias"], q=q, k=k,
            v=v, initial_state=args["initial_state"], inplace_final_state=True,
            cu_seqlens=cu_seqlens, ssm_state_indices=table, num_accepted_tokens=accepted,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        output = s["output"][0]  # [B * T, HV, V]
        output.copy_(attended[0])
        return norm(output, s["z"][0], s["norm_weight"])

    return plain_decode if tokens == 1 else spec_decode
