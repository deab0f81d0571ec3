"""Holding a register value at a point of the program (docs/design.md, "Kernel design").

A 16-bit state tile is loaded in its own dtype and converted to fp32 where the solve first uses
it. Left to themselves, LLVM and ptxas fold that conversion into the load's branch (the tile is
loaded only by the lanes that own rows), where every thread then waits for the state to arrive
before anything after the branch: the conv1d prologue's work, or the staged solve's staging of
q, k and the gates, and the loads ptxas schedules with them. ``hold_until_here`` pins the
conversion below that work, so the state's load is in flight while it runs.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


def hold_until_here(tile: cute.Tensor) -> None:
    """Make each value of the register tensor ``tile`` opaque at this point of the program, so
    that no use of it (its conversion to fp32, say) moves above here."""
    words = cute.recast_tensor(tile, Int32)  # as loaded: 16-bit halves would need unpacking
    for i in range(cute.size(words)):  # unrolled at trace time
        words[i] = _opaque(words[i])


def opaque(value):
    """A 32- or 64-bit integer ``value`` through an empty volatile inline asm (see ``_opaque``):
    the same number, which no use can see through to how it was loaded."""
    return _opaque(value, Int64 if isinstance(value, Int64) else Int32)


#: the inline asm's register constraint (output, tied to the input) per integer width
_REGISTER = {Int32: "=r,0", Int64: "=l,0"}


@dsl_user_op
def _opaque(word, width=Int32, *, loc=None, ip=None):
    """A ``width`` (Int32 or Int64) ``word`` through an empty volatile inline asm: the same bits,
    which the compilers can neither see through nor move across the program's other side effects
    (its barriers)."""
    held = llvm.inline_asm(
        width.mlir_type, [width(word).ir_value(loc=loc, ip=ip)], "", _REGISTER[width],
        has_side_effects=True, loc=loc, ip=ip,
    )  # fmt: skip
    return width(held)
