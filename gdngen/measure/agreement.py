"""Whether two implementations left the same results on copies of one input set: which slots of
a state pool a call changed, and how far two sets of stored states are apart. The benches that
time gdngen beside a peer on the peer's own call form (gdngen.bench.mtp, gdngen.bench.fi_forms)
check a cell with these before they time it."""

from __future__ import annotations

import torch

#: the written states, relative to the peer's (in norm over the written slots). Each stores a
#: state once from its fp32 value, and the two fp32 values differ only by the order of the
#: arithmetic: a bf16 state is within 2^-8 of its fp32 value, so the two are within 2^-7 of each
#: other, element by element; fp32 states differ by that order alone (the GPU tests hold each
#: within 2e-5 of the float64 reference, so 4e-5 apart; 1e-4 with margin).
STATE_TOLERANCE = {"bf16": 2**-7, "fp32": 1e-4}
#: slots compared at a time (a large pool in float64 at once would not fit beside the sets)
CHUNK_SLOTS = 64


class Disagreement(Exception):
    """The two implementations left different results on the same inputs."""


def changed_slots(pool: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """The slots (sorted indices) in which ``pool`` differs from ``before`` in any bit of any
    element (so a state rewritten with its own bits counts as unchanged; random states make that
    as likely as no write), a chunk of slots at a time. Either may be a strided view whose last
    dim is contiguous."""
    changed = [
        (
            pool[i : i + CHUNK_SLOTS].view(torch.uint8)
            != before[i : i + CHUNK_SLOTS].view(torch.uint8)
        )
        .flatten(1)
        .any(1)
        for i in range(0, pool.shape[0], CHUNK_SLOTS)
    ]
    return torch.cat(changed).nonzero().flatten()


def slot_error(got: torch.Tensor, expected: torch.Tensor, slots: torch.Tensor) -> float:
    """``|got - expected| / |expected|`` over the given slots of two pools, in float64, a chunk of
    slots at a time."""
    squares = [0.0, 0.0]
    for i in range(0, slots.numel(), CHUNK_SLOTS):
        chunk = slots[i : i + CHUNK_SLOTS]
        e = expected.index_select(0, chunk).double()
        squares[0] += float((got.index_select(0, chunk).double() - e).pow(2).sum())
        squares[1] += float(e.pow(2).sum())
    return (squares[0] / squares[1]) ** 0.5


def gathered_error(pool: torch.Tensor, slots: torch.Tensor, expected: torch.Tensor) -> float:
    """``|pool[slots] - expected| / |expected|`` in float64, a chunk of slots at a time:
    ``expected`` holds the states the other implementation stored in ``slots``, in order."""
    squares = [0.0, 0.0]
    for i in range(0, slots.numel(), CHUNK_SLOTS):
        e = expected[i : i + CHUNK_SLOTS].double()
        got = pool.index_select(0, slots[i : i + CHUNK_SLOTS]).double()
        squares[0] += float((got - e).pow(2).sum())
        squares[1] += float(e.pow(2).sum())
    return (squares[0] / squares[1]) ** 0.5
