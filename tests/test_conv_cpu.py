"""The conv1d prologue without a GPU: its argument checks, its spec feature, its dispatch (the
fused-core rules) and its kernels compiled for every SM target whose spec has it."""

import dataclasses
import importlib

import pytest
import torch

import generated.h200
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.spec import load_spec
from tests.spec_helpers import SPEC_PATH
from tests.test_checks import POOL, make_args, on_fake_cuda, raises

INFO = generated.h200.INFO
H, K, HV, V = 16, 128, 32, 128
D = 2 * H * K + HV * V


def conv_args(width=4, **changes) -> dict:
    args = make_args()
    args.update(
        conv_state=torch.zeros(POOL, D, width - 1, dtype=torch.bfloat16),
        conv_weight=torch.zeros(D, width, dtype=torch.bfloat16),
        conv_bias=torch.zeros(D, dtype=torch.bfloat16),
        conv_activation="silu",
    )
    args.update(changes)
    return args


def test_a_valid_conv_call_is_checked_into_the_call_and_the_key():
    from gdngen.runtime.checks import check_call

    # vLLM's layout: the transposed view of a [slots, W - 1, D] buffer; a conv module's weight.
    kept = torch.zeros(POOL, 2, D, dtype=torch.bfloat16).transpose(1, 2)
    args = conv_args(width=3, conv_state=kept, conv_bias=None, conv_activation="identity")
    args["conv_weight"] = torch.zeros(D, 1, 3, dtype=torch.bfloat16)
    call = check_call(INFO, **on_fake_cuda(args))
    assert call.conv.width == 3 and call.conv.weight.shape == (D, 3) and call.fused
    key = CompileKey.for_call("kl_bf16_tv64_ilp8_vec8_tpg16_sm90", "sm_90a", call)
    assert (key.conv_width, key.conv_bias, key.conv_activation) == (3, False, "identity")


@pytest.mark.parametrize(
    "changes,exc,fragments",
    [
        (dict(conv_weight=None), ValueError, ["conv_weight: the conv1d prologue needs"]),
        (dict(conv_state=None), ValueError, ["conv_state: the conv1d prologue needs"]),
        (dict(conv_weight=torch.zeros(D, 5, dtype=torch.bfloat16)), ValueError,
         ["conv_weight: a width of 5 taps; target h200 serves [2, 3, 4]", "conv1d_widths"]),
        (dict(conv_weight=torch.zeros(D + 8, 4, dtype=torch.bfloat16)), ValueError,
         ["conv_weight: expected [D, W] or [D, 1, W] with D = 2*H*K + HV*V = 8192"]),
        (dict(conv_weight=torch.zeros(4, D, dtype=torch.bfloat16).t()), ValueError,
         ["conv_weight: must be contiguous"]),
        (dict(conv_state=torch.zeros(POOL, 3, D, dtype=torch.bfloat16)), ValueError,
         ["conv_state: expected shape [slots, D, W - 1]", f"[{POOL}, 3, {D}]"]),
        (dict(conv_state=torch.zeros(POOL + 1, D, 3, dtype=torch.bfloat16)), ValueError,
         ["conv_state: expected shape", f"with {POOL} slots (as initial_state)"]),
        (dict(conv_state=torch.zeros(POOL, D, 6, dtype=torch.bfloat16)[..., ::2]), ValueError,
         ["conv_state: expected each slot channels-first"]),
        (dict(conv_state=torch.zeros(POOL, D, 3)), TypeError,
         ["conv_state: expected dtype bfloat16 (as q); got float32"]),
        (dict(conv_bias=torch.zeros(D - 1, dtype=torch.bfloat16)), ValueError,
         ["conv_bias: expected shape [D] with D = 8192"]),
        (dict(conv_activation="relu"), ValueError,
         ["conv_activation: expected one of ('silu', 'identity'); got 'relu'"]),
        (dict(disable_state_update=True), ValueError,
         ["disable_state_update: not served with the conv1d prologue"]),
    ],
    ids=["no_weight", "no_state", "width", "channels", "weight_strided", "state_shape",
         "state_slots", "state_strided", "state_dtype", "bias_shape", "activation", "no_update"],
)  # fmt: skip
def test_bad_conv_arguments_name_the_argument(changes, exc, fragments):
    raises(exc, conv_args(**changes), *fragments)


def test_bias_alone_and_a_target_without_the_feature():
    args = conv_args(conv_state=None, conv_weight=None)
    raises(ValueError, args, "conv_bias: given without conv_state and conv_weight")
    info = dataclasses.replace(INFO, conv1d_widths=())
    raises(ValueError, conv_args(), "without the conv1d prologue", "conv1d_widths", info=info)


def test_the_feature_checks_its_widths_and_needs_the_fused_rules():
    spec = load_spec(SPEC_PATH)
    assert spec.features.conv1d_widths == (2, 3, 4)
    for widths, message in (([1], "outside 2..8"), ([4, 4], "repeats a width")):
        with pytest.raises(ValueError, match=message):
            spec.model_validate(
                {
                    **spec.model_dump(),
                    "features": {**spec.features.model_dump(), "conv1d_widths": widths},
                }
            )
    with pytest.raises(ValueError, match="needs `gated_rmsnorm: true` as well"):
        features = {**spec.features.model_dump(), "gated_rmsnorm": False}
        spec.model_validate({**spec.model_dump(), "features": features})


@pytest.mark.parametrize(
    "target,variant,K,T,cu",
    [
        ("h200", "kl_bf16_tv64_ilp8_vec8_tpg16_sm90", 128, 1, None),
        ("h200", "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90", 128, 4, "int32"),
        ("h200", "vl_bf16_tv128_ilp4_vec16_tpg1_ks8_sm90", 128, 2, None),
        ("b200", "kl_bf16_tv128_ilp8_vec8_tpg16_pfma_sm100", 128, 8, None),
        ("b300", "vl_bf16_tv128_ilp4_vec16_tpg8_pfma_sm103", 128, 1, None),
        ("rtx_blackwell", "kl_bf16_tv32_ilp2_vec8_tpg32_sm120", 256, 3, "int64"),
        ("dgx_spark", "vl_fp32_tv32_ilp4_vec8_tpg32_sm121", 256, 1, None),
    ],
)
def test_the_prologue_compiles_for_each_target(target, variant, K, T, cu):
    package = importlib.import_module(f"generated.{target}")
    module = importlib.import_module(f"generated.{target}.kernels.{variant}")
    key = CompileKey(
        variant=variant, arch=package.INFO.sm, tokens=T, H=16, HV=32, K=K, V=K,
        io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype=module.STATE_DTYPE,
        index_dtype="int32", separate_write_slots=False, cache=False, write_final_state=True,
        use_qk_l2norm=True, cu_seqlens_dtype=cu, norm_activation="silu", norm_weight_dtype="bf16",
        conv_width=4, conv_bias=True, conv_activation="silu",
    )  # fmt: skip
    assert compile_kernel(module, key) is not None


def test_a_staged_kernel_refuses_the_prologue_at_trace_time():
    module = importlib.import_module(
        "generated.h200.kernels.kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90"
    )
    key = CompileKey(
        variant=module.NAME, arch="sm_90a", tokens=2, H=16, HV=32, K=128, V=128, io_dtype="bf16",
        gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype="bf16", index_dtype="int32",
        separate_write_slots=False, cache=False, write_final_state=True, use_qk_l2norm=True,
        conv_width=4, conv_activation="silu",
    )  # fmt: skip
    with pytest.raises(ValueError, match="has no conv1d prologue"):
        compile_kernel(module, key)
