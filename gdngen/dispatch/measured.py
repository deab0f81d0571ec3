"""The verdict policy: which variant serves each measured point, and the rules that follow.

A measured cell is (layout, state dtype, T, mode, HV, B) with one or more timings of its
candidate variants (:class:`gdngen.tune.tuning_file.Cell`). Within one (layout, dtype, mode, T)
group the rules are keyed on batch*heads: the measured points become ranges split at the
geometric midpoint between neighbours, and each range is served by the variant whose mean gap
to the fastest is least (with one timing: the fastest variant). If a variant's ranking differs
between processes or GPUs of one model, each timing is one sample of what a deployment gets, and
the mean gap estimates what a pick costs on average, where one run alone would crown whichever
side it happened to see. T values between measured ones use the rules of the nearest measured T
below. A rule's ``source`` names the measured points behind it (:func:`tuned_ref`), and
:func:`measured_evidence` says, point by point, why they go to its variant.

A cell's first timing has every candidate; a ``--retime`` run adds a timing of the cell's
contenders only (:func:`cell_gaps`). So a variant's gap in a cell is its mean over the cell's
timings that have it, the point's score the mean of those over the point's cells, and a retime
of one cell sharpens that cell's evidence without taking the other cells' candidates away. A
lone cell, as before, goes to a variant timed in every one of its timings.

Cells of different HV can share a batch*heads (HV 4 at B 64, HV 16 at B 16, HV 64 at B 4: the
tensor-parallel shards of docs/design.md, "Dispatch"), and there one variant need not suit them
all. Where the point's pick is more than ``CELL_TOLERANCE`` off a cell's own fastest, a rule for
that cell's HV, placed before the point's rule, gives the cell its own pick. Neighbouring cells of
one point (no other cell measured between their HVs there) that leave the pick for the same variant
share one rule over the HVs from the one to the other: an HV between them, measured at other
points only, sits between two shards on which the point's pick is known to lose to the same
variant (docs/design.md, "Dispatch").
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import groupby
from dataclasses import dataclass
from functools import partial
from typing import Iterable, Iterator, NamedTuple, Protocol, Sequence

from gdngen.terms import LAYOUT_PREFIX, plan_name, plan_parts, variant_pair

from .rules import MEASURED_SOURCE, Range, Rule

#: how far a measured cell's dispatched variant may be off its own fastest (mean gap over the
#: cell's timings, 0.015 = 1.5%) before the cell's HV gets a rule of its own
CELL_TOLERANCE = 0.015


class MeasuredCell(Protocol):
    """What the policy reads of a tuning file's cell."""

    layout: str
    state_dtype: str
    tokens: int
    mode: str
    HV: int
    batch: int
    times_us: dict[str, float]

    @property
    def batch_heads(self) -> int: ...

    @property
    def timings(self) -> list[dict[str, float]]: ...


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
        """What this point says for the rule it is behind (:func:`measured_evidence`); the
        runner-up named by its knobs alone (:func:`_knobs_only`)."""
        head = f"B*HV={self.batch_heads}: {self.total_us:.2f} us"
        runner_up = _knobs_only(self.runner_up) if self.runner_up else None
        if self.timings == 1:
            return head + (f" (next {runner_up} {self.runner_up_us:.2f} us)" if runner_up else "")
        cells = f"{self.timings} timings of {self.cells} cell{'s' if self.cells > 1 else ''}"
        if f"{self.worst_gap:.1%}" == "0.0%":  # the fastest every time, to the figure shown
            head += f", the fastest in all {cells}"
        else:
            head += (
                f", {self.mean_gap:+.1%} mean and {self.worst_gap:+.1%} worst off the fastest in "
                f"{cells}"
            )
        return head + (f" (next {runner_up} {self.runner_up_gap:+.1%})" if runner_up else "")


def _knobs_only(name: str) -> str:
    """A variant's (or plan's) name without what every contender of a rule shares: the layout
    and state dtype in front (``kl_bf16_``) and the SM suffix (``_sm90``); a plan keeps its
    ``split:``, ``steps:`` or ``nopdl:``."""
    plan, colon, variant = name.rpartition(":")
    if variant[:3] in ("kl_", "vl_"):
        variant = variant[3:].removeprefix(variant_pair(variant)[1] + "_")
    stem, _, suffix = variant.rpartition("_sm")
    return plan + colon + (stem if stem and suffix.isdigit() else variant)


def cell_gaps(cell: MeasuredCell) -> dict[str, float]:
    """Each variant of the cell's first timing: its mean gap to the fastest over the cell's
    timings that have it. A --retime run times the cell's contenders only; a variant it left
    out keeps the gap of its first timing, where it was not a contender."""
    gaps = {}
    for name in cell.times_us:
        seen = [times[name] / min(times.values()) - 1 for times in cell.timings if name in times]
        gaps[name] = sum(seen) / len(seen)
    return gaps


def confirmed(cell: MeasuredCell) -> set[str]:
    """The variants timed in every timing of ``cell`` (all of them without a retime); if the
    retimes have no contender in common, those of its first timing."""
    names = set.intersection(*map(set, cell.timings))
    return names or set(cell.times_us)


def _worst_gap(cell: MeasuredCell, name: str) -> float:
    return max(times[name] / min(times.values()) - 1 for times in cell.timings if name in times)


def verdicts(cells: Iterable[MeasuredCell]) -> list[Verdict]:
    """Per measured B*HV, the variant whose gap to the fastest is least on average over the
    cells there, each cell's gap the mean over its timings that have the variant (ties: least
    worst gap in any of those timings, then least summed first-timing time, then name).

    Candidates are the variants in every cell's first timing; a lone cell's, the variants timed
    in every one of its timings (:func:`confirmed`): a retime's contenders, so a variant the
    retime left out cannot win the cell on its first timing alone.
    """
    by_point: dict[int, list[MeasuredCell]] = defaultdict(list)
    for cell in cells:
        by_point[cell.batch_heads].append(cell)
    points = []
    for batch_heads in sorted(by_point):
        at_point = by_point[batch_heads]
        if len(at_point) == 1:
            names = confirmed(at_point[0])
        else:
            names = set.intersection(*(set(cell.times_us) for cell in at_point))
        gaps = [cell_gaps(cell) for cell in at_point]

        def score(name: str) -> tuple[float, float, float, str]:
            mean = sum(cell[name] for cell in gaps) / len(gaps)
            worst = max(_worst_gap(cell, name) for cell in at_point)
            total = sum(cell.times_us[name] for cell in at_point)
            return mean, worst, total, name

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
                cells=len(at_point), timings=sum(len(cell.timings) for cell in at_point),
            )  # fmt: skip
        )
    return points


def point_ranges(points: list[Verdict]) -> list[Range]:
    """The batch*heads range each measured point decides: to the integer geometric midpoints
    between it and its neighbours; the first from 1, the last unbounded."""
    marks = [p.batch_heads for p in points]
    return [
        Range(
            lo=1 if i == 0 else math.isqrt(marks[i - 1] * mark) + 1,
            hi=None if i + 1 == len(marks) else math.isqrt(mark * marks[i + 1]),
        )
        for i, mark in enumerate(marks)
    ]


def _spans(points: list[Verdict]) -> list[tuple[Range, str, list[Verdict]]]:
    """Consecutive points won by the same variant merged into one batch*heads range each (the
    ranges of :func:`point_ranges`, joined), with the points merged."""
    spans: list[list] = []  # [lo, hi, variant, points]
    for point, decided in zip(points, point_ranges(points)):
        if spans and spans[-1][2] == point.variant:
            spans[-1][1] = decided.hi
            spans[-1][3].append(point)
            continue
        spans.append([decided.lo, decided.hi, point.variant, [point]])
    return [(Range(lo=lo, hi=hi), variant, merged) for lo, hi, variant, merged in spans]


class HeadException(NamedTuple):
    """Cells of neighbouring HVs at one measured point that get their own pick there."""

    heads: Range
    point: Verdict
    #: the point's batch*heads range (point_ranges)
    batch_heads: Range
    use: str
    #: a line per cell: its time with its own pick, and how far the point's pick is off it
    evidence: list[str]


def head_exceptions(cells: Sequence[MeasuredCell], points: list[Verdict]) -> list[HeadException]:
    """The cells whose point's pick is more than ``CELL_TOLERANCE`` off their own fastest: those
    HVs get their own pick there, one rule for each run of neighbouring such cells (in HV order)
    with the same own pick."""
    exceptions = []
    for point, span in zip(points, point_ranges(points)):
        if point.cells < 2:
            continue  # a lone cell's point is its own pick
        picks = []  # (HV, its own pick or None where the point's pick serves it, evidence)
        for cell in sorted(
            (c for c in cells if c.batch_heads == point.batch_heads), key=lambda c: c.HV
        ):
            gaps = cell_gaps(cell)
            own = min(confirmed(cell), key=lambda name: (gaps[name], name))
            off = gaps[point.variant] - gaps[own]
            evidence = (
                f"HV={cell.HV} B={cell.batch}: {cell.times_us[own]:.2f} us, where the "
                f"B*HV={point.batch_heads} pick {point.variant} is {off:+.1%} off"
            )
            picks.append((cell.HV, own if off > CELL_TOLERANCE else None, evidence))
        for own, run in groupby(picks, key=lambda pick: pick[1]):
            if own is not None:
                run = list(run)
                heads = Range(lo=run[0][0], hi=run[-1][0])
                exceptions.append(HeadException(heads, point, span, own, [e for _, _, e in run]))
    return exceptions


def tuned_ref(
    layout: str,
    state_dtype: str,
    head_dims: tuple[int, int],
    mode: str,
    tokens: int,
    batch_heads: tuple[int, int],
    heads: Range | None = None,
) -> str:
    """A measured rule's ``source``: the measured points behind it, as a reader looks them up in
    the tuning file, ``t:kl/bf16/K128V128/update/T2/bh64-256`` (the cells of that layout, state
    dtype, head dims, mode and T whose B*HV is a measured point from 64 to 256), and for a rule
    of some HVs ``/hv4-16`` (the cells of HV 4 to 16 at that point)."""

    def span(lo: int, hi: int) -> str:
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    K, V = head_dims
    ref = f"{MEASURED_SOURCE}{LAYOUT_PREFIX[layout]}/{state_dtype}/K{K}V{V}/{mode}/T{tokens}/"
    ref += f"bh{span(*batch_heads)}"
    return ref + (f"/hv{span(heads.lo, heads.hi)}" if heads else "")


def _group_rules(
    group: Sequence[MeasuredCell], common: dict, ref
) -> Iterator[tuple[Rule, list[str]]]:
    """The rules of one measured group (its cells of one layout, dtype, mode and T), each with
    its evidence: each point's HV exceptions, then its spans. ``common`` holds the fields every
    rule of the group shares; ``ref(batch_heads, heads)`` names a rule's source. A pick is a
    plan's name (gdngen.terms.plan_name): a split plan becomes its variant with ``split_conv``,
    a steps plan with ``split_conv`` and ``split_norm``, a plan without PDL a rule with
    ``pdl=False``."""

    def picked(name: str) -> dict:
        plan = plan_parts(name)
        return dict(
            use=plan.variant, split_conv=plan.split_conv, split_norm=plan.split_norm, pdl=plan.pdl
        )

    points = verdicts(group)
    for exception in head_exceptions(group, points):
        at = exception.point.batch_heads
        rule = Rule(
            **common, batch_heads=exception.batch_heads, heads=exception.heads,
            **picked(exception.use), source=ref((at, at), exception.heads),
        )  # fmt: skip
        yield rule, exception.evidence
    for batch_heads, variant, merged in _spans(points):
        span = (merged[0].batch_heads, merged[-1].batch_heads)
        rule = Rule(**common, batch_heads=batch_heads, **picked(variant), source=ref(span))
        yield rule, [point.evidence() for point in merged]


def _token_ranges(
    measured: list[int], last_hi: int, first_lo: int | None = 1
) -> Iterator[tuple[int, Range]]:
    """Each measured T with the T range its rules serve: from it (the first from ``first_lo``,
    None: from itself) to the next measured T's predecessor, and the last to ``last_hi``."""
    for index, tokens in enumerate(measured):
        last = index + 1 == len(measured)
        lo = (first_lo or tokens) if index == 0 else tokens
        yield tokens, Range(lo=lo, hi=last_hi if last else measured[index + 1] - 1)


def _explained_rules(
    cells: Sequence[MeasuredCell],
    pairs: Iterable[tuple[str, str]],
    max_tokens: int,
    head_dims: tuple[int, int],
) -> Iterator[tuple[Rule, list[str]]]:
    """:func:`measured_rules`, each with its evidence: a line per measured point behind it (or
    per cell, for a rule of some HVs)."""
    groups: dict[tuple, list[MeasuredCell]] = defaultdict(list)
    for cell in cells:
        groups[(cell.layout, cell.state_dtype, cell.mode, cell.tokens)].append(cell)
    for layout, state_dtype in pairs:
        modes = {m for (l, d, m, _) in groups if (l, d) == (layout, state_dtype)}
        # "spec" first: its rules are for calls of a per-token slot table alone, which the
        # "update" rules of a pair without verify cells would otherwise serve ("any")
        for mode in ("spec", "update", "verify"):
            measured_tokens = sorted(
                t for (l, d, m, t) in groups if (l, d, m) == (layout, state_dtype, mode)
            )
            form, first_lo = {}, 1
            if mode == "spec":
                # a per-token table stores every token's state; from the first measured T on (a
                # per-token call of one token is a dense row's). Timed reading and writing the
                # same slots: FlashInfer's per-token scatter keeps the spec's rules
                form = dict(per_token_slots=True, separate_writes=False)
                intermediate, first_lo = "yes", None
            elif mode == "verify":
                intermediate = "yes"
            else:
                intermediate = "no" if "verify" in modes else "any"
            for tokens, token_range in _token_ranges(measured_tokens, max_tokens, first_lo):
                common = dict(
                    layout=layout, state_dtype=state_dtype, tokens=token_range,
                    intermediate=intermediate, head_dims=head_dims, gated_norm=False, **form,
                )  # fmt: skip
                ref = partial(tuned_ref, layout, state_dtype, head_dims, mode, tokens)
                yield from _group_rules(groups[(layout, state_dtype, mode, tokens)], common, ref)


def _explained_core_rules(
    cells: Sequence[MeasuredCell], head_dims: tuple[int, int]
) -> Iterator[tuple[Rule, list[str]]]:
    """:func:`core_rules`, each with its evidence."""
    groups: dict[tuple, list[MeasuredCell]] = defaultdict(list)
    for cell in cells:
        if cell.mode == "core":
            groups[(cell.layout, cell.state_dtype, cell.tokens)].append(cell)
    for layout, state_dtype in sorted({(l, d) for l, d, _ in groups}):
        measured_tokens = sorted(t for (l, d, t) in groups if (l, d) == (layout, state_dtype))
        for tokens, token_range in _token_ranges(measured_tokens, measured_tokens[-1]):
            common = dict(
                layout=layout, state_dtype=state_dtype, tokens=token_range, intermediate="any",
                head_dims=head_dims, gated_norm=True, conv1d=True,
            )  # fmt: skip
            ref = partial(tuned_ref, layout, state_dtype, head_dims, "core", tokens)
            yield from _group_rules(groups[(layout, state_dtype, tokens)], common, ref)


def core_rules(cells: Sequence[MeasuredCell], head_dims: tuple[int, int]) -> list[Rule]:
    """Rules for decode-core calls (the conv1d prologue and the gated RMSNorm; at T > 1 the
    cells are vLLM's per-token form, which stores every token's state) at ``head_dims``, from the ``mode: core`` cells of ``cells`` (those of a pair whose
    timings hold): each picks a plan,
    the fused kernel or the split plan (``split_conv``). T between measured ones takes the rules
    of the nearest measured T below, and no rule reaches past the largest measured T: the
    spec's rules serve those calls, as they serve the others' forms."""
    return [rule for rule, _ in _explained_core_rules(cells, head_dims)]


def measured_rules(
    cells: Sequence[MeasuredCell],
    pairs: Iterable[tuple[str, str]],
    max_tokens: int,
    head_dims: tuple[int, int],
) -> list[Rule]:
    """Rules for the (layout, dtype) ``pairs`` from their measured cells, each citing the
    measured points it comes from (:func:`tuned_ref`; their figures: :func:`measured_evidence`),
    and each for the ``head_dims`` (K, V) the cells were measured at: a ranking at one K says
    nothing of another. They serve calls without the gated RMSNorm epilogue only: the tuning
    times the recurrence alone, and the fastest recurrence need not have the epilogue; the spec's
    rules route the fused calls. A pair with verify cells gets separate rules for calls with
    intermediate states ("yes") and without ("no"); otherwise "any". A pair's "spec" cells
    (vLLM's per-token slot table, every token's state stored) give rules for calls with such a
    table (``per_token_slots``), ahead of the pair's others, from their first measured T."""
    return [rule for rule, _ in _explained_rules(cells, pairs, max_tokens, head_dims)]


def measured_evidence(
    cells: Sequence[MeasuredCell],
    pairs: Iterable[tuple[str, str]],
    max_tokens: int,
    head_dims: tuple[int, int],
) -> dict[str, list[str]]:
    """Why each of :func:`measured_rules` picks its variant, by its ``source``: the plan it
    runs (:func:`rule_plan`), then a line per measured point behind it (time, gaps, runner-up; :meth:`Verdict.evidence`), or per cell for
    a rule of some HVs."""
    explained = [
        *_explained_core_rules(cells, head_dims),
        *_explained_rules(cells, pairs, max_tokens, head_dims),
    ]
    return {rule.source: [rule_plan(rule), *evidence] for rule, evidence in explained}


def rule_plan(rule, pdl: bool | None = None) -> str:
    """What a rule (a table's, or a spec's dispatch rule) runs, as the tuning file names the
    plan (gdngen.terms.plan_name): its variant, ``split:``/``steps:`` where it splits steps
    off, ``nopdl:`` without PDL (the rule's own, or ``pdl`` where given)."""
    return plan_name(rule.use, rule.split_conv, rule.split_norm, rule.pdl if pdl is None else pdl)
