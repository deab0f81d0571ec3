"""The dispatch table's row type and the selector that reads it.

A generated ``dispatch.py`` holds a literal tuple of :class:`Row`; :func:`select` returns the first
row whose conditions hold. New kernels are new rows, never new ``if`` code here.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    layout: str
    state_dtype: str
    tokens: tuple[int, int | None]
    batch_heads: tuple[int, int | None]
    intermediate: str  # "yes", "no" or "any"
    variant: str
    source: str


def _within(value: int, bounds: tuple[int, int | None]) -> bool:
    lo, hi = bounds
    return lo <= value and (hi is None or value <= hi)


def matches(
    row: Row, *, layout: str, state_dtype: str, tokens: int, batch_heads: int, intermediate: bool
) -> bool:
    return (
        row.layout == layout
        and row.state_dtype == state_dtype
        and _within(tokens, row.tokens)
        and _within(batch_heads, row.batch_heads)
        and row.intermediate in ("any", "yes" if intermediate else "no")
    )


def select(
    table: tuple[Row, ...],
    *,
    layout: str,
    state_dtype: str,
    tokens: int,
    batch_heads: int,
    intermediate: bool,
) -> Row:
    """The first row of ``table`` that serves the call; LookupError if none does."""
    for row in table:
        if matches(
            row,
            layout=layout,
            state_dtype=state_dtype,
            tokens=tokens,
            batch_heads=batch_heads,
            intermediate=intermediate,
        ):
            return row
    raise LookupError(
        f"no dispatch row serves layout={layout} state_dtype={state_dtype} tokens={tokens} "
        f"batch_heads={batch_heads} intermediate={intermediate}"
    )
