"""Programmatic dependent launch without a GPU (docs/design.md, "Programmatic dependent
launch"): the kernels compiled for it wait once, read only what the grid before cannot have
written before that wait and write nothing before it; the kernels compiled without it are the
ones from before; ``enable_pdl`` is checked and keyed; the host's record turns the attribute off
for a call whose pools the last gdngen launch on its stream wrote. tests/gpu/test_pdl_gpu.py
runs it."""

import importlib
import re
from dataclasses import replace

import pytest
import torch

from gdngen.runtime import pdl as pdl_module
from gdngen.runtime.checks import check_call
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.conv_step import conv_step_key, conv_step_module
from gdngen.runtime.forms import Form, spec_forms
from gdngen.runtime.pdl import StreamWrites, span_bytes
from gdngen.spec import load_spec
from gdngen.terms import conv_step_name, kernel_serves_head_dims, variant_pair
from gdngen.runtime.kernel_table import load_kernel
from tests.spec_helpers import ROOT
from tests.test_checks import INFO, make_args, on_fake_cuda

WAIT = "griddepcontrol.wait;"
RELEASE = "griddepcontrol.launch_dependents;"
#: instructions that write memory other threads or grids can see
WRITES = re.compile(r"^\s*(st\.global|atom\.|red\.|cp\.async\.bulk|st\.async)", re.M)

TARGETS = [
    ("h200", "sm_90a"), ("b200", "sm_100a"), ("b300", "sm_103a"), ("rtx_blackwell", "sm_120a"),
    ("dgx_spark", "sm_121a"),
]  # fmt: skip


def key(variant: str, arch: str = "sm_90a", **changes) -> CompileKey:
    fields = dict(
        variant=variant, arch=arch, tokens=1, H=16, HV=64, K=128, V=128, io_dtype="bf16",
        gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype=variant_pair(variant)[1],
        index_dtype="int32", separate_write_slots=False, cache=False, write_final_state=True,
        use_qk_l2norm=True, pdl=True,
    )  # fmt: skip
    fields.update(changes)
    return CompileKey(**fields)


CORE = dict(
    norm_activation="silu", norm_weight_dtype="bf16", conv_width=4, conv_bias=True,
    conv_activation="silu",
)  # fmt: skip


def ptx_of(module, compile_key: CompileKey, folder) -> str:
    compile_kernel(module, compile_key, dump_dir=folder)
    (ptx,) = folder.glob("*.ptx")
    return ptx.read_text()


def split_at_wait(text: str, middles: int = 1) -> tuple[str, str]:
    """The PTX before the first CTAs' wait and after it. A PDL kernel has one wait at its start
    (the CTAs past the first wave) and then ``middles`` (the conv step has one in each branch
    of its head's part, a thread takes one), each followed by the release before any write."""
    assert text.count(WAIT) == 1 + middles and text.count(RELEASE) == middles
    start, rest = text.split(WAIT, 1)
    assert "ld.global" not in start and not WRITES.search(start), "the start's wait comes first"
    before, after = rest.split(WAIT, 1)
    first_write = WRITES.search(after)
    assert first_write and after.index(RELEASE) < first_write.start(), "released before writes"
    return start + before, after


def h200_kernel(variant: str):
    return load_kernel(f"generated.h200.kernels.{variant}")


def test_the_plain_kernel_loads_its_state_before_the_wait_and_its_inputs_after(tmp_path):
    # kl_bf16_tv64_ilp8_vec8: a lane's state is ILP rows of 8 bf16 (one 16-byte load each);
    # q, k (8 bf16) and its v rows (8 bf16) are one 16-byte load each
    variant = "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"
    before, after = split_at_wait(ptx_of(h200_kernel(variant), key(variant), tmp_path))
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4", before)) == 8
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4", after)) >= 3
    assert not WRITES.search(before)
    # after the wait every input load comes before the gates' arithmetic: q, k, v (16 bytes
    # each) and a, b (one bf16 each) in flight together, not b after g's exp
    first_exp = after.index("ex2.approx")
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4", after[:first_exp])) == 3
    assert len(re.findall(r"ld\.global(\.\w+)*\.b16", after[:first_exp])) == 2


@pytest.mark.parametrize("target,arch", TARGETS)
def test_every_targets_fused_core_waits_once_and_writes_after(target, arch, tmp_path):
    spec = load_spec(ROOT / "specs" / f"{target}.yaml")
    module_name = f"generated.{target}.kernels"
    served = importlib.import_module(f"generated.{target}").VARIANTS
    variant = next(
        name for name in served if name.startswith("kl_bf16") and "staged" not in name
        and "tv128" not in name and spec.variants_by_name[name].ilp >= 4
        and kernel_serves_head_dims(load_kernel(f"{module_name}.{name}"), 128, 128)
    )  # fmt: skip
    module = load_kernel(f"{module_name}.{variant}")
    text = ptx_of(module, key(variant, arch, tokens=2, **CORE), tmp_path / "core")
    before, _ = split_at_wait(text)
    assert not WRITES.search(before)
    # the conv step: its windows, taps and bias before the wait; its stores after
    step = importlib.import_module(conv_step_module(module_name, arch))
    step_key = conv_step_key(key(variant, arch, **CORE), conv_step_name(arch), True)
    # (one wait in each of the q, k and v branches: a thread takes one)
    before, after = split_at_wait(ptx_of(step, step_key, tmp_path / "step"), middles=3)
    assert not WRITES.search(before) and WRITES.search(after)


def test_a_staged_kernel_waits_once(tmp_path):
    variant = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_staged_sm90"
    before, _ = split_at_wait(ptx_of(h200_kernel(variant), key(variant, tokens=4), tmp_path))
    assert not WRITES.search(before)


def test_without_pdl_the_kernels_have_no_grid_dependency(tmp_path):
    variant = "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"
    text = ptx_of(h200_kernel(variant), key(variant, pdl=False, **CORE), tmp_path)
    assert "griddepcontrol" not in text


# --- enable_pdl, checked and keyed ---


def test_enable_pdl_is_checked_and_left_to_the_dispatch_when_unset():
    args = make_args()
    assert check_call(INFO, **on_fake_cuda(args)).pdl is None
    assert check_call(INFO, **on_fake_cuda(dict(args, enable_pdl=True))).pdl is True
    assert check_call(INFO, **on_fake_cuda(dict(args, enable_pdl=False))).pdl is False
    with pytest.raises(TypeError, match=r"enable_pdl: expected a bool or None, got int"):
        check_call(INFO, **on_fake_cuda(dict(args, enable_pdl=1)))


def test_the_build_and_warmup_forms_key_pdl():
    base = key("kl_bf16_tv64_ilp8_vec8_tpg16_sm90", pdl=False)
    assert replace(base, pdl=True) != base
    spec = load_spec(ROOT / "specs" / "h200.yaml")
    assert {form.pdl for form in spec_forms(spec.build)} == {None}
    both = spec.build.model_copy(update={"pdl": (False, True)})
    assert {form.pdl for form in spec_forms(both)} == {False, True}
    assert len(spec_forms(both)) == 2 * len(spec_forms(spec.build))


def test_an_unset_enable_pdl_takes_the_rules_pdl():
    import generated.h200 as h200
    from gdngen.geometry import Geometry

    geometry = Geometry(name="qwen3.5", H=16, HV=64, K=128, V=128)
    rules = {rule.pdl: rule for rule in h200.dispatch.TABLE}
    assert False in rules, "h200 has rules that hold PDL off"
    for form_pdl, rule in ((None, rules[False]), (None, rules[True]), (True, rules[False])):
        form = Form(mode="update", index_dtype="int32", pdl=form_pdl)
        (made,) = form.keys(rule, "sm_90a", 1, geometry, rule.state_dtype)
        assert made.pdl == (rule.pdl if form_pdl is None else form_pdl)


def test_a_row_names_pdl_only_where_it_is_off():
    import generated.h200 as h200
    from gdngen.dispatch import row

    text = (ROOT / "generated" / "h200" / "dispatch.py").read_text()
    tables = (h200.dispatch.AHEAD, h200.dispatch.TABLE, *h200.dispatch.TABLES.values())
    ahead = len(h200.dispatch.AHEAD)
    # each row once: AHEAD, and the rows a table holds before it (docs/design.md, "Tuning the
    # decode core")
    lead = [rule for table in tables[1:] for rule in table[: table.index(h200.dispatch.AHEAD[0])]]
    off = [rule for rule in (*h200.dispatch.AHEAD, *lead) if not rule.pdl]
    assert ahead and text.count(", pdl=False),") == len(off) > 0 and "pdl=True" not in text
    with pytest.raises(TypeError, match="unexpected keyword"):
        row(*[None] * 3, speed=1)


# --- the host's record ---


@pytest.fixture
def stream(monkeypatch):
    """The current stream's handle, as the tests set it."""
    current = {"handle": 1}
    monkeypatch.setattr(pdl_module, "current_stream_handle", lambda device: current["handle"])
    return current


def launch(record: StreamWrites, pool, conv=None, pdl=True, device=0) -> int:
    return record.launch_pdl(pdl, device, pool, span_bytes(pool), conv, span_bytes(conv))


def test_a_call_after_a_call_on_another_pool_overlaps_it(stream):
    record = StreamWrites()
    first, second = torch.zeros(4, 8), torch.zeros(4, 8)
    assert launch(record, first) == 1  # nothing recorded before it
    assert launch(record, second) == 1
    assert launch(record, first) == 1  # the call before wrote the other pool


def test_a_call_right_after_a_call_on_its_pool_waits_in_full(stream):
    record = StreamWrites()
    pool = torch.zeros(4, 8)
    launch(record, pool)
    assert launch(record, pool) == 0
    # a call without PDL is recorded too: the next call on its pool must not overlap it
    launch(record, pool, pdl=False)
    assert launch(record, pool) == 0


def test_overlapping_views_count_as_one_pool_and_disjoint_ones_do_not(stream):
    record = StreamWrites()
    buffer = torch.zeros(10, 8)
    launch(record, buffer[:5])
    assert launch(record, buffer[5:]) == 1  # SGLang-like layers: one buffer, disjoint views
    assert launch(record, buffer[4:6]) == 0


def test_the_conv_pool_counts(stream):
    record = StreamWrites()
    conv = torch.zeros(4, 3, 16).transpose(1, 2)
    launch(record, torch.zeros(4, 8), conv)
    assert launch(record, torch.zeros(4, 8), conv) == 0


def test_streams_and_devices_are_apart(stream):
    record = StreamWrites()
    pool = torch.zeros(4, 8)
    launch(record, pool)
    stream["handle"] = 2
    assert launch(record, pool) == 1  # another stream: the stream orders nothing between them
    assert launch(record, pool, device=1) == 1
    stream["handle"] = 1
    assert launch(record, pool) == 0


def test_span_bytes():
    assert span_bytes(None) == 0
    assert span_bytes(torch.zeros(3, 4)) == 48
    assert span_bytes(torch.zeros(3, 4)[:, :2]) == (2 * 4 + 1 + 1) * 4
    assert span_bytes(torch.zeros(0, 4)) == 0
