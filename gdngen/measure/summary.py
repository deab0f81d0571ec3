"""Figures the benches derive from their checks and timings: the relative error of two large
tensors, and the geometric mean of ratios."""

from __future__ import annotations

import math

import torch


def relative_error(got: torch.Tensor, expected: torch.Tensor, chunk: int = 1 << 26) -> float:
    """``|got - expected| / |expected|`` over whole tensors, in float64 a chunk of elements at a
    time (a pool in float64 at once would not fit beside the sets)."""
    got, expected = got.reshape(-1), expected.reshape(-1)
    squares = [0.0, 0.0]
    for start in range(0, expected.numel(), chunk):
        e = expected[start : start + chunk].double()
        squares[0] += float((got[start : start + chunk].double() - e).pow(2).sum())
        squares[1] += float(e.pow(2).sum())
    return math.sqrt(squares[0] / squares[1])


def geometric_mean(values: list[float]) -> float:
    """The geometric mean of positive ``values`` (ratios of times); ValueError if there are none."""
    if not values:
        raise ValueError("values: expected at least one ratio; got none")
    return math.exp(sum(map(math.log, values)) / len(values))
