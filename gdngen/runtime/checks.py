"""Checking a call's inputs before anything is launched or written.

Every check raises a TypeError (wrong kind or dtype) or a ValueError (wrong shape, layout,
device, range) whose message names the argument, what was expected and what was given. The
result is a :class:`Call`: the normalised facts the dispatcher and the compile cache need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .arg_checks import (
    VECTOR_ALIGN,
    dtype_name,
    require_aligned,
    require_contiguous,
    require_dims,
    require_dtype,
    require_inner_contiguous,
    require_int,
    require_tensor,
    shape_text,
)
from .conv_checks import ConvPrologue, check_conv
from .info import TargetInfo
from .norm_checks import GatedNorm, check_gated_norm

IO_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
GATE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DT_BIAS_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
STATE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
INDEX_DTYPES = {torch.int32: "int32", torch.int64: "int64"}
LAYOUTS = ("k_last", "v_last")


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
    #: engine forms (docs/design.md, "Call forms"); ``batch`` counts sequences when packed
    null_slot: int = -1
    cu_seqlens: torch.Tensor | None = None
    cu_seqlens_dtype: str | None = None
    per_token_slots: bool = False
    num_accepted: torch.Tensor | None = None
    cache_rows: torch.Tensor | None = None
    total_tokens: int | None = None
    #: the caller's promise that sequence n starts at n * T (``uniform_seqlen``)
    uniform_seqlen: bool = False
    #: the gated RMSNorm epilogue (gdngen.runtime.norm_checks); None without it
    norm: GatedNorm | None = None
    #: the conv1d prologue (gdngen.runtime.conv_checks); None without it
    conv: ConvPrologue | None = None

    @property
    def norm_activation(self) -> str | None:
        return None if self.norm is None else self.norm.activation

    @property
    def norm_weight_dtype(self) -> str | None:
        return None if self.norm is None else self.norm.weight_dtype

    @property
    def fused(self) -> bool:
        """The call fuses part of the decode core around the recurrence (the gated RMSNorm, the
        conv1d, or both): the dispatch's ``gated_norm: true`` rules serve it, whose variants have
        the stepwise solve both need (docs/design.md, "The fused decode core")."""
        return self.norm is not None or self.conv is not None

    @property
    def batch_heads(self) -> int:
        return self.batch * self.HV

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def uniform_rows(self) -> bool:
        """A packed call whose caller promised ``uniform_seqlen``: sequence n's tokens are placed
        at n * T without waiting for cu_seqlens, which the kernel reads beside them to check the
        promise (a row it breaks owns no slot). Never inferred from shapes: a token buffer of
        N * T tokens can hold shorter sequences and unused tokens after cu_seqlens[-1]."""
        return self.packed and self.uniform_seqlen

    @property
    def exact_slot_table(self) -> bool:
        """A per-token slot table of exactly T columns (vLLM's [N, 1 + S] at T = 1 + S): the
        kernel loads every column beside num_accepted_tokens instead of after it."""
        return self.per_token_slots and self.read_slots.shape[1] == self.tokens

    @property
    def stores_token_states(self) -> bool:
        """The call stores the state after every token (cache buffer or per-token slots): the
        dispatch's ``intermediate: yes``."""
        return self.cache or self.per_token_slots


def _index_vector(name: str, tensor: torch.Tensor, dtype: torch.dtype, rows: int, meaning: str):
    """A [rows] index tensor in the slots' dtype, dense."""
    if tensor.dtype != dtype:
        raise TypeError(
            f"{name}: expected dtype {dtype_name(dtype)} (as initial_state_indices); "
            f"got {dtype_name(tensor.dtype)}"
        )
    require_dims(name, tensor, (rows,), meaning)
    require_contiguous(name, tensor)


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
    null_slot=-1,
    cu_seqlens=None,
    max_seqlen=None,
    uniform_seqlen=False,
    num_accepted_tokens=None,
    intermediate_state_indices=None,
    z=None,
    norm_weight=None,
    norm_eps=1e-6,
    norm_activation="silu",
    conv_state=None,
    conv_weight=None,
    conv_bias=None,
    conv_activation="silu",
    intermediate_conv_windows=None,
) -> Call:
    """Check a call whose q, k, v, a, b, output are already in the kernel's 4-D (3-D for a, b)
    form (gdngen.runtime.views lifts the packed and mixed_qkv forms first)."""
    q = require_tensor("q", q)
    k = require_tensor("k", k)
    v = require_tensor("v", v)
    a = require_tensor("a", a)
    b = require_tensor("b", b)
    A_log = require_tensor("A_log", A_log)
    dt_bias = require_tensor("dt_bias", dt_bias)
    state = require_tensor("state", state, optional=True)
    initial_state = require_tensor("initial_state", initial_state, optional=True)
    read_slots = require_tensor("initial_state_indices", initial_state_indices, optional=True)
    write_slots = require_tensor("output_state_indices", output_state_indices, optional=True)
    cache_buffer = require_tensor(
        "intermediate_states_buffer", intermediate_states_buffer, optional=True
    )
    output = require_tensor("output", output, optional=True)
    cu_seqlens = require_tensor("cu_seqlens", cu_seqlens, optional=True)
    num_accepted = require_tensor("num_accepted_tokens", num_accepted_tokens, optional=True)
    cache_rows = require_tensor(
        "intermediate_state_indices", intermediate_state_indices, optional=True
    )

    for flag_name, flag in (
        ("use_qk_l2norm", use_qk_l2norm),
        ("disable_state_update", disable_state_update),
        ("uniform_seqlen", uniform_seqlen),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{flag_name}: expected a bool, got {type(flag).__name__}")
    if state_layout not in LAYOUTS:
        raise ValueError(f"state_layout: expected one of {LAYOUTS}; got {state_layout!r}")
    null_slot = require_int(
        "null_slot", null_slot, -1, None, "slots <= null_slot are padding; -1 or more"
    )

    # -- q, k, v, gates: shapes and dtypes ---------------------------------------------------------
    # Dense: [B, T, ...], kernel row n is batch row n. Packed: [1, total_tokens, ...] with
    # cu_seqlens [N + 1]; kernel row n is the n-th sequence, of at most T = max_seqlen tokens.
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
    token_dims = (1, total_tokens) if packed else (rows, q.shape[1])
    if k.dtype != q.dtype:
        raise TypeError(
            f"k: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(k.dtype)}"
        )
    require_dims("k", k, token_dims + (H, K), f"[{lead}, H, K] (as q)")
    if v.dtype != q.dtype:
        raise TypeError(
            f"v: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(v.dtype)}"
        )
    require_dims("v", v, token_dims + (None, None), f"[{lead}, HV, V]")
    HV, V = v.shape[2], v.shape[3]
    if q.shape[0] < 1 or q.shape[1] < 1:
        raise ValueError(f"q: batch and token counts must be >= 1; got shape {shape_text(q)}")
    gate_dtype = require_dtype("a", a, GATE_DTYPES)
    require_dims("a", a, token_dims + (HV,), f"[{lead}, HV]")
    if b.dtype != a.dtype:
        raise TypeError(
            f"b: expected dtype {dtype_name(a.dtype)} (as a); got {dtype_name(b.dtype)}"
        )
    require_dims("b", b, token_dims + (HV,), f"[{lead}, HV]")
    if A_log.dtype != torch.float32:
        raise TypeError(f"A_log: expected dtype float32; got {dtype_name(A_log.dtype)}")
    require_dims("A_log", A_log, (HV,), "[HV]")
    dt_bias_dtype = require_dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    require_dims("dt_bias", dt_bias, (HV,), "[HV]")
    require_contiguous("A_log", A_log)
    require_contiguous("dt_bias", dt_bias)

    if not info.serves_geometry(H, HV, K, V):
        served = info.served_geometries()
        line = f"`- {{name: <model>, H: {H}, HV: {HV}, K: {K}, V: {V}}}` under `geometries:`"
        message = (
            f"q/v: geometry H={H}, HV={HV}, K={K}, V={V} was not generated for target "
            f"{info.name}; it serves {served}. {info.add_to_spec(line)}"
        )
        head_dims = sorted({(g.K, g.V) for g in info.geometries})
        if (K, V) not in head_dims:
            dims = ", ".join(f"K={k}, V={v}" for k, v in head_dims)
            message += (
                f" Its kernels are built for {dims}: head dims K={K}, V={V} also need, for each "
                f"layout and state dtype, a variant built for them (K = k_splits * "
                f"threads_per_group * vec, V a multiple of tile_v) and dispatch rules with "
                f'`head_dims: [{K}, {V}]` (docs/design.md, "Head dims").'
            )
        raise ValueError(message)
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
        require_inner_contiguous(name, tensor, inner, meaning)
        require_aligned(name, tensor, VECTOR_ALIGN // tensor.element_size(), outer_dims=2)
    require_inner_contiguous("a", a, 1, "[HV]")
    require_inner_contiguous("b", b, 1, "[HV]")

    # -- the state: a dense per-row state, or a pool with slot indices ---------------------------
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
    head_meaning = "[V, K]" if state_layout == "k_last" else "[K, V]"
    require_dims(
        pool_name,
        pool,
        (None, HV) + head_dims,
        f"[pool, HV, {head_meaning[1:-1]}] ({state_layout})",
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
    require_inner_contiguous(pool_name, pool, 3, f"[HV, {head_meaning[1:-1]}]")
    if pool.size(0) > 1 and pool.stride(0) < HV * V * K:
        raise ValueError(
            f"{pool_name}: slots overlap (stride of dim 0 is {pool.stride(0)}, one slot holds "
            f"{HV * V * K} elements)"
        )
    require_aligned(pool_name, pool, VECTOR_ALIGN // pool.element_size(), outer_dims=1)
    if pool.size(0) < 1:
        raise ValueError(f"{pool_name}: the pool is empty (shape {shape_text(pool)})")

    rows_meaning = "[N] (one per sequence)" if packed else "[B]"
    index_dtype = None
    per_token_slots = False
    if read_slots is None:
        for name, given in (
            ("output_state_indices", write_slots),
            ("num_accepted_tokens", num_accepted),
            ("intermediate_state_indices", cache_rows),
        ):
            if given is not None:
                raise ValueError(f"{name}: needs initial_state_indices (the read slots) as well")
        if pool.size(0) != rows:
            what = "sequence" if packed else "batch row"
            raise ValueError(
                f"{pool_name}: without initial_state_indices the state is per {what}, so its "
                f"dim 0 must be {'N' if packed else 'B'}={rows}; got {shape_text(pool)}"
            )
        null_slot = -1  # a dense state has no padding rows
    else:
        index_dtype = require_dtype("initial_state_indices", read_slots, INDEX_DTYPES)
        if index_dtype not in info.index_dtypes:
            raise TypeError(
                f"initial_state_indices: target {info.name} was generated for "
                f"{'/'.join(info.index_dtypes)} indices; got {index_dtype}"
            )
        per_token_slots = read_slots.dim() == 2
        if per_token_slots:
            # A per-token table [N, 1 + S]: column t receives the state after token t.
            require_dims(
                "initial_state_indices", read_slots, (rows, None), "[N, 1 + S] (per-token slots)"
            )
            columns = read_slots.size(1)
            if columns < T:
                raise ValueError(
                    f"initial_state_indices: a per-token table needs a column per token, 1 + S >= "
                    f"T={T}; got {shape_text(read_slots)} (plain multi-token decode passes [N] indices)"
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
                _index_vector(
                    "num_accepted_tokens", num_accepted, read_slots.dtype, rows, rows_meaning
                )
        else:
            require_dims("initial_state_indices", read_slots, (rows,), rows_meaning)
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
                require_dims("output_state_indices", write_slots, (rows,), rows_meaning)
                require_contiguous("output_state_indices", write_slots)

    # -- intermediate states and output ----------------------------------------------------------
    if cache_rows is not None and cache_buffer is None:
        raise ValueError(
            "intermediate_state_indices: names rows of intermediate_states_buffer, which is missing"
        )
    if cache_buffer is not None:
        if cache_buffer.dtype != pool.dtype:
            raise TypeError(
                f"intermediate_states_buffer: expected dtype {dtype_name(pool.dtype)} (as the "
                f"state); got {dtype_name(cache_buffer.dtype)}"
            )
        if cache_rows is not None:
            _index_vector(
                "intermediate_state_indices", cache_rows, read_slots.dtype, rows, rows_meaning
            )
        require_dims(
            "intermediate_states_buffer",
            cache_buffer,
            (None if cache_rows is not None else rows, None, HV) + head_dims,
            f"[{'R' if cache_rows is not None else 'N' if packed else 'B'}, cache_steps, HV, "
            f"{head_meaning[1:-1]}]",
        )
        if cache_buffer.size(1) < T:
            raise ValueError(
                f"intermediate_states_buffer: cache_steps (dim 1) must be >= T={T}; "
                f"got {cache_buffer.size(1)}"
            )
        require_contiguous("intermediate_states_buffer", cache_buffer)
        require_aligned("intermediate_states_buffer", cache_buffer, 1, outer_dims=0)

    if output is not None:
        if output.dtype != q.dtype:
            raise TypeError(
                f"output: expected dtype {dtype_name(q.dtype)} (as q); got {dtype_name(output.dtype)}"
            )
        require_dims("output", output, token_dims + (HV, V), f"[{lead}, HV, V]")
        require_contiguous("output", output)
        require_aligned("output", output, 1, outer_dims=0)

    norm = check_gated_norm(
        info, z=z, norm_weight=norm_weight, norm_eps=norm_eps, norm_activation=norm_activation,
        q=q, token_dims=token_dims, lead=lead, HV=HV, V=V,
    )  # fmt: skip
    conv = check_conv(
        info, conv_state=conv_state, conv_weight=conv_weight, conv_bias=conv_bias,
        conv_activation=conv_activation, q=q, pool=pool, pool_name=pool_name, H=H, K=K, HV=HV,
        V=V, per_token_tokens=max(T, read_slots.size(1)) if per_token_slots else None,
        conv_windows=intermediate_conv_windows, cache_buffer=cache_buffer,
    )  # fmt: skip

    # -- devices -----------------------------------------------------------------------------------
    device = q.device
    if device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor; got a tensor on {device}")
    named = [
        ("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias),
        (pool_name, pool), ("initial_state_indices", read_slots),
        ("output_state_indices", write_slots), ("intermediate_states_buffer", cache_buffer),
        ("output", output), ("cu_seqlens", cu_seqlens), ("num_accepted_tokens", num_accepted),
        ("intermediate_state_indices", cache_rows),
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
        batch=rows,
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
        write_final_state=not disable_state_update and not per_token_slots,
        use_qk_l2norm=use_qk_l2norm,
        scale=float(scale),
        pool=pool,
        read_slots=read_slots,
        write_slots=write_slots,
        cache_buffer=cache_buffer,
        null_slot=null_slot,
        cu_seqlens=cu_seqlens,
        cu_seqlens_dtype=cu_seqlens_dtype,
        per_token_slots=per_token_slots,
        num_accepted=num_accepted,
        cache_rows=cache_rows,
        total_tokens=total_tokens,
        uniform_seqlen=uniform_seqlen,
        norm=norm,
        conv=conv,
    )


def check_index_values(call: Call) -> None:
    """Opt-in (check_indices=True): every index value the kernels would act on, checked.

    Slots in range (``<= null_slot`` is padding), no slot written by two rows, ``cu_seqlens``
    ascending within the packed tokens with no sequence longer than T (and, with
    ``uniform_seqlen``, every non-empty sequence n of T tokens at n * T),
    ``num_accepted_tokens`` in
    ``[1, 1 + S]``, cache rows inside the buffer. This reads the indices back to the host, so it
    synchronises; the kernels themselves never touch a slot outside the pool whatever the
    indices hold (a bad index shows as NaN output instead).
    """

    def host(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", torch.int64)

    def first_bad(name: str, values: torch.Tensor, bad: torch.Tensor, expected: str, skip=0):
        """``skip``: how many leading entries of the argument ``values`` leaves out."""
        where = bad.nonzero()
        if where.numel():
            at = tuple(int(i) for i in where[0])
            entry = at[0] + skip if len(at) == 1 else list(at)
            raise ValueError(f"{name}: entry {entry} is {int(values[at])}; expected {expected}")

    pool_size = call.pool.size(0)
    null = call.null_slot
    slot_range = f"a slot 0..{pool_size - 1} of the pool, or <= {null} for padding"
    lengths = None
    if call.cu_seqlens is not None:
        cu = host(call.cu_seqlens)
        first_bad("cu_seqlens", cu, cu < 0, f"offsets within the {call.total_tokens} packed tokens")
        first_bad(
            "cu_seqlens",
            cu,
            cu > call.total_tokens,
            f"offsets within the {call.total_tokens} packed tokens",
        )
        lengths = cu[1:] - cu[:-1]
        first_bad("cu_seqlens", cu[1:], lengths < 0, "ascending offsets", skip=1)
        first_bad(
            "cu_seqlens", cu[1:], lengths > call.tokens,
            f"sequences of at most max_seqlen={call.tokens} tokens", skip=1,
        )  # fmt: skip
        if call.uniform_seqlen:
            starts = torch.arange(call.batch) * call.tokens
            first_bad(
                "cu_seqlens", cu[:-1], (lengths > 0) & (cu[:-1] != starts),
                f"sequence n at n * max_seqlen (uniform_seqlen=True, max_seqlen={call.tokens}); "
                "an empty sequence may start anywhere",
            )  # fmt: skip
            first_bad(
                "cu_seqlens", cu[1:], (lengths > 0) & (lengths != call.tokens),
                f"sequences of max_seqlen={call.tokens} tokens or none (uniform_seqlen=True)",
                skip=1,
            )  # fmt: skip
    live_tokens = torch.full((call.batch,), call.tokens) if lengths is None else lengths

    writes: list[torch.Tensor] = []  # per row, the slots it writes (padding left out)
    owned = torch.ones(call.batch, dtype=torch.bool)  # rows whose read slot is not padding
    if call.read_slots is not None:
        table = host(call.read_slots)
        first_bad("initial_state_indices", table, (table >= pool_size) & (table > null), slot_range)
        if call.per_token_slots:
            columns = table.size(1)
            read_column = torch.zeros(call.batch, dtype=torch.int64)
            if call.num_accepted is not None:
                accepted = host(call.num_accepted)
                first_bad(
                    "num_accepted_tokens", accepted, (accepted < 1) | (accepted > columns),
                    f"1..{columns} (the columns of initial_state_indices)",
                )  # fmt: skip
                read_column = accepted - 1
            owned = table.gather(1, read_column[:, None])[:, 0] > null
            for n in range(call.batch):
                written = table[n, : int(live_tokens[n])]
                # A row may name one slot for several tokens: the last token's state stays.
                writes.append(written[written > null].unique() if owned[n] else written[:0])
        else:
            if call.write_slots is not None:
                out = host(call.write_slots)
                first_bad(
                    "output_state_indices", out, (out >= pool_size) & (out > null), slot_range
                )
            else:
                out = table
            owned = (table > null) & (out > null)
            if call.write_final_state:
                writes.append(out[owned])
    seen = torch.cat(writes) if writes else torch.empty(0, dtype=torch.int64)
    if seen.numel() != seen.unique().numel():
        values, counts = seen.unique(return_counts=True)
        slot = int(values[counts > 1][0])
        name = "output_state_indices" if call.write_slots is not None else "initial_state_indices"
        raise ValueError(f"{name}: slot {slot} is written by more than one batch row")
    if call.cache_rows is not None:
        cache = host(call.cache_rows)
        limit = call.cache_buffer.size(0)
        first_bad(
            "intermediate_state_indices", cache, (cache >= limit) & (cache > null),
            f"a row 0..{limit - 1} of intermediate_states_buffer, or <= {null} for padding",
        )  # fmt: skip
        live = cache[(cache > null) & owned]
        if live.numel() != live.unique().numel():
            values, counts = live.unique(return_counts=True)
            raise ValueError(
                f"intermediate_state_indices: row {int(values[counts > 1][0])} of "
                f"intermediate_states_buffer is written by more than one batch row"
            )
