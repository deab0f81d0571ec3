"""Trace-time helpers: where one kernel row's tokens, state slots and cache row are.

A kernel row is one batch row of a dense call, or one sequence of a packed (varlen) call. The
call forms that decide this (docs/design.md, "Call forms") are compile-time inputs, so each helper
returns plain DSL values and the kernel body reads the same names whatever the form:

- ``row_tokens``: the row's T token positions along dim 1 of q, k, v, a, b and the output,
  which of them are live, and (uniform rows) whether the row's sequence is where they are. A
  packed sequence has ``cu_seqlens[n + 1] - cu_seqlens[n] <= T`` tokens; the positions past its
  end repeat its last token (or, in uniform rows, stay in the buffer) and are not live: the
  kernel gives them no decay and no write strength, so they leave the state unchanged, and
  stores nothing for them.
- ``row_slots``: the state slot read, the slot written (or the per-token slot table), and whether
  the row owns them. A read slot ``<= null_slot`` is padding: the row outputs zeros and touches no
  state. A separate write slot ``<= null_slot`` (FlashInfer's negative ``output_state_indices``
  entry) writes nothing: the row still reads its slot, computes and stores its output (and its
  verify cache), but its final state is not stored. A slot past the pool, or a ``num_accepted_tokens`` outside ``[1, 1 + S]``, is a bad
  index (only reachable without the opt-in index check): the row outputs NaN, so that it shows,
  and touches no state either.
- ``row_span``: where the row's tokens start and how many there are (the conv1d prologue's
  state ends at the last).
- ``token_slot``: with a per-token slot table (vLLM's [N, 1 + S], or FlashInfer's
  ``ssm_state_indices [N, T]`` beside [N] read slots), the slot receiving the state after
  token t.
- ``conv_slots``: the conv1d prologue's state slots and where its window starts.
- ``row_recovery``: FlashInfer's state recovery (``accepted_steps``, ``recovery_steps``): which
  tokens store their output, after which token the state is stored, and which tokens a
  truncated row runs at all.

Slots are widened to 64 bits before they scale a stride: pool offsets pass 2^31.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
from cutlass import Int32, Int64

from .hold import opaque


def _clamp(value, lo, hi):
    return cutlass.max(cutlass.min(value, hi), lo)


def row_tokens(n64, T: int, cu_seqlens, total_tokens, uniform: bool = False):
    """``(batch_row, token_at, token_live, placed)``: the index of dim 0, T (position, live)
    pairs, and whether the row's sequence fits them (None: always), without which the row owns
    no slot (row_slots).
    ``uniform``: the caller promised that sequence n starts at n * T (CompileKey.uniform_rows,
    the call's ``uniform_seqlen``): the positions are computed without waiting for cu_seqlens,
    which is read beside them only for ``placed``."""
    if cu_seqlens is None:
        # Dense rows: token t of row n sits at [n, t]; all T are live (a constant true).
        return n64, list(range(T)), [Int64(t) < Int64(T) for t in range(T)], None
    total = Int64(total_tokens)
    start = Int64(cu_seqlens[n64])
    if uniform:
        # Sequence n's T tokens from n * T (the checks made sure the buffer holds N * T): no
        # position waits for a load, and every token is live; a clamp per token here cost up
        # to 20% at B = 1 (docs/perf/h100-2026-11-27-packed-buffer.md). The promise is checked
        # off the load path: a row whose sequence is not exactly there (another start, another
        # length) is not placed, so it owns no slot (RowSlots.owned) and stores no state; its
        # outputs are not computed (docs/design.md, "Call forms").
        first = n64 * T
        placed = (start == first) & (Int64(cu_seqlens[n64 + 1]) - start == Int64(T))
        token_at = [first + t for t in range(T)]
        return Int64(0), token_at, [Int64(t) < Int64(T) for t in range(T)], placed
    # The span is bounded to the buffer once, whatever cu_seqlens holds (its values are checked
    # on request only); then a position is a 32-bit min and an add. Every token's loads wait for
    # these: a select and a 64-bit clamp per token put ~280 more instructions before them at
    # T = 8 (sm_90a SASS, docs/perf/h100-2026-11-24-packed-rows.md).
    first = _clamp(start, Int64(0), total - 1)
    length = _clamp(Int64(cu_seqlens[n64 + 1]) - start, Int64(0), total - first)
    last = Int32(cutlass.max(length - 1, Int64(0)))  # the offset of the row's last token
    token_at = [first] + [first + Int64(cutlass.min(Int32(t), last)) for t in range(1, T)]
    token_live = [Int64(t) < length for t in range(T)]
    # A sequence longer than T is a bad index (only reachable with index checks off): the row
    # owns no slot, so it stores no state, and its first T tokens' outputs show NaN.
    return Int64(0), token_at, token_live, length <= Int64(T)


def kernel_rows(dense_rows, cu_seqlens):
    """The rows a launch's grid covers: a packed call's sequences (cu_seqlens holds one more
    offset than there are), else ``dense_rows`` (dim 0 of the call's tensors)."""
    return dense_rows if cu_seqlens is None else cu_seqlens.shape[0] - 1


def row_span(n64, T: int, cu_seqlens):
    """``(first, length)``: where the row's tokens start along dim 1 and how many there are;
    plain ints (0, T) for a dense row."""
    if cu_seqlens is None:
        return 0, T
    first = Int64(cu_seqlens[n64])
    return first, Int64(cu_seqlens[n64 + 1]) - first


@dataclass
class RowSlots:
    read: object  # Int64 slot the initial state comes from
    write: object  # Int64 slot the final state goes to (the read slot without separate slots)
    owned: object  # Boolean: the slots are live and in the pool (and the row is placed)
    padded: object  # Boolean: a slot is padding (zero output), not a bad index (NaN output)
    #: a per-token table of exactly T columns: every column, loaded up front (token_slot)
    columns: list | None = None
    #: Boolean: the read slot may be loaded (owned, before the placement check, so that the
    #: state's load waits for the slots alone; a row found unplaced stores nothing)
    readable: object = None
    #: Boolean: the final state is stored to ``write`` (owned, and a separate write slot that
    #: is not padding); the same value as ``owned`` where the call has no separate write slots
    writes: object = None

    def __post_init__(self):
        if self.readable is None:
            self.readable = self.owned
        if self.writes is None:
            self.writes = self.owned


def row_slots(
    n64, read_slots, write_slots, num_accepted, per_token_slots: bool, null_slot: int, pool_size,
    exact_table_tokens: int = 0, placed=None,
) -> RowSlots:  # fmt: skip
    """The row's state slots (see the module docstring). ``exact_table_tokens``: T where the
    per-token table has exactly T columns (CompileKey.exact_slot_table), else 0. ``placed``
    (row_tokens): where false, the row owns no slot (it may still read its read slot, which
    is the call's; it writes nothing); a padding slot still makes it padding."""
    slots = _row_slots(
        n64, read_slots, write_slots, num_accepted, per_token_slots, null_slot, pool_size,
        exact_table_tokens,
    )  # fmt: skip
    if placed is not None:
        writes_when_owned = slots.writes is slots.owned
        slots.owned = slots.owned & placed
        slots.writes = slots.owned if writes_when_owned else slots.writes & placed
    return slots


def _row_slots(
    n64, read_slots, write_slots, num_accepted, per_token_slots: bool, null_slot: int, pool_size,
    exact_table_tokens: int,
) -> RowSlots:  # fmt: skip
    if read_slots is None:
        # A dense state: row n uses slot n, which the checks made sure exists.
        owned = (n64 >= 0) & (n64 < pool_size)
        return RowSlots(read=n64, write=n64, owned=owned, padded=n64 < 0)
    if per_token_slots and write_slots is not None:
        # FlashInfer's per-token scatter: the initial state from the [N] read slot, the state
        # after token t to ssm_state_indices[n, t] (a [N, T] table: its T columns load up front,
        # beside the read slot; token_slot picks them). No final write.
        read = Int64(read_slots[n64])
        columns = [Int64(write_slots[n64, c]) for c in range(exact_table_tokens)]
        owned = (read > null_slot) & (read < pool_size)
        return RowSlots(
            read=read, write=read, owned=owned, padded=read <= null_slot, columns=columns
        )
    if per_token_slots and exact_table_tokens:
        # Every column is loaded beside num_accepted_tokens, and the initial slot picked among
        # them: no load waits for another. Held opaque, the columns cannot be folded back into
        # one load at column num_accepted - 1 (which would wait for num_accepted again).
        T = exact_table_tokens
        columns = [Int64(opaque(read_slots[n64, c])) for c in range(T)]
        column = Int64(0)
        if num_accepted is not None:
            column = Int64(num_accepted[n64]) - 1
        read = columns[0]
        for c in range(1, T):
            read = cutlass.select_(column == c, columns[c], read)
        column_ok = (column >= 0) & (column < T)
        live = read > null_slot
        owned = column_ok & live & (read < pool_size)
        return RowSlots(
            read=read, write=read, owned=owned, padded=column_ok & (read <= null_slot),
            columns=columns,
        )  # fmt: skip
    if per_token_slots:
        # A [N, 1 + S] table: the initial state is in column num_accepted - 1 (column 0 without
        # num_accepted_tokens); the state after token t goes to column t (token_slot).
        column = Int64(0)
        if num_accepted is not None:
            column = Int64(num_accepted[n64]) - 1
        columns = Int64(read_slots.shape[1])
        column_ok = (column >= 0) & (column < columns)
        read = Int64(read_slots[n64, _clamp(column, Int64(0), columns - 1)])
        live = read > null_slot
        owned = column_ok & live & (read < pool_size)
        return RowSlots(read=read, write=read, owned=owned, padded=column_ok & (read <= null_slot))
    read = Int64(read_slots[n64])
    if write_slots is not None:
        # FlashInfer's meaning of a write slot that is padding: the row reads, computes and
        # outputs as any other, and stores no final state. A write slot past the pool is a bad
        # index (NaN output, nothing stored), as a read slot past it is.
        write = Int64(write_slots[n64])
        owned = (read > null_slot) & (read < pool_size) & (write < pool_size)
        return RowSlots(
            read=read, write=write, owned=owned, padded=read <= null_slot,
            writes=owned & (write > null_slot),
        )  # fmt: skip
    write = read
    padded = (read <= null_slot) | (write <= null_slot)
    owned = (read > null_slot) & (write > null_slot) & (read < pool_size) & (write < pool_size)
    return RowSlots(read=read, write=write, owned=owned, padded=padded)


def token_slot(n64, t: int, read_slots, null_slot: int, pool_size, columns=None):
    """``(slot, ok)``: the per-token table's slot for the state after token t (from ``columns``
    where row_slots loaded them all); ``ok`` when it is neither padding nor past the pool."""
    slot = columns[t] if columns is not None else Int64(read_slots[n64, t])
    return slot, (slot > null_slot) & (slot < pool_size)


@dataclass
class ConvSlots:
    read: object  # Int64 conv slot whose window is read
    write: object  # Int64 conv slot the new columns go to
    owned: object  # Boolean: the row owns its recurrent slots and the conv slot is live
    offset: object  # Int64 column where the window starts in the slot read
    #: Boolean: the conv state advances (with the recurrent one: RowSlots.writes)
    writes: object = None

    def __post_init__(self):
        if self.writes is None:
            self.writes = self.owned


def conv_slots(n64, slots: RowSlots, read_slots, num_accepted, per_token_slots: bool,
               null_slot: int, pool_size) -> ConvSlots:  # fmt: skip
    """The conv state's slots: the recurrent state's, window at column 0; or, with a per-token
    slot table, one slot a row (its column 0, which keeps every token's input: see
    conv.new_columns), the window starting at column ``num_accepted - 1``."""
    if not per_token_slots:
        return ConvSlots(
            read=slots.read, write=slots.write, owned=slots.owned, offset=Int64(0),
            writes=slots.writes,
        )  # fmt: skip
    slot = Int64(read_slots[n64, 0])
    offset = Int64(0)
    if num_accepted is not None:
        offset = Int64(num_accepted[n64]) - 1
    owned = slots.owned & (slot > null_slot) & (slot < pool_size)
    # An unowned row reads no column; the offset only has to stay an in-bounds number.
    return ConvSlots(
        read=slot, write=slot, owned=owned, offset=cutlass.select_(owned, offset, Int64(0))
    )


def cache_row(n64, cache_rows, null_slot: int, cache):
    """``(row, ok)``: the intermediate-state buffer's row for this kernel row: row n, or the row
    ``cache_rows[n]`` names (padding or past the buffer: ``ok`` is false, nothing is cached)."""
    if cache_rows is None:
        return n64, n64 >= 0
    row = Int64(cache_rows[n64])
    return row, (row > null_slot) & (row < Int64(cache.shape[0]))


@dataclass
class RowRecovery:
    """A row's tokens under state recovery (docs/design.md, "State recovery")."""

    #: per token: whether it is in the row (a truncated row's tokens past its last accepted one
    #: are not: they leave the state as it is, as a packed sequence's padding tokens do)
    token_live: list
    #: per token: whether its output is stored (not a replayed token's)
    token_outputs: list
    #: per token: whether the state after it is the one stored (the last replayed token); None
    #: where the call stores no such state
    boundary: list | None = None
    #: Boolean: the row's accepted_steps entry is in [0, T - 1]; None without accepted_steps
    ok: object = None
    #: tokens past a packed sequence's or a truncated row's end may idle (token_gates' switch)
    idle_tokens: bool = False

    def restrict(self, slots: RowSlots) -> RowSlots:
        """The row's slots, owned only where its accepted_steps entry is good (a bad one, only
        reachable with index checks off, makes the row show NaN and touch no state)."""
        if self.ok is not None:
            slots.owned = slots.owned & self.ok
            slots.readable = slots.readable & self.ok
            slots.writes = slots.writes & self.ok
        return slots


def row_recovery(
    n64, T: int, token_live: list, packed: bool, accepted_steps, recovery_steps: int,
    recovers: bool,
) -> RowRecovery:  # fmt: skip
    """The row's tokens under the call's recovery form (plain T-token rows without one).
    ``recovers``: the replayed tokens' state is stored (the call updates the state); otherwise
    ``accepted_steps`` truncates the row to its tokens 0..accepted_steps[n]."""
    if accepted_steps is None and recovery_steps == 0:
        return RowRecovery(token_live, token_live, idle_tokens=packed)
    if accepted_steps is None:
        # Every row replays tokens 0..R-1: constants, so each token's branch folds away.
        outputs = [token_live[t] & (Int64(t) >= Int64(recovery_steps)) for t in range(T)]
        boundary = [Int64(t) == Int64(recovery_steps - 1) for t in range(T)]
        return RowRecovery(token_live, outputs, boundary, idle_tokens=packed)
    last = Int64(accepted_steps[n64])  # the row's last accepted token
    ok = (last >= 0) & (last < T)
    if recovers:
        # A bad entry stores the NaN fill in every token's output, so that it shows.
        outputs = [token_live[t] & ((Int64(t) > last) | (last < 0) | (last >= T)) for t in range(T)]
        boundary = [Int64(t) == last for t in range(T)]
        return RowRecovery(token_live, outputs, boundary, ok, idle_tokens=packed)
    live = [token_live[t] & (Int64(t) <= last) for t in range(T)]
    return RowRecovery(live, live, None, ok, idle_tokens=True)
