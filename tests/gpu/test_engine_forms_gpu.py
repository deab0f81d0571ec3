"""The engine call forms against the float64 reference: vLLM's per-token slots with
num_accepted_tokens and slot 0 as padding, SGLang's pool-row cache, varlen packing with mixed
lengths, packed projections read in place, and CUDA-graph replay with new index contents."""

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import PackedProblem
from gdngen.runtime.checks import check_call
from gdngen.runtime.compile import CompileKey
from gdngen.runtime.launcher import DecodeCall
from gdngen.terms import variant_pair
from tests.compare import assert_close
from tests.gpu.check_form import check_against, expected_of, kernel_form, run_form

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("state_dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
@pytest.mark.parametrize("lengths", ["uniform", "mixed"])
def test_vllm_spec_decode(state_dtype, tokens, lengths):
    problem = PackedProblem(
        sequences=2 * tokens + 3, tokens=tokens, state_dtype=state_dtype, null_slot=0,
        padded_rows=(1, tokens + 1), mixed_lengths=lengths == "mixed", extra_columns=tokens % 3,
        seed=tokens,
    )  # fmt: skip
    run_form(h200.gdn_decode, problem)


@pytest.mark.parametrize("layout", ["k_last", "v_last"])
@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_vllm_spec_decode_table_wider_than_max_seqlen(layout, tokens):
    """1 + S > max_seqlen: initial states are also read from columns past the T the kernel loads
    up front with the row (the second round trip that only such rows take)."""
    problem = PackedProblem(
        sequences=13, tokens=tokens, layout=layout, wide_table=3, padded_rows=(4,), seed=40 + tokens,
    )  # fmt: skip
    run_form(h200.gdn_decode, problem)


@pytest.mark.parametrize("batch", [1, 7, 64, 300])
def test_vllm_spec_decode_batches_and_layouts(batch):
    for layout in ("k_last", "v_last"):
        problem = PackedProblem(
            sequences=batch, tokens=4, layout=layout, padded_rows=(0,) if batch > 1 else (),
            index_dtype="int64" if batch % 2 else "int32", seed=batch,
        )  # fmt: skip
        run_form(h200.gdn_decode, problem, pass_output=True)


@pytest.mark.parametrize("tokens", [2, 4, 8])
@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_sglang_verify_into_pool_rows(tokens, state_dtype):
    problem = PackedProblem(
        sequences=6, tokens=tokens, state_dtype=state_dtype, slots="row", null_slot=-1,
        padded_rows=(2,), cache="rows", cache_rows=11, disable_state_update=True, seed=tokens,
    )  # fmt: skip
    run_form(h200.gdn_decode, problem)


@pytest.mark.parametrize("null_slot", [-1, 0])
@pytest.mark.parametrize("flat", [False, True])
def test_packed_decode_with_row_slots(null_slot, flat):
    problem = PackedProblem(
        sequences=9, tokens=3, slots="row", null_slot=null_slot, padded_rows=(0, 5),
        mixed_lengths=True, flat=flat, seed=3 + null_slot,
    )  # fmt: skip
    run_form(h200.gdn_decode, problem, pass_output=flat)


@pytest.mark.parametrize("form", ["packed", "dense"])
def test_mixed_qkv_is_read_in_place(form):
    """q, k, v as column views of one projection buffer: the kernel reads the caller's memory
    (zeroing v's columns afterwards changes the result exactly as the reference says)."""
    if form == "packed":
        problem = PackedProblem(sequences=5, tokens=2, mixed_qkv=True, flat=True, null_slot=0,
                                padded_rows=(3,), seed=11)  # fmt: skip
        args = run_form(h200.gdn_decode, problem)
        mixed = args["mixed_qkv"]
    else:
        problem = PackedProblem(sequences=6, tokens=1, slots="row", mixed_qkv=True, flat=True,
                                null_slot=0, padded_rows=(2,), seed=12)  # fmt: skip
        args = problem.make("cuda")
        mixed = args["mixed_qkv"]
        del args["cu_seqlens"], args["max_seqlen"]  # dense: [B, width] is one token per row
        pool_before = args["initial_state"].clone()
        out, _ = h200.gdn_decode(**args)
        assert out.shape == (6, 1, problem.HV, problem.V)
        dense = dict(args, cu_seqlens=torch.arange(7, dtype=torch.int32, device="cuda"))
        expected = expected_of(dense, problem, pool_before, None)
        check_against(expected, out[:, 0], args["initial_state"], None, problem, pool_before, None)
    width = 2 * problem.H * problem.K
    mixed[..., width:] = 0  # v's columns, in the caller's buffer
    args = dict(args)
    pool_before = args["initial_state"].clone()
    out, _ = h200.gdn_decode(**args)
    check = dict(
        args, cu_seqlens=args.get("cu_seqlens", torch.arange(7, dtype=torch.int32, device="cuda"))
    )
    expected = expected_of(check, problem, pool_before, None)
    got = out if "cu_seqlens" in args else out[:, 0]
    check_against(expected, got, args["initial_state"], None, problem, pool_before, None)
    assert kernel_form(check, problem)["v"].abs().max() == 0


def test_graph_replay_follows_new_index_contents():
    """One captured call; the lengths, accepted counts and slots change in place between replays."""
    problem = PackedProblem(
        sequences=8, tokens=4, null_slot=0, padded_rows=(6,), mixed_lengths=True, seed=21
    )
    args = problem.make("cuda")
    h200.gdn_decode.prepare(**args)
    pool = args["initial_state"]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out, _ = h200.gdn_decode(**args)
    torch.cuda.current_stream().wait_stream(stream)
    cu = args["cu_seqlens"]
    for seed in (22, 23, 24):
        # New contents, same total: the lengths, accepted counts and slot rows shuffled.
        order = torch.randperm(
            problem.sequences, generator=torch.Generator().manual_seed(seed)
        ).cuda()
        lengths = (cu[1:] - cu[:-1])[order]
        cu[1:] = lengths.cumsum(0).to(cu.dtype)
        args["num_accepted_tokens"].copy_(args["num_accepted_tokens"][order].roll(1))
        args["initial_state_indices"].copy_(args["initial_state_indices"][order])
        pool_before = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        expected = expected_of(args, problem, pool_before, None)
        check_against(expected, out, pool, None, problem, pool_before, None)


#: one kernel per way the template reads a packed row's tokens: stepwise (token by token, every
#: token preloaded, V-last, K split over warps) and staged (with and without the next pass's
#: state prefetched)
SOLVE_PATHS = [
    "kl_bf16_tv64_ilp8_vec8_tpg16_sm90",
    "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90",
    "kl_fp32_tv8_ilp2_vec4_tpg32_pre_sm90",
    "vl_fp32_tv16_ilp4_vec8_tpg16_sm90",
    "vl_fp32_tv64_ilp2_vec16_tpg1_ks8_sm90",
    "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_staged_sm90",
    "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_pf_staged_sm90",
]


LAYOUTS = {"kl": "k_last", "vl": "v_last"}


@pytest.mark.parametrize("name", SOLVE_PATHS)
def test_every_solve_path_reads_packed_rows_of_every_length(name):
    """Mixed lengths (a padded row of none among them) with the last sequence shorter than T:
    its positions past its end lie past the packed buffer, which is sized exactly, so a kernel
    that read them would read out of bounds (rows.row_tokens bounds the span instead)."""
    variant = h200.variant(name)
    tokens = 8
    problem = next(
        p
        for p in (
            PackedProblem(
                sequences=9, tokens=tokens, layout=LAYOUTS[name[:2]],
                state_dtype=variant_pair(name)[1], padded_rows=(3,), mixed_lengths=True, seed=seed,
            )  # fmt: skip
            for seed in range(100, 200)
        )
        if _last_length(p) < tokens - 1
    )
    run_form(variant, problem)


@pytest.mark.parametrize("name", SOLVE_PATHS)
def test_every_solve_path_reads_uniform_rows_and_an_exact_table(name):
    """Every sequence of T tokens, promised with uniform_seqlen, and a slot table exactly T wide:
    the kernel places the tokens without waiting for cu_seqlens and loads the table's columns
    up front (CompileKey.uniform_rows and exact_slot_table); a padded row and every accepted
    count."""
    problem = PackedProblem(
        sequences=11, tokens=4, layout=LAYOUTS[name[:2]], state_dtype=variant_pair(name)[1],
        padded_rows=(2,), extra_columns=1, uniform_seqlen=True, seed=60,
    )  # fmt: skip
    args = run_form(h200.variant(name), problem)
    options = {n: v for n, v in DecodeCall.CHECKED.items() if n != "check_indices"}
    key = CompileKey.for_call(name, "sm_90a", check_call(h200.INFO, **{**options, **args}))
    assert key.uniform_rows and key.exact_slot_table


def _last_length(problem: PackedProblem) -> int:
    cu = problem.make("cpu")["cu_seqlens"]
    return int(cu[-1] - cu[-2])


def test_one_kernel_serves_every_length_pattern():
    from gdngen.runtime.store import compiled_count

    problem = PackedProblem(sequences=10, tokens=4, mixed_lengths=True, seed=30)
    run_form(h200.gdn_decode, problem)
    before = compiled_count()
    for seed in range(31, 35):
        run_form(h200.gdn_decode, problem.with_(seed=seed))
    assert compiled_count() == before


def test_a_packed_call_without_max_seqlen_takes_its_total_as_t():
    """One sequence of 2, then 3, then 2 tokens through one call object and no max_seqlen: each
    call's T is its total, so the signature the first call left must not serve the second."""
    for tokens in (2, 3, 2):
        problem = PackedProblem(sequences=1, tokens=tokens, slots="row", seed=50 + tokens)
        args = problem.make("cuda")
        del args["max_seqlen"]
        pool_before = args["initial_state"].clone()
        out, pool = h200.gdn_decode(**args)
        torch.cuda.synchronize()
        expected = expected_of(args, problem, pool_before, None)
        check_against(expected, out, pool, None, problem, pool_before, None)


def test_bad_engine_inputs_are_named_before_launch():
    problem = PackedProblem(sequences=4, tokens=4, null_slot=0, seed=40)
    args = problem.make("cuda")
    pool_before = args["initial_state"].clone()
    cases = {
        "num_accepted_tokens": dict(num_accepted_tokens=args["num_accepted_tokens"][:3]),
        "cu_seqlens": dict(cu_seqlens=args["cu_seqlens"].float()),
        "initial_state_indices": dict(initial_state_indices=args["initial_state_indices"][:, :2]),
        "max_seqlen": dict(max_seqlen=9),
    }
    for name, change in cases.items():
        with pytest.raises((ValueError, TypeError), match=f"^{name}"):
            h200.gdn_decode(**dict(args, **change))
    bad = args["num_accepted_tokens"].clone()
    bad[0] = 5
    with pytest.raises(ValueError, match="^num_accepted_tokens: entry 0 is 5"):
        h200.gdn_decode(**dict(args, num_accepted_tokens=bad), check_indices=True)
    torch.cuda.synchronize()
    assert torch.equal(args["initial_state"], pool_before)
