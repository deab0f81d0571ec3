"""Specs for the CPU tests: the committed Hopper spec, and a frozen snapshot of it to derive broken
specs from (so that tuning specs/h200.yaml does not move the indices the validation tests poke)."""

import copy
import difflib
from pathlib import Path

import yaml

from gdngen.emit.plan import plan_target
from gdngen.emit.render import render
from gdngen.spec import parse_spec
from gdngen.spec.model import Variant

ROOT = Path(__file__).resolve().parent.parent
SPEC_REL = "specs/h200.yaml"
SPEC_PATH = ROOT / SPEC_REL
GENERATED = ROOT / "generated"

#: specs/h200.yaml as first written: 12 variants, 9 static dispatch rules
SNAPSHOT = """\
target: h200
sm: sm_90a
description: NVIDIA H100 / H200 (Hopper)
geometries:
  - {name: qwen3-next, H: 16, HV: 32, K: 128, V: 128}
  - {name: qwen3.5, H: 16, HV: 64, K: 128, V: 128}
features:
  max_tokens: 8
  index_dtypes: [int32, int64]
variants:
  - {layout: k_last, state_dtype: bf16, tile_v: 8, ilp: 2, vec: 8, threads_per_group: 16}   # 0
  - {layout: k_last, state_dtype: bf16, tile_v: 16, ilp: 4, vec: 8, threads_per_group: 16}  # 1
  - {layout: k_last, state_dtype: bf16, tile_v: 32, ilp: 4, vec: 8, threads_per_group: 16}  # 2
  - {layout: k_last, state_dtype: bf16, tile_v: 64, ilp: 4, vec: 8, threads_per_group: 16}  # 3, unused
  - {layout: k_last, state_dtype: fp32, tile_v: 8, ilp: 2, vec: 4, threads_per_group: 32}   # 4
  - {layout: k_last, state_dtype: fp32, tile_v: 16, ilp: 4, vec: 4, threads_per_group: 32}  # 5
  - {layout: k_last, state_dtype: fp32, tile_v: 32, ilp: 4, vec: 4, threads_per_group: 32}  # 6, unused
  - {layout: v_last, state_dtype: bf16, tile_v: 16, ilp: 8, vec: 8, threads_per_group: 16}  # 7
  - {layout: v_last, state_dtype: bf16, tile_v: 32, ilp: 8, vec: 8, threads_per_group: 16}  # 8
  - {layout: v_last, state_dtype: fp32, tile_v: 8, ilp: 4, vec: 8, threads_per_group: 16}   # 9
  - {layout: v_last, state_dtype: fp32, tile_v: 16, ilp: 4, vec: 8, threads_per_group: 16}  # 10
  - {layout: v_last, state_dtype: fp32, tile_v: 32, ilp: 4, vec: 8, threads_per_group: 16}  # 11, unused
dispatch:
  - {layout: k_last, state_dtype: bf16, tokens: [1, 8], batch_heads: [1, 256], use: kl_bf16_tv8_ilp2_vec8_tpg16_sm90}
  - {layout: k_last, state_dtype: bf16, tokens: [1, 8], batch_heads: [257, 1024], use: kl_bf16_tv16_ilp4_vec8_tpg16_sm90}
  - {layout: k_last, state_dtype: bf16, tokens: [1, 8], batch_heads: [1025, null], use: kl_bf16_tv32_ilp4_vec8_tpg16_sm90}
  - {layout: k_last, state_dtype: fp32, tokens: [1, 8], batch_heads: [1, 256], use: kl_fp32_tv8_ilp2_vec4_tpg32_sm90}
  - {layout: k_last, state_dtype: fp32, tokens: [1, 8], batch_heads: [257, null], use: kl_fp32_tv16_ilp4_vec4_tpg32_sm90}
  - {layout: v_last, state_dtype: bf16, tokens: [1, 8], batch_heads: [1, 1024], use: vl_bf16_tv16_ilp8_vec8_tpg16_sm90}
  - {layout: v_last, state_dtype: bf16, tokens: [1, 8], batch_heads: [1025, null], use: vl_bf16_tv32_ilp8_vec8_tpg16_sm90}
  - {layout: v_last, state_dtype: fp32, tokens: [1, 8], batch_heads: [1, 256], use: vl_fp32_tv8_ilp4_vec8_tpg16_sm90}
  - {layout: v_last, state_dtype: fp32, tokens: [1, 8], batch_heads: [257, null], use: vl_fp32_tv16_ilp4_vec8_tpg16_sm90}
"""


def snapshot_dict() -> dict:
    """A fresh, mutable copy of SNAPSHOT as plain data."""
    return yaml.safe_load(SNAPSHOT)


def h200_dict() -> dict:
    """A fresh, mutable copy of the committed specs/h200.yaml as plain data."""
    return copy.deepcopy(yaml.safe_load(SPEC_PATH.read_text()))


def to_yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def _one_variant_files(variant: dict) -> tuple[str, dict]:
    """The name of one variant (knobs as in a spec) and the planned files of a one-variant sm_90a
    spec, by path."""
    name = Variant(**variant).name_for("sm_90a")
    spec = parse_spec(
        to_yaml(
            {
                "target": "mini",
                "sm": "sm_90a",
                "geometries": [{"name": "g", "H": 16, "HV": 32, "K": 128, "V": 128}],
                "variants": [variant],
                "dispatch": [
                    {"layout": variant["layout"], "state_dtype": variant["state_dtype"],
                     "tokens": [1, 8], "batch_heads": [1, None], "use": name},
                ],
            }  # fmt: skip
        ),
        "specs/mini.yaml",
    )
    return name, {p.relpath: p for p in plan_target(spec, "specs/mini.yaml")}


def kernel_text(variant: dict) -> str:
    """The device code of one variant (knobs as in a spec): the emitted body module of its shape,
    from a one-variant sm_90a spec."""
    from gdngen.emit.shape import KernelShape
    from gdngen.spec.model import Variant

    _, files = _one_variant_files(variant)
    return render(files[f"bodies/{KernelShape.of(Variant(**variant)).name}.py"])


def variant_text(variant: dict) -> str:
    """The emitted row of one variant (knobs as in a spec), with the comment above it."""
    name, files = _one_variant_files(variant)
    lines = render(files["kernels/__init__.py"]).splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(f'    Row("{name}"'))
    comment = row
    while lines[comment - 1].startswith("    # "):
        comment -= 1
    return "\n".join(lines[comment : row + 1])


def changed_code_lines(before: str, after: str) -> list[str]:
    """Changed lines below the module docstring (the header hash and the docstring, which names
    the variant or body and describes it, change with any knob)."""

    def code(text: str) -> list[str]:
        return text.split('"""', 2)[2].splitlines()

    return [
        line
        for line in difflib.unified_diff(code(before), code(after), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def evidence_tables(text: str) -> dict[str, tuple[str, dict[str, tuple[str, list[str]]]]]:
    """An emitted dispatch_evidence.txt read back: per table ("TABLE", or the GPU model of a
    table in TABLES), the tuning file it names and, by each measured row's source, the row's
    plan (gdngen.terms.plan_name) and evidence lines. The rows a table left out are not read."""
    tables: dict = {}
    rows: dict = {}
    for line in text.splitlines():
        if line.startswith("Measured, and left out of "):
            rows = {}  # not the table's
        elif line.startswith(("TABLE: ", "TABLES[")):
            name, file = line.split(": ")
            rows = {}
            tables["TABLE" if name == "TABLE" else name.split('"')[1]] = (file, rows)
        elif line.startswith("t:"):
            source, use = line.split()
            rows[source] = (use, [])
        elif line.startswith("    ") and rows:
            rows[source][1].append(line.strip())
    return tables
