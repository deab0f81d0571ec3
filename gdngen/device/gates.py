"""A token's gates, as every kernel body computes them (docs/design.md, "The math"):
the decay ``g = exp(-exp(A_log) * softplus(a + dt_bias))`` and the write strength
``beta = sigmoid(b)``. A token past a packed sequence's end gets ``g = 1, beta = 0``: it leaves
the state as it is.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32

#: past it, softplus(x) is x to fp32 precision: the kernels skip its exp and log1p
SOFTPLUS_THRESHOLD = 20.0


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
