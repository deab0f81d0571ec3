"""The split plan of a fused-core call without a GPU (docs/design.md, "The conv1d step apart"):
the conv step compiled for every target that has the prologue and in every slot form, the rule
that picks the plan, the workspace's views, and what each of the two kernels is launched with."""

import dataclasses
import importlib
import re

import pytest
import torch

from gdngen.dispatch import CallShape, Range, Rule, select
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.conv_step import (
    ConvRows,
    conv_step_key,
    conv_step_module,
    moves_in_vectors,
    without_prologue,
)
from gdngen.runtime.kernel_args import RUN_TIME_ARGS
from gdngen.runtime.split_launch import SplitLaunch
from gdngen.spec import load_spec
from gdngen.terms import conv_step_name
from tests.spec_helpers import SPEC_PATH

#: every target whose spec has the prologue, and its SM
TARGETS = [("h200", "sm_90a"), ("b200", "sm_100a"), ("b300", "sm_103a"),
           ("rtx_blackwell", "sm_120a"), ("dgx_spark", "sm_121a")]  # fmt: skip


def step_key(arch="sm_90a", channels_last=False, **changes) -> CompileKey:
    """A conv step key for H 16 / HV 32, K = V = 128, width 4 with a bias, silu, [B] slots."""
    fields = dict(
        variant=conv_step_name(arch), arch=arch, tokens=1, H=16, HV=32, K=128, V=128,
        io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype="bf16",
        index_dtype="int32", separate_write_slots=False, cache=False, write_final_state=True,
        use_qk_l2norm=True, conv_width=4, conv_bias=True, conv_activation="silu",
    )  # fmt: skip
    fields.update(changes)
    return conv_step_key(CompileKey(**fields), conv_step_name(arch), channels_last)


def step_module(target: str, arch: str):
    return importlib.import_module(conv_step_module(f"generated.{target}.kernels", arch))


@pytest.mark.parametrize("target,arch", TARGETS)
def test_every_target_with_the_prologue_has_a_conv_step_that_compiles(target, arch):
    spec = load_spec(SPEC_PATH.parent / f"{target}.yaml")
    assert spec.features.conv1d_widths, f"{target} has no conv1d prologue"
    assert compile_kernel(step_module(target, arch), step_key(arch, tokens=2)) is not None


FORMS = {
    "dense": dict(),
    "packed_short_rows": dict(cu_seqlens_dtype="int32", tokens=4),
    "uniform_rows": dict(cu_seqlens_dtype="int64", tokens=3, uniform_rows=True),
    "vllm_spec_decode": dict(
        per_token_slots=True, num_accepted=True, null_slot=0, cu_seqlens_dtype="int32",
        write_final_state=False, tokens=4,
    ),
    "separate_write_slots": dict(separate_write_slots=True, index_dtype="int64"),
    "no_state_update": dict(write_final_state=False, tokens=2),
    "sglang_verify_cache": dict(
        cache=True, cache_rows=True, write_final_state=False, cu_seqlens_dtype="int32", tokens=8,
    ),
    "dense_state_width_2_identity": dict(index_dtype=None, conv_width=2, conv_bias=False,
                                         conv_activation="identity", tokens=8),
    "head_dims_256": dict(K=256, V=256, H=8, HV=16, conv_width=3),
}  # fmt: skip


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_the_conv_step_compiles_in_every_call_form(form, channels_last, tmp_path):
    key = step_key(channels_last=channels_last, **FORMS[form])
    compile_kernel(step_module("h200", "sm_90a"), key, dump_dir=tmp_path)
    (ptx,) = tmp_path.glob("*.ptx")
    text = ptx.read_text()
    # Each channel is read and written by one thread: no reader count, no fence.
    assert not re.search(r"^\s*(atom|red|fence|membar)\.", text, re.M)
    vector_stores = len(re.findall(r"^\s*st\.global\.v4", text, re.M))
    scalar_loads = len(re.findall(r"^\s*ld\.global\.b16", text, re.M))
    if channels_last:
        # a thread's channels in 16-byte vectors: at least the outputs of the three parts
        # (q, k, v), a store each per token; the window loaded in vectors
        assert vector_stores >= 3 * key.tokens and not scalar_loads
    else:  # a thread a channel: its window, inputs and outputs element-wise
        assert not vector_stores and scalar_loads >= 3 * (key.conv_width - 1 + key.tokens)


def test_the_step_moves_only_a_proven_channels_last_pool_in_vectors():
    held = torch.zeros(5, 3, 64, dtype=torch.bfloat16)  # [slots, columns, D]
    assert moves_in_vectors(held.transpose(1, 2))
    assert not moves_in_vectors(held.permute(0, 2, 1).contiguous())  # channels-first
    # a view one element into its buffer: the base is not 16-byte aligned
    shifted = torch.zeros(5 * 3 * 64 + 1, dtype=torch.bfloat16)[1:].view(5, 3, 64)
    assert not moves_in_vectors(shifted.transpose(1, 2))
    # slots an odd number of elements apart
    odd = torch.zeros(5, 3 * 64 + 1, dtype=torch.bfloat16)[:, :192].view(5, 3, 64)
    assert odd.data_ptr() % 16 == 0 and not moves_in_vectors(odd.transpose(1, 2))


def test_the_step_key_ignores_what_the_step_does_not_read():
    a = step_key(state_dtype="fp32", gate_dtype="bf16", use_qk_l2norm=True)
    b = step_key(state_dtype="bf16", gate_dtype="fp32", use_qk_l2norm=False)
    assert a == b
    assert step_key(tokens=2) != a and step_key(conv_width=3) != a


def test_the_decode_kernel_of_the_split_plan_has_no_prologue():
    key = dataclasses.replace(step_key(), variant="kl_fp32_tv32_ilp8_vec4_tpg32_sm90")
    rest = without_prologue(key)
    assert (rest.conv_width, rest.conv_bias, rest.conv_activation) == (None, False, None)
    assert dataclasses.replace(rest, conv_width=4, conv_bias=True, conv_activation="silu") == key


def rule(**changes) -> Rule:
    fields = dict(layout="k_last", state_dtype="fp32", tokens=Range(1, 1), batch_heads=Range(1),
                  gated_norm=True, conv1d=True, use="kl_fp32_tv32_ilp8_vec4_tpg32_sm90")  # fmt: skip
    fields.update(changes)
    return Rule(**fields)


def test_a_split_rule_serves_conv1d_calls_only():
    with pytest.raises(ValueError, match=r"split_conv: .*conv1d: true.*got conv1d=None"):
        rule(conv1d=None, split_conv=True)
    with pytest.raises(ValueError, match=r"got conv1d=False"):
        rule(conv1d=False, split_conv=True)
    split = rule(split_conv=True, batch_heads=Range(4096))
    fused = rule(use="kl_fp32_tv64_ilp8_vec4_tpg32_sm90")
    shape = CallShape("k_last", "fp32", 1, 8192, False, (128, 128), True, True, 64)
    assert select([split, fused], shape) is split
    small = dataclasses.replace(shape, batch_heads=64)
    assert select([split, fused], small) is fused


def test_a_spec_rule_may_split_the_conv_step(tmp_path):
    spec = load_spec(SPEC_PATH)
    dump = spec.model_dump()
    index = next(i for i, r in enumerate(dump["dispatch"]) if r["conv1d"])
    dump["dispatch"][index]["split_conv"] = True
    assert spec.model_validate(dump).dispatch[index].split_conv
    dump["dispatch"][index]["conv1d"] = None
    with pytest.raises(ValueError, match="split_conv"):
        spec.model_validate(dump)


def test_the_workspace_views_are_the_conv_channels_in_order():
    rows = ConvRows(H=2, K=4, HV=3, V=8, dtype=torch.float32, device="cpu")
    q, k, v = rows.views(5, 3)
    assert (q.shape, k.shape, v.shape) == ((5, 3, 2, 4), (5, 3, 2, 4), (5, 3, 3, 8))
    base = rows._buffers[-1][: 5 * 3 * rows.channels].view(5, 3, rows.channels)
    base.copy_(torch.arange(base.numel(), dtype=torch.float32).view_as(base))
    channels = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=2)
    assert torch.equal(channels, base)
    assert rows.views(5, 3)[0] is q  # views made once per (lead, tokens)
    rows.views(2, 3)  # smaller: the same buffer
    assert len(rows._buffers) == 1
    rows.views(9, 3)  # larger: a new buffer; the first stays alive (a graph may hold it)
    assert len(rows._buffers) == 2


@pytest.mark.parametrize("pdl", [False, True])
def test_the_split_launch_hands_each_kernel_its_arguments(pdl):
    names = [arg.name for arg in RUN_TIME_ARGS]
    arguments = {name: f"<{name}>" for name in names}
    q = torch.zeros(2, 1, 2, 4)
    arguments.update(q=q, k=torch.zeros(2, 1, 2, 4), v=torch.zeros(2, 1, 3, 8),
                     state=torch.zeros(7, 3, 8, 4), cache=None)  # fmt: skip
    seen = {}
    rows = ConvRows(H=2, K=4, HV=3, V=8, dtype=torch.float32, device="cpu")
    launch = SplitLaunch(
        lambda *a: seen.setdefault("kernel", a), pdl,
        conv_step=lambda *a: seen.setdefault("step", a), rows=rows,
    )  # fmt: skip
    launch(*(arguments[name] for name in names))
    q_out, k_out, v_out = rows.views(2, 1)
    step = seen["step"]
    assert step[0] is q and step[3:6] == (q_out, k_out, v_out)
    assert step[6:11] == tuple(
        arguments[n] for n in ("read_slots", "write_slots", "num_accepted", "cu_seqlens",
                               "cache_rows")
    )  # fmt: skip
    assert step[11:13] == (7, 0)  # the pool's slots; no verify cache
    assert step[13:] == tuple(
        arguments[n]
        for n in ("conv_state", "conv_weight", "conv_bias", "conv_windows", "launch_pdl")
    )  # the step is the call's first kernel: it takes the call's PDL attribute
    # the kernel after it overlaps the step wherever it was compiled for PDL
    assert seen["kernel"][names.index("launch_pdl")] == int(pdl)
    kernel = dict(zip(names, seen["kernel"]))
    assert (kernel["q"], kernel["k"], kernel["v"]) == (q_out, k_out, v_out)
    for name in ("conv_state", "conv_weight", "conv_bias", "conv_arrivals", "conv_windows"):
        assert kernel[name] is None
    for name in ("state", "read_slots", "out", "z", "norm_weight", "scale"):
        assert kernel[name] is arguments[name]


def test_each_split_rule_names_the_variant_the_norm_alone_takes():
    # The spec's split rules were set from the core bench (split_conv_call), which times the
    # variant the dispatch picks for the call without the prologue; a spec split rule naming
    # another would ship untimed. They serve a GPU model without measured core cells (the
    # emitted tables' measured core rules serve these calls first: each names the plan its
    # tune timed), so they are checked in the spec's own table.
    from gdngen.emit.plan import dispatch_rules

    for table in (dispatch_rules(load_spec(SPEC_PATH)),):
        split = [rule for rule in table if rule.split_conv and rule.source.startswith("spec[")]
        assert split, "the spec has split rules"
        for rule in split:
            for tokens in range(rule.tokens.lo, rule.tokens.hi + 1):
                for batch_heads in {
                    rule.batch_heads.lo,
                    rule.batch_heads.hi or 4 * rule.batch_heads.lo,
                }:
                    shape = CallShape(
                        rule.layout, rule.state_dtype, tokens, batch_heads, False,
                        rule.head_dims, True, False, 64,
                    )  # fmt: skip
                    assert select(table, shape).use == rule.use, (rule.source, tokens, batch_heads)


def test_warmup_keys_of_a_conv1d_form_hold_both_plans_kernels():
    # warmup and build compile what the dispatch can pick: a split rule's conv step and its
    # variant without the prologue, beside the fused rules' kernels with it.
    import generated.h200 as h200
    from gdngen.emit.plan import dispatch_rules
    from gdngen.runtime.forms import Form, compile_keys
    from gdngen.runtime.norm_step import norm_step_key, without_norm

    geometry = [g for g in h200.INFO.geometries if g.name == "qwen3.5"]
    form = Form(mode="update", index_dtype="int32", null_slot=0, norm_activation="silu",
                conv_width=4)  # fmt: skip
    # the spec's own table: fp32 at T = 1 fused, then the split plan from B*HV 512
    static = dispatch_rules(load_spec(SPEC_PATH))
    keys = compile_keys([static], arch="sm_90a", geometries=geometry,
                        pairs=[("k_last", "fp32")], max_tokens=1, forms=[form])  # fmt: skip
    fused = form.key("kl_fp32_tv64_ilp8_vec4_tpg32_sm90", "sm_90a", 1, geometry[0], "fp32")
    split = form.key("kl_fp32_tv32_ilp8_vec4_tpg32_sm90", "sm_90a", 1, geometry[0], "fp32")
    assert fused in keys and fused.conv_width == 4
    # the conv step for either conv state, moved in vectors or not
    assert {conv_step_key(split, "conv_step_sm90", c) for c in (True, False)} <= set(keys)
    assert without_prologue(split) in keys and split not in keys
    # the H200's measured table: the steps plan from B*HV 182 (a head over 16 CTAs between the
    # conv step and the norm step), both steps and the bare variant
    keys = compile_keys([h200.dispatch.TABLE], arch="sm_90a", geometries=geometry,
                        pairs=[("k_last", "fp32")], max_tokens=1, forms=[form])  # fmt: skip
    bare = form.key("kl_fp32_tv8_ilp8_vec4_tpg32_sm90", "sm_90a", 1, geometry[0], "fp32")
    assert without_norm(without_prologue(bare)) in keys and bare not in keys
    assert norm_step_key(bare, "norm_step_sm90") in keys
    assert conv_step_key(bare, "conv_step_sm90", True) in keys
    # without the prologue (the norm alone): no conv step
    norm_only = dataclasses.replace(form, conv_width=None)
    keys = compile_keys([h200.dispatch.TABLE], arch="sm_90a", geometries=geometry,
                        pairs=[("k_last", "fp32")], max_tokens=1, forms=[norm_only])  # fmt: skip
    assert keys and all(k.conv_width is None and k.norm_activation == "silu" for k in keys)


@pytest.mark.parametrize(
    "changes,fragment",
    [(dict(conv_width=5, norm_activation="silu"), "conv_width: target h200 serves conv1d widths"),
     (dict(conv_width=4), "norm_activation: the conv1d prologue's calls"),
     (dict(norm_activation="relu"), "norm_activation: expected None or one of"),
     (dict(conv_width=4, norm_activation="silu", conv_activation="gelu"), "conv_activation:")],
)  # fmt: skip
def test_warmup_names_a_bad_fused_step_argument(changes, fragment):
    import generated.h200 as h200

    with pytest.raises(ValueError, match=re.escape(fragment)):
        h200.warmup(geometry="qwen3.5", max_tokens=1, progress=False, **changes)


def test_a_spec_build_section_may_build_the_fused_core_forms():
    import generated.h200 as h200
    from gdngen.runtime.build import target_keys

    spec = load_spec(SPEC_PATH)
    dump = spec.model_dump()
    dump["build"].update(fused=("core",), modes=("update",), geometries=("qwen3.5",))
    keys = target_keys(spec.model_validate(dump), h200)
    # every kernel takes the norm but a steps plan's bare variant, whose norm step is built too
    steps_kernels = ("conv_step_sm90", "norm_step_sm90")
    bare = [k for k in keys if k.variant not in steps_kernels and k.norm_activation is None]
    assert keys and all(k.conv_width is None for k in bare)
    assert bare and any(k.variant == "norm_step_sm90" for k in keys)
    # fp32 from B*HV = 512 splits the conv off: the step and the variant without the prologue
    steps = [k for k in keys if k.variant == "conv_step_sm90"]
    assert steps and all(k.conv_width == 4 for k in steps)
    assert any(k.conv_width is None and k.state_dtype == "fp32" for k in keys)
    assert any(k.conv_width == 4 and k.variant.startswith("kl_bf16") for k in keys)
    # the steps need the features they build
    dump["build"]["conv_width"] = 5
    with pytest.raises(ValueError, match=r"build.conv_width: 5 is not among"):
        spec.model_validate(dump)
    dump["build"]["conv_width"] = 4
    dump["features"].update(gated_rmsnorm=False, conv1d_widths=())
    dump["dispatch"] = [r for r in dump["dispatch"] if not r["gated_norm"]]
    dump["variants"] = [v for v in dump["variants"] if not v.get("gated_norm_only")]
    dump["tuning"]["core"] = None  # (its grid needs the features too)
    with pytest.raises(ValueError, match=r"build.fused: \['core'\] needs `gated_rmsnorm: true`"):
        spec.model_validate(dump)
