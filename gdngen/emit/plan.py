"""What a spec emits: the list of files of one target, each with its template and context.

This is the one place where variants are enumerated (sorted by canonical name), and where every
number a template prints is prepared. Templates only branch on variant fields.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gdngen.spec import Spec, spec_sha256
from gdngen.spec.model import LOAD_CACHE_PTX, STORE_CACHE_PTX, DispatchRule, Range, Variant
from gdngen.tune.tuning_file import TuningError, TuningFile, tuned_rows

#: bumped when the emitted files' shape changes in a way their inputs do not show
GENERATOR_VERSION = "1"
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
#: the kernel template and every partial it imports or includes (their text shapes each kernel)
KERNEL_TEMPLATES = ("decode.py.j2", "_macros.j2", "_solve_stepwise.j2", "_solve_staged.j2")


@dataclass(frozen=True)
class VariantView:
    """A variant as its template sees it: every knob and derived number of :class:`Variant`
    (read through, so a new knob or property needs no change here), plus the variant's name and
    the prose of its docstring."""

    variant: Variant
    name: str
    layout_doc: str
    summary: str

    def __getattr__(self, attr: str):
        return getattr(self.variant, attr)

    @classmethod
    def of(cls, spec: Spec, variant: Variant) -> "VariantView":
        return cls(
            variant=variant,
            name=spec.variant_name(variant),
            layout_doc=(
                "K-last [pool, HV, V, K]"
                if variant.layout == "k_last"
                else "V-last [pool, HV, K, V]"
            ),
            summary=_summary(variant),
        )


def _summary(variant: Variant) -> str:
    """The kernel docstring's paragraph on how the variant maps the state onto lanes."""
    lanes = "lane" if variant.threads_per_group == 1 else "lanes"
    splits = f" in each of {variant.k_splits} K splits" if variant.k_splits > 1 else ""
    tiles = ","
    if variant.row_passes > 1:
        overlap = " (each loaded while the one before computes)" if variant.prefetch else ""
        unrolled = " in an unrolled loop" if variant.unroll_passes else ""
        tiles = f", {variant.row_passes} tiles one after the other{unrolled}{overlap},"
    if variant.solve == "stepwise":
        steps = len(variant.butterfly_offsets)
        over = [f"the group with a {steps}-step butterfly"] if steps else []
        if variant.k_splits > 1:
            over.append(f"the {variant.k_splits} K splits in shared memory")
        reduction = f"reduces its dot products over {' and over '.join(over)}, token by token"
        if variant.preload_tokens:
            reduction += " (every token's q, k, v and gates loaded before the first)"
    else:
        reduction = (
            f"solves the tokens staged: q, k and the gates of all T tokens are staged once per "
            f"CTA in shared memory, every dot product is taken against the initial state and "
            f"reduce-scattered so that a lane owns {variant.rows_held} row(s), and the deltas are "
            f"solved in closed form"
        )
    return (
        f"Each CTA owns {variant.tile_v} rows of one (batch, value head) state: "
        f"{variant.groups} groups of {variant.threads_per_group} {lanes}{splits} "
        f"({variant.threads} threads). A lane keeps a {variant.ilp} x {variant.vec} fp32 "
        f"tile ({variant.ilp} rows x {variant.vec} K columns) in registers for all T tokens{tiles}"
        f" moves it with {variant.loads_per_lane} loads of {variant.load_bytes} bytes, and "
        f"{reduction}"
        + (" with packed fp32x2 FMAs." if variant.packed_fma else ".")
        + (
            f" Its state moves with ld.global.{LOAD_CACHE_PTX[variant.state_load_cache]} loads and "
            f"st.global.{STORE_CACHE_PTX[variant.state_store_cache]} stores (cache operators)."
            if variant.cache_hinted
            else ""
        )
        + (
            f" Launch bounds fit {variant.min_ctas_per_sm} CTAs on an SM (at most "
            f"{variant.register_cap} registers a thread)."
            if variant.min_ctas_per_sm
            else ""
        )
    )


@dataclass(frozen=True)
class PlannedFile:
    """One file to emit: its path inside generated/<target>/, template and context."""

    relpath: str
    template: str
    context: dict = field(hash=False, compare=False)


def natural_key(name: str) -> tuple:
    """Sort key that orders kl_bf16_tv8 before kl_bf16_tv16."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _template_source(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


def _inputs_sha256(*parts: object) -> str:
    digest = hashlib.sha256()
    digest.update(GENERATOR_VERSION.encode())
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _meta(spec_path: str, inputs_sha256: str) -> dict:
    return {
        "spec_path": spec_path,
        "regenerate": f"gdngen emit {spec_path}",
        "inputs_sha256": inputs_sha256,
    }


def plan_target(spec: Spec, spec_path: str, tuning: Measured | None = None) -> list[PlannedFile]:
    """Every file of generated/<spec.target>/, in a fixed order."""
    kernel_templates = "".join(_template_source(name) for name in KERNEL_TEMPLATES)
    variants = sorted(spec.variants, key=lambda v: natural_key(spec.variant_name(v)))
    views = [VariantView.of(spec, variant) for variant in variants]
    files: list[PlannedFile] = []
    for view, variant in zip(views, variants):
        knobs = variant.model_dump(mode="json")
        inputs = _inputs_sha256(spec.sm, knobs, kernel_templates)
        files.append(
            PlannedFile(
                relpath=f"kernels/{view.name}.py",
                template="decode.py.j2",
                context={
                    "meta": _meta(spec_path, inputs),
                    "name": view.name,
                    "sm": spec.sm,
                    "v": view,
                    "knobs": repr(knobs),
                },
            )
        )
    whole_spec = spec_sha256(spec)
    rows = dispatch_rows(spec, tuning)
    dispatch_inputs = _inputs_sha256(rows, _template_source("dispatch.py.j2"))
    files.append(
        PlannedFile(
            relpath="dispatch.py",
            template="dispatch.py.j2",
            context={"meta": _meta(spec_path, dispatch_inputs), "rows": rows},
        )
    )
    target_info = {
        "name": spec.target,
        "sm": spec.sm,
        "description": spec.description,
        "geometries": [g.model_dump(mode="json") for g in spec.geometries],
        "max_tokens": spec.features.max_tokens,
        "index_dtypes": list(spec.features.index_dtypes),
        "served": [list(pair) for pair in spec.served],
    }
    init_inputs = _inputs_sha256(
        target_info, [v.name for v in views], _template_source("target_init.py.j2")
    )
    files.append(
        PlannedFile(
            relpath="__init__.py",
            template="target_init.py.j2",
            context={
                "meta": _meta(spec_path, init_inputs),
                "target": target_info,
                "variant_names": [v.name for v in views],
                "spec_sha256": whole_spec,
            },
        )
    )
    kernels_init_inputs = _inputs_sha256(
        spec.target, spec.sm, _template_source("kernels_init.py.j2")
    )
    files.append(
        PlannedFile(
            relpath="kernels/__init__.py",
            template="kernels_init.py.j2",
            context={"meta": _meta(spec_path, kernels_init_inputs), "target": target_info},
        )
    )
    return files


@dataclass(frozen=True)
class Measured:
    """A validated tuning file and the name the emitted rows cite it by."""

    tuning: TuningFile
    name: str


def dispatch_rows(spec: Spec, tuning: Measured | None = None) -> list[dict]:
    """The dispatch table as literal rows (first match wins): rows chosen by measurement for the
    (layout, dtype) pairs the tuning file covers, the spec's static rules for the others."""
    rows = tuned_rows(tuning.tuning, spec, tuning.name) if tuning else []
    measured = {(row["layout"], row["state_dtype"]) for row in rows}
    if rows:
        tuned_rules = [
            DispatchRule(
                layout=row["layout"], state_dtype=row["state_dtype"],
                tokens=Range(lo=row["tokens"][0], hi=row["tokens"][1]),
                batch_heads=Range(lo=row["batch_heads"][0], hi=row["batch_heads"][1]),
                intermediate=row["intermediate"], use=row["variant"],
            )
            for row in rows
        ]  # fmt: skip
        static_rules = [
            rule for rule in spec.dispatch if (rule.layout, rule.state_dtype) not in measured
        ]
        as_rules = tuned_rules + static_rules
        gap = spec.dispatch_gap(as_rules)
        if gap:
            raise TuningError(f"{tuning.name}: its dispatch rows leave a gap: {gap}")
    for index, rule in enumerate(spec.dispatch):
        if (rule.layout, rule.state_dtype) in measured:
            continue
        rows.append(
            {
                "layout": rule.layout,
                "state_dtype": rule.state_dtype,
                "tokens": (rule.tokens.lo, rule.tokens.hi),
                "batch_heads": (rule.batch_heads.lo, rule.batch_heads.hi),
                "intermediate": rule.intermediate,
                "variant": rule.use,
                "source": f"spec dispatch[{index}]",
            }
        )
    return rows
