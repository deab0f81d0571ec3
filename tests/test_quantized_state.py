"""The quantized states, int8 and fp8 e4m3 (docs/design.md, "Quantized state"), without a GPU:
the spec's limits on their variants, the call's checks of the pool and its scales, and the
reference's quantized pool."""

import importlib

import pytest
import torch

import generated.h200
from gdngen.problem import Problem
from gdngen.reference.decode import reference_call
from gdngen.reference.state_formats import STORAGE_DTYPES, store
from gdngen.runtime.checks import check_call
from gdngen.runtime.compile import compile_kernel
from gdngen.spec.model import Variant
from gdngen.terms import SCALED_STATE_FORMATS
from gdngen.runtime.kernel_table import load_kernel
from tests.quantized_state import assert_quantized_pool, quantized_pool
from tests.test_conv_cpu import prologue_key
from tests.test_checks import make_args, on_fake_cuda

INFO = generated.h200.INFO


@pytest.mark.parametrize(
    "knob,value",
    [("layout", "v_last"), ("k_splits", 2), ("state_load_cache", "streaming")],
)
@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_a_quantized_variant_outside_the_k_last_solves_is_refused(knob, value, state_dtype):
    knobs = dict(
        layout="k_last", state_dtype=state_dtype, tile_v=32, ilp=4, vec=8, threads_per_group=16
    )
    Variant(**knobs)  # the served points: stepwise and staged
    Variant(**knobs, solve="staged")
    with pytest.raises(ValueError, match=knob):
        Variant(
            **{**knobs, knob: value, **({"threads_per_group": 8} if knob == "k_splits" else {})}
        )


@pytest.mark.parametrize("target", ["h200", "b200", "b300", "rtx_blackwell", "dgx_spark"])
@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_every_target_serves_a_quantized_k_last_state(target, state_dtype):
    # sm_90a measured, the Blackwell targets on static rules (compiled in CI: test_compile)
    package = importlib.import_module(f"generated.{target}")
    assert ("k_last", state_dtype) in package.INFO.served
    assert any(v.startswith(f"kl_{state_dtype}_") for v in package.VARIANTS)


def _quantized_args(state_dtype="int8", **problem):
    return on_fake_cuda(quantized_pool(make_args(**problem), state_dtype))


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_a_quantized_call_checks_out_with_its_scales(state_dtype):
    call = check_call(INFO, **_quantized_args(state_dtype))
    assert call.state_dtype == state_dtype


@pytest.mark.parametrize(
    "change,fragments",
    [
        (lambda a: a.update(state_scales=None), ["state_scales", "int8", "[8, 32, 128]", "None"]),
        (lambda a: a.update(state_scales=a["state_scales"].double()), ["state_scales", "float64"]),
        (
            lambda a: a.update(state_scales=a["state_scales"][:4]),
            ["state_scales", "[8, 32, 128]", "[4, 32, 128]"],
        ),
        (
            lambda a: a.update(
                state_scales=a["state_scales"].transpose(1, 2).contiguous().transpose(1, 2)
            ),
            ["state_scales", "contiguous"],
        ),
    ],
    ids=["missing", "dtype", "slots", "strides"],
)
def test_bad_scales_are_refused_naming_the_argument(change, fragments):
    args = _quantized_args()
    change(args)
    with pytest.raises((TypeError, ValueError)) as error:
        check_call(INFO, **args)
    for fragment in fragments:
        assert fragment in str(error.value), (fragment, str(error.value))


def test_scales_beside_another_state_are_refused():
    args = on_fake_cuda(make_args())
    args["state_scales"] = torch.ones(8, 32, 128)
    with pytest.raises(ValueError, match="state_scales: only a quantized state"):
        check_call(INFO, **args)


def _verify_args(state_dtype="int8"):
    return _quantized_args(state_dtype, tokens=2, cache_steps=3, disable_state_update=True)


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_a_verify_cache_beside_a_quantized_state_is_in_its_format_with_scales(state_dtype):
    args = _verify_args(state_dtype)
    cache, scales = args["intermediate_states_buffer"], args["intermediate_states_scales"]
    assert cache.dtype == args["initial_state"].dtype and scales.dtype == torch.float32
    assert scales.shape == cache.shape[:4]
    assert check_call(INFO, **args).state_dtype == state_dtype


@pytest.mark.parametrize(
    "change,fragments",
    [
        (
            lambda a: a.update(intermediate_states_scales=None),
            ["intermediate_states_scales", "fp32 [4, 3, 32, 128]", "got None"],
        ),
        (
            lambda a: a.update(intermediate_states_scales=a["intermediate_states_scales"].half()),
            ["intermediate_states_scales", "float32", "float16"],
        ),
        (
            lambda a: a.update(intermediate_states_scales=a["intermediate_states_scales"][:, :2]),
            ["intermediate_states_scales", "[4, 3, 32, 128]", "[4, 2, 32, 128]"],
        ),
        (
            lambda a: a.update(
                intermediate_states_scales=a["intermediate_states_scales"].transpose(0, 1)
                .contiguous().transpose(0, 1)
            ),
            ["intermediate_states_scales", "contiguous"],
        ),
        (
            lambda a: a.update(intermediate_states_buffer=None, disable_state_update=False),
            ["intermediate_states_scales", "intermediate_states_buffer is None"],
        ),
        (
            lambda a: a.update(
                intermediate_states_buffer=a["intermediate_states_buffer"].float()
            ),
            ["intermediate_states_buffer", "dtype"],
        ),
    ],
    ids=["missing", "dtype", "steps", "strides", "without-cache", "cache-dtype"],
)  # fmt: skip
def test_bad_cache_scales_are_refused_naming_the_argument(change, fragments):
    args = _verify_args()
    change(args)
    with pytest.raises((TypeError, ValueError)) as error:
        check_call(INFO, **args)
    for fragment in fragments:
        assert fragment in str(error.value), (fragment, str(error.value))


def test_cache_scales_beside_another_state_are_refused():
    args = on_fake_cuda(make_args(tokens=2, cache_steps=2, disable_state_update=True))
    args["intermediate_states_scales"] = torch.ones(8, 2, 32, 128)
    with pytest.raises(ValueError, match="intermediate_states_scales: only a quantized state"):
        check_call(INFO, **args)


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_the_reference_caches_each_state_as_the_pool_stores_it(state_dtype):
    # Each token's state in the cache is stored as the pool's final state is: the last step's
    # values and scales are the write slot's; a padding row's cache row keeps its poison.
    problem = Problem(
        batch=3, tokens=3, H=2, HV=4, K=16, V=16, pool_size=6, padded_rows=(1,), cache_steps=4,
        seed=11,
    )  # fmt: skip
    args = quantized_pool(problem.make("cpu"), state_dtype)
    cache, cache_scales = args["intermediate_states_buffer"], args["intermediate_states_scales"]
    reads = args["initial_state_indices"]
    expected = reference_call(
        *(args[n] for n in ("q", "k", "v", "initial_state", "A_log", "a", "dt_bias", "b")),
        read_slots=reads, state_scales=args["state_scales"], cache=cache,
        cache_scales=cache_scales,
    )  # fmt: skip
    for row in (0, 2):
        slot = int(reads[row])
        last = expected.cache[row, 2]
        assert torch.equal(last.view(torch.int8), expected.pool[slot].view(torch.int8))
        assert torch.equal(expected.cache_scales[row, 2], expected.scales[slot])
        assert not expected.cache_scales[row, :3].isnan().any()
        assert expected.cache_scales[row, 3].isnan().all(), "a step past T stays untouched"
    assert expected.cache_scales[1].isnan().all(), "a padding row's cache row stays untouched"
    assert torch.equal(expected.cache[1].view(torch.int8), cache[1].view(torch.int8))


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_the_reference_reads_and_stores_a_quantized_pool(state_dtype):
    # A quantized pool is its dequantized states for the recurrence, and each state it stores
    # is state_formats.store of the float64 state the fp64 pool's call ends with.
    args = Problem(
        batch=3, tokens=2, H=2, HV=4, K=16, V=16, pool_size=6, padded_rows=(1,), seed=5
    ).make("cpu")
    quantized = quantized_pool(args, state_dtype)
    pool, scales = quantized["initial_state"], quantized["state_scales"]
    exact = pool.double() * scales.double()[..., None]  # the dequantized states, in float64
    tensors = [args[n] for n in ("q", "k", "v")]
    gates = [args[n] for n in ("A_log", "a", "dt_bias", "b")]
    common = dict(read_slots=args["initial_state_indices"])

    def call(pool_, **extra):
        return reference_call(*tensors, pool_, *gates, **common, **extra)

    got, wide = call(pool, state_scales=scales), call(exact)
    assert torch.equal(got.output.nan_to_num(), wide.output.nan_to_num())
    for slot in args["initial_state_indices"].tolist():
        if slot < 0:
            continue
        stored = store(wide.pool[slot], SCALED_STATE_FORMATS[state_dtype])
        assert torch.equal(got.pool[slot].view(torch.int8), stored.values.view(torch.int8))
        assert torch.equal(got.scales[slot], stored.scales)
    assert_quantized_pool(got.pool, got.scales, got.pool, got.scales, pool, scales)


def _assert_poisoned_cache(args: dict, scales_shape: tuple) -> None:
    """A drawn problem's verify cache beside a quantized pool: the pool's format, its scales
    beside it, every entry poisoned (-128 or NaN: a test sees what a kernel wrote)."""
    cache, scales = args["intermediate_states_buffer"], args["intermediate_states_scales"]
    assert cache.dtype == args["initial_state"].dtype and tuple(scales.shape) == scales_shape
    assert scales.dtype == torch.float32 and scales.isnan().all()
    assert (cache == -128).all() if cache.dtype == torch.int8 else cache.float().isnan().all()


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_a_problem_draws_a_quantized_pool_with_its_scales(state_dtype):
    # what gdngen tune and bench time on a quantized state (their check reads state_copy)
    from gdngen.measure.check import SCALED_CHECK_TOL, check_tolerance
    from gdngen.problem import state_copy

    problem = Problem(batch=3, H=2, HV=4, K=16, V=16, pool_size=5, state_dtype=state_dtype, seed=2)
    args = problem.make("cpu")
    pool, scales = args["initial_state"], args["state_scales"]
    fmt = SCALED_STATE_FORMATS[state_dtype]
    assert pool.dtype == STORAGE_DTYPES[fmt] and scales.shape == (5, 4, 16)
    drawn = problem.with_(state_dtype="fp32").make("cpu")["initial_state"]
    assert torch.equal(pool.view(torch.int8), store(drawn, fmt).values.view(torch.int8))
    assert torch.equal(state_copy(args), pool.float() * scales[..., None])
    assert problem.state_bytes() == 1 + 4 / 16
    verify = problem.with_(cache_steps=2, disable_state_update=True)
    _assert_poisoned_cache(verify.make("cpu"), (3, 2, 4, 16))
    assert check_tolerance(state_dtype, 5e-3) == SCALED_CHECK_TOL[state_dtype]
    assert check_tolerance("bf16", 5e-3) == 5e-3


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_a_packed_problem_draws_a_quantized_pool_with_its_scales(state_dtype):
    # the packed (varlen) form's pool is the quantized fp32 draw of the same seed, with its
    # scales passed beside it; a verify cache in its format, as on the positional form
    from gdngen.problem import PackedProblem

    problem = PackedProblem(
        sequences=3, tokens=2, H=2, HV=4, K=16, V=16, uniform_seqlen=True, state_dtype=state_dtype
    )
    args = problem.make("cpu")
    pool, scales = args["initial_state"], args["state_scales"]
    fmt = SCALED_STATE_FORMATS[state_dtype]
    assert pool.dtype == STORAGE_DTYPES[fmt] and scales.shape == (*pool.shape[:2], 16)
    drawn = problem.with_(state_dtype="fp32").make("cpu")["initial_state"]
    assert torch.equal(pool.view(torch.int8), store(drawn, fmt).values.view(torch.int8))
    _assert_poisoned_cache(problem.with_(cache="rows", cache_rows=5).make("cpu"), (5, 2, 4, 16))


FORMATS = ["bf16", "fp32", "int8", "fp8_e4m3"]


def test_the_state_formats_bench_checks_its_arguments_and_outputs(capsys):
    # python -m gdngen.bench.state_formats (docs/perf's quantized-state figures): its grid, its
    # argument errors, and the output check it holds each format's call to before timing it
    from gdngen.bench import state_formats as bench

    args = bench.parse_args(["--out", "/tmp/unused", "--tokens", "1,4", "--heads", "32"])
    assert bench.cells(args)[:2] == [(32, 1, 1), (32, 1, 4)]
    assert (32, 4, 512) in bench.cells(args) and (32, 4, 4) not in bench.cells(args)
    for bad, fragment in (
        (["--formats", "bf16,int4"], "--formats: expected state dtypes"),
        (["--formats", "int8,fp32"], "--formats: the comparison needs bf16"),
        (["--batches", "1,x"], "--batches: expected comma-separated integers"),
        (["--form", "rows"], "--form: invalid choice"),
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(["--out", "/tmp/unused", *bad])
        assert fragment in capsys.readouterr().err
    # --form cache: dense rows storing every token's state into a cache of the pool's format
    cache_form = bench.parse_args(["--out", "/tmp/unused", "--form", "cache"])
    verify = bench.cell_problem(4, 2, 3, "int8", cache_form.form)
    assert (verify.cache_steps, verify.disable_state_update, verify.pool_size) == (2, True, 11)
    for T in (1, 2):
        problem = bench.cell_problem(4, T, 3, "int8").with_(H=2)
        args = problem.make("cpu")
        exact = reference_call(
            args["q"], args["k"], args["v"], args["initial_state"].float() * args["state_scales"][..., None],
            args["A_log"], args["a"], args["dt_bias"], args["b"],
            read_slots=args["initial_state_indices"], null_slot=args.get("null_slot", -1),
            cu_seqlens=args.get("cu_seqlens") if T > 1 else None,
            num_accepted=args.get("num_accepted_tokens") if T > 1 else None,
        ).output  # fmt: skip
        output = exact.nan_to_num().bfloat16()
        assert bench.output_error(problem, args, output) < bench.OUTPUT_TOL
        assert bench.output_error(problem, args, output.flip(-1)) > 0.5  # rows mixed up
    records = [
        dict(HV=64, T=1, B=1, us={"bf16": 2.8, "fp32": 4.7, "int8": 2.8, "fp8_e4m3": 2.6,
             bench.FLASHINFER: 4.2}, variants={f: f"v_{f}" for f in FORMATS}),
        dict(HV=64, T=4, B=1, us=None, not_timed="int8: output off the reference by 0.9"),
    ]  # fmt: skip
    text = bench.markdown(records, dict(formats=FORMATS, target="h200", copy_GBps=4200))
    assert "| 64 | 1 | 1 | 2.80 | 4.70 | 2.80 | 2.60 | 4.20 | 0.596 | 1.000 | 1.077 |" in text
    assert "| 64 | 4 | 1 | not timed: int8: output off the reference by 0.9 |" in text


@pytest.mark.parametrize("state_dtype", ["int8", "fp8_e4m3"])
def test_the_decode_core_compiles_with_a_quantized_verify_cache(state_dtype):
    # SGLang's target verify through decode_core: the conv1d prologue, the gated RMSNorm, the
    # cache rows (values and scales) and no final write, on the variant its dispatch takes there
    module = load_kernel(f"generated.h200.kernels.kl_{state_dtype}_tv64_ilp8_vec8_tpg16_sm90")
    key = prologue_key(
        module, tokens=4, cu_seqlens_dtype="int32", cache=True, cache_rows=True,
        write_final_state=False, norm_activation="silu", norm_weight_dtype="bf16",
    )  # fmt: skip
    assert compile_kernel(module, key) is not None
