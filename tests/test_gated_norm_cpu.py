"""The gated RMSNorm epilogue without a GPU: its argument checks, its dispatch and spec rules, and
its kernels compiled for every SM target whose spec has the feature."""

import dataclasses
import importlib

import pytest
import torch

import generated.h200
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.spec import load_spec
from gdngen.spec.model import Variant
from gdngen.runtime.kernel_table import load_kernel
from tests.spec_helpers import SPEC_PATH
from tests.test_checks import make_args, on_fake_cuda, raises

INFO = generated.h200.INFO
B, HV, V = 4, 32, 128


def norm_args(**changes) -> dict:
    args = make_args()
    args.update(
        z=torch.zeros(B, 1, HV, V, dtype=torch.bfloat16),
        norm_weight=torch.ones(V, dtype=torch.bfloat16),
        norm_eps=1e-6,
        norm_activation="silu",
    )
    args.update(changes)
    return args


def test_a_valid_norm_call_is_checked_into_the_call():
    from gdngen.runtime.checks import check_call

    call = check_call(INFO, **on_fake_cuda(norm_args(norm_activation="sigmoid", norm_eps=0.01)))
    assert call.norm_activation == "sigmoid" and call.norm.eps == 0.01
    assert call.norm_weight_dtype == "bf16"
    key = CompileKey.for_call("kl_bf16_tv64_ilp8_vec8_tpg16_sm90", "sm_90a", call)
    assert (key.norm_activation, key.norm_weight_dtype) == ("sigmoid", "bf16")


@pytest.mark.parametrize(
    "changes,exc,fragments",
    [
        (dict(norm_weight=None), ValueError, ["norm_weight: the gated RMSNorm needs both"]),
        (dict(z=None), ValueError, ["z: the gated RMSNorm needs both"]),
        (dict(z=torch.zeros(B, 1, HV, 64, dtype=torch.bfloat16)), ValueError,
         ["z: expected shape [B, T, HV, V] (as the output) = [4, 1, 32, 128]", "[4, 1, 32, 64]"]),
        (dict(z=torch.zeros(B, 1, HV, V, dtype=torch.float32)), TypeError,
         ["z: expected dtype bfloat16 (as q); got float32"]),
        (dict(z=torch.zeros(B, 1, V, HV, dtype=torch.bfloat16).transpose(2, 3)), ValueError,
         ["z: its last 2 dim(s) [HV, V] must be contiguous"]),
        (dict(norm_weight=torch.ones(64, dtype=torch.bfloat16)), ValueError,
         ["norm_weight: expected shape [V] = [128]; got [64]"]),
        (dict(norm_weight=torch.ones(V, dtype=torch.int32)), TypeError,
         ["norm_weight: expected dtype bfloat16, float16, float32; got int32"]),
        (dict(norm_eps=0.0), ValueError, ["norm_eps: expected a finite number > 0; got 0.0"]),
        (dict(norm_eps="1e-6"), TypeError, ["norm_eps: expected a float; got str"]),
        (dict(norm_activation="gelu"), ValueError,
         ["norm_activation: expected one of ('silu', 'sigmoid'); got 'gelu'"]),
        (dict(norm_weight=torch.ones(V + 1, dtype=torch.bfloat16)[1:]), ValueError,
         ["norm_weight: data pointer must be 16-byte aligned"]),
    ],
    ids=["no_weight", "no_z", "z_shape", "z_dtype", "z_strided", "weight_shape", "weight_dtype",
         "eps_zero", "eps_type", "activation", "weight_misaligned"],
)  # fmt: skip
def test_bad_norm_arguments_name_the_argument(changes, exc, fragments):
    raises(exc, norm_args(**changes), *fragments)


def test_a_target_without_the_feature_says_what_to_add():
    info = dataclasses.replace(INFO, gated_rmsnorm=False)
    raises(
        ValueError,
        norm_args(),
        "without the gated RMSNorm epilogue",
        "gated_rmsnorm: true",
        info=info,
    )


def test_norm_rules_need_the_feature_and_a_kernel_with_the_epilogue():
    spec = load_spec(SPEC_PATH)
    with pytest.raises(ValueError, match="add `gated_rmsnorm: true` under `features:`"):
        spec.model_validate(
            {
                **spec.model_dump(),
                "features": {
                    **spec.features.model_dump(),
                    "gated_rmsnorm": False,
                    "conv1d_widths": [],
                },
            }
        )
    # A norm rule naming a staged kernel (no epilogue) is refused, naming the rule.
    dump = spec.model_dump()
    index = next(
        i for i, rule in enumerate(dump["dispatch"])
        if rule["gated_norm"] and rule["layout"] == "k_last" and rule["state_dtype"] == "bf16"
    )  # fmt: skip
    dump["dispatch"][index]["use"] = "kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90"
    with pytest.raises(
        ValueError, match=rf"dispatch\[{index}\]\.use: .* has no epilogue for V=128"
    ):
        spec.model_validate(dump)


def test_gated_norm_only_kernels_stay_out_of_the_tuning_and_of_plain_calls():
    spec = load_spec(SPEC_PATH)
    norm_only = [v for v in spec.variants if v.gated_norm_only]
    assert norm_only, "the shipped spec keeps whole-head kernels for the norm"
    for variant in norm_only:
        assert variant not in spec.tuning_candidates(variant.layout, variant.state_dtype)
    # A rule that also serves plain calls may not name one.
    dump = spec.model_dump()
    index = next(i for i, rule in enumerate(dump["dispatch"]) if not rule["gated_norm"])
    name = norm_only[0].name_for(spec.sm)
    rule = dump["dispatch"][index]
    rule.update(layout=norm_only[0].layout, state_dtype=norm_only[0].state_dtype, use=name)
    with pytest.raises(ValueError, match=rf"dispatch\[{index}\]\.use: {name} is `gated_norm_only`"):
        spec.model_validate(dump)


def test_which_kernels_have_the_epilogue():
    stepwise = Variant(
        layout="k_last", state_dtype="bf16", tile_v=16, ilp=4, vec=8, threads_per_group=16
    )
    assert stepwise.serves_gated_norm(128)  # a cluster of 8
    assert not stepwise.serves_gated_norm(256)  # 16 CTAs a head: past the portable cluster
    staged = stepwise.model_copy(update={"solve": "staged", "tile_v": 64, "ilp": 8})
    assert not staged.serves_gated_norm(128)


@pytest.mark.parametrize(
    "target,variant,K,T",
    [
        ("h200", "kl_bf16_tv64_ilp8_vec8_tpg16_sm90", 128, 2),
        ("h200", "kl_bf16_tv128_ilp8_vec8_tpg16_sm90", 128, 8),
        ("h200", "kl_fp32_tv16_ilp4_vec4_tpg32_pre_sm90", 128, 4),
        ("h200", "vl_fp32_tv16_ilp4_vec8_tpg16_sm90", 128, 1),
        ("h200", "kl_fp32_tv32_ilp4_vec4_tpg32_ks2_sm90", 256, 3),
        ("b200", "kl_fp32_tv16_ilp4_vec4_tpg32_sm100", 128, 2),
        ("b200", "kl_bf16_tv128_ilp8_vec8_tpg16_pfma_sm100", 128, 1),
        ("b300", "vl_bf16_tv128_ilp4_vec16_tpg8_pfma_sm103", 128, 1),
        ("rtx_blackwell", "kl_bf16_tv32_ilp2_vec8_tpg32_sm120", 256, 2),
        ("dgx_spark", "vl_fp32_tv32_ilp4_vec8_tpg32_sm121", 256, 1),
    ],
)
def test_the_epilogue_compiles_for_each_target(target, variant, K, T):
    package = importlib.import_module(f"generated.{target}")
    module = load_kernel(f"generated.{target}.kernels.{variant}")
    key = CompileKey(
        variant=variant, arch=package.INFO.sm, tokens=T, H=16, HV=32, K=K, V=K, io_dtype="bf16",
        gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype=module.STATE_DTYPE,
        index_dtype="int32", separate_write_slots=False, cache=T > 1, write_final_state=T == 1,
        use_qk_l2norm=True, norm_activation="silu", norm_weight_dtype="fp32",
    )  # fmt: skip
    assert compile_kernel(module, key) is not None


def test_a_kernel_without_the_epilogue_refuses_z_at_trace_time():
    module = load_kernel("generated.h200.kernels.kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90")
    key = CompileKey(
        variant=module.NAME, arch="sm_90a", tokens=2, H=16, HV=32, K=128, V=128, io_dtype="bf16",
        gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype="bf16", index_dtype="int32",
        separate_write_slots=False, cache=False, write_final_state=True, use_qk_l2norm=True,
        norm_activation="silu", norm_weight_dtype="bf16",
    )  # fmt: skip
    with pytest.raises(Exception, match="has no gated RMSNorm epilogue"):
        compile_kernel(module, key)
