"""Input validation of the engine call forms (docs/design.md, "Call forms"), on CPU tensors.

The forms: ``null_slot``; per-token slot tables ``initial_state_indices`` [N, 1 + S] with
``num_accepted_tokens``; packed sequences (``cu_seqlens``, ``max_seqlen``); cache rows named per row
(``intermediate_state_indices``); and ``mixed_qkv`` (gdngen.runtime.views). Every bad input raises
before anything launches, with a message that starts with the argument's name; good inputs give a
Call (and a CompileKey) that carries the form. As in tests/test_checks.py, the checks after the
device check and check_index_values get FakeCuda tensors (host data that says it is on cuda:0).
"""

import dataclasses
import functools
import itertools

import numpy as np
import pytest
import torch

import generated.h200
from gdngen.runtime.checks import Call, check_call, check_index_values
from gdngen.runtime.compile import CompileKey
from gdngen.runtime.launcher import DecodeCall
from gdngen.runtime.views import kernel_views, mixed_geometry, needs_views
from gdngen.geometry import Geometry
from tests.test_checks import FakeCuda, misaligned, on_fake_cuda, raises

INFO = generated.h200.INFO
H, HV, K, V, POOL = 16, 32, 128, 128, 8
HV2 = 64  # qwen3.5
BF16 = torch.bfloat16
I32, I64 = torch.int32, torch.int64
WIDTH = 2 * H * K + HV * V  # 8192, qwen3-next
WIDTH2 = 2 * H * K + HV2 * V  # 12288, qwen3.5
SEQLENS = (2, 1, 3)  # packed: N = 3 sequences, 6 tokens
TOTAL = sum(SEQLENS)
ARCH = "sm_90a"
VARIANT = generated.h200.VARIANTS[0]

#: every keyword of check_call with the call's defaults
DEFAULTS = {n: v for n, v in DecodeCall.CHECKED.items() if n != "check_indices"}


# -- building calls --------------------------------------------------------------------------------


@functools.cache
def pool(heads: int = HV, slots: int = POOL) -> torch.Tensor:
    """A k_last bf16 pool, shared (the checks never write it)."""
    return torch.zeros(slots, heads, V, K, dtype=BF16)


def ints(values, dtype=I32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def cache(rows: int, steps: int, heads: int = HV) -> torch.Tensor:
    return torch.zeros(rows, steps, heads, V, K, dtype=BF16)


def call_args(lead: int, tokens: int, rows: int, heads: int = HV, **over) -> dict:
    """q, k, v, a, b of shape [lead, tokens, ...], a pool and [rows] int32 slots 0..rows-1."""
    args = dict(DEFAULTS)
    args.update(
        q=torch.zeros(lead, tokens, H, K, dtype=BF16),
        k=torch.zeros(lead, tokens, H, K, dtype=BF16),
        v=torch.zeros(lead, tokens, heads, V, dtype=BF16),
        a=torch.zeros(lead, tokens, heads, dtype=BF16),
        b=torch.zeros(lead, tokens, heads, dtype=BF16),
        A_log=torch.zeros(heads),
        dt_bias=torch.zeros(heads),
        initial_state=pool(heads),
        initial_state_indices=torch.arange(rows, dtype=I32),
    )
    args.update(over)
    return args


def dense(B: int = 2, T: int = 2, **over) -> dict:
    return call_args(B, T, B, **over)


def cu(seqlens, dtype=I32) -> torch.Tensor:
    return ints([0, *itertools.accumulate(seqlens)], dtype)


def packed(seqlens=SEQLENS, cu_dtype=I32, **over) -> dict:
    over = {"cu_seqlens": cu(seqlens, cu_dtype), **over}
    return call_args(1, sum(seqlens), len(seqlens), **over)


def table(B: int = 2, T: int = 2, **over) -> dict:
    """A dense call with a per-token slot table [B, 1 + S] = [2, 3]."""
    return dense(B, T, **{"initial_state_indices": ints([[0, 1, 2], [3, 4, 5]]), **over})


def packed_table(**over) -> dict:
    """A packed call (T = max_seqlen = 3) with a per-token slot table [3, 4]."""
    slots = ints([[0, 1, 2, -1], [3, -1, -1, -1], [4, 5, 6, 7]])
    return packed(**{"max_seqlen": 3, "initial_state_indices": slots, **over})


def cache_rows(**over) -> dict:
    """A dense call (B=2, T=2) whose cache rows name rows of a 3-row buffer."""
    over = {
        "intermediate_states_buffer": cache(3, 2),
        "intermediate_state_indices": ints([2, 0]),
        **over,
    }
    return dense(**over)


BUILDERS = dict(
    dense=dense, table=table, packed=packed, packed_table=packed_table, cache_rows=cache_rows
)


def check(args: dict) -> Call:
    return check_call(INFO, **on_fake_cuda(args))


def key(call: Call) -> CompileKey:
    return CompileKey.for_call(VARIANT, ARCH, call)


def index_error(args: dict, *fragments: str) -> str:
    call = check(args)
    with pytest.raises(ValueError) as caught:
        check_index_values(call)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# -- check_call: bad inputs of the new forms --------------------------------------------------------
# (id, builder, replacements given the valid args, exception, message fragments); every message
# starts with the argument's name, checked by the test.

NULL = "null_slot: expected an int (slots <= null_slot are padding; -1 or more); got"
MAX_SEQLEN = "the most tokens a sequence of this call has; target h200 serves 1..8"

# fmt: off
BAD = [
    # null_slot
    ("null_slot_bool", "dense", lambda a: dict(null_slot=True), TypeError, [f"{NULL} bool"]),
    ("null_slot_float", "dense", lambda a: dict(null_slot=0.0), TypeError, [f"{NULL} float"]),
    ("null_slot_str", "dense", lambda a: dict(null_slot="0"), TypeError, [f"{NULL} str"]),
    ("null_slot_tensor", "dense", lambda a: dict(null_slot=torch.tensor(0)), TypeError, [f"{NULL} Tensor"]),
    ("null_slot_-2", "dense", lambda a: dict(null_slot=-2), ValueError,
     ["null_slot: expected -1 or more (slots <= null_slot are padding; -1 or more); got -2"]),
    ("null_slot_bool_dense_state", "dense",  # checked even where it is then ignored
     lambda a: dict(null_slot=False, initial_state=pool()[:2], initial_state_indices=None), TypeError,
     [f"{NULL} bool"]),
    # per-token slot tables
    ("table_int16", "table", lambda a: dict(initial_state_indices=a["initial_state_indices"].short()), TypeError,
     ["initial_state_indices: expected dtype int32, int64; got int16"]),
    ("table_rows", "table", lambda a: dict(initial_state_indices=ints([[0, 1, 2]] * 3)), ValueError,
     ["initial_state_indices: expected shape [N, 1 + S] (per-token slots) = [2, *]; got [3, 3]"]),
    ("table_3d", "table", lambda a: dict(initial_state_indices=ints([[[0, 1]], [[2, 3]]])), ValueError,
     ["initial_state_indices: expected shape [B] = [2]; got [2, 1, 2]"]),
    ("table_too_few_columns", "table", lambda a: dict(initial_state_indices=ints([[0], [1]])), ValueError,
     ["initial_state_indices: a per-token table needs a column per token, 1 + S >= T=2; got [2, 1]",
      "plain multi-token decode passes [N] indices"]),
    ("table_columns_strided", "table",
     lambda a: dict(initial_state_indices=torch.arange(6, dtype=I32).view(3, 2).t()), ValueError,
     ["initial_state_indices: its columns must be contiguous (strides (1, 2)); rows may have any stride"]),
    ("table_columns_every_other", "table",
     lambda a: dict(initial_state_indices=torch.arange(12, dtype=I32).view(2, 6)[:, ::2]), ValueError,
     ["initial_state_indices: its columns must be contiguous (strides (6, 2))"]),
    ("table_with_output_state_indices", "table", lambda a: dict(output_state_indices=ints([6, 7])), ValueError,
     ["output_state_indices: not with a per-token slot table (the table names the slots written)"]),
    ("table_with_disable_state_update", "table", lambda a: dict(disable_state_update=True), ValueError,
     ["disable_state_update: not with a per-token slot table (the table's slots are the update)"]),
    ("num_accepted_with_1d_indices", "dense", lambda a: dict(num_accepted_tokens=ints([1, 1])), ValueError,
     ["num_accepted_tokens: needs per-token slots, initial_state_indices of shape [N, 1 + S]; got [2]"]),
    ("num_accepted_without_indices", "dense",
     lambda a: dict(initial_state=pool()[:2], initial_state_indices=None, num_accepted_tokens=ints([1, 1])),
     ValueError, ["num_accepted_tokens: needs initial_state_indices (the read slots) as well"]),
    ("num_accepted_int64_table_int32", "table", lambda a: dict(num_accepted_tokens=ints([1, 1], I64)), TypeError,
     ["num_accepted_tokens: expected dtype int32 (as initial_state_indices); got int64"]),
    ("num_accepted_int32_table_int64", "table",
     lambda a: dict(initial_state_indices=a["initial_state_indices"].long(), num_accepted_tokens=ints([1, 1])),
     TypeError, ["num_accepted_tokens: expected dtype int64 (as initial_state_indices); got int32"]),
    ("num_accepted_float", "table", lambda a: dict(num_accepted_tokens=torch.ones(2)), TypeError,
     ["num_accepted_tokens: expected dtype int32 (as initial_state_indices); got float32"]),
    ("num_accepted_list", "table", lambda a: dict(num_accepted_tokens=[1, 1]), TypeError,
     ["num_accepted_tokens: expected a torch.Tensor, got list"]),
    ("num_accepted_rows", "table", lambda a: dict(num_accepted_tokens=ints([1, 1, 1])), ValueError,
     ["num_accepted_tokens: expected shape [B] = [2]; got [3]"]),
    ("num_accepted_2d", "table", lambda a: dict(num_accepted_tokens=ints([[1], [1]])), ValueError,
     ["num_accepted_tokens: expected shape [B] = [2]; got [2, 1]"]),
    ("num_accepted_strided", "table", lambda a: dict(num_accepted_tokens=torch.ones(4, dtype=I32)[::2]), ValueError,
     ["num_accepted_tokens: must be contiguous (shape [2], strides (2,))"]),
    ("num_accepted_packed_rows", "packed_table", lambda a: dict(num_accepted_tokens=ints([1, 1])), ValueError,
     ["num_accepted_tokens: expected shape [N] (one per sequence) = [3]; got [2]"]),
    ("packed_table_rows", "packed_table", lambda a: dict(initial_state_indices=ints([[0, 1, 2]] * 2)), ValueError,
     ["initial_state_indices: expected shape [N, 1 + S] (per-token slots) = [3, *]; got [2, 3]"]),
    ("packed_table_columns_below_max_seqlen", "packed_table", lambda a: dict(max_seqlen=5), ValueError,
     ["initial_state_indices: a per-token table needs a column per token, 1 + S >= T=5; got [3, 4]"]),
    ("packed_table_default_max_seqlen", "packed_table", lambda a: dict(max_seqlen=None), ValueError,
     ["initial_state_indices: a per-token table needs a column per token, 1 + S >= T=6; got [3, 4]"]),
    # packed sequences
    ("cu_seqlens_float", "packed", lambda a: dict(cu_seqlens=a["cu_seqlens"].float()), TypeError,
     ["cu_seqlens: expected dtype int32, int64; got float32"]),
    ("cu_seqlens_int16", "packed", lambda a: dict(cu_seqlens=a["cu_seqlens"].short()), TypeError,
     ["cu_seqlens: expected dtype int32, int64; got int16"]),
    ("cu_seqlens_list", "packed", lambda a: dict(cu_seqlens=[0, 2, 3, 6]), TypeError,
     ["cu_seqlens: expected a torch.Tensor, got list"]),
    ("cu_seqlens_no_sequence", "packed", lambda a: dict(cu_seqlens=ints([0])), ValueError,
     ["cu_seqlens: expected shape [N + 1] with N >= 1 sequences; got [1]"]),
    ("cu_seqlens_empty", "packed", lambda a: dict(cu_seqlens=ints([])), ValueError,
     ["cu_seqlens: expected shape [N + 1] with N >= 1 sequences; got [0]"]),
    ("cu_seqlens_2d", "packed", lambda a: dict(cu_seqlens=a["cu_seqlens"][None]), ValueError,
     ["cu_seqlens: expected shape [N + 1] with N >= 1 sequences; got [1, 4]"]),
    ("cu_seqlens_strided", "packed", lambda a: dict(cu_seqlens=cu((1, 1, 1, 1, 1, 1))[::2]), ValueError,
     ["cu_seqlens: must be contiguous (shape [4], strides (2,))"]),
    ("packed_q_dense_shape", "packed", lambda a: dict(q=torch.zeros(2, 3, H, K, dtype=BF16)), ValueError,
     ["q: expected shape [1, total_tokens, H, K] = [1, *, *, *]; got [2, 3, 16, 128]"]),
    ("packed_q_flat", "packed", lambda a: dict(q=a["q"][0]), ValueError,
     ["q: expected shape [1, total_tokens, H, K] = [1, *, *, *]; got [6, 16, 128]"]),
    ("packed_k_tokens", "packed", lambda a: dict(k=a["k"][:, :5]), ValueError,
     ["k: expected shape [1, total_tokens, H, K] (as q) = [1, 6, 16, 128]; got [1, 5, 16, 128]"]),
    ("packed_v_tokens", "packed", lambda a: dict(v=a["v"][:, :5]), ValueError,
     ["v: expected shape [1, total_tokens, HV, V] = [1, 6, *, *]; got [1, 5, 32, 128]"]),
    ("packed_a_flat", "packed", lambda a: dict(a=a["a"][0]), ValueError,
     ["a: expected shape [1, total_tokens, HV] = [1, 6, 32]; got [6, 32]"]),
    ("packed_b_tokens", "packed", lambda a: dict(b=a["b"][:, 1:]), ValueError,
     ["b: expected shape [1, total_tokens, HV] = [1, 6, 32]; got [1, 5, 32]"]),
    ("packed_output_tokens", "packed", lambda a: dict(output=torch.zeros(1, 5, HV, V, dtype=BF16)), ValueError,
     ["output: expected shape [1, total_tokens, HV, V] = [1, 6, 32, 128]; got [1, 5, 32, 128]"]),
    ("packed_output_flat", "packed", lambda a: dict(output=torch.zeros(TOTAL, HV, V, dtype=BF16)), ValueError,
     ["output: expected shape [1, total_tokens, HV, V] = [1, 6, 32, 128]; got [6, 32, 128]"]),
    ("packed_q_no_tokens", "packed",
     lambda a: {n: a[n][:, :0] for n in ("q", "k", "v", "a", "b")} | dict(cu_seqlens=ints([0, 0])),
     ValueError, ["q: batch and token counts must be >= 1; got shape [1, 0, 16, 128]"]),
    ("max_seqlen_0", "packed", lambda a: dict(max_seqlen=0), ValueError,
     [f"max_seqlen: expected 1..8 ({MAX_SEQLEN}); got 0"]),
    ("max_seqlen_9", "packed", lambda a: dict(max_seqlen=9), ValueError,
     [f"max_seqlen: expected 1..8 ({MAX_SEQLEN}); got 9"]),
    ("max_seqlen_bool", "packed", lambda a: dict(max_seqlen=True), TypeError,
     [f"max_seqlen: expected an int ({MAX_SEQLEN}); got bool"]),
    ("max_seqlen_float", "packed", lambda a: dict(max_seqlen=3.0), TypeError,
     [f"max_seqlen: expected an int ({MAX_SEQLEN}); got float"]),
    ("max_seqlen_tensor", "packed", lambda a: dict(max_seqlen=torch.tensor(3)), TypeError,
     [f"max_seqlen: expected an int ({MAX_SEQLEN}); got Tensor"]),
    ("max_seqlen_without_cu_seqlens", "dense", lambda a: dict(max_seqlen=2), ValueError,
     ["max_seqlen: only a packed call (cu_seqlens) takes it; a dense call's T is q.shape[1]"]),
    ("uniform_seqlen_dense", "dense", lambda a: dict(uniform_seqlen=True), ValueError,
     ["uniform_seqlen: places sequence n at n * max_seqlen, so it needs a packed call (cu_seqlens) "
      "with max_seqlen; got cu_seqlens=None, max_seqlen=None"]),
    ("uniform_seqlen_without_max_seqlen", "packed", lambda a: dict(uniform_seqlen=True), ValueError,
     ["uniform_seqlen: places sequence n at n * max_seqlen, so it needs a packed call (cu_seqlens) "
      "with max_seqlen; got cu_seqlens=a tensor, max_seqlen=None"]),
    ("uniform_seqlen_int", "packed", lambda a: dict(uniform_seqlen=1, max_seqlen=3), TypeError,
     ["uniform_seqlen: expected a bool, got int"]),
    ("uniform_seqlen_short_buffer", "packed", lambda a: dict(uniform_seqlen=True, max_seqlen=3),
     ValueError, ["uniform_seqlen: places sequence n at n * max_seqlen, so the token buffer must "
                  "hold N * max_seqlen = 3 * 3 = 9 tokens; got 6"]),
    ("packed_dense_state_rows", "packed", lambda a: dict(initial_state=pool()[:2], initial_state_indices=None),
     ValueError, ["initial_state: without initial_state_indices the state is per sequence, so its dim 0 must be "
                  "N=3; got [2, 32, 128, 128]"]),
    ("packed_state_rows", "packed", lambda a: dict(state=pool()[:4], initial_state=None, initial_state_indices=None),
     ValueError, ["state: without initial_state_indices the state is per sequence, so its dim 0 must be N=3; "
                  "got [4, 32, 128, 128]"]),
    ("packed_indices_rows", "packed", lambda a: dict(initial_state_indices=ints([0, 1, 2, 3])), ValueError,
     ["initial_state_indices: expected shape [N] (one per sequence) = [3]; got [4]"]),
    ("packed_write_indices_rows", "packed", lambda a: dict(output_state_indices=ints([4, 5])), ValueError,
     ["output_state_indices: expected shape [N] (one per sequence) = [3]; got [2]"]),
    ("packed_cache_rows", "packed", lambda a: dict(intermediate_states_buffer=cache(2, 6)), ValueError,
     ["intermediate_states_buffer: expected shape [N, cache_steps, HV, V, K] = [3, *, 32, 128, 128]; "
      "got [2, 6, 32, 128, 128]"]),
    ("packed_cache_steps", "packed", lambda a: dict(max_seqlen=3, intermediate_states_buffer=cache(3, 2)),
     ValueError, ["intermediate_states_buffer: cache_steps (dim 1) must be >= T=3; got 2"]),
    ("packed_cache_steps_default_max_seqlen", "packed", lambda a: dict(intermediate_states_buffer=cache(3, 3)),
     ValueError, ["intermediate_states_buffer: cache_steps (dim 1) must be >= T=6; got 3"]),
    # cache rows named per row
    ("cache_rows_without_buffer", "cache_rows", lambda a: dict(intermediate_states_buffer=None), ValueError,
     ["intermediate_state_indices: names rows of intermediate_states_buffer, which is missing"]),
    ("cache_rows_without_indices", "cache_rows",
     lambda a: dict(initial_state=pool()[:2], initial_state_indices=None), ValueError,
     ["intermediate_state_indices: needs initial_state_indices (the read slots) as well"]),
    ("cache_rows_without_indices_or_buffer", "dense",
     lambda a: dict(initial_state=pool()[:2], initial_state_indices=None, intermediate_state_indices=ints([0, 1])),
     ValueError, ["intermediate_state_indices: needs initial_state_indices (the read slots) as well"]),
    ("cache_rows_int64", "cache_rows", lambda a: dict(intermediate_state_indices=ints([0, 1], I64)), TypeError,
     ["intermediate_state_indices: expected dtype int32 (as initial_state_indices); got int64"]),
    ("cache_rows_int32_indices_int64", "cache_rows",
     lambda a: dict(initial_state_indices=a["initial_state_indices"].long()), TypeError,
     ["intermediate_state_indices: expected dtype int64 (as initial_state_indices); got int32"]),
    ("cache_rows_float", "cache_rows", lambda a: dict(intermediate_state_indices=torch.zeros(2)), TypeError,
     ["intermediate_state_indices: expected dtype int32 (as initial_state_indices); got float32"]),
    ("cache_rows_numpy", "cache_rows", lambda a: dict(intermediate_state_indices=np.zeros(2, np.int32)), TypeError,
     ["intermediate_state_indices: expected a torch.Tensor, got ndarray"]),
    ("cache_rows_rows", "cache_rows", lambda a: dict(intermediate_state_indices=ints([0, 1, 2])), ValueError,
     ["intermediate_state_indices: expected shape [B] = [2]; got [3]"]),
    ("cache_rows_2d", "cache_rows", lambda a: dict(intermediate_state_indices=ints([[0], [1]])), ValueError,
     ["intermediate_state_indices: expected shape [B] = [2]; got [2, 1]"]),
    ("cache_rows_strided", "cache_rows", lambda a: dict(intermediate_state_indices=ints([0, 9, 1, 9])[::2]),
     ValueError, ["intermediate_state_indices: must be contiguous (shape [2], strides (2,))"]),
    ("cache_rows_packed_rows", "packed",
     lambda a: dict(intermediate_states_buffer=cache(4, 6), intermediate_state_indices=ints([0, 1])), ValueError,
     ["intermediate_state_indices: expected shape [N] (one per sequence) = [3]; got [2]"]),
    ("cache_rows_buffer_heads", "cache_rows", lambda a: dict(intermediate_states_buffer=cache(3, 2, heads=16)),
     ValueError, ["intermediate_states_buffer: expected shape [R, cache_steps, HV, V, K] = [*, *, 32, 128, 128]; "
                  "got [3, 2, 16, 128, 128]"]),
    ("cache_rows_buffer_steps", "cache_rows", lambda a: dict(intermediate_states_buffer=cache(3, 1)), ValueError,
     ["intermediate_states_buffer: cache_steps (dim 1) must be >= T=2; got 1"]),
    ("cache_rows_buffer_dtype", "cache_rows",
     lambda a: dict(intermediate_states_buffer=torch.zeros(3, 2, HV, V, K, dtype=torch.float16)), TypeError,
     ["intermediate_states_buffer: expected dtype bfloat16 (as the state); got float16"]),
]
# fmt: on


@pytest.mark.parametrize(
    "builder,change,exc_type,fragments", [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_bad_form(builder, change, exc_type, fragments):
    args = BUILDERS[builder]()
    args.update(change(args))
    message = raises(exc_type, args, *fragments)
    name = fragments[0].split(":")[0]
    assert message.startswith(name + ":"), message


@pytest.mark.parametrize(
    "builder,name",
    [
        ("packed", "cu_seqlens"),
        ("table", "num_accepted_tokens"),
        ("cache_rows", "intermediate_state_indices"),
        ("table", "initial_state_indices"),
    ],
)
def test_form_tensor_on_another_device(builder, name):
    args = BUILDERS[builder]()
    if name == "num_accepted_tokens":
        args[name] = ints([1, 3])
    fake = on_fake_cuda(args)
    fake[name] = args[name]  # left on the host
    raises(ValueError, fake, f"{name}: expected a tensor on cuda:0 (as q); got cpu")


def test_valid_forms_on_the_host_fail_only_on_the_device():
    for builder in BUILDERS.values():
        raises(ValueError, builder(), "q: expected a CUDA tensor; got a tensor on cpu")


# -- check_call: the Call and CompileKey of good inputs ---------------------------------------------


@pytest.mark.parametrize("null_slot", [-1, 0, 3, 100])
def test_null_slot_is_carried(null_slot):
    call = check(dense(null_slot=null_slot))
    assert call.null_slot == null_slot and key(call).null_slot == null_slot


@pytest.mark.parametrize("null_slot", [0, 5])
@pytest.mark.parametrize("builder", ["dense", "packed"])
def test_null_slot_without_indices_is_normalised(builder, null_slot):
    rows = 2 if builder == "dense" else len(SEQLENS)
    args = BUILDERS[builder](
        initial_state=pool()[:rows], initial_state_indices=None, null_slot=null_slot
    )
    call = check(args)
    assert call.null_slot == -1 and key(call).null_slot == -1
    assert call.index_dtype is None and call.read_slots is None


def test_plain_call_has_no_form():
    call = check(dense())
    assert (call.batch, call.tokens) == (2, 2)
    assert not call.per_token_slots and not call.packed and call.write_final_state
    assert (call.null_slot, call.cu_seqlens_dtype, call.total_tokens) == (-1, None, None)
    assert call.num_accepted is None and call.cache_rows is None
    k = key(call)
    assert (k.null_slot, k.cu_seqlens_dtype, k.per_token_slots, k.num_accepted, k.cache_rows) == (
        -1, None, False, False, False,
    )  # fmt: skip
    assert not k.packed and k.write_final_state


@pytest.mark.parametrize("dtype", [I32, I64], ids=["int32", "int64"])
@pytest.mark.parametrize("accepted", [False, True], ids=["all", "num_accepted"])
def test_per_token_table_call(dtype, accepted):
    args = table(initial_state_indices=ints([[0, 1, 2], [3, 4, 5]], dtype))
    if accepted:
        args["num_accepted_tokens"] = ints([1, 3], dtype)
    call = check(args)
    assert (call.batch, call.tokens) == (2, 2)
    assert call.per_token_slots and call.stores_token_states
    assert not call.write_final_state and not call.cache and not call.separate_write_slots
    assert call.index_dtype == str(dtype).removeprefix("torch.")
    assert (call.num_accepted is not None) == accepted
    k = key(call)
    assert k.per_token_slots and not k.write_final_state and k.num_accepted == accepted
    assert k.index_dtype == call.index_dtype and k.tokens == 2


@pytest.mark.parametrize(
    "slots",
    [
        torch.arange(16, dtype=I32).view(2, 8)[:, :3],  # rows of stride 8
        torch.arange(16, dtype=I32).view(2, 8)[:, 4:6],  # an offset view, 1 + S = T
        ints([[0, 1, 2]]).expand(2, 3),  # rows of stride 0
        torch.arange(6, dtype=I32).view(2, 3),
    ],
    ids=["row_stride_8", "offset_view", "row_stride_0", "dense"],
)
def test_per_token_table_rows_may_have_any_stride(slots):
    call = check(table(initial_state_indices=slots))
    assert call.per_token_slots and call.read_slots.data_ptr() == slots.data_ptr()


def test_per_token_table_of_one_column_any_stride():
    slots = torch.arange(8, dtype=I32).view(2, 4)[:, 1:2]  # [2, 1], strides (4, 1)
    slots = slots.as_strided((2, 1), (4, 7))  # a single column: its stride does not matter
    call = check(dense(T=1, initial_state_indices=slots))
    assert call.per_token_slots and call.tokens == 1


def test_per_token_table_with_cache_and_null_slot():
    args = table(intermediate_states_buffer=cache(2, 2), null_slot=0)
    call = check(args)
    assert call.per_token_slots and call.cache and call.null_slot == 0
    k = key(call)
    assert k.cache and not k.cache_rows and k.per_token_slots and k.null_slot == 0


@pytest.mark.parametrize("cu_dtype", [I32, I64], ids=["int32", "int64"])
@pytest.mark.parametrize(
    "seqlens,max_seqlen,tokens",
    [
        (SEQLENS, None, 6),  # min(total, 8)
        (SEQLENS, 3, 3),
        (SEQLENS, 8, 8),
        ((4, 4, 4), None, 8),  # total 12, capped at the target's 8
        ((1,), None, 1),
        ((1,), 1, 1),
        ((0, 2), None, 2),  # an empty sequence
    ],
    ids=["default", "max3", "max8", "total12", "one_token", "one_token_max1", "empty_seq"],
)
def test_packed_call(cu_dtype, seqlens, max_seqlen, tokens):
    call = check(packed(seqlens, cu_dtype, max_seqlen=max_seqlen))
    assert call.packed and call.batch == len(seqlens) and call.tokens == tokens
    assert call.total_tokens == sum(seqlens)
    assert call.cu_seqlens_dtype == str(cu_dtype).removeprefix("torch.")
    assert call.batch_heads == len(seqlens) * HV
    assert call.write_final_state and not call.per_token_slots
    k = key(call)
    assert k.packed and k.cu_seqlens_dtype == call.cu_seqlens_dtype and k.tokens == tokens


def test_packed_cu_seqlens_dtype_is_its_own():
    """cu_seqlens need not match the slot indices' dtype."""
    call = check(packed(cu_dtype=I64, initial_state_indices=ints([0, 1, 2], I32)))
    assert (call.cu_seqlens_dtype, call.index_dtype) == ("int64", "int32")


@pytest.mark.parametrize("name", ["state", "initial_state"])
def test_packed_dense_state(name):
    args = packed(initial_state=None, initial_state_indices=None, null_slot=2)
    args[name] = pool()[: len(SEQLENS)]
    call = check(args)
    assert call.batch == 3 and call.index_dtype is None and call.null_slot == -1


def test_packed_with_output_cache_and_write_slots():
    args = packed(
        max_seqlen=3,
        output=torch.zeros(1, TOTAL, HV, V, dtype=BF16),
        output_state_indices=ints([5, 6, 7]),
        intermediate_states_buffer=cache(3, 3),
        disable_state_update=False,
    )
    call = check(args)
    assert (call.batch, call.tokens, call.total_tokens) == (3, 3, TOTAL)
    assert call.cache and call.separate_write_slots and call.cache_rows is None


def test_packed_per_token_table_call():
    args = packed_table(num_accepted_tokens=ints([1, 2, 4]), null_slot=0)
    call = check(args)
    assert (call.batch, call.tokens, call.total_tokens) == (3, 3, TOTAL)
    assert call.per_token_slots and not call.write_final_state and call.null_slot == 0
    k = key(call)
    assert (k.per_token_slots, k.num_accepted, k.cu_seqlens_dtype, k.tokens) == (
        True, True, "int32", 3,
    )  # fmt: skip


@pytest.mark.parametrize("R", [1, 3, 64])
def test_cache_rows_call(R):
    call = check(cache_rows(intermediate_states_buffer=cache(R, 2)))
    assert call.cache and call.cache_rows is not None and call.cache_buffer.size(0) == R
    k = key(call)
    assert k.cache and k.cache_rows and k.write_final_state


def test_cache_rows_with_verify_and_packed():
    args = packed(
        max_seqlen=3,
        intermediate_states_buffer=cache(5, 4),
        intermediate_state_indices=ints([4, 0, 2]),
        disable_state_update=True,
    )
    call = check(args)
    assert call.batch == 3 and call.cache and not call.write_final_state
    assert key(call).cache_rows and key(call).packed


def test_forms_give_distinct_compile_keys():
    keys = {
        key(check(dense())),
        key(check(dense(null_slot=0))),
        key(check(table())),
        key(check(table(num_accepted_tokens=ints([1, 1])))),
        key(check(packed(max_seqlen=2))),
        key(check(packed(max_seqlen=2, cu_dtype=I64))),
        key(check(cache_rows())),
        key(check(dense(intermediate_states_buffer=cache(2, 2)))),
    }
    assert len(keys) == 8


def test_uniform_rows_come_from_the_callers_promise_never_the_shapes():
    """Sequence n is placed at n * max_seqlen only where the call says uniform_seqlen=True: a
    buffer of exactly N * max_seqlen tokens proves nothing, as it may hold shorter sequences and
    unused tokens past cu_seqlens[-1] (an engine's graph-padded token buffer)."""
    assert not key(check(packed([3, 3, 3], max_seqlen=3))).uniform_rows
    # 2 + 3 + 1 live tokens in a buffer of 9 = 3 * 3: not uniform, whatever its length says
    padded_buffer = packed([3, 3, 3], max_seqlen=3, cu_seqlens=cu([2, 3, 1]))
    assert not key(check(padded_buffer)).uniform_rows
    for seqlens, max_seqlen in (([3, 3, 3], 3), ([3, 2, 3], 3), ([2, 2], 4)):
        # a buffer of N * max_seqlen tokens, whatever cu_seqlens holds (the kernel checks it)
        buffer = [max_seqlen] * len(seqlens)
        promised = packed(
            buffer, max_seqlen=max_seqlen, cu_seqlens=cu(seqlens), uniform_seqlen=True
        )
        assert key(check(promised)).uniform_rows, seqlens
    assert not key(check(dense(T=3))).uniform_rows  # dense rows are placed by shape anyway


def test_an_exact_slot_table_is_read_off_the_table_shape():
    """A per-token table of exactly max_seqlen columns is loaded whole beside
    num_accepted_tokens; its width is a fact of the tensor, so the shapes may pick it."""
    slots = ints([[1, 2, 3], [4, 5, 6]])
    spec = dict(initial_state_indices=slots, num_accepted_tokens=ints([1, 3]))
    exact = key(check(packed([3, 3], max_seqlen=3, **spec)))
    assert exact.exact_slot_table and not exact.uniform_rows
    both = key(check(packed([3, 3], max_seqlen=3, uniform_seqlen=True, **spec)))
    assert both.uniform_rows and both.exact_slot_table
    wide = key(check(packed([2, 2], max_seqlen=2, **spec)))  # 1 + S = 3 > T = 2
    assert not wide.exact_slot_table
    assert key(check(table(initial_state_indices=ints([[1, 2], [3, 4]])))).exact_slot_table
    assert not key(check(table())).exact_slot_table  # [2, 3] at T = 2


def test_the_uniform_promise_joins_the_signature():
    """Two calls that differ only in uniform_seqlen compile different kernels, so the promise
    must be part of the signature the launcher keeps (and a buffer's length no longer is)."""
    from gdngen.runtime.launcher import call_key

    def signature(args):
        args = on_fake_cuda(args)
        return call_key(**{n: args[n] for n in DEFAULTS})

    plain = signature(packed([2, 2], max_seqlen=2))
    promised = signature(packed([2, 2], max_seqlen=2, uniform_seqlen=True))
    assert promised != plain
    assert signature(packed([2, 2], max_seqlen=2, cu_seqlens=cu([1, 2]))) == plain
    # a buffer too short for the promise must reach the full checks (which refuse it)
    assert signature(packed([2, 1], max_seqlen=2, uniform_seqlen=True)) != promised


# -- kernel_views: mixed_qkv and the flat packed forms -----------------------------------------------


def views_of(**given):
    arguments = dict(q=None, k=None, v=None, output=None, mixed_qkv=None, cu_seqlens=None)
    arguments.update(given)
    return kernel_views(INFO, **arguments)


def checked_views(views, cu_seqlens=None, heads=HV, rows=None, **over) -> Call:
    """check_call on the views (rows: the pool slots, 0..rows-1)."""
    rows = (
        rows
        if rows is not None
        else (views.q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1)
    )
    args = call_args(1, 1, rows, heads=heads)
    args.update(q=views.q, k=views.k, v=views.v, a=views.a, b=views.b, output=views.output)
    args.update(cu_seqlens=cu_seqlens, **over)
    return check(args)


def assert_zero_copy(views, mixed: torch.Tensor, heads: int = HV) -> None:
    base = mixed.data_ptr()
    size = mixed.element_size()
    assert views.q.data_ptr() - base == 0
    assert views.k.data_ptr() - base == H * K * size
    assert views.v.data_ptr() - base == 2 * H * K * size
    storage = mixed.untyped_storage().data_ptr()
    for t in (views.q, views.k, views.v):
        assert t.untyped_storage().data_ptr() == storage
    assert views.q.shape[-2:] == (H, K) and views.k.shape[-2:] == (H, K)
    assert views.v.shape[-2:] == (heads, V)


@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("row_stride", [WIDTH, WIDTH + 8, WIDTH + 64])
def test_mixed_dense_rows(dtype, row_stride):
    B = 3
    mixed = torch.zeros(B, row_stride, dtype=dtype)[:, :WIDTH]
    a, b = torch.zeros(B, HV, dtype=BF16), torch.ones(B, HV, dtype=BF16)
    views = views_of(mixed_qkv=mixed, a=a, b=b)
    assert_zero_copy(views, mixed)
    assert views.q.shape == (B, 1, H, K) and views.v.shape == (B, 1, HV, V)
    assert views.q.stride() == (row_stride, row_stride, K, 1)
    assert views.v.stride() == (row_stride, row_stride, V, 1)
    assert views.a.shape == (B, 1, HV) and views.b.shape == (B, 1, HV)
    assert views.a.data_ptr() == a.data_ptr() and views.b.data_ptr() == b.data_ptr()
    assert views.output is None
    # a write through the buffer shows in the views: no copies
    mixed[1, H * K + 5] = 7
    mixed[2, 2 * H * K + 3 * V + 1] = 9
    assert views.k[1, 0, 0, 5] == 7 and views.v[2, 0, 3, 1] == 9
    call = checked_views(views)
    assert (call.batch, call.tokens, call.H, call.HV, call.K, call.V) == (B, 1, H, HV, K, V)
    assert call.io_dtype == ("bf16" if dtype == BF16 else "fp16")


def test_mixed_dense_tokens():
    B, T = 2, 3
    mixed = torch.zeros(B, T, WIDTH, dtype=BF16)
    a = torch.zeros(B, T, HV, dtype=BF16)
    views = views_of(mixed_qkv=mixed, a=a, b=a)
    assert_zero_copy(views, mixed)
    assert views.q.shape == (B, T, H, K) and views.v.shape == (B, T, HV, V)
    assert views.q.stride() == (T * WIDTH, WIDTH, K, 1)
    assert views.a is a and views.output_squeeze is None
    call = checked_views(views)
    assert (call.batch, call.tokens) == (B, T)


def test_mixed_qwen35_geometry():
    mixed = torch.zeros(2, WIDTH2, dtype=BF16)
    a = torch.zeros(2, HV2, dtype=BF16)
    views = views_of(mixed_qkv=mixed, a=a, b=a)
    assert_zero_copy(views, mixed, heads=HV2)
    assert views.v.shape == (2, 1, HV2, V)
    call = checked_views(views, heads=HV2)
    assert (call.H, call.HV, call.K, call.V) == (H, HV2, K, V)


def test_mixed_view_of_an_offset_buffer():
    """A mixed_qkv that starts inside its storage (16-byte aligned)."""
    big = torch.zeros(4, WIDTH, dtype=BF16)
    mixed = big[1:3]
    views = views_of(
        mixed_qkv=mixed, a=torch.zeros(2, HV, dtype=BF16), b=torch.zeros(2, HV, dtype=BF16)
    )
    assert_zero_copy(views, mixed)
    assert views.q.storage_offset() == WIDTH


@pytest.mark.parametrize("form", ["flat", "lead1"])
def test_mixed_packed(form):
    mixed = torch.zeros(TOTAL, WIDTH + 8, dtype=BF16)[:, :WIDTH]
    if form == "lead1":
        mixed = mixed[None]
    a = torch.zeros(TOTAL, HV, dtype=BF16)
    cu_seqlens = cu(SEQLENS)
    views = views_of(mixed_qkv=mixed, a=a, b=a, cu_seqlens=cu_seqlens)
    assert_zero_copy(views, mixed)
    assert views.q.shape == (1, TOTAL, H, K) and views.v.shape == (1, TOTAL, HV, V)
    assert views.q.stride()[1] == WIDTH + 8 and views.q.stride()[2:] == (K, 1)
    assert views.a.shape == (1, TOTAL, HV) and views.b.shape == (1, TOTAL, HV)
    assert views.output_squeeze == (0 if form == "flat" else None)
    call = checked_views(views, cu_seqlens, max_seqlen=3)
    assert (call.batch, call.tokens, call.total_tokens) == (3, 3, TOTAL)


def test_mixed_views_stay_on_the_buffers_device():
    """The views are made from the caller's tensors (as_strided, unsqueeze): no host round trip."""
    mixed = torch.zeros(TOTAL, WIDTH, dtype=BF16).as_subclass(FakeCuda)
    a = torch.zeros(TOTAL, HV, dtype=BF16).as_subclass(FakeCuda)
    views = views_of(mixed_qkv=mixed, a=a, b=a, cu_seqlens=cu(SEQLENS).as_subclass(FakeCuda))
    for t in (views.q, views.k, views.v, views.a, views.b):
        assert t.device == torch.device("cuda", 0)
    assert_zero_copy(views, mixed)


def test_mixed_outputs_are_lifted():
    B = 2
    out = torch.zeros(B, HV, V, dtype=BF16)
    a = torch.zeros(B, HV, dtype=BF16)
    views = views_of(mixed_qkv=torch.zeros(B, WIDTH, dtype=BF16), a=a, b=a, output=out)
    assert views.output.shape == (B, 1, HV, V) and views.output_squeeze == 1
    assert views.output.data_ptr() == out.data_ptr()
    out4 = torch.zeros(B, 1, HV, V, dtype=BF16)
    views = views_of(mixed_qkv=torch.zeros(B, WIDTH, dtype=BF16), a=a, b=a, output=out4)
    assert views.output is out4 and views.output_squeeze is None
    checked_views(views)


def test_packed_flat_q_is_lifted():
    q = torch.zeros(TOTAL, H, K, dtype=BF16)
    v = torch.zeros(TOTAL, HV, V, dtype=BF16)
    a = torch.zeros(TOTAL, HV, dtype=BF16)
    out = torch.zeros(TOTAL, HV, V, dtype=BF16)
    cu_seqlens = cu(SEQLENS)
    assert needs_views(q, None, cu_seqlens)
    views = views_of(q=q, k=q, v=v, a=a, b=a, cu_seqlens=cu_seqlens)
    assert views.q.shape == (1, TOTAL, H, K) and views.k.shape == (1, TOTAL, H, K)
    assert views.v.shape == (1, TOTAL, HV, V) and views.a.shape == (1, TOTAL, HV)
    assert views.q.data_ptr() == q.data_ptr() and views.output is None
    assert views.output_squeeze == 0
    views = views_of(q=q, k=q, v=v, a=a, b=a, output=out, cu_seqlens=cu_seqlens)
    assert views.output.shape == (1, TOTAL, HV, V) and views.output_squeeze == 0
    call = checked_views(views, cu_seqlens)
    assert (call.batch, call.tokens, call.total_tokens) == (3, 6, TOTAL)


def test_needs_views():
    q4 = torch.zeros(1, TOTAL, H, K, dtype=BF16)
    q3 = q4[0]
    mixed = torch.zeros(2, WIDTH, dtype=BF16)
    cu_seqlens = cu(SEQLENS)
    assert needs_views(None, mixed, None) and needs_views(None, mixed, cu_seqlens)
    assert needs_views(q3, None, cu_seqlens)
    assert not needs_views(q4, None, cu_seqlens)
    assert not needs_views(q4, None, None) and not needs_views(q3, None, None)
    assert not needs_views(None, None, None)


def test_mixed_geometry():
    assert mixed_geometry(INFO, WIDTH, HV) == (H, K, HV, V)
    assert mixed_geometry(INFO, WIDTH2, HV2) == (H, K, HV2, V)


def test_mixed_geometry_ambiguous():
    info = dataclasses.replace(
        INFO,
        name="h200-ambiguous-test",
        geometries=INFO.geometries + (Geometry(name="other", H=32, HV=32, K=64, V=128),),
    )
    with pytest.raises(ValueError) as caught:
        mixed_geometry(info, WIDTH, HV)
    message = str(caught.value)
    assert message.startswith(
        "mixed_qkv: a row width of 8192 with HV=32 (from a) is ambiguous among the geometries "
        "of target h200-ambiguous-test"
    ), message
    assert "other: 2*32*64 + 32*128 = 8192" in message


def mixed_rows(rows=2, width=WIDTH):
    return torch.zeros(rows, width, dtype=BF16)


def gates(rows=2, heads=HV):
    return torch.zeros(rows, heads, dtype=BF16)


NONE_OF = (
    "(from a) matches none of the geometries of target h200 (2*H*K + HV*V: "
    "qwen3-next: 2*16*128 + 32*128 = 8192, qwen3-next-tp2: 2*8*128 + 16*128 = 4096, "
)

# fmt: off
# (id, kernel_views arguments, exception, message fragments)
BAD_VIEWS = [
    ("mixed_and_q", lambda: dict(q=torch.zeros(2, 1, H, K, dtype=BF16), mixed_qkv=mixed_rows(), a=gates(), b=gates()),
     ValueError, ["q: pass q, k, v or mixed_qkv, not both"]),
    ("mixed_and_qkv", lambda: dict(q=torch.zeros(2, 1, H, K, dtype=BF16), k=torch.zeros(2, 1, H, K, dtype=BF16),
                                   v=torch.zeros(2, 1, HV, V, dtype=BF16), mixed_qkv=mixed_rows(), a=gates(), b=gates()),
     ValueError, ["q/k/v: pass q, k, v or mixed_qkv, not both"]),
    ("mixed_and_v", lambda: dict(v=torch.zeros(2, 1, HV, V, dtype=BF16), mixed_qkv=mixed_rows(), a=gates(), b=gates()),
     ValueError, ["v: pass q, k, v or mixed_qkv, not both"]),
    ("mixed_numpy", lambda: dict(mixed_qkv=np.zeros((2, WIDTH), np.float32), a=gates(), b=gates()),
     TypeError, ["mixed_qkv: expected a torch.Tensor, got ndarray"]),
    ("mixed_fp32", lambda: dict(mixed_qkv=torch.zeros(2, WIDTH), a=gates(), b=gates()),
     TypeError, ["mixed_qkv: expected dtype bfloat16, float16; got float32"]),
    ("mixed_a_none", lambda: dict(mixed_qkv=mixed_rows(), a=None, b=gates()),
     TypeError, ["a: expected a torch.Tensor, got None"]),
    ("mixed_b_list", lambda: dict(mixed_qkv=mixed_rows(), a=gates(), b=[0.0]),
     TypeError, ["b: expected a torch.Tensor, got list"]),
    ("mixed_1d", lambda: dict(mixed_qkv=torch.zeros(WIDTH, dtype=BF16), a=gates(), b=gates()),
     ValueError, ["mixed_qkv: expected shape [B, width] (one token per row) or [B, T, width]; got [8192]"]),
    ("mixed_4d", lambda: dict(mixed_qkv=torch.zeros(1, 2, 1, WIDTH, dtype=BF16), a=gates(), b=gates()),
     ValueError, ["mixed_qkv: expected shape [B, width] (one token per row) or [B, T, width]; got [1, 2, 1, 8192]"]),
    ("mixed_packed_lead2", lambda: dict(mixed_qkv=torch.zeros(2, 3, WIDTH, dtype=BF16), a=gates(6), b=gates(6),
                                        cu_seqlens=cu((3, 3))),
     ValueError, ["mixed_qkv: expected shape [total_tokens, width] or [1, total_tokens, width]; got [2, 3, 8192]"]),
    ("mixed_packed_4d", lambda: dict(mixed_qkv=torch.zeros(1, 1, 6, WIDTH, dtype=BF16), a=gates(6), b=gates(6),
                                     cu_seqlens=cu((3, 3))),
     ValueError, ["mixed_qkv: expected shape [total_tokens, width] or [1, total_tokens, width]; got [1, 1, 6, 8192]"]),
    ("mixed_width", lambda: dict(mixed_qkv=mixed_rows(width=8000), a=gates(), b=gates()),
     ValueError, [f"mixed_qkv: a row width of 8000 with HV=32 {NONE_OF}"]),
    ("mixed_width_of_other_HV", lambda: dict(mixed_qkv=mixed_rows(width=WIDTH2), a=gates(), b=gates()),
     ValueError, [f"mixed_qkv: a row width of 12288 with HV=32 {NONE_OF}"]),
    ("mixed_width_of_HV32_with_HV16", lambda: dict(mixed_qkv=mixed_rows(), a=gates(heads=16), b=gates(heads=16)),
     ValueError, [f"mixed_qkv: a row width of 8192 with HV=16 {NONE_OF}"]),
    ("mixed_rows_not_contiguous", lambda: dict(mixed_qkv=torch.zeros(WIDTH, 2, dtype=BF16).t(), a=gates(), b=gates()),
     ValueError, ["mixed_qkv: its rows must be contiguous (strides (1, 2)); the rows themselves may have any stride"]),
    ("mixed_every_other_column",
     lambda: dict(mixed_qkv=torch.zeros(2, 2 * WIDTH, dtype=BF16)[:, ::2], a=gates(), b=gates()),
     ValueError, ["mixed_qkv: its rows must be contiguous (strides (16384, 2))"]),
    ("mixed_row_stride", lambda: dict(mixed_qkv=mixed_rows(width=WIDTH + 4)[:, :WIDTH], a=gates(), b=gates()),
     ValueError, ["mixed_qkv: its row stride must be a multiple of 8 elements (16 bytes); got strides (8196, 1)"]),
    ("mixed_row_stride_packed",
     lambda: dict(mixed_qkv=mixed_rows(6, WIDTH + 2)[:, :WIDTH], a=gates(6), b=gates(6), cu_seqlens=cu((3, 3))),
     ValueError, ["mixed_qkv: its row stride must be a multiple of 8 elements (16 bytes); got strides (8194, 1)"]),
    ("mixed_token_stride_3d",
     lambda: dict(mixed_qkv=torch.zeros(2, 2, WIDTH + 4, dtype=BF16)[..., :WIDTH], a=gates(), b=gates()),
     ValueError, ["mixed_qkv: its row stride must be a multiple of 8 elements (16 bytes); got strides (16392, 8196, 1)"]),
    ("mixed_misaligned", lambda: dict(mixed_qkv=misaligned((2, WIDTH), BF16), a=gates(), b=gates()),
     ValueError, ["mixed_qkv: q, k and v must each start 16-byte aligned for vector loads; got address 0x",
                  "with q 16*128 elements wide"]),
    ("packed_flat_k_missing", lambda: dict(q=torch.zeros(6, H, K, dtype=BF16), v=torch.zeros(6, HV, V, dtype=BF16),
                                           a=gates(6), b=gates(6), cu_seqlens=cu((3, 3))),
     TypeError, ["k: expected a torch.Tensor, got None"]),
    ("packed_flat_v_numpy", lambda: dict(q=torch.zeros(6, H, K, dtype=BF16), k=torch.zeros(6, H, K, dtype=BF16),
                                         v=np.zeros(3), a=gates(6), b=gates(6), cu_seqlens=cu((3, 3))),
     TypeError, ["v: expected a torch.Tensor, got ndarray"]),
]
# fmt: on


@pytest.mark.parametrize(
    "make,exc_type,fragments", [c[1:] for c in BAD_VIEWS], ids=[c[0] for c in BAD_VIEWS]
)
def test_bad_views(make, exc_type, fragments):
    with pytest.raises(exc_type) as caught:
        views_of(**make())
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert message.startswith(fragments[0].split(":")[0] + ":"), message


def test_mixed_single_row_odd_stride_names_mixed_qkv():
    # Regression: gdngen/runtime/views.py _split_mixed skips the row-stride check for a dim of size 1
    # (``lead[dim] > 1``), but check_call's require_aligned checks q/k/v's outer strides whatever
    # their size, so a one-row mixed_qkv whose row stride is not a whole vector (here 8193) is
    # refused as "q: stride of dim 0 must be a multiple of 8 elements (16 bytes); got 8193": an
    # argument the caller never passed (views.py promises errors name the caller's argument).
    mixed = torch.zeros(1, WIDTH + 1, dtype=BF16)[:, :WIDTH]
    with pytest.raises(ValueError) as caught:
        views = views_of(mixed_qkv=mixed, a=gates(1), b=gates(1))
        checked_views(views)
    assert str(caught.value).startswith("mixed_qkv:"), str(caught.value)


# -- the launcher: bad forms are refused before anything launches -----------------------------------


def launcher_args(args: dict) -> dict:
    return {n: v for n, v in args.items() if v is not None or n in ("q", "k", "v")}


@pytest.mark.parametrize(
    "entry,make,exc_type,fragment",
    [
        ("call", lambda: dense(null_slot=-2), ValueError, "null_slot: expected -1 or more"),
        ("call", lambda: dense(max_seqlen=2), ValueError, "max_seqlen: only a packed call"),
        ("call", lambda: table(disable_state_update=True), ValueError, "disable_state_update: not"),
        ("prepare", lambda: packed(max_seqlen=9), ValueError, "max_seqlen: expected 1..8"),
        ("prepare", lambda: cache_rows(intermediate_states_buffer=None), ValueError,
         "intermediate_state_indices: names rows"),
        ("call", lambda: dict(packed(), q=None, k=None, v=None, a=gates(TOTAL), b=gates(TOTAL),
                              mixed_qkv=mixed_rows(TOTAL, 8000)), ValueError, "mixed_qkv: a row width of 8000"),
        ("prepare", lambda: dict(dense(), mixed_qkv=mixed_rows()), ValueError,
         "q/k/v: pass q, k, v or mixed_qkv, not both"),
        ("call", lambda: dict(dense(T=1), q=None, k=None, v=None, a=gates(), b=gates(), mixed_qkv=mixed_rows()),
         ValueError, "q: expected a CUDA tensor; got a tensor on cpu"),  # a good call, on the host
    ],
    ids=["null_slot", "max_seqlen_dense", "table_verify", "max_seqlen_9", "cache_rows_no_buffer",
         "mixed_width", "mixed_and_q", "mixed_good_on_host"],
)  # fmt: skip
def test_launcher_refuses_bad_forms(entry, make, exc_type, fragment):
    gdn_decode = generated.h200.gdn_decode
    arguments = launcher_args(make())
    launch = gdn_decode.prepare if entry == "prepare" else gdn_decode
    before = gdn_decode.signatures()
    with pytest.raises(exc_type) as caught:
        launch(**arguments)
    assert str(caught.value).startswith(fragment), str(caught.value)
    assert gdn_decode.signatures() == before  # nothing planned


# -- check_index_values for the new forms ----------------------------------------------------------


# fmt: off
INDEX_OK = [
    ("packed_plain", lambda: packed()),
    ("packed_empty_sequence", lambda: packed((0, 3, 3))),
    ("packed_tokens_left_over", lambda: packed(cu_seqlens=ints([0, 2, 3, 4]))),
    ("packed_int64", lambda: packed(cu_dtype=I64, max_seqlen=3)),
    ("table_dead_columns_repeat", lambda: table(initial_state_indices=ints([[0, 1, 7], [2, 3, 7]]))),
    ("table_padding_repeats", lambda: table(initial_state_indices=ints([[-1, -1, -1], [-1, 3, -5]]))),
    ("table_num_accepted_bounds", lambda: table(num_accepted_tokens=ints([1, 3]))),
    ("packed_table_live_columns_only", lambda: packed((1, 2), max_seqlen=3,
                                                      initial_state_indices=ints([[0, 4, 4], [1, 2, 4]]))),
    ("packed_table", lambda: packed_table(num_accepted_tokens=ints([3, 1, 4]))),
    ("null_slot_0_table", lambda: table(null_slot=0, initial_state_indices=ints([[0, 1, 0], [0, 2, 0]]))),
    ("null_slot_3_table", lambda: table(null_slot=3, initial_state_indices=ints([[3, 4, 0], [2, 5, 1]]))),
    ("null_slot_0_indices", lambda: dense(B=4, T=1, null_slot=0, initial_state_indices=ints([0, 0, 1, 2]))),
    ("null_slot_0_writes", lambda: dense(null_slot=0, output_state_indices=ints([0, 0]))),
    ("cache_rows", lambda: cache_rows()),
    ("cache_rows_padding", lambda: cache_rows(intermediate_state_indices=ints([-1, -1]))),
    ("cache_rows_null_slot_0", lambda: cache_rows(null_slot=0, intermediate_state_indices=ints([0, 0]))),
    ("cache_rows_verify_shared_read", lambda: cache_rows(initial_state_indices=ints([3, 3]),
                                                         disable_state_update=True)),
    ("padded_row_writes_nothing", lambda: dense(initial_state_indices=ints([-1, 1]), output_state_indices=ints([5, 5]))),
    ("packed_table_rows_read_from_num_accepted", lambda: packed_table(num_accepted_tokens=ints([1, 1, 4]))),
    ("uniform_seqlen_kept", lambda: packed((3, 3, 3), max_seqlen=3, uniform_seqlen=True)),
    ("uniform_seqlen_graph_padded", lambda: packed((3, 3, 3), max_seqlen=3, uniform_seqlen=True,
                                                   cu_seqlens=ints([0, 3, 3, 3]))),
]
# fmt: on


@pytest.mark.parametrize("make", [c[1] for c in INDEX_OK], ids=[c[0] for c in INDEX_OK])
def test_index_values_of_forms_accepted(make):
    check_index_values(check(make()))


SLOTS = "expected a slot 0..7 of the pool, or <= -1 for padding"
WRITTEN = "is written by more than one batch row"

# fmt: off
INDEX_BAD = [
    ("cu_seqlens_negative", lambda: packed(cu_seqlens=ints([0, -1, 3, 6])),
     ["cu_seqlens: entry 1 is -1; expected offsets within the 6 packed tokens"]),
    ("cu_seqlens_past_total", lambda: packed(cu_seqlens=ints([0, 2, 3, 7])),
     ["cu_seqlens: entry 3 is 7; expected offsets within the 6 packed tokens"]),
    ("cu_seqlens_past_total_int64", lambda: packed(cu_seqlens=ints([0, 9, 9, 9], I64)),
     ["cu_seqlens: entry 1 is 9; expected offsets within the 6 packed tokens"]),
    ("cu_seqlens_descending", lambda: packed(cu_seqlens=ints([0, 3, 2, 6])),
     ["cu_seqlens: entry ", " is 2; expected ascending offsets"]),
    ("cu_seqlens_longer_than_max_seqlen", lambda: packed(max_seqlen=3, cu_seqlens=ints([0, 1, 5, 6])),
     ["cu_seqlens: entry ", " is 5; expected sequences of at most max_seqlen=3 tokens"]),
    ("cu_seqlens_longer_than_target", lambda: packed((2, 9, 1)),
     ["cu_seqlens: entry ", " is 11; expected sequences of at most max_seqlen=8 tokens"]),
    ("num_accepted_0", lambda: table(num_accepted_tokens=ints([1, 0])),
     ["num_accepted_tokens: entry 1 is 0; expected 1..3 (the columns of initial_state_indices)"]),
    ("num_accepted_negative", lambda: table(num_accepted_tokens=ints([-1, 1])),
     ["num_accepted_tokens: entry 0 is -1; expected 1..3"]),
    ("num_accepted_past_columns", lambda: table(num_accepted_tokens=ints([4, 1], I32)),
     ["num_accepted_tokens: entry 0 is 4; expected 1..3 (the columns of initial_state_indices)"]),
    ("num_accepted_packed", lambda: packed_table(num_accepted_tokens=ints([1, 5, 1])),
     ["num_accepted_tokens: entry 1 is 5; expected 1..4"]),
    ("table_slot_past_pool", lambda: table(initial_state_indices=ints([[0, 1, 2], [3, 8, 4]])),
     [f"initial_state_indices: entry [1, 1] is 8; {SLOTS}"]),
    ("table_slot_past_pool_null_slot_0", lambda: table(null_slot=0, initial_state_indices=ints([[0, 9, 0], [0, 1, 0]]))
     , ["initial_state_indices: entry [0, 1] is 9; expected a slot 0..7 of the pool, or <= 0 for padding"]),
    ("table_written_twice", lambda: table(initial_state_indices=ints([[0, 1, 2], [5, 1, 3]])),
     [f"initial_state_indices: slot 1 {WRITTEN}"]),
    ("packed_table_written_twice", lambda: packed((1, 2), max_seqlen=3,
                                                  initial_state_indices=ints([[4, 0, 0], [1, 4, 0]])),
     [f"initial_state_indices: slot 4 {WRITTEN}"]),
    ("packed_table_cu_past_max", lambda: packed((1, 4), max_seqlen=3, initial_state_indices=ints([[0, 1, 2]] * 2)),
     ["cu_seqlens: entry ", " is 5; expected sequences of at most max_seqlen=3 tokens"]),
    ("null_slot_0_indices_twice", lambda: dense(B=4, T=1, null_slot=0, initial_state_indices=ints([0, 0, 1, 1])),
     [f"initial_state_indices: slot 1 {WRITTEN}"]),
    ("null_slot_2_writes_twice", lambda: dense(null_slot=2, initial_state_indices=ints([3, 4]),
                                               output_state_indices=ints([5, 5])),
     [f"output_state_indices: slot 5 {WRITTEN}"]),
    ("null_slot_0_write_past_pool", lambda: dense(null_slot=0, output_state_indices=ints([0, 8])),
     ["output_state_indices: entry 1 is 8; expected a slot 0..7 of the pool, or <= 0 for padding"]),
    ("packed_indices_written_twice", lambda: packed(initial_state_indices=ints([2, 5, 2])),
     [f"initial_state_indices: slot 2 {WRITTEN}"]),
    ("cache_row_past_R", lambda: cache_rows(intermediate_state_indices=ints([0, 3])),
     ["intermediate_state_indices: entry 1 is 3; expected a row 0..2 of intermediate_states_buffer, "
      "or <= -1 for padding"]),
    ("cache_row_written_twice", lambda: cache_rows(intermediate_state_indices=ints([1, 1])),
     ["intermediate_state_indices: row 1 of intermediate_states_buffer is written by more than one batch row"]),
    ("cache_row_null_slot_0_twice", lambda: cache_rows(null_slot=0, initial_state_indices=ints([1, 1]), disable_state_update=True, intermediate_state_indices=ints([2, 2])),
     ["intermediate_state_indices: row 2 of intermediate_states_buffer"]),
    ("uniform_seqlen_broken", lambda: packed((3, 3, 3), max_seqlen=3, uniform_seqlen=True,
                                             cu_seqlens=cu((2, 1, 3))),
     ["cu_seqlens: entry 1 is 2; expected sequence n at n * max_seqlen (uniform_seqlen=True, "
      "max_seqlen=3); an empty sequence may start anywhere"]),
    ("uniform_seqlen_short_last", lambda: packed((3, 3, 3), max_seqlen=3, uniform_seqlen=True,
                                                 cu_seqlens=cu((3, 3, 2))),
     ["cu_seqlens: entry 3 is 8; expected sequences of max_seqlen=3 tokens or none "
      "(uniform_seqlen=True)"]),
    ("cache_row_packed_past_R", lambda: packed(max_seqlen=3, intermediate_states_buffer=cache(2, 3),
                                               intermediate_state_indices=ints([0, 1, 2])),
     ["intermediate_state_indices: entry 2 is 2; expected a row 0..1 of intermediate_states_buffer"]),
]
# fmt: on


@pytest.mark.parametrize(
    "make,fragments", [c[1:] for c in INDEX_BAD], ids=[c[0] for c in INDEX_BAD]
)
def test_index_values_of_forms_rejected(make, fragments):
    message = index_error(make(), *fragments)
    assert message.startswith(fragments[0].split(":")[0] + ":"), message


@pytest.mark.parametrize(
    "make,entry,value,expected",
    [
        (lambda: packed(cu_seqlens=ints([0, 3, 2, 6])), 2, 2, "ascending offsets"),
        (lambda: packed(max_seqlen=3, cu_seqlens=ints([0, 1, 5, 6])), 2, 5, "sequences of at most"),
        (lambda: packed(max_seqlen=3, cu_seqlens=ints([0, 4, 5, 6])), 1, 4, "sequences of at most"),
    ],
    ids=["descending", "too_long", "first_too_long"],
)
def test_cu_seqlens_error_names_the_entry(make, entry, value, expected):
    # Regression: gdngen/runtime/checks.py check_index_values reports the ordering and length errors of
    # cu_seqlens with first_bad("cu_seqlens", cu[1:], ...): the entry printed is an index into
    # cu[1:], one less than the position in cu_seqlens. cu_seqlens=[0, 3, 2, 6] gives
    # "cu_seqlens: entry 1 is 2; expected ascending offsets", but cu_seqlens[1] is 3 (the 2 is
    # entry 2); [0, 4, 5, 6] with max_seqlen=3 gives "entry 0 is 4" while cu_seqlens[0] is 0.
    # The range errors above (cu < 0, cu > total) index cu_seqlens itself.
    index_error(make(), f"cu_seqlens: entry {entry} is {value}; expected {expected}")


@pytest.mark.parametrize(
    "make",
    [
        lambda: table(null_slot=100, initial_state_indices=ints([[50, 50, 50], [60, 60, 60]])),
        lambda: dense(null_slot=10, initial_state_indices=ints([9, 10])),
        lambda: cache_rows(
            null_slot=5, initial_state_indices=ints([6, 7]), intermediate_state_indices=ints([4, 0])
        ),
    ],
    ids=["table", "indices", "cache_rows"],
)
def test_index_values_padding_past_the_pool(make):
    # Regression: gdngen/runtime/checks.py check_index_values tests ``slot >= pool size`` (and ``row >=
    # buffer rows``) before, and regardless of, ``slot <= null_slot``. A slot <= null_slot is
    # padding (gdngen/device/rows.py: the row outputs zeros and touches nothing), yet with
    # null_slot >= the pool size it is refused with a self-contradicting message, e.g. null_slot=100,
    # initial_state_indices=[[50, 50, 50], [60, 60, 60]]: "initial_state_indices: entry [0, 0] is
    # 50; expected a slot 0..7 of the pool, or <= 100 for padding"; null_slot=10, [9, 10]: "entry 0
    # is 9 ... or <= 10 for padding"; null_slot=5, intermediate_state_indices=[4, 0] with a 3-row
    # buffer: "entry 0 is 4; expected a row 0..2 of intermediate_states_buffer, or <= 5 for padding".
    check_index_values(check(make()))


@pytest.mark.parametrize(
    "make",
    [
        # row 0 reads column 0 = -1: padding, so its live column 1 (slot 3) is never written
        lambda: table(initial_state_indices=ints([[-1, 3, 0], [1, 3, 2]])),
        # row 0 reads column num_accepted - 1 = 1, which is padding
        lambda: table(
            initial_state_indices=ints([[3, -1, 0], [1, 3, 2]]), num_accepted_tokens=ints([2, 1])
        ),
        # a padded row caches nothing either (rows.py: stores need ``owned``)
        lambda: cache_rows(initial_state_indices=ints([-1, 0]), intermediate_state_indices=ints([1, 1])),
        lambda: table(
            initial_state_indices=ints([[-1, 4, 5], [1, 2, 3]]),
            intermediate_states_buffer=cache(2, 2),
            intermediate_state_indices=ints([1, 1]),
        ),
    ],
    ids=["table_padded_row", "table_padded_read_column", "cache_rows_padded_row", "table_cache_rows_padded_row"],
)  # fmt: skip
def test_index_values_padded_rows_write_nothing(make):
    # Regression: gdngen/runtime/checks.py check_index_values counts the live columns (and cache rows) of
    # a row whose read slot is padding, although such a row stores nothing (gdngen/device/rows.py
    # row_slots: ``owned`` needs read > null_slot; every token/cache store is gated on ``owned``;
    # gdngen/reference/ skips the row too). The plain [N] form already leaves padded rows out
    # (``live = (table > null) & (out > null)``). E.g. initial_state_indices=[[-1, 3, 0], [1, 3,
    # 2]], T=2 raises "initial_state_indices: slot 3 is written by more than one batch row", and
    # initial_state_indices=[-1, 0], intermediate_state_indices=[1, 1] raises
    # "intermediate_state_indices: row 1 of intermediate_states_buffer is written by more than one
    # batch row"; the kernel writes slot 3 / cache row 1 once.
    check_index_values(check(make()))


def test_index_values_one_row_writing_a_slot_twice():
    # Regression: a row whose live columns repeat a slot (here row 0 writes slot 3 after token 0 and
    # after token 1) is refused as "initial_state_indices: slot 3 is written by more than one batch
    # row": only one row writes it (and one lane stores both tokens' tiles in order, so the last
    # wins, as in gdngen/reference/). Either accept it or say what is wrong.
    call = check(table(initial_state_indices=ints([[3, 3, 0], [1, 2, 4]])))
    try:
        check_index_values(call)
    except ValueError as error:
        assert "more than one batch row" not in str(error), str(error)
