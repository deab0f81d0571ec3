"""Trace-time helpers of the staged solve (``solve: staged`` kernels).

The staged kernels need, per CTA, the products between the T tokens' normalised vectors:
``q_t . k_s`` for ``s <= t`` (how token s's delta reaches token t's output) and ``k_t . k_s`` for
``s < t`` (how it reaches token t's delta). Each warp takes every ``warps``-th product; these
functions list them at trace time, so the kernel unrolls exactly the products a warp owns.
"""

from __future__ import annotations


def _all_products(tokens: int) -> list[tuple[str, int, int]]:
    output = [("output", t, s) for t in range(tokens) for s in range(t + 1)]
    solve = [("solve", t, s) for t in range(tokens) for s in range(t)]
    return output + solve


def output_products(tokens: int, warps: int, warp: int) -> list[tuple[int, int]]:
    """(t, s) with s <= t whose ``q_t . k_s`` warp ``warp`` of ``warps`` computes."""
    mine = _all_products(tokens)[warp::warps]
    return [(t, s) for kind, t, s in mine if kind == "output"]


def solve_products(tokens: int, warps: int, warp: int) -> list[tuple[int, int]]:
    """(t, s) with s < t whose ``k_t . k_s`` warp ``warp`` of ``warps`` computes."""
    mine = _all_products(tokens)[warp::warps]
    return [(t, s) for kind, t, s in mine if kind == "solve"]
