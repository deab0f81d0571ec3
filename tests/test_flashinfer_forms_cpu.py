"""FlashInfer's per-token scatter, ``ssm_state_indices [B, T]`` (gated_delta_rule_mtp's form;
docs/design.md, "Call forms"), on CPU tensors: the checks, the index check, the compile key and
the float64 reference. As in tests/test_checks.py, check_call gets FakeCuda tensors."""

import pytest
import torch

import generated.h200
from gdngen.reference import reference_call, reference_decode
from gdngen.runtime.checks import check_call, check_index_values
from gdngen.runtime.compile import CompileKey
from tests.test_checks import on_fake_cuda, raises
from tests.test_forms_checks import cache, dense, ints, pool

INFO = generated.h200.INFO
B, T = 2, 3


def scatter_args(**over) -> dict:
    """B = 2 rows of T = 3 tokens reading slots 0, 1 and scattering to 2..7."""
    args = dense(B, T, ssm_state_indices=ints([[2, 3, 4], [5, 6, 7]]))
    args.update(over)
    return args


def test_the_scatter_is_a_per_token_form_with_read_slots_of_its_own():
    call = check_call(INFO, **on_fake_cuda(scatter_args()))
    assert call.token_scatter and call.per_token_slots and call.separate_write_slots
    assert call.exact_slot_table and call.stores_token_states and not call.write_final_state
    assert call.token_slot_table.shape == (B, T) and call.read_slots.shape == (B,)
    key = CompileKey.for_call(generated.h200.VARIANTS[0], "sm_90a", call)
    table = check_call(
        INFO, **on_fake_cuda(dense(B, T, initial_state_indices=ints([[2, 3, 4], [5, 6, 7]])))
    )
    other = CompileKey.for_call(generated.h200.VARIANTS[0], "sm_90a", table)
    assert key.per_token_slots and key.separate_write_slots and key != other


def test_one_token_is_the_same_form():
    """FlashInfer's kernel needs T >= 2; the form itself is defined at T = 1 too."""
    call = check_call(INFO, **on_fake_cuda(dense(B, 1, ssm_state_indices=ints([[2], [5]]))))
    assert call.token_scatter and call.tokens == 1


# fmt: off
BAD = [
    ("dtype", dict(ssm_state_indices=ints([[2, 3, 4], [5, 6, 7]], torch.int64)), TypeError,
     "ssm_state_indices: expected dtype int32 (as initial_state_indices); got int64"),
    ("too_wide", dict(ssm_state_indices=ints([[2, 3, 4, 1], [5, 6, 7, 1]])), ValueError,
     "ssm_state_indices: expected shape [B, T] (the slot of the state after each token) = [2, 3]; got [2, 4]"),
    ("strided_columns", dict(ssm_state_indices=torch.arange(2, 8, dtype=torch.int32).view(3, 2).t()), ValueError,
     "ssm_state_indices: its columns must be contiguous (strides (1, 2)); rows may have any stride"),
    ("with_write_slots", dict(output_state_indices=ints([0, 1])), ValueError,
     "output_state_indices: not with ssm_state_indices (the state after the last token goes to ssm_state_indices[:, T - 1])"),
    ("with_cache", dict(intermediate_states_buffer=cache(B, T)), ValueError,
     "intermediate_states_buffer: not with ssm_state_indices"),
    ("with_disable_state_update", dict(disable_state_update=True), ValueError,
     "disable_state_update: not with ssm_state_indices"),
    ("with_num_accepted", dict(num_accepted_tokens=ints([1, 1])), ValueError,
     "num_accepted_tokens: not with ssm_state_indices"),
    ("with_a_table", dict(initial_state_indices=ints([[0, 1, 2], [3, 4, 5]])), ValueError,
     "ssm_state_indices: needs initial_state_indices of shape [N], the slots the initial states are read from; got [2, 3]"),
    ("dense_state", dict(initial_state=None, initial_state_indices=None, state=pool()[:B]), ValueError,
     "ssm_state_indices: needs initial_state_indices of shape [N]"),
    ("not_a_tensor", dict(ssm_state_indices=[[2, 3, 4], [5, 6, 7]]), TypeError,
     "ssm_state_indices: expected a torch.Tensor, got list"),
]
# fmt: on


@pytest.mark.parametrize("change,exc_type,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_scatter_is_refused_by_name(change, exc_type, fragment):
    raises(exc_type, scatter_args(**change), fragment, info=INFO)


def test_the_conv_prologue_is_refused_with_the_scatter():
    args = scatter_args(conv_state=torch.zeros(8, 2 * 16 * 128 + 32 * 128, 3, dtype=torch.bfloat16))
    raises(ValueError, args, "conv_state: not with ssm_state_indices", info=INFO)


def checked(reads, scatter):
    args = scatter_args(initial_state_indices=ints(reads), ssm_state_indices=ints(scatter))
    return check_call(INFO, **on_fake_cuda(args))


@pytest.mark.parametrize(
    "reads,scatter",
    [([0, 1], [[2, 3, 4], [5, 6, 7]]), ([0, 1], [[2, -1, 3], [4, -1, -1]]),
     ([0, -1], [[2, 3, 4], [2, 3, 4]]), ([0, 1], [[2, 2, 2], [3, 4, 5]])],
    ids=["plain", "padding_entries", "padded_row_shares_slots", "one_slot_for_every_token"],
)  # fmt: skip
def test_scatter_values_accepted(reads, scatter):
    check_index_values(checked(reads, scatter))


@pytest.mark.parametrize(
    "reads,scatter,fragment",
    [([0, 1], [[2, 3, 8], [5, 6, 7]],
      "ssm_state_indices: entry [0, 2] is 8; expected a slot 0..7 of the pool, or <= -1 for padding"),
     ([0, 1], [[2, 3, 4], [5, 4, 7]], "ssm_state_indices: slot 4 is written by more than one batch row"),
     ([0, 9], [[2, 3, 4], [5, 6, 7]], "initial_state_indices: entry 1 is 9")],
    ids=["past_the_pool", "written_by_two_rows", "read_past_the_pool"],
)  # fmt: skip
def test_scatter_values_rejected(reads, scatter, fragment):
    with pytest.raises(ValueError) as caught:
        check_index_values(checked(reads, scatter))
    assert fragment in str(caught.value)


def test_the_reference_scatters_every_tokens_state():
    """Against reference_decode: row 0's state after token t at its slot, a padding entry
    skipped; row 1 (read slot -1) padding; no final write; every other slot as it was."""
    torch.manual_seed(0)
    H, HV, K, V, P = 2, 4, 8, 6, 10
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, a, b = torch.randn(B, T, HV, V), torch.randn(B, T, HV), torch.randn(B, T, HV)
    A_log, dt_bias = torch.randn(HV), torch.randn(HV)
    state = torch.randn(P, HV, V, K)
    reads = torch.tensor([7, -1])
    scatter = torch.tensor([[2, -1, 4], [5, 6, 8]])
    got = reference_call(
        q, k, v, state, A_log, a, dt_bias, b, read_slots=reads, token_slots=scatter
    )
    want = reference_decode(q, k, v, state, A_log, a, dt_bias, b, read_slots=reads)
    assert torch.equal(got.output[0], want.output[0]) and (got.output[1] == 0).all()
    assert torch.allclose(got.pool[2], want.intermediates[0, 0].float())
    assert torch.allclose(got.pool[4], want.intermediates[0, 2].float())
    untouched = [s for s in range(P) if s not in (2, 4)]
    assert torch.equal(got.pool[untouched], state[untouched])
