"""The fused MTP bench (gdngen.bench.mtp) without a GPU: its arguments and cells, vLLM's inputs it
draws, the check that refuses to time a cell whose two calls disagree (on stand-in calls), the
variant it reports, and its report from made-up timings. Where Triton is installed, its check
also runs vLLM's port in Triton's interpreter on the bench's own inputs
(tests/mtp_bench_interpret.py)."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdngen.bench import mtp
from gdngen.bench.mtp_inputs import (
    MtpCell,
    cell_grid,
    copy_for_check,
    mtp_set,
    parameters,
    written_slots,
)
from gdngen.bench.mtp_report import ADAPTER, PORT, TARGET_SPEEDUP, dump, join, markdown, summary
from gdngen.engines.vllm import VllmGdn
from gdngen.measure import agreement, environment
from gdngen.measure.summary import geometric_mean
from gdngen.measure.vllm_source import write_bundle
from tests.spec_helpers import ROOT
from tests.vllm_mtp import reference_gdn_decode

TINY = dict(H=2, K=16, V=16)


def tiny_set(tokens=3, state_dtype="fp32", batch=5, seed=0) -> dict:
    cell = MtpCell(batch=batch, tokens=tokens, HV=4, state_dtype=state_dtype, **TINY)
    return mtp_set(cell, parameters(cell, "cpu"), seed, "cpu")


# -- arguments and cells -------------------------------------------------------------------------


def test_the_default_grid_is_the_issues():
    args, cells = mtp.parse_args(["--out", "o"])
    assert len(cells) == 5 * 2 * 2 * 2
    assert {(c.batch, c.tokens, c.HV, c.state_dtype) for c in cells} == {
        (b, t, hv, d)
        for b in (1, 4, 16, 64, 256)
        for t in (2, 4)
        for hv in (32, 64)
        for d in ("bf16", "fp32")
    }
    assert all((c.H, c.K, c.V) == (16, 128, 128) for c in cells)
    # state dtype, then HV, then 1 + S, then batch
    assert [(c.state_dtype, c.HV, c.tokens, c.batch) for c in cells[:6]] == [
        ("bf16", 32, 2, 1), ("bf16", 32, 2, 4), ("bf16", 32, 2, 16), ("bf16", 32, 2, 64),
        ("bf16", 32, 2, 256), ("bf16", 32, 4, 1),
    ]  # fmt: skip
    assert {c.model for c in cells} == {"qwen3-next", "qwen3.5"}
    assert str(args.out) == "o" and args.target == "h200" and args.vllm_src is None


def test_a_narrowed_grid():
    _, cells = mtp.parse_args(
        ["--out", "o", "--batches", "8", "--tokens", "4", "--heads", "64", "--dtypes", "fp32"]
    )
    assert cells == [MtpCell(batch=8, tokens=4, HV=64, state_dtype="fp32")]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tokens", "9"], "tokens: expected 1 \\+ S in 1..8"),
        (["--heads", "24"], "HV: expected a multiple of H=16; got 24"),
        (["--dtypes", "fp16"], "state_dtype: expected one of"),
        (["--batches", "0"], "batch: expected at least one request"),
        (["--batches", "4,x"], "--batches: expected comma-separated integers"),
        ([], "the following arguments are required: --out"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        mtp.parse_args(argv + (["--out", "o"] if argv else []))
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_cells_bytes():
    cell = MtpCell(batch=4, tokens=2, HV=32, state_dtype="fp32")
    state = 32 * 128 * 128 * 4
    per_token = 2 * (2 * 16 * 128 + 32 * 128 + 2 * 32 * 128 + 2 * 32)
    assert cell.slots == 9
    assert cell.moved_bytes() == 4 * 3 * state + 8 * per_token
    assert cell.footprint_bytes() == 9 * state + 8 * per_token
    assert cell_grid([1], [2], [32], ["bf16"])[0].state_bytes() == state // 2


# -- vLLM's inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_the_inputs_are_vllms_plain_mtp_decode(tokens):
    N, HV, H, K, V = 5, 4, TINY["H"], TINY["K"], TINY["V"]
    s = tiny_set(tokens=tokens, state_dtype="bf16", batch=N)
    L, D = N * tokens, 2 * H * K + HV * V
    # rows and gate: views of one qkvz buffer, as the conv writes over its input
    assert s["mixed_qkv"].shape == (L, D) and s["mixed_qkv"].stride() == (D + HV * V, 1)
    assert s["output_gate"].shape == (L, HV, V)
    assert s["output_gate"].stride() == (D + HV * V, V, 1)
    assert s["output_gate"].data_ptr() == s["mixed_qkv"].data_ptr() + 2 * D
    # b and a: the halves of ba
    assert s["b"].shape == s["a"].shape == (L, HV) and s["a"].stride() == (2 * HV, 1)
    assert s["a"].data_ptr() == s["b"].data_ptr() + 2 * HV
    assert all(s[n].dtype == torch.bfloat16 for n in ("mixed_qkv", "a", "b", "output_gate", "out"))
    assert s["out"].shape == (L, HV, V) and s["out"].is_contiguous()
    assert s["state"].shape == (N * tokens + 1, HV, V, K) and s["state"].dtype == torch.bfloat16
    assert s["A_log"].dtype == s["dt_bias"].dtype == torch.float32
    assert s["norm_weight"].shape == (V,) and s["norm_weight"].dtype == torch.bfloat16
    # the table: dense int32, distinct slots, never the null block, all inside the pool
    table = s["state_indices"]
    assert table.shape == (N, tokens) and table.is_contiguous() and table.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(1, N * tokens + 1))
    assert torch.equal(written_slots(s), torch.arange(1, N * tokens + 1))
    assert s["cu_seqlens"].tolist() == [n * tokens for n in range(N + 1)]
    assert s["cu_seqlens"].dtype == s["num_accepted_tokens"].dtype == torch.int32
    assert set(s["num_accepted_tokens"].tolist()) == set(range(1, tokens + 1))
    assert s["scale"] == K**-0.5 and s["output_gate_activation"] == "silu"


def test_sets_differ_but_share_the_layers_weights():
    first, second = tiny_set(seed=0), tiny_set(seed=1)
    assert not torch.equal(first["mixed_qkv"], second["mixed_qkv"])
    assert not torch.equal(first["state_indices"], second["state_indices"])
    assert not torch.equal(first["num_accepted_tokens"], second["num_accepted_tokens"])
    assert torch.equal(first["A_log"], second["A_log"])
    assert torch.equal(tiny_set(seed=1)["state"], second["state"])  # drawn from the seed alone


def test_the_check_copies_what_a_call_writes():
    s = tiny_set()
    copy = copy_for_check(s)
    assert copy["state"].data_ptr() != s["state"].data_ptr() and torch.equal(
        copy["state"], s["state"]
    )
    assert copy["out"].data_ptr() != s["out"].data_ptr() and copy["out"].isnan().all()
    assert copy["mixed_qkv"] is s["mixed_qkv"]


# -- the check before timing ---------------------------------------------------------------------


def stand_in_op(**s):
    """A call that writes what the op writes, from its inputs: each token's output row, and the
    state after each token in its column's slot (from the state at column accepted - 1)."""
    table, accepted, cu = s["state_indices"], s["num_accepted_tokens"], s["cu_seqlens"]
    state, out = s["state"], s["out"]
    for n in range(table.shape[0]):
        held = state[table[n, accepted[n] - 1]].double()
        for t in range(int(cu[n + 1] - cu[n])):
            row = int(cu[n]) + t
            gate = s["output_gate"][row].double()
            held = 0.9 * held + s["a"][row].double()[:, None, None]
            out[row] = (gate * held.mean(-1)).to(out.dtype)
            state[table[n, t]] = held.to(state.dtype)
    return out


def off_by(scale):
    def op(**s):
        stand_in_op(**s)
        s["out"].mul_(scale)

    return op


def writes_elsewhere(**s):
    table = s["state_indices"].clone()
    table[0, 0] = s["state"].shape[0] - 1 if table[0, 0] != s["state"].shape[0] - 1 else 1
    stand_in_op(**dict(s, state_indices=table))


def leaves_a_row(**s):
    out = s["out"].clone()
    stand_in_op(**s)
    s["out"][-1] = out[-1]


def touches_another_slot(**s):
    stand_in_op(**s)
    s["state"][0, 0, 0, 0] += 1  # the null block


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_the_same_results_agree(state_dtype):
    s = tiny_set(state_dtype=state_dtype)
    before = s["state"].clone()
    errors = mtp.check_cell(s, stand_in_op, stand_in_op, state_dtype)
    assert errors == dict(output=0.0, state=0.0)
    assert torch.equal(s["state"], before)  # the check ran on copies


def test_a_rounding_of_the_output_agrees():
    s = tiny_set()
    s["out"] = s["out"].float()  # so that the scale is not rounded away
    errors = mtp.check_cell(s, stand_in_op, off_by(1 + 2**-9), "fp32")
    assert errors["output"] == pytest.approx(2**-9, rel=1e-3) and errors["state"] == 0


@pytest.mark.parametrize(
    "adapter, message",
    [
        (off_by(1.02), "the outputs differ: relative error 0.02"),
        (writes_elsewhere, "gdngen adapter: the pool's changed slots are not the table's: 1 slot"),
        (
            touches_another_slot,
            "gdngen adapter: .* 1 other slot\\(s\\) changed \\(first \\[0\\]\\)",
        ),
        (leaves_a_row, "gdngen adapter: 1 output row\\(s\\) left unwritten"),
    ],
)
def test_a_cell_that_disagrees_is_refused(adapter, message):
    with pytest.raises(mtp.Disagreement, match=message):
        mtp.check_cell(tiny_set(), stand_in_op, adapter, "fp32")


def test_states_that_differ_past_the_tolerance_are_refused():
    def drifts(**s):
        stand_in_op(**s)
        s["state"][1:].mul_(1.001)

    s = tiny_set()
    with pytest.raises(mtp.Disagreement, match="the states differ"):
        mtp.check_cell(s, stand_in_op, drifts, "fp32")
    assert mtp.check_cell(s, stand_in_op, drifts, "bf16")["state"] == pytest.approx(1e-3, rel=0.1)


def test_changed_slots_and_their_error_go_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(agreement, "CHUNK_SLOTS", 3)
    before = torch.randn(10, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    after = before.clone()
    after[[2, 3, 7]] *= 1.5
    assert mtp.changed_slots(after, before).tolist() == [2, 3, 7]
    slots = torch.tensor([2, 3, 7, 9])
    after, before = after.double(), before.double()
    whole = float((after[slots] - before[slots]).norm() / before[slots].norm())
    assert mtp.slot_error(after, before, slots) == pytest.approx(whole, rel=1e-12)


# -- the variant ---------------------------------------------------------------------------------


def test_the_variant_is_the_one_prepare_names_for_the_adapters_call():
    prepared = {}

    class Target:
        @staticmethod
        def prepare(**arguments):
            prepared.update(arguments)
            return "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"

    s = tiny_set(tokens=4, state_dtype="bf16")
    assert mtp.dispatched_variant(Target, s) == "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"
    assert prepared["initial_state"] is s["state"]
    assert prepared["initial_state_indices"] is s["state_indices"]
    assert prepared["num_accepted_tokens"] is s["num_accepted_tokens"]
    assert prepared["mixed_qkv"] is s["mixed_qkv"] and prepared["z"] is s["output_gate"]
    assert prepared["output"] is s["out"] and prepared["norm_weight"] is s["norm_weight"]
    assert prepared["max_seqlen"] == 4 and prepared["null_slot"] == 0
    assert prepared["use_qk_l2norm"] is True and prepared["uniform_seqlen"] is False
    assert (prepared["norm_eps"], prepared["norm_activation"]) == (1e-6, "silu")


# -- a cell from end to end ----------------------------------------------------------------------


class StandInTarget:
    """A target whose gdn_decode is the float64 stand-in (tests.vllm_mtp), with a prepare."""

    def __init__(self, prepare=lambda **arguments: "kl_stand_in"):
        def gdn_decode(**arguments):
            return reference_gdn_decode(**arguments)

        gdn_decode.prepare = prepare
        self.gdn_decode = gdn_decode


def fake_timer(calls):
    """time_side_by_side without a GPU: each entry's calls run once, and made-up µs."""
    timed = {}
    for name, entry in calls.items():
        for call in entry:
            call()
        timed[name] = {PORT: 12.0, ADAPTER: 8.0}[name]
    return timed


def test_a_cell_from_its_sets_to_its_record(monkeypatch):
    monkeypatch.setattr(mtp, "rotating_sets", lambda set_bytes: 3)
    monkeypatch.setattr(mtp, "time_side_by_side", fake_timer)
    cell = MtpCell(batch=3, tokens=2, HV=4, state_dtype="fp32", **TINY)
    # vLLM's op as the adapter over the same stand-in: the two agree
    port = VllmGdn(reference_gdn_decode).fused_gdn_decode_post_conv_mtp
    record = mtp.run_cell(cell, StandInTarget(), port, device="cpu")
    assert record["sets"] == 3 and record["variant"] == "kl_stand_in"
    assert record["errors"]["output"] < 1e-2 and record["errors"]["state"] < 1e-12
    assert record["us"] == {PORT: 12.0, ADAPTER: 8.0} and record["ratio"] == 1.5
    assert (record["model"], record["HV"], record["tokens"], record["batch"]) == ("HV=4", 4, 2, 3)

    record = mtp.run_cell(cell, StandInTarget(), off_by(1.1), device="cpu")
    assert record["us"] is None and record["not_timed"].startswith("disagrees: the outputs differ")


def test_a_call_gdngen_refuses_is_reported_not_timed(monkeypatch):
    monkeypatch.setattr(mtp, "rotating_sets", lambda set_bytes: 2)

    def refuse(**arguments):
        raise ValueError("max_seqlen: at most 8")

    cell = MtpCell(batch=2, tokens=2, HV=4, state_dtype="bf16", **TINY)
    record = mtp.run_cell(cell, StandInTarget(refuse), stand_in_op, device="cpu")
    assert record["us"] is None
    assert record["not_timed"] == "gdngen refuses the call: max_seqlen: at most 8"


# -- the report ----------------------------------------------------------------------------------


def record(dtype, model, tokens, batch, port, adapter):
    us = {PORT: port, ADAPTER: adapter}
    return dict(
        batch=batch, tokens=tokens, HV=64 if model == "qwen3.5" else 32, model=model,
        state_dtype=dtype, variant="kl_x", errors=dict(output=1e-3, state=2e-3), us=us,
        ratio=port / adapter,
    )  # fmt: skip


ENV = dict(gpu="NVIDIA H100 80GB HBM3", sm="sm_90", driver="570.1", copy_GBps=3000.0,
           gdngen_commit="abc1234", vllm="0.33.0 (Triton 3.6.0)",
           versions={"torch": "2.9", "triton": "3.6.0", "nvidia-cutlass-dsl": "4.3", "fla": None})  # fmt: skip


def test_geometric_mean():
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([1.5]) == 1.5
    with pytest.raises(ValueError, match="values: expected at least one ratio"):
        geometric_mean([])


def test_the_report_of_a_run_that_meets_the_target():
    records = [
        record("bf16", "qwen3-next", 2, 1, 10.0, 5.0),
        record("bf16", "qwen3-next", 2, 4, 10.0, 8.0),
        record("bf16", "qwen3.5", 2, 1, 30.0, 20.0),
        record("fp32", "qwen3.5", 4, 256, 130.0, 100.0),
    ]
    figures = summary(records)
    assert [(g["state_dtype"], g["model"], g["cells"]) for g in figures["groups"]] == [
        ("bf16", "qwen3-next", 2), ("bf16", "qwen3.5", 1), ("fp32", "qwen3.5", 1),
    ]  # fmt: skip
    assert figures["groups"][0]["geomean"] == pytest.approx(math.sqrt(2.0 * 1.25))
    assert figures["overall"] == pytest.approx((2.0 * 1.25 * 1.5 * 1.3) ** 0.25)
    assert figures["overall"] >= TARGET_SPEEDUP and figures["target_met"]
    text = markdown(records, ENV)
    assert "GPU: NVIDIA H100 80GB HBM3 (sm_90, driver 570.1)" in text
    assert "torch 2.9, triton 3.6.0, nvidia-cutlass-dsl 4.3" in text and "fla" not in text
    assert "vLLM's port: 0.33.0 (Triton 3.6.0)" in text
    assert "| bf16 | qwen3-next | 32 | 2 | 4 | 10.00 | 8.00 | 1.25 | `kl_x` |" in text
    assert f"| all | all | 4 | {figures['overall']:.2f}x |" in text
    assert "Target (geometric mean >= 1.2x, no cell slower): met." in text
    saved = json.loads(dump(records, ENV))
    assert saved["records"] == records and saved["environment"] == ENV
    assert saved["summary"]["overall"] == pytest.approx(figures["overall"])


def test_a_slower_cell_or_one_not_timed_misses_the_target():
    fast = [record("bf16", "qwen3.5", 2, b, 30.0, 10.0) for b in (1, 4)]
    slower = fast + [record("bf16", "qwen3.5", 2, 16, 9.0, 10.0)]
    figures = summary(slower)
    assert figures["overall"] > TARGET_SPEEDUP and not figures["target_met"]
    assert figures["slower"] == ["bf16 qwen3.5 1+S=2 B=16"]
    assert "Cells where the adapter is slower: bf16 qwen3.5 1+S=2 B=16." in markdown(slower, ENV)

    refused = dict(batch=64, tokens=4, HV=32, model="qwen3-next", state_dtype="fp32",
                   variant="kl_y", us=None, not_timed="disagrees: the outputs differ")  # fmt: skip
    figures = summary(fast + [refused])
    assert figures["cells"] == 2 and not figures["target_met"]
    assert figures["untimed"] == ["fp32 qwen3-next 1+S=4 B=64"]
    text = markdown(fast + [refused], ENV)
    assert "| fp32 | qwen3-next | 32 | 4 | 64 | - | - | not timed: disagrees: the outputs" in text
    assert "Cells not timed: fp32 qwen3-next 1+S=4 B=64." in text

    assert summary([refused])["overall"] is None
    assert "not met." in markdown([refused], ENV)


def test_runs_split_over_commands_join_into_one_report(tmp_path, capsys):
    bf16 = [record("bf16", "qwen3.5", 2, b, 30.0, 20.0) for b in (1, 4)]
    fp32 = [record("fp32", "qwen3.5", 2, 1, 26.0, 20.0)]
    paths = []
    for name, records, uuid in (("a", bf16, "GPU-1"), ("b", fp32, "GPU-2")):
        paths.append(tmp_path / name / "mtp.json")
        paths[-1].parent.mkdir()
        paths[-1].write_text(dump(records, dict(ENV, gpu_uuid=uuid)))
    assert mtp.main(["--tables", *map(str, paths), "--out", str(tmp_path / "all")]) == 0
    joined = json.loads((tmp_path / "all" / "mtp.json").read_text())
    assert joined["records"] == bf16 + fp32
    assert [run["gpu_uuid"] for run in joined["environment"]["joined"]] == ["GPU-1", "GPU-2"]
    assert joined["summary"]["overall"] == pytest.approx((1.5 * 1.5 * 1.3) ** (1 / 3))
    text = (tmp_path / "all" / "mtp.md").read_text()
    assert "| fp32 | qwen3.5 | 1 | 1.30x |" in text and text in capsys.readouterr().out

    other_gpu = json.loads(dump(fp32, dict(ENV, gpu="NVIDIA H200")))
    with pytest.raises(ValueError, match="the runs are of different GPUs"):
        join([json.loads(paths[0].read_text()), other_gpu])
    with pytest.raises(ValueError, match="the cell bf16 qwen3.5 1\\+S=2 B=1 is in more than one"):
        join([json.loads(paths[0].read_text())] * 2)


def test_no_driver_without_nvidia_smi(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(environment.subprocess, "run", missing)
    assert environment.driver_version() is None


# -- vLLM's port in Triton's interpreter ---------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton's interpreter")
def test_the_check_passes_vllms_port_on_the_bench_inputs_in_the_interpreter(tmp_path):
    """The bench's inputs through vLLM's port (Triton's interpreter) and the adapter (over the
    float64 stand-in of gdn_decode): the port takes them (its asserts hold), and the bench's
    check finds the two in agreement (tests/mtp_bench_interpret.py)."""
    source = os.environ.get("GDNGEN_VLLM_SRC")
    if not source:
        wheels = sorted(Path("/tmp/vllm").glob("vllm-*.whl"))
        if not wheels:
            pytest.skip("no vLLM source: no wheel in /tmp/vllm, no GDNGEN_VLLM_SRC")
        source = str(tmp_path / "vllm-gdn.tar.xz")
        write_bundle(wheels[-1], source)
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.mtp_bench_interpret", source], cwd=ROOT,
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *python_path]),
             "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    cases = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(cases) == 4
    for case in cases:
        assert case["output"] < 1e-5, case  # fp32 outputs here: the order of the sums alone
        # a bf16 state: the interpreter rounds toward zero, the stand-in to nearest
        assert case["state"] < (
            mtp.STATE_TOLERANCE["bf16"] if case["state_dtype"] == "bf16" else 1e-6
        )
