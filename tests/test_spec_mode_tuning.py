"""The tuning's "spec" call form (vLLM's per-token slot table, every token's state stored):
the cells it times, the check it makes before timing, and the dispatch rules its cells give."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest
import torch

from gdngen.dispatch import CallShape
from gdngen.dispatch.measured import measured_rules
from gdngen.dispatch.rules import FirstMatch
from gdngen.measure.check import check_packed_against_reference
from gdngen.problem import PackedProblem, Problem
from gdngen.reference.decode import reference_call
from gdngen.tune.run import cell_problem
from gdngen.tune.tuning_file import Cell, CellMode, TuningFile, dump_tuning, read_tuning
from tests.spec_helpers import ROOT

DIMS = (128, 128)
DENSE, PER_TOKEN = "dense_variant", "per_token_variant"


def _cell(mode: str, T: int, batch: int, fast: str, slow: str) -> Cell:
    return Cell(
        layout="k_last", state_dtype="int8", tokens=T, mode=mode, HV=64, batch=batch,
        times_us={fast: 10.0, slow: 20.0},
    )  # fmt: skip


def _shape(T: int, batch: int, per_token: bool) -> CallShape:
    return CallShape(
        "k_last", "int8", T, batch * 64, per_token, DIMS, packed=per_token,
        per_token_slots=per_token,
    )  # fmt: skip


def test_every_cell_mode_reads_back_from_its_file(tmp_path):
    # a tuning file groups its cells by mode, and refuses a group of a mode it does not know
    # (core cells, whose timings are of plans, have their own: tests/test_core_tuning.py)
    modes = sorted(mode for mode in get_args(CellMode) if mode != "core")
    cells = [_cell(mode, 2, 64, DENSE, PER_TOKEN) for mode in modes]
    tuning = TuningFile(
        target="h200", sm="sm_90a", gpu="NVIDIA H200", date="2026-11-29",
        command="gdngen tune specs/h200.yaml --modes spec", variants_sha256={},
        copy_bw_tbps=4.2, cells=cells,
    )  # fmt: skip
    path = tmp_path / "h200.tuning.yaml"
    path.write_text(dump_tuning(tuning))
    assert sorted(read_tuning(path).cells, key=lambda c: c.mode) == cells


@pytest.fixture
def rules():
    cells = [_cell("update", T, B, DENSE, PER_TOKEN) for T in (1, 2, 4) for B in (1, 64)]
    cells += [_cell("spec", T, B, PER_TOKEN, DENSE) for T in (2, 4) for B in (1, 64)]
    return measured_rules(cells, [("k_last", "int8")], 8, DIMS)


def test_spec_cells_give_per_token_rules_ahead_of_the_pairs_others(rules):
    spec_rules = [r for r in rules if r.per_token_slots]
    assert spec_rules and all(r.use == PER_TOKEN for r in spec_rules)
    assert all(r.intermediate == "yes" and "/spec/" in r.source for r in spec_rules)
    first_other = next(i for i, r in enumerate(rules) if not r.per_token_slots)
    assert all(rules.index(r) < first_other for r in spec_rules)
    # from the first measured T on: a per-token call of one token is a dense row's call
    assert min(r.tokens.lo for r in spec_rules) == 2


@pytest.mark.parametrize("T", [2, 3, 4, 8])
@pytest.mark.parametrize("batch", [1, 7, 64, 300])
def test_per_token_calls_take_the_spec_pick_and_the_rest_the_update_pick(rules, T, batch):
    first = FirstMatch(rules)
    assert first(_shape(T, batch, per_token=True)).use == PER_TOKEN
    assert first(_shape(T, batch, per_token=False)).use == DENSE
    assert first(_shape(1, batch, per_token=False)).use == DENSE


def test_a_spec_cell_times_vllms_per_token_form():
    class Geometry:
        H, K, V = 16, 128, 128

    problem = cell_problem("spec", 4, 8, Geometry, 32, "k_last", "int8")
    assert isinstance(problem, PackedProblem)
    assert (problem.sequences, problem.tokens, problem.HV, problem.slots) == (4, 8, 32, "per_token")
    assert problem.uniform_seqlen and problem.state_dtype == "int8"
    # one state read and T stored a sequence: 9 states' bytes besides the tokens' io
    state = 4 * 32 * 128 * 128 * (1 + 4 / 128)
    io = 4 * 8 * (2 * 16 * 128 + 2 * 32 * 128 + 2 * 32) * 2
    assert problem.moved_bytes() == int(state * 9 + io)
    update = cell_problem("update", 4, 8, Geometry, 32, "k_last", "bf16")
    assert isinstance(update, Problem) and update.cache_steps is None


class _ReferenceRun:
    """A bound call whose run is the float64 reference, rounded as a kernel stores it; with
    ``corrupt``, one stored state of the last sequence is off by a tenth of the state."""

    def __init__(self, problem: PackedProblem, args: dict, corrupt: bool = False):
        self.problem, self.args, self.corrupt = problem, args, corrupt
        self.output = torch.empty(args["v"].shape, dtype=torch.float64)

    def run(self):
        a = self.args
        expected = reference_call(
            a["q"], a["k"], a["v"], a["initial_state"], a["A_log"], a["a"], a["dt_bias"],
            a["b"], read_slots=a["initial_state_indices"], null_slot=a["null_slot"],
            cu_seqlens=a["cu_seqlens"], num_accepted=a["num_accepted_tokens"],
            state_scales=a.get("state_scales"),
        )  # fmt: skip
        self.output.copy_(expected.output)
        a["initial_state"].copy_(expected.pool)
        if expected.scales is not None:
            a["state_scales"].copy_(expected.scales)
        if self.corrupt:
            slot = a["initial_state_indices"][-1, -1]
            scales = a.get("state_scales")
            target = a["initial_state"] if scales is None else scales
            target[slot] += 0.1 * target[slot].abs().max()

    def read_output(self):
        return self.output


@pytest.mark.parametrize("seed, state_dtype", [(0, "bf16"), (1, "bf16"), (2, "int8")])
def test_the_packed_check_passes_the_reference_and_catches_a_wrong_state(seed, state_dtype):
    problem = PackedProblem(
        sequences=9, tokens=3, H=2, HV=4, K=32, V=32, uniform_seqlen=True, seed=seed,
        state_dtype=state_dtype,
    )  # fmt: skip
    args = problem.make("cpu")
    good = check_packed_against_reference(problem, args, _ReferenceRun(problem, args))
    # the reference against itself: its states rounded to bf16, or int8 rows (half a step of
    # amax / 127 a value) against the unrounded float64 states the check's reference keeps
    assert good < (2**-7 if state_dtype == "bf16" else 0.07)
    args = problem.make("cpu")
    bad = _ReferenceRun(problem, args, corrupt=True)
    assert check_packed_against_reference(problem, args, bad) > 2**-5


def test_tune_refuses_a_mode_the_grid_does_not_time():
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "tune", "specs/h200.yaml", "--modes", "spec,draft"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--modes ['draft']" in run.stderr and "tuning.modes" in run.stderr
