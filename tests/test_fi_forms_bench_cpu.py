"""The FlashInfer forms bench (gdngen.bench.fi_forms) without a GPU: its arguments and grid, the
input sets it draws (tiny, on the CPU), the calls it makes of each side, the check that refuses to
time a cell whose two calls disagree (on synthetic outcomes, and on float64 stand-ins of both
sides that follow each form's meaning), a cell from end to end with made-up timings, and the
report and the join. Where FlashInfer is importable (``PYTHONPATH`` with its Python package), the
calls are also bound to FlashInfer's own signatures; gdngen's calls go through its checks."""

import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import generated.h200
from gdngen.bench import fi_forms
from gdngen.bench.fi_forms import CallFailed, Outcome, compare
from gdngen.bench.fi_forms_inputs import (
    BF16_MTP,
    FORMS,
    MTP,
    NULL_SLOT,
    PRETRANSPOSE,
    FiCell,
    cell_grid,
    cell_sets,
    defined_outputs,
    gdngen_arguments,
    outside_views,
    pool_slots,
    written_slots,
)
from gdngen.bench.fi_forms_peer import FlashInferForms, flashinfer_arguments
from gdngen.bench.fi_forms_report import FLASHINFER, GDNGEN, dump, join, markdown, summary
from gdngen.measure.agreement import STATE_TOLERANCE, Disagreement
from gdngen.reference import reference_decode
from gdngen.runtime.checks import check_call
from gdngen.runtime.kernel_args import KEYWORDS
from gdngen.runtime.launcher import DecodeCall
from tests.spec_helpers import ROOT
from tests.test_checks import on_fake_cuda

TINY = dict(H=2, K=16, V=16)
MTP_FORMS = [name for name, form in FORMS.items() if not form.one_token]
ALL = [(name, dtype) for name, form in FORMS.items() for dtype in form.dtypes]
IDS = [f"{name}-{dtype}" for name, dtype in ALL]


def tiny_cell(form, state_dtype="bf16", tokens=None, batch=9, HV=4) -> FiCell:
    if tokens is None:
        tokens = 1 if FORMS[form].one_token else 3
    return FiCell(form, state_dtype, HV, tokens, batch, **TINY)


def tiny_sets(cell: FiCell, count=3) -> list[dict]:
    slots = pool_slots([cell], lambda c: count)[cell.group]
    return cell_sets(cell, count, slots, "cpu")


# -- arguments and the grid ----------------------------------------------------------------------


def test_the_default_grid():
    args, cells = fi_forms.parse_args(["--out", "o"])
    assert str(args.out) == "o" and args.target == "h200" and args.tables is None
    assert [c.form_name for c in cells[:1]] == ["scatter"]
    for name, form in FORMS.items():
        mine = [c for c in cells if c.form_name == name]
        assert {(c.state_dtype, c.HV, c.tokens, c.batch) for c in mine} == {
            (dtype, HV, 1 if form.one_token else 4, batch)
            for dtype in form.dtypes
            for HV in (32, 64)
            for batch in (1, 4, 16, 64, 256)
        }, name
    assert all((c.H, c.K, c.V) == (16, 128, 128) for c in cells)
    assert len(cells) == 2 * 10 * 4 + 10 * 5  # four forms with bf16 and fp32, five bf16-only
    # form, then state dtype, then HV, then T, then batch
    assert [(c.state_dtype, c.HV, c.batch) for c in cells[:6]] == [
        ("bf16", 32, 1), ("bf16", 32, 4), ("bf16", 32, 16), ("bf16", 32, 64), ("bf16", 32, 256),
        ("bf16", 64, 1),
    ]  # fmt: skip
    # FlashInfer's fused recovery needs its wide_vec kernel (B*HV >= 128): B = 1 at both HV
    refused = [(c.form_name, c.HV, c.batch) for c in cells if c.flashinfer_refuses()]
    assert sorted(refused) == [
        ("accepted", 32, 1), ("accepted", 64, 1), ("recovery_steps", 32, 1),
        ("recovery_steps", 64, 1),
    ]  # fmt: skip
    assert FiCell("accepted", "bf16", 32, 4, 4).flashinfer_refuses() is None


def test_a_narrowed_grid():
    argv = ["--out", "o", "--forms", "scatter,pdl", "--batches", "8", "--tokens", "2,8"]
    _, cells = fi_forms.parse_args(argv + ["--heads", "64", "--dtypes", "fp32"])
    assert cells == [
        FiCell("scatter", "fp32", 64, 2, 8), FiCell("scatter", "fp32", 64, 8, 8),
        FiCell("pdl", "fp32", 64, 1, 8),
    ]  # fmt: skip
    # a bf16-only form takes only bf16 of --dtypes
    _, cells = fi_forms.parse_args(["--out", "o", "--forms", "accepted_verify", "--heads", "32"])
    assert {c.state_dtype for c in cells} == {"bf16"} and len(cells) == 5


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--forms", "scatter,nope"],
            "--forms: expected names of scatter, strided, .*; got 'nope'",
        ),
        (["--tokens", "9"], "tokens: expected T in 2..8 for the form scatter; got 9"),
        (["--tokens", "1"], "tokens: expected T in 2..8 for the form scatter; got 1"),
        (["--dtypes", "fp16"], "--dtypes: expected state dtypes of bf16, fp32; got \\['fp16'\\]"),
        (["--heads", "24"], "HV: expected a multiple of H=16; got 24"),
        (["--batches", "0"], "batch: expected at least one row"),
        (["--batches", "4,x"], "--batches: expected comma-separated integers"),
        (["--forms", "accepted", "--dtypes", "fp32"], "the grid is empty"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        fi_forms.parse_args(argv + ["--out", "o"])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_cell_names_what_is_wrong_with_it():
    with pytest.raises(ValueError, match="FlashInfer serves the form strided_scatter with bf16"):
        FiCell("strided_scatter", "fp32", 32, 4, 1)
    with pytest.raises(ValueError, match="tokens: the form strided is T = 1; got 2"):
        FiCell("strided", "bf16", 32, 2, 1)
    with pytest.raises(ValueError, match="form: expected one of"):
        FiCell("spec", "bf16", 32, 2, 1)


def test_a_cells_slots_and_bytes():
    scatter = FiCell("scatter", "fp32", 32, 4, 8)
    state = 32 * 128 * 128 * 4
    per_token = 2 * (2 * 16 * 128 + 2 * 32 * 128 + 2 * 32)
    assert scatter.slots_per_set() == 8 + 8 * 4
    assert scatter.moved_bytes() == (8 + 32) * state + 32 * per_token
    verify = FiCell("accepted_verify", "bf16", 32, 4, 8)
    assert verify.slots_per_set() == 8 and verify.moved_bytes() == 8 * state // 2 + 32 * per_token
    assert FiCell("negative_writes", "bf16", 32, 1, 8).slots_per_set() == 16
    assert FiCell("recovery_steps", "bf16", 32, 8, 8).recovery_steps == 4
    assert FiCell("recovery_steps", "bf16", 32, 2, 8).record()["recovery_steps"] == 1
    assert FiCell("pdl", "bf16", 32, 1, 16).record()["padded_rows"] == 2  # rows 3 and 11


def test_one_pool_size_for_every_batch_of_a_form_dtype_hv_and_t():
    cells = cell_grid(["strided", "scatter"], ["bf16"], [32], [2], [1, 4, 16])
    sets = {1: 40, 4: 10, 16: 2}
    sizes = pool_slots(cells, lambda cell: sets[cell.batch])
    # strided: 40 sets of 1 slot, 10 of 4, 2 of 16: 40 the most; scatter: 1 + T = 3 slots a row
    assert sizes == {
        ("strided", "bf16", 32, 1): 1 + 40 + 40 // 8 + 2,
        ("scatter", "bf16", 32, 2): 1 + 120 + 120 // 8 + 2,
    }


# -- the input sets ------------------------------------------------------------------------------


@pytest.mark.parametrize("form,state_dtype", ALL, ids=IDS)
def test_the_sets_of_a_cell(form, state_dtype):
    cell = tiny_cell(form, state_dtype)
    B, T, HV = cell.batch, cell.tokens, cell.HV
    sets = tiny_sets(cell)
    slots = pool_slots([cell], lambda c: 3)[cell.group]
    first = sets[0]
    assert first["pool"].shape == (slots, HV, 16, 16)
    assert first["pool"].dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[state_dtype]
    for s in sets:
        assert s["pool"] is first["pool"] and s["buffer"] is first["buffer"]  # one pool
        assert s["A_log"] is first["A_log"] and s["dt_bias"] is first["dt_bias"]
        assert s["q"].shape == s["k"].shape == (B, T, 2, 16) and s["v"].shape == (B, T, HV, 16)
        assert s["a"].shape == s["b"].shape == (B, T, HV) and s["out"].shape == (B, T, HV, 16)
        assert all(s[n].dtype == torch.bfloat16 for n in ("q", "k", "v", "a", "b", "out"))
        assert s["A_log"].dtype == s["dt_bias"].dtype == torch.float32 and s["scale"] == 0.25
        for name in ("reads", "writes", "scatter", "accepted"):
            assert s[name] is None or s[name].dtype == torch.int32, name
        assert s["reads"][3] == -1 and (s["reads"] >= 0).sum() == B - 1  # row 3 is padding
    # every slot a set names is its own, in the pool, never the null slot
    named = []
    for s in sets:
        live = s["reads"] >= 0
        named += s["reads"][live].tolist()
        if s["writes"] is not None:
            named += s["writes"][s["writes"] >= 0].tolist()
        if s["scatter"] is not None:
            named += s["scatter"][live].flatten().tolist()
            assert (s["scatter"][~live] == NULL_SLOT).all()
    assert len(named) == len(set(named)) and 0 < min(named) and max(named) < slots
    assert not torch.equal(sets[0]["q"], sets[1]["q"])


def test_negative_writes_and_accepted_steps():
    s = tiny_sets(tiny_cell("negative_writes"))[0]
    # rows 1, 5 (b % 4 == 1) store nothing; row 3 is padding
    assert [i for i, w in enumerate(s["writes"].tolist()) if w < 0] == [1, 3, 5]
    sets = tiny_sets(tiny_cell("accepted", tokens=4))
    assert sets[0]["accepted"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert sets[1]["accepted"].tolist() == [1, 2, 3, 0, 1, 2, 3, 0, 1]  # shifted by the set


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_a_strided_pool_is_a_view_with_spare_heads_rows_and_vectors(state_dtype):
    cell = tiny_cell("strided", state_dtype)
    s = tiny_sets(cell)[0]
    buffer, pool = s["buffer"], s["pool"]
    vector = 16 // pool.element_size()
    assert buffer.shape == (pool.shape[0], 8, 17, 16 + vector) and buffer.is_contiguous()
    assert pool.data_ptr() == buffer.data_ptr()
    assert pool.stride() == (8 * 17 * (16 + vector), 2 * 17 * (16 + vector), 16 + vector, 1)
    # the parts outside the view and the view cover the buffer once
    marks = torch.zeros(buffer.shape, dtype=torch.int32)
    marks[:, ::2, :16, :16] += 1
    for part in outside_views(cell, marks):
        part += 1
    assert (marks == 1).all()
    assert outside_views(tiny_cell("scatter", state_dtype), buffer) == []


def test_a_pool_too_small_is_refused():
    cell = tiny_cell("scatter")
    with pytest.raises(ValueError, match="slots: 3 sets of 36 slots need 108 besides the null"):
        cell_sets(cell, 3, 100, "cpu")


def test_what_each_form_writes_and_defines():
    B, T = 9, 4
    live = [b != 3 for b in range(B)]
    for form in FORMS:
        cell = tiny_cell(form, tokens=1 if FORMS[form].one_token else T)
        s = tiny_sets(cell)[0]
        written = written_slots(cell, s).tolist()
        defined = defined_outputs(cell, s)
        assert written == sorted(written)
        steps = s["accepted"].tolist() if s["accepted"] is not None else None
        if form in ("scatter", "strided_scatter"):
            want = [x for b in range(B) if live[b] for x in s["scatter"][b].tolist()]
        elif form == "accepted_scatter":
            want = [
                s["scatter"][b, t].item() for b in range(B) if live[b] for t in range(steps[b] + 1)
            ]
        elif form == "accepted_verify":
            want = []
        elif form == "negative_writes":
            want = [w for b, w in enumerate(s["writes"].tolist()) if live[b] and w >= 0]
        else:
            want = [r for r in s["reads"].tolist() if r >= 0]
        assert written == sorted(want), form
        if form == "accepted":
            want = [[live[b] and t > steps[b] for t in range(T)] for b in range(B)]
        elif form in ("accepted_verify", "accepted_scatter"):
            want = [[live[b] and t <= steps[b] for t in range(T)] for b in range(B)]
        elif form == "recovery_steps":
            want = [[live[b] and t >= 2 for t in range(T)] for b in range(B)]
        else:
            want = [[live[b]] * cell.tokens for b in range(B)]
        assert defined.tolist() == want, form


# -- the calls of both sides ---------------------------------------------------------------------


@pytest.mark.parametrize("form,state_dtype", ALL, ids=IDS)
def test_gdngens_call_names_the_form(form, state_dtype):
    cell = tiny_cell(form, state_dtype)
    s = tiny_sets(cell)[0]
    args = gdngen_arguments(cell, s)
    assert args["initial_state"] is s["pool"] and args["initial_state_indices"] is s["reads"]
    assert args["output"] is s["out"] and args["state"] is None and args["scale"] == 0.25
    extra = {
        "scatter": {"ssm_state_indices"}, "strided": set(),
        "strided_scatter": {"ssm_state_indices"},
        "negative_writes": {"output_state_indices"}, "pdl": {"enable_pdl"},
        "accepted": {"accepted_steps"}, "recovery_steps": {"recovery_steps"},
        "accepted_verify": {"accepted_steps", "disable_state_update"},
        "accepted_scatter": {"accepted_steps", "ssm_state_indices"},
    }[form]  # fmt: skip
    base = {"q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale", "output"}
    assert set(args) == base | {"initial_state", "initial_state_indices"} | extra
    assert args.get("enable_pdl", True) is True and args.get("disable_state_update", True) is True
    assert args.get("recovery_steps", 1) == 1  # T // 2 at T = 3
    # every keyword is gdn_decode's, or one of the two it is gaining (accepted/recovery steps)
    keywords = {keyword.name for keyword in KEYWORDS}
    assert set(args) - keywords <= {"accepted_steps", "recovery_steps"}


@pytest.mark.parametrize("form,state_dtype", ALL, ids=IDS)
def test_gdngens_checks_take_the_benchs_full_size_calls(form, state_dtype):
    """The call of a cell of the grid (H = 16, K = V = 128, HV = 32, B = 4) passes gdn_decode's
    checks, which take it as the form it is. The recovery forms' keywords are gdn_decode's once
    it takes them."""
    cell = FiCell(form, state_dtype, 32, 1 if FORMS[form].one_token else 4, 4)
    s = cell_sets(cell, 1, 1 + cell.slots_per_set() + 2, "cpu")[0]
    args = gdngen_arguments(cell, s)
    checked = set(inspect.signature(check_call).parameters)
    if set(args) - checked:
        pytest.skip(f"gdn_decode does not take {sorted(set(args) - checked)} on this tree")
    defaults = {n: v for n, v in DecodeCall.CHECKED.items() if n != "check_indices"}
    call = check_call(generated.h200.INFO, **on_fake_cuda(dict(defaults, **args)))
    assert (call.batch, call.tokens, call.HV, call.state_dtype) == (4, cell.tokens, 32, state_dtype)
    assert call.token_scatter == FORMS[form].scatter
    assert call.strided_state == FORMS[form].strided
    assert call.separate_write_slots == (FORMS[form].negative_writes or FORMS[form].scatter)


@pytest.mark.parametrize("form,state_dtype", ALL, ids=IDS)
def test_flashinfers_call_names_the_form(form, state_dtype):
    cell = tiny_cell(form, state_dtype)
    s = tiny_sets(cell)[0]
    entry, positional, keywords = flashinfer_arguments(cell, s, takes_pdl=False)
    assert entry == FORMS[form].entry(state_dtype)
    model = flashinfer_model(entry, positional, keywords)
    assert model["pool"] is s["pool"] and model["reads"] is s["reads"] and model["out"] is s["out"]
    assert model["writes"] is s["writes"] and model["scatter"] is s["scatter"]
    assert model["accepted"] is s["accepted"]
    assert model["verify"] == (form == "accepted_verify")
    assert model["recovery"] == cell.recovery_steps
    assert "enable_pdl" not in keywords
    if entry == PRETRANSPOSE:
        assert keywords["backend"] == "flashinfer" and keywords["use_qk_l2norm"] is True
        _, _, with_pdl = flashinfer_arguments(cell, s, takes_pdl=True)
        assert with_pdl.get("enable_pdl", False) is (form == "pdl")


def flashinfer_available() -> bool:
    try:
        return importlib.util.find_spec("flashinfer") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(
    not flashinfer_available(), reason="FlashInfer's Python package not on the path"
)
@pytest.mark.parametrize("form,state_dtype", ALL, ids=IDS)
def test_flashinfers_call_binds_to_its_signature(form, state_dtype):
    """Each call the bench makes binds to FlashInfer's own entry (FlashInfer 0.7.2's Python
    package: no GPU needed to read its signatures), and takes no keyword it does not have."""
    peer = FlashInferForms()
    assert peer.missing is None, peer.missing
    cell = tiny_cell(form, state_dtype)
    s = tiny_sets(cell)[0]
    entry, positional, keywords = flashinfer_arguments(cell, s, peer.takes_pdl)
    inspect.signature(peer.functions[entry]).bind(*positional, **keywords)
    call = peer.call(cell, s)
    assert call.func is peer.functions[entry] and set(call.keywords) == set(keywords)


def test_the_bench_imports_no_flashinfer():
    code = (
        "import sys, gdngen.bench.fi_forms; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'flashinfer'], 'imported'"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


# -- the check before timing: synthetic outcomes --------------------------------------------------


def outcome(output=None, changed=(2, 5), outside=(), states=None) -> Outcome:
    gen = torch.Generator().manual_seed(3)
    if output is None:
        output = torch.randn(3, 2, 4, 8, generator=gen, dtype=torch.float64)
    if states is None:
        states = torch.randn(2, 4, 8, 8, generator=gen, dtype=torch.float64)
    return Outcome(
        output=output, changed=torch.tensor(changed, dtype=torch.long),
        outside=torch.tensor(outside, dtype=torch.long), states=states,
    )  # fmt: skip


EXPECTED = torch.tensor([2, 5])
DEFINED = torch.tensor([[True, True], [True, False], [False, False]])


def test_equal_outcomes_agree():
    assert compare(outcome(), outcome(), EXPECTED, DEFINED, "fp32") == dict(output=0.0, state=0.0)


def test_undefined_outputs_are_not_compared():
    theirs, ours = outcome(), outcome()
    ours.output[1, 1] = float("nan")  # past the form's tokens
    ours.output[2] = 7.0  # a padded row
    assert compare(theirs, ours, EXPECTED, DEFINED, "fp32") == dict(output=0.0, state=0.0)


def test_outcomes_within_the_tolerances_agree():
    theirs = outcome()
    ours = outcome(output=theirs.output * (1 + 2**-9), states=theirs.states * (1 + 2**-9))
    errors = compare(theirs, ours, EXPECTED, DEFINED, "bf16")
    assert errors["output"] == pytest.approx(2**-9) and errors["state"] == pytest.approx(2**-9)
    assert fi_forms.OUTPUT_TOLERANCE == 2**-7 and STATE_TOLERANCE["bf16"] == 2**-7


def nan_at(row, t):
    out = outcome().output.clone()
    out[row, t, 0, 0] = float("nan")
    return out


@pytest.mark.parametrize("side", ["theirs", "ours"])
@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(output=outcome().output * 1.02),
            "the outputs differ: relative error 0\\.0(2|196) > 0\\.0078",
        ),
        (
            dict(states=outcome().states * 1.001),
            "the states differ: relative error 0\\.(001|000999) > 0\\.0001",
        ),
        (dict(output=nan_at(1, 0)), "{who}: 1 output row\\(s\\) of the form's left unwritten"),
        (dict(changed=(2,)), "{who}: .*: 1 slot\\(s\\) it writes unchanged \\(first \\[5\\]\\)"),
        (dict(changed=(2, 5, 7)), "{who}: .*, 1 other slot\\(s\\) changed \\(first \\[7\\]\\)"),
        (dict(outside=(9,)), "{who}: the buffer outside the pool's view changed in 1 slot"),
    ],
    ids=["output", "state", "unwritten", "missed", "stray", "outside"],
)
def test_a_disagreement_is_named_whichever_side_has_it(side, change, message):
    who = FLASHINFER if side == "theirs" else GDNGEN
    sides = dict(theirs=outcome(), ours=outcome())
    sides[side] = outcome(**change)
    with pytest.raises(Disagreement, match=message.format(who=who)):
        compare(sides["theirs"], sides["ours"], EXPECTED, DEFINED, "fp32")


def test_no_slots_written_and_no_outputs_defined_compare_to_nothing():
    theirs = outcome(changed=(), states=torch.zeros(0, 4, 8, 8))
    errors = compare(theirs, theirs, EXPECTED[:0], torch.zeros(3, 2, dtype=torch.bool), "bf16")
    assert errors == dict(output=0.0, state=0.0)


# -- the check before timing: float64 stand-ins of both sides -------------------------------------


def run_model(m: dict, padding_on_null_slot: bool) -> None:
    """A call of the form ``m`` describes (reads, writes, scatter, accepted, recovery, verify),
    in float64, written into m's pool and output: gdngen's meaning of each form, or, with
    ``padding_on_null_slot``, FlashInfer's bf16 kernels' (a padded row computed from and stored
    to the null slot, its outputs left; a -1 write slot stores to the null slot)."""
    reads = m["reads"].long()
    live = reads >= 0
    pool, out, T = m["pool"], m["out"], m["q"].shape[1]
    ref = reference_decode(
        m["q"], m["k"], m["v"], pool, m["A_log"], m["a"], m["dt_bias"], m["b"], scale=m["scale"],
        read_slots=reads.clamp(min=NULL_SLOT) if padding_on_null_slot else reads,
    )  # fmt: skip
    states = ref.intermediates
    for b in range(reads.numel()):
        if not live[b] and not padding_on_null_slot:
            out[b] = 0
            continue
        steps = range(T)
        if m["accepted"] is not None and (m["verify"] or m["scatter"] is not None):
            steps = range(int(m["accepted"][b]) + 1)
        boundary = None
        if m["accepted"] is not None and not m["verify"] and m["scatter"] is None:
            boundary = int(m["accepted"][b])
        elif m["recovery"]:
            boundary = m["recovery"] - 1
        for t in steps:
            if boundary is None or t > boundary:
                if live[b]:
                    out[b, t] = ref.output[b, t].to(out.dtype)
            if m["scatter"] is not None:
                pool[int(m["scatter"][b, t])] = states[b, t].to(pool.dtype)
        if m["scatter"] is not None or m["verify"]:
            continue
        slot = int(reads[b]) if m["writes"] is None else int(m["writes"][b])
        if slot < 0:
            if not padding_on_null_slot:
                continue
            slot = NULL_SLOT
        pool[slot] = states[b, T - 1 if boundary is None else boundary].to(pool.dtype)


def gdngen_model(**kw) -> dict:
    return dict(
        q=kw["q"], k=kw["k"], v=kw["v"], a=kw["a"], b=kw["b"], A_log=kw["A_log"],
        dt_bias=kw["dt_bias"], scale=kw["scale"], pool=kw["initial_state"], out=kw["output"],
        reads=kw["initial_state_indices"], writes=kw.get("output_state_indices"),
        scatter=kw.get("ssm_state_indices"), accepted=kw.get("accepted_steps"),
        recovery=kw.get("recovery_steps", 0), verify=kw.get("disable_state_update", False),
    )  # fmt: skip


def flashinfer_model(entry: str, positional: tuple, kw: dict) -> dict:
    """FlashInfer's call, read back as the form it asks for (its arguments by its own names)."""
    if entry == PRETRANSPOSE:
        q, k, v, _, A_log, a, dt_bias, b = positional
        pool, reads = kw["initial_state"], kw["initial_state_indices"]
    elif entry == MTP:
        q, k, v, pool, reads, A_log, a, dt_bias, b = positional
        assert kw["disable_state_update"] is False
    else:
        assert entry == BF16_MTP and positional == ()
        q, k, v, a, b = kw["q"], kw["k"], kw["v"], kw["a"], kw["b"]
        A_log, dt_bias = kw["A_log"], kw["dt_bias"]
        pool, reads = kw["initial_state_source"], kw["initial_state_indices"]
    return dict(
        q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=kw["scale"], pool=pool,
        out=kw["output"], reads=reads, writes=kw.get("output_state_indices"),
        scatter=kw.get("ssm_state_indices"), accepted=kw.get("accepted_steps"),
        recovery=kw.get("recovery_steps", 0), verify=kw.get("disable_state_update", False),
    )  # fmt: skip


class StandInTarget:
    """A target whose gdn_decode is the float64 model of the form its keywords name."""

    def __init__(self, prepare=lambda **kw: "kl_stand_in", run=run_model):
        def gdn_decode(**kw):
            run(gdngen_model(**kw), padding_on_null_slot=False)
            return kw["output"], kw["initial_state"]

        gdn_decode.prepare = prepare
        self.gdn_decode = gdn_decode


class StandInFlashInfer:
    """A FlashInferForms whose entries are the float64 model of the form its arguments name."""

    takes_pdl = False

    def __init__(self, run=run_model):
        self.run = run

    def call(self, cell, s):
        model = flashinfer_model(*flashinfer_arguments(cell, s, self.takes_pdl))
        return lambda: self.run(model, padding_on_null_slot=True)


def check(cell, flashinfer=None, target=None) -> dict:
    s = tiny_sets(cell, count=2)[0]
    flashinfer = flashinfer or StandInFlashInfer()
    target = target or StandInTarget()
    ours = lambda: target.gdn_decode(**gdngen_arguments(cell, s))  # noqa: E731
    before = s["buffer"].clone()
    errors = fi_forms.check_cell(cell, s, flashinfer.call(cell, s), ours)
    assert torch.equal(s["buffer"], before)  # the check puts the pool back
    return errors


@pytest.mark.parametrize("form,state_dtype", ALL, ids=IDS)
def test_both_sides_meaning_of_each_form_agree(form, state_dtype):
    """gdngen's and FlashInfer's meanings of the form, on one set, the pool and outputs in their
    own dtypes: each side changes exactly the form's slots (FlashInfer also the null slot), and
    the two agree within rounding."""
    errors = check(tiny_cell(form, state_dtype, tokens=None if FORMS[form].one_token else 4))
    assert errors["output"] < 2**-8 and errors["state"] < 2**-8


def skips_the_accepted_steps(m, padding_on_null_slot):
    run_model(dict(m, accepted=None), padding_on_null_slot)


def stores_the_final_state(m, padding_on_null_slot):
    run_model(dict(m, recovery=0), padding_on_null_slot)


def writes_the_spare_vector(m, padding_on_null_slot):
    run_model(m, padding_on_null_slot)
    m["pool"].as_strided((1,), (1,), m["pool"].storage_offset() + 16).fill_(9.0)


def leaves_the_last_token(m, padding_on_null_slot):
    run_model(m, padding_on_null_slot)
    m["out"][:, -1] = float("nan")


def writes_the_read_slots_too(m, padding_on_null_slot):
    run_model(m, padding_on_null_slot)
    live = m["reads"] >= 0
    m["pool"][m["reads"][live].long()] *= 2


@pytest.mark.parametrize("side", ["flashinfer", "gdngen"])
@pytest.mark.parametrize(
    "form, fault, message",
    [
        ("accepted", skips_the_accepted_steps, "the states differ"),
        ("recovery_steps", stores_the_final_state, "the states differ"),
        ("strided", writes_the_spare_vector, "the buffer outside the pool's view changed"),
        ("scatter", leaves_the_last_token, "output row\\(s\\) of the form's left unwritten"),
        ("scatter", writes_the_read_slots_too, "other slot\\(s\\) changed"),
    ],
    ids=["accepted", "recovery", "strided", "unwritten", "stray"],
)
def test_a_side_that_misreads_the_form_disagrees(side, form, fault, message):
    sides = dict(flashinfer=StandInFlashInfer(), target=StandInTarget())
    if side == "flashinfer":
        sides["flashinfer"] = StandInFlashInfer(run=fault)
    else:
        sides["target"] = StandInTarget(run=fault)
    with pytest.raises(Disagreement, match=message):
        check(tiny_cell(form, tokens=None if FORMS[form].one_token else 4), **sides)


def test_a_call_that_raises_is_named_with_its_side():
    def fails(m, padding_on_null_slot):
        raise AssertionError("recovery_steps>0 requires the wide_vec path")

    with pytest.raises(CallFailed, match="flashinfer's call fails: AssertionError: recovery_st"):
        check(tiny_cell("recovery_steps"), flashinfer=StandInFlashInfer(run=fails))
    with pytest.raises(CallFailed, match="gdngen's call fails: AssertionError"):
        check(tiny_cell("recovery_steps"), target=StandInTarget(run=fails))


# -- a cell from end to end ----------------------------------------------------------------------


def fake_timer(calls):
    """time_side_by_side without a GPU: each entry's calls run once, and made-up µs."""
    for entry in calls.values():
        for call in entry:
            call()
    return {FLASHINFER: 12.0, GDNGEN: 8.0}


def test_a_cell_from_its_sets_to_its_record(monkeypatch):
    monkeypatch.setattr(fi_forms, "rotating_sets", lambda set_bytes: 3)
    monkeypatch.setattr(fi_forms, "time_side_by_side", fake_timer)
    cell = tiny_cell("accepted", tokens=4, batch=40)  # B*HV = 160: FlashInfer serves it
    slots = pool_slots([cell], lambda c: 3)[cell.group]
    record = fi_forms.run_cell(cell, StandInTarget(), StandInFlashInfer(), slots, device="cpu")
    assert record["sets"] == 3 and record["pool_slots"] == slots
    assert record["variant"] == "kl_stand_in" and record["errors"]["output"] < 2**-8
    assert record["us"] == {FLASHINFER: 12.0, GDNGEN: 8.0} and record["ratio"] == 1.5
    assert (record["form"], record["tokens"], record["batch"], record["padded_rows"]) == (
        "accepted", 4, 40, 5,
    )  # fmt: skip
    assert record["seconds"] > 0 and "not_timed" not in record

    pdl = tiny_cell("pdl", batch=4)
    record = fi_forms.run_cell(pdl, StandInTarget(), StandInFlashInfer(), 40, device="cpu")
    assert record["flashinfer_pdl"] is False and record["ratio"] == 1.5


def test_a_cell_flashinfer_does_not_serve_is_skipped_before_any_input():
    cell = tiny_cell("recovery_steps", batch=1)  # B*HV = 4 < 128
    record = fi_forms.run_cell(cell, None, None, 0, device="cpu")
    assert record["us"] is None and "wide_vec kernel" in record["skipped"]
    assert fi_forms.exit_status([record]) == 0


def test_a_call_gdngen_refuses_or_a_disagreement_is_reported_not_timed(monkeypatch):
    monkeypatch.setattr(fi_forms, "rotating_sets", lambda set_bytes: 2)

    def refuse(**arguments):
        raise TypeError("prepare: unexpected keyword argument(s) ['accepted_steps']")

    cell = tiny_cell("accepted", tokens=4, batch=40)
    slots = pool_slots([cell], lambda c: 2)[cell.group]
    record = fi_forms.run_cell(cell, StandInTarget(refuse), StandInFlashInfer(), slots, "cpu")
    assert record["us"] is None and record["not_timed"] == (
        "gdngen refuses the call: prepare: unexpected keyword argument(s) ['accepted_steps']"
    )
    assert "variant" not in record and fi_forms.exit_status([record]) == 1

    wrong = StandInTarget(run=stores_the_final_state)
    record = fi_forms.run_cell(
        tiny_cell("recovery_steps", batch=40), wrong, StandInFlashInfer(), slots, "cpu"
    )
    assert record["not_timed"].startswith("disagrees: the states differ")


# -- the report ----------------------------------------------------------------------------------


def record(form, dtype, HV, tokens, batch, theirs, ours, **extra):
    us = {FLASHINFER: theirs, GDNGEN: ours}
    return dict(
        form=form, state_dtype=dtype, HV=HV, tokens=tokens, batch=batch, H=16, K=128, V=128,
        padded_rows=0, variant="kl_x", errors=dict(output=1e-3, state=2e-3), us=us,
        ratio=theirs / ours, **extra,
    )  # fmt: skip


ENV = dict(gpu="NVIDIA H100 80GB HBM3", sm="sm_90", driver="570.1", copy_GBps=3000.0,
           gdngen_commit="abc1234", flashinfer="0.7.2.post1",
           versions={"torch": "2.9", "nvidia-cutlass-dsl": "4.3", "fla-core": None})  # fmt: skip


def test_the_report_per_form_and_over_all():
    records = [
        record("scatter", "bf16", 32, 4, 1, 10.0, 5.0),
        record("scatter", "fp32", 32, 4, 1, 9.0, 10.0),
        record("pdl", "bf16", 64, 1, 16, 20.0, 10.0, flashinfer_pdl=False),
        dict(record("accepted", "bf16", 64, 4, 1, 1, 1), us=None, skipped="no wide_vec"),
        dict(record("accepted", "bf16", 64, 4, 4, 1, 1), us=None, not_timed="gdngen refuses"),
    ]
    figures = summary(records)
    scatter = figures["forms"]["scatter"]
    assert scatter["cells"] == 2 and scatter["geomean"] == pytest.approx((2.0 * 0.9) ** 0.5)
    assert scatter["slower"] == ["scatter fp32 HV=32 T=4 B=1"]
    assert figures["forms"]["accepted"] == dict(
        cells=0, slower=[], geomean=None, untimed=["accepted bf16 HV=64 T=4 B=4"],
        skipped=["accepted bf16 HV=64 T=4 B=1"],
    )  # fmt: skip
    assert figures["overall"]["cells"] == 3
    assert figures["overall"]["geomean"] == pytest.approx((2.0 * 0.9 * 2.0) ** (1 / 3))
    text = markdown(records, ENV)
    assert "GPU: NVIDIA H100 80GB HBM3 (sm_90, driver 570.1)" in text
    assert "FlashInfer 0.7.2.post1; versions: torch 2.9, nvidia-cutlass-dsl 4.3" in text
    assert "### scatter" in text and f"bf16: `{BF16_MTP}`, fp32: `{MTP}`" in text
    assert "| fp32 | 32 | 4 | 1 | 9.00 | 10.00 | 0.90 | `kl_x` | 0.001 | 0.002 |" in text
    assert (
        "scatter: 2 cells timed, 1 slower than FlashInfer, geometric mean FlashInfer / gdngen "
        "1.34x; slower: scatter fp32 HV=32 T=4 B=1." in text
    )
    assert "FlashInfer called without enable_pdl (its entry has no such keyword)." in text
    assert "| bf16 | 64 | 4 | 1 | - | - | skipped: no wide_vec | `kl_x` | - | - |" in text
    assert "| - | - | not timed: gdngen refuses |" in text
    assert "accepted: no cell timed; not timed: 1; not served by FlashInfer: 1." in text
    assert "| all | 3 | 1 | 1.53x |" in text
    assert "Cells not timed: accepted bf16 HV=64 T=4 B=4." in text
    saved = json.loads(dump(records, ENV))
    assert saved["records"] == records and saved["environment"] == ENV
    assert saved["summary"]["overall"]["cells"] == 3
    assert fi_forms.exit_status(records) == 1 and fi_forms.exit_status(records[:4]) == 0


def test_runs_split_over_commands_join_into_one_report(tmp_path, capsys):
    first = [record("strided", "bf16", 32, 1, b, 12.0, 10.0) for b in (1, 4)]
    second = [record("scatter", "fp32", 64, 4, 1, 26.0, 20.0)]
    paths = []
    for name, records, uuid in (("a", first, "GPU-1"), ("b", second, "GPU-2")):
        paths.append(tmp_path / name / "fi_forms.json")
        paths[-1].parent.mkdir()
        paths[-1].write_text(dump(records, dict(ENV, gpu_uuid=uuid)))
    out = tmp_path / "all"
    assert fi_forms.main(["--tables", *map(str, paths), "--out", str(out)]) == 0
    joined = json.loads((out / "fi_forms.json").read_text())
    assert joined["records"] == first + second
    assert [run["gpu_uuid"] for run in joined["environment"]["joined"]] == ["GPU-1", "GPU-2"]
    assert joined["summary"]["overall"]["geomean"] == pytest.approx((1.2 * 1.2 * 1.3) ** (1 / 3))
    text = (out / "fi_forms.md").read_text()
    assert "| strided | 2 | 0 | 1.20x |" in text and text in capsys.readouterr().out

    other_gpu = json.loads(dump(second, dict(ENV, gpu="NVIDIA H200")))
    with pytest.raises(ValueError, match="the runs are of different GPUs"):
        join([json.loads(paths[0].read_text()), other_gpu])
    with pytest.raises(ValueError, match="the cell strided bf16 HV=32 T=1 B=1 is in more than"):
        join([json.loads(paths[0].read_text())] * 2)


def doubles_the_outputs(m, padding_on_null_slot):
    run_model(m, padding_on_null_slot)
    m["out"].mul_(2)


@pytest.mark.parametrize("side", ["flashinfer", "gdngen"])
def test_a_disagreement_says_which_side_the_reference_backs(side):
    """Where the outputs differ, the message gives each side's error against the float64
    reference: the side that doubled its outputs is off by 1, the other by rounding."""
    sides = dict(flashinfer=StandInFlashInfer(), target=StandInTarget())
    if side == "flashinfer":
        sides["flashinfer"] = StandInFlashInfer(run=doubles_the_outputs)
    else:
        sides["target"] = StandInTarget(run=doubles_the_outputs)
    with pytest.raises(Disagreement) as caught:
        check(tiny_cell("scatter", tokens=4), **sides)
    found = re.search(r"reference: flashinfer ([\d.e+-]+), gdngen ([\d.e+-]+)", str(caught.value))
    assert found, str(caught.value)
    theirs, ours = float(found.group(1)), float(found.group(2))
    off, fine = (theirs, ours) if side == "flashinfer" else (ours, theirs)
    assert 0.9 < off < 1.1 and fine < 2**-7


def test_isolate_runs_each_form_in_a_process_and_joins_what_they_wrote(tmp_path, monkeypatch):
    """--isolate: one child per form with the other arguments as given; a child that dies
    (here: the scatter's, before writing anything) leaves the other forms' records, joined,
    and the run's status says it failed."""
    commands = []

    def child(command):
        commands.append(command)
        form, out = command[command.index("--forms") + 1], Path(command[command.index("--out") + 1])
        if form == "scatter":
            return subprocess.CompletedProcess(command, -6)
        out.mkdir(parents=True)
        (out / "fi_forms.json").write_text(dump([record(form, "bf16", 64, 1, 4, 12.0, 10.0)], ENV))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(fi_forms.subprocess, "run", child)
    argv = [
        "--isolate",
        "--forms",
        "strided,scatter,negative_writes",
        "--heads=64",
        "--out",
        str(tmp_path),
    ]
    assert fi_forms.main(argv) == 1
    assert [c[c.index("--forms") + 1] for c in commands] == [
        "strided",
        "scatter",
        "negative_writes",
    ]
    for command in commands:
        assert "--isolate" not in command and "--heads=64" in command
        assert command.count("--forms") == 1 and command.count("--out") == 1
    joined = json.loads((tmp_path / "fi_forms.json").read_text())
    assert [r["form"] for r in joined["records"]] == ["strided", "negative_writes"]
