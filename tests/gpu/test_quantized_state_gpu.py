"""The quantized states on the GPU, int8 and fp8 e4m3 (docs/design.md, "Quantized state"): each
call form the target serves them in, against the float64 reference on the same quantized pool
(tests/quantized_state.py says the bound)."""

import importlib

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import PackedProblem, Problem
from gdngen.terms import kernel_serves_head_dims
from gdngen.runtime.kernel_table import load_kernel
from tests.gpu.check_quantized import assert_quantized_call, check_quantized_call
from tests.quantized_state import quantized_pool

pytestmark = pytest.mark.gpu
QUANTIZED = ["int8", "fp8_e4m3"]


@pytest.mark.parametrize("state_dtype", QUANTIZED)
@pytest.mark.parametrize("batch", [1, 7, 64, 300])
@pytest.mark.parametrize("tokens", [1, 3])
def test_quantized_pool_dense_rows(batch, tokens, state_dtype):
    problem = Problem(
        batch=batch, tokens=tokens, HV=64, pool_size=batch + 9,
        padded_rows=(1,) if batch > 2 else (), seed=batch * 10 + tokens,
    )  # fmt: skip
    args = quantized_pool(problem.make("cuda"), state_dtype)
    check_quantized_call(args, read_slots=args["initial_state_indices"])


@pytest.mark.parametrize("state_dtype", QUANTIZED)
@pytest.mark.parametrize("sequences", [3, 40])
def test_quantized_pool_vllm_spec_decode(sequences, state_dtype):
    # vLLM's verify form: a [N, 1 + S] slot table, every token's state stored in the pool.
    problem = PackedProblem(sequences=sequences, tokens=4, HV=32, padded_rows=(1,), seed=sequences)
    args = quantized_pool(problem.make("cuda"), state_dtype)
    check_quantized_call(
        args, read_slots=args["initial_state_indices"], null_slot=0,
        cu_seqlens=args["cu_seqlens"], num_accepted=args["num_accepted_tokens"],
    )  # fmt: skip


@pytest.mark.parametrize("state_dtype", QUANTIZED)
@pytest.mark.parametrize("batch", [1, 37])
def test_quantized_pool_with_a_verify_cache(batch, state_dtype):
    # Target verify on dense rows (FlashInfer's MTP form): every token's state into the cache,
    # in the pool's format with its rows' scales; no final state written.
    problem = Problem(
        batch=batch, tokens=4, HV=32, pool_size=batch + 5, cache_steps=5,
        disable_state_update=True, padded_rows=(1,) if batch > 2 else (), seed=batch + 1,
    )  # fmt: skip
    args = quantized_pool(problem.make("cuda"), state_dtype)
    check_quantized_call(args, read_slots=args["initial_state_indices"])


@pytest.mark.parametrize("state_dtype", QUANTIZED)
def test_quantized_pool_with_sglangs_verify_rows(state_dtype):
    # SGLang's target verify: packed sequences, the cache rows named per sequence.
    problem = PackedProblem(
        sequences=9, tokens=4, HV=32, slots="row", cache="rows", cache_rows=13,
        disable_state_update=True, padded_rows=(2,), null_slot=-1, seed=4,
    )  # fmt: skip
    args = quantized_pool(problem.make("cuda"), state_dtype)
    check_quantized_call(
        args, read_slots=args["initial_state_indices"], cu_seqlens=args["cu_seqlens"]
    )


@pytest.mark.parametrize("state_dtype", QUANTIZED)
@pytest.mark.parametrize("batch", [3, 64])
def test_quantized_pool_with_flashinfers_token_scatter(batch, state_dtype):
    # ssm_state_indices [B, T]: the state after token t into its own slot, quantized with its
    # scales; a -1 entry stores nothing; a padding row (read slot -1); no final write
    problem = Problem(batch=batch, tokens=4, HV=32, pool_size=batch * 5 + 2, seed=batch + 2)
    args = quantized_pool(problem.make("cuda"), state_dtype)
    reads = args["initial_state_indices"]
    taken = set(reads.tolist())
    free = [s for s in range(args["initial_state"].shape[0]) if s not in taken][: batch * 4]
    scatter = torch.tensor(free, dtype=reads.dtype, device="cuda").view(batch, 4)
    reads[1] = -1
    scatter[0, 1] = -1
    check_quantized_call(
        args, read_slots=reads, flashinfer=dict(ssm_state_indices=scatter),
        ref=dict(token_slots=scatter),
    )  # fmt: skip


@pytest.mark.parametrize("state_dtype", QUANTIZED)
@pytest.mark.parametrize("batch", [5, 96])
def test_quantized_pool_with_flashinfers_state_recovery(batch, state_dtype):
    # accepted_steps [B]: each row replays its accepted tokens, stores the state after them in
    # its write slot (quantized, with its scales), decodes the rest; row 3 writes to -1
    problem = Problem(
        batch=batch, tokens=4, HV=32, pool_size=2 * batch + 3, separate_write_slots=True,
        padded_rows=(1,), seed=batch + 3,
    )  # fmt: skip
    args = quantized_pool(problem.make("cuda"), state_dtype)
    writes = args["output_state_indices"]
    writes[3] = -1
    gen = torch.Generator().manual_seed(batch)
    accepted = torch.randint(0, 4, (batch,), generator=gen).to(writes.dtype).cuda()
    check_quantized_call(
        args, read_slots=args["initial_state_indices"],
        flashinfer=dict(accepted_steps=accepted),
        ref=dict(write_slots=writes, accepted_steps=accepted),
    )  # fmt: skip


#: every quantized variant of the target that serves K = V = 128, whether its dispatch picks it
#: or not
QUANTIZED_VARIANTS = [
    name
    for name in h200.VARIANTS
    if name.startswith(("kl_int8_", "kl_fp8_e4m3_"))
    and kernel_serves_head_dims(load_kernel(f"generated.h200.kernels.{name}"), 128, 128)
]


@pytest.mark.parametrize("variant", QUANTIZED_VARIANTS)
def test_every_quantized_variant(variant):
    state_dtype = load_kernel(f"generated.h200.kernels.{variant}").STATE_DTYPE
    # Dense rows at T = 1 (a tile kept in units of its rows' scales: gdngen/device/quant.py) and
    # T = 2, with a padding row, then vLLM's verify form at T = 1 and T = 4.
    call = h200.variant(variant)
    for tokens in (1, 2):
        problem = Problem(
            batch=37, tokens=tokens, HV=32, pool_size=45, padded_rows=(5,), seed=7 + tokens
        )
        args = quantized_pool(problem.make("cuda"), state_dtype)
        check_quantized_call(args, read_slots=args["initial_state_indices"], call=call)
    # and the verify cache at T = 3, in the pool's format
    problem = Problem(
        batch=37, tokens=3, HV=32, pool_size=45, padded_rows=(5,), cache_steps=3,
        disable_state_update=True, seed=9,
    )  # fmt: skip
    args = quantized_pool(problem.make("cuda"), state_dtype)
    check_quantized_call(args, read_slots=args["initial_state_indices"], call=call)
    for tokens in (1, 4):
        problem = PackedProblem(sequences=9, tokens=tokens, HV=32, padded_rows=(2,), seed=8)
        args = quantized_pool(problem.make("cuda"), state_dtype)
        check_quantized_call(
            args, read_slots=args["initial_state_indices"], null_slot=0,
            cu_seqlens=args["cu_seqlens"], num_accepted=args["num_accepted_tokens"], call=call,
        )  # fmt: skip


@pytest.mark.parametrize("state_dtype", QUANTIZED)
@pytest.mark.parametrize("batch", [2, 33])
def test_quantized_pool_with_the_gated_norm(batch, state_dtype):
    problem = Problem(batch=batch, HV=64, pool_size=batch + 3, seed=batch)
    args = quantized_pool(problem.make("cuda"), state_dtype)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    z = torch.randn(args["v"].shape, generator=gen, device="cuda").bfloat16()
    weight = (1 + 0.1 * torch.randn(128, generator=gen, device="cuda")).bfloat16()
    check_quantized_call(args, read_slots=args["initial_state_indices"], norm=(z, weight))


@pytest.mark.parametrize("state_dtype", QUANTIZED)
def test_quantized_pool_under_a_cuda_graph(state_dtype):
    # Replays of one captured call on fresh inputs each time: the scales move with the pool.
    problem = Problem(batch=16, HV=64, pool_size=20, seed=3)
    args = quantized_pool(problem.make("cuda"), state_dtype)
    output = torch.empty(args["v"].shape, dtype=torch.bfloat16, device="cuda")
    h200.gdn_decode(**args, output=output)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h200.gdn_decode(**args, output=output)
    for seed in range(3):
        fresh = quantized_pool(problem.with_(seed=100 + seed).make("cuda"), state_dtype)
        for name in ("q", "k", "v", "a", "b", "initial_state", "state_scales"):
            args[name].copy_(fresh[name])
        before, scales_before = args["initial_state"].clone(), args["state_scales"].clone()
        graph.replay()
        torch.cuda.synchronize()
        assert_quantized_call(
            args, output, before, scales_before, read_slots=args["initial_state_indices"]
        )
