"""SM targets without a GPU: each target's limits are checked against its variants, a spec can
extend another for a second SM, and a call on the wrong GPU is told which import serves it."""

import importlib
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import generated.b200 as b200
import generated.h200 as h200
from gdngen.emit import EmitError, check, emit, plan_target
from gdngen.emit.shape import KernelShape
from gdngen.runtime.kernel_dir import file_content_sha256
from gdngen.runtime.siblings import targets_built_for, wrong_gpu_message
from gdngen.spec import SpecError, load_spec, parse_spec, spec_sha256
from gdngen.sm import SM_FACTS
from gdngen.runtime.kernel_table import load_kernel
from gdngen.terms import sm_suffix
from tests.spec_helpers import to_yaml

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
#: the shipped targets that extend another spec: (target, the spec it extends, its SM)
EXTENDED = [("b300", "b200", "sm_103a"), ("rtx_blackwell", "h200", "sm_120a"),
            ("dgx_spark", "rtx_blackwell", "sm_121a")]  # fmt: skip


@pytest.mark.parametrize("target,parent,sm", EXTENDED, ids=[t for t, _, _ in EXTENDED])
def test_an_extending_spec_takes_the_parents_knob_points_on_its_own_sm(target, parent, sm):
    child, base = load_spec(SPECS / f"{target}.yaml"), load_spec(SPECS / f"{parent}.yaml")
    assert (child.target, child.sm) == (target, sm)
    assert child.variants == base.variants
    assert child.geometries == base.geometries
    # The inherited rules name the same knob points, compiled for this SM.
    assert [r.use.removesuffix(sm_suffix(sm)) for r in child.dispatch] == [
        r.use.removesuffix(sm_suffix(base.sm)) for r in base.dispatch
    ]
    assert all(r.use.endswith("_" + sm_suffix(sm)) for r in child.dispatch)
    # Another part's timings do not describe this one: no tuning, static rules.
    assert child.tuning is None


def _write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.write_text(to_yaml(data))
    return path


def _base(tmp_path: Path) -> Path:
    return _write(tmp_path, "base.yaml", load_spec(SPECS / "b200.yaml").model_dump(mode="json"))


def test_sections_the_child_names_replace_the_parents_whole(tmp_path):
    base = load_spec(_base(tmp_path))
    geometry = {"name": "only", "H": 8, "HV": 16, "K": 128, "V": 128}
    # (every variant must serve some geometry, so the child keeps one of each other head dims)
    others = [asdict(g) for g in base.geometries if (g.K, g.V) != (128, 128)]
    # (the parent's build section names its geometries, so replacing them replaces it too)
    child = _write(tmp_path, "child.yaml", {"extends": "base.yaml", "target": "child",
                                            "sm": "sm_103a", "geometries": [geometry, *others],
                                            "build": {"modes": ["update"]}})  # fmt: skip
    spec = load_spec(child)
    assert [g.name for g in spec.geometries] == ["only", "head-dim-64", "head-dim-256"]
    assert spec.build.geometries is None and spec.build.modes == ("update",)
    assert spec.features == load_spec(tmp_path / "base.yaml").features


def test_editing_the_parent_makes_the_child_stale(tmp_path):
    base = _base(tmp_path)
    child = _write(tmp_path, "child.yaml", {"extends": "base.yaml", "target": "child",
                                            "sm": "sm_103a"})  # fmt: skip
    before = spec_sha256(load_spec(child))
    data = load_spec(base).model_dump(mode="json")
    data["features"]["max_tokens"] = 4
    data["dispatch"] = [{**r, "tokens": [1, 4]} for r in data["dispatch"]]
    _write(tmp_path, "base.yaml", data)
    assert spec_sha256(load_spec(child)) != before


def test_a_child_with_its_own_rules_names_its_own_kernels(tmp_path):
    _base(tmp_path)
    rules = load_spec(tmp_path / "base.yaml").model_dump(mode="json")["dispatch"]
    child = _write(tmp_path, "child.yaml", {"extends": "base.yaml", "target": "child",
                                            "sm": "sm_103a", "dispatch": rules})  # fmt: skip
    with pytest.raises(SpecError, match=r"dispatch\[0\]\.use: unknown variant '\w+_sm100'"):
        load_spec(child)


@pytest.mark.parametrize(
    "extends,expected",
    [
        ("missing.yaml", r"x/child\.yaml: extends: cannot read .*missing\.yaml"),
        (["base.yaml"], r"extends: expected the path of a spec file, got \['base.yaml'\]"),
        ("child.yaml", r"extends: child\.yaml leads back to this spec \(a cycle\)"),
    ],
    ids=["missing", "not_a_path", "cycle"],
)
def test_bad_extends(tmp_path, extends, expected):
    folder = tmp_path / "x"
    folder.mkdir()
    _base(folder)
    child = _write(folder, "child.yaml", {"extends": extends, "target": "child"})
    with pytest.raises(SpecError, match=expected):
        load_spec(child)


def test_a_cycle_through_two_specs(tmp_path):
    _write(tmp_path, "one.yaml", {"extends": "two.yaml"})
    _write(tmp_path, "two.yaml", {"extends": "one.yaml"})
    with pytest.raises(SpecError, match=r"two\.yaml: extends: one\.yaml leads back"):
        load_spec(tmp_path / "one.yaml")


# -- kernels of an extending target --------------------------------------------------------------


@pytest.mark.parametrize("target,parent,sm", EXTENDED, ids=[t for t, _, _ in EXTENDED])
def test_an_extending_target_compiles_the_kernel_bodies_of_the_spec_it_extends(target, parent, sm):
    spec = load_spec(SPECS / f"{target}.yaml")
    root = spec.ancestors[-1][0]  # dgx_spark -> rtx_blackwell -> h200: the bodies are h200's
    assert not (ROOT / "generated" / target / "bodies").exists()  # the root has every shape
    table = importlib.import_module(f"generated.{target}.kernels").KERNELS
    for variant in spec.variants:
        name, body = spec.variant_name(variant), KernelShape.of(variant).name
        assert table.rows[name].body == f"...{root.target}.bodies.{body}", name
        assert table.body_path(name) == ROOT / "generated" / root.target / "bodies" / f"{body}.py"
    variant = spec.variants[-1]
    module = load_kernel(f"generated.{target}.kernels.{spec.variant_name(variant)}")
    root_module = load_kernel(f"generated.{root.target}.kernels.{root.variant_name(variant)}")
    # One device code, its own name and host side (the kernel's symbol names this target's SM).
    assert module.device_code is root_module.device_code
    assert module.NAME != root_module.NAME and module.launch is not root_module.launch
    assert (module.LAYOUT, module.THREADS, module.HEAD_K_DIM) == (
        root_module.LAYOUT,
        root_module.THREADS,
        root_module.HEAD_K_DIM,
    )


def test_a_shape_the_parent_lacks_gets_its_own_kernel_body(tmp_path):
    _base(tmp_path)
    variants = load_spec(tmp_path / "base.yaml").model_dump(mode="json")["variants"]
    # a knob point b200 lacks, of a shape it has; and one of a shape it lacks (the staged solve)
    knobs = dict(layout="k_last", state_dtype="bf16", vec=8, threads_per_group=16)
    new_point = dict(knobs, tile_v=32, ilp=2)
    new_shape = dict(knobs, tile_v=64, ilp=8, solve="staged")
    child = _write(tmp_path, "child.yaml", {"extends": "base.yaml", "target": "child",
                                            "sm": "sm_103a",
                                            "variants": variants + [new_point, new_shape]})  # fmt: skip
    spec = load_spec(child)
    planned = {p.relpath: p for p in plan_target(spec, "child.yaml")}
    rows = dict(
        (kernel.name, body) for kernel, body in planned["kernels/__init__.py"].context["rows"]
    )
    point, shape = (spec.variant_name(v) for v in spec.variants[-2:])
    assert rows[point] == "...b200.bodies.kl_stepwise"
    assert rows[shape] == "..bodies.kl_staged"
    assert sorted(p for p in planned if p.startswith("bodies/")) == [
        "bodies/__init__.py",
        "bodies/kl_staged.py",
    ]
    # a variant is a row of the table, never a module of its own (beside it: the step kernels)
    assert sorted(p for p in planned if p.startswith("kernels/")) == [
        "kernels/__init__.py",
        "kernels/conv_step_sm103.py",
        "kernels/norm_step_sm103.py",
    ]


def test_a_child_is_not_emitted_before_the_bodies_it_reuses(tmp_path):
    _base(tmp_path)
    child = _write(tmp_path, "child.yaml", {"extends": "base.yaml", "target": "child",
                                            "sm": "sm_103a"})  # fmt: skip
    out = tmp_path / "generated"
    spec = load_spec(child)
    expected = (rf"child reuses the kernel bodies of {tmp_path}/base\.yaml, but \d+ of them are "
                rf"not emitted \(first: generated/b200/bodies/\w+\.py\); run: gdngen emit "
                rf"{tmp_path}/base\.yaml")  # fmt: skip
    with pytest.raises(EmitError, match=expected):
        emit(spec, "child.yaml", out)
    assert not (out / "child").exists()
    assert re.search(expected, check(spec, "child.yaml", out)[0])


def test_an_edited_body_changes_the_build_fingerprint_of_every_target_compiling_it(tmp_path):
    # dgx_spark's rows run h200's bodies: a copy of both packages, then h200's body re-emitted
    spec = load_spec(SPECS / "dgx_spark.yaml")
    name = spec.variant_name(spec.variants[0])
    body = tmp_path / "gen" / "h200" / "bodies" / f"{KernelShape.of(spec.variants[0]).name}.py"
    for target in ("h200", "dgx_spark"):
        shutil.copytree(ROOT / "generated" / target, tmp_path / "gen" / target)
    (tmp_path / "gen" / "__init__.py").write_text("")
    probe = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from gdngen.runtime.kernel_table import kernel_content_sha256
print(kernel_content_sha256("gen.dgx_spark.kernels.{name}"))
"""

    def content():
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    before = content()
    row, body_hash = before.split("+")
    assert body_hash == file_content_sha256(body)
    text = body.read_text().splitlines(keepends=True)
    text[2] = "# Content sha256: 0123456789abcdef\n"  # the body as a template edit re-emits it
    body.write_text("".join(text))
    assert content() == f"{row}+0123456789abcdef"


# -- each target's own limits ---------------------------------------------------------------------


def _spec_on(sm: str, **variant_knobs) -> str:
    data = load_spec(SPECS / "h200.yaml").model_dump(mode="json")
    data.update(sm=sm, tuning=None)
    data["dispatch"] = [{**r, "use": r["use"].replace("_sm90", "_" + sm_suffix(sm))}
                        for r in data["dispatch"]]  # fmt: skip
    data["variants"].append(variant_knobs)
    return to_yaml(data)


def test_occupancy_bounds_are_checked_against_the_targets_threads_per_sm():
    # 4 CTAs of 512 threads: 2048 fit an sm_90a SM, not the 1536 of an sm_120a SM.
    knobs = dict(layout="k_last", state_dtype="bf16", tile_v=32, ilp=1, vec=8,
                 threads_per_group=16, min_ctas_per_sm=4)  # fmt: skip
    parse_spec(_spec_on("sm_90a", **knobs), "x.yaml")
    with pytest.raises(SpecError) as info:
        parse_spec(_spec_on("sm_120a", **knobs), "x.yaml")
    assert "min_ctas_per_sm=4 CTAs of 512 threads exceed the 1536 threads an SM of sm_120a" in str(
        info.value
    )


@pytest.mark.parametrize("sm", ["sm_90a", "sm_120a", "sm_121a"])
def test_packed_fma_needs_a_target_that_has_it(sm):
    knobs = dict(layout="k_last", state_dtype="bf16", tile_v=64, ilp=8, vec=8,
                 threads_per_group=16, packed_fma=True)  # fmt: skip
    with pytest.raises(
        SpecError, match=f"packed_fma needs sm_100a or sm_103a; this spec targets {sm}"
    ):
        parse_spec(_spec_on(sm, **knobs), "x.yaml")
    parse_spec(_spec_on("sm_103a", **knobs), "x.yaml")


def test_every_sm_target_has_its_facts_and_a_shipped_spec():
    shipped = {load_spec(path).sm for path in SPECS.glob("*.yaml") if ".tuning." not in path.name}
    assert shipped == set(SM_FACTS)


# -- the wrong GPU ---------------------------------------------------------------------------------


def test_the_import_that_serves_the_gpu_is_named():
    message = wrong_gpu_message(b200.INFO, "sm_90a", "NVIDIA H100 80GB HBM3", "generated")
    assert message == (
        "q: target b200 is built for sm_100a (Blackwell: B200, GB200); the tensors are on NVIDIA "
        "H100 80GB HBM3, an sm_90a GPU. Use `from generated.h200 import gdn_decode`."
    )
    message = wrong_gpu_message(h200.INFO, "sm_121a", "NVIDIA GB10", "generated")
    assert message.endswith("Use `from generated.dgx_spark import gdn_decode`.")


def test_targets_are_found_by_their_sm():
    assert targets_built_for("sm_100a", "generated") == ["generated.b200"]
    assert targets_built_for("sm_120a", "generated") == ["generated.rtx_blackwell"]
    assert targets_built_for("sm_90a", "no_such_package") == []


def test_an_sm_without_an_emitted_target_or_without_support():
    message = wrong_gpu_message(h200.INFO, "sm_103a", "NVIDIA B300", "no_such_package")
    assert (
        "No target under no_such_package/ is built for sm_103a: write a spec with `sm: sm_103a`"
        in message
    )
    message = wrong_gpu_message(h200.INFO, "sm_89a", "NVIDIA L40S", "generated")
    assert message.endswith(
        "gdngen has no sm_89a target; it builds for sm_90a, sm_100a, sm_103a, sm_120a, sm_121a."
    )
