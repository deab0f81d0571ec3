"""The conv1d step as a kernel of its own: the split plan of a fused-core call (docs/design.md,
"The conv1d step apart").

A call with the conv1d prologue normally convolves inside the decode kernel (gdngen.device.conv).
Where the dispatch says so (a rule's ``split_conv``), the runtime launches this kernel first: it
convolves every channel of every row once, writes the convolved rows into a workspace in q's
dtype (what an engine's own conv kernel hands its recurrence) and advances the conv state; the
decode kernel then reads the workspace as its q, k, v, without the prologue.

One CTA a head of one row: grid ``(2H + HV, rows)``, the heads of q, then of k, then of v, a
thread a channel of the head. Each channel is read and written by one thread, so nothing counts
readers (the fused prologue's ``conv_arrivals``). The arithmetic is the prologue's, in the same
order, so the workspace holds the prologue's fp32 outputs rounded once to q's dtype.

The row's slots, its ownership and the window's start come from the helpers the decode kernel
uses (gdngen.device.rows), so that both kernels agree on every call form: a row that does not
own its conv slot convolves a zero window and writes no state; the verify cache's windows are
written where the row owns its slot and its cache row is live; positions past a packed
sequence's end are not written.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32, Int32, Int64

from gdngen.terms import CONV_ACTIVATIONS

from .conv import _new_column, _token, conv_token, new_columns
from .pdl import wait_at_start, wait_for_producer
from .rows import conv_slots, row_slots, row_span, row_tokens


def conv_step_launcher(*, name: str):
    """``launch(q, k, v, q_out, k_out, v_out, <slots and forms>, conv tensors, options,
    launch_pdl, stream)``:
    the conv step's host side, named ``name`` (its parameters: gdngen.runtime.conv_step)."""

    @cute.kernel
    def conv_step_kernel(
        q: cute.Tensor,
        k: cute.Tensor,
        v: cute.Tensor,
        q_out: cute.Tensor,
        k_out: cute.Tensor,
        v_out: cute.Tensor,
        read_slots,
        write_slots,
        num_accepted,
        cu_seqlens,
        cache_rows,
        pool_size: Int64,
        cache_count: Int64,
        conv_state: cute.Tensor,
        conv_weight: cute.Tensor,
        conv_bias,
        conv_windows,
        T: Constexpr[int],
        null_slot: Constexpr[int],
        per_token_slots: Constexpr[bool],
        uniform_rows: Constexpr[bool],
        write_state: Constexpr[bool],
        conv_activation: Constexpr[str],
        pdl: Constexpr[bool],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        head, n, _ = cute.arch.block_idx()
        wait_at_start(pdl)
        H, HV = q.shape[2], v.shape[2]
        n64 = Int64(n)
        seq, _, _, placed = row_tokens(n64, T, cu_seqlens, q.shape[1], uniform_rows)
        slots = row_slots(
            n64, read_slots, write_slots, num_accepted, per_token_slots, null_slot, pool_size,
            0, placed,
        )  # fmt: skip
        conv = conv_slots(
            n64, slots, read_slots, num_accepted, per_token_slots, null_slot, conv_state.shape[0]
        )
        first, length = row_span(n64, T, cu_seqlens)
        cached = None
        cache_at = n64
        if cutlass.const_expr(conv_windows is not None):
            cache_ok = n64 >= 0
            if cutlass.const_expr(cache_rows is not None):
                cache_at = Int64(cache_rows[n64])
                cache_ok = (cache_at > null_slot) & (cache_at < cache_count)
            cached = conv.owned & cache_ok
        K, V = q.shape[3], v.shape[3]
        rest = (
            conv_state, conv_weight, conv_bias, conv_windows, conv.read, conv.write, conv.offset,
            conv.owned, conv.writes, cached, cache_at, seq, Int64(first), Int64(length),
        )  # fmt: skip
        options = (T, conv_activation, write_state, per_token_slots, pdl)
        # The head's channels along the conv's D: q's H*K, then k's H*K, then v's HV*V.
        if head < H:
            if tidx < K:
                _convolve_channel(q, q_out, head, tidx, head * K + tidx, *rest, *options)
        elif head < 2 * H:
            if tidx < K:
                _convolve_channel(k, k_out, head - H, tidx, head * K + tidx, *rest, *options)
        elif head < 2 * H + HV:
            if tidx < V:
                c = 2 * H * K + (head - 2 * H) * V + tidx
                _convolve_channel(v, v_out, head - 2 * H, tidx, c, *rest, *options)

    @cute.jit
    def launch(
        q: cute.Tensor,
        k: cute.Tensor,
        v: cute.Tensor,
        q_out: cute.Tensor,
        k_out: cute.Tensor,
        v_out: cute.Tensor,
        read_slots,
        write_slots,
        num_accepted,
        cu_seqlens,
        cache_rows,
        pool_size: Int64,
        cache_count: Int64,
        conv_state: cute.Tensor,
        conv_weight: cute.Tensor,
        conv_bias,
        conv_windows,
        T: Constexpr[int],
        null_slot: Constexpr[int],
        per_token_slots: Constexpr[bool],
        uniform_rows: Constexpr[bool],
        write_state: Constexpr[bool],
        conv_activation: Constexpr[str],
        pdl: Constexpr[bool],
        launch_pdl: Int32,
        stream,
    ):
        if cutlass.const_expr(conv_activation not in CONV_ACTIVATIONS):
            raise ValueError(
                f"conv_activation: expected one of {CONV_ACTIVATIONS}; got {conv_activation!r}"
            )
        rows = q.shape[0]
        if cutlass.const_expr(cu_seqlens is not None):
            rows = cu_seqlens.shape[0] - 1
        threads = max(q.shape[3], v.shape[3])
        conv_step_kernel(
            q, k, v, q_out, k_out, v_out, read_slots, write_slots, num_accepted, cu_seqlens,
            cache_rows, pool_size, cache_count, conv_state, conv_weight, conv_bias, conv_windows,
            T, null_slot, per_token_slots, uniform_rows, write_state, conv_activation, pdl,
        ).launch(
            grid=(2 * q.shape[2] + v.shape[2], rows, 1), block=(threads, 1, 1), stream=stream,
            use_pdl=launch_pdl if cutlass.const_expr(pdl) else False,
        )  # fmt: skip

    launch.set_name_prefix(name, remove_cutlass_symbol=True, keep_mangled_name=False)
    return launch


@cute.jit
def _convolve_channel(
    source: cute.Tensor,
    out: cute.Tensor,
    head,
    dim,
    c,
    state: cute.Tensor,
    weight: cute.Tensor,
    bias,
    windows,
    read,
    write,
    offset,
    owned,
    writes,
    cached,
    cache_at,
    seq,
    first,
    length,
    tokens: Constexpr[int],
    activation: Constexpr[str],
    write_state: Constexpr[bool],
    per_token: Constexpr[bool],
    pdl: Constexpr[bool],
):
    """Conv channel ``c`` of one row (``dim`` of ``head`` in ``source`` and ``out``): the window
    read (zeros where the row owns no conv slot), every token's input, the outputs of the row's
    tokens; then the new state columns (where the row ``writes``) and the verify cache's
    windows. With ``pdl``, the inputs
    are read after the wait for the grid before (gdngen.device.pdl), the window, taps and bias
    before it."""
    width = weight.shape[1]
    kept = width - 1
    rows = source[seq, None, head, dim]
    # The prologue's row (gdngen.device.conv.conv_token): the window, the taps, the bias.
    window = cute.make_rmem_tensor((kept + tokens + width + 1,), Float32)
    for w in cutlass.range_constexpr(kept):
        window[w] = Float32(0.0)
    if owned:
        for w in cutlass.range_constexpr(kept):
            window[w] = Float32(state[read, c, offset + w])
    if cutlass.const_expr(not pdl):
        for t in cutlass.range_constexpr(tokens):
            window[kept + t] = Float32(rows[_token(rows, first, length, t)])
    for w in cutlass.range_constexpr(width):
        window[kept + tokens + w] = Float32(weight[c, w])
    window[kept + tokens + width] = Float32(0.0)
    if cutlass.const_expr(bias is not None):
        window[kept + tokens + width] = Float32(bias[c])
    if cutlass.const_expr(pdl):
        wait_for_producer(pdl)
        for t in cutlass.range_constexpr(tokens):
            window[kept + t] = Float32(rows[_token(rows, first, length, t)])
    written = out[seq, None, head, dim]
    for t in cutlass.range_constexpr(tokens):
        if Int64(t) < length:
            acc = conv_token(window, t, kept, tokens, activation)
            written[first + t] = acc.to(written.element_type)
    if cutlass.const_expr(write_state):
        # (a row whose write slot is padding reads its window and stores no state)
        if writes:
            for j in cutlass.range_constexpr(new_columns(kept, tokens, per_token)):
                value, is_written = _new_column(window, j, kept, length, tokens, per_token)
                if is_written:
                    state[write, c, j] = Float32(value).to(state.element_type)
    if cutlass.const_expr(windows is not None):
        if cached:
            # After token t the window is positions t + 1 .. t + W - 1 (gdngen.device.conv).
            for t in cutlass.range_constexpr(tokens):
                if Int64(t) < length:
                    for j in cutlass.range_constexpr(kept):
                        windows[cache_at, t, c, j] = window[t + 1 + j].to(windows.element_type)
