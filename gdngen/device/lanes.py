"""How the lanes of a group share a state row, as numbers the kernels unroll at trace time.

A group is ``threads_per_group`` lanes that together hold ``ilp`` rows of the state (each lane
``vec`` K columns of them). K-last: a group is that many consecutive lanes. V-last: ``32 / tpg``
groups interleave in a warp so that neighbouring lanes read neighbouring rows, and the lanes of
one group are ``lane_stride`` warp lanes apart. Sums over a group are XOR shuffles whose offsets
are the group-lane bits times the stride (docs/design.md, "Kernel design").

Pure Python: the spec model validates and describes variants with these same functions, and the
generated kernel modules import them, so each number has one derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WARP = 32


def lane_stride(layout: str, threads_per_group: int) -> int:
    """Distance in warp lanes between two K-neighbours of one group (1 for K-last)."""
    return 1 if layout == "k_last" else WARP // threads_per_group


def group_masks(threads_per_group: int) -> tuple[int, ...]:
    """The group-lane bits, largest first: one butterfly or scatter round each."""
    depth = int(math.log2(threads_per_group))
    return tuple(1 << s for s in reversed(range(depth)))


def butterfly_offsets(threads_per_group: int, stride: int = 1) -> tuple[int, ...]:
    """XOR offsets (warp lanes) of a full butterfly over a group, largest first: afterwards every
    lane holds the group's sum. Empty for a one-lane group."""
    return tuple(stride * mask for mask in group_masks(threads_per_group))


@dataclass(frozen=True)
class ReduceScatter:
    """The staged solve's reduce-scatter of a lane's ``2 * ilp`` partial dots (h.k of its rows,
    then h.q) over its group, and who holds what afterwards.

    In a round ``(offset, mask, half)`` the lanes whose ``mask`` bit is clear keep the lower
    ``half`` of their values and send the upper half to the partner ``offset`` lanes away, which
    keeps the upper half: one shuffle per kept value instead of one per value. The first round
    splits h.k from h.q. When the group has more lanes than values to split, the bits left over
    (``rest_offsets``) finish with a plain butterfly.
    """

    #: (xor offset, group-lane mask, half) per round, largest mask first
    levels: tuple[tuple[int, int, int], ...]
    #: plain butterfly offsets after the rounds
    rest_offsets: tuple[int, ...]
    #: consecutive rows whose reduced dots one lane holds afterwards
    rows_held: int
    #: (group-lane mask, rows): a lane's first held row is the sum of ``rows`` over the masks its
    #: lane index has set (every round after the h.k / h.q split)
    row_bits: tuple[tuple[int, int], ...]
    #: the group-lane bit set on lanes that hold h.q (clear: h.k)
    query_mask: int
    #: XOR offset between the h.k lane and the h.q lane of the same rows
    query_offset: int
    #: group-lane bits clear on the one lane that writes a row's output
    writer_mask: int


def reduce_scatter(ilp: int, threads_per_group: int, stride: int) -> ReduceScatter:
    """The reduce-scatter of ``2 * ilp`` values over a group of ``threads_per_group`` lanes whose
    neighbours are ``stride`` warp lanes apart (the staged solve needs ``threads_per_group >= 2``).
    """
    values = 2 * ilp
    masks = group_masks(threads_per_group)
    rounds = min(len(masks), int(math.log2(values)))
    levels = tuple(
        (stride * mask, mask, values >> (r + 1)) for r, mask in enumerate(masks[:rounds])
    )
    rest = masks[rounds:]
    query_mask = levels[0][1] if levels else 0
    return ReduceScatter(
        levels=levels,
        rest_offsets=tuple(stride * mask for mask in rest),
        rows_held=values >> len(levels),
        row_bits=tuple((mask, half) for _, mask, half in levels[1:]),
        query_mask=query_mask,
        query_offset=levels[0][0] if levels else 0,
        writer_mask=query_mask | sum(rest),
    )
