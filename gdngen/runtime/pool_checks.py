"""The state's checks: a dense per-row state or a pool of slots, the slot indices, the verify
cache beside it, and a quantized state's scales. Messages as gdngen.runtime.checks says.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdngen.terms import SCALED_STATE_DTYPES

from .arg_checks import (
    VECTOR_ALIGN,
    dtype_name,
    require_aligned,
    require_contiguous,
    require_dims,
    require_dtype,
    require_tensor,
    shape_text,
)
from .form_checks import INDEX_DTYPES, Tokens, check_slot_table, index_vector
from .info import TargetInfo

STATE_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int8: "int8",
    torch.float8_e4m3fn: "fp8_e4m3",
}


@dataclass(frozen=True)
class Pool:
    """The checked state: ``state`` (one per row) or ``initial_state`` (a pool of slots)."""

    name: str
    tensor: torch.Tensor
    dtype: str
    #: a head's dims, (V, K) for k_last, (K, V) for v_last, and how messages name them
    head_dims: tuple[int, int]
    head_meaning: str
    #: its head and row strides are not the dense ones (a view into a larger buffer):
    #: CompileKey.strided_state
    strided: bool = False


def check_pool(info: TargetInfo, state, initial_state, state_layout, HV, K, V) -> Pool:
    if (state is None) == (initial_state is None):
        raise ValueError(
            "state / initial_state: pass exactly one: state=[B, HV, ...] updated in place, or "
            "initial_state=[pool, HV, ...] with initial_state_indices"
            + ("" if state is None else "; both were given")
        )
    pool_name = "state" if state is not None else "initial_state"
    pool = state if state is not None else initial_state
    state_dtype = require_dtype(pool_name, pool, STATE_DTYPES)
    head_dims = (V, K) if state_layout == "k_last" else (K, V)
    head_meaning = "V, K" if state_layout == "k_last" else "K, V"
    require_dims(
        pool_name, pool, (None, HV) + head_dims, f"[pool, HV, {head_meaning}] ({state_layout})"
    )
    if (state_layout, state_dtype) not in info.served:
        served = ", ".join(f"{lay}/{dt}" for lay, dt in info.served)
        what = (
            f"variants with `layout: {state_layout}, state_dtype: {state_dtype}` and dispatch "
            f"rules for {state_layout}/{state_dtype}"
        )
        raise ValueError(
            f"{pool_name}: a {state_layout} {state_dtype} state is not served by target "
            f"{info.name} (it serves {served}). {info.add_to_spec(what)}"
        )
    strided = check_pool_strides(pool_name, pool, head_dims, head_meaning)
    require_aligned(
        pool_name, pool, VECTOR_ALIGN // pool.element_size(), outer_dims=3 if strided else 1
    )
    if pool.size(0) < 1:
        raise ValueError(f"{pool_name}: the pool is empty (shape {shape_text(pool)})")
    return Pool(pool_name, pool, state_dtype, head_dims, head_meaning, strided)


def check_pool_strides(pool_name: str, pool, head_dims, head_meaning: str) -> bool:
    """The pool's strides: its last dim contiguous, and no two elements of different slots,
    heads or rows at one address. Returns whether the head and row strides are other than the
    dense ones (FlashInfer's strided pools: a view into a larger buffer), which the kernel then
    takes at run time (CompileKey.strided_state); their alignment is check_pool's."""
    rows, columns = head_dims
    if columns > 1 and pool.stride(3) != 1:
        raise ValueError(
            f"{pool_name}: its last dim ({head_meaning.split(', ')[1]}) must be contiguous "
            f"(strides {tuple(pool.stride())} given); pass a view whose last stride is 1"
        )
    # The extent of one row, one head and one slot, given the inner strides: each outer stride
    # must step past the whole of the dim inside it.
    row_span = columns
    head_span = (rows - 1) * pool.stride(2) + row_span
    slot_span = (pool.size(1) - 1) * pool.stride(1) + head_span
    for dim, what, span in (
        (2, "rows", row_span),
        (1, "heads", head_span),
        (0, "slots", slot_span),
    ):
        if pool.size(dim) > 1 and pool.stride(dim) < span:
            raise ValueError(
                f"{pool_name}: {what} overlap (stride of dim {dim} is {pool.stride(dim)}; one of "
                f"its {what} spans {span} elements at strides {tuple(pool.stride())})"
            )
    dense_row, dense_head = columns, rows * columns
    return (rows > 1 and pool.stride(2) != dense_row) or (
        pool.size(1) > 1 and pool.stride(1) != dense_head
    )


def check_per_row_state(tokens: Tokens, pool: Pool, write_slots, num_accepted, cache_rows):
    """A state without slot indices: one per row, so no other index table either."""
    for name, given in (
        ("output_state_indices", write_slots),
        ("num_accepted_tokens", num_accepted),
        ("intermediate_state_indices", cache_rows),
    ):
        if given is not None:
            raise ValueError(f"{name}: needs initial_state_indices (the read slots) as well")
    if pool.tensor.size(0) != tokens.rows:
        what = "sequence" if tokens.packed else "batch row"
        raise ValueError(
            f"{pool.name}: without initial_state_indices the state is per {what}, so its "
            f"dim 0 must be {'N' if tokens.packed else 'B'}={tokens.rows}; "
            f"got {shape_text(pool.tensor)}"
        )


def check_slots(
    info: TargetInfo, tokens: Tokens, read_slots, write_slots, num_accepted, disable_state_update
) -> str:
    """The slot indices of a pool: [N] per row (with [N] write slots), or a per-token table.
    Returns their dtype."""
    index_dtype = require_dtype("initial_state_indices", read_slots, INDEX_DTYPES)
    if index_dtype not in info.index_dtypes:
        raise TypeError(
            f"initial_state_indices: target {info.name} was generated for "
            f"{'/'.join(info.index_dtypes)} indices; got {index_dtype}"
        )
    if read_slots.dim() == 2:
        check_slot_table(tokens, read_slots, write_slots, num_accepted, disable_state_update)
        return index_dtype
    require_dims("initial_state_indices", read_slots, (tokens.rows,), tokens.rows_meaning)
    require_contiguous("initial_state_indices", read_slots)
    if num_accepted is not None:
        raise ValueError(
            "num_accepted_tokens: needs per-token slots, initial_state_indices of shape "
            f"[N, 1 + S]; got {shape_text(read_slots)}"
        )
    if write_slots is not None:
        if write_slots.dtype != read_slots.dtype:
            raise TypeError(
                f"output_state_indices: expected dtype {dtype_name(read_slots.dtype)} "
                f"(as initial_state_indices); got {dtype_name(write_slots.dtype)}"
            )
        require_dims("output_state_indices", write_slots, (tokens.rows,), tokens.rows_meaning)
        require_contiguous("output_state_indices", write_slots)
    return index_dtype


def check_state_scales(pool: Pool, state_scales, cache_scales) -> None:
    """A quantized (int8 or fp8 e4m3) state's ``state_scales``: fp32 ``[slots, HV, V]`` (the
    pool's leading dims, one scale per row), rows contiguous; no scales (of the pool or of a
    verify cache) beside any other state (docs/design.md, "Quantized state")."""
    state_scales = require_tensor("state_scales", state_scales, optional=True)
    cache_scales = require_tensor("intermediate_states_scales", cache_scales, optional=True)
    if pool.dtype not in SCALED_STATE_DTYPES:
        for name, scales in (("state_scales", state_scales),
                             ("intermediate_states_scales", cache_scales)):  # fmt: skip
            if scales is not None:
                raise ValueError(
                    f"{name}: only a quantized state has scales (int8, fp8_e4m3); {pool.name} "
                    f"is {pool.dtype}, so pass {name}=None"
                )
        return
    if state_scales is None:
        raise ValueError(
            f"state_scales: an {pool.dtype} {pool.name} stores one fp32 scale per row; pass "
            f"state_scales, fp32 [{pool.tensor.size(0)}, {pool.tensor.size(1)}, "
            f"{pool.head_dims[0]}] (its slots, heads and rows); got None"
        )
    _check_row_scales("state_scales", state_scales, pool.tensor, pool.name)


def check_cache_scales(pool: Pool, cache_buffer, cache_scales) -> None:
    """A verify cache beside a quantized state is in the state's format (``cache_buffer``, as
    :func:`check_cache` holds it) with its rows' scales ``intermediate_states_scales``, fp32
    ``[R, cache_steps, HV, V]`` (the cache's leading dims), rows contiguous: an engine's copy of
    an accepted step into the pool is then a copy of values and scales (docs/design.md,
    "Quantized state"). Run after :func:`check_state_scales` and :func:`check_cache`."""
    if cache_buffer is None:
        if cache_scales is not None:
            raise ValueError(
                "intermediate_states_scales: the scales of a verify cache, which the call does "
                "not pass (intermediate_states_buffer is None); pass None"
            )
        return
    if pool.dtype not in SCALED_STATE_DTYPES:
        return
    expected = list(cache_buffer.shape[:4])
    if cache_scales is None:
        raise ValueError(
            f"intermediate_states_scales: a verify cache beside an {pool.dtype} {pool.name} "
            f"stores one fp32 scale per row; pass intermediate_states_scales, fp32 {expected} "
            "(its rows, steps, heads and value rows); got None"
        )
    _check_row_scales(
        "intermediate_states_scales", cache_scales, cache_buffer, "intermediate_states_buffer"
    )


def _check_row_scales(name: str, scales, values, values_name: str) -> None:
    """fp32 scales of ``values``' rows: its leading dims but the last (K-last rows), contiguous."""
    require_dtype(name, scales, {torch.float32: "fp32"})
    expected = tuple(values.shape[:-1])
    if tuple(scales.shape) != expected:
        raise ValueError(
            f"{name}: expected shape {list(expected)} (one scale per row of {values_name} "
            f"{shape_text(values)}); got {shape_text(scales)}"
        )
    require_contiguous(name, scales)


def check_cache(tokens: Tokens, pool: Pool, cache_buffer, cache_rows, read_slots) -> None:
    """The verify cache ``intermediate_states_buffer`` and the rows it is written at."""
    if cache_rows is not None and cache_buffer is None:
        raise ValueError(
            "intermediate_state_indices: names rows of intermediate_states_buffer, which is missing"
        )
    if cache_buffer is None:
        return
    if cache_buffer.dtype != pool.tensor.dtype:
        raise TypeError(
            f"intermediate_states_buffer: expected dtype {dtype_name(pool.tensor.dtype)} (as the "
            f"state); got {dtype_name(cache_buffer.dtype)}"
        )
    if cache_rows is not None:
        index_vector(
            "intermediate_state_indices", cache_rows, read_slots.dtype, tokens.rows,
            tokens.rows_meaning,
        )  # fmt: skip
    rows_name = "R" if cache_rows is not None else "N" if tokens.packed else "B"
    require_dims(
        "intermediate_states_buffer",
        cache_buffer,
        (None if cache_rows is not None else tokens.rows, None, pool.tensor.size(1))
        + pool.head_dims,
        f"[{rows_name}, cache_steps, HV, {pool.head_meaning}]",
    )
    if cache_buffer.size(1) < tokens.T:
        raise ValueError(
            f"intermediate_states_buffer: cache_steps (dim 1) must be >= T={tokens.T}; "
            f"got {cache_buffer.size(1)}"
        )
    require_contiguous("intermediate_states_buffer", cache_buffer)
    require_aligned("intermediate_states_buffer", cache_buffer, 1, outer_dims=0)
