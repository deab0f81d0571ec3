"""vLLM's fused MTP op (``fused_gdn_decode_post_conv_mtp``) in tests: its inputs as vLLM's GDN
layer passes them, what the float64 reference says a call must leave behind, and the check of
everything a call wrote (and that nothing else changed).

The inputs follow ``_forward_core_decode_spec_post_conv_fused_norm`` of vLLM 0.33.0
(vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py): post-conv ``mixed_qkv`` rows
and the output gate as column views of one ``qkvz`` buffer, ``a`` and ``b`` as the two halves of
the ``ba`` projection (row-strided views), the per-token table ``[N, 1 + S]`` as a column slice
of the block table (int32, slot 0 the null block), a contiguous ``out``. On top of
gdngen.problem.PackedProblem's rows (every accepted count, padded rows with slot 0, mixed lengths,
an empty sequence, token-buffer padding past ``cu_seqlens[N]``) one padded row has slot -1 (the
op's padding test is ``<= 0``) and one live row a null column for a later token (that token
stores nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdngen.problem import TORCH_DTYPES, PackedProblem
from gdngen.reference import gated_rmsnorm, reference_call, split_mixed_qkv
from tests.compare import assert_close


@dataclass(frozen=True)
class MtpCase:
    sequences: int
    tokens: int  # 1 + S: the table's width and the longest sequence
    state_dtype: str = "bf16"
    H: int = 16
    HV: int = 64
    K: int = 128
    V: int = 128
    mixed_lengths: bool = True
    padded_rows: tuple[int, ...] = (1, 3)
    #: tokens in the buffer past the sequences' (a captured graph's padding)
    spare_tokens: int = 3
    activation: str = "silu"
    norm_weight_dtype: str = "bf16"
    dt_bias_dtype: str = "fp32"
    eps: float = 1e-6
    #: rows of the block table past the 1 + S columns the layer slices
    extra_columns: int = 2
    seed: int = 0

    def problem(self) -> PackedProblem:
        # The token count depends on the drawn lengths: draw them once (they come first from
        # the seed, whatever the head sizes: tiny heads keep this draw cheap), then make the
        # case with the spare tokens.
        base = PackedProblem(
            sequences=self.sequences, tokens=self.tokens, H=self.H, HV=self.HV, K=self.K,
            V=self.V, state_dtype=self.state_dtype, null_slot=0, padded_rows=self.padded_rows,
            mixed_lengths=self.mixed_lengths, flat=True, mixed_qkv=True,
            extra_columns=self.extra_columns, seed=self.seed,
        )  # fmt: skip
        total = int(base.with_(H=1, HV=1, K=8, V=8).make("cpu")["cu_seqlens"][-1])
        return base.with_(buffer_tokens=max(total, 1) + self.spare_tokens)


def mtp_args(case: MtpCase, device: str = "cuda", io_dtype: torch.dtype | None = None) -> dict:
    """The op's keyword arguments for ``case``. ``io_dtype`` casts the bf16 activations (rows,
    gates, output gate, out) keeping their strides, for Triton's interpreter, which mishandles
    bf16 arithmetic."""
    made = case.problem().make(device)
    HV, V = case.HV, case.V
    total, width = made["mixed_qkv"].shape
    gen = torch.Generator().manual_seed(case.seed + 500)
    # One qkvz buffer, as the layer splits it: mixed_qkv (the conv writes over its input) and
    # the output gate are column views of the same rows.
    qkvz = torch.empty(total, width + HV * V, dtype=torch.bfloat16, device=device)
    qkvz[:, :width] = made["mixed_qkv"]
    qkvz[:, width:] = torch.randn(total, HV * V, generator=gen).to(torch.bfloat16).to(device)
    mixed, output_gate = qkvz[:, :width], qkvz[:, width:].unflatten(-1, (HV, V))
    norm_weight = (1 + 0.5 * torch.randn(V, generator=gen)).to(TORCH_DTYPES[case.norm_weight_dtype])
    table = made["initial_state_indices"]
    accepted = made["num_accepted_tokens"]
    cu = made["cu_seqlens"].cpu()
    if len(case.padded_rows) > 1:
        table[case.padded_rows[-1]] = -1  # padding is any slot <= 0
    lengths = (cu[1:] - cu[:-1]).tolist()
    for n, length in enumerate(lengths):
        if n not in case.padded_rows and int(accepted[n]) == 1 and length >= 2:
            table[n, length - 1] = 0  # a live row's later token with no slot: no store
            break
    args = dict(
        mixed_qkv=mixed, a=made["a"], b=made["b"], A_log=made["A_log"],
        dt_bias=made["dt_bias"].to(TORCH_DTYPES[case.dt_bias_dtype]), state_indices=table,
        cu_seqlens=made["cu_seqlens"], num_accepted_tokens=accepted,
        state=made["initial_state"], output_gate=output_gate, norm_weight=norm_weight.to(device),
        out=torch.full((total, HV, V), float("nan"), dtype=torch.bfloat16, device=device),
        scale=case.K**-0.5, norm_eps=case.eps, output_gate_activation=case.activation,
    )  # fmt: skip
    if io_dtype is not None:
        for name in ("mixed_qkv", "a", "b", "output_gate", "out"):
            args[name] = _recast(args[name], io_dtype)
    return args


def _recast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype`` with the same strides (a view's strides outlive its base)."""
    out = torch.empty_strided(tensor.shape, tensor.stride(), dtype=dtype, device=tensor.device)
    out.copy_(tensor)
    return out


def fresh(args: dict) -> dict:
    """The arguments with new copies of what a call writes (the pool and the output)."""
    return dict(args, state=args["state"].clone(), out=args["out"].clone())


@dataclass
class MtpExpected:
    #: [tokens, HV, V] float64: the normed output; 0 on padded rows, NaN where nothing is written
    output: torch.Tensor
    #: the pool after the call, in the state dtype
    pool: torch.Tensor


def expected_mtp(args: dict, case: MtpCase, output_rounded_to: torch.dtype | None = None):
    """What the op must leave behind, in float64 (gdngen.reference): the recurrence of the packed
    per-token form, then the gated RMSNorm over each head's V. ``output_rounded_to``: round the
    recurrence's output to that dtype before the norm (vLLM's Triton port stores it in ``out``'s
    dtype first, as the unfused path does)."""
    q, k, v = split_mixed_qkv(args["mixed_qkv"][None], case.H, case.K, case.HV, case.V)
    call = reference_call(
        q, k, v, args["state"], args["A_log"], args["a"][None], args["dt_bias"], args["b"][None],
        scale=args["scale"], read_slots=args["state_indices"], null_slot=0,
        cu_seqlens=args["cu_seqlens"], num_accepted=args["num_accepted_tokens"],
    )  # fmt: skip
    output = call.output[0]
    if output_rounded_to is not None:
        output = output.to(output_rounded_to).double()
    normed = gated_rmsnorm(
        output, args["output_gate"], args["norm_weight"], eps=args["norm_eps"],
        activation=args["output_gate_activation"],
    )  # fmt: skip
    return MtpExpected(output=normed, pool=call.pool)


def check_mtp(who: str, args: dict, expected: MtpExpected, pool_before: torch.Tensor) -> None:
    """Everything the call with ``args`` wrote (``out``, ``state``) against ``expected``: the
    normed outputs, zeros on padded rows, the NaN fill of ``out`` left where no sequence has a
    token, the written states, and every other slot bit-identical."""
    out, pool = args["out"], args["state"]
    written = ~torch.isnan(expected.output)
    padded = expected.output == 0
    live = written & ~padded
    assert_close(f"{who}: output", out[live], expected.output[live], out.dtype)
    assert (out[padded] == 0).all(), f"{who}: padded rows must have zero output"
    assert torch.isnan(out[~written].float()).all(), f"{who}: an output row of no sequence changed"
    changed = (expected.pool != pool_before).flatten(1).any(1)
    assert changed.any(), "the case writes no state"
    assert_close(
        f"{who}: written states", pool[changed], expected.pool[changed].double(), pool.dtype
    )
    assert torch.equal(
        pool[~changed], pool_before[~changed]
    ), f"{who}: a slot it does not own changed"


def reference_gdn_decode(**kwargs):
    """gdn_decode's documented semantics of the call form the adapter uses (packed
    ``mixed_qkv``, per-token slots, the gated RMSNorm epilogue; docs/design.md, "Call forms"), in
    float64 on any device: a stand-in for the target where there is no GPU."""
    expected_keywords = {
        "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "use_qk_l2norm", "initial_state",
        "initial_state_indices", "num_accepted_tokens", "null_slot", "cu_seqlens", "max_seqlen",
        "uniform_seqlen", "output", "z", "norm_weight", "norm_eps", "norm_activation",
        "state_scales",
    }  # fmt: skip
    assert set(kwargs) == expected_keywords, set(kwargs) ^ expected_keywords
    assert kwargs["state_scales"] is None  # the stand-in reads a bf16 or fp32 pool
    pool, table, cu = kwargs["initial_state"], kwargs["initial_state_indices"], kwargs["cu_seqlens"]
    assert kwargs["use_qk_l2norm"] is True and not kwargs["uniform_seqlen"]
    assert int((cu[1:] - cu[:-1]).max()) <= kwargs["max_seqlen"] == table.shape[1]
    HV, V, K = pool.shape[1], pool.shape[2], pool.shape[3]
    H = (kwargs["mixed_qkv"].shape[1] - HV * V) // (2 * K)
    q, k, v = split_mixed_qkv(kwargs["mixed_qkv"][None], H, K, HV, V)
    call = reference_call(
        q, k, v, pool, kwargs["A_log"], kwargs["a"][None], kwargs["dt_bias"], kwargs["b"][None],
        scale=kwargs["scale"], read_slots=table, null_slot=kwargs["null_slot"], cu_seqlens=cu,
        num_accepted=kwargs["num_accepted_tokens"],
    )  # fmt: skip
    normed = gated_rmsnorm(
        call.output[0], kwargs["z"], kwargs["norm_weight"], eps=kwargs["norm_eps"],
        activation=kwargs["norm_activation"],
    )  # fmt: skip
    output = kwargs["output"]
    if output is None:
        output = torch.empty(normed.shape, dtype=kwargs["mixed_qkv"].dtype, device=pool.device)
    written = ~torch.isnan(normed)
    output[written] = normed[written].to(output.dtype)
    pool.copy_(call.pool)
    return output, pool
