"""Run one engine-form gdn_decode call (gdngen.problem.PackedProblem) and check everything it
wrote, and that nothing else changed, against gdngen.reference.reference_call."""

import torch

from gdngen.problem import TORCH_DTYPES, PackedProblem
from gdngen.reference import reference_call
from gdngen.terms import SCALED_STATE_DTYPES
from tests.compare import assert_close
from tests.gpu.check_quantized import check_quantized_call


def kernel_form(args: dict, problem: PackedProblem) -> dict:
    """q, k, v, a, b as [1, total, ...], split from mixed_qkv by hand where given."""
    H, K, HV, V = problem.H, problem.K, problem.HV, problem.V
    if "mixed_qkv" in args:
        mixed = args["mixed_qkv"].reshape(-1, args["mixed_qkv"].shape[-1])
        q = mixed[:, : H * K].reshape(1, -1, H, K)
        k = mixed[:, H * K : 2 * H * K].reshape(1, -1, H, K)
        v = mixed[:, 2 * H * K :].reshape(1, -1, HV, V)
    else:
        q, k, v = (args[n] if args[n].dim() == 4 else args[n][None] for n in "qkv")
    a, b = (args[n] if args[n].dim() == 3 else args[n][None] for n in "ab")
    return dict(q=q, k=k, v=v, a=a, b=b)


def expected_of(args: dict, problem: PackedProblem, pool_before, cache_before):
    form = kernel_form(args, problem)
    return reference_call(
        form["q"], form["k"], form["v"], pool_before, args["A_log"], form["a"], args["dt_bias"],
        form["b"], scale=args.get("scale"), read_slots=args.get("initial_state_indices"),
        disable_state_update=args["disable_state_update"], state_layout=problem.layout,
        null_slot=args["null_slot"], cu_seqlens=args["cu_seqlens"],
        num_accepted=args.get("num_accepted_tokens"), cache=cache_before,
        cache_rows=args.get("intermediate_state_indices"),
    )  # fmt: skip


def check_against(
    expected, out, pool, cache, problem: PackedProblem, pool_before, cache_before,
    inputs_rounded_to=None,
):  # fmt: skip
    """``inputs_rounded_to``: see tests.compare.assert_close (the split conv plan's states)."""
    io = torch.bfloat16
    state_dtype = TORCH_DTYPES[problem.state_dtype]
    out4 = out if out.dim() == 4 else out[None]
    written = ~torch.isnan(expected.output)
    padded = expected.output == 0
    assert_close("output", out4[written & ~padded], expected.output[written & ~padded], io)
    assert (out4[padded] == 0).all(), "padded rows must have zero output"

    changed = (expected.pool != pool_before).flatten(1).any(1)
    assert_close(
        "written states", pool[changed], expected.pool[changed].double(), state_dtype,
        inputs_rounded_to,
    )  # fmt: skip
    assert torch.equal(
        pool[~changed], pool_before[~changed]
    ), "a slot the call does not own changed"
    if cache is not None:
        filled = ~torch.isnan(expected.cache.float())
        assert_close(
            "cached states", cache[filled], expected.cache[filled].double(), state_dtype,
            inputs_rounded_to,
        )  # fmt: skip
        assert torch.isnan(
            cache[~filled].float()
        ).all(), "a cache entry the call does not own was written"


def run_form(call, problem: PackedProblem, *, pass_output: bool = False) -> dict:
    """One call in ``problem``'s form against the reference; a quantized state (int8, fp8 e4m3)
    by tests/gpu/check_quantized.py (q, k and v as tensors of their own: no mixed_qkv)."""
    args = problem.make("cuda")
    if problem.state_dtype in SCALED_STATE_DTYPES:
        assert "mixed_qkv" not in args, "a quantized state's forms are checked with q, k and v"
        check_quantized_call(
            args, read_slots=args.get("initial_state_indices"), null_slot=args["null_slot"],
            cu_seqlens=args["cu_seqlens"], num_accepted=args.get("num_accepted_tokens"),
            call=call,
        )  # fmt: skip
        return args
    pool = args["initial_state"]
    pool_before = pool.clone()
    cache = args.get("intermediate_states_buffer")
    cache_before = None if cache is None else cache.clone()
    if pass_output:
        total = kernel_form(args, problem)["v"].shape[1]  # the token buffer, used or not
        shape = (
            (total, problem.HV, problem.V) if problem.flat else (1, total, problem.HV, problem.V)
        )
        args["output"] = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    out, returned = call(**args)
    torch.cuda.synchronize()
    assert returned is pool
    expected = expected_of(args, problem, pool_before, cache_before)
    check_against(expected, out, pool, cache, problem, pool_before, cache_before)
    if pass_output:
        assert out is args["output"]
        # Tokens of no sequence (past cu_seqlens[-1]) get no output: the NaN fill stays.
        unused = torch.isnan(expected.output)
        out4 = out if out.dim() == 4 else out[None]
        assert torch.isnan(out4[unused].float()).all(), "an output row of no sequence was written"
    return args
