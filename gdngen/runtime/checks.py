"""Checking a call's inputs before anything is launched or written.

Every check raises a TypeError (wrong kind or dtype) or a ValueError (wrong shape, layout,
device, range) whose message names the argument, what was expected and what was given. The
result is a :class:`Call`: the normalised facts the dispatcher and the compile cache need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .info import TargetInfo

IO_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
GATE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DT_BIAS_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
STATE_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
INDEX_DTYPES = {torch.int32: "int32", torch.int64: "int64"}
LAYOUTS = ("k_last", "v_last")
#: byte alignment the kernels assume for the base of every vector-loaded tensor
VECTOR_ALIGN = 16


@dataclass(frozen=True)
class Call:
    """A checked call: shapes, dtypes and flags, plus the tensors to launch with."""

    batch: int
    tokens: int
    H: int
    HV: int
    K: int
    V: int
    layout: str
    io_dtype: str
    gate_dtype: str
    dt_bias_dtype: str
    state_dtype: str
    index_dtype: str | None
    separate_write_slots: bool
    cache: bool
    write_final_state: bool
    use_qk_l2norm: bool
    scale: float
    pool: torch.Tensor
    read_slots: torch.Tensor | None
    write_slots: torch.Tensor | None
    cache_buffer: torch.Tensor | None

    @property
    def batch_heads(self) -> int:
        return self.batch * self.HV


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(tensor: torch.Tensor) -> str:
    return "[" + ", ".join(str(d) for d in tensor.shape) + "]"


def _tensor(name: str, value: object, *, optional: bool = False) -> torch.Tensor | None:
    if value is None:
        if optional:
            return None
        raise TypeError(f"{name}: expected a torch.Tensor, got None")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def _dtype(name: str, tensor: torch.Tensor, allowed: dict) -> str:
    if tensor.dtype not in allowed:
        options = ", ".join(_dtype_name(d) for d in allowed)
        raise TypeError(f"{name}: expected dtype {options}; got {_dtype_name(tensor.dtype)}")
    return allowed[tensor.dtype]


def _dims(name: str, tensor: torch.Tensor, expected: tuple, meaning: str) -> None:
    """``expected`` holds ints or None (any size) per dim; ``meaning`` spells the dims."""
    ok = tensor.dim() == len(expected) and all(
        want is None or got == want for got, want in zip(tensor.shape, expected)
    )
    if not ok:
        shown = ", ".join("*" if d is None else str(d) for d in expected)
        raise ValueError(f"{name}: expected shape {meaning} = [{shown}]; got {_shape(tensor)}")


def _inner_contiguous(name: str, tensor: torch.Tensor, inner: int, meaning: str) -> None:
    """The last ``inner`` dims must be dense row-major (outer dims may be strided)."""
    expected = 1
    for dim in range(tensor.dim() - 1, tensor.dim() - 1 - inner, -1):
        if tensor.size(dim) > 1 and tensor.stride(dim) != expected:
            raise ValueError(
                f"{name}: its last {inner} dim(s) {meaning} must be contiguous "
                f"(strides {tuple(tensor.stride())} given); pass .contiguous() or a dense view"
            )
        expected *= tensor.size(dim)


def _contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise ValueError(
            f"{name}: must be contiguous (shape {_shape(tensor)}, strides {tuple(tensor.stride())}); "
            f"it is written in place, so a copy would silently lose the result"
        )


def _aligned(name: str, tensor: torch.Tensor, elems_per_vector: int, outer_dims: int) -> None:
    """Base address 16-byte aligned and every outer stride a whole number of vectors."""
    if tensor.data_ptr() % VECTOR_ALIGN:
        raise ValueError(
            f"{name}: data pointer must be {VECTOR_ALIGN}-byte aligned for vector loads; "
            f"got address {tensor.data_ptr():#x}"
        )
    for dim in range(outer_dims):
        if tensor.stride(dim) % elems_per_vector:
            raise ValueError(
                f"{name}: stride of dim {dim} must be a multiple of {elems_per_vector} elements "
                f"({VECTOR_ALIGN} bytes); got {tensor.stride(dim)}"
            )


def check_call(
    info: TargetInfo,
    *,
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale,
    output,
    use_qk_l2norm,
    initial_state,
    initial_state_indices,
    output_state_indices,
    intermediate_states_buffer,
    disable_state_update,
    state_layout,
) -> Call:
    q = _tensor("q", q)
    k = _tensor("k", k)
    v = _tensor("v", v)
    a = _tensor("a", a)
    b = _tensor("b", b)
    A_log = _tensor("A_log", A_log)
    dt_bias = _tensor("dt_bias", dt_bias)
    state = _tensor("state", state, optional=True)
    initial_state = _tensor("initial_state", initial_state, optional=True)
    read_slots = _tensor("initial_state_indices", initial_state_indices, optional=True)
    write_slots = _tensor("output_state_indices", output_state_indices, optional=True)
    cache_buffer = _tensor("intermediate_states_buffer", intermediate_states_buffer, optional=True)
    output = _tensor("output", output, optional=True)

    for flag_name, flag in (
        ("use_qk_l2norm", use_qk_l2norm),
        ("disable_state_update", disable_state_update),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{flag_name}: expected a bool, got {type(flag).__name__}")
    if state_layout not in LAYOUTS:
        raise ValueError(f"state_layout: expected one of {LAYOUTS}; got {state_layout!r}")

    # -- q, k, v, gates: shapes and dtypes ---------------------------------------------------------
    io_dtype = _dtype("q", q, IO_DTYPES)
    _dims("q", q, (None, None, None, None), "[B, T, H, K]")
    B, T, H, K = q.shape
    if k.dtype != q.dtype:
        raise TypeError(
            f"k: expected dtype {_dtype_name(q.dtype)} (as q); got {_dtype_name(k.dtype)}"
        )
    _dims("k", k, (B, T, H, K), "[B, T, H, K] (as q)")
    if v.dtype != q.dtype:
        raise TypeError(
            f"v: expected dtype {_dtype_name(q.dtype)} (as q); got {_dtype_name(v.dtype)}"
        )
    _dims("v", v, (B, T, None, None), "[B, T, HV, V]")
    HV, V = v.shape[2], v.shape[3]
    if B < 1 or T < 1:
        raise ValueError(f"q: batch and token counts must be >= 1; got shape {_shape(q)}")
    gate_dtype = _dtype("a", a, GATE_DTYPES)
    _dims("a", a, (B, T, HV), "[B, T, HV]")
    if b.dtype != a.dtype:
        raise TypeError(
            f"b: expected dtype {_dtype_name(a.dtype)} (as a); got {_dtype_name(b.dtype)}"
        )
    _dims("b", b, (B, T, HV), "[B, T, HV]")
    if A_log.dtype != torch.float32:
        raise TypeError(f"A_log: expected dtype float32; got {_dtype_name(A_log.dtype)}")
    _dims("A_log", A_log, (HV,), "[HV]")
    dt_bias_dtype = _dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    _dims("dt_bias", dt_bias, (HV,), "[HV]")
    _contiguous("A_log", A_log)
    _contiguous("dt_bias", dt_bias)

    geometry = (H, HV, K, V)
    if not any((g.H, g.HV, g.K, g.V) == geometry for g in info.geometries):
        served = ", ".join(
            f"{g.name} (H={g.H}, HV={g.HV}, K={g.K}, V={g.V})" for g in info.geometries
        )
        raise ValueError(
            f"q/v: geometry H={H}, HV={HV}, K={K}, V={V} was not generated for target "
            f"{info.name}; it serves {served}. Add it to the spec's geometries and re-emit."
        )
    if T > info.max_tokens:
        raise ValueError(
            f"q: T={T} tokens per call; target {info.name} was generated for T <= {info.max_tokens}"
        )

    # q, k, v rows are vector-loaded: inner dims dense, outer strides whole vectors.
    for name, tensor, inner, meaning in (
        ("q", q, 2, "[H, K]"),
        ("k", k, 2, "[H, K]"),
        ("v", v, 2, "[HV, V]"),
    ):
        _inner_contiguous(name, tensor, inner, meaning)
        _aligned(name, tensor, VECTOR_ALIGN // tensor.element_size(), outer_dims=2)
    _inner_contiguous("a", a, 1, "[HV]")
    _inner_contiguous("b", b, 1, "[HV]")

    # -- the state: a dense per-batch state, or a pool with slot indices -------------------------
    if (state is None) == (initial_state is None):
        raise ValueError(
            "state / initial_state: pass exactly one: state=[B, HV, ...] updated in place, or "
            "initial_state=[pool, HV, ...] with initial_state_indices"
            + ("" if state is None else "; both were given")
        )
    pool_name = "state" if state is not None else "initial_state"
    pool = state if state is not None else initial_state
    state_dtype = _dtype(pool_name, pool, STATE_DTYPES)
    head_dims = (V, K) if state_layout == "k_last" else (K, V)
    head_meaning = "[V, K]" if state_layout == "k_last" else "[K, V]"
    _dims(
        pool_name,
        pool,
        (None, HV) + head_dims,
        f"[pool, HV, {head_meaning[1:-1]}] ({state_layout})",
    )
    if (state_layout, state_dtype) not in info.served:
        served = ", ".join(f"{lay}/{dt}" for lay, dt in info.served)
        raise ValueError(
            f"{pool_name}: a {state_layout} {state_dtype} state is not served by target {info.name} "
            f"(it serves {served})"
        )
    _inner_contiguous(pool_name, pool, 3, f"[HV, {head_meaning[1:-1]}]")
    if pool.size(0) > 1 and pool.stride(0) < HV * V * K:
        raise ValueError(
            f"{pool_name}: slots overlap (stride of dim 0 is {pool.stride(0)}, one slot holds "
            f"{HV * V * K} elements)"
        )
    _aligned(pool_name, pool, VECTOR_ALIGN // pool.element_size(), outer_dims=1)
    if pool.size(0) < 1:
        raise ValueError(f"{pool_name}: the pool is empty (shape {_shape(pool)})")

    index_dtype = None
    if read_slots is None:
        if write_slots is not None:
            raise ValueError(
                "output_state_indices: needs initial_state_indices (the read slots) as well"
            )
        if pool.size(0) != B:
            raise ValueError(
                f"{pool_name}: without initial_state_indices the state is per batch row, so its "
                f"dim 0 must be B={B}; got {_shape(pool)}"
            )
    else:
        index_dtype = _dtype("initial_state_indices", read_slots, INDEX_DTYPES)
        if index_dtype not in info.index_dtypes:
            raise TypeError(
                f"initial_state_indices: target {info.name} was generated for "
                f"{'/'.join(info.index_dtypes)} indices; got {index_dtype}"
            )
        _dims("initial_state_indices", read_slots, (B,), "[B]")
        _contiguous("initial_state_indices", read_slots)
        if write_slots is not None:
            if write_slots.dtype != read_slots.dtype:
                raise TypeError(
                    f"output_state_indices: expected dtype {_dtype_name(read_slots.dtype)} "
                    f"(as initial_state_indices); got {_dtype_name(write_slots.dtype)}"
                )
            _dims("output_state_indices", write_slots, (B,), "[B]")
            _contiguous("output_state_indices", write_slots)

    # -- intermediate states and output ----------------------------------------------------------
    if cache_buffer is not None:
        if cache_buffer.dtype != pool.dtype:
            raise TypeError(
                f"intermediate_states_buffer: expected dtype {_dtype_name(pool.dtype)} (as the "
                f"state); got {_dtype_name(cache_buffer.dtype)}"
            )
        _dims(
            "intermediate_states_buffer",
            cache_buffer,
            (B, None, HV) + head_dims,
            f"[B, cache_steps, HV, {head_meaning[1:-1]}]",
        )
        if cache_buffer.size(1) < T:
            raise ValueError(
                f"intermediate_states_buffer: cache_steps (dim 1) must be >= T={T}; "
                f"got {cache_buffer.size(1)}"
            )
        _contiguous("intermediate_states_buffer", cache_buffer)
        _aligned("intermediate_states_buffer", cache_buffer, 1, outer_dims=0)

    if output is not None:
        if output.dtype != q.dtype:
            raise TypeError(
                f"output: expected dtype {_dtype_name(q.dtype)} (as q); got {_dtype_name(output.dtype)}"
            )
        _dims("output", output, (B, T, HV, V), "[B, T, HV, V]")
        _contiguous("output", output)
        _aligned("output", output, 1, outer_dims=0)

    # -- devices -----------------------------------------------------------------------------------
    device = q.device
    if device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor; got a tensor on {device}")
    named = [
        ("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias),
        (pool_name, pool), ("initial_state_indices", read_slots),
        ("output_state_indices", write_slots), ("intermediate_states_buffer", cache_buffer),
        ("output", output),
    ]  # fmt: skip
    for name, tensor in named:
        if tensor is not None and tensor.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (as q); got {tensor.device}")

    # -- scale -------------------------------------------------------------------------------------
    if scale is None:
        scale = K**-0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float or None; got {type(scale).__name__}")
    elif not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number; got {scale}")

    return Call(
        batch=B,
        tokens=T,
        H=H,
        HV=HV,
        K=K,
        V=V,
        layout=state_layout,
        io_dtype=io_dtype,
        gate_dtype=gate_dtype,
        dt_bias_dtype=dt_bias_dtype,
        state_dtype=state_dtype,
        index_dtype=index_dtype,
        separate_write_slots=write_slots is not None,
        cache=cache_buffer is not None,
        write_final_state=not disable_state_update,
        use_qk_l2norm=use_qk_l2norm,
        scale=float(scale),
        pool=pool,
        read_slots=read_slots,
        write_slots=write_slots,
        cache_buffer=cache_buffer,
    )


def check_index_values(call: Call) -> None:
    """Opt-in (check_indices=True): slot values in range and no slot written twice.

    This reads the indices back to the host, so it synchronises; the kernels themselves never
    touch a slot outside the pool whatever the indices hold.
    """
    pool_size = call.pool.size(0)
    pool_name = "the pool"
    for name, slots in (
        ("initial_state_indices", call.read_slots),
        ("output_state_indices", call.write_slots),
    ):
        if slots is None:
            continue
        host = slots.detach().to("cpu", torch.int64)
        bad = (host >= pool_size).nonzero().flatten()
        if bad.numel():
            row = int(bad[0])
            raise ValueError(
                f"{name}: entry {row} is {int(host[row])}, outside {pool_name} of {pool_size} slots "
                f"(valid: 0..{pool_size - 1}, or negative for a padded row)"
            )
    writes = call.write_slots if call.write_slots is not None else call.read_slots
    if writes is not None and call.write_final_state:
        host = writes.detach().to("cpu", torch.int64)
        live = host[host >= 0]
        if live.numel() != live.unique().numel():
            values, counts = live.unique(return_counts=True)
            slot = int(values[counts > 1][0])
            name = (
                "output_state_indices" if call.write_slots is not None else "initial_state_indices"
            )
            raise ValueError(f"{name}: slot {slot} is written by more than one batch row")
