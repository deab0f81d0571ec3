"""A dispatch table as ``generated/<target>/dispatch.py`` writes it: a rule a line, in columns.

Each row is a call of :func:`gdngen.dispatch.row`, a value per Rule field in field order, padded
to its column under a header comment that names the columns; black leaves the table alone
(``# fmt: off``). The widths are fixed, not the widest row's (the variant column's is the spec's
longest variant name, the T column's its max_tokens): a re-tune that moves some rows leaves every
other row's text as it was, and a value wider than its column pushes the rest of its own row only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Iterable

from gdngen.dispatch import Range, Rule
from gdngen.dispatch.rules import ROW_OPTIONS

#: per Rule field, in field order: its label in the header comment, and the width of its value
#: with the comma after it (None: as wide as the spec needs, :meth:`RowFormat.for_spec`; the last
#: column is not padded)
COLUMNS: dict[str, tuple[str, int | None]] = {
    "layout": ("layout", len('"v_last",')),
    "state_dtype": ("dtype", len('"bf16",')),
    "tokens": ("T", None),
    "batch_heads": ("B*HV", len("(11586, 23170),")),
    "intermediate": ("inter", len('"any",')),
    "head_dims": ("(K, V)", len("(128, 128),")),
    "gated_norm": ("norm", len("False,")),
    "conv1d": ("conv", len("False,")),
    "heads": ("HV", len("(12, 16),")),
    "packed": ("packed", len("False,")),
    "per_token_slots": ("slots", len("False,")),
    "split_conv": ("split", len("False,")),
    "use": ("use", None),
    "source": ("source", 0),
}


_DEFAULTS = {f.name: f.default for f in fields(Rule)}


def value_text(value: object) -> str:
    """A field's value as a row writes it: a range as ``(lo, hi)``, strings double-quoted."""
    if isinstance(value, Range):
        return f"({value.lo}, {value.hi})"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)  # head dims (K, V), a bool or None


@dataclass(frozen=True)
class RowFormat:
    """The columns of one target's tables."""

    widths: tuple[int, ...]

    @classmethod
    def for_spec(cls, variant_names: Iterable[str], max_tokens: int) -> "RowFormat":
        """Columns for rules that use any of ``variant_names``, at up to ``max_tokens`` tokens."""
        fitted = {
            "tokens": len(f"({max_tokens}, {max_tokens}),"),
            "use": max(len(value_text(name) + ",") for name in variant_names),
        }
        return cls(tuple(fitted.get(field, width) for field, (_, width) in COLUMNS.items()))

    def _line(self, cells: list[str]) -> str:
        return " ".join(cell.ljust(width) for cell, width in zip(cells, self.widths)).rstrip()

    def header(self) -> str:
        """The header comment, its labels above the values of :meth:`row`."""
        return "#   " + self._line([label for label, _ in COLUMNS.values()])

    def row(self, rule: Rule) -> str:
        values = [value_text(getattr(rule, field)) for field in COLUMNS]
        # the options after the columns, by keyword, only where a rule leaves its default
        values[-1] += "".join(
            f", {name}={value_text(getattr(rule, name))}"
            for name in ROW_OPTIONS
            if getattr(rule, name) != _DEFAULTS[name]
        )
        return f"row({self._line([value + ',' for value in values[:-1]] + values[-1:])}),"
