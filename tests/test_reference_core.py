"""The reference of the whole decode core (gdngen.reference: conv, norm, core) against
independent computations: torch's conv1d and rms_norm, and the recurrence reference on the
split rows."""

import pytest
import torch
import torch.nn.functional as F

from gdngen.reference import (
    causal_conv1d_update,
    gated_rmsnorm,
    reference_decode,
    reference_decode_core,
    split_mixed_qkv,
)

D = 24


def _conv_inputs(seed, B=3, T=2, width=4, pool=5, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=gen).to(dtype)
    state = torch.randn(pool, D, width - 1, generator=gen).to(dtype)
    weight = torch.randn(D, width, generator=gen)
    bias = torch.randn(D, generator=gen)
    return x, state, weight, bias


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("tokens", [1, 2, 5])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_conv_is_torch_conv1d_over_the_kept_window_and_the_new_tokens(width, tokens, with_bias):
    x, state, weight, bias = _conv_inputs(width * 10 + tokens, T=tokens, width=width)
    bias = bias if with_bias else None
    slots = torch.tensor([4, 0, 2])
    out, pool = causal_conv1d_update(x, state, weight, bias, slots=slots)
    for n, slot in enumerate(slots.tolist()):
        window = torch.cat([state[slot], x[n].transpose(0, 1)], dim=1).double()[None]
        expected = F.conv1d(
            window, weight.double()[:, None, :], None if bias is None else bias.double(), groups=D
        )
        torch.testing.assert_close(
            out[n], F.silu(expected[0].transpose(0, 1)), rtol=1e-12, atol=1e-12
        )
        assert torch.equal(pool[slot], window[0, :, -(width - 1) :].to(state.dtype))
    assert torch.equal(pool[[1, 3]], state[[1, 3]])  # slots no row owns are untouched


def test_conv_on_t_tokens_is_t_calls_of_one_token():
    x, state, weight, bias = _conv_inputs(7, T=4)
    state = state.double()  # (no rounding between the one-token calls)
    whole, after = causal_conv1d_update(x, state, weight, bias)
    pool = state
    for t in range(4):
        step, pool = causal_conv1d_update(x[:, t : t + 1], pool, weight, bias)
        torch.testing.assert_close(step[:, 0], whole[:, t], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pool, after, rtol=0, atol=0)


def test_conv_state_layouts_hold_the_same_window():
    x, state, weight, bias = _conv_inputs(8, T=3)
    first, pool_first = causal_conv1d_update(x, state, weight, bias)
    last, pool_last = causal_conv1d_update(
        x, state.transpose(1, 2).contiguous(), weight, bias, state_layout="channels_last"
    )
    torch.testing.assert_close(first, last, rtol=0, atol=0)
    assert torch.equal(pool_first, pool_last.transpose(1, 2))


def test_conv_padding_rows_read_and_write_nothing():
    x, state, weight, bias = _conv_inputs(9)
    out, pool = causal_conv1d_update(
        x, state, weight, bias, slots=torch.tensor([3, 0, 1]), null_slot=0
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # slot 0 is vLLM's padding slot
    assert torch.equal(pool[[0, 2, 4]], state[[0, 2, 4]])
    assert not torch.equal(pool[3], state[3]) and not torch.equal(pool[1], state[1])


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(state_layout="dim_last"), "state_layout: expected one of ('channels_first', 'channels_last'); got 'dim_last'"),
        (dict(activation="relu"), "activation: expected one of (None, 'silu'); got 'relu'"),
    ],
)  # fmt: skip
def test_conv_names_a_bad_option(kwargs, fragment):
    x, state, weight, bias = _conv_inputs(1)
    with pytest.raises(ValueError) as caught:
        causal_conv1d_update(x, state, weight, bias, **kwargs)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_rmsnorm_is_torch_rms_norm_times_the_gate(activation):
    gen = torch.Generator().manual_seed(3)
    o, z = torch.randn(2, 3, 4, 64, generator=gen), torch.randn(2, 3, 4, 64, generator=gen)
    weight = torch.randn(64, generator=gen)
    got = gated_rmsnorm(o, z, weight, eps=1e-6, activation=activation)
    gate = F.silu(z.double()) if activation == "silu" else torch.sigmoid(z.double())
    expected = F.rms_norm(o.double(), (64,), weight.double(), eps=1e-6) * gate
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="activation: expected one of"):
        gated_rmsnorm(o, z, weight, eps=1e-6, activation="gelu")


def test_the_core_is_conv_then_split_then_recurrence_then_norm():
    """With an identity conv (last tap 1, no bias, no activation) the core must be the recurrence
    reference on the split rows, normed: q, k, v sit in that order along a packed row."""
    H, K, HV, V, B, T, P = 2, 8, 4, 8, 3, 2, 6
    gen = torch.Generator().manual_seed(11)
    width = 2 * H * K + HV * V
    mixed = torch.randn(B, T, width, generator=gen).to(torch.bfloat16)
    conv_state = torch.randn(P, width, 3, generator=gen).to(torch.bfloat16)
    identity = torch.zeros(width, 4)
    identity[:, -1] = 1.0
    z = torch.randn(B, T, HV, V, generator=gen).to(torch.bfloat16)
    pool = torch.randn(P, HV, V, K, generator=gen).to(torch.bfloat16)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    a, b = torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen)
    norm_weight = torch.randn(V, generator=gen)
    slots = torch.tensor([5, -1, 2])
    got = reference_decode_core(
        mixed, conv_state, identity, None, z, pool, A_log, a, dt_bias, b, norm_weight, H=H, K=K,
        eps=1e-6, conv_activation=None, slots=slots,
    )  # fmt: skip
    q, k, v = split_mixed_qkv(mixed, H, K, HV, V)
    assert torch.equal(q[0, 0, 1], mixed[0, 0, K : 2 * K]) and torch.equal(
        v[0, 0, 0], mixed[0, 0, 2 * H * K : 2 * H * K + V]
    )
    plain = reference_decode(q, k, v, pool, A_log, a, dt_bias, b, read_slots=slots)
    expected = gated_rmsnorm(plain.output, z, norm_weight, eps=1e-6)
    expected[1] = 0.0
    torch.testing.assert_close(got.output, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(got.pool, plain.pool)
    # the conv state of each live slot now ends with the row's last tokens; the rest is untouched
    assert torch.equal(got.conv_pool[5, :, -2:], mixed[0].transpose(0, 1))
    untouched = [0, 1, 3, 4]
    assert torch.equal(got.conv_pool[untouched], conv_state[untouched])
    assert torch.equal(got.pool[untouched], pool[untouched])


def test_split_mixed_qkv_names_a_row_of_the_wrong_width():
    with pytest.raises(ValueError, match=r"mixed_qkv: rows of 2\*H\*K \+ HV\*V = 96; got 95"):
        split_mixed_qkv(torch.zeros(1, 95), 2, 16, 2, 16)


def _packed_core(slots: str, tokens: int, seed: int, padded=(2,)):
    """A packed fused-core call's arguments on the CPU (gdngen.problem.PackedProblem), with a
    channels-first conv pool of W - 2 + T columns, z and the norm weight."""
    from gdngen.problem import PackedProblem

    H, K, HV, V = 2, 16, 4, 16
    problem = PackedProblem(
        sequences=5, tokens=tokens, H=H, HV=HV, K=K, V=V, mixed_qkv=True, slots=slots,
        padded_rows=padded, state_dtype="fp32", seed=seed,
    )  # fmt: skip
    args = problem.make("cpu")
    gen = torch.Generator().manual_seed(seed)
    D = 2 * H * K + HV * V
    args["conv_state"] = torch.randn(args["initial_state"].shape[0], D, 2 + tokens, generator=gen)
    args["conv_weight"] = torch.randn(D, 4, generator=gen)
    args["conv_bias"] = torch.randn(D, generator=gen)
    z = torch.randn(1, 5 * tokens, HV, V, generator=gen)
    return args, z, torch.randn(V, generator=gen), (H, K, HV, V)


@pytest.mark.parametrize("tokens", [1, 3])
def test_packed_core_call_is_the_dense_core_on_its_rows(tokens):
    from gdngen.reference.core import reference_core_call

    args, z, weight, (H, K, HV, V) = _packed_core("row", tokens, seed=tokens)
    D = args["mixed_qkv"].shape[-1]
    ref = reference_core_call(args, z, weight, H=H, K=K, eps=1e-6)
    dense = reference_decode_core(
        args["mixed_qkv"].reshape(5, tokens, D), args["conv_state"][:, :, :3].contiguous(),
        args["conv_weight"], args["conv_bias"], z.reshape(5, tokens, HV, V),
        args["initial_state"], args["A_log"], args["a"].reshape(5, tokens, HV), args["dt_bias"],
        args["b"].reshape(5, tokens, HV), weight, H=H, K=K, eps=1e-6,
        slots=args["initial_state_indices"], null_slot=0,
    )  # fmt: skip
    assert torch.equal(ref.output.reshape(5, tokens, HV, V), dense.output)
    assert torch.equal(ref.pool, dense.pool)
    assert torch.equal(ref.conv_pool[:, :, :3], dense.conv_pool)
    # a few sequences alone: theirs the same, the others' not computed (NaN) and not written
    some = reference_core_call(args, z, weight, H=H, K=K, eps=1e-6, sequences=[4, 0])
    out = some.output.reshape(5, tokens, HV, V)
    # (float64 sums over other batch shapes: equal to rounding)
    torch.testing.assert_close(out[[0, 4]], dense.output[[0, 4]], rtol=1e-12, atol=1e-12)
    assert out[[1, 3]].isnan().all()
    untouched = args["initial_state_indices"][[1, 3]].long()
    assert torch.equal(some.pool[untouched], args["initial_state"][untouched])


def test_packed_core_call_per_token_table():
    # vLLM's per-token table with every row accepting its first token: the same outputs as the
    # row form on column 0, every token's state in its column, the conv window from column 0.
    from gdngen.reference.core import reference_core_call

    args, z, weight, (H, K, _, _) = _packed_core("per_token", 3, seed=7)
    args["num_accepted_tokens"] = torch.ones_like(args["num_accepted_tokens"])
    table = args["initial_state_indices"]
    ref = reference_core_call(args, z, weight, H=H, K=K, eps=1e-6)
    rows = dict(args, initial_state_indices=table[:, 0].clone())
    del rows["num_accepted_tokens"]
    by_rows = reference_core_call(rows, z, weight, H=H, K=K, eps=1e-6)
    assert torch.equal(ref.output, by_rows.output)
    live = table[:, 0] > 0
    assert torch.equal(ref.pool[table[live, -1].long()], by_rows.pool[table[live, 0].long()])
    # per-token conv slots keep W - 2 + T columns: the window's last W - 2, then every input
    assert torch.equal(ref.conv_pool[table[live, 0].long()][..., 2:],
                       args["mixed_qkv"].reshape(5, 3, -1)[live].transpose(1, 2))  # fmt: skip
