"""Packed calls whose token buffer is longer than ``cu_seqlens[-1]`` (an engine pads its token
buffer to a captured size): every sequence is placed where ``cu_seqlens`` says, whatever the
buffer's length, and no slot the call does not own changes. With the caller's promise
``uniform_seqlen=True`` sequence n is placed at n * max_seqlen, and a row that breaks the promise
is not served: none of its slots written, no output computed for its tokens (docs/design.md,
"Call forms")."""

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import PackedProblem
from tests.gpu.check_form import check_against, expected_of, kernel_form, run_form

pytestmark = pytest.mark.gpu

SEQUENCES = 9


def mixed(tokens: int, **over) -> PackedProblem:
    """Mixed lengths (1..T, one padded row of none), drawn until some sequence is shorter than T
    so that cu_seqlens[-1] < N * T."""
    for seed in range(1000 + tokens, 2000):
        problem = PackedProblem(
            sequences=SEQUENCES, tokens=tokens, mixed_lengths=True, padded_rows=(4,), seed=seed,
            **over,
        )  # fmt: skip
        cu = problem.with_(buffer_tokens=None).make("cpu")["cu_seqlens"]
        if int(cu[-1]) < SEQUENCES * tokens - 1:
            return problem
    raise AssertionError("no seed gave mixed lengths")


def live_tokens(problem: PackedProblem) -> int:
    return int(problem.with_(buffer_tokens=None).make("cpu")["cu_seqlens"][-1])


BUFFERS = {
    # exactly N * T tokens: the shape a uniform batch has, so a kernel that took the shape for
    # uniform rows would read other sequences' tokens and write slots past shorter sequences
    "n_times_t": lambda p: p.sequences * p.tokens,
    "past_n_times_t": lambda p: p.sequences * p.tokens + 3,
    "one_past_live": lambda p: live_tokens(p) + 1,
}


@pytest.mark.parametrize("buffer", sorted(BUFFERS))
@pytest.mark.parametrize("slots", ["per_token", "row"])
@pytest.mark.parametrize("tokens", range(2, 9))
@pytest.mark.parametrize("state_dtype", ["bf16", "fp16", "fp32"])
def test_a_padded_token_buffer_is_placed_by_cu_seqlens(state_dtype, tokens, slots, buffer):
    null = 0 if slots == "per_token" else -1
    problem = mixed(tokens, state_dtype=state_dtype, slots=slots, null_slot=null)
    problem = problem.with_(buffer_tokens=BUFFERS[buffer](problem))
    run_form(h200.gdn_decode, problem, pass_output=True)


@pytest.mark.parametrize("tokens", [2, 3, 4, 8])
@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_the_uniform_promise_kept_places_rows_at_n_times_t(state_dtype, tokens):
    """Every live sequence has T tokens; trailing rows are a graph-padded batch's (no tokens,
    slot 0), and the buffer holds N * T tokens."""
    problem = PackedProblem(
        sequences=SEQUENCES, tokens=tokens, state_dtype=state_dtype, null_slot=0,
        uniform_seqlen=True, seed=70 + tokens,
    )  # fmt: skip
    args = problem.make("cuda")
    cu, table = args["cu_seqlens"], args["initial_state_indices"]
    live = SEQUENCES - 3
    cu[live + 1 :] = cu[live]  # rows live.. have no tokens
    table[live:] = 0
    args["num_accepted_tokens"][live:] = 1
    _run_and_check(args, problem)


def _not_computed(values: torch.Tensor) -> bool:
    """Output rows no served row computed: NaN (left, or a row not served), or zero (a padding
    row's fill)."""
    values = values.float()
    return bool((torch.isnan(values) | (values == 0)).all())


def _run_and_check(args: dict, problem: PackedProblem, not_served=()):
    """One call into an output filled with NaN, checked against the reference with the rows
    ``not_served`` as padding (their slots must not change); those rows' tokens, and the
    tokens of no sequence, get no computed output."""
    pool = args["initial_state"]
    pool_before = pool.clone()
    tokens = kernel_form(args, problem)["v"].shape[1]
    args["output"] = torch.full(
        (1, tokens, problem.HV, problem.V), float("nan"), dtype=torch.bfloat16, device="cuda"
    )
    out, _ = h200.gdn_decode(**args)
    torch.cuda.synchronize()
    reference_args = dict(args)
    if not_served:
        # The reference has no such rows: as padding they read and write nothing, and output
        # zeros where the kernel computes nothing.
        table = args["initial_state_indices"].clone()
        table[list(not_served)] = args["null_slot"]
        reference_args["initial_state_indices"] = table
    expected = expected_of(reference_args, problem, pool_before, None)
    cu = args["cu_seqlens"].tolist()
    assert _not_computed(out[:, cu[-1] :]), "output past cu_seqlens[-1] computed"
    for row in not_served:
        got = out[:, cu[row] : cu[row + 1]]
        assert _not_computed(got), f"row {row}: a row not served has computed output"
        got.zero_()
    check_against(expected, out, pool, None, problem, pool_before, None)


def _misplaced_rows(cu: list[int], tokens: int, owned) -> list[int]:
    """Rows with tokens and slots that break the promise: not at n * T, or not T long."""
    return [
        n for n in range(len(cu) - 1)
        if cu[n + 1] > cu[n] and (cu[n] != n * tokens or cu[n + 1] - cu[n] != tokens)
        and owned[n]
    ]  # fmt: skip


@pytest.mark.parametrize("slots", ["per_token", "row"])
@pytest.mark.parametrize("tokens", [2, 4, 8])
@pytest.mark.parametrize("state_dtype", ["bf16", "fp16", "fp32"])
def test_a_broken_uniform_promise_writes_no_slot_it_does_not_own(state_dtype, tokens, slots):
    """uniform_seqlen=True over mixed lengths in a buffer of N * T tokens: the rows of T tokens
    at n * T are served exactly; every other row with tokens computes no output and changes no
    slot (its table's slots included)."""
    null = 0 if slots == "per_token" else -1
    problem = mixed(tokens, state_dtype=state_dtype, slots=slots, null_slot=null)
    problem = problem.with_(buffer_tokens=SEQUENCES * tokens, uniform_seqlen=True)
    args = problem.make("cuda")
    cu = args["cu_seqlens"].tolist()
    indices = args["initial_state_indices"]
    if slots == "per_token":
        read = indices.gather(1, (args["num_accepted_tokens"].long() - 1)[:, None])[:, 0]
    else:
        read = indices
    misplaced = _misplaced_rows(cu, tokens, (read > null).tolist())
    assert misplaced, "the draw must break the promise somewhere"
    _run_and_check(args, problem, not_served=misplaced)


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_a_sequence_longer_than_max_seqlen_stores_nothing(state_dtype):
    """Index checks off, sequences of 1..4 tokens called with max_seqlen=3: the rows of 4
    tokens are bad input, so they store no state and compute no output; the others are served."""
    problem = mixed(4, state_dtype=state_dtype, null_slot=0)
    args = problem.make("cuda")
    args["max_seqlen"] = 3
    cu = args["cu_seqlens"].tolist()
    table = args["initial_state_indices"]
    read = table.gather(1, (args["num_accepted_tokens"].long() - 1)[:, None])[:, 0]
    too_long = [n for n in range(SEQUENCES) if cu[n + 1] - cu[n] > 3 and read[n] > 0]
    assert too_long, "the draw must have a sequence of 4 tokens"
    # the accepted counts stay within the 3 columns the compiled T reads first
    args["num_accepted_tokens"].clamp_(max=3)
    _run_and_check(args, problem, not_served=too_long)


def _capture(args: dict):
    h200.gdn_decode.prepare(**args)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out, _ = h200.gdn_decode(**args)
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_graph_replay_with_new_cu_seqlens_in_a_padded_buffer(state_dtype):
    """One captured call over a buffer of N * T tokens; between replays cu_seqlens changes in
    place (mixed lengths, fewer live tokens than the buffer, uniform rows too), and so do the
    accepted counts. Each replay is checked against the reference, untouched slots included."""
    tokens = 4
    problem = mixed(tokens, state_dtype=state_dtype, null_slot=0)
    problem = problem.with_(buffer_tokens=SEQUENCES * tokens)
    args = problem.make("cuda")
    graph, out = _capture(args)
    pool = args["initial_state"]
    cu = args["cu_seqlens"]
    generator = torch.Generator().manual_seed(5)
    patterns = [
        torch.randint(0, tokens + 1, (SEQUENCES,), generator=generator) for _ in range(3)
    ] + [torch.full((SEQUENCES,), tokens), torch.full((SEQUENCES,), 1)]
    for lengths in patterns:
        cu[1:] = lengths.cumsum(0).to(cu.dtype).cuda()
        accepted = torch.randint(1, tokens + 1, (SEQUENCES,), generator=generator)
        args["num_accepted_tokens"].copy_(accepted.to(args["num_accepted_tokens"].dtype))
        pool_before = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        expected = expected_of(args, problem, pool_before, None)
        check_against(expected, out, pool, None, problem, pool_before, None)


def test_graph_replay_keeps_the_uniform_promise_with_fewer_live_rows():
    """uniform_seqlen=True, captured once: replays with 9, 5 and 1 live sequences of T tokens
    (the rest empty, slot 0), as a graph-padded decode batch of spec requests."""
    tokens = 3
    problem = PackedProblem(
        sequences=SEQUENCES, tokens=tokens, null_slot=0, uniform_seqlen=True, seed=90
    )
    args = problem.make("cuda")
    graph, out = _capture(args)
    pool = args["initial_state"]
    cu, table = args["cu_seqlens"], args["initial_state_indices"]
    full_table = table.clone()
    for live in (SEQUENCES, 5, 1):
        lengths = torch.tensor([tokens] * live + [0] * (SEQUENCES - live))
        cu[1:] = lengths.cumsum(0).to(cu.dtype).cuda()
        table.copy_(full_table)
        table[live:] = 0
        pool_before = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        expected = expected_of(args, problem, pool_before, None)
        check_against(expected, out, pool, None, problem, pool_before, None)
