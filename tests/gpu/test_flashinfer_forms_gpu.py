"""FlashInfer's decode forms under FlashInfer's names (docs/design.md, "Call forms"): a negative
``output_state_indices`` entry (the row is computed, no final state stored), the per-token
scatter ``ssm_state_indices [B, T]``, strided pools and state recovery (``accepted_steps``,
``recovery_steps``). Each call is checked against the float64 reference, and
every pool slot the call does not own must keep its bits."""

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import Problem
from gdngen.reference import reference_call, reference_decode
from tests.compare import assert_close
from gdngen.problem import TORCH_DTYPES
from tests.gpu.check_call import as_k_last, run_and_check

pytestmark = pytest.mark.gpu

SERVED = [("k_last", "bf16"), ("k_last", "fp16"), ("k_last", "fp32"), ("v_last", "bf16"),
          ("v_last", "fp16"), ("v_last", "fp32")]  # fmt: skip


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize(
    "tokens,cache", [(1, False), (3, False), (4, True)], ids=["t1", "t3", "t4_cache"]
)
@pytest.mark.parametrize("batch", [6, 96])
def test_negative_write_slot_computes_the_row_and_stores_no_state(
    layout, state_dtype, tokens, cache, batch
):  # fmt: skip
    """Rows 2 and 4 write to -1: their outputs (and verify-cache rows) are the reference's, their
    read slots keep their bits; row 1 is padding (read slot -1): zero output. Two batch sizes
    reach different variants of the dispatch."""
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=2 * batch + 3, separate_write_slots=True, padded_rows=(1,),
        cache_steps=tokens if cache else None, seed=batch + tokens,
    )  # fmt: skip
    run_and_check(h200.gdn_decode, problem, unwritten_rows=(2, 4))


def test_negative_write_slot_passes_the_index_check():
    """check_indices=True accepts rows that write nothing, and two of them may share -1."""
    problem = Problem(batch=5, tokens=2, HV=32, pool_size=12, separate_write_slots=True, seed=4)
    run_and_check(h200.gdn_decode, problem, unwritten_rows=(0, 3), check_indices=True)


@pytest.mark.parametrize("null_slot", [-1, 0])
def test_write_slot_at_null_slot_writes_nothing(null_slot):
    """With null_slot=0 (vLLM's null block) a write slot of 0 is padding as -1 is: the row is
    computed and stores nothing; slot 0 and the row's read slot keep their bits."""
    problem = Problem(batch=4, tokens=2, HV=32, pool_size=12, separate_write_slots=True, seed=9)
    args = problem.make("cuda")
    index = args["initial_state_indices"].dtype
    args["initial_state_indices"] = torch.tensor([1, 2, 3, 4], dtype=index, device="cuda")
    args["output_state_indices"] = torch.tensor([5, null_slot, 7, 8], dtype=index, device="cuda")
    pool = args["initial_state"]
    before = pool.clone()
    out, _ = h200.gdn_decode(**args, null_slot=null_slot)
    torch.cuda.synchronize()
    ref = reference_decode(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], read_slots=args["initial_state_indices"],
        write_slots=torch.tensor([5, -1, 7, 8], device="cuda"),
    )  # fmt: skip
    assert_close("output", out, ref.output, torch.bfloat16)
    assert_close("pool", pool.double(), ref.pool.double(), torch.bfloat16)
    for slot in (0, 2, 6, 9, 10, 11):  # read by row 1, or owned by no row
        assert torch.equal(pool[slot], before[slot]), f"slot {slot} changed"


def free_slot_table(reads: torch.Tensor, pool_size: int, batch: int, tokens: int) -> torch.Tensor:
    """A [batch, tokens] per-token table of distinct pool slots that no row reads."""
    taken = set(reads.tolist())
    free = [s for s in range(pool_size) if s not in taken]
    table = torch.tensor(free[: batch * tokens], dtype=reads.dtype, device=reads.device)
    return table.view(batch, tokens).contiguous()


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [3, 64])
def test_token_scatter_matches_the_reference(layout, state_dtype, tokens, batch):
    """ssm_state_indices [B, T]: row n's initial state from initial_state_indices[n], its state
    after token t into ssm_state_indices[n, t]; row 1 is padding (read slot -1), row 0's second
    entry is -1 (that token's state is not stored); no final write; every other slot keeps its
    bits."""
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=batch * (tokens + 1) + 2, seed=batch * 10 + tokens,
    )  # fmt: skip
    args = problem.make("cuda")
    reads = args["initial_state_indices"]
    pool = args["initial_state"]
    scatter = free_slot_table(reads, pool.shape[0], batch, tokens)
    reads[1] = -1
    if tokens > 1:
        scatter[0, 1] = -1
    before = pool.clone()
    output = torch.full_like(args["v"], float("nan"))
    out, returned = h200.gdn_decode(**args, output=output, ssm_state_indices=scatter)
    torch.cuda.synchronize()
    assert returned is pool and out is output
    want = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=problem.scale, use_qk_l2norm=problem.use_qk_l2norm, read_slots=reads,
        state_layout=layout, token_slots=scatter,
    )  # fmt: skip
    io = args["q"].dtype
    assert_close("output", out, want.output, io)
    stored = scatter[torch.arange(batch, device="cuda") != 1]
    stored = stored[stored >= 0].long()
    assert_close("scattered states", pool[stored], want.pool[stored].double(), pool.dtype)
    untouched = torch.ones(pool.shape[0], dtype=torch.bool, device="cuda")
    untouched[stored] = False
    assert torch.equal(pool[untouched], before[untouched]), "a slot the call does not own changed"


def test_token_scatter_with_index_checks_and_a_graph():
    """check_indices=True accepts the call; a captured graph replays it into the same slots."""
    problem = Problem(batch=4, tokens=3, HV=32, pool_size=20, seed=5)
    args = problem.make("cuda")
    scatter = torch.arange(4, 16, dtype=args["initial_state_indices"].dtype, device="cuda")
    args["initial_state_indices"].copy_(torch.tensor([0, 1, 2, 3]))
    scatter = scatter.view(4, 3)
    output = torch.empty_like(args["v"])
    h200.gdn_decode(**args, output=output, ssm_state_indices=scatter, check_indices=True)
    pool = args["initial_state"]
    before = pool.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h200.gdn_decode(**args, output=output, ssm_state_indices=scatter)
    pool.copy_(before)
    graph.replay()
    torch.cuda.synchronize()
    want = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], read_slots=args["initial_state_indices"], token_slots=scatter,
    )  # fmt: skip
    assert_close("graph output", output, want.output, output.dtype)
    assert_close("graph states", pool[4:16], want.pool[4:16].double(), pool.dtype)
    assert torch.equal(pool[16:], before[16:]) and torch.equal(pool[:4], before[:4])


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens,cache", [(1, False), (4, True)], ids=["t1", "t4_verify"])
@pytest.mark.parametrize("batch", [5, 96])
def test_a_strided_pool_matches_the_reference_and_nothing_outside_it_changes(
    layout, state_dtype, tokens, cache, batch
):  # fmt: skip
    """The pool a view into a larger buffer (FlashInfer's strided pools): every other head of
    twice as many, one spare row per head and one spare vector per row. Outputs, written slots
    and the verify cache against the float64 reference on the dense copy; every element of the
    buffer outside the view, and every slot the call does not own, keeps its bits."""
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=2 * batch + 3, padded_rows=(1,), cache_steps=tokens if cache else None,
        disable_state_update=cache, seed=batch + 7 * tokens,
    )  # fmt: skip
    args = problem.make("cuda")
    dense = args["initial_state"]
    slots, heads, rows, columns = dense.shape
    vector = 16 // dense.element_size()
    shape = (slots, 2 * heads, rows + 1, columns + vector)
    buffer = torch.randn(shape, device="cuda", dtype=dense.dtype)
    view = buffer[:, ::2, :rows, :columns]
    view.copy_(dense)
    buffer_before = buffer.clone()
    args["initial_state"] = view
    out, returned = h200.gdn_decode(**args)
    torch.cuda.synchronize()
    assert returned is view
    assert h200.gdn_decode.prepare(**args)  # plans (the strided form) without a launch
    ref = reference_decode(
        args["q"], args["k"], args["v"], dense, args["A_log"], args["a"], args["dt_bias"],
        args["b"], read_slots=args["initial_state_indices"], disable_state_update=cache,
        state_layout=layout,
    )  # fmt: skip
    live = ref.live
    stored = TORCH_DTYPES[state_dtype]
    assert_close("output", out[live], ref.output[live], torch.bfloat16)
    assert (out[~live] == 0).all(), "padded rows must have zero output"
    # The buffer outside the view, in three disjoint parts (no mask: at batch 96 a boolean
    # index copies gigabytes): the odd heads, the spare row, the spare vector of each row.
    for outside in (
        (slice(None), slice(1, None, 2)),
        (slice(None), slice(None, None, 2), slice(rows, None)),
        (slice(None), slice(None, None, 2), slice(None, rows), slice(columns, None)),
    ):
        assert torch.equal(buffer[outside], buffer_before[outside]), f"the buffer at {outside}"
    written = args["initial_state_indices"].long()[live]
    touched = torch.zeros(slots, dtype=torch.bool, device="cuda")
    if not cache:
        touched[written] = True
        assert_close("final state", as_k_last(view[written], layout), ref.final_state[live], stored)
    else:
        got = as_k_last(args["intermediate_states_buffer"][live, :tokens], layout)
        assert_close("intermediate states", got, ref.intermediates[live], stored)
    assert torch.equal(view[~touched], dense[~touched]), "a slot the call does not own changed"


def _recovery_check(out, pool, before, want, stored_slots, io, cache=None, cache_want=None):
    """Outputs where the reference stores them (its NaN: nothing stored, so the NaN the output
    was filled with stays), the stored slots against the reference, every other slot's bits."""
    stored = ~torch.isnan(want.output)
    assert_close("output", out[stored], want.output[stored], io)
    assert torch.isnan(out[~stored]).all(), "an output the call does not store was written"
    if stored_slots.numel():
        assert_close(
            "stored states", pool[stored_slots].double(), want.pool[stored_slots].double(),
            pool.dtype,
        )  # fmt: skip
    untouched = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    untouched[stored_slots] = False
    assert torch.equal(pool[untouched], before[untouched]), "a slot the call does not own changed"
    if cache is not None:
        # Row by row: a boolean index over the whole buffer would copy gigabytes.
        for n in range(cache.shape[0]):
            cached = ~torch.isnan(cache_want[n, :, 0, 0, 0])
            if cached.any():
                assert_close(f"cache row {n}", cache[n, cached], cache_want[n, cached], cache.dtype)
            assert torch.isnan(cache[n, ~cached].double()).all(), f"cache row {n}: a step past it"


def random_last_accepted(seed: int, tokens: int, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """accepted_steps [batch]: each row's last accepted token, drawn from 0..tokens-1."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, tokens, (batch,), generator=gen).to(dtype).cuda()


RECOVERY_FORMS = ["accepted_steps", "recovery_steps_1", "recovery_steps_half", "recovery_steps_all"]


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("form", RECOVERY_FORMS)
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [5, 96])
def test_recovery_replays_stores_and_decodes(layout, state_dtype, form, tokens, batch):
    """FlashInfer's fused recovery: each row replays its first R tokens (R = accepted_steps[n] +
    1, random per row, or recovery_steps), stores the state after them in its write slot, and
    decodes the rest with output; no final write. Row 1 is padding (zero output where outputs
    are stored), row 3 writes to -1 (computed, nothing stored). Two batch sizes reach different
    variants of the dispatch (stepwise and staged solves)."""
    steps = {"recovery_steps_1": 1, "recovery_steps_half": max(1, tokens // 2)}.get(form, tokens)
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=2 * batch + 3, separate_write_slots=True, padded_rows=(1,),
        seed=batch * 100 + tokens * 10 + RECOVERY_FORMS.index(form),
    )  # fmt: skip
    args = problem.make("cuda")
    writes = args["output_state_indices"]
    writes[3] = -1
    recovery = {"recovery_steps": steps}
    if form == "accepted_steps":
        recovery = {
            "accepted_steps": random_last_accepted(problem.seed, tokens, batch, writes.dtype)
        }
    pool = args["initial_state"]
    before = pool.clone()
    output = torch.full_like(args["v"], float("nan"))
    out, returned = h200.gdn_decode(**args, output=output, **recovery)
    torch.cuda.synchronize()
    assert returned is pool and out is output
    want = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=problem.scale, use_qk_l2norm=problem.use_qk_l2norm,
        read_slots=args["initial_state_indices"], write_slots=writes, state_layout=layout,
        **recovery,
    )  # fmt: skip
    live = args["initial_state_indices"] >= 0
    stored_slots = writes[live & (writes >= 0)].long()
    _recovery_check(out, pool, before, want, stored_slots, args["q"].dtype)


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens", [2, 4, 8])
@pytest.mark.parametrize("batch", [5, 40])
def test_accepted_steps_truncate_a_verify_call(layout, state_dtype, tokens, batch):
    """accepted_steps with disable_state_update and the verify cache: each row runs its tokens
    0..accepted_steps[n] (outputs, cache rows) and nothing after; the pool keeps its bits."""
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=batch + 3, padded_rows=(1,), cache_steps=tokens, disable_state_update=True,
        seed=batch + 7 * tokens,
    )  # fmt: skip
    args = problem.make("cuda")
    reads = args["initial_state_indices"]
    last = random_last_accepted(problem.seed, tokens, batch, reads.dtype)
    pool = args["initial_state"]
    before = pool.clone()
    output = torch.full_like(args["v"], float("nan"))
    out, _ = h200.gdn_decode(**args, output=output, accepted_steps=last)
    torch.cuda.synchronize()
    cache = args["intermediate_states_buffer"]
    want = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=problem.scale, use_qk_l2norm=problem.use_qk_l2norm, read_slots=reads,
        disable_state_update=True, state_layout=layout, accepted_steps=last,
        cache=torch.full(cache.shape, float("nan"), dtype=torch.float64, device="cuda"),
    )  # fmt: skip
    empty = torch.empty(0, dtype=torch.long, device="cuda")
    _recovery_check(out, pool, before, want, empty, args["q"].dtype, cache, want.cache)


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [2, 4, 8])
@pytest.mark.parametrize("batch", [3, 64])
def test_accepted_steps_truncate_the_token_scatter(state_dtype, tokens, batch):
    """accepted_steps with ssm_state_indices: row n stores the state after each of its tokens
    0..accepted_steps[n] in that token's slot; the later tokens' slots keep their bits."""
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, state_dtype=state_dtype,
        pool_size=batch * (tokens + 1) + 2, seed=batch * 10 + tokens + 1,
    )  # fmt: skip
    args = problem.make("cuda")
    reads = args["initial_state_indices"]
    pool = args["initial_state"]
    scatter = free_slot_table(reads, pool.shape[0], batch, tokens)
    last = random_last_accepted(problem.seed, tokens, batch, reads.dtype)
    before = pool.clone()
    output = torch.full_like(args["v"], float("nan"))
    out, _ = h200.gdn_decode(
        **args, output=output, ssm_state_indices=scatter, accepted_steps=last, check_indices=True
    )
    torch.cuda.synchronize()
    want = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=problem.scale, use_qk_l2norm=problem.use_qk_l2norm, read_slots=reads,
        token_slots=scatter, accepted_steps=last,
    )  # fmt: skip
    columns = torch.arange(tokens, device="cuda")[None, :] <= last[:, None].long()
    _recovery_check(out, pool, before, want, scatter[columns].long(), args["q"].dtype)


def test_recovery_replays_in_a_graph_with_new_accepted_steps():
    """A captured graph replays the fused recovery with new accepted_steps each replay (copied
    into the captured tensor), and check_indices=True accepts the call."""
    problem = Problem(batch=8, tokens=4, HV=32, pool_size=20, separate_write_slots=True, seed=3)
    args = problem.make("cuda")
    last = torch.zeros(8, dtype=args["initial_state_indices"].dtype, device="cuda")
    output = torch.full_like(args["v"], float("nan"))
    h200.gdn_decode(**args, output=output, accepted_steps=last, check_indices=True)
    pool = args["initial_state"]
    before = pool.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h200.gdn_decode(**args, output=output, accepted_steps=last)
    gen = torch.Generator().manual_seed(11)
    for _ in range(5):
        pool.copy_(before)
        output.fill_(float("nan"))
        last.copy_(torch.randint(0, 4, (8,), generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        want = reference_call(
            args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
            args["b"], read_slots=args["initial_state_indices"],
            write_slots=args["output_state_indices"], accepted_steps=last,
        )  # fmt: skip
        _recovery_check(
            output, pool, before, want, args["output_state_indices"].long(), args["q"].dtype
        )
