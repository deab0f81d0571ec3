"""The verdict policy: which variant serves each measured point, and the rules that follow.

A measured cell is (layout, state dtype, T, mode, HV, B) with one or more timings of its
candidate variants (:class:`gdngen.tune.tuning_file.Cell`). Within one (layout, dtype, mode, T)
group the rules are keyed on batch*heads: the measured points become ranges split at the
geometric midpoint between neighbours, and each range is served by the variant whose mean gap
to the fastest, over every timing of the cells at that point, is least (with one timing: the
fastest variant). If a variant's ranking differs between processes or GPUs of one model, each
timing is one sample of what a deployment gets, and the mean gap estimates what a pick costs on
average, where one run alone would crown whichever side it happened to see. T values between
measured ones use the rules of the nearest measured T below.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from .rules import Range, Rule


class MeasuredCell(Protocol):
    """What the policy reads of a tuning file's cell."""

    layout: str
    state_dtype: str
    tokens: int
    mode: str
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
        """What a rule's ``source`` says of this point."""
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


def verdicts(cells: Iterable[MeasuredCell]) -> list[Verdict]:
    """Per measured B*HV, the variant whose mean gap to the fastest is least over every timing of
    the cells there (ties: least worst gap, then least summed first-timing time, then name).

    Only variants timed in all those timings compete (a --retime run times a cell's contenders
    only); if none is, the first timings alone decide.
    """
    by_point: dict[int, list[MeasuredCell]] = defaultdict(list)
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


def _spans(points: list[Verdict]) -> list[tuple[Range, str, list[str]]]:
    """Consecutive points won by the same variant merged into one batch*heads range each; a range
    ends at the geometric midpoint between its last point and the next range's first."""
    spans: list[list] = []  # [lo, hi, variant, evidence]
    for position, point in enumerate(points):
        lo = (
            1
            if position == 0
            else math.isqrt(points[position - 1].batch_heads * point.batch_heads) + 1
        )
        if spans and spans[-1][2] == point.variant:
            spans[-1][3].append(point.evidence())
            continue
        if spans:
            spans[-1][1] = lo - 1
        spans.append([lo, None, point.variant, [point.evidence()]])
    return [(Range(lo=lo, hi=hi), variant, evidence) for lo, hi, variant, evidence in spans]


def measured_rules(
    cells: Sequence[MeasuredCell],
    pairs: Iterable[tuple[str, str]],
    max_tokens: int,
    cite: str,
    head_dims: tuple[int, int],
) -> list[Rule]:
    """Rules for the (layout, dtype) ``pairs`` from their measured cells, each citing ``cite``
    (the tuning file) and the evidence of its points, and each for the ``head_dims`` (K, V) the
    cells were measured at: a ranking at one K says nothing of another. A pair with verify cells
    gets separate rules for calls with intermediate states ("yes") and without ("no");
    otherwise "any"."""
    groups: dict[tuple, list[MeasuredCell]] = defaultdict(list)
    for cell in cells:
        groups[(cell.layout, cell.state_dtype, cell.mode, cell.tokens)].append(cell)
    rules = []
    for layout, state_dtype in pairs:
        modes = {m for (l, d, m, _) in groups if (l, d) == (layout, state_dtype)}
        for mode in ("update", "verify"):
            measured_tokens = sorted(
                t for (l, d, m, t) in groups if (l, d, m) == (layout, state_dtype, mode)
            )
            if mode == "verify":
                intermediate = "yes"
            else:
                intermediate = "no" if "verify" in modes else "any"
            for index, tokens in enumerate(measured_tokens):
                last = index + 1 == len(measured_tokens)
                token_range = Range(
                    lo=1 if index == 0 else tokens,
                    hi=max_tokens if last else measured_tokens[index + 1] - 1,
                )
                points = verdicts(groups[(layout, state_dtype, mode, tokens)])
                for batch_heads, variant, evidence in _spans(points):
                    rules.append(
                        Rule(
                            layout=layout, state_dtype=state_dtype, tokens=token_range,
                            batch_heads=batch_heads, intermediate=intermediate,
                            head_dims=head_dims, use=variant,
                            source=f"tuned {cite} T={tokens} {mode}: " + "; ".join(evidence),
                        )  # fmt: skip
                    )
    return rules
