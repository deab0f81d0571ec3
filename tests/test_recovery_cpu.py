"""FlashInfer's state recovery, ``accepted_steps`` and ``recovery_steps`` (docs/design.md, "State
recovery"), on CPU tensors: the checks, the index check, the compile key and the float64
reference. As in tests/test_checks.py, check_call gets FakeCuda tensors."""

import pytest
import torch

import generated.h200
from gdngen.reference import reference_call, reference_decode
from gdngen.runtime.checks import check_call, check_index_values
from gdngen.runtime.compile import CompileKey
from tests.test_checks import on_fake_cuda, raises
from tests.test_forms_checks import cache, dense, ints, packed, pool, table

INFO = generated.h200.INFO
B, T = 2, 3


def accepted_args(**over) -> dict:
    """B = 2 rows of T = 3 tokens, slots 0 and 1, the last accepted tokens 0 and 2."""
    args = dense(B, T, accepted_steps=ints([0, 2]))
    args.update(over)
    return args


def key_of(args: dict) -> CompileKey:
    call = check_call(INFO, **on_fake_cuda(args))
    return CompileKey.for_call(generated.h200.VARIANTS[0], "sm_90a", call)


def test_the_forms_and_their_keys():
    plain = check_call(INFO, **on_fake_cuda(dense(B, T)))
    fused = check_call(INFO, **on_fake_cuda(accepted_args()))
    steps = check_call(INFO, **on_fake_cuda(dense(B, T, recovery_steps=2)))
    verify = check_call(
        INFO, **on_fake_cuda(accepted_args(disable_state_update=True, intermediate_states_buffer=cache(B, T)))
    )  # fmt: skip
    scatter = check_call(
        INFO, **on_fake_cuda(accepted_args(ssm_state_indices=ints([[2, 3, 4], [5, 6, 7]])))
    )  # fmt: skip
    assert not plain.recovers and not plain.truncates
    assert fused.recovers and not fused.truncates and fused.write_final_state
    assert steps.recovers and steps.recovery_steps == 2 and steps.accepted_steps is None
    assert verify.truncates and not verify.recovers
    assert scatter.truncates and scatter.token_scatter
    keys = {
        key_of(args)
        for args in (
            dense(B, T), accepted_args(), dense(B, T, recovery_steps=2),
            dense(B, T, recovery_steps=3), accepted_args(disable_state_update=True),
        )
    }  # fmt: skip
    assert len(keys) == 5
    assert key_of(accepted_args()).accepted_steps_dtype == "int32"
    assert key_of(dense(B, T, recovery_steps=0)) == key_of(dense(B, T))


def test_a_dense_state_and_write_slots_are_served():
    call = check_call(
        INFO, **on_fake_cuda(accepted_args(initial_state=None, initial_state_indices=None, state=pool()[:B]))
    )  # fmt: skip
    assert call.recovers and call.read_slots is None
    call = check_call(INFO, **on_fake_cuda(accepted_args(output_state_indices=ints([4, -1]))))
    assert call.recovers and call.separate_write_slots


# fmt: off
BAD = [
    ("steps_not_int", dict(recovery_steps=1.0), TypeError,
     "recovery_steps: expected an int (the leading tokens each row replays without output, at most T=3); got float"),
    ("steps_past_T", dict(recovery_steps=4), ValueError,
     "recovery_steps: expected 0..3 (the leading tokens each row replays without output, at most T=3); got 4"),
    ("steps_negative", dict(recovery_steps=-1), ValueError, "recovery_steps: expected 0..3"),
    ("steps_without_update", dict(recovery_steps=1, disable_state_update=True), ValueError,
     "disable_state_update: not with recovery_steps=1 (the state after the replayed tokens is the call's only store)"),
    ("steps_with_cache", dict(recovery_steps=1, intermediate_states_buffer=cache(B, T)), ValueError,
     "intermediate_states_buffer: not with recovery_steps=1"),
    ("steps_with_scatter", dict(recovery_steps=1, ssm_state_indices=ints([[2, 3, 4], [5, 6, 7]])), ValueError,
     "ssm_state_indices: not with recovery_steps=1"),
    ("both", dict(accepted_steps=ints([0, 1]), recovery_steps=1), ValueError,
     "recovery_steps: expected 0 with accepted_steps (each row's accepted_steps entry sets where its replay ends); got 1"),
    ("accepted_dtype", dict(accepted_steps=torch.tensor([0, 1], dtype=torch.int16)), TypeError,
     "accepted_steps: expected dtype int32, int64; got int16"),
    ("accepted_not_slot_dtype", dict(accepted_steps=ints([0, 1], torch.int64)), TypeError,
     "accepted_steps: expected dtype int32 (as initial_state_indices); got int64"),
    ("accepted_shape", dict(accepted_steps=ints([[0], [1]])), ValueError,
     "accepted_steps: expected shape [B] (each row's last accepted token, 0..T-1 = 0..2) = [2]; got [2, 1]"),
    ("accepted_rows", dict(accepted_steps=ints([0, 1, 2])), ValueError,
     "accepted_steps: expected shape [B]"),
    ("accepted_strided", dict(accepted_steps=ints([0, 9, 1, 9])[::2]), ValueError,
     "accepted_steps: must be contiguous (stride 2 given); pass .contiguous()"),
    ("accepted_list", dict(accepted_steps=[0, 1]), TypeError,
     "accepted_steps: expected a torch.Tensor, got list"),
    ("accepted_cache_with_update", dict(accepted_steps=ints([0, 1]), intermediate_states_buffer=cache(B, T)),
     ValueError, "intermediate_states_buffer: with accepted_steps, only beside disable_state_update=True"),
    ("accepted_norm", dict(accepted_steps=ints([0, 1]), z=torch.zeros(B, T, 32, 128, dtype=torch.bfloat16),
                           norm_weight=torch.ones(128, dtype=torch.bfloat16)),
     ValueError, "z: not with accepted_steps (the gated RMSNorm epilogue is not fused into the recovery forms)"),
    ("steps_conv", dict(recovery_steps=1, conv_state=torch.zeros(8, 2 * 16 * 128 + 32 * 128, 3, dtype=torch.bfloat16)),
     ValueError, "conv_state: not with recovery_steps"),
]
# fmt: on


@pytest.mark.parametrize("change,exc_type,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_recovery_is_refused_by_name(change, exc_type, fragment):
    args = dense(B, T)
    args.update(change)
    raises(exc_type, args, fragment, info=INFO)


def test_the_engine_forms_are_refused_by_name():
    raises(
        ValueError, packed(accepted_steps=ints([0, 1, 0])),
        "cu_seqlens: not with accepted_steps (the recovery forms take dense [B, T] rows)", info=INFO,
    )  # fmt: skip
    raises(
        ValueError, table(B, 2, recovery_steps=1),
        "initial_state_indices: expected shape [B] with recovery_steps; got a per-token table [2, 3]",
        info=INFO,
    )  # fmt: skip


@pytest.mark.parametrize(
    "last,fragment",
    [([0, 3], "accepted_steps: entry 1 is 3; expected 0..2 (the row's last accepted token, below T=3)"),
     ([-1, 0], "accepted_steps: entry 0 is -1; expected 0..2")],
)  # fmt: skip
def test_accepted_values_out_of_range_are_named(last, fragment):
    call = check_call(INFO, **on_fake_cuda(accepted_args(accepted_steps=ints(last))))
    with pytest.raises(ValueError) as caught:
        check_index_values(call)
    assert fragment in str(caught.value)


def test_a_truncated_scatter_owns_only_its_accepted_tokens_slots():
    """Row 0 accepts token 0 only, so its later entries may repeat row 1's slots."""
    args = accepted_args(
        accepted_steps=ints([0, 2]), ssm_state_indices=ints([[2, 5, 6], [5, 6, 7]])
    )
    check_index_values(check_call(INFO, **on_fake_cuda(args)))
    args["accepted_steps"] = ints([1, 2])
    with pytest.raises(ValueError, match="ssm_state_indices: slot 5 is written by more than one"):
        check_index_values(check_call(INFO, **on_fake_cuda(args)))


def _problem(seed=0, P=10):
    torch.manual_seed(seed)
    H, HV, K, V = 2, 4, 8, 6
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, a, b = torch.randn(B, T, HV, V), torch.randn(B, T, HV), torch.randn(B, T, HV)
    return (q, k, v, torch.randn(P, HV, V, K), torch.randn(HV), a, torch.randn(HV), b)


def test_the_reference_replays_then_decodes():
    """Row 0 accepts token 0: its state after token 0 goes to its write slot, its tokens 1..2
    are output; row 1 accepts all 3: the state after token 2 is stored, nothing is output."""
    q, k, v, state, A_log, a, dt_bias, b = _problem()
    reads, writes = torch.tensor([7, 3]), torch.tensor([2, 9])
    got = reference_call(
        q, k, v, state, A_log, a, dt_bias, b, read_slots=reads, write_slots=writes,
        accepted_steps=torch.tensor([0, 2]),
    )  # fmt: skip
    full = reference_decode(q, k, v, state, A_log, a, dt_bias, b, read_slots=reads)
    assert torch.isnan(got.output[0, 0]).all() and torch.equal(
        got.output[0, 1:], full.output[0, 1:]
    )
    assert torch.isnan(got.output[1]).all()
    assert torch.allclose(got.pool[2], full.intermediates[0, 0].float())
    assert torch.allclose(got.pool[9], full.intermediates[1, 2].float())
    untouched = [s for s in range(10) if s not in (2, 9)]
    assert torch.equal(got.pool[untouched], state[untouched])
    same = reference_call(
        q, k, v, state, A_log, a, dt_bias, b, read_slots=reads, write_slots=writes,
        recovery_steps=1,
    )  # fmt: skip
    torch.testing.assert_close(same.output[0], got.output[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(same.pool[2], got.pool[2])


def test_the_reference_truncates_without_state_updates():
    """accepted_steps with disable_state_update: row 0 runs token 0 only (output, cache row),
    row 1 all three; nothing past a row's last accepted token is written; the pool stays."""
    q, k, v, state, A_log, a, dt_bias, b = _problem(1)
    reads = torch.tensor([4, 5])
    buffer = torch.zeros(B, T, 4, 6, 8)
    got = reference_call(
        q, k, v, state, A_log, a, dt_bias, b, read_slots=reads, disable_state_update=True,
        cache=buffer, accepted_steps=torch.tensor([0, 2]),
    )  # fmt: skip
    full = reference_decode(q, k, v, state, A_log, a, dt_bias, b, read_slots=reads)
    assert (
        torch.equal(got.output[0, :1], full.output[0, :1]) and torch.isnan(got.output[0, 1:]).all()
    )
    assert torch.equal(got.output[1], full.output[1])
    assert torch.allclose(got.cache[0, 0], full.intermediates[0, 0].float())
    assert (got.cache[0, 1:] == 0).all() and torch.equal(got.pool, state)
