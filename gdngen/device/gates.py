"""A token's gates, as every kernel body computes them (docs/design.md, "The math"):
the decay ``g = exp(-exp(A_log) * softplus(a + dt_bias))`` and the write strength
``beta = sigmoid(b)``. A token past a packed sequence's end gets ``g = 1, beta = 0``: it leaves
the state as it is.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32, Int64

#: past it, softplus(x) is x to fp32 precision: the kernels skip its exp and log1p
SOFTPLUS_THRESHOLD = 20.0
#: the least T from which the stepwise solve's warps share each token's gates (lane_token):
#: on an H200, from T = 3 no cell measured slower and some ran up to 1.24x faster; at T = 2
#: vLLM's spec form of int8 `tv32_ilp4_vec8` ran 0.91x at B = 1
#: (docs/perf/h200-2026-11-29-warp-gates.md)
SHARED_GATES_FROM_T = 3


def _gate_input(x, at):
    """``x`` as an fp32 value: ``x`` itself, or, with ``at``, the element of tensor ``x`` there."""
    return x if at is None else Float32(x[at])


@cute.jit
def token_gates(a, b, A, bias, live, packed: Constexpr[bool], at=None):
    """``(g, beta)`` of one token. ``a`` and ``b``: its gate inputs as fp32 values, or, with
    ``at`` (an index of the [rows, tokens, HV] tensors), the tensors to load them from here, each
    where its value is first needed: b after g's arithmetic, where the kernels have always loaded
    it (ptxas follows that order). ``A``: -exp(A_log) of the head; ``bias``: its dt_bias;
    ``live``: whether the token is in its row (``packed``: rows are packed sequences)."""
    x = _gate_input(a, at) + bias
    softplus_x = x
    if x <= SOFTPLUS_THRESHOLD:
        softplus_x = cute.math.log1p(cute.math.exp(x))
    g = cute.math.exp(A * softplus_x)
    beta = 1.0 / (1.0 + cute.math.exp(-_gate_input(b, at)))
    if cutlass.const_expr(packed):
        g = Float32(cutlass.select_(live, g, Float32(1.0)))
        beta = Float32(cutlass.select_(live, beta, Float32(0.0)))
    return g, beta


def lane_token(token_at: list, token_live: list, T: int):
    """``(position, live)`` of the token whose gates this lane computes for its warp: token
    ``lane % T`` of the row (:func:`shared_gates`). Every lane of a stepwise CTA solves the same
    row and value head, so a token's gates are the same on all of them; computing each once a
    warp instead of once a lane takes T - 1 gates' arithmetic (about 45 instructions each) off
    every lane, for two shuffles a token. T <= 32 lanes: ``features.max_tokens`` caps T at 16.
    At T = 1 the row's token as it is."""
    if T == 1:
        return token_at[0], token_live[0]
    mine = cute.arch.lane_idx() % T
    if all(isinstance(at, int) for at in token_at):
        # Dense rows: token t sits at position t.
        at = Int64(mine)
    else:
        at = Int64(token_at[0])
        for t in range(1, T):
            at = Int64(cutlass.select_(mine == t, Int64(token_at[t]), at))
    live = token_live[0]
    for t in range(1, T):
        live = cutlass.select_(mine == t, token_live[t], live)
    return at, live


def shared_gates(lane_g, lane_beta, T: int):
    """Every token's ``g`` and ``beta`` (two lists), each from the lane of the warp that computed
    them (:func:`lane_token`): lane t has token t's. Every lane of the warp must take part."""
    g = [cute.arch.shuffle_sync(lane_g, offset=t) for t in range(T)]
    beta = [cute.arch.shuffle_sync(lane_beta, offset=t) for t in range(T)]
    return g, beta
