"""The state-recovery forms' checks: FlashInfer's ``accepted_steps`` and ``recovery_steps``
(docs/design.md, "State recovery"). Messages as gdngen.runtime.checks says.

- ``recovery_steps = R`` (0..T): every row replays its first R tokens into the state without
  output, stores the state after them to its write slot, and decodes the rest from it with
  output; no final state is stored.
- ``accepted_steps [N]``, each row's last accepted token K (0..T-1): with state updates, the same
  with R = K + 1 per row; with ``disable_state_update=True`` or ``ssm_state_indices``, the row runs
  only its tokens 0..K (with output, their per-token states or cache rows), nothing past them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arg_checks import dtype_name, require_dims, require_dtype, require_int
from .form_checks import INDEX_DTYPES, Tokens


@dataclass(frozen=True)
class Recovery:
    """What a call asks of state recovery (none: ``accepted_steps_dtype`` None and
    ``recovery_steps`` 0)."""

    accepted_steps_dtype: str | None = None
    recovery_steps: int = 0


def check_recovery(
    tokens: Tokens, accepted_steps, recovery_steps, *, read_slots, disable_state_update,
    token_scatter, cache_buffer, num_accepted, z, conv_state,
) -> Recovery:  # fmt: skip
    """``accepted_steps`` (a tensor or None, already known to be one) and ``recovery_steps``,
    against the rest of the call. The recovery forms are FlashInfer's: dense rows of a pool
    with [N] read slots or a dense state, without the fused core."""
    steps = require_int(
        "recovery_steps", recovery_steps, 0, tokens.T,
        f"the leading tokens each row replays without output, at most T={tokens.T}",
    )  # fmt: skip
    if accepted_steps is None and steps == 0:
        return Recovery()
    name = "accepted_steps" if accepted_steps is not None else "recovery_steps"
    for other, given, why in (
        ("cu_seqlens", tokens.cu_seqlens_dtype, "the recovery forms take dense [B, T] rows"),
        ("num_accepted_tokens", num_accepted,
         "vLLM's per-token table picks the initial slot instead"),
        ("z", z, "the gated RMSNorm epilogue is not fused into the recovery forms"),
        ("conv_state", conv_state, "the conv1d prologue is not fused into the recovery forms"),
    ):  # fmt: skip
        if given is not None:
            raise ValueError(f"{other}: not with {name} ({why})")
    if read_slots is not None and read_slots.dim() != 1:
        raise ValueError(
            f"initial_state_indices: expected shape [B] with {name}; got a per-token table "
            f"[{', '.join(str(d) for d in read_slots.shape)}]"
        )
    if accepted_steps is None:
        # recovery_steps > 0: the state after the replayed tokens is what the call stores.
        for other, given, why in (
            ("disable_state_update", disable_state_update or None,
             "the state after the replayed tokens is the call's only store"),
            ("intermediate_states_buffer", cache_buffer,
             "the state after the replayed tokens goes to the pool's write slot instead"),
            ("ssm_state_indices", token_scatter, "FlashInfer's per-token scatter replays nothing"),
        ):  # fmt: skip
            if given is not None:
                raise ValueError(f"{other}: not with recovery_steps={steps} ({why})")
        return Recovery(recovery_steps=steps)
    if steps:
        raise ValueError(
            f"recovery_steps: expected 0 with accepted_steps (each row's accepted_steps entry "
            f"sets where its replay ends); got {steps}"
        )
    dtype = require_dtype("accepted_steps", accepted_steps, INDEX_DTYPES)
    require_dims(
        "accepted_steps", accepted_steps, (tokens.rows,),
        f"[B] (each row's last accepted token, 0..T-1 = 0..{tokens.T - 1})",
    )  # fmt: skip
    if tokens.rows > 1 and accepted_steps.stride(0) != 1:
        raise ValueError(
            f"accepted_steps: must be contiguous (stride {accepted_steps.stride(0)} given); "
            "pass .contiguous()"
        )
    if read_slots is not None and accepted_steps.dtype != read_slots.dtype:
        raise TypeError(
            f"accepted_steps: expected dtype {dtype_name(read_slots.dtype)} (as "
            f"initial_state_indices); got {dtype_name(accepted_steps.dtype)}"
        )
    if cache_buffer is not None and not disable_state_update:
        raise ValueError(
            "intermediate_states_buffer: with accepted_steps, only beside "
            "disable_state_update=True (each row then runs its accepted tokens and caches "
            "their states); with state updates the call replays them and stores the state "
            "after them instead"
        )
    return Recovery(accepted_steps_dtype=dtype)
