"""Tensor-parallel shards (CPU): the shipped specs carry each model at TP 1, 2, 4 and 8, a call of
any of them passes the geometry check, and `gdngen build` compiles the spec's build geometries
unless told others."""

import subprocess
import sys

import pytest

import generated.b300 as b300
import generated.h200 as h200
from gdngen.runtime.build import target_keys
from gdngen.spec import SpecError, load_spec, parse_spec
from tests.spec_helpers import ROOT, to_yaml

#: per-GPU (H, HV) of each model at TP 1, 2, 4, 8
MODELS = {"qwen3-next": (16, 32), "qwen3.5": (16, 64), "qwen3.6-27b": (16, 48)}
SHARDS = {
    (name if tp == 1 else f"{name}-tp{tp}", H // tp, HV // tp)
    for name, (H, HV) in MODELS.items()
    for tp in (1, 2, 4, 8)
}


@pytest.mark.parametrize("target", [h200, b300], ids=["h200", "b300"])
def test_every_model_is_served_at_tp_1_2_4_8(target):
    models = [g for g in target.INFO.geometries if not g.name.startswith("head-dim-")]
    assert {(g.name, g.H, g.HV) for g in models} == SHARDS
    assert all((g.K, g.V) == (128, 128) for g in models)


def test_the_default_build_compiles_the_build_geometries_and_a_flag_adds_others():
    spec = load_spec(ROOT / "specs/h200.yaml")
    default = {(k.H, k.HV) for k in target_keys(spec, h200)}
    assert default == {(16, 32), (16, 64)}
    shard = {(k.H, k.HV) for k in target_keys(spec, h200, ("qwen3.5-tp2", "qwen3.6-27b-tp8"))}
    assert shard == {(8, 32), (2, 6)}
    with pytest.raises(
        ValueError, match=r"geometries: qwen9 not in target h200 \(it has qwen3-next"
    ):
        target_keys(spec, h200, ("qwen9",))


def test_build_geometries_must_name_the_specs_geometries():
    data = load_spec(ROOT / "specs/h200.yaml").model_dump(mode="json")
    data["build"]["geometries"] = ["qwen3.5", "qwen9"]
    with pytest.raises(
        SpecError, match=r"build\.geometries: qwen9 not among the spec's geometries"
    ):
        parse_spec(to_yaml(data), "specs/h200.yaml")


def test_cli_build_refuses_an_unknown_geometry_before_compiling(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "gdngen", "build", "specs/h200.yaml", "--no-check",
         "--geometries", "qwen3.5,qwen9", "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert "gdngen build: geometries: qwen9 not in target h200" in run.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_tune_measures_an_hv_on_the_first_geometry_that_has_it():
    """HV 32 is Qwen3-Next at TP 1 (H=16) and Qwen3.5 at TP 2 (H=8): the tune keeps measuring the
    full model, as the committed timings did."""
    spec = load_spec(ROOT / "specs/h200.yaml")
    assert (spec.tuning_geometry(32).name, spec.tuning_geometry(32).H) == ("qwen3-next", 16)
    assert (spec.tuning_geometry(64).name, spec.tuning_geometry(64).H) == ("qwen3.5", 16)
    assert spec.tuning_geometry(16).name == "qwen3-next-tp2"
