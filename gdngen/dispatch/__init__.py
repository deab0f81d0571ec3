"""The dispatch model: which kernel variant serves a call (docs/design.md, "Dispatch").

One representation everywhere: a :class:`Rule` (conditions on a call -> the variant it ``use``s)
is what a spec's ``dispatch:`` section holds, what ``gdngen emit`` derives from measurements
(:mod:`.measured`, the verdict policy) and writes into ``generated/<target>/dispatch.py``, and
what the runtime reads. First match wins, written once (:func:`select`, and
:class:`FirstMatch`, the same answer over one table for many calls); coverage is checked with the
same matcher (:func:`coverage_gap`).
"""

from .measured import (
    Verdict,
    core_rules,
    measured_evidence,
    measured_rules,
    rule_plan,
    tuned_ref,
    verdicts,
)
from .rules import (
    CallShape,
    FirstMatch,
    Fusion,
    Range,
    Rule,
    batch_heads_points,
    boundary_shapes,
    coverage_gap,
    ahead_of_measured,
    for_a_form,
    reached,
    reached_at,
    row,
    select,
    table_order,
)

__all__ = [
    "CallShape",
    "FirstMatch",
    "Fusion",
    "Range",
    "Rule",
    "Verdict",
    "ahead_of_measured",
    "for_a_form",
    "batch_heads_points",
    "boundary_shapes",
    "coverage_gap",
    "core_rules",
    "measured_evidence",
    "measured_rules",
    "reached",
    "reached_at",
    "row",
    "rule_plan",
    "select",
    "table_order",
    "tuned_ref",
    "verdicts",
]
