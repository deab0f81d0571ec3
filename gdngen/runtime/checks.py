"""Checking a call's inputs before anything is launched or written.

Every check raises a TypeError (wrong kind or dtype) or a ValueError (wrong shape, layout,
device, range) whose message names the argument, what was expected and what was given. The
result is a :class:`Call`: the normalised facts the dispatcher and the compile cache need.
:func:`check_call` composes the checks of each concern: the decode core's tensors, options,
geometry, output, devices and scale (core_checks), the call forms' tokens and slot table
(form_checks), the state, its slots and the verify cache (pool_checks), the gated RMSNorm
(norm_checks) and the conv1d prologue (conv_checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .arg_checks import require_tensor
from .conv_checks import ConvPrologue, check_conv
from .core_checks import (
    check_backend,
    check_core_layout,
    check_core_tensors,
    check_devices,
    check_enable_pdl,
    check_geometry,
    check_options,
    check_output,
    check_scale,
    token_dims,
)
from .form_checks import check_token_scatter, check_tokens
from .info import TargetInfo
from .norm_checks import GatedNorm, check_gated_norm
from .pool_checks import (
    check_cache,
    check_cache_scales,
    check_per_row_state,
    check_pool,
    check_slots,
    check_state_scales,
)
from .recovery_checks import check_recovery


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
    #: the pool's head and row strides are run-time values (a strided view; pool_checks)
    strided_state: bool = False
    #: programmatic dependent launch as the caller asks (``enable_pdl``; docs/design.md); None:
    #: as the dispatch rule says
    pdl: bool | None = None
    #: state recovery (gdngen.runtime.recovery_checks): each row's last accepted token [N], its
    #: dtype, and the leading tokens every row replays without output
    accepted_steps: torch.Tensor | None = None
    accepted_steps_dtype: str | None = None
    recovery_steps: int = 0

    @property
    def recovers(self) -> bool:
        """Rows replay their leading tokens into the state without output and store the state
        after them; the rest are decoded from it, and no final state is stored."""
        return self.write_final_state and (
            self.accepted_steps is not None or self.recovery_steps > 0
        )

    @property
    def truncates(self) -> bool:
        """Rows run only their tokens 0..accepted_steps[n] (no state update of their own, or
        per-token slots)."""
        return self.accepted_steps is not None and not self.recovers

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
    def token_scatter(self) -> bool:
        """FlashInfer's per-token scatter: [N] read slots, and ``ssm_state_indices [N, T]``
        (held as the write slots) naming the slot of the state after each token."""
        return self.per_token_slots and self.separate_write_slots

    @property
    def token_slot_table(self) -> torch.Tensor | None:
        """The table naming the slot of the state after each token (column t for token t):
        vLLM's [N, 1 + S] read table, or FlashInfer's ssm_state_indices [N, T]."""
        if not self.per_token_slots:
            return None
        return self.write_slots if self.token_scatter else self.read_slots

    @property
    def exact_slot_table(self) -> bool:
        """A per-token slot table of exactly T columns (vLLM's [N, 1 + S] at T = 1 + S, and
        FlashInfer's [N, T] always): the kernel loads every column up front (beside
        num_accepted_tokens, for vLLM's) instead of one per token."""
        return self.per_token_slots and self.token_slot_table.shape[1] == self.tokens

    @property
    def stores_token_states(self) -> bool:
        """The call stores the state after every token (cache buffer or per-token slots): the
        dispatch's ``intermediate: yes``."""
        return self.cache or self.per_token_slots


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
    backend="auto",
    state_layout="k_last",
    null_slot=-1,
    cu_seqlens=None,
    max_seqlen=None,
    uniform_seqlen=False,
    num_accepted_tokens=None,
    intermediate_state_indices=None,
    ssm_state_indices=None,
    accepted_steps=None,
    recovery_steps=0,
    z=None,
    norm_weight=None,
    norm_eps=1e-6,
    norm_activation="silu",
    conv_state=None,
    conv_weight=None,
    conv_bias=None,
    conv_activation="silu",
    intermediate_conv_windows=None,
    enable_pdl=None,
    state_scales=None,
    intermediate_states_scales=None,
) -> Call:
    """Check a call whose q, k, v, a, b, output are already in the kernel's 4-D (3-D for a, b)
    form (gdngen.runtime.views lifts the packed and mixed_qkv forms first). The checks run in
    this order, so that a call with several faults hears of the same one first every time."""
    q, k, v, a, b, A_log, dt_bias = (
        require_tensor(name, value)
        for name, value in (
            ("q", q), ("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log),
            ("dt_bias", dt_bias),
        )
    )  # fmt: skip
    state, initial_state, read_slots, write_slots, cache_buffer, output = (
        require_tensor(name, value, optional=True)
        for name, value in (
            ("state", state), ("initial_state", initial_state),
            ("initial_state_indices", initial_state_indices),
            ("output_state_indices", output_state_indices),
            ("intermediate_states_buffer", intermediate_states_buffer), ("output", output),
        )
    )  # fmt: skip
    cu_seqlens, num_accepted, cache_rows, token_scatter, accepted_steps = (
        require_tensor(name, value, optional=True)
        for name, value in (
            ("cu_seqlens", cu_seqlens), ("num_accepted_tokens", num_accepted_tokens),
            ("intermediate_state_indices", intermediate_state_indices),
            ("ssm_state_indices", ssm_state_indices), ("accepted_steps", accepted_steps),
        )
    )  # fmt: skip
    null_slot = check_options(
        use_qk_l2norm, disable_state_update, uniform_seqlen, state_layout, null_slot
    )
    check_backend(backend)
    tokens = check_tokens(info, q, cu_seqlens, max_seqlen, uniform_seqlen)
    gate_dtype, dt_bias_dtype = check_core_tensors(tokens, q, k, v, a, b, A_log, dt_bias)
    HV, V = v.shape[2], v.shape[3]
    check_geometry(info, tokens, HV, V)
    check_core_layout(q, k, v, a, b)
    pool = check_pool(info, state, initial_state, state_layout, HV, tokens.K, V)
    check_state_scales(pool, state_scales, intermediate_states_scales)
    if token_scatter is not None:
        check_token_scatter(
            tokens, token_scatter, read_slots, write_slots, num_accepted, cache_buffer,
            disable_state_update, conv_state,
        )  # fmt: skip
    recovery = check_recovery(
        tokens, accepted_steps, recovery_steps, read_slots=read_slots,
        disable_state_update=disable_state_update, token_scatter=token_scatter,
        cache_buffer=cache_buffer, num_accepted=num_accepted, z=z, conv_state=conv_state,
    )  # fmt: skip
    per_token_slots = token_scatter is not None or (
        read_slots is not None and read_slots.dim() == 2
    )
    if read_slots is None:
        check_per_row_state(tokens, pool, write_slots, num_accepted, cache_rows)
        index_dtype, null_slot = None, -1  # a dense state has no padding rows
    else:
        index_dtype = check_slots(
            info, tokens, read_slots, write_slots, num_accepted, disable_state_update
        )
    check_cache(tokens, pool, cache_buffer, cache_rows, read_slots)
    check_cache_scales(pool, cache_buffer, intermediate_states_scales)
    check_output(tokens, q, output, HV, V)
    norm = check_gated_norm(
        info, z=z, norm_weight=norm_weight, norm_eps=norm_eps, norm_activation=norm_activation,
        q=q, token_dims=token_dims(tokens, q), lead=tokens.lead, HV=HV, V=V,
    )  # fmt: skip
    conv = check_conv(
        info, conv_state=conv_state, conv_weight=conv_weight, conv_bias=conv_bias,
        conv_activation=conv_activation, q=q, pool=pool.tensor, pool_name=pool.name, H=tokens.H,
        K=tokens.K, HV=HV, V=V,
        per_token_tokens=(
            max(tokens.T, read_slots.size(1))
            if per_token_slots and token_scatter is None
            else None
        ),
        conv_windows=intermediate_conv_windows, cache_buffer=cache_buffer,
    )  # fmt: skip
    check_devices(q, [
        ("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias),
        (pool.name, pool.tensor), ("initial_state_indices", read_slots),
        ("output_state_indices", write_slots), ("intermediate_states_buffer", cache_buffer),
        ("output", output), ("cu_seqlens", cu_seqlens), ("num_accepted_tokens", num_accepted),
        ("intermediate_state_indices", cache_rows), ("ssm_state_indices", token_scatter),
        ("accepted_steps", accepted_steps), ("state_scales", state_scales),
        ("intermediate_states_scales", intermediate_states_scales),
    ])  # fmt: skip
    return Call(
        batch=tokens.rows,
        tokens=tokens.T,
        H=tokens.H,
        HV=HV,
        K=tokens.K,
        V=V,
        layout=state_layout,
        io_dtype=tokens.io_dtype,
        gate_dtype=gate_dtype,
        dt_bias_dtype=dt_bias_dtype,
        state_dtype=pool.dtype,
        index_dtype=index_dtype,
        separate_write_slots=write_slots is not None or token_scatter is not None,
        cache=cache_buffer is not None,
        write_final_state=not disable_state_update and not per_token_slots,
        use_qk_l2norm=use_qk_l2norm,
        scale=check_scale(scale, tokens.K),
        pool=pool.tensor,
        read_slots=read_slots,
        write_slots=write_slots if token_scatter is None else token_scatter,
        cache_buffer=cache_buffer,
        null_slot=null_slot,
        cu_seqlens=cu_seqlens,
        cu_seqlens_dtype=tokens.cu_seqlens_dtype,
        per_token_slots=per_token_slots,
        num_accepted=num_accepted,
        cache_rows=cache_rows,
        total_tokens=tokens.total_tokens,
        uniform_seqlen=uniform_seqlen,
        norm=norm,
        conv=conv,
        pdl=check_enable_pdl(enable_pdl),
        strided_state=pool.strided,
        accepted_steps=accepted_steps,
        accepted_steps_dtype=recovery.accepted_steps_dtype,
        recovery_steps=recovery.recovery_steps,
    )


def check_index_values(call: Call) -> None:
    """Opt-in (check_indices=True): every index value the kernels would act on, checked.

    Slots in range (``<= null_slot`` is padding), no slot written by two rows, ``cu_seqlens``
    ascending within the packed tokens with no sequence longer than T (and, with
    ``uniform_seqlen``, every non-empty sequence n of T tokens at n * T),
    ``num_accepted_tokens`` in ``[1, 1 + S]``, ``accepted_steps`` in ``[0, T - 1]``, cache
    rows inside the buffer. This reads the indices back to the host, so it
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
    if call.accepted_steps is not None:
        last = host(call.accepted_steps)
        first_bad(
            "accepted_steps", last, (last < 0) | (last >= call.tokens),
            f"0..{call.tokens - 1} (the row's last accepted token, below T={call.tokens})",
        )  # fmt: skip
        if call.truncates:
            live_tokens = last + 1

    writes: list[torch.Tensor] = []  # per row, the slots it writes (padding left out)
    owned = torch.ones(call.batch, dtype=torch.bool)  # rows whose read slot is not padding
    if call.read_slots is not None:
        table = host(call.read_slots)
        first_bad("initial_state_indices", table, (table >= pool_size) & (table > null), slot_range)
        if call.token_scatter:
            scatter = host(call.write_slots)
            first_bad(
                "ssm_state_indices", scatter, (scatter >= pool_size) & (scatter > null), slot_range
            )
            owned = table > null
            for n in range(call.batch):
                written = scatter[n, : int(live_tokens[n])]
                # A row may name one slot for several tokens: the last token's state stays.
                writes.append(written[written > null].unique() if owned[n] else written[:0])
        elif call.per_token_slots:
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
            # A write slot that is padding stores no final state; the row is still computed.
            owned = table > null
            if call.write_final_state:
                writes.append(out[owned & (out > null)])
    seen = torch.cat(writes) if writes else torch.empty(0, dtype=torch.int64)
    if seen.numel() != seen.unique().numel():
        values, counts = seen.unique(return_counts=True)
        slot = int(values[counts > 1][0])
        name = (
            "ssm_state_indices"
            if call.token_scatter
            else "output_state_indices" if call.write_slots is not None else "initial_state_indices"
        )
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
