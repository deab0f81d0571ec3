"""Device helpers of the causal conv1d prologue (docs/design.md, "The conv1d prologue").

With the prologue, the kernel's q, k and v are the engine's projections *before* its short
depthwise convolution: channel c of token t becomes

    act(bias[c] + sum_{w < W} weight[c, w] * window[c, t + w])

with ``window`` the W - 1 columns the conv state keeps (oldest first), then the call's tokens.

Before the token loop, the CTA convolves the channels it reads, once each: its key head's K
channels of q and of k and its TILE_V rows of v, a thread a channel (``convolve``), for every
token, into shared memory (``conv_outputs``); the token loop reads q, k, v there instead of from
global memory. (Convolving in each lane the VEC columns it uses would repeat the q/k work in every
group and held taps and windows in registers through the loop: 227 against 128 registers a
thread for kl_bf16_tv64_ilp8 at T = 1.)

Who writes the state. A v channel belongs to one CTA and one thread, which writes its new
columns as soon as it has convolved them. A q or k channel is read by every CTA of its key head,
(HV / H) * (V / tile_v) of them, and its state must not change under a reader. Each of those
CTAs counts itself in ``conv_arrivals[slot, key head]`` once its reads are done (``arrive``:
after a CTA barrier, one relaxed atomic add at GPU scope; see ``arrive`` for why no stronger
order is needed); the CTA that finds all the others already counted (``last_reader``) writes
the q/k columns at its end (``store_key_head``, loading the window's last columns again: only it
writes them, and every reader is past them), and takes its readers back off the count
(``leave``), so the count is zero again for the next call. The add's result is only needed at
the kernel's end, so its round trip hides behind the tokens. Rows that share a slot (a caller's
error) still leave the count at zero: it is read modulo the readers.

The verify cache's conv windows (``intermediate_conv_windows [R, steps, D, W - 1]``, at the
recurrent cache's row): the window after each token of the row, written from the registers
``convolve`` already holds. A v channel's by its thread; a q or k channel's by the key head's
first CTA alone (``CtaConv.first_reader``): the windows are not state any CTA reads, so they
need no count.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32, Int32, Int64

from .norm import activate
from .rows import ConvSlots, RowSlots, conv_slots, row_span


def conv_outputs(tokens: int, head_k_dim: int, tile_v: int) -> cute.Tensor:
    """The CTA's convolved inputs in shared memory: (token, channel) fp32, the channels its
    key head's K of q, then K of k, then its TILE_V rows of v."""
    width = 2 * head_k_dim + tile_v
    layout = cute.make_layout((tokens, width), stride=(width, 1))
    return cutlass.memory.SmemAllocator().allocate_tensor(Float32, layout, 16)


@dataclass(frozen=True)
class ConvPart:
    """One run of consecutive conv channels the CTA reads (its q, k or v channels): their
    weight rows [n, W], bias [n] (or None), state columns [n, columns] in the slot read and in
    the slot written, and raw inputs [tokens, n] (the head's, from ``source_first``)."""

    weight: cute.Tensor
    bias: object
    state: cute.Tensor
    written: cute.Tensor
    source: cute.Tensor
    source_first: object
    #: where the part's outputs start along conv_outputs' channels
    out_first: int
    #: its windows in the verify cache's row, [steps, n, W - 1] (None without the cache), and
    #: whether this CTA writes them
    windows: object
    writes_windows: object


@dataclass(frozen=True)
class CtaConv:
    """The conv channels of one CTA, (value head ``hv``, rows ``v_tile`` * TILE_V..), of kernel
    row ``seq``. Frozen: the DSL passes it into the kernel's run-time branches as it is."""

    q: ConvPart
    k: ConvPart
    v: ConvPart
    #: the CTAs that read this key head's q/k channels: (HV / H) * (V / tile_v)
    readers: int
    #: the conv state's slots, whether the row owns them, and where its window starts
    slots: ConvSlots
    #: (first token, tokens) of the row (rows.row_span)
    span: tuple

    @property
    def offset(self):
        return self.slots.offset

    @property
    def kept(self) -> int:
        """The window's columns the state keeps, W - 1."""
        return self.q.weight.shape[1] - 1

    @property
    def owned(self):
        return self.slots.owned

    @property
    def writes(self):
        """The row stores its conv state (rows.ConvSlots.writes)."""
        return self.slots.writes


def cta_conv(
    conv_state, weight, bias, windows, q, k, v, n64, seq, row: RowSlots, read_slots,
    num_accepted, per_token_slots: bool, null_slot: int, cu_seqlens, cache_at, cache_ok,
    head_qk, hv, v_tile, tokens: int, tile_v: int,
) -> CtaConv:  # fmt: skip
    """The parts of a CTA (nothing is loaded here but the row's slots and span): views of the
    conv's weight [D, W], bias [D] and the state [D, columns] of the slots read and written
    (rows.conv_slots, from the recurrent state's ``row``), whose D channels are H*K of q, H*K of
    k, HV*V of v; with the verify cache, of the windows [steps, D, W - 1] in its row
    ``cache_at`` (written where ``cache_ok``, rows.cache_row)."""
    slots = conv_slots(
        n64, row, read_slots, num_accepted, per_token_slots, null_slot, conv_state.shape[0]
    )
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    read_state = conv_state[slots.read, None, None]
    write_state = conv_state[slots.write, None, None]
    row_windows = cached = first_reader = None
    if cutlass.const_expr(windows is not None):
        row_windows = windows[cache_at, None, None, None]
        cached = slots.owned & cache_ok
        # The key head's first CTA, the one that writes its q/k windows.
        first_reader = cached & (v_tile == 0) & (hv % (HV // H) == 0)

    def part(block, n, source, source_first, out_first, writes_windows):
        rows = cute.local_tile(weight, (n, weight.shape[1]), (block, 0))
        kept = cute.local_tile(read_state, (n, read_state.shape[1]), (block, 0))
        written = cute.local_tile(write_state, (n, write_state.shape[1]), (block, 0))
        bias_rows = None
        if cutlass.const_expr(bias is not None):
            bias_rows = cute.local_tile(bias, (n,), (block,))
        part_windows = None
        if cutlass.const_expr(windows is not None):
            steps, _, kept_columns = row_windows.shape
            part_windows = cute.local_tile(row_windows, (steps, n, kept_columns), (0, block, 0))
        return ConvPart(
            rows, bias_rows, kept, written, source, source_first, out_first, part_windows,
            writes_windows,
        )  # fmt: skip

    v_block = 2 * H * K // tile_v + hv * (V // tile_v) + v_tile
    return CtaConv(
        q=part(head_qk, K, q[seq, None, head_qk, None], 0, 0, first_reader),
        k=part(H + head_qk, K, k[seq, None, head_qk, None], 0, K, first_reader),
        v=part(v_block, tile_v, v[seq, None, hv, None], v_tile * tile_v, 2 * K, cached),
        readers=(HV // H) * (V // tile_v),
        slots=slots,
        span=row_span(n64, tokens, cu_seqlens),
    )


def load_conv(conv: CtaConv, tokens: int, threads: int, inputs: bool = True) -> list:
    """Issue every load of the CTA's conv (windows, inputs, taps, bias) into registers, one
    tensor a part. The kernel calls it before it loads the state, so that the conv's data is
    in flight with the state's and ``convolve`` waits no round trip of its own. Without
    ``inputs``, the tokens' inputs are left for :func:`load_conv_inputs` (a PDL kernel loads
    them after its wait: gdngen.device.pdl)."""
    first, length = Int64(conv.span[0]), Int64(conv.span[1])
    kept = conv.kept
    held = []
    for part in (conv.q, conv.k, conv.v):
        rounds = (part.weight.shape[0] + threads - 1) // threads
        # Per round: the window (kept columns, then the tokens' inputs), then the taps and bias.
        loaded = cute.make_rmem_tensor((rounds, 2 * kept + tokens + 2), Float32)
        _load_part(
            loaded, part.weight, part.bias, part.state, part.source, Int32(part.source_first),
            conv.owned, conv.offset, first, length, tokens, threads, inputs,
        )  # fmt: skip
        held.append(loaded)
    return held


def load_conv_inputs(conv: CtaConv, held: list, tokens: int, threads: int) -> None:
    """The tokens' inputs into ``held`` (from ``load_conv(..., inputs=False)``)."""
    first, length = Int64(conv.span[0]), Int64(conv.span[1])
    for part, loaded in zip((conv.q, conv.k, conv.v), held):
        _load_inputs(
            loaded, part.weight, part.source, Int32(part.source_first), first, length, tokens,
            threads,
        )  # fmt: skip


def convolve(
    outputs, conv: CtaConv, held: list, tokens: int, activation: str, threads: int,
    write_state: bool, per_token: bool,
):  # fmt: skip
    """Every token's conv outputs of the CTA's channels into ``outputs``, from ``held``
    (load_conv); with ``write_state``, the v channels' new state columns (``new_columns``);
    with the verify cache, the windows this CTA writes. A row that owns no conv state convolves
    zeros and stores no state. The caller's CTA barrier then publishes ``outputs`` (and ends the
    CTA's reads of the state)."""
    length = Int64(conv.span[1])
    kept = conv.kept
    for part, loaded, write_now in zip((conv.q, conv.k, conv.v), held, (False, False, write_state)):
        _convolve_part(
            outputs, loaded, part.written, part.out_first, kept, conv.writes, length, tokens,
            activation, write_now, per_token, threads, part.windows, part.writes_windows,
        )  # fmt: skip


def store_key_head(conv: CtaConv, tokens: int, threads: int, per_token: bool):
    """The q and k channels' new state columns (the key head's last reader, at its end)."""
    first, length = Int64(conv.span[0]), Int64(conv.span[1])
    kept = conv.kept
    for part in (conv.q, conv.k):
        _store_part(
            part.state, part.written, part.source, Int32(part.source_first), conv.offset, kept,
            first, length, tokens, per_token, threads,
        )  # fmt: skip


def new_columns(kept: int, tokens: int, per_token: bool) -> int:
    """How many state columns a call may write (from column 0), for a row of up to ``tokens``
    tokens: the window (``kept`` = W - 1 columns) ending at the row's last token; or, with
    per-token slots, the window's last W - 2 columns and then every token's input, so that the
    next call can start its window at any accepted token (its ``num_accepted - 1``)."""
    return kept - 1 + tokens if per_token else kept


def conv_token(row, t: int, kept: int, tokens: int, activation: str):
    """Token t's conv output from a loaded ``row``: the window (``kept`` columns read, then the
    tokens' inputs), then the W taps, then the bias. The sum runs in one fixed order, so both
    plans of a conv1d call (this prologue and gdngen.device.conv_step) compute the same fp32
    value."""
    taps = kept + tokens
    acc = row[taps + kept + 1]
    for w in range(kept + 1):
        acc += row[taps + w] * row[t + w]
    if activation == "silu":
        acc = activate(acc, "silu")
    return acc


def _new_column(window, j: int, kept: int, length, tokens: int, per_token: bool):
    """New state column j from ``window`` (the row's ``kept`` columns read, then its tokens'
    inputs), and whether the column is written (the row has tokens; within new_columns)."""
    if per_token:
        # The W - 2 newest columns read, then every token's input.
        written = Int64(0) < length
        if j >= kept - 1:
            written = Int64(j - (kept - 1)) < length
        return window[j + 1], written
    # The last kept columns of the window ending at the row's last token.
    value = window[j]
    for t in range(tokens):
        value = cutlass.select_(Int64(t) < length, window[t + 1 + j], value)
    return value, Int64(0) < length


@cute.jit
def _token(source: cute.Tensor, first: Int64, length: Int64, t: Constexpr[int]):
    """Token t of the row along the source's dim 0 (past a short sequence's end: its last)."""
    at = first + cutlass.min(Int64(t), cutlass.max(length - 1, Int64(0)))
    return cutlass.min(at, Int64(source.shape[0] - 1))


@cute.jit
def _load_part(
    loaded: cute.Tensor,
    weight: cute.Tensor,
    bias,
    state: cute.Tensor,
    source: cute.Tensor,
    source_first: Int32,
    owned,
    offset: Int64,
    first: Int64,
    length: Int64,
    tokens: Constexpr[int],
    threads: Constexpr[int],
    inputs: Constexpr[bool],
):
    """A part's windows, taps and bias (and, with ``inputs``, the tokens' inputs) into
    ``loaded`` (see convolve), a round of channels a row. A thread past the part's channels
    loads the last channel's (and stores nothing)."""
    channels = weight.shape[0]
    width = weight.shape[1]
    kept = width - 1
    tidx, _, _ = cute.arch.thread_idx()
    for r in cutlass.range_constexpr((channels + threads - 1) // threads):
        c = cutlass.min(tidx + r * threads, channels - 1)
        for w in cutlass.range_constexpr(kept):
            loaded[r, w] = Float32(0.0)
        if owned:
            for w in cutlass.range_constexpr(kept):
                loaded[r, w] = Float32(state[c, offset + w])
        if cutlass.const_expr(inputs):
            for t in cutlass.range_constexpr(tokens):
                loaded[r, kept + t] = Float32(
                    source[_token(source, first, length, t), source_first + c]
                )
        for w in cutlass.range_constexpr(width):
            loaded[r, kept + tokens + w] = Float32(weight[c, w])
        loaded[r, kept + tokens + width] = Float32(0.0)
        if cutlass.const_expr(bias is not None):
            loaded[r, kept + tokens + width] = Float32(bias[c])


@cute.jit
def _load_inputs(
    loaded: cute.Tensor,
    weight: cute.Tensor,
    source: cute.Tensor,
    source_first: Int32,
    first: Int64,
    length: Int64,
    tokens: Constexpr[int],
    threads: Constexpr[int],
):
    """The tokens' inputs of a part into ``loaded``, where ``_load_part`` without ``inputs``
    left their places."""
    channels = weight.shape[0]
    kept = weight.shape[1] - 1
    tidx, _, _ = cute.arch.thread_idx()
    for r in cutlass.range_constexpr((channels + threads - 1) // threads):
        c = cutlass.min(tidx + r * threads, channels - 1)
        for t in cutlass.range_constexpr(tokens):
            loaded[r, kept + t] = Float32(
                source[_token(source, first, length, t), source_first + c]
            )


@cute.jit
def _convolve_part(
    outputs: cute.Tensor,
    loaded: cute.Tensor,
    written: cute.Tensor,
    out_first: Constexpr[int],
    kept: Constexpr[int],
    writes,
    length: Int64,
    tokens: Constexpr[int],
    activation: Constexpr[str],
    write_now: Constexpr[bool],
    per_token: Constexpr[bool],
    threads: Constexpr[int],
    windows,
    writes_windows,
):
    """A part's outputs from its ``loaded`` rows; with ``write_now``, its new state columns
    (where the row ``writes``);
    with ``windows`` (where ``writes_windows``), the window after each of the row's tokens."""
    channels = written.shape[0]
    tidx, _, _ = cute.arch.thread_idx()
    for r in cutlass.range_constexpr((channels + threads - 1) // threads):
        c = tidx + r * threads
        if c < channels:
            for t in cutlass.range_constexpr(tokens):
                outputs[t, out_first + c] = conv_token(loaded[r, None], t, kept, tokens, activation)
            if cutlass.const_expr(write_now):
                if writes:
                    for j in cutlass.range_constexpr(new_columns(kept, tokens, per_token)):
                        value, write = _new_column(
                            loaded[r, None], j, kept, length, tokens, per_token
                        )
                        if write:
                            written[c, j] = Float32(value).to(written.element_type)
            if cutlass.const_expr(windows is not None):
                if writes_windows:
                    # After token t the window is positions t + 1 .. t + W - 1 of the loaded
                    # row (its kept columns, then the tokens). Overlapping windows (a caller's
                    # view with step stride = column stride) get the same value twice.
                    for t in cutlass.range_constexpr(tokens):
                        if Int64(t) < length:
                            for j in cutlass.range_constexpr(kept):
                                windows[t, c, j] = loaded[r, t + 1 + j].to(windows.element_type)


@cute.jit
def _store_part(
    state: cute.Tensor,
    written: cute.Tensor,
    source: cute.Tensor,
    source_first: Int32,
    offset: Int64,
    kept: Constexpr[int],
    first: Int64,
    length: Int64,
    tokens: Constexpr[int],
    per_token: Constexpr[bool],
    threads: Constexpr[int],
):
    """A part's new state columns, from the columns read (loaded again) and the row's inputs."""
    channels = state.shape[0]
    tidx, _, _ = cute.arch.thread_idx()
    for r in cutlass.range_constexpr((channels + threads - 1) // threads):
        c = tidx + r * threads
        if c < channels:
            # The window again, every position loaded before any column is stored: a new
            # column may be an old one this loop overwrites.
            window = cute.make_rmem_tensor((kept + tokens,), state.element_type)
            for w in cutlass.range_constexpr(kept):
                window[w] = state[c, offset + w]
            for t in cutlass.range_constexpr(tokens):
                window[kept + t] = source[_token(source, first, length, t), source_first + c]
            for j in cutlass.range_constexpr(new_columns(kept, tokens, per_token)):
                value, write = _new_column(window, j, kept, length, tokens, per_token)
                if write:
                    written[c, j] = value


def _counter(arrivals: cute.Tensor, slot, head):
    return arrivals.iterator + cute.crd2idx((slot, head), arrivals.layout)


def arrive(arrivals: cute.Tensor, slot, head):
    """Count this CTA as done reading the key head's q/k state (one thread calls it, after a
    CTA barrier that follows every thread's reads); returns the count before.

    Relaxed, not acquire-release: the reads it must follow are complete already. Every q/k
    state value a thread loads is consumed by its convolution, whose result it stores into
    shared memory before the CTA barrier (a thread past the part's channels loads the last
    channel and discards it), so no read is still in flight when the add is issued; and the
    last reader's writes depend on the count the add returns, so they come after every
    reader's add. An acquire-release add cost 4-5% of a bf16 T = 1 call on an H100 at every
    batch: its fence holds thread 0 until all its loads (the state's included) are back, and
    warp 0's later loads until the add returns (docs/perf/h100-2026-11-26-relaxed-count.md)."""
    return cute.arch.atomic_add(
        _counter(arrivals, slot, head), Int32(1), sem="relaxed", scope="gpu"
    )


def last_reader(before, readers: int):
    """Whether the CTA whose ``arrive`` returned ``before`` was the last of ``readers``."""
    return before % readers == readers - 1


def leave(arrivals: cute.Tensor, slot, head, readers: int) -> None:
    """Take the key head's readers back off the count (the last reader, after its writes)."""
    cute.arch.atomic_add(
        _counter(arrivals, slot, head), Int32(-readers), sem="relaxed", scope="gpu"
    )
