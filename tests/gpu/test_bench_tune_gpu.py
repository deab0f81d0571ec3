"""`gdngen bench` and `gdngen tune` end to end on a small grid (H100/H200)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gdngen.spec import parse_spec
from gdngen.tune.run import retime_names
from gdngen.dispatch import core_rules, measured_rules
from gdngen.tune.tuning_file import load_tuning

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _gdngen(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdngen", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_small_grid(tmp_path):
    out = tmp_path / "small"
    run = _gdngen(
        "bench", "--tokens", "1,2", "--batch", "1,3", "--hv", "32", "--layout", "k_last",
        "--state-dtype", "bf16", "--mode", "update,verify", "--replays", "3", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "[   1/" in run.stderr  # progress display
    results = json.loads(Path(f"{out}.json").read_text())["results"]
    ours = [r for r in results if r["impl"] == "gdngen"]
    assert len(ours) == 2 + 2 + 2  # T=1 update, T=2 update and verify, for B = 1 and 3
    for r in ours:
        assert r["status"] == "ok" and r["us"] > 0 and 0 < r["sol"] < 1.5, r
        assert r["check_error"] < 5e-3 and r["variant"], r
    peers = {r["impl"] for r in results} - {"gdngen"}
    assert peers == {"flashinfer", "fla"}  # reported even where missing: status says why
    table = Path(f"{out}.md").read_text()
    assert "### K-last [B,HV,V,K], bf16 state, T=2, verify" in table and "copy bandwidth" in table


def test_tune_small_grid_feeds_emit(tmp_path):
    data = yaml.safe_load((ROOT / "specs" / "h200.yaml").read_text())
    data["tuning"] = {
        "gpu": "NVIDIA",
        "tokens": [1, 2],
        "batch": [1, 4],
        "heads": [32],
        "modes": ["update", "verify"],
    }
    spec_path = tmp_path / "h200.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "h200.tuning.yaml"
    run = _gdngen(
        "tune", str(spec_path), "--pairs", "k_last/bf16", "--replays", "3", "--out", str(out)
    )
    assert run.returncode == 0, run.stderr
    spec = parse_spec(spec_path.read_text(), str(spec_path))
    tuning = load_tuning(out, spec)
    assert len(tuning.cells) == 2 * (1 + 2)  # B in {1, 4}; T=1 update, T=2 update and verify
    for cell in tuning.cells:
        assert cell.times_us and all(us > 0 for us in cell.times_us.values())
    assert not tuning.stale
    rules = measured_rules(
        tuning.cells, spec.served, spec.features.max_tokens, spec.tuning_head_dims
    )
    assert {rule.intermediate for rule in rules} == {"no", "yes"}

    # --retime: a second process times each cell's contenders again and adds that timing
    run = _gdngen(
        "tune", str(spec_path), "--pairs", "k_last/bf16", "--replays", "3", "--out", str(out),
        "--retime",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    again = load_tuning(out, spec)
    assert (again.tuning.date, again.tuning.command) == (tuning.tuning.date, tuning.tuning.command)
    assert len(again.tuning.retimed) == 1 and "--retime" in again.tuning.retimed[0]
    before = {(c.tokens, c.mode, c.batch): c for c in tuning.cells}
    retimed = 0
    for cell in again.cells:
        first = before[(cell.tokens, cell.mode, cell.batch)]
        assert cell.times_us == first.times_us
        names = retime_names(first, spec)
        if len(names) < 2:
            assert cell.retimed_us == []
        else:
            (timing,) = cell.retimed_us
            assert sorted(timing) == sorted(names) and all(us > 0 for us in timing.values())
            retimed += 1
    assert retimed > 0
    measured_rules(again.cells, spec.served, spec.features.max_tokens, spec.tuning_head_dims)


def test_tune_spec_mode_times_the_per_token_form_and_feeds_its_rules(tmp_path):
    """vLLM's per-token slot form (`--modes spec`): each candidate checked against the float64
    reference on that form, its cells merged beside the update cells, and its rules ahead."""
    data = yaml.safe_load((ROOT / "specs" / "h200.yaml").read_text())
    data["tuning"] = {
        "gpu": "NVIDIA", "tokens": [1, 4], "batch": [1, 16], "heads": [32],
        "modes": ["update", "spec"],
    }  # fmt: skip
    spec_path = tmp_path / "h200.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "h200.tuning.yaml"
    for modes in ("update", "spec"):
        run = _gdngen(
            "tune", str(spec_path), "--pairs", "k_last/int8", "--modes", modes, "--replays", "3",
            "--out", str(out), "--merge",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
    spec = parse_spec(spec_path.read_text(), str(spec_path))
    tuning = load_tuning(out, spec)
    got = sorted((c.mode, c.tokens, c.batch) for c in tuning.cells)
    assert got == sorted(
        [("update", t, b) for t in (1, 4) for b in (1, 16)] + [("spec", 4, b) for b in (1, 16)]
    )
    rules = measured_rules(
        tuning.cells, spec.served, spec.features.max_tokens, spec.tuning_head_dims
    )
    per_token = [r for r in rules if r.per_token_slots]
    assert per_token and rules[: len(per_token)] == per_token
    assert all(r.tokens.lo == 4 and r.intermediate == "yes" for r in per_token)


def test_bench_times_the_dispatched_call_beside_every_candidate(tmp_path):
    out = tmp_path / "side"
    run = _gdngen(
        "bench", "--tokens", "1", "--batch", "2,64", "--hv", "64", "--layout", "k_last",
        "--state-dtype", "fp32", "--variants", "candidates", "--peers", "none", "--replays", "10",
        "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    results = json.loads(Path(f"{out}.json").read_text())["results"]
    for batch in (2, 64):
        cell = {r["impl"]: r for r in results if r["batch"] == batch}
        ours = cell.pop("gdngen")
        assert len(cell) > 1 and all(r["status"] == "ok" and r["us"] > 0 for r in cell.values())
        # the same kernel, timed side by side on the same inputs, reads the same
        assert abs(cell[ours["variant"]]["us"] / ours["us"] - 1) < 0.05, (ours, cell)
    table = Path(f"{out}.md").read_text()
    assert "vs fastest" in table and "all tables:" in table


def test_two_tune_processes_share_the_gpu_by_turns(tmp_path):
    data = yaml.safe_load((ROOT / "specs" / "h200.yaml").read_text())
    data["tuning"] = {
        "gpu": "NVIDIA",
        "tokens": [1],
        "batch": [1, 4],
        "heads": [32],
        "modes": ["update"],
    }
    spec_path = tmp_path / "h200.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    lock = tmp_path / "gpu.lock"
    pairs = ("k_last/bf16", "v_last/fp32")
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "gdngen", "tune", str(spec_path), "--pairs", pair,
             "--replays", "3", "--gpu-lock", str(lock), "--out", str(tmp_path / f"{index}.yaml")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for index, pair in enumerate(pairs)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr
    spec = parse_spec(spec_path.read_text(), str(spec_path))
    for index, pair in enumerate(pairs):
        tuning = load_tuning(tmp_path / f"{index}.yaml", spec)
        assert {f"{c.layout}/{c.state_dtype}" for c in tuning.cells} == {pair}
        assert sorted(c.batch for c in tuning.cells) == [1, 4]
        for cell in tuning.cells:
            assert len(cell.times_us) > 1 and all(us > 0 for us in cell.times_us.values())


def test_tune_core_grid_feeds_emit(tmp_path):
    # The decode core's grid, small: both plans of every bf16 candidate at T = 1 and 2 (vLLM's
    # per-token form), the steps plan, and at T = 1, B*HV 1024 the held rule's plan without PDL
    # (specs/h200.yaml holds PDL off there), checked against the float64 reference and timed,
    # then its rules.
    data = yaml.safe_load((ROOT / "specs" / "h200.yaml").read_text())
    data["tuning"]["gpu"] = "NVIDIA"
    data["tuning"]["other_gpus"] = []
    data["tuning"]["core"] = {
        "pairs": ["k_last/bf16"], "tokens": [1, 2], "batch": [1, 32], "heads": [32],
        "steps": True,
    }  # fmt: skip
    spec_path = tmp_path / "h200.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "h200.tuning.yaml"
    run = _gdngen("tune", str(spec_path), "--core", "--replays", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr
    spec = parse_spec(spec_path.read_text(), str(spec_path))
    tuning = load_tuning(out, spec)
    assert not tuning.stale and len(tuning.cells) == 4
    plans = 2 * len(spec.core_candidates("k_last", "bf16")) + 1
    for cell in tuning.cells:
        held = cell.tokens == 1 and cell.batch * cell.HV >= 1024
        assert cell.mode == "core" and len(cell.times_us) == plans + held
        assert sum(name.startswith("steps:") for name in cell.times_us) == 1
        assert sum(name.startswith("nopdl:") for name in cell.times_us) == held
        assert all(us > 0 for us in cell.times_us.values())
    rules = core_rules(tuning.cells, spec.tuning_head_dims)
    assert rules and all(rule.conv1d and rule.gated_norm for rule in rules)
    assert {(rule.tokens.lo, rule.tokens.hi) for rule in rules} == {(1, 1), (2, 2)}
