"""Tuning files: parsing, validation against the spec, and the dispatch rows emit makes of them."""

import dataclasses
import difflib
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import generated.h200 as h200
from gdngen.dispatch import (
    CallShape,
    measured_evidence,
    measured_rules,
    select,
    tuned_ref,
    verdicts,
)
from gdngen.dispatch.measured import CELL_TOLERANCE
from gdngen.emit import emit, expected_files
from gdngen.spec import load_spec, parse_spec
from gdngen.terms import plan_name
from gdngen.tune.run import (
    TuneError,
    earlier_first_token_cells,
    merge,
    merge_runs,
    retime_names,
    ROUND_DRIFT,
    EXTRA_ROUNDS,
    round_drift,
    settle,
    shortlist,
)
from gdngen.tune.tuning_file import (
    Cell,
    Measured,
    TuningError,
    TuningFile,
    dump_tuning,
    gpu_model,
    load_tuning,
    pair_sha256,
    read_tuning,
    set_key,
    stale_pairs,
    variants_sha256,
)
from tests.spec_helpers import ROOT, evidence_tables, to_yaml

SMALL = {
    "target": "mini",
    "sm": "sm_90a",
    "geometries": [
        {"name": "a", "H": 16, "HV": 32, "K": 128, "V": 128},
        {"name": "b", "H": 16, "HV": 64, "K": 128, "V": 128},
    ],
    "features": {"max_tokens": 8},
    "variants": [
        {"layout": "k_last", "state_dtype": "bf16", "tile_v": 8, "ilp": 2, "vec": 8, "threads_per_group": 16},
        {"layout": "k_last", "state_dtype": "bf16", "tile_v": 64, "ilp": 8, "vec": 8, "threads_per_group": 16},
        {"layout": "k_last", "state_dtype": "fp32", "tile_v": 8, "ilp": 2, "vec": 4, "threads_per_group": 32},
    ],
    "tuning": {"gpu": "H100", "tokens": [1, 4], "batch": [1, 64], "heads": [32, 64]},
    "dispatch": [
        {"layout": "k_last", "state_dtype": "bf16", "tokens": [1, 8], "batch_heads": [1, None], "use": "kl_bf16_tv8_ilp2_vec8_tpg16_sm90"},
        {"layout": "k_last", "state_dtype": "fp32", "tokens": [1, 8], "batch_heads": [1, None], "use": "kl_fp32_tv8_ilp2_vec4_tpg32_sm90"},
    ],
}  # fmt: skip
SMALL_V = "kl_bf16_tv8_ilp2_vec8_tpg16_sm90"
LARGE_V = "kl_bf16_tv64_ilp8_vec8_tpg16_sm90"


@pytest.fixture
def spec():
    return parse_spec(to_yaml(SMALL), "specs/mini.yaml")


def _cells() -> list[Cell]:
    """bf16 only: the small variant wins below B*HV = 1024, the large one from 2048 up."""
    cells = []
    for mode, tokens in (("update", 1), ("update", 4), ("verify", 4)):
        for HV in (32, 64):
            for batch in (1, 64):
                bh = batch * HV
                small = 3.0 + bh * 0.01
                large = 3.5 + bh * 0.008 if bh >= 2048 else small + 1.0
                cells.append(
                    Cell(
                        layout="k_last", state_dtype="bf16", tokens=tokens, mode=mode, HV=HV,
                        batch=batch, times_us={SMALL_V: round(small, 2), LARGE_V: round(large, 2)},
                    )  # fmt: skip
                )
    return cells


def _tuning(spec, **changes) -> TuningFile:
    fields = dict(
        target="mini", sm="sm_90a", gpu="NVIDIA H100 80GB HBM3", date="2026-11-22",
        command="gdngen tune specs/mini.yaml", variants_sha256=variants_sha256(spec),
        copy_bw_tbps=2.97, versions={"torch": "2.11.0"}, cells=_cells(),
    )  # fmt: skip
    fields.update(changes)
    return TuningFile(**fields)


def _rules(spec, tuning: TuningFile):
    """The rules emit makes of ``tuning``'s cells for the spec's pairs."""
    return measured_rules(
        tuning.cells, spec.served, spec.features.max_tokens, spec.tuning_head_dims
    )


def _evidence(spec, tuning: TuningFile) -> dict[str, list[str]]:
    """Why each of :func:`_rules` picks its variant, by its source."""
    return measured_evidence(
        tuning.cells, spec.served, spec.features.max_tokens, spec.tuning_head_dims
    )


def _span(bounds) -> tuple:
    return (bounds.lo, bounds.hi)


def _measured(tuning: TuningFile, name: str = "specs/mini.tuning.yaml") -> Measured:
    return Measured(name=name, cells=tuple(tuning.cells), tuning=tuning)


def _write(tmp_path: Path, tuning: TuningFile) -> Path:
    path = tmp_path / "mini.tuning.yaml"
    path.write_text(dump_tuning(tuning))
    return path


def test_dump_and_load_round_trip(spec, tmp_path):
    tuning = _tuning(spec)
    loaded = load_tuning(_write(tmp_path, tuning), spec)
    assert sorted(loaded.cells, key=repr) == sorted(tuning.cells, key=repr) and not loaded.stale
    assert loaded.tuning.gpu == tuning.gpu and loaded.tuning.versions == tuning.versions


def _retimed(cell: Cell, *timings: dict) -> Cell:
    return cell.model_copy(update={"retimed_us": [*cell.retimed_us, *timings]})


def test_retimed_cells_round_trip_and_files_without_retimes_keep_their_form(spec, tmp_path):
    plain = dump_tuning(_tuning(spec))
    assert "retimed" not in plain
    cells = _cells()
    cells[0] = _retimed(cells[0], {SMALL_V: 3.4, LARGE_V: 4.1}, {SMALL_V: 3.3, LARGE_V: 4.5})
    record = "2026-11-22 15:04 NVIDIA H100 80GB HBM3 (GPU-1234): gdngen tune --retime"
    tuning = _tuning(spec, cells=cells, retimed=[record])
    path = _write(tmp_path, tuning)
    text = path.read_text()
    assert yaml.safe_load(text)["retimed"] == [record]
    # every timing a list in the order of its set's columns (the variant names, sorted)
    assert sorted([LARGE_V, SMALL_V]) == [LARGE_V, SMALL_V]
    assert yaml.safe_load(text)["columns"]["k_last/bf16"] == [LARGE_V, SMALL_V]
    assert "], [4.10, 3.40], [4.50, 3.30]]\n" in text  # the first timing, then the retimes
    loaded = load_tuning(path, spec)
    assert sorted(loaded.cells, key=repr) == sorted(cells, key=repr)
    assert loaded.tuning.retimed == [record]


def test_a_file_naming_every_timing_reads_as_the_columns_form(spec, tmp_path):
    """Files written before the columns form (each timing a mapping of names) still read, to
    the same cells; a variant missing from a timing comes back missing, not as a number."""
    cells = _cells()
    cells[0] = _retimed(cells[0], {SMALL_V: 3.4})
    tuning = _tuning(spec, cells=cells)
    named = tuning.model_dump(mode="json")
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(named))
    assert read_tuning(old) == read_tuning(_write(tmp_path, tuning)) == tuning
    assert "null" in dump_tuning(tuning)  # LARGE_V was not retimed in cell 0


def _first_timing(data: dict) -> list:
    """The first cell's timing in a dumped file's cells (grouped: a batch size's list)."""
    return next(iter(next(iter(data["cells"].values())).values()))


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d["columns"].pop("k_last/bf16"), "columns: no entry for the cells of k_last/bf16"),
        (lambda d: _first_timing(d).append(1.0), "timing has 3 entries; its columns have 2"),
        (lambda d: d.update(columns=["x"]), "columns: expected a mapping"),
        (lambda d: d.update(cells={"k_last/bf16 T1": {1: [1.0, 2.0]}}), "'k_last/bf16 T1' is not a group"),
    ],
    ids=["no_columns", "too_many", "not_a_mapping", "not_a_group"],
)  # fmt: skip
def test_a_timing_that_does_not_fit_its_columns_is_named(spec, tmp_path, change, message):
    data = yaml.safe_load(dump_tuning(_tuning(spec)))
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TuningError, match=message):
        read_tuning(path)


def test_dump_is_sorted_and_deterministic(spec):
    tuning = _tuning(spec)
    shuffled = tuning.model_copy(update={"cells": list(reversed(tuning.cells))})
    assert dump_tuning(tuning) == dump_tuning(shuffled)
    text = dump_tuning(tuning)
    assert text.startswith("# Measured by `gdngen tune specs/mini.yaml`")
    assert yaml.safe_load(text)["target"] == "mini"


def test_rows_pick_the_fastest_and_split_at_geometric_midpoints(spec):
    rules = _rules(spec, _tuning(spec))
    t1 = [r for r in rules if _span(r.tokens) == (1, 3) and r.intermediate == "no"]
    # measured B*HV: 32, 64, 2048, 4096 -> small wins up to 64, large from 2048
    assert [(_span(r.batch_heads), r.use, r.source) for r in t1] == [
        ((1, 362), SMALL_V, "t:kl/bf16/K128V128/update/T1/bh32-64"),  # isqrt(64 * 2048) = 362
        ((363, None), LARGE_V, "t:kl/bf16/K128V128/update/T1/bh2048-4096"),
    ]
    # the figures are the evidence's, a line per point
    evidence = _evidence(spec, _tuning(spec))
    assert list(evidence) == [r.source for r in rules]
    plan, at_2048, at_4096 = evidence[t1[1].source]
    assert plan == LARGE_V  # the rule's plan first: a plain rule's is its variant
    assert (
        at_2048.startswith("B*HV=2048: ")
        and "next tv8_ilp2_vec8_tpg16 " in at_2048  # SMALL_V by its knobs
    )
    assert at_4096.startswith("B*HV=4096: ")
    # the tuning times the recurrence alone: calls with the gated RMSNorm go to the spec's rules
    assert all(r.gated_norm is False for r in rules)
    fused = CallShape("k_last", "bf16", 1, 64, False, (128, 128), gated_norm=True)
    assert select(rules, fused) is None


def _cell(batch: int, times: dict, *retimes: dict, HV: int = 64) -> Cell:
    return Cell(
        layout="k_last", state_dtype="bf16", tokens=4, mode="update", HV=HV, batch=batch,
        times_us=times, retimed_us=list(retimes),
    )  # fmt: skip


def test_a_retimed_cell_goes_to_the_variant_least_behind_in_every_timing():
    """The swing seen on an H200: "steady" wins the first timing by 0.6%, "swinging" wins the
    retime by 4%. Dispatching "steady" costs 2% on average over the two, "swinging" 0.3%."""
    cell = _cell(
        512,
        {"steady": 832.5, "swinging": 837.1, "slow": 900.0},
        {"steady": 841.0, "swinging": 809.0},
    )
    (point,) = verdicts([cell])
    assert point.variant == "swinging" and point.timings == 2 and point.cells == 1
    assert point.worst_gap == pytest.approx(837.1 / 832.5 - 1)
    assert point.mean_gap == pytest.approx((837.1 / 832.5 - 1) / 2)
    assert point.runner_up == "steady" and point.runner_up_gap == pytest.approx((841 / 809 - 1) / 2)
    assert point.evidence() == (
        "B*HV=32768: 837.10 us, +0.3% mean and +0.6% worst off the fastest in 2 timings of 1 "
        "cell (next steady +2.0%)"
    )
    # "slow" was not a contender, so not retimed: it cannot win on its first timing alone.
    assert "slow" not in point.runner_up


def test_a_variant_fastest_in_every_timing_says_so():
    cell = _cell(64, {"a": 10.0, "b": 11.0}, {"a": 10.2, "b": 11.5})
    (point,) = verdicts([cell])
    assert point.evidence() == (
        "B*HV=4096: 10.00 us, the fastest in all 2 timings of 1 cell (next b +11.4%)"
    )


def test_one_timing_keeps_the_fastest_and_its_plain_evidence():
    (point,) = verdicts([_cell(4, {"a": 10.0, "b": 9.5})])
    assert (point.variant, point.worst_gap, point.runner_up) == ("b", 0.0, "a")
    assert point.evidence() == "B*HV=256: 9.50 us (next a 10.00 us)"


def test_cells_sharing_a_batch_heads_go_to_the_least_mean_gap_across_them():
    """HV=32 B=512 and HV=64 B=256 are both B*HV=16384: "b" has the least summed time but is 5%
    off in one cell; "a" is at most 1% off in both."""
    cells = [
        _cell(512, {"a": 101.0, "b": 100.0}, HV=32),
        _cell(256, {"a": 100.0, "b": 105.0}),
    ]
    (point,) = verdicts(cells)
    assert point.variant == "a" and point.cells == 2 and point.timings == 2
    assert point.worst_gap == pytest.approx(0.01) and point.mean_gap == pytest.approx(0.005)


def test_a_cell_its_point_pick_leaves_over_3_percent_behind_gets_a_rule_for_its_hv(spec):
    """HV 4 at B 64 and HV 64 at B 4 are both B*HV = 256: the point goes to the variant least
    behind on average (SMALL_V, 0.5% off at HV 4), but it is 6% off at HV 64, so HV 64 gets
    LARGE_V in that point's range, before the point's own rule; other HVs (and calls that give
    no HV) keep the point's pick."""
    cells = [c for c in _cells() if (c.tokens, c.mode) != (1, "update")]
    shared = [
        Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=4, batch=64,
             times_us={SMALL_V: 10.0, LARGE_V: 30.0}),
        Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64, batch=4,
             times_us={SMALL_V: 10.6, LARGE_V: 10.0}),
        Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=32, batch=64,
             times_us={SMALL_V: 30.0, LARGE_V: 20.0}),
    ]  # fmt: skip
    rules = _rules(spec, _tuning(spec, cells=cells + shared))
    t1 = [r for r in rules if _span(r.tokens) == (1, 3) and r.intermediate == "no"]
    assert [(_span(r.batch_heads), r.heads and _span(r.heads), r.use) for r in t1] == [
        ((1, 724), (64, 64), LARGE_V),  # the point's range: isqrt(256 * 2048) = 724
        ((1, 724), None, SMALL_V),
        ((725, None), None, LARGE_V),
    ]
    assert t1[0].source == "t:kl/bf16/K128V128/update/T1/bh256/hv64"
    plan, why = _evidence(spec, _tuning(spec, cells=cells + shared))[t1[0].source]
    assert plan == LARGE_V
    assert why == f"HV=64 B=4: 10.00 us, where the B*HV=256 pick {SMALL_V} is +6.0% off"

    def pick(heads):
        shape = CallShape("k_last", "bf16", 1, 256, False, (128, 128), heads=heads)
        return select(rules, shape).use

    assert (pick(64), pick(4), pick(None)) == (LARGE_V, SMALL_V, SMALL_V)


def test_neighbouring_hvs_that_leave_the_point_for_one_variant_share_a_rule_over_the_hvs_between(
    spec,
):
    """At B*HV = 256, HV 4 and HV 16 both run LARGE_V faster than the point's pick, SMALL_V (which
    wins at HV 64): one rule over HV 4..16 serves the unmeasured HV 8 (B = 32) between them too.
    A cell measured between them that the pick serves (HV 8 here, in the second table) splits the
    rule in two, and HVs past the last such cell keep the pick."""
    cells = [c for c in _cells() if (c.tokens, c.mode) != (1, "update")]

    def shared(hv8=None):
        times = {4: (12.0, 10.0), 16: (12.0, 10.0), 64: (10.0, 30.0)}
        if hv8:
            times[8] = hv8
        return [
            Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=hv,
                 batch=256 // hv, times_us={SMALL_V: small, LARGE_V: large})
            for hv, (small, large) in sorted(times.items())
        ]  # fmt: skip

    def t1_rules(rules):
        return [
            (_span(r.batch_heads), r.heads and _span(r.heads), r.use)
            for r in rules
            if _span(r.tokens) == (1, 3) and r.intermediate == "no"
        ]

    rules = _rules(spec, _tuning(spec, cells=cells + shared()))
    assert t1_rules(rules) == [
        ((1, None), (4, 16), LARGE_V),  # SMALL_V is 20% off at both HV 4 and HV 16
        ((1, None), None, SMALL_V),
    ]
    assert rules[0].source == "t:kl/bf16/K128V128/update/T1/bh256/hv4-16"
    plan, hv4, hv16 = _evidence(spec, _tuning(spec, cells=cells + shared()))[rules[0].source]
    assert plan == LARGE_V
    assert hv4.startswith("HV=4 B=64: 10.00 us") and hv16.startswith("HV=16 B=16: 10.00 us")

    def pick(rules, heads):
        return select(
            rules, CallShape("k_last", "bf16", 1, 256, False, (128, 128), heads=heads)
        ).use

    assert [pick(rules, hv) for hv in (4, 6, 8, 12, 16, 24, 64)] == [LARGE_V] * 5 + [SMALL_V] * 2

    split = _rules(spec, _tuning(spec, cells=cells + shared(hv8=(10.0, 10.05))))
    assert t1_rules(split) == [
        ((1, None), (4, 4), LARGE_V),
        ((1, None), (16, 16), LARGE_V),
        ((1, None), None, SMALL_V),
    ]
    assert [pick(split, hv) for hv in (4, 6, 8, 12, 16)] == [
        LARGE_V,
        SMALL_V,
        SMALL_V,
        SMALL_V,
        LARGE_V,
    ]


def test_retimes_of_disjoint_contenders_are_weighed_cell_by_cell():
    cells = [
        _cell(512, {"a": 10.0, "b": 10.1, "c": 11.0, "d": 12.0}, {"a": 10.2, "b": 10.0}, HV=32),
        _cell(256, {"a": 10.9, "b": 11.2, "c": 10.0, "d": 10.3}, {"c": 10.0, "d": 10.2}),
    ]
    # Per cell, each variant's mean over the timings that have it; then the mean over the cells:
    # "a" (1% and 9%) and "c" (10% and 0%) tie at 5%, and "a" is the less behind at worst.
    (point,) = verdicts(cells)
    assert point.variant == "a" and point.runner_up == "c" and point.timings == 4
    assert point.mean_gap == pytest.approx(0.05) and point.worst_gap == pytest.approx(0.09)


def test_a_retime_of_one_cell_leaves_its_points_other_cells_their_candidates():
    """HV 4, 8 and 16 share B*HV = 1024. A retime of HV 4 times its contenders "x" and "y" only;
    "z", 6% behind there, is the fastest at HV 8 and 16 by 5%. The point keeps "z", which then
    serves the HVs measured at other points, and HV 4 gets "x" by a rule of its own. (Narrowed to
    the retime's contenders, the point went to "x" for every HV: 5% off at HV 8 and 16.)"""
    from gdngen.dispatch.measured import head_exceptions

    cells = [
        _cell(256, {"x": 10.0, "y": 10.1, "z": 10.6}, {"x": 10.0, "y": 10.05}, HV=4),
        _cell(128, {"x": 21.0, "y": 21.2, "z": 20.0}, HV=8),
        _cell(64, {"x": 42.0, "y": 42.5, "z": 40.0}, HV=16),
    ]
    points = verdicts(cells)
    (point,) = points
    assert point.variant == "z" and point.cells == 3 and point.timings == 4
    assert point.mean_gap == pytest.approx(0.06 / 3)
    (exception,) = head_exceptions(cells, points)
    assert (exception.heads.lo, exception.heads.hi, exception.use) == (4, 4, "x")
    assert exception.evidence == ["HV=4 B=256: 10.00 us, where the B*HV=1024 pick z is +6.0% off"]


def test_rows_take_the_retimed_verdict(spec):
    cells = _cells()
    index = next(
        i for i, c in enumerate(cells)
        if (c.tokens, c.mode, c.HV, c.batch) == (1, "update", 64, 64)
    )  # fmt: skip
    # LARGE_V wins the first timing by 2%; the retime has it 10% behind SMALL_V
    cells[index] = cells[index].model_copy(
        update={
            "times_us": {SMALL_V: 37.0, LARGE_V: 36.27},
            "retimed_us": [{SMALL_V: 36.0, LARGE_V: 39.6}],
        }
    )
    rules = _rules(spec, _tuning(spec, cells=cells))
    t1 = [r for r in rules if _span(r.tokens) == (1, 3) and r.intermediate == "no"]
    (rule,) = [r for r in t1 if r.batch_heads.contains(4096)]
    at_4096 = _evidence(spec, _tuning(spec, cells=cells))[rule.source][-1]
    assert rule.use == SMALL_V and at_4096.startswith("B*HV=4096: ")
    assert "2 timings of 1 cell" in at_4096


def test_retime_times_the_contenders_of_every_timing_the_spec_still_has(spec):
    cell = Cell(
        layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64, batch=1,
        times_us={SMALL_V: 10.0, LARGE_V: 10.6, "kl_bf16_tv4_ilp1_vec8_tpg16_sm90": 10.1},
    )  # fmt: skip
    assert retime_names(cell, spec) == [SMALL_V]  # LARGE_V is 6% behind; tv4 is not in the spec
    assert retime_names(_retimed(cell, {SMALL_V: 10.0, LARGE_V: 10.2}), spec) == [SMALL_V, LARGE_V]


def test_rows_cover_every_token_count_and_both_modes(spec):
    covered = {(_span(r.tokens), r.intermediate) for r in _rules(spec, _tuning(spec))}
    assert covered == {((1, 3), "no"), ((4, 8), "no"), ((1, 8), "yes")}


def test_emit_uses_measured_rules_and_static_rules_for_the_rest(spec, tmp_path):
    out = tmp_path / "generated"
    emit(spec, "specs/mini.yaml", out, _measured(_tuning(spec)))
    namespace: dict = {}
    exec((out / "mini" / "dispatch.py").read_text(), namespace)
    table = namespace["TABLE"]
    big = select(table, CallShape("k_last", "bf16", 4, 8192, True, (128, 128)))
    assert big.use == LARGE_V and big.source == "t:kl/bf16/K128V128/verify/T4/bh2048-4096"
    fp32 = select(table, CallShape("k_last", "fp32", 2, 64, False, (128, 128)))
    assert fp32.source == "spec[1]"  # fp32 was not measured: the static rule stays
    # the evidence file names the tuning file and says why each measured row is there
    ((file, rows),) = evidence_tables((out / "mini" / "dispatch_evidence.txt").read_text()).values()
    assert file == "specs/mini.tuning.yaml"
    assert list(rows) == [r.source for r in table if r.source.startswith("t:")]
    assert rows[big.source][0] == LARGE_V
    manifest = (out / "mini" / "MANIFEST.txt").read_text()
    assert "# Dispatch measured (specs/mini.tuning.yaml): k_last/bf16" in manifest
    assert (
        "# Dispatch from the spec's static rules: k_last/fp32 "
        "(specs/mini.tuning.yaml has no cells of it)" in manifest
    )


def test_emit_from_tuning_is_deterministic(spec):
    measured = _measured(_tuning(spec))
    assert expected_files(spec, "specs/mini.yaml", measured) == expected_files(
        spec, "specs/mini.yaml", measured
    )


@pytest.mark.parametrize(
    "changes,reason",
    [
        (
            dict(gpu="NVIDIA A100-SXM4-80GB"),
            "measured on 'NVIDIA A100-SXM4-80GB'; this file is for the spec's 'H100'",
        ),
        (
            dict(variants_sha256={"k_last/bf16": "0000"}),
            "the spec's variants of this pair changed since it was measured "
            "(variants sha256 0000 in the file, ",
        ),
        (dict(variants_sha256={}), "the file records no variants sha256"),
    ],
    ids=["other_gpu", "variants_changed", "pair_not_recorded"],
)
def test_timings_that_no_longer_hold_make_their_pair_stale(spec, tmp_path, changes, reason):
    loaded = load_tuning(_write(tmp_path, _tuning(spec, **changes)), spec)
    assert list(loaded.stale) == ["k_last/bf16"] and reason in loaded.stale["k_last/bf16"]
    assert loaded.cells == ()


def test_a_file_of_another_target_is_refused(spec, tmp_path):
    path = _write(tmp_path, _tuning(spec, sm="sm_100a"))
    with pytest.raises(TuningError) as error:
        load_tuning(path, spec)
    message = str(error.value)
    assert str(path) in message
    assert "measured for target mini (sm_100a), the spec is mini (sm_90a)" in message


def test_unknown_variant_in_a_fresh_pair_is_reported(spec, tmp_path):
    cells = _cells()
    cells[0] = cells[0].model_copy(update={"times_us": {"kl_bf16_tv4_ilp1_vec8_tpg16_sm90": 1.0}})
    path = _write(tmp_path, _tuning(spec, cells=cells))
    with pytest.raises(
        TuningError, match="names variants the spec does not have: kl_bf16_tv4_ilp1"
    ):
        load_tuning(path, spec)


def test_unknown_variant_in_a_retime_is_reported(spec, tmp_path):
    cells = _cells()
    cells[0] = _retimed(cells[0], {SMALL_V: 1.0, "kl_bf16_tv4_ilp1_vec8_tpg16_sm90": 1.1})
    path = _write(tmp_path, _tuning(spec, cells=cells))
    with pytest.raises(TuningError, match="names variants the spec does not have: kl_bf16_tv4"):
        load_tuning(path, spec)


def test_malformed_tuning_file_names_the_file_and_field(spec, tmp_path):
    path = tmp_path / "bad.tuning.yaml"
    path.write_text("target: mini\ncells: 3\n")
    with pytest.raises(TuningError, match=r"bad.tuning.yaml: invalid tuning file: "):
        load_tuning(path, spec)


def test_cli_emit_falls_back_per_pair_and_says_how_to_remeasure(tmp_path):
    """One pair's variants changed: that pair's dispatch comes from the static rules (with a
    warning naming the re-measure command), the other pair keeps its measured rules, and
    ``emit --check`` reports the same."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mini.yaml").write_text(to_yaml(SMALL))
    spec = parse_spec(to_yaml(SMALL), "specs/mini.yaml")
    fp32_cells = [
        c.model_copy(update={"state_dtype": "fp32", "times_us": {FP32_V: c.times_us[SMALL_V]}})
        for c in _cells()
    ]
    hashes = {**variants_sha256(spec), "k_last/bf16": "0000"}
    tuning = _tuning(spec, cells=_cells() + fp32_cells, variants_sha256=hashes)
    (specs / "mini.tuning.yaml").write_text(dump_tuning(tuning))
    for args in (["emit", "specs/mini.yaml"], ["emit", "--check", "specs/mini.yaml"]):
        run = subprocess.run(
            [sys.executable, "-m", "gdngen", *args], cwd=tmp_path, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        assert "k_last/bf16 is unmeasured (the spec's variants of this pair changed" in run.stderr
        assert "gdngen tune specs/mini.yaml --pairs k_last/bf16 --merge" in run.stderr
        assert "k_last/fp32" not in run.stderr
    namespace: dict = {}
    exec((tmp_path / "generated" / "mini" / "dispatch.py").read_text(), namespace)
    sources = {(r.state_dtype, r.source.split("/")[0]) for r in namespace["TABLE"]}
    assert sources == {("bf16", "spec[0]"), ("fp32", "t:kl")}


def test_merge_keeps_cells_not_remeasured(spec):
    old = _tuning(spec)
    fresh_cell = old.cells[0].model_copy(update={"times_us": {SMALL_V: 1.0, LARGE_V: 2.0}})
    new = _tuning(spec, cells=[fresh_cell])
    merged = merge(old, new, spec)
    assert len(merged.cells) == len(old.cells)
    assert fresh_cell in merged.cells and old.cells[0] not in merged.cells


def test_a_retime_keeps_the_header_and_names_each_run_once(spec):
    old = _tuning(spec)
    retimed = _retimed(old.cells[0], {SMALL_V: 3.0, LARGE_V: 3.2})
    record = "2026-11-22 15:04 NVIDIA H100 80GB HBM3: gdngen tune specs/mini.yaml --retime"
    new = _tuning(spec, date="2026-12-01", command="gdngen tune --retime", cells=[retimed])
    merged = merge(old, new, spec, retimed_by=record)
    assert (merged.date, merged.command) == (old.date, old.command)  # what measured the cells
    assert merged.retimed == [record]
    assert len(merged.cells) == len(old.cells) and retimed in merged.cells
    # the next pair or token count of the same run: the run is named once
    again = merge(merged, new.model_copy(update={"cells": [old.cells[1]]}), spec, retimed_by=record)
    assert again.retimed == [record]
    with pytest.raises(TuneError, match="same GPU model"):
        merge(old, new.model_copy(update={"gpu": "NVIDIA H200"}), spec, retimed_by=record)


def test_a_tune_merged_after_a_retime_keeps_the_retime_record_while_its_cells_are_kept(spec):
    record = "2026-11-22 15:04 NVIDIA H100 80GB HBM3: gdngen tune specs/mini.yaml --retime"
    cells = _cells()
    cells[0] = _retimed(cells[0], {SMALL_V: 3.0, LARGE_V: 3.2})
    old = _tuning(spec, cells=cells, retimed=[record])
    # A plain tune of one other cell: the retimed cell is kept, and so is the line naming its run.
    remeasured = cells[1].model_copy(update={"times_us": {SMALL_V: 1.0, LARGE_V: 2.0}})
    merged = merge(old, _tuning(spec, date="2026-12-01", cells=[remeasured]), spec)
    assert cells[0] in merged.cells and merged.retimed == [record]
    # Re-measuring the retimed cell itself replaces it, and the record goes with it.
    fresh = cells[0].model_copy(update={"times_us": {SMALL_V: 3.1, LARGE_V: 3.3}, "retimed_us": []})
    assert merge(merged, _tuning(spec, cells=[fresh]), spec).retimed == []


def test_cli_retime_needs_the_tuning_file(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mini.yaml").write_text(to_yaml(SMALL))
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "tune", "specs/mini.yaml", "--retime"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--retime adds timings to the cells of specs/mini.tuning.yaml" in run.stderr
    assert "does not exist" in run.stderr


def test_cli_heads_must_be_in_the_tuning_grid(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mini.yaml").write_text(to_yaml(SMALL))
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "tune", "specs/mini.yaml", "--heads", "32,40"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--heads [40] are not HVs the grid of specs/mini.yaml measures ([32, 64]" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "tune", "specs/mini.yaml", "--heads", "all"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2 and "--heads expects HV values like 4,6,8; got 'all'" in run.stderr


def _with_variant(variant: dict):
    """The SMALL spec with one more variant (and no other change)."""
    return parse_spec(
        to_yaml({**SMALL, "variants": SMALL["variants"] + [variant]}), "specs/mini.yaml"
    )


BF16_EXTRA = dict(SMALL["variants"][0], tile_v=16, ilp=4)
FP32_EXTRA = dict(SMALL["variants"][2], tile_v=16, ilp=4)
FP32_V = "kl_fp32_tv8_ilp2_vec4_tpg32_sm90"


def test_variants_sha256_names_every_pair_with_variants(spec):
    assert variants_sha256(spec) == {
        "k_last/bf16": pair_sha256(spec, "k_last", "bf16"),
        "k_last/fp32": pair_sha256(spec, "k_last", "fp32"),
    }
    assert len(pair_sha256(spec, "k_last", "bf16")) == 16


def test_a_variant_added_to_another_pair_leaves_a_pair_fresh(spec, tmp_path):
    path = _write(tmp_path, _tuning(spec))  # bf16 cells only
    changed = _with_variant(FP32_EXTRA)
    assert pair_sha256(changed, "k_last", "fp32") != pair_sha256(spec, "k_last", "fp32")
    loaded = load_tuning(path, changed)
    assert loaded.cells and not loaded.stale  # the bf16 timings still hold


def test_a_variant_added_to_the_same_pair_makes_it_stale(spec, tmp_path):
    path = _write(tmp_path, _tuning(spec))
    loaded = load_tuning(path, _with_variant(BF16_EXTRA))
    assert loaded.cells == ()
    assert "the spec's variants of this pair changed" in loaded.stale["k_last/bf16"]


def test_a_knob_at_its_default_does_not_change_the_pair_hash(spec):
    """Spelling out a default (as a spec written before the knob existed would not) is the same
    kernel, so the same timings; a knob off its default is hashed."""
    explicit = dict(SMALL["variants"][0], solve="stepwise", row_passes=1, packed_fma=False)
    variants = [explicit] + SMALL["variants"][1:]
    respelled = parse_spec(to_yaml({**SMALL, "variants": variants}), "specs/mini.yaml")
    assert variants_sha256(respelled) == variants_sha256(spec)
    staged = dict(SMALL["variants"][0], solve="staged")
    implicit_passes = _with_variant(staged)
    explicit_passes = _with_variant(dict(staged, row_passes=1))
    assert variants_sha256(implicit_passes) == variants_sha256(explicit_passes)
    assert pair_sha256(implicit_passes, "k_last", "bf16") != pair_sha256(spec, "k_last", "bf16")


def test_merge_keeps_fresh_pairs_drops_stale_ones_and_replaces_remeasured_cells(spec):
    fp32_cell = Cell(
        layout="k_last", state_dtype="fp32", tokens=1, mode="update", HV=32, batch=1,
        times_us={FP32_V: 4.0},
    )  # fmt: skip
    old = _tuning(spec, cells=_cells() + [fp32_cell])
    # The spec gains a bf16 variant: old bf16 cells are stale, the fp32 one still holds.
    changed = _with_variant(BF16_EXTRA)
    remeasured = old.cells[0].model_copy(update={"times_us": {SMALL_V: 1.0, LARGE_V: 2.0}})
    new = _tuning(
        changed, cells=[remeasured],
        variants_sha256={"k_last/bf16": pair_sha256(changed, "k_last", "bf16")},
    )  # fmt: skip
    merged = merge(old, new, changed)
    assert sorted(merged.cells, key=repr) == sorted([remeasured, fp32_cell], key=repr)
    assert merged.variants_sha256 == variants_sha256(changed)
    # Re-measuring one fp32 cell of a fresh pair keeps the pair's other cells.
    other = fp32_cell.model_copy(update={"batch": 64})
    old = _tuning(spec, cells=[fp32_cell, other])
    refreshed = fp32_cell.model_copy(update={"times_us": {FP32_V: 3.0}})
    new = _tuning(
        spec, cells=[refreshed],
        variants_sha256={"k_last/fp32": pair_sha256(spec, "k_last", "fp32")},
    )  # fmt: skip
    merged = merge(old, new, spec)
    assert sorted(merged.cells, key=repr) == sorted([refreshed, other], key=repr)
    assert merged.variants_sha256 == {"k_last/fp32": pair_sha256(spec, "k_last", "fp32")}


def test_merge_keeps_nothing_measured_on_another_gpu(spec):
    old = _tuning(spec, gpu="NVIDIA H100 PCIe")
    new = _tuning(spec, cells=[old.cells[0]])
    assert merge(old, new, spec) == new


def _runs_by_token_count_and_mode(spec) -> list[TuningFile]:
    """The cells of _cells() as the files of three tune runs, one per (T, mode)."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in _cells():
        groups.setdefault((cell.tokens, cell.mode), []).append(cell)
    return [
        _tuning(spec, command=f"gdngen tune specs/mini.yaml --tokens {T}", cells=cells)
        for (T, _), cells in sorted(groups.items())
    ]


def test_merge_runs_combines_runs_split_by_token_count(spec):
    runs = _runs_by_token_count_and_mode(spec)
    assert len(runs) == 3
    merged = merge_runs(runs, spec, "gdngen merge-tuning specs/mini.yaml a b c")
    assert sorted(merged.cells, key=repr) == sorted(_cells(), key=repr)
    assert merged.command == "gdngen merge-tuning specs/mini.yaml a b c"
    # A cell in two runs keeps the later run's timing.
    again = runs[0].cells[0].model_copy(update={"times_us": {SMALL_V: 1.0, LARGE_V: 9.0}})
    merged = merge_runs(runs + [_tuning(spec, cells=[again])], spec, "merged")
    assert again in merged.cells and runs[0].cells[0] not in merged.cells
    assert len(merged.cells) == len(_cells())


def test_merge_runs_refuses_other_gpu_models_and_stale_timings(spec):
    runs = _runs_by_token_count_and_mode(spec)
    other = runs[1].model_copy(update={"gpu": "NVIDIA H200"})
    with pytest.raises(TuneError, match="different GPU models: NVIDIA H100 80GB HBM3, NVIDIA H200"):
        merge_runs([runs[0], other], spec, "merged")
    stale = runs[1].model_copy(update={"variants_sha256": {"k_last/bf16": "0000"}})
    with pytest.raises(TuneError, match="stale timings .*k_last/bf16"):
        merge_runs([runs[0], stale], spec, "merged")


def test_cli_merge_tuning_writes_the_spec_tuning_file(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mini.yaml").write_text(to_yaml(SMALL))
    spec = parse_spec(to_yaml(SMALL), "specs/mini.yaml")
    paths = []
    for index, run in enumerate(_runs_by_token_count_and_mode(spec)):
        paths.append(f"run{index}.yaml")
        (tmp_path / paths[-1]).write_text(dump_tuning(run))

    def merge_tuning(*files):
        return subprocess.run(
            [sys.executable, "-m", "gdngen", "merge-tuning", "specs/mini.yaml", *files],
            cwd=tmp_path, capture_output=True, text=True,
        )  # fmt: skip

    run = merge_tuning(*paths)
    assert run.returncode == 0, run.stderr
    merged = load_tuning(specs / "mini.tuning.yaml", spec)
    assert sorted(merged.cells, key=repr) == sorted(_cells(), key=repr)
    assert merged.tuning.command.startswith("gdngen merge-tuning specs/mini.yaml run0.yaml")
    # merging into the merged file names a tune run as the example, not the earlier merge
    run = merge_tuning("specs/mini.tuning.yaml", paths[0])
    assert run.returncode == 0, run.stderr
    command = load_tuning(specs / "mini.tuning.yaml", spec).tuning.command
    assert command.count("merge-tuning") == 1 and command.endswith(
        f"like: {_runs_by_token_count_and_mode(spec)[0].command}"
    )
    run = merge_tuning(paths[0], "missing.yaml")
    assert run.returncode == 2 and "missing.yaml: cannot read tuning file" in run.stderr


def test_a_run_without_t1_shortlists_from_the_earlier_t1_cells_that_still_hold(spec):
    gpu = "NVIDIA H100 80GB HBM3"
    fp32_cell = Cell(
        layout="k_last", state_dtype="fp32", tokens=1, mode="update", HV=32, batch=1,
        times_us={FP32_V: 4.0},
    )  # fmt: skip
    # a decode-core cell at T = 1 times plans, not variants: no shortlist of variants
    core_cell = fp32_cell.model_copy(update={"mode": "core", "times_us": {f"nopdl:{FP32_V}": 3.0}})
    core_key = set_key("k_last", "fp32", None, spec, core=True)
    hashes = {**variants_sha256(spec), core_key: pair_sha256(spec, "k_last", "fp32", core=True)}
    earlier = _tuning(spec, cells=_cells() + [fp32_cell, core_cell], variants_sha256=hashes)
    assert core_key not in stale_pairs(earlier, spec)
    first = [c for c in earlier.cells if c.tokens == 1 and c.mode != "core"]
    assert len(first) == 5 and sorted(earlier_first_token_cells(earlier, spec, gpu), key=repr) == (
        sorted(first, key=repr)
    )
    # bf16 gained a variant since: only the fp32 cell still holds.
    assert earlier_first_token_cells(earlier, _with_variant(BF16_EXTRA), gpu) == [fp32_cell]
    assert earlier_first_token_cells(earlier, spec, "NVIDIA H200") == []
    assert earlier_first_token_cells(None, spec, gpu) == []


def test_dump_lists_the_pair_hashes_sorted(spec):
    tuning = _tuning(spec, variants_sha256={"k_last/fp32": "b" * 16, "k_last/bf16": "a" * 16})
    text = dump_tuning(tuning)
    assert f"variants_sha256:\n  k_last/bf16: {'a' * 16}\n  k_last/fp32: {'b' * 16}\n" in text


def test_shortlist_keeps_variants_near_the_best():
    cells = [
        Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=32, batch=1,
             times_us={"a": 10.0, "b": 10.5, "c": 12.0}),
        Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=32, batch=64,
             times_us={"a": 20.0, "b": 30.0, "c": 19.0}),
    ]  # fmt: skip
    assert shortlist(cells, 1.10) == ["a", "b", "c"]
    assert shortlist(cells, 1.01) == ["a", "c"]


def test_shortlist_ranks_each_solve_family_against_itself():
    cells = [
        Cell(layout="k_last", state_dtype="bf16", tokens=1, mode="update", HV=64, batch=1,
             times_us={"step_a": 10.0, "step_b": 10.5, "staged_a": 13.0, "staged_b": 16.0})
    ]  # fmt: skip
    family = {
        "step_a": "stepwise",
        "step_b": "stepwise",
        "staged_a": "staged",
        "staged_b": "staged",
    }
    # Without families the staged kernels, slower at T = 1, would never be timed at T > 1.
    assert shortlist(cells, 1.10) == ["step_a", "step_b"]
    assert shortlist(cells, 1.10, family) == ["staged_a", "step_a", "step_b"]


@pytest.mark.parametrize(
    "file,gpu",
    [("h200.tuning.yaml", "NVIDIA H200"), ("h200.tuning.h100.yaml", "NVIDIA H100 80GB HBM3")],
    ids=["h200", "h100"],
)
def test_committed_tuning_matches_the_committed_dispatch(file, gpu):
    """Each GPU model's tuning file is valid for specs/h200.yaml and measures every served pair,
    and for every measured cell the dispatch table of that model picks a variant whose mean gap
    to the fastest over the cell's timings is within CELL_TOLERANCE (1.5%) of the least such gap:
    half the 3% the dispatch is held to out of sample, at every head dims measured. Cells sharing a
    B*HV (a TP shard's HV=4, B=16 and a full model's HV=64, B=1) are decided together, and a cell
    that would give up more than CELL_TOLERANCE there has a rule for its HV."""
    spec = load_spec(ROOT / "specs" / "h200.yaml")
    model = gpu_model(spec, gpu)
    tuning = load_tuning(ROOT / "specs" / file, spec, gpu=model)
    assert not tuning.stale
    # every served pair, but on the H100 the quantized states': on their static rules until a
    # GPU of the model tunes them
    unmeasured = set() if model == spec.tuning.gpu else {("k_last", "int8"), ("k_last", "fp8_e4m3")}
    assert {(c.layout, c.state_dtype) for c in tuning.cells} == set(spec.served) - unmeasured
    evidence = evidence_tables((ROOT / "generated" / "h200" / "dispatch_evidence.txt").read_text())
    cited, why = evidence["TABLE" if model == spec.tuning.gpu else model]
    assert cited == f"specs/{file}"
    for cell in tuning.cells:
        dims = cell.head_dims(spec.tuning_head_dims)
        core = cell.mode == "core"  # vLLM's forms: the per-token table at T > 1
        per_token = cell.mode == "spec" or (core and cell.tokens > 1)
        rule = h200.select(
            layout=cell.layout, state_dtype=cell.state_dtype, tokens=cell.tokens,
            batch_heads=cell.batch_heads, intermediate=cell.mode == "verify" or per_token,
            head_dims=dims, gpu=gpu, heads=cell.HV, gated_norm=core, conv1d=core,
            per_token_slots=per_token, packed=per_token,
        )  # fmt: skip
        if core and rule.source.startswith("spec["):
            # the spec's rule that holds PDL off goes first where the cells did not time its
            # plan without PDL (docs/design.md, "Tuning the decode core")
            assert not rule.pdl, rule
            assert plan_name(rule.use, False, pdl=False) not in cell.times_us, (rule, cell)
            continue
        # a measured rule of this file, whose source names the cell's point (and HV)
        picked = plan_name(rule.use, rule.split_conv, rule.split_norm, rule.pdl)
        assert why[rule.source][0] == picked, rule
        assert _names_the_cell(rule.source, cell, dims), (rule.source, cell)
        mean = {}
        for name in set.intersection(*(set(times) for times in cell.timings)):
            gaps = [times[name] / min(times.values()) - 1 for times in cell.timings]
            mean[name] = sum(gaps) / len(gaps)
        assert mean[picked] <= min(mean.values()) + CELL_TOLERANCE, (cell, picked)


def test_a_retune_of_one_cell_changes_only_the_rows_of_its_group():
    """The emitted tables are a rule a line, in columns of fixed width, so a re-tune's diff is the
    rows it moves. One cell of the committed H200 file timed again with its slowest variant now
    the fastest by far: the default table's rows that change are all of that cell's (layout,
    dtype, head dims, mode, T) group, and so is the evidence that changes; the H100 table and
    every other row stay as they were, byte for byte."""
    from gdngen.emit.plan import EVIDENCE, dispatch_files
    from gdngen.emit.render import render
    from gdngen.tune.tuning_file import load_other_tunings

    spec = load_spec(ROOT / "specs" / "h200.yaml")
    tuning = load_tuning(ROOT / "specs" / "h200.tuning.yaml", spec, "specs/h200.tuning.yaml")
    others = load_other_tunings(ROOT / "specs" / "h200.yaml", spec, ROOT)
    ((index, cell),) = [
        (i, c) for i, c in enumerate(tuning.cells)
        if (c.layout, c.state_dtype, c.mode, c.tokens, c.HV, c.batch, c.K)
        == ("k_last", "bf16", "update", 2, 16, 16, None)
    ]  # fmt: skip
    slowest = max(cell.times_us, key=cell.times_us.get)
    times = {**cell.times_us, slowest: min(cell.times_us.values()) / 2}
    cells = list(tuning.cells)
    cells[index] = cell.model_copy(update={"times_us": times, "retimed_us": []})
    retuned = dataclasses.replace(tuning, cells=tuple(cells))

    def emitted(measured: Measured) -> dict[str, str]:
        planned = dispatch_files(spec, "specs/h200.yaml", measured, others)
        return {p.relpath: render(p).split("\n", 3)[3] for p in planned}  # below the header

    before, after = emitted(tuning), emitted(retuned)
    group = "t:kl/bf16/K128V128/update/T2/"
    changed = [
        line[1:]
        for line in difflib.unified_diff(
            before["dispatch.py"].splitlines(), after["dispatch.py"].splitlines(), n=0
        )
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert any(slowest in line for line in changed)  # the cell moved rows to its new fastest
    for line in changed:
        assert line.startswith("    row(") and f'"{group}' in line, line
    assert (
        before["dispatch.py"].split("TABLES = {")[1] == after["dispatch.py"].split("TABLES = {")[1]
    )

    def outside_the_group(tables: dict) -> dict:
        return {
            gpu: (
                file,
                {source: row for source, row in rows.items() if not source.startswith(group)},
            )
            for gpu, (file, rows) in tables.items()
        }

    old, new = evidence_tables(before[EVIDENCE]), evidence_tables(after[EVIDENCE])
    assert old != new and outside_the_group(old) == outside_the_group(new)


def _names_the_cell(source: str, cell: Cell, head_dims: tuple[int, int]) -> bool:
    """Whether a measured rule's source (gdngen.dispatch.tuned_ref) names ``cell``: its layout,
    dtype, head dims, mode and T, its B*HV among the points, and its HV among those named."""

    def holds(span: str, value: int) -> bool:
        lo, _, hi = span.partition("-")
        return int(lo) <= value <= int(hi or lo)

    group = tuned_ref(cell.layout, cell.state_dtype, head_dims, cell.mode, cell.tokens, (0, 0))
    group = group.removesuffix("bh0")
    points, _, heads = source.removeprefix(group).partition("/")
    return (
        source.startswith(group)
        and holds(points.removeprefix("bh"), cell.batch_heads)
        and (not heads or holds(heads.removeprefix("hv"), cell.HV))
    )


def test_settle_times_every_variant_again_in_reverse_and_keeps_the_slower():
    first = {"steady": 10.0, "lucky": 9.8, "slow": 12.0}
    second = {"steady": 10.1, "lucky": 10.9, "slow": 11.5}
    asked = []

    def retime(names):
        asked.append(names)
        return {name: second[name] for name in names}

    settled = settle(first, retime)
    assert asked == [["slow", "lucky", "steady"]]  # all of them, once, in the reverse order
    assert settled == {"steady": 10.1, "lucky": 10.9, "slow": 12.0}
    assert min(settled, key=settled.get) == "steady"


def test_settle_ranks_every_variant_by_timings_taken_in_the_same_company():
    # A kernel's time depends on what is timed beside it: in a small group of heavy kernels
    # each reads slower than inside the full set (seen on an H200, 2-6%). Re-timing only the
    # close contenders ranked those by the slower group and a steady variant by the full set,
    # and the steady one won a cell it loses in every bench.
    full_set = {"fast": 410.0, "fast_too": 414.0, "steady": 424.0, "far": 600.0}

    def time_in(names):
        slowdown = 1.0 if len(names) == len(full_set) else 1.06
        return {name: full_set[name] * slowdown for name in names}

    settled = settle(time_in(list(full_set)), time_in)
    assert min(settled, key=settled.get) == "fast"
    assert settled == full_set


def test_settle_times_a_disturbed_cell_again_and_keeps_the_two_timings_that_agree():
    # The first timing read every variant 20% slow (something else ran on the GPU): kept as the
    # slower figure, it would rank the cell by the disturbance, under which "b" looks fastest.
    true = {"a": 27.0, "b": 29.0, "c": 28.5, "d": 33.0}
    disturbed = {"a": 36.0, "b": 33.0, "c": 35.0, "d": 40.0}
    later = [dict(true), {name: us * 1.005 for name, us in true.items()}]
    asked = []

    def retime(names):
        asked.append(names)
        times = later.pop(0)
        return {name: times[name] for name in names}

    settled = settle(disturbed, retime)
    assert asked == [["d", "c", "b", "a"], ["a", "b", "c", "d"]]  # one more, in the first order
    assert settled == {name: us * 1.005 for name, us in true.items()}
    assert min(settled, key=settled.get) == "a"


def test_settle_gives_a_cell_that_never_settles_two_more_timings_only():
    scale = iter([1.0, 1.2, 1.5, 1.9])
    first = {"a": 10.0, "b": 11.0}
    calls = []

    def retime(names):
        calls.append(names)
        factor = next(scale)
        return {name: first[name] * factor for name in names}

    settled = settle({name: us * 0.8 for name, us in first.items()}, retime)
    assert len(calls) == 2 + EXTRA_ROUNDS - 1  # the cell's own first timing came from outside
    # the closest two of 0.8, 1.0, 1.2, 1.5 (as factors): 1.0 and 1.2 (log distance 0.18)
    assert settled == {"a": 12.0, "b": 13.2}


def test_round_drift_reads_a_shift_of_all_variants_not_one_variants_noise():
    base = {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0, "e": 50.0}
    one_noisy = {**base, "e": 65.0}
    assert round_drift(base, one_noisy) == 0.0
    assert round_drift(base, {n: us * 1.1 for n, us in base.items()}) == pytest.approx(
        math.log(1.1)
    )
    assert round_drift(base, {n: us * (1 + ROUND_DRIFT / 2) for n, us in base.items()}) < (
        ROUND_DRIFT
    )


def test_a_cells_binds_run_in_its_gpu_turn_and_its_compiles_between_turns(monkeypatch):
    """As in the bench: tune processes sharing a GPU compile side by side, and anything that
    may launch work on the GPU (a bind) waits for the process's turn."""
    from contextlib import contextmanager

    from gdngen.problem import Problem
    from gdngen.tune import run

    in_turn = [False]
    events = []

    @contextmanager
    def gpu_turn():
        in_turn[0] = True
        try:
            yield
        finally:
            in_turn[0] = False

    class Recording:
        def __init__(self, target, name):
            self.name = name

        def compile(self, problem, args):
            events.append(("compile", self.name, in_turn[0]))

        def bind(self, problem, args):
            events.append(("bind", self.name, in_turn[0]))
            return type("Bound", (), {"run": lambda self: None})()

    monkeypatch.setattr(run, "Gdngen", Recording)
    monkeypatch.setattr(Problem, "make", lambda self, device: {"state": None})
    monkeypatch.setattr(run, "state_copy", lambda args: None)
    monkeypatch.setattr(run, "rotating_sets", lambda moved: 2)
    monkeypatch.setattr(run, "check_against_reference", lambda *args: 0.0)
    monkeypatch.setattr(run, "time_side_by_side", lambda runs, replays: dict.fromkeys(runs, 1.0))
    times = run.time_variants("h200", Problem(batch=1), ["x", "y"], replays=3, gpu_turn=gpu_turn)
    assert times == {"x": 1.0, "y": 1.0}
    assert events == [("compile", "x", False), ("compile", "y", False)] + [
        ("bind", name, True) for name in ("x", "y") for _ in range(2)
    ]


def test_settle_leaves_a_lone_variant_alone():
    first = {"only": 5.0}
    assert settle(first, lambda names: pytest.fail(f"re-timed {names}")) == first


# -- Other head dims in the grid (tuning.head_dims) -----------------------------------------------

WIDE = {
    **SMALL,
    "geometries": [*SMALL["geometries"], {"name": "wide", "H": 16, "HV": 32, "K": 256, "V": 256}],
    "variants": [
        *SMALL["variants"],
        {"layout": "k_last", "state_dtype": "bf16", "tile_v": 8, "ilp": 2, "vec": 8, "threads_per_group": 32},
        {"layout": "k_last", "state_dtype": "bf16", "tile_v": 32, "ilp": 2, "vec": 8, "threads_per_group": 32},
        {"layout": "k_last", "state_dtype": "fp32", "tile_v": 8, "ilp": 2, "vec": 4, "threads_per_group": 32, "k_splits": 2},
    ],
    "tuning": {**SMALL["tuning"], "head_dims": [[256, 256]]},
    "dispatch": [
        {"layout": "k_last", "state_dtype": "bf16", "head_dims": [256, 256], "tokens": [1, 8], "batch_heads": [1, None], "use": "kl_bf16_tv8_ilp2_vec8_tpg32_sm90"},
        {"layout": "k_last", "state_dtype": "fp32", "head_dims": [256, 256], "tokens": [1, 8], "batch_heads": [1, None], "use": "kl_fp32_tv8_ilp2_vec4_tpg32_ks2_sm90"},
        *SMALL["dispatch"],
    ],
}  # fmt: skip
WIDE_SMALL, WIDE_LARGE = "kl_bf16_tv8_ilp2_vec8_tpg32_sm90", "kl_bf16_tv32_ilp2_vec8_tpg32_sm90"


@pytest.fixture
def wide():
    return parse_spec(to_yaml(WIDE), "specs/mini.yaml")


def _wide_cells() -> list[Cell]:
    """bf16 at K = V = 256 (HV 32, the wide geometry's): the 32-row CTA wins from B = 64."""
    return [
        Cell(
            layout="k_last", state_dtype="bf16", tokens=T, mode=mode, HV=32, batch=B, K=256,
            V=256, times_us={WIDE_SMALL: 10.0 * B, WIDE_LARGE: 10.0 * B + (5 if B == 1 else -B)},
        )  # fmt: skip
        for mode, T in (("update", 1), ("update", 4), ("verify", 4))
        for B in (1, 64)
    ]


def test_the_grid_measures_each_head_dims_with_its_own_kernels_and_hvs(wide):
    from gdngen.tune.run import grid_sets

    assert wide.tuned_head_dims == ((128, 128), (256, 256))
    sets = {(l, d, dims): (names, HVs) for l, d, dims, names, HVs in grid_sets(wide, wide.served)}
    assert sets[("k_last", "bf16", (128, 128))] == (sorted([SMALL_V, LARGE_V]), (32, 64))
    assert sets[("k_last", "bf16", (256, 256))] == (sorted([WIDE_SMALL, WIDE_LARGE]), (32,))
    assert sets[("k_last", "fp32", (256, 256))] == (["kl_fp32_tv8_ilp2_vec4_tpg32_ks2_sm90"], (32,))
    # --heads 64 leaves no HV of the wide geometry; --head-dims 256 leaves only its sets
    assert {dims for _, _, dims, _, _ in grid_sets(wide, wide.served, heads=(64,))} == {(128, 128)}
    only = grid_sets(wide, wide.served, head_dims=((256, 256),))
    assert {dims for _, _, dims, _, _ in only} == {(256, 256)}


def test_cells_of_other_head_dims_round_trip_and_give_their_own_rules(wide, tmp_path):
    from gdngen.emit.plan import dispatch_rules, measured_sets, unmeasured_sets

    tuning = _tuning(wide, cells=_cells() + _wide_cells())
    text = dump_tuning(tuning)
    groups = {(c.mode, c.tokens, c.HV) for c in _wide_cells()}
    assert text.count("  k_last/bf16 K=256 V=256 ") == len(groups)  # a group each, by its key
    measured = load_tuning(_write(tmp_path, tuning), wide, "specs/mini.tuning.yaml")
    assert sorted(measured.cells, key=repr) == sorted(tuning.cells, key=repr)
    assert not measured.stale
    assert ("k_last", "bf16", (256, 256)) in measured_sets(wide, measured)
    assert unmeasured_sets(wide, measured) == {
        "k_last/fp32": "specs/mini.tuning.yaml has no cells of it",
        "k_last/fp32 K=256 V=256": "specs/mini.tuning.yaml has no cells of it",
    }
    rules = dispatch_rules(wide, measured)

    def pick(K, B):
        shape = CallShape(
            layout="k_last", state_dtype="bf16", tokens=1, batch_heads=B * 32, intermediate=False,
            head_dims=(K, K),
        )  # fmt: skip
        return select(rules, shape)

    assert pick(256, 1).use == WIDE_SMALL and pick(256, 64).use == WIDE_LARGE
    assert pick(256, 64).source == "t:kl/bf16/K256V256/update/T1/bh2048"
    assert pick(128, 1).use == SMALL_V  # the base's timings, not the wide ones
    # the static K = 256 bf16 rule is shadowed by the measured ones and dropped
    assert not any(r.head_dims == (256, 256) and r.source.startswith("spec") and
                   r.state_dtype == "bf16" for r in rules)  # fmt: skip


def test_a_variant_added_at_other_head_dims_makes_only_that_set_stale(wide, tmp_path):
    tuning = _tuning(wide, cells=_cells() + _wide_cells())
    data = yaml.safe_load(to_yaml(WIDE))
    data["variants"].append(
        {"layout": "k_last", "state_dtype": "bf16", "tile_v": 16, "ilp": 2, "vec": 8,
         "threads_per_group": 32}
    )  # fmt: skip
    changed = parse_spec(to_yaml(data), "specs/mini.yaml")
    measured = load_tuning(_write(tmp_path, tuning), changed)
    assert list(measured.stale) == ["k_last/bf16 K=256 V=256"]
    assert all(c.K is None for c in measured.cells)  # the base's cells still hold


def test_head_dims_of_the_grid_are_checked_against_the_geometries():
    from gdngen.spec import SpecError

    for dims, why in (([64, 64], "[64, 64] must be the (K, V) of a geometry"),
                      ([128, 128], "other than tuning.heads' [128, 128]")):  # fmt: skip
        data = yaml.safe_load(to_yaml(WIDE))
        data["tuning"]["head_dims"] = [dims]
        with pytest.raises(SpecError, match=r"tuning.head_dims\[0\]") as info:
            parse_spec(to_yaml(data), "specs/mini.yaml")
        assert why in str(info.value)


def test_remeasure_commands_name_the_head_dims(wide):
    from gdngen.tune.tuning_file import parse_head_dims, remeasure_command

    command = remeasure_command("specs/mini.yaml", wide, ["k_last/fp32", "k_last/bf16 K=256 V=256"])
    assert command == (
        "gdngen tune specs/mini.yaml --pairs k_last/fp32 --merge; "
        "gdngen tune specs/mini.yaml --pairs k_last/bf16 --head-dims 256 --merge"
    )
    assert parse_head_dims("256,128x64") == ((256, 256), (128, 64))
    with pytest.raises(ValueError, match="--head-dims"):
        parse_head_dims("K256")


def test_cli_head_dims_must_be_in_the_grid(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mini.yaml").write_text(to_yaml(SMALL))
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "tune", "specs/mini.yaml", "--head-dims", "256"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--head-dims 256: the grid of specs/mini.yaml measures 128" in run.stderr


def test_a_cell_that_does_not_fit_in_the_gpu_is_left_out_and_the_rest_measured(monkeypatch):
    """On an H100, the verify cell of K = V = 256 fp32 at T = 8, B = 512 (32 GiB of per-token
    states beside the checks' copies) ran out of memory and took the whole run down with it:
    now that cell alone is left out, said so, and the run goes on (run without a GPU here)."""
    import io

    import torch

    from gdngen.tune import run

    spec = load_spec(ROOT / "specs" / "h200.yaml")
    monkeypatch.setattr(run.torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(run, "copy_bandwidth", lambda: 3.0e12)
    monkeypatch.setattr(run, "environment", lambda: {"versions": {"torch": "x"}})

    def time_variants(target, problem, names, **kwargs):
        if problem.batch == 512 and getattr(problem, "cache_steps", None):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
        return {name: 1.0 + problem.batch + index for index, name in enumerate(names)}

    monkeypatch.setattr(run, "time_variants", time_variants)
    progress = io.StringIO()
    measured = run.tune(
        spec, ["tune"], pairs=[("k_last", "fp32")], tokens=(8,), head_dims=((256, 256),),
        progress=progress,
    )  # fmt: skip
    got = {(c.mode, c.batch) for c in measured.cells}
    batches = set(spec.tuning.batch)
    assert got == {(m, b) for m in ("update", "spec") for b in batches} | {
        ("verify", b) for b in batches - {512}
    }
    assert all((c.K, c.V, c.HV, c.tokens) == (256, 256, 32, 8) for c in measured.cells)
    assert "T=8 verify HV= 32 B= 512: not measured: its inputs and checks do not fit" in (
        progress.getvalue()
    )
