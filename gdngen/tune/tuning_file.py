"""Tuning files: per-cell timings of every candidate variant, measured on one GPU, checked in
next to the spec (``gdngen tune`` writes them; ``gdngen emit`` turns the cells that still hold
into dispatch rules with gdngen.dispatch.measured_rules, the verdict policy).

A cell is (layout, state dtype, T, mode, HV, B) with the first timing of its candidates and one
more per ``gdngen tune --retime`` run. The timings of a (layout, dtype) pair hold as long as the
spec's variants of that pair are the ones measured (:func:`pair_sha256`); a pair whose variants
changed is stale, and its dispatch falls back to the spec's static rules until it is re-measured.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gdngen.spec.model import Spec
from gdngen.terms import Layout, StateDtype, pair_key


class TuningError(ValueError):
    """A tuning file that cannot be used (stale, mismatched or malformed); names the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cell(_Strict):
    layout: Layout
    state_dtype: StateDtype
    tokens: int = Field(ge=1)
    mode: Literal["update", "verify"]
    HV: int = Field(gt=0)
    batch: int = Field(gt=0)
    #: microseconds per call of each candidate variant
    times_us: dict[str, float]
    #: later timings of the cell's contenders, one per `gdngen tune --retime` run
    retimed_us: list[dict[str, float]] = []

    @property
    def batch_heads(self) -> int:
        return self.batch * self.HV

    @property
    def timings(self) -> list[dict[str, float]]:
        """Every timing of the cell, the first (all candidates) first."""
        return [self.times_us, *self.retimed_us]

    def within(self, margin: float) -> list[str]:
        """The variants within ``margin`` of the fastest in at least one of the cell's timings,
        in the order of the first timing (fastest first)."""
        near = set()
        for times in self.timings:
            best = min(times.values())
            near |= {name for name, us in times.items() if us <= best * (1 + margin)}
        ranked = sorted(self.times_us.items(), key=lambda item: (item[1], item[0]))
        return [name for name, _ in ranked if name in near]


class TuningFile(_Strict):
    target: str
    sm: str
    gpu: str
    date: str
    command: str
    #: "layout/state_dtype" -> :func:`pair_sha256` of that pair when its cells were measured
    variants_sha256: dict[str, str]
    copy_bw_tbps: float
    versions: dict[str, str | None] = {}
    #: one line (start time, GPU, command) per `gdngen tune --retime` run that added timings
    retimed: list[str] = []
    cells: list[Cell]


def pair_sha256(spec: Spec, layout: str, state_dtype: str) -> str:
    """What the timings of one (layout, dtype) pair depend on: the target, the SM and the knobs of
    that pair's variants that serve the measured head dims (the candidates of its cells). Hashed
    per pair so that a variant added to one pair leaves the others' timings valid, and a variant
    for other head dims leaves them all valid; knobs at their default value are left out, so that
    a knob added to the Variant model (which does not change existing kernels' code) invalidates
    nothing."""
    variants = sorted(
        (spec.variant_name(v), v.model_dump(mode="json", exclude_defaults=True))
        for v in spec.tuning_candidates(layout, state_dtype)
    )
    payload = {"target": spec.target, "sm": spec.sm, "variants": variants}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def variants_sha256(spec: Spec) -> dict[str, str]:
    """:func:`pair_sha256` of every (layout, dtype) pair that has variants in ``spec``."""
    pairs = sorted({(v.layout, v.state_dtype) for v in spec.variants})
    return {pair_key(*pair): pair_sha256(spec, *pair) for pair in pairs}


def stale_pairs(tuning: TuningFile, spec: Spec) -> dict[str, str]:
    """The pairs with cells in ``tuning`` whose timings no longer hold for ``spec``, each with
    why: the file records no hash for it, or the spec's variants of that pair changed since."""
    stale = {}
    for layout, state_dtype in sorted({(c.layout, c.state_dtype) for c in tuning.cells}):
        key = pair_key(layout, state_dtype)
        recorded = tuning.variants_sha256.get(key)
        current = pair_sha256(spec, layout, state_dtype)
        if recorded is None:
            stale[key] = "the file records no variants sha256 for this pair"
        elif recorded != current:
            stale[key] = (
                "the spec's variants of this pair changed since it was measured "
                f"(variants sha256 {recorded} in the file, {current} now)"
            )
    return stale


def default_path(spec_path: Path) -> Path:
    """The tuning file of the spec's ``tuning.gpu``: ``specs/h200.yaml`` -> ``specs/h200.tuning.yaml``."""
    return spec_path.with_name(spec_path.stem + ".tuning.yaml")


def tuning_gpus(spec: Spec) -> tuple[str, ...]:
    """The GPU models the spec's dispatch is measured per: ``tuning.gpu`` (whose table is the
    default for parts listed nowhere) first, then ``tuning.other_gpus``."""
    return (spec.tuning.gpu, *spec.tuning.other_gpus) if spec.tuning else ()


def tuning_path(spec_path: Path, spec: Spec, gpu: str) -> Path:
    """The tuning file of one of the spec's GPU models: :func:`default_path` for ``tuning.gpu``,
    ``specs/h200.tuning.h100.yaml`` for ``other_gpus: [H100]``."""
    if spec.tuning is None or gpu == spec.tuning.gpu:
        return default_path(spec_path)
    slug = "-".join("".join(c if c.isalnum() else " " for c in gpu.lower()).split())
    return spec_path.with_name(f"{spec_path.stem}.tuning.{slug}.yaml")


def tuning_path_for_gpu(spec_path: Path, spec: Spec, device_name: str) -> Path:
    """The tuning file of the spec's model that a GPU is (by its name); the default file for a
    GPU the spec does not list, or without a GPU (``device_name`` empty)."""
    model = gpu_model(spec, device_name)
    return tuning_path(spec_path, spec, model) if model else default_path(spec_path)


def gpu_model(spec: Spec, device_name: str) -> str | None:
    """Which of the spec's GPU models a device is (its name contains the model's, any case)."""
    for model in tuning_gpus(spec):
        if model.lower() in device_name.lower():
            return model
    return None


def read_tuning(path: Path) -> TuningFile:
    """Parse a tuning file without checking it against a spec: ``gdngen tune --merge`` keeps the
    pairs that are still fresh from a file that :func:`load_tuning` would refuse as a whole."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TuningError(f"{path}: cannot read tuning file: {exc}") from None
    try:
        return TuningFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TuningError(f"{path}: invalid tuning file: {where}: {first['msg']}") from None


@dataclass(frozen=True)
class Measured:
    """What a tuning file holds for a spec: the cells of the pairs whose timings still hold, and
    why each other pair's do not (those pairs fall back to the spec's static rules)."""

    #: the file as dispatch rules cite it (a path relative to the project)
    name: str
    cells: tuple[Cell, ...]
    #: "layout/dtype" -> why its cells no longer hold
    stale: dict[str, str] = field(default_factory=dict)
    tuning: TuningFile | None = None


def remeasure_command(spec_path: str, pairs: list[str]) -> str:
    """The command that measures ``pairs`` again and merges them into the tuning file."""
    return f"gdngen tune {spec_path} --pairs {','.join(pairs)} --merge"


def load_tuning(
    path: Path, spec: Spec, name: str | None = None, *, gpu: str | None = None
) -> Measured:
    """Read a tuning file for ``spec``: the cells that still hold, per pair.

    A file for another target or SM, or one whose cells name variants of another layout/dtype,
    is refused (TuningError); a pair whose variants changed since it was measured, or a file
    measured on another GPU model than ``gpu`` (default: the spec's ``tuning.gpu``), only makes
    those pairs stale.
    """
    tuning = read_tuning(path)
    name = name or path.name
    if tuning.target != spec.target or tuning.sm != spec.sm:
        raise TuningError(
            f"{path}: measured for target {tuning.target} ({tuning.sm}), the spec is "
            f"{spec.target} ({spec.sm}); delete it or point the spec at its own file"
        )
    for cell in tuning.cells:
        for variant_name in sorted({n for times in cell.timings for n in times}):
            variant = spec.variants_by_name.get(variant_name)
            if variant and (variant.layout, variant.state_dtype) != (cell.layout, cell.state_dtype):
                raise TuningError(
                    f"{path}: cell {pair_key(cell.layout, cell.state_dtype)} lists "
                    f"{variant_name}, a kernel for another layout/dtype"
                )
    stale = stale_pairs(tuning, spec)
    known = set(spec.variants_by_name)
    for cell in tuning.cells:
        if pair_key(cell.layout, cell.state_dtype) in stale:
            continue  # renamed or removed variants are expected there
        unknown = sorted({n for times in cell.timings for n in times} - known)
        if unknown:
            raise TuningError(
                f"{path}: names variants the spec does not have: {', '.join(unknown)} (in a "
                f"{pair_key(cell.layout, cell.state_dtype)} cell whose pair hash matches the spec: "
                "the file was edited by hand); re-measure it with gdngen tune"
            )
    expected_gpu = gpu or (spec.tuning.gpu if spec.tuning else None)
    if expected_gpu and expected_gpu.lower() not in tuning.gpu.lower():
        why = f"measured on {tuning.gpu!r}; this file is for the spec's {expected_gpu!r}"
        stale = {key: why for key in {pair_key(c.layout, c.state_dtype) for c in tuning.cells}}
    cells = tuple(c for c in tuning.cells if pair_key(c.layout, c.state_dtype) not in stale)
    return Measured(name=name, cells=cells, stale=dict(sorted(stale.items())), tuning=tuning)


#: the fields written above the cells, in this order
_HEADER_FIELDS = (
    "target",
    "sm",
    "gpu",
    "date",
    "command",
    "variants_sha256",
    "copy_bw_tbps",
    "versions",
    "retimed",
)


def _flow(times: dict[str, float]) -> str:
    """One timing as a one-line YAML mapping, names sorted."""
    return "{" + ", ".join(f"{name}: {us:.2f}" for name, us in sorted(times.items())) + "}"


def dump_tuning(tuning: TuningFile) -> str:
    """YAML with one cell per block, cells and times sorted: small diffs when re-measured."""
    data = tuning.model_dump(mode="json")
    cells = sorted(
        data.pop("cells"),
        key=lambda c: (c["layout"], c["state_dtype"], c["mode"], c["tokens"], c["HV"], c["batch"]),
    )
    data["variants_sha256"] = dict(sorted(data["variants_sha256"].items()))
    # `retimed` only once a --retime run has added timings: files without any stay as they were
    header = {field: data[field] for field in _HEADER_FIELDS if field != "retimed" or data[field]}
    lines = [
        f"# Measured by `{tuning.command}`; do not edit by hand.",
        "# `gdngen emit` turns these timings (microseconds per call) into dispatch rows.",
        yaml.safe_dump(header, sort_keys=False, width=100).rstrip(),
        "cells:",
    ]
    for cell in cells:
        lines.append(
            f"  - {{layout: {cell['layout']}, state_dtype: {cell['state_dtype']}, "
            f"tokens: {cell['tokens']}, mode: {cell['mode']}, HV: {cell['HV']}, "
            f"batch: {cell['batch']},"
        )
        retimed = cell["retimed_us"]
        lines.append(f"     times_us: {_flow(cell['times_us'])}" + ("," if retimed else "}"))
        if retimed:
            lines.append(f"     retimed_us: [{', '.join(_flow(t) for t in retimed)}]}}")
    return "\n".join(lines) + "\n"


def load_other_tunings(spec_path: Path, spec: Spec, project_root: Path) -> dict[str, Measured]:
    """The tuning files of the spec's ``tuning.other_gpus`` that exist, by GPU model, each named
    as dispatch rules cite it (relative to ``project_root``)."""
    found = {}
    for gpu in tuning_gpus(spec)[1:]:
        path = tuning_path(spec_path, spec, gpu)
        if path.is_file():
            try:
                shown = path.resolve().relative_to(project_root.resolve()).as_posix()
            except ValueError:
                shown = path.name
            found[gpu] = load_tuning(path, spec, shown, gpu=gpu)
    return found
