"""Run one gdn_decode call on a fresh random problem and check everything it wrote (and did not)."""

import torch

from gdngen.problem import TORCH_DTYPES, Problem, state_of
from gdngen.reference import reference_decode
from gdngen.terms import SCALED_STATE_DTYPES
from tests.compare import assert_close
from tests.gpu.check_quantized import check_quantized_call


def as_k_last(state: torch.Tensor, layout: str) -> torch.Tensor:
    return state if layout == "k_last" else state.transpose(-1, -2)


def run_and_check(
    call, problem: Problem, *, pass_output: bool = True, device="cuda", unwritten_rows=(), **extra
) -> None:
    """``device``: where the problem's tensors live (the current device may be another).
    ``unwritten_rows``: rows whose write slot is set to -1 (FlashInfer's meaning: computed, no
    final state stored; the problem needs separate write slots). ``extra``: more keywords of the
    call. A quantized state (int8, fp8 e4m3) is checked by tests/gpu/check_quantized.py."""
    args = problem.make(device)
    for row in unwritten_rows:
        args["output_state_indices"][row] = -1
    if problem.state_dtype in SCALED_STATE_DTYPES:
        read_slots = args.get("initial_state_indices")
        check_quantized_call(args, read_slots=read_slots, call=call, flashinfer=extra)
        return
    pool = state_of(args)
    pool_before = pool.clone()
    cache = args.get("intermediate_states_buffer")
    io = TORCH_DTYPES[problem.io_dtype]
    B, T, HV, V = problem.batch, problem.tokens, problem.HV, problem.V
    output = (
        torch.full((B, T, HV, V), float("nan"), dtype=io, device=device) if pass_output else None
    )

    out, returned = call(**args, output=output, **extra)
    torch.cuda.synchronize(device)

    assert returned is pool, "gdn_decode must return the state it updated in place"
    if pass_output:
        assert out is output, "gdn_decode must write into the output it was given"
    ref = reference_decode(
        args["q"], args["k"], args["v"], pool_before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=problem.scale, use_qk_l2norm=problem.use_qk_l2norm,
        read_slots=args.get("initial_state_indices"), write_slots=args.get("output_state_indices"),
        disable_state_update=problem.disable_state_update, state_layout=problem.layout,
    )  # fmt: skip
    live = ref.live
    assert_close("output", out[live], ref.output[live], io)
    if (~live).any():
        assert (out[~live] == 0).all(), "padded rows must have zero output"

    state_dtype = TORCH_DTYPES[problem.state_dtype]
    if args["state"] is not None:
        writes = torch.arange(B, device=device)
    else:
        slots = args.get("output_state_indices", args["initial_state_indices"])
        writes = slots.long()
    touched = torch.zeros(pool.shape[0], dtype=torch.bool, device=device)
    if not problem.disable_state_update:
        writing = live & (writes >= 0)  # a live row with a negative write slot stores nothing
        written = writes[writing]
        touched[written] = True
        assert_close(
            "final state",
            as_k_last(pool[written], problem.layout),
            ref.final_state[writing],
            state_dtype,
        )
    assert torch.equal(
        pool[~touched], pool_before[~touched]
    ), "a slot the call does not own changed"

    if cache is not None:
        got = as_k_last(cache[live, :T], problem.layout)
        assert_close("intermediate states", got, ref.intermediates[live], state_dtype)
        beyond = cache[:, T:]
        assert torch.isnan(beyond.float()).all(), "cache entries past T were written"
        assert torch.isnan(
            cache[~live].float()
        ).all(), "cache rows of padded batch rows were written"


def replay_and_check(graph, problem: Problem, args: dict, output, *, device="cuda", seed=100):
    """Replay a captured graph of one call three times, each after copying a fresh problem's
    inputs and slots (seeds ``seed``, ``seed + 1``, ...) into the captured tensors, and check
    the output, the states written and the cache against the reference (bf16 state and io)."""
    pool = args["initial_state"]
    for replay in range(3):
        fresh = problem.with_(seed=seed + replay).make(device)
        for name in ("q", "k", "v", "a", "b", "initial_state", "initial_state_indices"):
            args[name].copy_(fresh[name])
        before = pool.clone()
        graph.replay()
        torch.cuda.synchronize(device)
        ref = reference_decode(
            args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
            args["b"], read_slots=args["initial_state_indices"],
        )  # fmt: skip
        live = ref.live
        assert_close("graph output", output[live], ref.output[live], torch.bfloat16)
        written = args["initial_state_indices"].long()[live]
        assert_close("graph state", pool[written], ref.final_state[live], torch.bfloat16)
        cache = args["intermediate_states_buffer"]
        assert_close("graph cache", cache[live], ref.intermediates[live], torch.bfloat16)
