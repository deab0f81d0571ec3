"""Dispatch per GPU model within one target (CPU): a tuning file per model, a table per model in
the emitted dispatch, the device's table chosen at run time (said, with a warning for a model
that has none), and builds that cover every table."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import generated.h200 as h200
from gdngen.dispatch import CallShape, Range, Rule, select
from gdngen.runtime.build import target_keys
from gdngen.runtime.target import Target
from gdngen.spec import SpecError, load_spec, parse_spec
from gdngen.tune.tuning_file import dump_tuning, gpu_model, tuning_path
from tests.spec_helpers import ROOT, evidence_tables, to_yaml
from tests.test_tuning import LARGE_V, SMALL, SMALL_V, _cells, _tuning

TWO_GPUS = {**SMALL, "tuning": {**SMALL["tuning"], "gpu": "H200", "other_gpus": ["H100"]}}
H100_NAME = "NVIDIA H100 80GB HBM3"


def test_each_gpu_model_has_its_own_tuning_file():
    spec = parse_spec(to_yaml(TWO_GPUS), "specs/mini.yaml")
    assert tuning_path(Path("specs/mini.yaml"), spec, "H200") == Path("specs/mini.tuning.yaml")
    assert tuning_path(Path("specs/mini.yaml"), spec, "H100") == Path("specs/mini.tuning.h100.yaml")
    other = {**TWO_GPUS, "tuning": {**TWO_GPUS["tuning"], "other_gpus": ["RTX PRO 6000"]}}
    spec_other = parse_spec(to_yaml(other), "specs/mini.yaml")
    assert tuning_path(Path("specs/mini.yaml"), spec_other, "RTX PRO 6000").name == (
        "mini.tuning.rtx-pro-6000.yaml"
    )
    assert gpu_model(spec, H100_NAME) == "H100"
    assert gpu_model(spec, "NVIDIA H200") == "H200"
    assert gpu_model(spec, "NVIDIA H800 PCIe") is None


@pytest.mark.parametrize("others", [["H100", "H100 NVL"], ["h200"]], ids=["overlap", "twice"])
def test_a_gpu_model_named_twice_is_refused(others):
    data = {**TWO_GPUS, "tuning": {**TWO_GPUS["tuning"], "other_gpus": others}}
    with pytest.raises(SpecError, match=r"tuning: other_gpus: .* would both match one GPU's name"):
        parse_spec(to_yaml(data), "specs/mini.yaml")


@pytest.fixture
def two_gpu_project(tmp_path):
    """specs/mini.yaml measured on an H200 (the small kernel wins everywhere) and on an H100 (the
    large one wins from B*HV = 2048), emitted by the command line."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mini.yaml").write_text(to_yaml(TWO_GPUS))
    spec = parse_spec(to_yaml(TWO_GPUS), "specs/mini.yaml")
    small_wins = [c.model_copy(update={"times_us": {SMALL_V: 1.0, LARGE_V: 2.0}}) for c in _cells()]
    h200_file = _tuning(spec, gpu="NVIDIA H200", cells=small_wins)
    (specs / "mini.tuning.yaml").write_text(dump_tuning(h200_file))
    (specs / "mini.tuning.h100.yaml").write_text(dump_tuning(_tuning(spec, gpu=H100_NAME)))
    runs = [
        subprocess.run([sys.executable, "-m", "gdngen", *args, "specs/mini.yaml"], cwd=tmp_path,
                       capture_output=True, text=True)
        for args in (["emit"], ["emit", "--check"])
    ]  # fmt: skip
    return tmp_path, runs


def test_emit_writes_a_table_per_measured_gpu_model(two_gpu_project):
    project, runs = two_gpu_project
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "on H100: specs/mini.tuning.h100.yaml" in run.stdout
    namespace: dict = {}
    exec((project / "generated/mini/dispatch.py").read_text(), namespace)
    assert namespace["TABLE_GPU"] == "H200" and list(namespace["TABLES"]) == ["H100"]
    big = CallShape("k_last", "bf16", 4, 8192, True, (128, 128))
    on_h200, on_h100 = select(namespace["TABLE"], big), select(namespace["TABLES"]["H100"], big)
    assert on_h200.use == SMALL_V and on_h100.use == LARGE_V
    # each table's measured rows cite its own file
    evidence = evidence_tables((project / "generated/mini/dispatch_evidence.txt").read_text())
    assert {gpu: file for gpu, (file, _) in evidence.items()} == {
        "TABLE": "specs/mini.tuning.yaml",
        "H100": "specs/mini.tuning.h100.yaml",
    }
    assert evidence["TABLE"][1][on_h200.source][0] == SMALL_V
    assert evidence["H100"][1][on_h100.source][0] == LARGE_V
    manifest = (project / "generated/mini/MANIFEST.txt").read_text()
    assert (
        "# Dispatch on H100: its own table, measured (specs/mini.tuning.h100.yaml): k_last/bf16; "
        "static rules for k_last/fp32" in manifest
    )


def test_a_file_measured_on_another_gpu_model_does_not_become_its_table(two_gpu_project):
    project, _ = two_gpu_project
    spec = parse_spec(to_yaml(TWO_GPUS), "specs/mini.yaml")
    (project / "specs/mini.tuning.h100.yaml").write_text(
        dump_tuning(_tuning(spec, gpu="NVIDIA H200"))
    )
    run = subprocess.run([sys.executable, "-m", "gdngen", "emit", "specs/mini.yaml"],
                         cwd=project, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    namespace: dict = {}
    exec((project / "generated/mini/dispatch.py").read_text(), namespace)
    sources = {rule.source for rule in namespace["TABLES"]["H100"]}
    assert sources == {"spec[0]", "spec[1]"}  # stale: the static rules


def _rule(use: str, lo: int, hi: int | None) -> Rule:
    return Rule(layout="k_last", state_dtype="bf16", tokens=Range(lo=1, hi=8),
                batch_heads=Range(lo=lo, hi=hi), use=use)  # fmt: skip


SMALL_H = "kl_bf16_tv8_ilp2_vec8_tpg16_sm90"
LARGE_H = "kl_bf16_tv32_ilp4_vec8_tpg16_sm90"


def _target(tables, table_gpu="H200") -> Target:
    return Target(h200.INFO, (_rule(SMALL_H, 1, None),), h200.VARIANTS,
                  kernels_package="generated.h200.kernels", tables=tables, table_gpu=table_gpu)  # fmt: skip


def test_the_device_name_picks_the_table_and_says_which():
    target = _target({"H100": (_rule(SMALL_H, 1, 1024), _rule(LARGE_H, 1025, None))})
    on_h100 = target.table_for(H100_NAME)
    assert on_h100.table is target.tables["H100"] and not on_h100.fallback
    assert on_h100.reason == f"{H100_NAME}: the table measured on H100"
    on_h200 = target.table_for("NVIDIA H200")
    assert on_h200.table is target.table and not on_h200.fallback
    other = target.table_for("NVIDIA H800 PCIe")
    assert other.table is target.table and other.fallback
    assert "has no table measured on this GPU model (it has H200, H100)" in other.reason
    assert "add the model to tuning.other_gpus in specs/h200.yaml" in other.reason
    shape = dict(layout="k_last", state_dtype="bf16", tokens=1, batch_heads=4096,
                 intermediate=False, head_dims=(128, 128))  # fmt: skip
    assert target.select(**shape, gpu=H100_NAME).use == LARGE_H
    assert target.select(**shape, gpu="NVIDIA H200").use == SMALL_H


def test_a_target_of_static_rules_only_has_no_fallback_to_report():
    choice = _target({}, table_gpu=None).table_for("NVIDIA RTX PRO 6000 Blackwell")
    assert not choice.fallback and choice.reason.endswith("the spec's static rules")


def test_a_target_naming_unknown_variants_in_a_gpu_table_does_not_import():
    with pytest.raises(ImportError, match=r"dispatch rules name unknown variants \['nope_sm90'\]"):
        _target({"H100": (_rule("nope_sm90", 1, None),)})


def test_a_build_covers_every_gpu_models_table():
    spec = load_spec(ROOT / "specs/h200.yaml")
    only_h100 = "kl_bf16_tv64_ilp4_vec4_tpg32_passes2_pf_staged_sm90"
    h100_table = tuple(
        replace(r, use=only_h100) if (r.layout, r.state_dtype) == ("k_last", "bf16")
        else r
        for r in h200.dispatch.TABLE
    )  # fmt: skip
    default = SimpleNamespace(dispatch=SimpleNamespace(TABLE=h200.dispatch.TABLE, TABLES={}))
    both = SimpleNamespace(dispatch=SimpleNamespace(TABLE=h200.dispatch.TABLE,
                                                    TABLES={"H100": h100_table}))  # fmt: skip
    assert only_h100 not in {k.variant for k in target_keys(spec, default)}
    keys = target_keys(spec, both)
    assert only_h100 in {k.variant for k in keys}
    assert set(target_keys(spec, default)) < set(keys)
