"""Input validation of a call (gdngen.runtime.checks), on CPU tensors.

check_call tests devices last, so every check before that runs on CPU tensors; the checks after it
(device agreement, scale) and check_index_values, which needs a checked Call, get tensors that
report a CUDA device (FakeCuda) while their data stays on the host.
"""

import dataclasses

import numpy as np
import pytest
import torch

import generated.h200
from gdngen.problem import Problem
from gdngen.runtime.checks import check_call, check_index_values

INFO = generated.h200.INFO
B, T, H, HV, K, V, POOL = 4, 1, 16, 32, 128, 128, 8
BF16 = torch.bfloat16


class FakeCuda(torch.Tensor):
    """A host tensor that says it is on cuda:0 (only check_call reads .device)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def on_fake_cuda(args: dict) -> dict:
    return {
        n: v.as_subclass(FakeCuda) if isinstance(v, torch.Tensor) else v for n, v in args.items()
    }


def make_args(**problem) -> dict:
    """Every keyword of check_call, drawn from a Problem (a pool with int32 slots by default)."""
    fields = dict(batch=B, HV=HV, pool_size=POOL)
    fields.update(problem)
    args = dict.fromkeys(
        (
            "state",
            "initial_state",
            "initial_state_indices",
            "output_state_indices",
            "intermediate_states_buffer",
            "output",
        )
    )
    args.update(Problem(**fields).make("cpu"))
    return args


@pytest.fixture(scope="module")
def base_args() -> dict:
    return make_args()


@pytest.fixture
def args(base_args) -> dict:
    return dict(base_args)


def misaligned(shape, dtype) -> torch.Tensor:
    """A dense tensor whose data starts one element past a 16-byte boundary."""
    return torch.zeros(int(np.prod(shape)) + 1, dtype=dtype)[1:].view(*shape)


def raises(exc_type, args: dict, *fragments: str, info=INFO) -> str:
    with pytest.raises(exc_type) as caught:
        check_call(info, **args)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def test_valid_cpu_call_fails_only_on_the_device(args):
    raises(ValueError, args, "q: expected a CUDA tensor; got a tensor on cpu")


def test_valid_call_is_described(args):
    call = check_call(INFO, **on_fake_cuda(args))
    assert (call.batch, call.tokens, call.H, call.HV, call.K, call.V) == (B, T, H, HV, K, V)
    assert (call.layout, call.io_dtype, call.gate_dtype, call.dt_bias_dtype, call.state_dtype) == (
        "k_last", "bf16", "bf16", "fp32", "bf16",
    )  # fmt: skip
    assert call.index_dtype == "int32" and not call.separate_write_slots and not call.cache
    assert call.write_final_state and call.use_qk_l2norm
    assert call.scale == K**-0.5
    assert call.batch_heads == B * HV
    assert call.pool.data_ptr() == args["initial_state"].data_ptr()


def test_call_flags_follow_the_arguments():
    args = make_args(
        tokens=3, layout="v_last", state_dtype="fp32", separate_write_slots=True, index_dtype="int64",
        cache_steps=4, disable_state_update=True, use_qk_l2norm=False, scale=0.25, gate_dtype="fp32",
        io_dtype="fp16", dt_bias_dtype="bf16",
    )  # fmt: skip
    call = check_call(INFO, **on_fake_cuda(args))
    assert (call.tokens, call.layout) == (3, "v_last")
    assert (call.state_dtype, call.index_dtype) == ("fp32", "int64")
    assert (call.io_dtype, call.gate_dtype, call.dt_bias_dtype) == ("fp16", "fp32", "bf16")
    assert call.separate_write_slots and call.cache
    assert not call.write_final_state and not call.use_qk_l2norm
    assert call.scale == 0.25


def test_dense_state_call():
    args = make_args(pool_size=None)
    call = check_call(INFO, **on_fake_cuda(args))
    assert call.index_dtype is None and call.read_slots is None and call.pool.shape[0] == B


# -- bad inputs, on CPU: (id, replacements given the valid args, exception, message fragments) ----

# fmt: off
BAD = [
    # missing or not a tensor
    ("q_none", lambda a: dict(q=None), TypeError, ["q: expected a torch.Tensor, got None"]),
    ("v_numpy", lambda a: dict(v=a["v"].float().numpy()), TypeError, ["v: expected a torch.Tensor, got ndarray"]),
    # dtypes
    ("q_fp32", lambda a: dict(q=a["q"].float()), TypeError, ["q: expected dtype bfloat16, float16; got float32"]),
    ("k_fp16", lambda a: dict(k=a["k"].half()), TypeError, ["k: expected dtype bfloat16 (as q); got float16"]),
    ("v_fp32", lambda a: dict(v=a["v"].float()), TypeError, ["v: expected dtype bfloat16 (as q); got float32"]),
    ("a_int32", lambda a: dict(a=a["a"].int()), TypeError, ["a: expected dtype bfloat16, float16, float32; got int32"]),
    ("b_fp32", lambda a: dict(b=a["b"].float()), TypeError, ["b: expected dtype bfloat16 (as a); got float32"]),
    ("A_log_bf16", lambda a: dict(A_log=a["A_log"].bfloat16()), TypeError, ["A_log: expected dtype float32; got bfloat16"]),
    ("dt_bias_fp16", lambda a: dict(dt_bias=a["dt_bias"].half()), TypeError, ["dt_bias: expected dtype bfloat16, float32; got float16"]),
    ("pool_fp64", lambda a: dict(initial_state=a["initial_state"].double()), TypeError, ["initial_state: expected dtype bfloat16, float16, float32, int8, float8_e4m3fn; got float64"]),
    (
        "dense_state_fp64",
        lambda a: dict(state=a["initial_state"][:B].double(), initial_state=None, initial_state_indices=None),
        TypeError,
        ["state: expected dtype bfloat16, float16, float32, int8, float8_e4m3fn; got float64"],
    ),
    # shapes
    ("q_3d", lambda a: dict(q=a["q"][:, 0]), ValueError, ["q: expected shape [B, T, H, K] = [*, *, *, *]; got [4, 16, 128]"]),
    ("k_other_heads", lambda a: dict(k=a["k"][:, :, :8]), ValueError, ["k: expected shape [B, T, H, K] (as q) = [4, 1, 16, 128]; got [4, 1, 8, 128]"]),
    ("v_other_batch", lambda a: dict(v=a["v"][:3]), ValueError, ["v: expected shape [B, T, HV, V] = [4, 1, *, *]; got [3, 1, 32, 128]"]),
    ("a_other_heads", lambda a: dict(a=a["a"][..., :16]), ValueError, ["a: expected shape [B, T, HV] = [4, 1, 32]; got [4, 1, 16]"]),
    ("b_4d", lambda a: dict(b=a["b"][..., None]), ValueError, ["b: expected shape [B, T, HV] = [4, 1, 32]; got [4, 1, 32, 1]"]),
    ("A_log_short", lambda a: dict(A_log=a["A_log"][:16]), ValueError, ["A_log: expected shape [HV] = [32]; got [16]"]),
    ("dt_bias_2d", lambda a: dict(dt_bias=a["dt_bias"][:, None]), ValueError, ["dt_bias: expected shape [HV] = [32]; got [32, 1]"]),
    (
        "empty_batch",
        lambda a: {n: a[n][:0] for n in ("q", "k", "v", "a", "b")},
        ValueError,
        ["q: batch and token counts must be >= 1; got shape [0, 1, 16, 128]"],
    ),
    (
        "pool_other_heads",
        lambda a: dict(initial_state=a["initial_state"][:, :16]),
        ValueError,
        ["initial_state: expected shape [pool, HV, V, K] (k_last) = [*, 32, 128, 128]; got [8, 16, 128, 128]"],
    ),
    (
        "v_last_pool_shape",
        lambda a: dict(state_layout="v_last", initial_state=a["initial_state"][:, :, :64]),
        ValueError,
        ["initial_state: expected shape [pool, HV, K, V] (v_last) = [*, 32, 128, 128]; got [8, 32, 64, 128]"],
    ),
    # contiguity and alignment
    (
        "q_misaligned",
        lambda a: dict(q=misaligned((B, T, H, K), BF16)),
        ValueError,
        ["q: data pointer must be 16-byte aligned for vector loads; got address 0x"],
    ),
    (
        "v_outer_stride",
        lambda a: dict(v=torch.zeros(B * (HV * V + 4), dtype=BF16).as_strided((B, T, HV, V), (HV * V + 4, HV * V + 4, V, 1))),
        ValueError,
        ["v: stride of dim 0 must be a multiple of 8 elements (16 bytes); got 4100"],
    ),
    (
        "k_inner_transposed",
        lambda a: dict(k=torch.zeros(B, T, K, H, dtype=BF16).transpose(-1, -2)),
        ValueError,
        ["k: its last 2 dim(s) [H, K] must be contiguous", "strides (2048, 2048, 1, 16)"],
    ),
    (
        "a_strided",
        lambda a: dict(a=torch.zeros(B, T, HV, 2, dtype=BF16)[..., 0]),
        ValueError,
        ["a: its last 1 dim(s) [HV] must be contiguous", "strides (64, 64, 2)"],
    ),
    ("A_log_strided", lambda a: dict(A_log=torch.zeros(2 * HV)[::2]), ValueError, ["A_log: must be contiguous", "strides (2,)"]),
    (
        "pool_last_dim_strided",
        lambda a: dict(initial_state=torch.zeros(POOL, HV, V, 2 * K, dtype=BF16)[..., ::2]),
        ValueError,
        ["initial_state: its last dim (K) must be contiguous", "strides (1048576, 32768, 256, 2)"],
    ),
    (
        "pool_slots_overlap",
        lambda a: dict(initial_state=a["initial_state"][:1].expand(POOL, HV, V, K)),
        ValueError,
        ["initial_state: slots overlap (stride of dim 0 is 0; one of its slots spans 524288 elements"],
    ),
    (
        "pool_misaligned",
        lambda a: dict(initial_state=misaligned((POOL, HV, V, K), BF16)),
        ValueError,
        ["initial_state: data pointer must be 16-byte aligned"],
    ),
    (
        "pool_slot_stride",
        lambda a: dict(initial_state=torch.zeros(POOL * (HV * V * K + 4), dtype=BF16).as_strided((POOL, HV, V, K), (HV * V * K + 4, V * K, K, 1))),
        ValueError,
        ["initial_state: stride of dim 0 must be a multiple of 8 elements (16 bytes); got 524292"],
    ),
    (
        "pool_empty",
        lambda a: dict(initial_state=torch.zeros(0, HV, V, K, dtype=BF16)),
        ValueError,
        ["initial_state: the pool is empty (shape [0, 32, 128, 128])"],
    ),
    # state / pool / indices
    (
        "state_and_initial_state",
        lambda a: dict(state=a["initial_state"][:B]),
        ValueError,
        ["state / initial_state: pass exactly one", "both were given"],
    ),
    ("neither_state", lambda a: dict(initial_state=None), ValueError, ["state / initial_state: pass exactly one"]),
    (
        "pool_not_batch_without_indices",
        lambda a: dict(initial_state_indices=None),
        ValueError,
        ["initial_state: without initial_state_indices the state is per batch row, so its dim 0 must be B=4; got [8, 32, 128, 128]"],
    ),
    (
        "write_slots_without_read_slots",
        lambda a: dict(initial_state_indices=None, output_state_indices=torch.arange(B, dtype=torch.int32)),
        ValueError,
        ["output_state_indices: needs initial_state_indices"],
    ),
    (
        "indices_float",
        lambda a: dict(initial_state_indices=a["initial_state_indices"].float()),
        TypeError,
        ["initial_state_indices: expected dtype int32, int64; got float32"],
    ),
    (
        "write_indices_int64_read_int32",
        lambda a: dict(output_state_indices=torch.arange(B, dtype=torch.int64)),
        TypeError,
        ["output_state_indices: expected dtype int32 (as initial_state_indices); got int64"],
    ),
    (
        "indices_too_long",
        lambda a: dict(initial_state_indices=torch.arange(B + 1, dtype=torch.int32)),
        ValueError,
        ["initial_state_indices: expected shape [B] = [4]; got [5]"],
    ),
    (
        "write_indices_2d",
        lambda a: dict(output_state_indices=torch.arange(B, dtype=torch.int32)[:, None]),
        ValueError,
        ["output_state_indices: expected shape [B] = [4]; got [4, 1]"],
    ),
    (
        "indices_strided",
        lambda a: dict(initial_state_indices=torch.arange(2 * B, dtype=torch.int32)[::2]),
        ValueError,
        ["initial_state_indices: must be contiguous"],
    ),
    # intermediate states buffer
    (
        "cache_dtype",
        lambda a: dict(intermediate_states_buffer=torch.zeros(B, 2, HV, V, K)),
        TypeError,
        ["intermediate_states_buffer: expected dtype bfloat16 (as the state); got float32"],
    ),
    (
        "cache_shape",
        lambda a: dict(intermediate_states_buffer=torch.zeros(B, 2, HV, V, dtype=BF16)),
        ValueError,
        ["intermediate_states_buffer: expected shape [B, cache_steps, HV, V, K] = [4, *, 32, 128, 128]; got [4, 2, 32, 128]"],
    ),
    (
        "cache_not_contiguous",
        lambda a: dict(intermediate_states_buffer=torch.zeros(2, B, HV, V, K, dtype=BF16).transpose(0, 1)),
        ValueError,
        ["intermediate_states_buffer: must be contiguous (shape [4, 2, 32, 128, 128]"],
    ),
    # output
    ("output_dtype", lambda a: dict(output=torch.zeros(B, T, HV, V)), TypeError, ["output: expected dtype bfloat16 (as q); got float32"]),
    (
        "output_shape",
        lambda a: dict(output=torch.zeros(B, T, HV, V // 2, dtype=BF16)),
        ValueError,
        ["output: expected shape [B, T, HV, V] = [4, 1, 32, 128]; got [4, 1, 32, 64]"],
    ),
    (
        "output_not_contiguous",
        lambda a: dict(output=torch.zeros(B, T, V, HV, dtype=BF16).transpose(-1, -2)),
        ValueError,
        ["output: must be contiguous (shape [4, 1, 32, 128], strides (4096, 4096, 1, 32))"],
    ),
    ("output_misaligned", lambda a: dict(output=misaligned((B, T, HV, V), BF16)), ValueError, ["output: data pointer must be 16-byte aligned"]),
    # flags
    ("l2norm_int", lambda a: dict(use_qk_l2norm=1), TypeError, ["use_qk_l2norm: expected a bool, got int"]),
    ("disable_update_str", lambda a: dict(disable_state_update="no"), TypeError, ["disable_state_update: expected a bool, got str"]),
    ("layout_unknown", lambda a: dict(state_layout="k-last"), ValueError, ["state_layout: expected one of ('k_last', 'v_last'); got 'k-last'"]),
    # FlashInfer's backend keyword: its values other than "auto" name FlashInfer's own kernels
    ("backend_flashinfer", lambda a: dict(backend="flashinfer"), ValueError,
     ["backend: 'flashinfer' asks for FlashInfer's generic kernels, which gdngen cannot run; gdngen accepts backend='auto'"]),
    ("backend_cake_gdn", lambda a: dict(backend="cake_gdn"), ValueError,
     ["backend: 'cake_gdn' asks for FlashInfer's Cake GDN kernels", "gdngen accepts backend='auto'"]),
    ("backend_rubin", lambda a: dict(backend="rubin"), ValueError,
     ["backend: 'rubin' asks for FlashInfer's Rubin-tuned (SM 10.7) T = 1 kernel", "gdngen accepts backend='auto'"]),
    ("backend_unknown", lambda a: dict(backend="triton"), ValueError,
     ["backend: gdngen accepts backend='auto' (its own dispatch); FlashInfer's other values ('flashinfer', 'cake_gdn', 'rubin') name FlashInfer's own kernels; got 'triton'"]),
    ("backend_none", lambda a: dict(backend=None), TypeError, ["backend: expected a str, one of ('auto',); got NoneType"]),
]
# fmt: on


@pytest.mark.parametrize(
    "change,exc_type,fragments", [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_bad_input(args, change, exc_type, fragments):
    args.update(change(args))
    raises(exc_type, args, *fragments)


@pytest.mark.parametrize(
    "problem,fragments",
    [
        (dict(HV=80), ["q/v: geometry H=16, HV=80, K=128, V=128 was not generated for target h200",
                       "qwen3-next (H=16, HV=32, K=128, V=128)",
                       "To serve it, add `- {name: <model>, H: 16, HV: 80, K: 128, V: 128}` under "
                       "`geometries:` to specs/h200.yaml and run `gdngen emit specs/h200.yaml`."]),
        (dict(K=64, V=128), ["q/v: geometry H=16, HV=32, K=64, V=128 was not generated for target h200",
                             "`- {name: <model>, H: 16, HV: 32, K: 64, V: 128}`",
                             "Its kernels are built for K=64, V=64, K=128, V=128, K=256, V=256: head "
                             "dims K=64, V=128 also need, for each layout and state dtype, a variant "
                             "built for them", "dispatch rules with `head_dims: [64, 128]`"]),
        # a served head dims at an HV no geometry of it has: only the geometry line is missing
        (dict(H=8, HV=16, K=64, V=64), ["q/v: geometry H=8, HV=16, K=64, V=64 was not generated",
                                        "head-dim-64 (H=16, HV=32, K=64, V=64)"]),
        (dict(tokens=9), ["q: T=9 tokens per call; target h200 was generated for T <= 8"]),
    ],
    ids=["HV80", "K64V128", "K64_HV16", "T9"],
)  # fmt: skip
def test_call_outside_the_target(problem, fragments):
    raises(ValueError, make_args(pool_size=2, batch=2, **problem), *fragments)


def test_cache_steps_below_tokens():
    args = make_args(tokens=3)
    args["intermediate_states_buffer"] = torch.zeros(B, 2, HV, V, K, dtype=BF16)
    raises(
        ValueError, args, "intermediate_states_buffer: cache_steps (dim 1) must be >= T=3; got 2"
    )


def test_layout_dtype_the_target_does_not_serve(args):
    info = dataclasses.replace(INFO, served=(("k_last", "bf16"), ("k_last", "fp32")))
    args["state_layout"] = "v_last"
    raises(ValueError, args, "initial_state: a v_last bf16 state is not served by target h200",
           "(it serves k_last/bf16, k_last/fp32). To serve it, add variants with `layout: v_last, "
           "state_dtype: bf16` and dispatch rules for v_last/bf16 to specs/h200.yaml and run "
           "`gdngen emit specs/h200.yaml`.", info=info)  # fmt: skip


def test_index_dtype_the_target_does_not_serve():
    info = dataclasses.replace(INFO, index_dtypes=("int32",))
    args = make_args(index_dtype="int64")
    raises(
        TypeError,
        args,
        "initial_state_indices: target h200 was generated for int32 indices; got int64",
        info=info,
    )


# -- past the device check: device agreement and scale --------------------------------------------


@pytest.mark.parametrize("name", ["k", "v", "a", "A_log", "initial_state", "initial_state_indices"])
def test_tensor_on_another_device(args, name):
    fake = on_fake_cuda(args)
    fake[name] = args[name]
    raises(ValueError, fake, f"{name}: expected a tensor on cuda:0 (as q); got cpu")


@pytest.mark.parametrize(
    "scale,exc_type,fragment",
    [
        (float("nan"), ValueError, "scale: expected a finite number; got nan"),
        (float("inf"), ValueError, "scale: expected a finite number; got inf"),
        ("0.1", TypeError, "scale: expected a float or None; got str"),
        (True, TypeError, "scale: expected a float or None; got bool"),
        (torch.tensor(0.1), TypeError, "scale: expected a float or None; got Tensor"),
    ],
    ids=["nan", "inf", "str", "bool", "tensor"],
)
def test_bad_scale(args, scale, exc_type, fragment):
    fake = on_fake_cuda(args)
    fake["scale"] = scale
    raises(exc_type, fake, fragment)


def test_backend_auto_is_accepted(args):
    """FlashInfer's default names gdngen's own dispatch: the call is the one without it."""
    fake = on_fake_cuda(args)
    assert check_call(INFO, **fake, backend="auto") == check_call(INFO, **fake)


def test_integer_scale_is_accepted(args):
    args["scale"] = 2
    assert check_call(INFO, **on_fake_cuda(args)).scale == 2.0


# -- check_index_values ---------------------------------------------------------------------------


def checked(args: dict, reads, writes=None, **flags):
    args = dict(args, **flags)
    args["initial_state_indices"] = torch.tensor(reads, dtype=torch.int32)
    if writes is not None:
        args["output_state_indices"] = torch.tensor(writes, dtype=torch.int32)
    return check_call(INFO, **on_fake_cuda(args))


@pytest.mark.parametrize(
    "reads,writes,flags",
    [
        ([0, 1, 2, 7], None, {}),
        ([-1, 7, -5, 0], None, {}),  # negative: padded rows
        ([3, 3, 3, 3], [0, 1, 2, -1], {}),  # rows may read one slot
        ([3, 3, 1, 2], None, dict(disable_state_update=True)),  # nothing written
        ([-1, -1, 1, 2], [-1, -1, 5, 6], {}),  # padded rows share -1
    ],
    ids=["plain", "padded", "shared_read_slot", "verify_shared_slot", "padded_duplicates"],
)
def test_index_values_accepted(args, reads, writes, flags):
    check_index_values(checked(args, reads, writes, **flags))


@pytest.mark.parametrize(
    "reads,writes,fragment",
    [
        ([0, 1, POOL, 2], None, "initial_state_indices: entry 2 is 8; expected a slot 0..7 of the pool, or <= -1 for padding"),
        ([0, 1, 2, 3], [4, 5, 6, 100], "output_state_indices: entry 3 is 100; expected a slot 0..7 of the pool"),
        ([0, 3, 1, 3], None, "initial_state_indices: slot 3 is written by more than one batch row"),
        ([0, 1, 2, 3], [5, 4, 5, -1], "output_state_indices: slot 5 is written by more than one batch row"),
    ],
    ids=["read_out_of_range", "write_out_of_range", "shared_slot_written_twice", "write_slot_twice"],
)  # fmt: skip
def test_index_values_rejected(args, reads, writes, fragment):
    call = checked(args, reads, writes)
    with pytest.raises(ValueError) as caught:
        check_index_values(call)
    assert fragment in str(caught.value)


def test_index_values_of_a_dense_state():
    args = make_args(pool_size=None)
    check_index_values(check_call(INFO, **on_fake_cuda(args)))
