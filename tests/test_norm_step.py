"""The norm-split plan of a call with the gated RMSNorm, without a GPU (docs/design.md, "The norm
step apart"): the norm step compiled for every target that has the epilogue and in every call
form it serves, its thread layout, its key, what the split launch hands each kernel, and the
rules that pick the plan."""

import dataclasses
import importlib
import re

import pytest
import torch

from gdngen.device.norm_step import head_lanes, heads_per_cta
from gdngen.dispatch import Range, Rule
from gdngen.emit.dispatch_table import RowFormat
from gdngen.dispatch.rules import row
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.conv_step import ConvRows
from gdngen.runtime.kernel_args import RUN_TIME_ARGS
from gdngen.runtime.norm_step import norm_step_key, norm_step_module, without_norm
from gdngen.runtime.split_launch import SplitLaunch
from gdngen.spec import load_spec
from gdngen.terms import norm_step_name
from tests.spec_helpers import SPEC_PATH
from tests.test_conv_step import TARGETS


def call_key(arch="sm_90a", **changes) -> CompileKey:
    """A gated-norm call's key: H 16 / HV 32, K = V = 128, bf16, silu, [B] slots."""
    fields = dict(
        variant="kl_fp32_tv8_ilp8_vec4_tpg32_sm90", arch=arch, tokens=1, H=16, HV=32, K=128,
        V=128, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype="fp32",
        index_dtype="int32", separate_write_slots=False, cache=False, write_final_state=True,
        use_qk_l2norm=True, norm_activation="silu", norm_weight_dtype="bf16",
    )  # fmt: skip
    fields.update(changes)
    return CompileKey(**fields)


def step_key(arch="sm_90a", **changes) -> CompileKey:
    return norm_step_key(call_key(arch, **changes), norm_step_name(arch))


@pytest.mark.parametrize("target,arch", TARGETS)
def test_every_target_with_the_epilogue_has_a_norm_step_that_compiles(target, arch):
    spec = load_spec(SPEC_PATH.parent / f"{target}.yaml")
    assert spec.features.gated_rmsnorm, f"{target} has no gated RMSNorm"
    module = importlib.import_module(norm_step_module(f"generated.{target}.kernels", arch))
    assert compile_kernel(module, step_key(arch, tokens=2)) is not None


FORMS = {
    "dense": dict(),
    "dense_T4_pdl": dict(tokens=4, pdl=True),
    "packed_short_rows": dict(cu_seqlens_dtype="int32", tokens=4),
    "uniform_rows": dict(cu_seqlens_dtype="int64", tokens=3, uniform_rows=True),
    "fp16_fp32_weight_sigmoid": dict(io_dtype="fp16", norm_weight_dtype="fp32",
                                     norm_activation="sigmoid"),
    "head_dims_256": dict(K=256, V=256, H=8, HV=16),
    "head_dims_64": dict(K=64, V=64, HV=48),
}  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
def test_the_norm_step_compiles_in_every_call_form(form, tmp_path):
    key = step_key(**FORMS[form])
    module = importlib.import_module(norm_step_module("generated.h200.kernels", "sm_90a"))
    compile_kernel(module, key, dump_dir=tmp_path)
    (ptx,) = tmp_path.glob("*.ptx")
    text = ptx.read_text()
    # A head's squares meet in a butterfly within a warp: no shared memory, no atomics.
    assert not re.search(r"^\s*(atom|red|fence|membar|bar)\.", text, re.M)
    lanes, _ = head_lanes(2, key.V)
    assert len(re.findall(r"^\s*shfl\.sync\.bfly", text, re.M)) == key.tokens * (
        lanes.bit_length() - 1
    )
    # each token's row, z and output in 16-byte vectors, one store a token
    assert len(re.findall(r"^\s*st\.global\.v4", text, re.M)) == key.tokens
    assert len(re.findall(r"^\s*ld\.global\.v4", text, re.M)) >= 2 * key.tokens + 1
    assert not re.search(r"^\s*(ld|st)\.global\.(b16|u16)\b", text, re.M)  # no scalar values
    # every token's row and gate in flight before the first token's norm
    loads = [m.start() for m in re.finditer(r"^\s*ld\.global\.v4", text, re.M)]
    assert loads[-1] < re.search(r"^\s*shfl\.sync", text, re.M).start()
    waits = len(re.findall(r"griddepcontrol\.wait", text))
    assert waits >= 1 if key.pdl else waits == 0


@pytest.mark.parametrize(
    "element_bytes,V,lanes,values",
    [(2, 128, 16, 8), (4, 128, 32, 4), (2, 256, 32, 8), (2, 64, 8, 8), (2, 96, 8, 12),
     (4, 256, 32, 8), (2, 8, 1, 8)],
)  # fmt: skip
def test_a_head_row_is_a_power_of_two_of_lanes_in_one_warp(element_bytes, V, lanes, values):
    assert head_lanes(element_bytes, V) == (lanes, values)


@pytest.mark.parametrize(
    "HV,lanes,per_cta", [(64, 16, 8), (32, 16, 8), (48, 16, 8), (20, 16, 5), (7, 16, 7),
                         (13, 32, 1), (4, 32, 4), (1, 16, 1)],
)  # fmt: skip
def test_a_cta_holds_whole_heads_dividing_hv(HV, lanes, per_cta):
    # so no warp holds a head past HV, and every butterfly runs on a whole head
    assert heads_per_cta(HV, lanes) == per_cta
    assert HV % per_cta == 0 and per_cta * lanes <= max(128, lanes)


def test_the_step_key_keeps_only_what_the_step_reads():
    a = step_key()
    others = dict(variant="kl_bf16_tv64_ilp8_vec8_tpg16_sm90", state_dtype="bf16",
                  index_dtype="int64", gate_dtype="fp32", conv_width=4, conv_bias=True,
                  conv_activation="silu", H=8, K=64, use_qk_l2norm=False)  # fmt: skip
    assert step_key(**others) == a
    for changed in (dict(tokens=2), dict(HV=64), dict(V=64, K=64), dict(io_dtype="fp16"),
                    dict(norm_activation="sigmoid"), dict(norm_weight_dtype="fp32"),
                    dict(cu_seqlens_dtype="int32"), dict(pdl=True)):  # fmt: skip
        assert step_key(**changed) != a, changed


def test_the_decode_kernel_of_the_norm_split_plan_has_no_epilogue():
    key = call_key()
    rest = without_norm(key)
    assert (rest.norm_activation, rest.norm_weight_dtype) == (None, None)
    assert dataclasses.replace(rest, norm_activation="silu", norm_weight_dtype="bf16") == key


def _launch_arguments():
    names = [arg.name for arg in RUN_TIME_ARGS]
    arguments = {name: f"<{name}>" for name in names}
    arguments.update(q=torch.zeros(2, 1, 2, 4), k=torch.zeros(2, 1, 2, 4),
                     v=torch.zeros(2, 1, 3, 8), state=torch.zeros(7, 3, 8, 4), cache=None,
                     launch_pdl=1)  # fmt: skip
    return names, arguments


@pytest.mark.parametrize("pdl", [False, True])
def test_the_norm_split_launch_hands_each_kernel_its_arguments(pdl):
    names, arguments = _launch_arguments()
    seen = {}
    launch = SplitLaunch(
        lambda *a: seen.setdefault("kernel", a), pdl,
        norm_step=lambda *a: seen.setdefault("step", a),
    )  # fmt: skip
    launch(*(arguments[name] for name in names))
    kernel = dict(zip(names, seen["kernel"]))
    assert kernel["z"] is None and kernel["norm_weight"] is None
    # the decode kernel is the call's first: the call's PDL attribute; all else as given
    for name in names:
        if name not in ("z", "norm_weight"):
            assert kernel[name] is arguments[name], name
    # the step after it: the output in place, z, the weight, the rows' form, eps; the plan's PDL
    assert seen["step"] == tuple(
        arguments[n] for n in ("out", "z", "norm_weight", "cu_seqlens", "norm_eps")
    ) + (int(pdl),)


def test_both_steps_run_around_the_kernel_in_order():
    names, arguments = _launch_arguments()
    order = []
    rows = ConvRows(H=2, K=4, HV=3, V=8, dtype=torch.float32, device="cpu")
    launch = SplitLaunch(
        lambda *a: order.append(("kernel", a)), True,
        conv_step=lambda *a: order.append(("conv", a)), rows=rows,
        norm_step=lambda *a: order.append(("norm", a)),
    )  # fmt: skip
    launch(*(arguments[name] for name in names))
    assert [what for what, _ in order] == ["conv", "kernel", "norm"]
    kernel = dict(zip(names, order[1][1]))
    assert kernel["q"] is rows.views(2, 1)[0] and kernel["conv_state"] is None
    assert kernel["z"] is None and kernel["launch_pdl"] == 1


def test_a_split_launch_splits_off_a_step_and_the_conv_step_has_its_workspace():
    with pytest.raises(ValueError, match="at least one step"):
        SplitLaunch(lambda *a: None, True)
    with pytest.raises(ValueError, match="rows"):
        SplitLaunch(lambda *a: None, True, conv_step=lambda *a: None)


def test_a_split_norm_rule_serves_gated_norm_calls_only_and_rows_name_it():
    with pytest.raises(ValueError, match=r"split_norm: .*gated_norm: true.*got gated_norm=None"):
        Rule(layout="k_last", state_dtype="fp32", tokens=Range(1, 1), batch_heads=Range(1),
             use="kl_fp32_tv8_ilp8_vec4_tpg32_sm90", split_norm=True)  # fmt: skip
    rule = Rule(layout="k_last", state_dtype="fp32", tokens=Range(1, 1), batch_heads=Range(256),
                gated_norm=True, use="kl_fp32_tv8_ilp8_vec4_tpg32_sm90", split_norm=True)  # fmt: skip
    text = RowFormat.for_spec([rule.use], 8).row(rule)
    assert text.endswith(", split_norm=True),")
    assert eval(text.rstrip(","), {"row": row}) == rule


def test_a_spec_rule_may_split_the_norm_off_to_a_variant_without_the_epilogue():
    spec = load_spec(SPEC_PATH)
    dump = spec.model_dump()
    index = next(i for i, r in enumerate(dump["dispatch"]) if r["gated_norm"] and not r["conv1d"])
    without = next(v for v in spec.variants if v.layout == dump["dispatch"][index]["layout"]
                   and v.state_dtype == dump["dispatch"][index]["state_dtype"]
                   and not v.serves_gated_norm(128) and v.serves_head_dims(128, 128))  # fmt: skip
    dump["dispatch"][index]["use"] = spec.variant_name(without)
    with pytest.raises(ValueError, match="no epilogue"):
        spec.model_validate(dump)
    dump["dispatch"][index]["split_norm"] = True
    assert spec.model_validate(dump).dispatch[index].split_norm


def test_warmup_keys_of_a_norm_split_rule_hold_the_step_and_the_bare_kernel():
    import generated.h200 as h200
    from gdngen.runtime.forms import Form

    geometry = next(g for g in h200.INFO.geometries if g.name == "qwen3.5")
    form = Form(mode="update", index_dtype="int32", null_slot=0, norm_activation="silu")
    rule = Rule(layout="k_last", state_dtype="fp32", tokens=Range(1, 1), batch_heads=Range(1),
                gated_norm=True, use="kl_fp32_tv8_ilp8_vec4_tpg32_sm90", split_norm=True)  # fmt: skip
    key = form.key(rule.use, "sm_90a", 1, geometry, "fp32")
    assert form.keys(rule, "sm_90a", 1, geometry, "fp32") == [
        norm_step_key(key, "norm_step_sm90"),
        without_norm(key),
    ]
    fused = dataclasses.replace(rule, split_norm=False)
    assert form.keys(fused, "sm_90a", 1, geometry, "fp32") == [key]
