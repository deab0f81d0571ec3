"""The conv1d step as a kernel of its own: the split plan of a fused-core call (docs/design.md,
"The conv1d step apart").

A call with the conv1d prologue normally convolves inside the decode kernel (gdngen.device.conv).
Where the dispatch says so (a rule's ``split_conv``), the runtime launches this kernel first: it
convolves every channel of every row once, writes the convolved rows into a workspace in q's
dtype (what an engine's own conv kernel hands its recurrence) and advances the conv state; the
decode kernel then reads the workspace as its q, k, v, without the prologue.

A thread convolves ``VEC`` consecutive channels of one head (on a channels-last pool a 16-byte
vector of q's dtype, :func:`channels_per_thread`; else one); a CTA holds ``heads_per_cta`` heads of one row, about 128
threads: grid ``(ceil((2H + HV) / heads_per_cta), rows)``, the heads of q, then of k, then of v.
Each channel is read and written by one thread, so nothing counts readers (the fused prologue's
``conv_arrivals``). A thread's loads of its window, inputs, taps and bias are all in flight at
once: at a thread a channel each thread made two dependent round trips for six bytes of state,
and the step streamed at about 60% of the copy bandwidth (docs/design.md, "The conv1d step
apart"). With ``channels_last`` (CompileKey.conv_channels_last: the pool's channels are
contiguous, every stride and the base 16-byte aligned) a window column, a token's input, the
output and each new state column are one 16-byte access; otherwise the state's are scalar.
The arithmetic is the prologue's, in the same order, so the workspace holds the prologue's fp32
outputs rounded once to q's dtype.

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

from gdngen.terms import CONV_ACTIVATIONS, require_activation

from .conv import _new_column, _token, conv_token, new_columns
from .pdl import wait_at_start, wait_for_producer
from .rows import conv_slots, kernel_rows, row_slots, row_span, row_tokens

#: threads a CTA of the step aims at (whole heads: a head's channels are never split)
CTA_THREADS = 128


def channels_per_thread(element_bytes: int, K: int, V: int) -> int:
    """The channels one thread of the step convolves: a 16-byte vector of q's dtype, halved
    until it divides both head dims (so a thread's channels are one head's)."""
    vec = 16 // element_bytes
    while K % vec or V % vec:
        vec //= 2
    return vec


def step_grid(heads: int, K: int, V: int, vec: int) -> tuple[int, int, int]:
    """``(lanes, heads_per_cta, ctas_per_row)``: the threads of a head (one per ``vec``
    channels of its larger dim), the heads a CTA holds and the CTAs of a row."""
    lanes = max(K, V) // vec
    per_cta = max(1, min(heads, CTA_THREADS // lanes))
    return lanes, per_cta, -(-heads // per_cta)


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
        channels_last: Constexpr[bool],
        VEC: Constexpr[int],
        lanes: Constexpr[int],
        heads_per_cta: Constexpr[int],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        block, n, _ = cute.arch.block_idx()
        wait_at_start(pdl)
        H, HV = q.shape[2], v.shape[2]
        head = block * heads_per_cta + tidx // lanes
        lane = tidx % lanes
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
        options = (T, conv_activation, write_state, per_token_slots, pdl, channels_last, VEC)
        # The head's channels along the conv's D: q's H*K, then k's H*K, then v's HV*V; a
        # thread's are VEC consecutive ones, its lane's.
        if head < H:
            if lane * VEC < K:
                _convolve(q, q_out, head, lane, head * K + lane * VEC, *rest, *options)
        elif head < 2 * H:
            if lane * VEC < K:
                _convolve(k, k_out, head - H, lane, head * K + lane * VEC, *rest, *options)
        elif head < 2 * H + HV:
            if lane * VEC < V:
                c = 2 * H * K + (head - 2 * H) * V + lane * VEC
                _convolve(v, v_out, head - 2 * H, lane, c, *rest, *options)

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
        channels_last: Constexpr[bool],
        launch_pdl: Int32,
        stream,
    ):
        require_activation("conv_activation", conv_activation, CONV_ACTIVATIONS)
        rows = kernel_rows(q.shape[0], cu_seqlens)
        H, HV, K, V = q.shape[2], v.shape[2], q.shape[3], v.shape[3]
        # A channels-first pool's VEC channels of a column are VEC strided elements: a thread
        # a channel keeps a warp's accesses to one column contiguous (VEC of them per thread
        # took up to 4.6x as long on an H200: docs/design.md, "The conv1d step apart").
        vec = channels_per_thread(q.element_type.width // 8, K, V) if channels_last else 1
        lanes, per_cta, ctas = step_grid(2 * H + HV, K, V, vec)
        conv_step_kernel(
            q, k, v, q_out, k_out, v_out, read_slots, write_slots, num_accepted, cu_seqlens,
            cache_rows, pool_size, cache_count, conv_state, conv_weight, conv_bias, conv_windows,
            T, null_slot, per_token_slots, uniform_rows, write_state, conv_activation, pdl,
            channels_last, vec, lanes, per_cta,
        ).launch(
            grid=(ctas, rows, 1), block=(lanes * per_cta, 1, 1), stream=stream,
            use_pdl=launch_pdl if cutlass.const_expr(pdl) else False,
        )  # fmt: skip

    launch.set_name_prefix(name, remove_cutlass_symbol=True, keep_mangled_name=False)
    return launch


@cute.jit
def _vector(tensor: cute.Tensor, block, VEC: Constexpr[int]) -> cute.Tensor:
    """Elements ``block * VEC ..`` of a 1-D tensor, as a (VEC,) view (one access where the
    tensor's stride is 1 and its alignment allows)."""
    return cute.zipped_divide(tensor, (VEC,))[None, block]


@cute.jit
def _convolve(
    source: cute.Tensor,
    out: cute.Tensor,
    head,
    lane,
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
    channels_last: Constexpr[bool],
    VEC: Constexpr[int],
):
    """Conv channels ``c .. c + VEC`` of one row (``lane``'s of ``head`` in ``source`` and
    ``out``): the window read (zeros where the row owns no conv slot), every token's input, the
    outputs of the row's tokens; then the new state columns (where the row ``writes``) and the
    verify cache's windows. With ``pdl``, the inputs are read after the wait for the grid
    before (gdngen.device.pdl), the window, taps and bias before it."""
    width = weight.shape[1]
    kept = width - 1
    span = kept + tokens + width + 1
    # Channel i's row of the prologue (gdngen.device.conv.conv_token) is rows[None, i]: the
    # window, the tokens' inputs, the taps, the bias.
    rows = cute.make_rmem_tensor(cute.make_layout((span, VEC), stride=(1, span)), Float32)
    staged = cute.make_rmem_tensor((VEC,), state.element_type)
    for w in cutlass.range_constexpr(kept):
        for i in cutlass.range_constexpr(VEC):
            rows[w, i] = Float32(0.0)
    if owned:
        for w in cutlass.range_constexpr(kept):
            column = state[read, None, offset + w]
            if cutlass.const_expr(channels_last):
                staged.store(_vector(column, c // VEC, VEC).load())
                for i in cutlass.range_constexpr(VEC):
                    rows[w, i] = Float32(staged[i])
            else:
                for i in cutlass.range_constexpr(VEC):
                    rows[w, i] = Float32(column[c + i])
    if cutlass.const_expr(not pdl):
        _load_inputs(rows, source, seq, head, lane, first, length, kept, tokens, VEC)
    taps = cute.make_rmem_tensor(
        cute.make_layout((VEC, width), stride=(width, 1)), weight.element_type
    )
    taps.store(cute.local_tile(weight, (VEC, width), (c // VEC, 0)).load())
    for i in cutlass.range_constexpr(VEC):
        for w in cutlass.range_constexpr(width):
            rows[kept + tokens + w, i] = Float32(taps[i, w])
        rows[kept + tokens + width, i] = Float32(0.0)
    if cutlass.const_expr(bias is not None):
        bias_staged = cute.make_rmem_tensor((VEC,), bias.element_type)
        bias_staged.store(_vector(bias, c // VEC, VEC).load())
        for i in cutlass.range_constexpr(VEC):
            rows[kept + tokens + width, i] = Float32(bias_staged[i])
    if cutlass.const_expr(pdl):
        wait_for_producer(pdl)
        _load_inputs(rows, source, seq, head, lane, first, length, kept, tokens, VEC)
    result = cute.make_rmem_tensor((VEC,), out.element_type)
    for t in cutlass.range_constexpr(tokens):
        if Int64(t) < length:
            for i in cutlass.range_constexpr(VEC):
                acc = conv_token(rows[None, i], t, kept, tokens, activation)
                result[i] = acc.to(out.element_type)
            _vector(out[seq, first + t, head, None], lane, VEC).store(result.load())
    if cutlass.const_expr(write_state):
        # (a row whose write slot is padding reads its window and stores no state)
        if writes:
            for j in cutlass.range_constexpr(new_columns(kept, tokens, per_token)):
                is_written = None
                for i in cutlass.range_constexpr(VEC):
                    value, is_written = _new_column(
                        rows[None, i], j, kept, length, tokens, per_token
                    )
                    staged[i] = Float32(value).to(state.element_type)
                if is_written:
                    column = state[write, None, j]
                    if cutlass.const_expr(channels_last):
                        _vector(column, c // VEC, VEC).store(staged.load())
                    else:
                        for i in cutlass.range_constexpr(VEC):
                            column[c + i] = staged[i]
    if cutlass.const_expr(windows is not None):
        if cached:
            # After token t the window is positions t + 1 .. t + W - 1 (gdngen.device.conv).
            for t in cutlass.range_constexpr(tokens):
                if Int64(t) < length:
                    for j in cutlass.range_constexpr(kept):
                        for i in cutlass.range_constexpr(VEC):
                            windows[cache_at, t, c + i, j] = rows[t + 1 + j, i].to(
                                windows.element_type
                            )


@cute.jit
def _load_inputs(rows, source, seq, head, lane, first, length, kept: int, tokens: int, VEC: int):
    """Every token's input of the thread's channels into ``rows`` (past a packed sequence's
    end, its last token's: those outputs are not written)."""
    staged = cute.make_rmem_tensor((VEC,), source.element_type)
    for t in cutlass.range_constexpr(tokens):
        at = _token(source[seq, None, head, 0], first, length, t)
        staged.store(_vector(source[seq, at, head, None], lane, VEC).load())
        for i in cutlass.range_constexpr(VEC):
            rows[kept + t, i] = Float32(staged[i])
