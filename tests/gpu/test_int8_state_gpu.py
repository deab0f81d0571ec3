"""The int8 state on the GPU (docs/design.md, "Quantized state"): each call form the target serves
it in, against the float64 reference on the same int8 pool (tests/int8_state.py says the bound)."""

import importlib

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import PackedProblem, Problem
from gdngen.reference.decode import reference_call
from gdngen.reference.norm import gated_rmsnorm
from gdngen.terms import kernel_serves_head_dims
from tests.compare import assert_close
from tests.int8_state import assert_int8_pool, int8_pool

pytestmark = pytest.mark.gpu


def _check(
    args: dict, *, read_slots, null_slot=-1, cu_seqlens=None, num_accepted=None, norm=None,
    call=h200.gdn_decode,
):  # fmt: skip
    before, scales_before = args["initial_state"].clone(), args["state_scales"].clone()
    output = torch.full(args["v"].shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    extra = {} if norm is None else dict(z=norm[0], norm_weight=norm[1])
    call(**args, output=output, **extra)
    torch.cuda.synchronize()
    _assert_call(
        args, output, before, scales_before, read_slots=read_slots, null_slot=null_slot,
        cu_seqlens=cu_seqlens, num_accepted=num_accepted, norm=norm,
    )  # fmt: skip


def _assert_call(args, output, before, scales_before, *, read_slots, norm=None, **forms):
    """What the call left in ``output`` and in the pool against the reference's, from the pool
    ``before`` it and its scales (``forms``: reference_call's null_slot, cu_seqlens, ...)."""
    expected = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], read_slots=read_slots, state_scales=scales_before, **forms,
    )  # fmt: skip
    ref = expected.output
    if norm is not None:
        ref = gated_rmsnorm(ref, norm[0], norm[1], eps=1e-6, activation="silu")
    live = ~torch.isnan(ref)
    assert_close("output", output[live], ref[live], torch.bfloat16)
    pool, scales = args["initial_state"], args["state_scales"]
    assert_int8_pool(pool, scales, expected.pool, expected.scales, before, scales_before)


@pytest.mark.parametrize("batch", [1, 7, 64, 300])
@pytest.mark.parametrize("tokens", [1, 3])
def test_int8_pool_dense_rows(batch, tokens):
    problem = Problem(
        batch=batch, tokens=tokens, HV=64, pool_size=batch + 9,
        padded_rows=(1,) if batch > 2 else (), seed=batch * 10 + tokens,
    )  # fmt: skip
    args = int8_pool(problem.make("cuda"))
    _check(args, read_slots=args["initial_state_indices"])


@pytest.mark.parametrize("sequences", [3, 40])
def test_int8_pool_vllm_spec_decode(sequences):
    # vLLM's verify form: a [N, 1 + S] slot table, every token's state stored in the pool.
    problem = PackedProblem(sequences=sequences, tokens=4, HV=32, padded_rows=(1,), seed=sequences)
    args = int8_pool(problem.make("cuda"))
    _check(
        args, read_slots=args["initial_state_indices"], null_slot=0,
        cu_seqlens=args["cu_seqlens"], num_accepted=args["num_accepted_tokens"],
    )  # fmt: skip


#: every int8 variant of the target that serves K = V = 128, whether its dispatch picks it or not
INT8_VARIANTS = [
    name
    for name in h200.VARIANTS
    if name.startswith("kl_int8_")
    and kernel_serves_head_dims(importlib.import_module(f"generated.h200.kernels.{name}"), 128, 128)
]


@pytest.mark.parametrize("variant", INT8_VARIANTS)
def test_every_int8_variant(variant):
    # Dense rows at T = 2 with a padding row, then vLLM's verify form at T = 4.
    call = h200.variant(variant)
    problem = Problem(batch=37, tokens=2, HV=32, pool_size=45, padded_rows=(5,), seed=7)
    args = int8_pool(problem.make("cuda"))
    _check(args, read_slots=args["initial_state_indices"], call=call)
    problem = PackedProblem(sequences=9, tokens=4, HV=32, padded_rows=(2,), seed=8)
    args = int8_pool(problem.make("cuda"))
    _check(
        args, read_slots=args["initial_state_indices"], null_slot=0,
        cu_seqlens=args["cu_seqlens"], num_accepted=args["num_accepted_tokens"], call=call,
    )  # fmt: skip


@pytest.mark.parametrize("batch", [2, 33])
def test_int8_pool_with_the_gated_norm(batch):
    problem = Problem(batch=batch, HV=64, pool_size=batch + 3, seed=batch)
    args = int8_pool(problem.make("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(batch)
    z = torch.randn(args["v"].shape, generator=gen, device="cuda").bfloat16()
    weight = (1 + 0.1 * torch.randn(128, generator=gen, device="cuda")).bfloat16()
    _check(args, read_slots=args["initial_state_indices"], norm=(z, weight))


def test_int8_pool_under_a_cuda_graph():
    # Replays of one captured call on fresh inputs each time: the scales move with the pool.
    problem = Problem(batch=16, HV=64, pool_size=20, seed=3)
    args = int8_pool(problem.make("cuda"))
    output = torch.empty(args["v"].shape, dtype=torch.bfloat16, device="cuda")
    h200.gdn_decode(**args, output=output)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h200.gdn_decode(**args, output=output)
    for seed in range(3):
        fresh = int8_pool(problem.with_(seed=100 + seed).make("cuda"))
        for name in ("q", "k", "v", "a", "b", "initial_state", "state_scales"):
            args[name].copy_(fresh[name])
        before, scales_before = args["initial_state"].clone(), args["state_scales"].clone()
        graph.replay()
        torch.cuda.synchronize()
        _assert_call(args, output, before, scales_before, read_slots=args["initial_state_indices"])
