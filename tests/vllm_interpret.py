"""vLLM's chain (gdngen.bench.vllm_chain) run by Triton's interpreter on the CPU, against the
float64 reference: the argument forms of every call (slots, per-token table, accepted tokens,
conv state layouts, strided rows) checked where there is no GPU. Run in a fresh process with
``TRITON_INTERPRET=1`` (tests/test_vllm_chain_cpu.py does):

    TRITON_INTERPRET=1 python -m tests.vllm_interpret VLLM_SRC

Prints one JSON line per case: the relative errors of the output, the recurrent pool and the
conv pool. Three things of the interpreter are worked around, none of the chain's: it mishandles
bf16 arithmetic (NaN where fp32 is exact), so every tensor but a bf16 state is fp32 (the
kernels take any float dtype); it patches ``tl``'s functions but not the aliases vLLM's op.py
binds (``exp``, ``log``), which are routed to ``tl``; and ``range`` over a loaded scalar needs a
one-element array read as an index.
"""

from __future__ import annotations

import json
import sys

import torch
import triton.language as tl
import triton.runtime.interpreter as interpreter

from gdngen.bench import vllm_chain
from gdngen.bench.chain_steps import EPS
from gdngen.measure.vllm_kernels import vllm_kernels
from gdngen.problem import PackedProblem
from gdngen.reference import causal_conv1d_update, gated_rmsnorm, reference_call, split_mixed_qkv

WIDTH = 4
CASES = [  # B, T, HV, conv, state dtype, conv layout
    (3, 1, 32, True, "bf16", "channels_last"),
    (2, 1, 64, False, "fp32", "channels_first"),
    (3, 2, 32, True, "fp32", "channels_last"),
    (4, 4, 32, True, "bf16", "channels_first"),
    (2, 3, 64, False, "bf16", "channels_last"),
]


def _work_around_the_interpreter() -> None:
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    recurrent = sys.modules["vllm.third_party.flash_linear_attention.ops.fused_recurrent"]
    recurrent.exp, recurrent.log = (lambda x: tl.exp(x)), (lambda x: tl.log(x))
    norm = sys.modules["vllm.third_party.flash_linear_attention.ops.layernorm_guard"]
    norm.num_compute_units = lambda device_id: 132  # an H100's; no device here


def _fp32_like(t):
    """A bf16 tensor in fp32 with its strides (an engine's rows and gates are views)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=torch.float32)
    out.copy_(t)
    return out


def make_set(B, T, HV, conv, state_dtype, layout, H=16, K=128, V=128) -> tuple:
    problem = PackedProblem(
        sequences=B, tokens=T, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, mixed_qkv=True,
        slots="per_token" if T > 1 else "row",
    )  # fmt: skip
    args = problem.make("cpu")
    args = {k: _fp32_like(v) if k != "initial_state" else v for k, v in args.items()}
    gen = torch.Generator().manual_seed(7)
    D = 2 * H * K + HV * V
    slots, columns = args["initial_state"].shape[0], WIDTH - 2 + T

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    pool = randn(slots, columns, D).transpose(1, 2) if layout == "channels_last" else None
    s = dict(
        args=args, z=randn(1, B * T, HV, V), norm_weight=1 + 0.1 * randn(V),
        output=torch.empty(1, B * T, HV, V), conv_weight=randn(D, WIDTH, std=0.5),
        conv_bias=randn(D, std=0.2),
        conv_state=pool if pool is not None else randn(slots, D, columns),
    )  # fmt: skip
    return problem, s


def reference(problem, s, conv) -> tuple:
    """Output [B * T, HV, V], recurrent pool and conv pool after the call, in float64."""
    args = s["args"]
    B, T, H, HV, K, V = (problem.sequences, problem.tokens, problem.H, problem.HV, problem.K,
                         problem.V)  # fmt: skip
    rows = args["mixed_qkv"][0].view(B, T, -1)
    table, accepted = args["initial_state_indices"], args.get("num_accepted_tokens")
    conv_pool = None
    if conv:
        layout = "channels_first" if s["conv_state"].stride(-1) == 1 else "channels_last"
        held = s["conv_state"] if layout == "channels_first" else s["conv_state"].transpose(1, 2)
        rows, conv_pool = causal_conv1d_update(
            rows, held, s["conv_weight"], s["conv_bias"], slots=table if T == 1 else table[:, 0],
            null_slot=0, state_layout=layout, accepted=accepted,
        )  # fmt: skip
        conv_pool = conv_pool if layout == "channels_first" else conv_pool.transpose(1, 2)
    q, k, v = split_mixed_qkv(rows.float().reshape(1, B * T, -1), H, K, HV, V)
    expected = reference_call(
        q, k, v, args["initial_state"], args["A_log"], args["a"][None], args["dt_bias"],
        args["b"][None], read_slots=table, null_slot=0, cu_seqlens=args["cu_seqlens"],
        num_accepted=accepted,
    )  # fmt: skip
    normed = gated_rmsnorm(expected.output.float(), s["z"], s["norm_weight"], eps=EPS)
    return normed[0], expected.pool, conv_pool


def relative(got, expected) -> float:
    return float((got.double() - expected.double()).norm() / expected.double().norm())


def main(source: str) -> None:
    kernels = vllm_kernels(source)
    if isinstance(kernels, str):
        raise SystemExit(kernels)
    _work_around_the_interpreter()
    for B, T, HV, conv, state_dtype, layout in CASES:
        problem, s = make_set(B, T, HV, conv, state_dtype, layout)
        expected_output, expected_pool, expected_conv = reference(problem, s, conv)
        vllm_chain.prepare_set(s, conv)
        run = vllm_chain.vllm_chain(
            kernels, vllm_chain.triton_gated_rmsnorm(kernels), H=problem.H, K=problem.K,
            V=problem.V, tokens=T, conv=conv,
        )  # fmt: skip
        output = run(s)
        native = vllm_chain.native_gated_rmsnorm(s["output"][0], s["z"][0], s["norm_weight"], EPS)
        print(json.dumps(dict(
            case=[B, T, HV, conv, state_dtype, layout],
            output=relative(output, expected_output),
            state=relative(s["args"]["initial_state"], expected_pool),
            conv_state=relative(s["conv_state"], expected_conv) if conv else None,
            native_norm=relative(native, output),
        )), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
