"""The call forms' checks: where a call's tokens are (dense, or packed by cu_seqlens with
max_seqlen and uniform_seqlen) and the per-token slot table with num_accepted_tokens
(docs/design.md, "Call forms"). Messages as gdngen.runtime.checks says.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .arg_checks import (
    dtype_name,
    require_contiguous,
    require_dims,
    require_dtype,
    require_int,
    shape_text,
)
from .info import TargetInfo

IO_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
INDEX_DTYPES = {torch.int32: "int32", torch.int64: "int64"}


@dataclass(frozen=True)
class Tokens:
    """Where a call's tokens are. Dense: q is [B, T, ...] and kernel row n is batch row n.
    Packed: q is [1, total_tokens, ...] with cu_seqlens [N + 1]; kernel row n is the n-th
    sequence, of at most T = max_seqlen tokens."""

    io_dtype: str
    #: kernel rows: batch rows, or sequences
    rows: int
    T: int
    H: int
    K: int
    total_tokens: int | None
    cu_seqlens_dtype: str | None

    @property
    def packed(self) -> bool:
        return self.total_tokens is not None

    @property
    def lead(self) -> str:
        """The leading dims of q's form, as messages name them."""
        return "1, total_tokens" if self.packed else "B, T"

    @property
    def rows_meaning(self) -> str:
        return "[N] (one per sequence)" if self.packed else "[B]"


def check_tokens(info: TargetInfo, q, cu_seqlens, max_seqlen, uniform_seqlen) -> Tokens:
    """q's dtype and form, and the packed form's cu_seqlens, max_seqlen and uniform_seqlen."""
    io_dtype = require_dtype("q", q, IO_DTYPES)
    packed = cu_seqlens is not None
    lead = "1, total_tokens" if packed else "B, T"
    require_dims("q", q, (1, None, None, None) if packed else (None,) * 4, f"[{lead}, H, K]")
    rows, T, H, K = q.shape
    cu_seqlens_dtype = total_tokens = None
    if packed:
        total_tokens = T
        cu_seqlens_dtype = require_dtype("cu_seqlens", cu_seqlens, INDEX_DTYPES)
        if cu_seqlens.dim() != 1 or cu_seqlens.size(0) < 2:
            raise ValueError(
                f"cu_seqlens: expected shape [N + 1] with N >= 1 sequences; got {shape_text(cu_seqlens)}"
            )
        require_contiguous("cu_seqlens", cu_seqlens)
        rows = cu_seqlens.size(0) - 1
        if max_seqlen is None:
            T = min(total_tokens, info.max_tokens)
        else:
            T = require_int(
                "max_seqlen", max_seqlen, 1, info.max_tokens,
                f"the most tokens a sequence of this call has; target {info.name} serves "
                f"1..{info.max_tokens}",
            )  # fmt: skip
    elif max_seqlen is not None:
        raise ValueError(
            "max_seqlen: only a packed call (cu_seqlens) takes it; a dense call's T is q.shape[1]"
        )
    if uniform_seqlen and max_seqlen is None:
        raise ValueError(
            "uniform_seqlen: places sequence n at n * max_seqlen, so it needs a packed call "
            f"(cu_seqlens) with max_seqlen; got cu_seqlens={'a tensor' if packed else None}, "
            "max_seqlen=None"
        )
    if uniform_seqlen and total_tokens < rows * T:
        raise ValueError(
            f"uniform_seqlen: places sequence n at n * max_seqlen, so the token buffer must hold "
            f"N * max_seqlen = {rows} * {T} = {rows * T} tokens; got {total_tokens}"
        )
    return Tokens(io_dtype, rows, T, H, K, total_tokens, cu_seqlens_dtype)


def index_vector(name: str, tensor: torch.Tensor, dtype: torch.dtype, rows: int, meaning: str):
    """A [rows] index tensor in the slots' dtype, dense."""
    if tensor.dtype != dtype:
        raise TypeError(
            f"{name}: expected dtype {dtype_name(dtype)} (as initial_state_indices); "
            f"got {dtype_name(tensor.dtype)}"
        )
    require_dims(name, tensor, (rows,), meaning)
    require_contiguous(name, tensor)


def check_slot_table(
    tokens: Tokens, read_slots, write_slots, num_accepted, disable_state_update
) -> None:
    """A per-token table [N, 1 + S]: column t receives the state after token t."""
    require_dims(
        "initial_state_indices", read_slots, (tokens.rows, None), "[N, 1 + S] (per-token slots)"
    )
    columns = read_slots.size(1)
    if columns < tokens.T:
        raise ValueError(
            f"initial_state_indices: a per-token table needs a column per token, 1 + S >= "
            f"T={tokens.T}; got {shape_text(read_slots)} (plain multi-token decode passes [N] indices)"
        )
    if columns > 1 and read_slots.stride(1) != 1:
        raise ValueError(
            f"initial_state_indices: its columns must be contiguous (strides "
            f"{tuple(read_slots.stride())}); rows may have any stride"
        )
    for name, given, why in (
        ("output_state_indices", write_slots, "the table names the slots written"),
        ("disable_state_update", disable_state_update or None, "the table's slots are the update"),
    ):  # fmt: skip
        if given is not None:
            raise ValueError(f"{name}: not with a per-token slot table ({why})")
    if num_accepted is not None:
        index_vector(
            "num_accepted_tokens", num_accepted, read_slots.dtype, tokens.rows,
            tokens.rows_meaning,
        )  # fmt: skip


def check_token_scatter(
    tokens: Tokens, token_scatter, read_slots, write_slots, num_accepted, cache_buffer,
    disable_state_update, conv_state,
) -> None:  # fmt: skip
    """FlashInfer's per-token scatter (gated_delta_rule_mtp's ``ssm_state_indices [B, T]``): the
    initial state from ``initial_state_indices [N]``, the state after token t to slot
    ``ssm_state_indices[n, t]`` (skipped where that slot is padding), no final write. FlashInfer
    refuses it at T = 1 only because its kernel needs T >= 2; here T = 1 is the same form."""
    if read_slots is None or read_slots.dim() != 1:
        got = "None" if read_slots is None else shape_text(read_slots)
        raise ValueError(
            "ssm_state_indices: needs initial_state_indices of shape [N], the slots the initial "
            f"states are read from; got {got}"
        )
    if token_scatter.dtype != read_slots.dtype:
        raise TypeError(
            f"ssm_state_indices: expected dtype {dtype_name(read_slots.dtype)} (as "
            f"initial_state_indices); got {dtype_name(token_scatter.dtype)}"
        )
    require_dims(
        "ssm_state_indices", token_scatter, (tokens.rows, tokens.T),
        f"[{'N' if tokens.packed else 'B'}, T] (the slot of the state after each token)",
    )  # fmt: skip
    if tokens.T > 1 and token_scatter.stride(1) != 1:
        raise ValueError(
            f"ssm_state_indices: its columns must be contiguous (strides "
            f"{tuple(token_scatter.stride())}); rows may have any stride"
        )
    for name, given, why in (
        ("output_state_indices", write_slots,
         "the state after the last token goes to ssm_state_indices[:, T - 1]"),
        ("intermediate_states_buffer", cache_buffer,
         "the per-token states go to the pool's slots instead, as in FlashInfer"),
        ("disable_state_update", disable_state_update or None,
         "the per-token slots are the update, as in FlashInfer"),
        ("num_accepted_tokens", num_accepted,
         "it picks a column of a [N, 1 + S] initial_state_indices table"),
        ("conv_state", conv_state, "the conv1d prologue takes vLLM's per-token table only"),
    ):  # fmt: skip
        if given is not None:
            raise ValueError(f"{name}: not with ssm_state_indices ({why})")
