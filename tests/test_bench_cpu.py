"""`gdngen bench` without a GPU: which variants it times beside the dispatched call, its
argument errors, and the dispatch columns of its report."""

import json
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import asdict, replace

import pytest

import generated.h200 as h200
from gdngen.bench.contenders import (
    ContenderError,
    pair_variants,
    picker,
    tuned_cell,
)
from gdngen.bench.report import (
    DISPATCH_TOLERANCE,
    dispatch_excess,
    dump_record,
    markdown,
)
from gdngen.bench.run import Result, grid
from gdngen.measure.environment import source_commit
from gdngen.problem import Problem
from gdngen.tune.tuning_file import Cell, TuningFile, dump_tuning, read_tuning
from gdngen.spec import load_spec
from tests.spec_helpers import ROOT

SPEC_VARIANTS = load_spec(ROOT / "specs" / "h200.yaml").variants_by_name


def _variants(prefix: str, K: int) -> list[str]:
    return [
        name
        for name in h200.VARIANTS
        if name.startswith(prefix) and SPEC_VARIANTS[name].head_k_dim == K
    ]


KL_BF16 = _variants("kl_bf16_", 128)
KL_FP32 = _variants("kl_fp32_", 128)


def _problem(**changes) -> Problem:
    base = Problem(
        batch=16, tokens=1, H=16, HV=64, K=128, V=128, layout="k_last", state_dtype="bf16",
        pool_size=16,
    )  # fmt: skip
    return base.with_(**changes)


def _tuning_file(tmp_path, times_us: dict[str, float], **cell) -> object:
    where = dict(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64, batch=16)
    where.update(cell)
    tuning = TuningFile(
        target="h200", sm="sm_90a", gpu="NVIDIA H100 80GB HBM3", date="2026-11-22",
        command="gdngen tune specs/h200.yaml", variants_sha256={"k_last/bf16": "0" * 16},
        copy_bw_tbps=2.95, versions={"torch": "2"}, cells=[Cell(**where, times_us=times_us)],
    )  # fmt: skip
    path = tmp_path / "h200.tuning.yaml"
    path.write_text(dump_tuning(tuning))
    return path


def test_problem_mode_names_the_two_served_modes_and_the_others():
    assert _problem().mode == "update"
    assert _problem(tokens=4, cache_steps=4, disable_state_update=True).mode == "verify"
    assert _problem(tokens=4, cache_steps=4).mode == "cache+update"
    assert _problem(disable_state_update=True).mode == "no-write"


def test_pair_variants_are_those_of_the_layout_dtype_and_head_dims():
    assert pair_variants(h200, "k_last", "bf16", (128, 128)) == KL_BF16
    assert pair_variants(h200, "k_last", "fp32", (128, 128)) == KL_FP32
    assert len(KL_BF16) > 1 and len(KL_FP32) > 1
    for K in (64, 256):
        assert pair_variants(h200, "k_last", "bf16", (K, K)) == _variants("kl_bf16_", K) != []
    # V must be a multiple of the kernel's tile: none of the K=64 kernels tiles V=64 by 128
    assert all(
        SPEC_VARIANTS[n].tile_v <= 64 for n in pair_variants(h200, "v_last", "bf16", (64, 64))
    )


def test_contenders_of_a_problem_at_other_head_dims_are_its_own_kernels(tmp_path):
    path = _tuning_file(tmp_path, {KL_BF16[0]: 10.0, KL_BF16[1]: 10.5}, HV=32)
    names, why = picker("contenders", h200, tuning_path=path)(_problem(HV=32, K=64, V=64))
    assert names == _variants("kl_bf16_", 64) and "head dims" in why


def test_candidates_follow_the_problem_pair():
    pick = picker("candidates", h200)
    assert pick(_problem())[0] == KL_BF16
    assert pick(_problem(state_dtype="fp32"))[0] == KL_FP32


def test_contenders_are_the_tuned_variants_within_the_margin_fastest_first(tmp_path):
    a, b, c, d = KL_BF16[:4]
    path = _tuning_file(tmp_path, {a: 10.0, b: 10.9, c: 11.1, d: 9.95})
    names, why = picker("contenders", h200, tuning_path=path, margin=0.10)(_problem())
    assert names == [d, a, b]  # c is 11.6% behind the best
    assert "within 10%" in why and path.name in why
    tight = picker("contenders", h200, tuning_path=path, margin=0.0)(_problem())[0]
    assert tight == [d]


def test_contenders_of_a_cell_the_tune_did_not_measure_are_every_candidate(tmp_path):
    path = _tuning_file(tmp_path, {KL_BF16[0]: 10.0})
    names, why = picker("contenders", h200, tuning_path=path)(_problem(HV=32))
    assert names == KL_BF16 and "not in the tuning file" in why


def test_contenders_of_a_batch_between_tuned_ones_are_those_of_its_neighbours(tmp_path):
    """B = 32 between tuned B = 16 and 64: the variants within the margin at either neighbour
    (each once, the lower neighbour's first); the batches further out do not count."""
    a, b, c, d = KL_BF16[:4]
    path = _tuning_file(tmp_path, {a: 10.0, b: 10.05, c: 12.0})
    tuning = read_tuning(path)
    at = dict(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64)
    more = [
        Cell(**at, batch=64, times_us={b: 20.0, c: 19.9, d: 25.0}),
        Cell(**at, batch=512, times_us={d: 100.0, a: 120.0}),
        Cell(**{**at, "mode": "verify"}, batch=32, times_us={d: 1.0}),
    ]
    path.write_text(dump_tuning(tuning.model_copy(update={"cells": [*tuning.cells, *more]})))
    pick = picker("contenders", h200, tuning_path=path, margin=0.01)
    names, why = pick(_problem(batch=32, pool_size=32))
    assert names == [a, b, c] and "B=16 and B=64" in why
    assert pick(_problem(batch=1024, pool_size=1024))[0] == [d]  # above every tuned batch


def test_contenders_drop_names_the_target_no_longer_has(tmp_path):
    path = _tuning_file(tmp_path, {"kl_bf16_gone_sm90": 9.0, KL_BF16[0]: 9.5})
    names, _ = picker("contenders", h200, tuning_path=path)(_problem())
    assert names == [KL_BF16[0]]


def test_tuned_cell_matches_every_coordinate(tmp_path):
    tuning = read_tuning(_tuning_file(tmp_path, {KL_BF16[0]: 10.0}))
    assert tuned_cell(tuning, _problem(), h200) is not None
    for change in (
        dict(HV=32), dict(batch=4, pool_size=4), dict(tokens=2), dict(state_dtype="fp32"),
        dict(tokens=1, cache_steps=1, disable_state_update=True),
    ):  # fmt: skip
        assert tuned_cell(tuning, _problem(**change), h200) is None, change


def test_tuned_cell_keeps_head_dims_apart(tmp_path):
    """A K = V = 256 problem at the base cell's coordinates takes the cell measured at its head
    dims, never the base's (whose variants are K = 128 kernels), and the reverse."""
    (k256,) = _variants("kl_bf16", 256)[:1]
    base = _tuning_file(tmp_path, {KL_BF16[0]: 10.0}, HV=32)
    at_256 = dict(HV=32, H=16, K=256, V=256)
    assert tuned_cell(read_tuning(base), _problem(**at_256), h200) is None
    assert tuned_cell(read_tuning(base), _problem(HV=32), h200) is not None
    other = tmp_path / "k256"
    other.mkdir()
    wide = read_tuning(_tuning_file(other, {k256: 20.0}, HV=32, K=256, V=256))
    assert tuned_cell(wide, _problem(**at_256), h200).times_us == {k256: 20.0}
    assert tuned_cell(wide, _problem(HV=32), h200) is None


def test_contenders_within_a_margin_break_ties_by_name():
    cell = Cell(
        layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64, batch=1,
        times_us={"b": 5.0, "a": 5.0, "c": 5.2, "d": 7.0},
    )  # fmt: skip
    assert cell.within(0.05) == ["a", "b", "c"]


def test_contenders_include_a_variant_near_the_best_of_a_later_timing():
    """A retimed cell: "d" was 40% behind at first, but within the margin in the retime."""
    cell = Cell(
        layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64, batch=1,
        times_us={"a": 5.0, "c": 5.2, "d": 7.0, "e": 9.0},
        retimed_us=[{"a": 7.4, "d": 7.1}],
    )  # fmt: skip
    assert cell.within(0.05) == ["a", "c", "d"]  # in the order of the first timing


@pytest.mark.parametrize(
    "choice, kwargs, message",
    [
        ("kl_bf16_nope_sm90", {}, "unknown variant(s) kl_bf16_nope_sm90"),
        ("contenders", {"tuning_path": None}, "needs the target's tuning file"),
        ("contenders", {"margin": 1.5}, "--contender-margin must be within [0, 1], got 1.5"),
    ],
)
def test_picker_refuses_bad_choices(tmp_path, choice, kwargs, message):
    kwargs.setdefault("tuning_path", _tuning_file(tmp_path, {KL_BF16[0]: 1.0}))
    with pytest.raises(ContenderError) as caught:
        picker(choice, h200, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variants", "nope"], "unknown variant(s) nope"),
        (["--variants", "contenders", "--tuning", "missing.yaml"], "missing.yaml does not exist"),
        (["--target", "b900"], "--target 'b900': no generated target generated/b900/"),
        (["--qk-heads", "8", "--hv", "16,12"], "must be multiples of --qk-heads 8; got [12]"),
        (["--head-dim", "96", "--hv", "32"], "h200 serves no geometry H=16 HV=32 K=V=96"),
        (["--head-dim", "64", "--hv", "32,64"], "no geometry H=16 HV=64 K=V=64; it serves"),
    ],
)
def test_cli_bench_argument_errors_come_before_any_gpu_work(args, message):
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "bench", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 2, run.stderr
    assert message in run.stderr, run.stderr


def _result(impl: str, us: float | None, variant: str | None = None, **where) -> Result:
    cell = dict(layout="k_last", state_dtype="bf16", mode="update", tokens=1, HV=64, batch=16)
    cell.update(where)
    return Result(impl=impl, variant=variant or impl, us=us, sol=0.5 if us else None, **cell)


META = {
    "gpu": "GPU", "sm": "sm_90", "copy_bw": 3e12, "date": "2026-11-22", "command": "gdngen bench",
    "versions": {"torch": "2"},
}  # fmt: skip


def test_dispatch_excess_compares_with_the_fastest_single_variant():
    cell = {
        "gdngen": _result("gdngen", 10.2, variant="v1"),
        "v1": _result("v1", 10.1),
        "v2": _result("v2", 10.0),
        "flashinfer": _result("flashinfer", 9.0, variant=None),  # a peer is not a variant
    }
    assert dispatch_excess(cell) == pytest.approx(0.02)
    assert dispatch_excess({"gdngen": cell["gdngen"]}) is None
    assert dispatch_excess({**cell, "v2": replace(cell["v2"], us=None)}) == pytest.approx(
        0.1 / 10.1
    )


def test_report_shows_the_fastest_variant_and_counts_the_cells_within_tolerance():
    slow = 1 + 2 * DISPATCH_TOLERANCE
    results = [
        _result("gdngen", 10.0, variant="v1", batch=1),
        _result("v1", 10.0, batch=1),
        _result("v2", 10.1, batch=1),
        _result("gdngen", 10.0 * slow, variant="v2", batch=4),
        _result("v1", 10.0, batch=4),
        _result("v2", 10.0 * slow, batch=4),
        _result("flashinfer", 12.0, variant=None, batch=4),
    ]
    table = markdown(results, META)
    assert "fastest variant us | vs fastest" in table
    assert "| 10.00 (same) | +0.0% |" in table  # B=1: the dispatched kernel is the fastest
    assert "| 10.00 `v1` | +6.0% |" in table  # B=4: v1 was 6% faster than the dispatched v2
    assert "within 3% of the fastest single variant timed beside it: 1 of 2 cells" in table
    assert "largest gap +6.0% at HV=64 B=4" in table
    assert "all tables: 1 of 2 cells" in table


def test_grid_covers_each_head_dim():
    problems = grid(
        tokens=[1], batches=[1, 4], heads=[32], layouts=["k_last"], state_dtypes=["bf16"],
        modes=["update"], head_dims=[64, 256],
    )  # fmt: skip
    assert [(p.K, p.V, p.batch) for p in problems] == [(64, 64, 1), (64, 64, 4), (256, 256, 1),
                                                        (256, 256, 4)]  # fmt: skip


def test_report_keeps_head_dims_apart():
    """Cells of other head dims get tables of their own, titled with them (K = V = 128 keeps
    the plain title), and the dispatch summary names them."""
    results = [
        _result("gdngen", 10.0, variant="v1"),
        _result("v1", 10.0),
        _result("gdngen", 20.0, variant="v2", K=256, V=256),
        _result("v2", 10.0, K=256, V=256),
    ]
    table = markdown(results, META)
    assert "### K-last [B,HV,V,K], bf16 state, T=1, update\n" in table
    assert "### K-last [B,HV,V,K], bf16 state, T=1, update, K=V=256\n" in table
    assert "largest gap +100.0% at k_last bf16 T=1 update K=V=256 HV=64 B=16" in table


def test_report_without_single_variants_has_no_dispatch_columns():
    table = markdown([_result("gdngen", 10.0, variant="v1")], META)
    assert "vs fastest" not in table and "### Dispatch" not in table


def test_report_names_the_card_where_the_record_has_its_uuid():
    # runs side by side on several GPUs of one host are told apart by the card's UUID
    card = "GPU-0c1d2e3f-0000-1111-2222-333344445555"
    header = markdown([_result("gdngen", 10.0)], {**META, "gpu_uuid": card}).splitlines()[0]
    assert header.startswith(f"GPU: GPU (sm_90, {card}), copy bandwidth 3.00 TB/s")
    assert markdown([_result("gdngen", 10.0)], META).startswith("GPU: GPU (sm_90), copy")


def test_bench_record_is_json_with_one_result_per_line():
    record = {
        "meta": {"gpu": "NVIDIA H200", "copy_bw": 4.25e12},
        "results": [{"impl": "gdngen", "us": 3.5}, {"impl": "flashinfer", "us": None}],
        "note": "cut off",
    }
    text = dump_record(record)
    assert json.loads(text) == record
    lines = text.splitlines()
    assert '  {"impl": "gdngen", "us": 3.5},' in lines
    assert '  {"impl": "flashinfer", "us": null}' in lines
    assert json.loads(dump_record({"meta": {}, "results": []})) == {"meta": {}, "results": []}


def test_source_commit_says_when_the_tree_differs_from_the_commit(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "kernel.py").write_text("A = 1\n")
    git("add", "kernel.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    clean = source_commit(cwd=str(tmp_path))
    assert clean and len(clean) >= 7 and not clean.endswith("-dirty")
    (tmp_path / "kernel.py").write_text("A = 2\n")
    assert source_commit(cwd=str(tmp_path)) == f"{clean}-dirty"


def test_the_startup_bench_report_adds_up_the_workers(tmp_path):
    from gdngen.bench import startup

    compile(startup.WORKER.format(target="h200", problems=startup.PROBLEMS), "worker", "exec")
    assert startup.check_entries(tmp_path) == {"count": 0, "whole": 0}
    (tmp_path / "kl_x").mkdir()
    (tmp_path / "kl_x" / "entry.json").write_text('{"fingerprint": {"key": {"variant": "kl_x"}}}')
    assert startup.check_entries(tmp_path) == {"count": 1, "whole": 0}  # no library: not whole
    runs = [
        dict(processes=2, entries=dict(count=2, whole=2), workers=[
            dict(gpu=0, seconds=13.0, sources={"compiled": 2}, error=1e-3),
            dict(gpu=1, seconds=14.5, sources={"cache": 2}, error=2e-3),
        ]),
    ]  # fmt: skip
    row = startup.markdown(runs, dict(gpu="H200", gpus=2)).splitlines()[-1]
    assert row == "| 2 | 14.5 | 13.0, 14.5 | 2 | 2 | 2 (2) | 2.00e-03 |"


def test_a_startup_worker_starts_cold_whatever_the_shell_set(tmp_path):
    # Each worker sees its own GPU and the run's empty cache, with the disk cache on and no
    # artifact directory: a GDNGEN_ARTIFACTS or GDNGEN_DISK_CACHE=0 in the calling shell would
    # otherwise load every kernel (or compile it in every process) and the run would not show
    # a machine's cold start.
    from gdngen.bench import startup

    shell = {"PATH": "/bin", "GDNGEN_ARTIFACTS": "/prebuilt", "GDNGEN_DISK_CACHE": "0",
             "GDNGEN_CACHE_DIR": "/elsewhere", "CUDA_VISIBLE_DEVICES": "0,1"}  # fmt: skip
    environment = startup.worker_environment(1, tmp_path, shell)
    assert environment == {"PATH": "/bin", "GDNGEN_DISK_CACHE": "1",
                           "GDNGEN_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "1"}  # fmt: skip
    assert shell["GDNGEN_ARTIFACTS"] == "/prebuilt"  # the caller's mapping is left as it was
    # worker i takes the i-th GPU the caller sees, not the machine's i-th
    masked = startup.worker_environment(1, tmp_path, dict(shell, CUDA_VISIBLE_DEVICES="2, 3"))
    assert masked["CUDA_VISIBLE_DEVICES"] == "3"


def test_core_bench_forms_and_report():
    # The core bench's cells are in vLLM's forms (a per-token table at T > 1), and its report's
    # ratio is the fastest chain over the fused core, with "-" where a peer skipped a cell (the
    # vLLM chains' column among them: tests/test_vllm_chain_cpu.py).
    from gdngen.bench import core

    assert core.core_problem(3, 4, 32, "bf16").slots == "per_token"
    assert core.core_problem(3, 1, 32, "bf16").slots == "row"
    peer = core.peer_problem(core.core_problem(3, 4, 32, "fp32"))
    assert (peer.mode, peer.cache_steps, peer.batch) == ("verify", 4, 3)
    records = [
        dict(state_dtype="bf16", HV=32, tokens=1, batch=1, variant="v",
             us={"fused core": 5.0, "chain (gdngen)": 7.5, "chain (flashinfer)": 10.0,
                 "recurrence alone": 4.0}),
        dict(state_dtype="fp32", HV=64, tokens=4, batch=8, variant="w",
             us={"fused core": 10.0, "chain (gdngen)": 5.0, "recurrence alone": 8.0}),
    ]  # fmt: skip
    text = core.markdown(records, dict(gpu="X", copy_GBps=1.0, fla_steps="conv, norm"))
    assert "| 1.50 | - | 1.250 | - | - | - |" in text and "| 0.50 | - | 1.250 |" in text
    assert "| 5.00 | - | 8.00 |" in text  # FlashInfer skipped the second cell
    assert "geometric mean 0.87x over 2 cells" in text


def test_core_bench_report_puts_the_best_plan_against_vllm_and_the_floor():
    from gdngen.bench import core
    from gdngen.measure.core_cell import steps_bytes

    # HV 64, B 512, T 1 at 4000 GB/s: the conv window (12288 channels, 3 columns read and 3
    # written) and z (64 x 128) in bf16 add 40.1 µs to the recurrence
    record = dict(state_dtype="fp32", H=16, HV=64, K=128, V=128, tokens=1, batch=512, conv=True,
                  variant="v", us={"fused core": 1140.0, "split plan": 1130.0,
                                   "steps plan": 1080.0, "chain (vllm, triton norm)": 1188.0,
                                   "chain (gdngen)": 1100.0, "recurrence alone": 1000.0})  # fmt: skip
    added = steps_bytes(core.core_problem(512, 1, 64, "fp32"), core.CONV_WIDTH)
    assert added == 512 * (12288 * 2 * 6 + 64 * 128 * 2)
    floor = core.floor_us(record, 4000.0)
    assert floor == pytest.approx(1000.0 + added / 4000e3)
    text = core.markdown([record], dict(gpu="X", copy_GBps=4000.0, fla_steps="conv, norm"))
    assert f"| 1.10 | {1080.0 / floor:.3f} |" in text  # the steps plan is the best plan
    assert "vllm chain / best plan: geometric mean 1.10x, min 1.10x over 1 cells" in text
    assert core.floor_us(dict(record, conv=False), 4000.0) is None


def test_a_stopped_bench_writes_the_tables_of_the_cells_it_finished(tmp_path, monkeypatch):
    """`timeout` (SIGTERM) or Ctrl-C during a long bench: the tables and the record hold the
    cells finished before it, say that the run stopped and where, and the exit code says so
    (run without a GPU: the measuring is faked, the CLI path is real)."""
    import argparse
    import os
    import signal

    import torch

    import gdngen.bench.run as bench_run
    import gdngen.measure.environment as environment
    import gdngen.measure.timing as timing
    from gdngen.bench import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4.2e12)
    monkeypatch.setattr(environment, "environment", lambda: {**META, "gpu": "NVIDIA H200"})

    def run_grid(problems, target, copy_bw, *, jsonl, **kwargs):
        for problem in problems[:2]:
            cell = [
                _result("gdngen", 10.0 + problem.batch, "kl_bf16_x", HV=problem.HV,
                        batch=problem.batch),
                _result("fla", 12.0 + problem.batch, HV=problem.HV, batch=problem.batch),
            ]  # fmt: skip
            jsonl.write("".join(json.dumps(asdict(r)) + "\n" for r in cell))
            jsonl.flush()
        os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` sends
        raise AssertionError("the signal stops the run before this")

    monkeypatch.setattr(bench_run, "run_grid", run_grid)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "b"
    args = parser.parse_args(
        ["--layout", "k_last", "--state-dtype", "bf16", "--hv", "64", "--batch", "1,16,512",
         "--peers", "none", "--out", str(out)]
    )  # fmt: skip
    assert cli.run(args, ["bench"]) == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["meta"]["stopped"] == "stopped after 2 of 3 cells"
    assert sorted({r["batch"] for r in record["results"]}) == [1, 16]
    table = out.with_suffix(".md").read_text()
    assert "**Incomplete:** the run was stopped after 2 of 3 cells." in table
    assert "| 64 | 16 | 26.00" in table and "| 64 | 512 |" not in table
    assert not out.with_suffix(".jsonl").exists()


def test_a_cell_no_implementation_serves_draws_no_inputs_and_takes_no_gpu_turn(monkeypatch):
    """A peer without the cell's mode (FLA in verify, FlashInfer's V-last at T > 1) is n/a
    before any input set is drawn: a grid of such cells spends no GPU time on them."""
    from gdngen.bench import run as bench_run
    from gdngen.measure.impls import Impl

    class Without(Impl):
        name = "without"

        def supports(self, problem):
            return "no such mode"

    def no_inputs(*args, **kwargs):
        raise AssertionError("inputs were drawn for a cell nobody serves")

    monkeypatch.setattr(Problem, "make", no_inputs)
    turns = []
    cell = bench_run.measure_side_by_side(
        [Without()], _problem(), 1e12, gpu_turn=lambda: turns.append(1) or nullcontext()
    )
    assert [r.status for r in cell] == ["n/a: no such mode"] and turns == []


def test_binds_run_in_the_gpu_turn_and_compiles_between_turns(monkeypatch):
    """Processes sharing a GPU compile side by side, but anything that may launch work on the
    GPU (a bind's allocations and index conversions) waits for the turn: outside it, it would
    land in the middle of another process's timing."""
    from contextlib import contextmanager

    from gdngen.bench import run as bench_run
    from gdngen.measure.impls import Bound, Impl

    in_turn = [False]
    events = []

    @contextmanager
    def gpu_turn():
        in_turn[0] = True
        try:
            yield
        finally:
            in_turn[0] = False

    class Recording(Impl):
        name = "recording"

        def supports(self, problem):
            return None

        def compile(self, problem, args):
            events.append(("compile", in_turn[0]))

        def bind(self, problem, args):
            events.append(("bind", in_turn[0]))
            return Bound(run=lambda: None, read_output=None, read_state=None, slots=None)

    monkeypatch.setattr(Problem, "make", lambda self, device: {"seed": self.seed})
    monkeypatch.setattr(bench_run, "rotating_sets", lambda moved: 3)
    monkeypatch.setattr(bench_run, "_check", lambda result, problem, args, bound: None)
    monkeypatch.setattr(
        bench_run, "time_side_by_side", lambda runs, replays: {name: 1.0 for name in runs}
    )
    cell = bench_run.measure_side_by_side([Recording()], _problem(), 1e12, gpu_turn=gpu_turn)
    assert [r.status for r in cell] == ["ok"] and cell[0].us == 1.0
    assert events == [("compile", False)] + [("bind", True)] * 3


def test_the_records_of_a_killed_bench_render_with_its_metadata(tmp_path, capsys):
    """A run killed outright (SIGKILL, its machine taken back) writes no tables: its .jsonl,
    metadata first and then whole cells, renders on its own with `gdngen bench-tables`."""
    from gdngen.bench.run import write_meta_line
    from gdngen.cli import main

    records = tmp_path / "run.jsonl"
    with open(records, "w") as jsonl:
        write_meta_line(jsonl, {**META, "cells": 3})
        for batch in (1, 16):
            cell = [_result("gdngen", 10.0 + batch, "kl_bf16_x", HV=64, batch=batch)]
            jsonl.write("".join(json.dumps(asdict(r)) + "\n" for r in cell))
    assert main(["bench-tables", str(records), "--out", str(tmp_path / "tables")]) == 0
    table = (tmp_path / "tables.md").read_text()
    assert "**Incomplete:** the run was stopped after 2 of 3 cells." in table
    assert "Command: `gdngen bench`" in table and "| 64 | 16 | 26.00" in table
    record = json.loads((tmp_path / "tables.json").read_text())
    assert len(record["results"]) == 2 and record["meta"]["gpu"] == "GPU"
    assert capsys.readouterr().out.startswith(table[:40])


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("run.csv", "", "expected a .json or .jsonl bench record"),
        ("old.jsonl", json.dumps(asdict(_result("gdngen", 1.0, "v"))) + "\n", "metadata"),
    ],
)
def test_bench_tables_refuses_what_it_cannot_render(tmp_path, capsys, name, text, message):
    from gdngen.cli import main

    path = tmp_path / name
    path.write_text(text)
    assert main(["bench-tables", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_the_bench_names_the_variant_a_per_hv_rule_dispatches():
    """A cell whose HV has a rule of its own is labelled with that rule's kernel, the one the
    dispatched call runs, not with its B*HV point's pick for other HVs."""
    from gdngen.measure.impls import Gdngen
    from gdngen.problem import Problem

    import generated.h200 as h200
    from generated.h200.dispatch import TABLE

    per_hv = next(r for r in TABLE if r.heads is not None and r.tokens.lo == 1)
    HV = per_hv.heads.lo
    problem = Problem(
        batch=per_hv.batch_heads.lo // HV + 1, tokens=1, H=2,
        HV=HV, layout=per_hv.layout, state_dtype=per_hv.state_dtype, pool_size=None,
        cache_steps=1 if per_hv.intermediate == "yes" else None,
    )  # fmt: skip
    shared = dict(
        layout=problem.layout, state_dtype=problem.state_dtype, tokens=1,
        batch_heads=problem.batch * HV, intermediate=problem.cache_steps is not None,
        head_dims=(128, 128),
    )  # fmt: skip
    assert h200.select(**shared, heads=HV) is per_hv
    assert h200.select(**shared).use != per_hv.use  # the point's pick, for any other HV
    assert Gdngen("h200").chosen_variant(problem) == per_hv.use
