"""Tuning files: per-cell timings of every candidate variant, measured on one GPU, checked in
next to the spec. ``gdngen emit`` turns them into dispatch rows (:func:`tuned_rows`).

A cell is (layout, state dtype, T, mode, HV, B). Within one (layout, dtype, mode, T) group the
rows are keyed on batch*heads: the measured points become ranges split at the geometric midpoint
between neighbours, and each range is served by the variant whose mean gap to the fastest, over
every timing of the cells at that point, is least (with one timing: the fastest variant). A cell
holds one timing from `gdngen tune` and one more per `gdngen tune --retime` run. If a variant's
ranking differs between processes or GPUs of one model, each timing is one sample of what a
deployment gets, and the mean gap estimates what a pick costs on average, where one run alone
would crown whichever side it happened to see.
T values between measured ones use the table of the nearest measured T below.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gdngen.spec.model import Spec


class TuningError(ValueError):
    """A tuning file that cannot be used (stale, mismatched or malformed); names the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cell(_Strict):
    layout: Literal["k_last", "v_last"]
    state_dtype: Literal["bf16", "fp32"]
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


def pair_key(layout: str, state_dtype: str) -> str:
    """How a (layout, state dtype) pair is named in a tuning file and its messages."""
    return f"{layout}/{state_dtype}"


def pair_sha256(spec: Spec, layout: str, state_dtype: str) -> str:
    """What the timings of one (layout, dtype) pair depend on: the target, the SM and the knobs of
    that pair's variants. Hashed per pair so that a variant added to one pair leaves the others'
    timings valid; knobs at their default value are left out, so that a knob added to the Variant
    model (which does not change existing kernels' code) invalidates nothing."""
    variants = sorted(
        (spec.variant_name(v), v.model_dump(mode="json", exclude_defaults=True))
        for v in spec.variants
        if (v.layout, v.state_dtype) == (layout, state_dtype)
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
            stale[key] = f"{key}: the file records no variants sha256 for this pair"
        elif recorded != current:
            stale[key] = (
                f"{key}: the spec's variants of this pair changed since it was measured "
                f"(variants sha256 {recorded} in the file, {current} now)"
            )
    return stale


def default_path(spec_path: Path) -> Path:
    return spec_path.with_name(spec_path.stem + ".tuning.yaml")


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


def load_tuning(path: Path, spec: Spec) -> TuningFile:
    """Read and validate a tuning file against ``spec``; TuningError says what is wrong."""
    tuning = read_tuning(path)
    problems = []
    if tuning.target != spec.target or tuning.sm != spec.sm:
        problems.append(
            f"measured for target {tuning.target} ({tuning.sm}), the spec is {spec.target} ({spec.sm})"
        )
    expected_gpu = spec.tuning.gpu if spec.tuning else None
    if expected_gpu and expected_gpu.lower() not in tuning.gpu.lower():
        problems.append(f"measured on {tuning.gpu!r}; the spec's tuning.gpu is {expected_gpu!r}")
    known = set(spec.variants_by_name)
    timed = {name for cell in tuning.cells for times in cell.timings for name in times}
    unknown = sorted(timed - known)
    if unknown:
        problems.append(f"names variants the spec does not have: {', '.join(unknown)}")
    problems.extend(stale_pairs(tuning, spec).values())
    for cell in tuning.cells:
        for name in sorted({name for times in cell.timings for name in times}):
            variant = spec.variants_by_name.get(name)
            if variant and (variant.layout, variant.state_dtype) != (cell.layout, cell.state_dtype):
                problems.append(
                    f"cell {cell.layout}/{cell.state_dtype} lists {name}, a kernel for another layout/dtype"
                )
    if problems:
        raise TuningError(
            f"{path}: stale or mismatched tuning data:\n  - "
            + "\n  - ".join(problems)
            + f"\nRe-measure on the GPU with `gdngen tune <spec>`, or delete {path.name} to use "
            "the spec's static dispatch rules."
        )
    return tuning


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


@dataclass(frozen=True)
class Verdict:
    """The variant that serves one measured B*HV, and why."""

    batch_heads: int
    variant: str
    #: the variant's summed first-timing microseconds over the cells at this point
    total_us: float
    #: its mean and its worst gap to the fastest variant (0.01 = 1% slower) over every timing there
    mean_gap: float
    worst_gap: float
    #: the runner-up, its total and its mean gap (None with one candidate)
    runner_up: str | None
    runner_up_us: float | None
    runner_up_gap: float | None
    #: how many cells are at this point, and how many timings they hold together
    cells: int
    timings: int

    def evidence(self) -> str:
        """The row's `source` text for this point."""
        head = f"B*HV={self.batch_heads}: {self.total_us:.2f} us"
        if self.timings == 1:
            return head + (
                f" (next {self.runner_up} {self.runner_up_us:.2f} us)" if self.runner_up else ""
            )
        head += (
            f", off the fastest by {self.mean_gap:+.1%} on average and {self.worst_gap:+.1%} at "
            f"most in {self.timings} timings of {self.cells} cell{'s' if self.cells > 1 else ''}"
        )
        return head + (
            f" (next {self.runner_up} {self.runner_up_gap:+.1%})" if self.runner_up else ""
        )


def verdicts(cells: list[Cell]) -> list[Verdict]:
    """Per measured B*HV, the variant whose mean gap to the fastest is least over every timing of
    the cells there (ties: least worst gap, then least summed first-timing time, then name).

    Only variants timed in all those timings compete (a --retime run times a cell's contenders
    only); if none is, the first timings alone decide.
    """
    by_point: dict[int, list[Cell]] = defaultdict(list)
    for cell in cells:
        by_point[cell.batch_heads].append(cell)
    points = []
    for batch_heads in sorted(by_point):
        at_point = by_point[batch_heads]
        timings = [times for cell in at_point for times in cell.timings]
        names = set.intersection(*map(set, timings))
        if not names:
            timings = [cell.times_us for cell in at_point]
            names = set.intersection(*map(set, timings))
        fastest = [min(times.values()) for times in timings]

        def score(name: str) -> tuple[float, float, float, str]:
            gaps = [times[name] / best - 1 for times, best in zip(timings, fastest)]
            total = sum(cell.times_us[name] for cell in at_point)
            return sum(gaps) / len(gaps), max(gaps), total, name

        ranked = sorted(score(name) for name in names)
        mean_gap, worst_gap, total, best = ranked[0]
        next_gap, _, next_total, runner_up = (
            ranked[1] if len(ranked) > 1 else (None, None, None, None)
        )
        points.append(
            Verdict(
                batch_heads=batch_heads, variant=best, total_us=total, mean_gap=mean_gap,
                worst_gap=worst_gap,
                runner_up=runner_up, runner_up_us=next_total, runner_up_gap=next_gap,
                cells=len(at_point), timings=len(timings),
            )  # fmt: skip
        )
    return points


def tuned_rows(tuning: TuningFile, spec: Spec, tuning_name: str) -> list[dict]:
    """Dispatch rows from measurements, for the (layout, dtype) pairs that were measured."""
    groups: dict[tuple, list[Cell]] = defaultdict(list)
    for cell in tuning.cells:
        groups[(cell.layout, cell.state_dtype, cell.mode, cell.tokens)].append(cell)
    rows = []
    for layout, state_dtype in spec.served:
        for mode in ("update", "verify"):
            measured_tokens = sorted(
                t for (l, d, m, t) in groups if (l, d, m) == (layout, state_dtype, mode)
            )
            if mode == "verify" and not measured_tokens:
                continue
            for index, tokens in enumerate(measured_tokens):
                lo_t = 1 if index == 0 else tokens
                hi_t = (
                    measured_tokens[index + 1] - 1
                    if index + 1 < len(measured_tokens)
                    else spec.features.max_tokens
                )
                if mode == "verify" and index == 0:
                    lo_t = 1
                points = verdicts(groups[(layout, state_dtype, mode, tokens)])
                merged: list[list] = []  # [lo, hi, variant, evidence]
                for position, point in enumerate(points):
                    batch_heads, best, evidence = point.batch_heads, point.variant, point.evidence()
                    lo = (
                        1
                        if position == 0
                        else math.isqrt(points[position - 1].batch_heads * batch_heads) + 1
                    )
                    if merged and merged[-1][2] == best:
                        merged[-1][3].append(evidence)
                        continue
                    if merged:
                        merged[-1][1] = lo - 1
                    merged.append([lo, None, best, [evidence]])
                for lo, hi, variant, evidence in merged:
                    rows.append(
                        {
                            "layout": layout,
                            "state_dtype": state_dtype,
                            "tokens": (lo_t, hi_t),
                            "batch_heads": (lo, hi),
                            "intermediate": (
                                "yes"
                                if mode == "verify"
                                else (
                                    "no"
                                    if any(
                                        m == "verify"
                                        for (l, d, m, t) in groups
                                        if (l, d) == (layout, state_dtype)
                                    )
                                    else "any"
                                )
                            ),
                            "variant": variant,
                            "source": f"tuned {tuning_name} T={tokens} {mode}: "
                            + "; ".join(evidence),
                        }
                    )
    return rows
