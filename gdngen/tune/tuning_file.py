"""Tuning files: per-cell timings of every candidate variant, measured on one GPU, checked in
next to the spec (``gdngen tune`` writes them; ``gdngen emit`` turns the cells that still hold
into dispatch rules with gdngen.dispatch.measured_rules, the verdict policy).

A cell is (layout, state dtype, T, mode, HV, B, head dims) with the first timing of its
candidates and one more per ``gdngen tune --retime`` run. The cells of one (layout, dtype) pair at
one head dims form a set (:func:`set_key`). Its timings hold as long as the spec's variants of
that pair for those head dims are the ones measured (:func:`pair_sha256`); a set whose variants
changed is stale, and its dispatch falls back to the spec's static rules until it is re-measured.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gdngen.spec.model import Spec
from gdngen.terms import Layout, StateDtype, pair_key, plan_parts


class TuningError(ValueError):
    """A tuning file that cannot be used (stale, mismatched or malformed); names the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: a cell's call form: the forms of ``Tuning.modes``, or "core" (``gdngen tune --core``)
CellMode = Literal["update", "verify", "spec", "core"]


class Cell(_Strict):
    layout: Layout
    state_dtype: StateDtype
    tokens: int = Field(ge=1)
    #: "core": a decode-core cell (``gdngen tune --core``), whose timings are of plans
    #: (gdngen.terms.plan_name) in vLLM's call forms, with the conv1d prologue and the norm;
    #: "spec": vLLM's per-token slot form (``Tuning.modes``)
    mode: CellMode
    HV: int = Field(gt=0)
    batch: int = Field(gt=0)
    #: the head dims measured where they are not the grid's base (``Spec.tuning_head_dims``), i.e.
    #: a cell of ``tuning.head_dims``; None at the base (left out of the file)
    K: int | None = Field(default=None, gt=0)
    V: int | None = Field(default=None, gt=0)
    #: microseconds per call of each candidate variant
    times_us: dict[str, float]
    #: later timings of the cell's contenders, one per `gdngen tune --retime` run
    retimed_us: list[dict[str, float]] = []

    @model_validator(mode="after")
    def _both_head_dims(self) -> "Cell":
        if (self.K is None) != (self.V is None):
            raise ValueError(
                f"a cell names both head dims K and V or neither; got K={self.K}, V={self.V}"
            )
        return self

    @property
    def batch_heads(self) -> int:
        return self.batch * self.HV

    def head_dims(self, base: tuple[int, int] | None) -> tuple[int, int] | None:
        """The (K, V) the cell was measured at: its own, else the grid's ``base``."""
        return (self.K, self.V) if self.K is not None else base

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


#: how the key of a set of decode-core cells ends (:func:`set_key`)
CORE_SET = " core"


def set_key(
    layout: str,
    state_dtype: str,
    head_dims: tuple[int, int] | None,
    spec: Spec,
    core: bool = False,
) -> str:
    """How the cells of one (layout, dtype) pair at one head dims are named in files and messages:
    the pair (``k_last/bf16``) at the grid's base head dims, ``k_last/bf16 K=256 V=256`` at
    others (``tuning.head_dims``); a pair's decode-core cells (``core``) are a set of their own,
    ``k_last/bf16 core``, as their plans are other variants (those with the epilogue)."""
    key = pair_key(layout, state_dtype)
    if core:
        return key + CORE_SET
    if head_dims is None or head_dims == spec.tuning_head_dims:
        return key
    return f"{key} K={head_dims[0]} V={head_dims[1]}"


def cell_set(cell: Cell, spec: Spec) -> str:
    """:func:`set_key` of the set ``cell`` belongs to."""
    dims = cell.head_dims(spec.tuning_head_dims)
    return set_key(cell.layout, cell.state_dtype, dims, spec, cell.mode == "core")


def pair_sha256(
    spec: Spec,
    layout: str,
    state_dtype: str,
    head_dims: tuple[int, int] | None = None,
    core: bool = False,
    steps: bool | None = None,
) -> str:
    """What the timings of one (layout, dtype) pair at ``head_dims`` (default: the grid's base)
    depend on: the target, the SM and the knobs of that pair's variants built for those head dims
    (the candidates of its cells). Hashed per pair and head dims so that a variant added to one
    leaves the others' timings valid; knobs at their default value are left out, so that a knob
    added to the Variant model (which does not change existing kernels' code) invalidates
    nothing. The decode-core cells of a pair (``core``) hash its :meth:`Spec.core_candidates`
    instead, with the plain tuning's candidates too where the core grid times steps plans (their
    variants are those). ``steps`` overrides the grid's for that (:func:`stale_pairs`)."""
    if core:
        chosen = [spec.variants_by_name[n] for n in spec.core_candidates(layout, state_dtype)]
        grid = spec.tuning.core if spec.tuning else None
        if steps is None:
            steps = grid is not None and grid.steps
        if steps:
            plain = spec.tuning_candidates(layout, state_dtype)
            chosen += [v for v in plain if v not in chosen]
    else:
        chosen = spec.tuning_candidates(layout, state_dtype, head_dims)
    variants = sorted(
        (spec.variant_name(v), v.model_dump(mode="json", exclude_defaults=True)) for v in chosen
    )
    payload = {"target": spec.target, "sm": spec.sm, "variants": variants}
    if core:
        payload["plans"] = "core, steps" if steps else "core"
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def variants_sha256(spec: Spec) -> dict[str, str]:
    """:func:`pair_sha256` of every (layout, dtype) pair that has variants in ``spec``, at every
    head dims the grid measures that the pair has candidates for, by :func:`set_key`."""
    pairs = sorted({(v.layout, v.state_dtype) for v in spec.variants})
    hashes = {
        set_key(layout, state_dtype, dims, spec): pair_sha256(spec, layout, state_dtype, dims)
        for layout, state_dtype, dims in spec.tuning_sets(pairs)
    }
    core = spec.tuning.core if spec.tuning else None
    for layout, state_dtype in core.pair_tuples if core else ():
        key = set_key(layout, state_dtype, None, spec, core=True)
        hashes[key] = pair_sha256(spec, layout, state_dtype, core=True)
    return hashes


def stale_pairs(tuning: TuningFile, spec: Spec) -> dict[str, str]:
    """The sets (pairs at a head dims, :func:`set_key`) with cells in ``tuning`` whose timings no
    longer hold for ``spec``, each with why: the file records no hash for it, or the spec's
    variants of that pair for those head dims changed since.

    Decode-core cells measured before the grid timed steps plans still hold while their variants
    are unchanged: each timed the fused and split plans it names, which adding a plan leaves
    true. Their verdicts are among those plans only; a new core tune adds the steps plans."""
    stale = {}
    base = spec.tuning_head_dims
    sets = {(c.layout, c.state_dtype, c.head_dims(base), c.mode == "core") for c in tuning.cells}
    for layout, state_dtype, dims, core in sorted(
        sets, key=lambda s: (s[0], s[1], s[2] or (0, 0), s[3])
    ):
        key = set_key(layout, state_dtype, dims, spec, core)
        recorded = tuning.variants_sha256.get(key)
        current = pair_sha256(spec, layout, state_dtype, dims, core)
        if core and recorded == pair_sha256(spec, layout, state_dtype, dims, core, steps=False):
            continue  # measured without the steps plans (see above)
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


def spec_of_tuning_file(path: Path) -> Path | None:
    """The spec a tuning file beside it belongs to, by name (the inverse of :func:`tuning_path`:
    ``specs/h200.tuning.yaml`` and ``specs/h200.tuning.h100.yaml`` -> ``specs/h200.yaml``), where
    both files exist; None for any other path."""
    stem, marker, rest = path.name.partition(".tuning.")
    if not (marker and stem and (rest == "yaml" or rest.endswith(".yaml")) and path.is_file()):
        return None
    spec_path = path.with_name(f"{stem}.yaml")
    return spec_path if spec_path.is_file() else None


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


#: PyYAML's safe loader, in C where PyYAML was built with libyaml: a tuning file is a few MB
#: (thousands of cells), which the pure-Python parser takes seconds over, in every emit
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_tuning(path: Path) -> TuningFile:
    """Parse a tuning file without checking it against a spec: ``gdngen tune --merge`` keeps the
    pairs that are still fresh from a file that :func:`load_tuning` would refuse as a whole.
    Either form: the columns one (:func:`dump_tuning`), or a name for every timing."""
    try:
        data = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except (OSError, yaml.YAMLError) as exc:
        raise TuningError(f"{path}: cannot read tuning file: {exc}") from None
    try:
        data = _named_timings(data)
    except ValueError as exc:
        raise TuningError(f"{path}: invalid tuning file: {exc}") from None
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

    #: the file as the emitted dispatch cites it (a path relative to the project)
    name: str
    cells: tuple[Cell, ...]
    #: :func:`set_key` ("layout/dtype", with head dims other than the base) -> why its cells
    #: no longer hold
    stale: dict[str, str] = field(default_factory=dict)
    tuning: TuningFile | None = None


def remeasure_command(spec_path: str, spec: Spec, keys: list[str]) -> str:
    """The commands that measure the sets ``keys`` (:func:`set_key`) again and merge them into
    the tuning file, one per head dims."""
    by_dims: dict[tuple[int, int] | None, list[str]] = {
        d: [] for d in spec.tuned_head_dims or (None,)
    }
    for layout, state_dtype, dims in spec.tuning_sets():
        if set_key(layout, state_dtype, dims, spec) in keys:
            by_dims[dims].append(pair_key(layout, state_dtype))
    commands = []
    for dims, pairs in by_dims.items():
        other = dims not in (None, spec.tuning_head_dims)
        head_dims = f" --head-dims {head_dims_arg(dims)}" if other else ""
        if pairs:
            commands.append(f"gdngen tune {spec_path} --pairs {','.join(pairs)}{head_dims} --merge")
    return "; ".join(commands)


def head_dims_arg(head_dims: tuple[int, int]) -> str:
    """How ``gdngen tune --head-dims`` spells head dims: ``256`` for K = V = 256, else ``KxV``."""
    K, V = head_dims
    return str(K) if K == V else f"{K}x{V}"


def parse_head_dims(text: str) -> tuple[tuple[int, int], ...]:
    """``gdngen tune --head-dims``: a comma list of ``K`` (K = V) or ``KxV``, e.g. ``128,256``."""
    dims = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"--head-dims: expected K or KxV items like 256 or 128x256; got {item!r}"
            )
        K = int(parts[0])
        dims.append((K, int(parts[-1])))
    return tuple(dims)


def _variants_of(cell: Cell) -> set[str]:
    """The variants a cell's timings name (a core cell's plans, by their variants)."""
    names = {n for times in cell.timings for n in times}
    return {plan_parts(n).variant for n in names} if cell.mode == "core" else names


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
        for variant_name in sorted(_variants_of(cell)):
            variant = spec.variants_by_name.get(variant_name)
            if variant and (variant.layout, variant.state_dtype) != (cell.layout, cell.state_dtype):
                raise TuningError(
                    f"{path}: cell {pair_key(cell.layout, cell.state_dtype)} lists "
                    f"{variant_name}, a kernel for another layout/dtype"
                )
    stale = stale_pairs(tuning, spec)
    known = set(spec.variants_by_name)
    for cell in tuning.cells:
        if cell_set(cell, spec) in stale:
            continue  # renamed or removed variants are expected there
        unknown = sorted(_variants_of(cell) - known)
        if unknown:
            raise TuningError(
                f"{path}: names variants the spec does not have: {', '.join(unknown)} (in a "
                f"{cell_set(cell, spec)} cell whose pair hash matches the spec: "
                "the file was edited by hand); re-measure it with gdngen tune"
            )
    expected_gpu = gpu or (spec.tuning.gpu if spec.tuning else None)
    if expected_gpu and expected_gpu.lower() not in tuning.gpu.lower():
        why = f"measured on {tuning.gpu!r}; this file is for the spec's {expected_gpu!r}"
        stale = {key: why for key in {cell_set(c, spec) for c in tuning.cells}}
    cells = tuple(c for c in tuning.cells if cell_set(c, spec) not in stale)
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


def columns_key(cell: dict) -> str:
    """The key of a cell's set in the file's ``columns``: ``k_last/bf16``, with ``K=.. V=..``
    where the cell names head dims, ``k_last/bf16 core`` for a decode-core cell (as
    :func:`set_key` spells it, without the spec)."""
    key = pair_key(cell["layout"], cell["state_dtype"])
    if cell.get("mode") == "core":
        return key + CORE_SET
    return key if cell.get("K") is None else f"{key} K={cell['K']} V={cell['V']}"


def _named_timings(data: object) -> object:
    """A file in the columns form as the model reads it: each timing a mapping of variant names
    (a null entry: not timed there). A file without ``columns`` is returned as it is."""
    if not isinstance(data, dict) or "columns" not in data:
        return data
    data = dict(data)
    columns = data.pop("columns")
    if not isinstance(columns, dict):
        raise ValueError("columns: expected a mapping of a set to its variants")

    def named(times: object, key: str) -> dict:
        names = columns.get(key)
        if names is None:
            raise ValueError(f"columns: no entry for the cells of {key}")
        if not isinstance(times, list) or len(times) != len(names):
            raise ValueError(
                f"a {key} cell's timing has {len(times) if isinstance(times, list) else 'no'} "
                f"entries; its columns have {len(names)}"
            )
        return {name: us for name, us in zip(names, times) if us is not None}

    cells = []
    for cell in _cells_of_groups(data.get("cells")):
        cell = dict(cell)
        key = columns_key(cell)
        cell["times_us"] = named(cell.get("times_us"), key)
        cell["retimed_us"] = [named(times, key) for times in cell.get("retimed_us", [])]
        cells.append(cell)
    data["cells"] = cells
    return data


#: a group of cells in a file's ``cells`` (:func:`dump_tuning`): the set's columns key, the mode
#: (a core set's is its own), the tokens and the value heads; e.g. ``k_last/bf16 update T2 HV64``
_GROUP = re.compile(
    r"(?P<layout>\w+)/(?P<state_dtype>\w+)(?: K=(?P<K>\d+) V=(?P<V>\d+))?"
    rf" (?P<mode>{'|'.join(get_args(CellMode))}) T(?P<tokens>\d+) HV(?P<HV>\d+)"
)


def _group_key(cell: dict) -> str:
    key = columns_key(cell)
    mode = "" if cell["mode"] == "core" else f" {cell['mode']}"  # the core set's key has it
    return f"{key}{mode} T{cell['tokens']} HV{cell['HV']}"


def _cells_of_groups(cells: object) -> list:
    """A file's ``cells`` as a list of cells: as they are where listed (the form before groups),
    else from the groups, each cell a batch size's timings, a list (the first timing) or a list
    of them (the first, then the --retime runs')."""
    if not isinstance(cells, dict):
        return list(cells or [])
    found = []
    for group, by_batch in cells.items():
        match = _GROUP.fullmatch(str(group))
        if match is None:
            raise ValueError(f"cells: {group!r} is not a group like 'k_last/bf16 update T1 HV64'")
        if not isinstance(by_batch, dict):
            raise ValueError(f"cells: {group}: expected a mapping of batch sizes to timings")
        head = {
            name: int(value) if name in ("tokens", "HV", "K", "V") else value
            for name, value in match.groupdict().items()
            if value is not None
        }
        for batch, timings in by_batch.items():
            rows = timings if timings and isinstance(timings[0], list) else [timings]
            found.append({**head, "batch": batch, "times_us": rows[0], "retimed_us": rows[1:]})
    return found


def _row(times: dict[str, float], names: list[str]) -> str:
    """One timing as a one-line YAML list in the order of ``names`` (null: not timed there)."""
    return "[" + ", ".join("null" if n not in times else f"{times[n]:.2f}" for n in names) + "]"


def dump_tuning(tuning: TuningFile) -> str:
    """YAML with one cell per line, cells sorted: small diffs when re-measured. Each set's
    variants are named once, in ``columns``; a cell's timings are lists in that order (the
    names of every timing, written out, were most of a file's bytes). Cells are grouped by set,
    mode, tokens and value heads, a line per batch size (each cell spelling those out was half
    of what was left)."""
    data = tuning.model_dump(mode="json")
    cells = sorted(
        data.pop("cells"),
        key=lambda c: (
            c["layout"], c["state_dtype"], c["K"] or 0, c["V"] or 0, c["mode"], c["tokens"],
            c["HV"], c["batch"],
        ),  # fmt: skip
    )
    data["variants_sha256"] = dict(sorted(data["variants_sha256"].items()))
    # `retimed` only once a --retime run has added timings: files without any stay as they were
    header = {field: data[field] for field in _HEADER_FIELDS if field != "retimed" or data[field]}
    columns: dict[str, list[str]] = {}
    for cell in cells:
        names = columns.setdefault(columns_key(cell), [])
        names.extend(n for t in (cell["times_us"], *cell["retimed_us"]) for n in t)
    columns = {key: sorted(set(names)) for key, names in sorted(columns.items())}
    lines = [
        f"# Measured by `{tuning.command}`; do not edit by hand.",
        "# `gdngen emit` turns these timings (microseconds per call) into dispatch rows. A cell's",
        "# timings are in the order of its set's `columns` (null: that variant not timed there).",
        "# Cells are grouped by set, mode, tokens and value heads (`k_last/bf16 update T1 HV64`),",
        "# a line per batch size: its timing, or its timings (the first, then each --retime run's).",
        yaml.safe_dump(header, sort_keys=False, width=100).rstrip(),
        yaml.safe_dump({"columns": columns}, sort_keys=False, width=100).rstrip(),
        "cells:",
    ]
    group = None
    for cell in cells:
        if _group_key(cell) != group:
            group = _group_key(cell)
            lines.append(f"  {group}:")
        names = columns[columns_key(cell)]
        rows = [_row(t, names) for t in (cell["times_us"], *cell["retimed_us"])]
        lines.append(
            f"    {cell['batch']}: " + (rows[0] if len(rows) == 1 else f"[{', '.join(rows)}]")
        )
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
