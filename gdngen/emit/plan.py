"""What a spec emits: the files of one target, each with its template and context.

This is the one place where variants are enumerated (sorted by canonical name), where each
becomes what the templates read (:class:`KernelPlan`: its code shape, which names the body
module its row of the kernels table runs, and the numbers of its code), and where the dispatch
table is assembled: measured rules for the (layout, dtype) pairs whose timings still hold, the spec's
static rules for the others (docs/design.md, "Architecture").
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from itertools import takewhile
from pathlib import Path
from typing import Iterator

from gdngen.device.lanes import butterfly_offsets, lane_stride, reduce_scatter
from gdngen.dispatch import (
    Rule,
    ahead_of_measured,
    boundary_shapes,
    core_rules,
    coverage_gap,
    for_a_form,
    measured_evidence,
    measured_rules,
    reached,
    reached_at,
    rule_plan,
    select,
    table_order,
)
from gdngen.runtime.kernel_args import KERNEL_ARGS
from gdngen.spec import Spec
from gdngen.spec.model import LOAD_CACHE_PTX, STORE_CACHE_PTX, Variant
from gdngen.terms import step_name
from gdngen.tune.tuning_file import Cell, Measured, TuningError, set_key

from .dispatch_table import RowFormat

from .shape import KernelShape

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
#: the file beside dispatch.py that says why each measured row picks its variant
EVIDENCE = "dispatch_evidence.txt"


@dataclass(frozen=True)
class KernelPlan:
    """A variant as the templates see it: its name, its knobs, the shape of its code
    (:class:`gdngen.emit.shape.KernelShape`, which picks the body), the numbers derived for its
    code and the prose of its row's comment. Plain data: the templates never read the spec's
    pydantic models."""

    name: str
    summary: str
    shape: KernelShape
    layout: str
    state_dtype: str
    tile_v: int
    ilp: int
    vec: int
    threads_per_group: int
    k_splits: int
    row_passes: int
    min_ctas_per_sm: int
    #: warp lanes between K-neighbours of a group, and the XOR offsets of the group's butterfly
    #: (gdngen.device.lanes)
    lane_stride: int
    butterfly_offsets: tuple[int, ...]
    #: independent state loads a lane has in flight, and the elements of one state load or store
    loads_per_lane: int
    state_vector: int
    #: CuTe's LoadCacheMode and StoreCacheMode members of the state's cache operators
    load_cache_mode: str
    store_cache_mode: str
    #: each token's stores after the next token's dot products (Variant.late_stores)
    late_stores: bool
    #: the next row pass's tile loaded during the pass before (Variant.prefetch)
    prefetch: bool
    #: every later row pass's tile copied into shared memory as the kernel starts
    #: (Variant.async_tiles)
    async_tiles: bool

    @property
    def device_numbers(self) -> dict[str, int | str | bool]:
        """What its row passes to its body's ``device_code``, by keyword (KernelShape.numbers):
        each the field of the keyword's name in lower case."""
        return {name: getattr(self, name.lower()) for name, _ in self.shape.numbers}

    @classmethod
    def of(cls, variant: Variant, sm: str) -> "KernelPlan":
        stride = lane_stride(variant.layout, variant.threads_per_group)
        offsets = butterfly_offsets(variant.threads_per_group, stride)
        loads = _loads_per_lane(variant)
        return cls(
            name=variant.name_for(sm),
            summary=_summary(variant, stride, offsets, loads),
            shape=KernelShape.of(variant),
            layout=variant.layout,
            state_dtype=variant.state_dtype,
            tile_v=variant.tile_v,
            ilp=variant.ilp,
            vec=variant.vec,
            threads_per_group=variant.threads_per_group,
            k_splits=variant.k_splits,
            row_passes=variant.row_passes,
            min_ctas_per_sm=variant.min_ctas_per_sm,
            lane_stride=stride,
            butterfly_offsets=offsets,
            loads_per_lane=loads,
            state_vector=variant.load_elems,
            load_cache_mode=(
                "ALWAYS" if variant.state_load_cache == "all" else variant.state_load_cache.upper()
            ),
            store_cache_mode=variant.state_store_cache.upper(),
            late_stores=variant.late_stores,
            prefetch=variant.prefetch,
            async_tiles=variant.async_tiles,
        )


def _loads_per_lane(variant: Variant) -> int:
    """Independent state loads a lane has in flight: K-last, its rows' loads; V-last, one a
    column (a load covers ilp rows of one column)."""
    return variant.ilp * variant.row_loads if variant.layout == "k_last" else variant.vec


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural but for one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _summary(variant: Variant, stride: int, offsets: tuple[int, ...], loads: int) -> str:
    """The paragraph of its row's comment on how the variant maps the state onto lanes, from its
    lane stride, its group's butterfly offsets and its state loads a lane."""
    lanes = "lane" if variant.threads_per_group == 1 else "lanes"
    splits = f" in each of {variant.k_splits} K splits" if variant.k_splits > 1 else ""
    tiles = ","
    if variant.row_passes > 1:
        overlap = " (each loaded while the one before computes)" if variant.prefetch else ""
        if variant.async_tiles:
            overlap = " (the later ones copied into shared memory as the kernel starts)"
        unrolled = " in an unrolled loop" if variant.unroll_passes else ""
        tiles = f", {variant.row_passes} tiles one after the other{unrolled}{overlap},"
    if variant.solve == "stepwise":
        steps = len(offsets)
        over = [f"the group with a {steps}-step butterfly"] if steps else []
        if variant.k_splits > 1:
            over.append(f"the {variant.k_splits} K splits in shared memory")
        reduction = f"reduces its dot products over {' and over '.join(over)}, token by token"
        if variant.preload_tokens:
            reduction += " (every token's q, k, v and gates loaded before the first)"
        if variant.late_stores:
            reduction += ", each token's stores after the next token's dot products"
    else:
        rows_held = reduce_scatter(variant.ilp, variant.threads_per_group, stride).rows_held
        reduction = (
            f"solves the tokens staged: q, k and the gates of all T tokens are staged once per "
            f"CTA in shared memory, every dot product is taken against the initial state and "
            f"reduce-scattered so that a lane owns {rows_held} row(s), and the deltas are "
            f"solved in closed form"
        )
    return (
        f"Each CTA owns {variant.tile_v} rows of one (batch, value head) state: "
        f"{_count(variant.groups, 'group')} of {variant.threads_per_group} {lanes}{splits} "
        f"({variant.threads} threads). A lane keeps a {variant.ilp} x {variant.vec} fp32 "
        f"tile ({_count(variant.ilp, 'row')} x {variant.vec} K columns) in registers for all T "
        f"tokens{tiles} moves it with {_count(loads, 'load')} of {variant.load_bytes} bytes, and "
        f"{reduction}"
        + (" with packed fp32x2 FMAs." if variant.packed_fma else ".")
        + (
            f" Its state moves with ld.global.{LOAD_CACHE_PTX[variant.state_load_cache]} loads and "
            f"st.global.{STORE_CACHE_PTX[variant.state_store_cache]} stores (cache operators)."
            if KernelShape.of(variant).cache_ops
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
class StepModule:
    """A step kernel of a target's split plans (step.py.j2): the device module
    ``gdngen/device/<kind>.py`` and its runtime ``gdngen/runtime/<kind>.py``."""

    kind: str
    #: what the module's docstring calls it, says it does, and says it serves
    title: str
    what: str
    serves: str
    #: the dispatch rule field that picks the plan with this step
    rule_field: str

    def module_name(self, sm: str) -> str:
        return step_name(self.kind, sm)


CONV_STEP = StepModule(
    "conv_step",
    "conv1d step",
    "the causal conv1d update as a\nkernel of its own, which a fused-core call's split plan "
    "launches before its decode kernel",
    "conv width, activation",
    "split_conv",
)
NORM_STEP = StepModule(
    "norm_step",
    "norm step",
    "the gated RMSNorm as a kernel of\nits own, which a call's norm-split plan launches after "
    "its decode kernel",
    "gate activation, norm weight dtype",
    "split_norm",
)


@dataclass(frozen=True)
class PlannedFile:
    """One file to emit: its path inside generated/<target>/, template and context. ``render``
    prepends the header (spec, template, regenerate command, content hash)."""

    relpath: str
    template: str
    spec_path: str
    context: dict = field(hash=False, compare=False)


def natural_key(name: str) -> tuple:
    """Sort key that orders kl_bf16_tv8 before kl_bf16_tv16."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def plan_target(
    spec: Spec,
    spec_path: str,
    measured: Measured | None = None,
    other_gpus: dict[str, Measured] | None = None,
) -> list[PlannedFile]:
    """Every file of generated/<spec.target>/, in a fixed order. ``measured`` is the tuning file
    of the spec's ``tuning.gpu`` (the default table), ``other_gpus`` those of its other GPU
    models (a table each)."""
    variants = sorted(spec.variants, key=lambda v: natural_key(spec.variant_name(v)))
    kernels = [KernelPlan.of(variant, spec.sm) for variant in variants]
    target_info = {
        "name": spec.target,
        "sm": spec.sm,
        "description": spec.description,
        "geometries": [asdict(g) for g in spec.geometries],
        "max_tokens": spec.features.max_tokens,
        "index_dtypes": list(spec.features.index_dtypes),
        "gated_rmsnorm": spec.features.gated_rmsnorm,
        "conv1d_widths": list(spec.features.conv1d_widths),
        "served": [list(pair) for pair in spec.served],
        "spec": spec_path,
    }
    files = []
    # the bodies of the shapes no spec this one extends has
    own = {k.shape.name: k.shape for k in kernels if body_source(spec, k.shape) is None}
    files += [
        PlannedFile(
            f"bodies/{name}.py",
            "body.py.j2",
            spec_path,
            {"name": name, "shape": shape, "kernel_args": KERNEL_ARGS},
        )
        for name, shape in sorted(own.items())
    ]
    if own:
        files.append(
            PlannedFile(
                relpath="bodies/__init__.py",
                template="bodies_init.py.j2",
                spec_path=spec_path,
                context={"target": target_info},
            )
        )
    for step, wanted in (
        (CONV_STEP, bool(spec.features.conv1d_widths)),
        (NORM_STEP, spec.features.gated_rmsnorm),
    ):
        if wanted:
            name = step.module_name(spec.sm)
            files.append(
                PlannedFile(
                    f"kernels/{name}.py",
                    "step.py.j2",
                    spec_path,
                    {"target": target_info, "name": name, "step": step},
                )
            )
    files.append(
        PlannedFile(
            relpath="kernels/__init__.py",
            template="kernels_init.py.j2",
            spec_path=spec_path,
            context={
                "target": target_info,
                "rows": [(kernel, body_import(spec, kernel.shape)) for kernel in kernels],
            },
        )
    )
    files += dispatch_files(spec, spec_path, measured, other_gpus or {})
    files.append(
        PlannedFile(
            relpath="__init__.py",
            template="target_init.py.j2",
            spec_path=spec_path,
            context={"target": target_info},
        )
    )
    return files


def body_source(spec: Spec, shape: KernelShape) -> tuple[Spec, str] | None:
    """Where the body of ``shape`` comes from when a spec this one extends has a variant of that
    shape: the farthest such spec and its path (its target emits the body, whose code is the same
    for every SM: docs/design.md, "Targets that extend another"). None: this target emits it."""
    for ancestor, path in reversed(spec.ancestors):
        if any(KernelShape.of(variant) == shape for variant in ancestor.variants):
            return ancestor, path
    return None


def body_path(spec: Spec, shape: KernelShape) -> str:
    """The path of the body of ``shape`` that ``spec``'s kernels take, under the generated root."""
    source = body_source(spec, shape)
    target = spec.target if source is None else source[0].target
    return f"{target}/bodies/{shape.name}.py"


def body_import(spec: Spec, shape: KernelShape) -> str:
    """The import of the body of ``shape`` relative to ``spec``'s kernels package (this target's
    bodies, or those of a target whose spec this one extends)."""
    source = body_source(spec, shape)
    package = ".." if source is None else f"...{source[0].target}."
    return f"{package}bodies.{shape.name}"


def measured_sets(
    spec: Spec, measured: Measured | None
) -> list[tuple[str, str, tuple[int, int] | None]]:
    """The sets of ``spec.tuning_sets()`` whose dispatch comes from measurements."""
    if measured is None:
        return []
    base = spec.tuning_head_dims
    with_cells = {
        (c.layout, c.state_dtype, c.head_dims(base)) for c in measured.cells if c.mode != "core"
    }
    return [s for s in spec.tuning_sets() if s in with_cells]


def unmeasured_sets(spec: Spec, measured: Measured | None) -> dict[str, str]:
    """The sets of ``spec.tuning_sets()`` whose dispatch falls back to the spec's static rules, by
    :func:`set_key`, each with why."""
    fresh = set(measured_sets(spec, measured))
    reasons = {}
    for layout, state_dtype, dims in spec.tuning_sets():
        if (layout, state_dtype, dims) in fresh:
            continue
        key = set_key(layout, state_dtype, dims, spec)
        if measured is None:
            reasons[key] = "no tuning file"
        else:
            reasons[key] = measured.stale.get(key, f"{measured.name} has no cells of it")
    return reasons


def _table_lead(rules: list[Rule]) -> list[Rule]:
    """The rules a table starts with, its own (:func:`dispatch_rules`): where it has measured
    decode-core cells, the spec's rules that hold PDL off for such calls, then the measured core
    rules; then its measured per-token rules."""
    held = list(takewhile(lambda r: r.conv1d and not r.pdl and not r.measured, rules))
    core = list(takewhile(lambda r: r.conv1d and r.measured, rules[len(held) :]))
    lead = held + core if core else []
    return lead + list(takewhile(lambda r: r.measured and for_a_form(r), rules[len(lead) :]))


def dispatch_tables(rules: list[Rule], tables: dict[str, list[Rule]]) -> dict:
    """dispatch.py's tables. Each starts with its own measured decode-core rules (``lead``,
    ``leads``), then the rules every table has next (the spec's rules that go ahead of the other
    measured ones, the same in each), written once as ``ahead``; then ``rules`` (the default
    table) and each GPU model's table without those."""
    lead = _table_lead(rules)
    ahead = list(takewhile(ahead_of_measured, rules[len(lead) :]))
    parts = {"ahead": ahead, "lead": lead, "rules": rules[len(lead) + len(ahead) :]}
    parts["leads"], parts["tables"] = {}, {}
    for gpu, gpu_rules in tables.items():
        gpu_lead = _table_lead(gpu_rules)
        rest = gpu_rules[len(gpu_lead) :]
        if list(takewhile(ahead_of_measured, rest)) != ahead:
            raise AssertionError(f"the {gpu} table does not have the default's static rules")
        parts["leads"][gpu] = gpu_lead
        parts["tables"][gpu] = rest[len(ahead) :]
    return parts


def _without_dead_rules(spec: Spec, tables: list[tuple]) -> list[tuple]:
    """``tables`` (key, tuning, rules) without the rules no call reaches. Each table's own rules
    (its decode-core lead, and its rules after the shared ones) go where that table does not
    reach them; the spec's rules every table has ahead of its measured ones (written once)
    only where no table reaches them, as where every table's measured core rules, or a held
    rule's first place, serve their calls first (:func:`dispatch_rules`)."""
    calls = (spec.served, spec.head_dims, spec.features.max_tokens, spec.fusions)
    parts = []  # per table: its lead's length, its shared rules' span, its reached positions
    for _, _, rules in tables:
        lead = len(_table_lead(rules))
        ahead = len(list(takewhile(ahead_of_measured, rules[lead:])))
        parts.append((lead, ahead, set(reached_at(rules, *calls))))
    shared_live = {i - lead for lead, ahead, at in parts for i in at if lead <= i < lead + ahead}
    kept = []
    for (key, tuning, rules), (lead, ahead, at) in zip(tables, parts):
        live = [
            rule for i, rule in enumerate(rules)
            if (i - lead in shared_live if lead <= i < lead + ahead else i in at)
        ]  # fmt: skip
        kept.append((key, tuning, live))
    return kept


def dispatch_files(
    spec: Spec, spec_path: str, measured: Measured | None, other_gpus: dict[str, Measured]
) -> list[PlannedFile]:
    """``dispatch.py``, its tables a rule a line (gdngen.emit.dispatch_table), and where any of
    them is measured, ``dispatch_evidence.txt``: why each of their measured rows picks its
    variant."""
    table_gpu = spec.tuning.gpu if spec.tuning and measured else None
    # per table: its key ("TABLE", or its GPU model in TABLES), tuning file and rules
    tables = [("TABLE", measured, dispatch_rules(spec, measured))]
    tables += [(gpu, other, dispatch_rules(spec, other)) for gpu, other in other_gpus.items()]
    tables = _without_dead_rules(spec, tables)
    parts = dispatch_tables(tables[0][2], {gpu: rules for gpu, _, rules in tables[1:]})
    evidence = []  # per table with measured rows: the rows' sources, variants and evidence
    for key, tuning, rules in tables:
        why = dispatch_evidence(spec, tuning) if tuning else {}
        kept = [rule.source for rule in rules if rule.source in why]
        rows = [(source, *why[source][:1], why[source][1:]) for source in kept]
        # measured rules that rules before them serve every call of first (a held rule)
        left_out = [(source, why[source][0]) for source in why if source not in kept]
        if rows:
            name = "TABLE" if key == "TABLE" else f"TABLES[{json.dumps(key)}]"
            evidence.append({"key": key, "name": name, "file": tuning.name, "rows": rows,
                             "left_out": left_out})  # fmt: skip
    layout = RowFormat.for_spec(
        (spec.variant_name(v) for v in spec.variants), spec.features.max_tokens
    )
    files = [
        PlannedFile(
            relpath="dispatch.py",
            template="dispatch.py.j2",
            spec_path=spec_path,
            context={
                "target": spec.target,
                "table_gpu": table_gpu,
                "header": layout.header(),
                "ahead": [layout.row(rule) for rule in parts["ahead"]],
                "lead": [layout.row(rule) for rule in parts["lead"]],
                "rules": [layout.row(rule) for rule in parts["rules"]],
                "leads": {
                    gpu: [layout.row(rule) for rule in rules]
                    for gpu, rules in parts["leads"].items()
                },
                "tables": {
                    gpu: [layout.row(rule) for rule in rules]
                    for gpu, rules in parts["tables"].items()
                },
                # the tuning file each table's measured rows cite, by its key
                "cites": {table["key"]: table["file"] for table in evidence},
                "evidence": EVIDENCE if evidence else None,
            },
        )
    ]
    if evidence:
        files.append(
            PlannedFile(
                relpath=EVIDENCE,
                template="dispatch_evidence.txt.j2",
                spec_path=spec_path,
                context={"target": spec.target, "tables": evidence},
            )
        )
    return files


def _measured_by_head_dims(
    spec: Spec, measured: Measured
) -> Iterator[tuple[list[Cell], list[tuple[str, str]], tuple[int, int]]]:
    """Per head dims the grid measures: the cells measured at them, the (layout, dtype) pairs
    whose timings there hold (:func:`measured_sets`), and the head dims."""
    sets = measured_sets(spec, measured)
    base = spec.tuning_head_dims
    for dims in spec.tuned_head_dims:
        cells = [c for c in measured.cells if c.head_dims(base) == dims]
        yield cells, [(layout, dtype) for layout, dtype, d in sets if d == dims], dims


def dispatch_evidence(spec: Spec, measured: Measured) -> dict[str, list[str]]:
    """Why each measured rule of :func:`dispatch_rules` picks its plan, by its ``source``: the
    plan, then the evidence lines (gdngen.dispatch.measured_evidence)."""
    evidence = {}
    for cells, pairs, dims in _measured_by_head_dims(spec, measured):
        evidence.update(measured_evidence(cells, pairs, spec.features.max_tokens, dims))
    return evidence


def dispatch_rules(spec: Spec, measured: Measured | None = None) -> list[Rule]:
    """The dispatch table (first match wins): measured rules for decode-core calls, from the
    tuning file's core cells (docs/design.md, "Tuning the decode core"), and for calls with
    vLLM's per-token slot table, from its spec cells (timed in that form on this GPU model, they
    go before the spec's rules for it, which other GPU models' tables keep); the spec's rules for
    calls with the gated RMSNorm epilogue and its rules that name a call form (the plain tuning
    times the recurrence alone, on dense rows, so they come before its rules); measured rules
    for the pairs whose timings hold, at the head dims they were measured at; then the spec's
    other static rules that still serve some call (every call of the other pairs, and the
    measured pairs' calls at other head dims), each citing where it came from.

    The static rules are kept as they are reached without those leading rules, so that every table
    holds the same ones ahead of its measured rules (dispatch.py writes them once): where a core
    rule serves a call first, the spec's rule behind it stays and serves the calls it does not
    (other T, other pairs, calls with a per-token cache)."""
    static = [replace(rule, source=f"spec[{index}]") for index, rule in enumerate(spec.dispatch)]
    rules = [rule for rule in static if ahead_of_measured(rule)]
    lead: list[Rule] = []
    per_token: list[Rule] = []
    if measured:
        for cells, pairs, dims in _measured_by_head_dims(spec, measured):
            for rule in measured_rules(cells, pairs, spec.features.max_tokens, dims):
                (per_token if rule.per_token_slots else rules).append(rule)
            lead += core_rules(cells, dims)
    rules += [rule for rule in static if not ahead_of_measured(rule)]
    gap = coverage_gap(rules, spec.served, spec.head_dims, spec.features.max_tokens, spec.fusions)
    if gap is not None:  # the spec's own rules cover every call (Spec validates), so: measured
        where = measured.name if measured else "the spec's dispatch"
        raise TuningError(
            f"{where}: its dispatch rules leave a gap: no rule serves {gap.describe()}"
        )
    calls = (spec.served, spec.head_dims, spec.features.max_tokens, spec.fusions)
    reach = reached(rules, *calls)
    if lead:
        lead = _held_pdl_off(spec, static, measured) + lead
    if lead or per_token:
        # a measured rule that a rule before it serves every call of first is dead weight
        first = reached(lead + per_token + reach, *calls)
        lead = [rule for rule in lead + per_token if rule in first]
    return lead + reach


def _held_pdl_off(spec: Spec, static: list[Rule], measured: Measured) -> list[Rule]:
    """The spec's rules that hold PDL off (``pdl: false``) for decode-core calls, which go
    before the measured core rules where the core tune did not time their plan without PDL
    (gdngen.tune.core.pdl_off_plans): ranked only against plans with PDL, as a call gets them
    by default, the tune's verdict says nothing about the same kernel without PDL, which is
    what such a rule was measured for (docs/design.md, "Tuning the decode core"). Where the
    cells timed it, their rules decide. Each must be the spec's own first match for every call
    it serves, so that putting it first changes no other rule's calls."""
    timed = {name for c in measured.cells if c.mode == "core" for t in c.timings for name in t}
    held = [
        rule for rule in static if rule.conv1d and not rule.pdl
        and rule_plan(rule, pdl=False) not in timed
    ]  # fmt: skip
    if not held:
        return []
    ordered = table_order(static)
    fusions = [(True, True)]
    for shape in boundary_shapes(
        ordered, spec.served, spec.head_dims, spec.features.max_tokens, fusions
    ):
        for rule in held:
            if rule.serves(shape) and select(ordered, shape) is not rule:
                raise TuningError(
                    f"{rule.source} holds PDL off for decode-core calls, but the spec's "
                    f"{select(ordered, shape).source} serves {shape.describe()} first: a core "
                    "rule held ahead of the measured ones must be the first match of its calls"
                )
    return held
