"""The recurrence: GDN decode in float64, in the kernel's call forms.

It follows docs/design.md ("The math") literally (decay first, then the delta update, then the
output from the updated state) and the precision contract: the state stays in float64 across all T
tokens of a call and is rounded to the state dtype only where it is stored (each cached
intermediate state, and the final state). It runs on whatever device its inputs are on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .state_formats import store

SOFTPLUS_THRESHOLD = 20.0
#: a quantized pool's torch dtype -> its format in gdngen.reference.state_formats
SCALED_FORMATS = {torch.int8: "int8_row", torch.float8_e4m3fn: "fp8_e4m3_row"}
L2NORM_EPS = 1e-6


@dataclass
class ReferenceResult:
    output: torch.Tensor  # [B, T, HV, V], float64
    pool: torch.Tensor  # the pool after the call, in the state dtype (a new tensor)
    final_state: torch.Tensor  # [B, HV, V, K] float64 state after the last token (K-last)
    intermediates: torch.Tensor  # [B, T, HV, V, K] float64 state after each token (K-last)
    live: torch.Tensor  # [B] bool: rows that are not padded


def softplus(x: torch.Tensor) -> torch.Tensor:
    """softplus with beta 1 and threshold 20, as a branch (never mask * log1p(exp(x)))."""
    return torch.where(
        x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD)))
    )


def gates(A_log, a, dt_bias, b) -> tuple[torch.Tensor, torch.Tensor]:
    """g = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), in float64."""
    x = a.double() + dt_bias.double()
    g = torch.exp(-torch.exp(A_log.double()) * softplus(x))
    beta = torch.sigmoid(b.double())
    return g, beta


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def recurrence(h, q, k, v, g, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """The token loop of docs/design.md ("The math") for R rows, in float64.

    ``h`` [R, HV, V, K] (K-last); ``q``, ``k`` [R, T, HV, K] (already normalised and scaled);
    ``v`` [R, T, HV, V]; ``g``, ``beta`` [R, T, HV]. Returns the outputs [R, T, HV, V] and the state
    after each token [R, T, HV, V, K]."""
    outputs = []
    states = []
    for t in range(q.shape[1]):
        h = g[:, t, :, None, None] * h  # decay first
        hk = torch.einsum("bhvk,bhk->bhv", h, k[:, t])
        u = beta[:, t, :, None] * (v[:, t].double() - hk)
        h = h + u[..., None] * k[:, t, :, None, :]
        outputs.append(torch.einsum("bhvk,bhk->bhv", h, q[:, t]))
        states.append(h)
    return torch.stack(outputs, dim=1), torch.stack(states, dim=1)


def _heads(q, k, HV: int, scale: float, use_qk_l2norm: bool):
    """q and k per value head, in float64, normalised (if asked) and q scaled."""
    group = HV // q.shape[2]
    qh = q.double().repeat_interleave(group, dim=2)
    kh = k.double().repeat_interleave(group, dim=2)
    if use_qk_l2norm:
        qh, kh = l2_normalize(qh), l2_normalize(kh)
    return qh * scale, kh


def reference_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pool: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    read_slots: torch.Tensor | None = None,
    write_slots: torch.Tensor | None = None,
    disable_state_update: bool = False,
    state_layout: str = "k_last",
) -> ReferenceResult:
    """One call of GDN decode on T tokens.

    ``pool`` is [P, HV, V, K] (k_last) or [P, HV, K, V] (v_last); without ``read_slots`` batch row
    n uses slot n. A row whose read slot is negative is padded: output zeros, nothing read or
    written. A row whose write slot alone is negative (FlashInfer's meaning) is computed as any
    other and stores no final state.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    device = q.device
    if scale is None:
        scale = K**-0.5
    rows = torch.arange(B, device=device)
    reads = rows if read_slots is None else read_slots.long()
    writes = reads if write_slots is None else write_slots.long()
    live = reads >= 0

    h = pool[reads.clamp(min=0)].double()  # [B, HV, ...]
    if state_layout == "v_last":
        h = h.transpose(-1, -2)  # -> [B, HV, V, K]
    h = torch.where(live[:, None, None, None], h, torch.zeros_like(h))

    qh, kh = _heads(q, k, HV, scale, use_qk_l2norm)
    g, beta = gates(A_log, a, dt_bias, b)  # [B, T, HV]
    output, intermediates = recurrence(h, qh, kh, v, g, beta)
    h = intermediates[:, -1]
    output = torch.where(live[:, None, None, None], output, torch.zeros_like(output))

    new_pool = pool.clone()
    if not disable_state_update:
        stored = (h if state_layout == "k_last" else h.transpose(-1, -2)).to(pool.dtype)
        writing = live & (writes >= 0)
        new_pool[writes[writing]] = stored[writing]
    return ReferenceResult(
        output=output,
        pool=new_pool,
        final_state=h,
        intermediates=intermediates,
        live=live,
    )


@dataclass
class ExpectedCall:
    """What one call of any form must leave behind (every tensor a new one)."""

    output: torch.Tensor  # the kernel-form output, float64; NaN where the call writes nothing
    pool: torch.Tensor  # the whole pool after the call, in the state dtype
    cache: torch.Tensor | None  # the whole intermediate-state buffer after the call, or None
    #: an int8 pool's scales after the call ([slots, HV, V] fp32), or None
    scales: torch.Tensor | None = None
    #: and its verify cache's ([R, cache_steps, HV, V] fp32), or None
    cache_scales: torch.Tensor | None = None


def reference_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pool: torch.Tensor,
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    read_slots: torch.Tensor | None = None,
    write_slots: torch.Tensor | None = None,
    disable_state_update: bool = False,
    state_layout: str = "k_last",
    null_slot: int = -1,
    cu_seqlens: torch.Tensor | None = None,
    num_accepted: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    cache_rows: torch.Tensor | None = None,
    token_slots: torch.Tensor | None = None,
    accepted_steps: torch.Tensor | None = None,
    recovery_steps: int = 0,
    state_scales: torch.Tensor | None = None,
    cache_scales: torch.Tensor | None = None,
) -> ExpectedCall:
    """Every call form of docs/design.md ("Call forms"), row by row, on the kernel-form tensors
    (q [lead, tokens, H, K], ...; the packed form has lead 1 and ``cu_seqlens``).

    A row is a batch row, or a packed sequence. Its initial state comes from its read slot: slot
    n of a dense state, ``read_slots[n]``, or column ``num_accepted[n] - 1`` (column 0 without
    it) of a [N, 1 + S] per-token table. A read slot ``<= null_slot`` makes the row padding:
    zero output, no state or cache touched. A write slot ``<= null_slot`` (FlashInfer's negative
    ``output_state_indices`` entry) stores no final state; the row is otherwise computed and
    stored as any other. Otherwise the state after token t goes to
    the table's column t (per-token slots), to ``cache[cache_rows[n] or n, t]`` when a cache is
    given (skipped where the cache row is padding), and the final state to the write slot unless
    ``disable_state_update`` (or per-token slots) says not to. ``token_slots`` [N, T]
    (FlashInfer's ``ssm_state_indices``, beside [N] read slots): the state after token t goes to
    ``token_slots[n, t]`` (skipped where that slot is padding), and there is no final write.
    Stored states are rounded to the state dtype; nothing else is.

    State recovery (FlashInfer's; docs/design.md, "State recovery"): with ``recovery_steps`` R,
    or ``accepted_steps`` [N] (R = accepted_steps[n] + 1) where the call updates the state (no
    ``disable_state_update``, no per-token slots), the row's first R tokens update the state and
    output nothing, the state after them goes to the write slot, and the rest are decoded from
    it with output; no final state is stored. Otherwise ``accepted_steps`` truncates the row to
    its tokens 0..accepted_steps[n]: the later ones are not run (no output, state or cache).

    ``state_scales`` [slots, HV, V]: an int8 K-last pool with one fp32 scale per row
    (docs/design.md, "Quantized state"): a state is read as ``values * scale`` and stored as
    :func:`gdngen.reference.state_formats.store` quantizes it (``int8_row``), its scales into
    the returned ``scales``. Its verify cache is in the same format, with ``cache_scales`` [R,
    cache_steps, HV, V]: each cached state is stored as the pool's are, its scales into the
    returned ``cache_scales``.
    """
    K = q.shape[3]
    HV = v.shape[2]
    if scale is None:
        scale = K**-0.5
    qh, kh = _heads(q, k, HV, scale, use_qk_l2norm)
    g, beta = gates(A_log, a, dt_bias, b)
    per_token = token_slots is not None or (read_slots is not None and read_slots.dim() == 2)
    rows = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    bounds = None if cu_seqlens is None else cu_seqlens.long().tolist()
    tables = {
        name: None if t is None else t.long().cpu()
        for name, t in (("read", read_slots), ("write", write_slots), ("accepted", num_accepted), ("cache", cache_rows), ("scatter", token_slots), ("last", accepted_steps))
    }  # fmt: skip
    recovers = (
        not disable_state_update
        and not per_token
        and (accepted_steps is not None or recovery_steps > 0)
    )

    output = torch.full(v.shape, float("nan"), dtype=torch.float64, device=q.device)
    new_pool = pool.clone()
    new_cache = None if cache is None else cache.clone()
    new_scales = None if state_scales is None else state_scales.clone()
    new_cache_scales = None if cache_scales is None else cache_scales.clone()

    def k_last(state):
        return state if state_layout == "k_last" else state.transpose(-1, -2)

    def read_state(slot):
        if state_scales is None:
            return k_last(pool[slot]).double()
        return pool[slot].double() * state_scales[slot].double()[..., None]

    def write_state(slot, state):
        if state_scales is None:
            new_pool[slot] = k_last(state).to(pool.dtype)
            return
        stored = store(state, SCALED_FORMATS[pool.dtype])
        new_pool[slot], new_scales[slot] = stored.values, stored.scales

    for n in range(rows):
        lead, tokens = (n, slice(None)) if bounds is None else (0, slice(bounds[n], bounds[n + 1]))
        if tables["read"] is None:
            read = write = n
        elif tables["scatter"] is not None:
            read = write = int(tables["read"][n])
        elif per_token:
            column = 0 if tables["accepted"] is None else int(tables["accepted"][n]) - 1
            read = write = int(tables["read"][n, column])
        else:
            read = int(tables["read"][n])
            write = read if tables["write"] is None else int(tables["write"][n])
        live = read > null_slot
        if tables["read"] is None:
            live = True
        count = output[lead, tokens].shape[0]
        replayed = 0  # the leading tokens whose outputs are not stored (state recovery)
        if recovers:
            replayed = recovery_steps if tables["last"] is None else int(tables["last"][n]) + 1
        elif tables["last"] is not None:
            count = min(count, int(tables["last"][n]) + 1)
            tokens = slice(None, count) if bounds is None else slice(bounds[n], bounds[n] + count)
        if not live:
            output[lead, tokens][replayed:] = 0.0
            continue
        h = read_state(read)[None]
        final = h[0]  # an empty sequence leaves its state as it is
        if count:
            out, states = recurrence(
                h, qh[lead, tokens][None], kh[lead, tokens][None], v[lead, tokens][None],
                g[lead, tokens][None], beta[lead, tokens][None],
            )  # fmt: skip
            output[lead, tokens][replayed:] = out[0, replayed:]
            final = states[0, -1]
        if recovers:
            if replayed and write > null_slot:
                write_state(write, states[0, replayed - 1])
            continue
        if per_token:
            table = tables["read"] if tables["scatter"] is None else tables["scatter"]
            for t in range(count):
                slot = int(table[n, t])
                if slot > null_slot:
                    write_state(slot, states[0, t])
        elif not disable_state_update and write > null_slot:
            write_state(write, final)
        if cache is not None:
            row = n if tables["cache"] is None else int(tables["cache"][n])
            if row > null_slot:
                for t in range(count):
                    if cache_scales is None:
                        new_cache[row, t] = k_last(states[0, t]).to(cache.dtype)
                    else:
                        stored = store(states[0, t], SCALED_FORMATS[cache.dtype])
                        new_cache[row, t], new_cache_scales[row, t] = stored.values, stored.scales
    return ExpectedCall(
        output=output, pool=new_pool, cache=new_cache, scales=new_scales,
        cache_scales=new_cache_scales,
    )  # fmt: skip
