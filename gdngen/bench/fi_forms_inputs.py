"""The forms and cells of the FlashInfer forms bench (gdngen.bench.fi_forms), and their inputs.

A form is one of FlashInfer's decode call forms that gdngen's ``gdn_decode`` takes under
FlashInfer's names (docs/design.md, "Call forms"), with the FlashInfer 0.7.2 entry that runs it
per state dtype. A cell is a form, a state dtype, HV, T and a batch (H = 16, K = V = 128).

The inputs of a cell, one generator for every form (:func:`cell_sets`):

- one state pool for all of the cell's input sets, each set on slots of its own, drawn without
  repeats from slots 1.. (slot 0 is FlashInfer's null buffer: its bf16 kernels and its fp32
  pretranspose kernel redirect a negative read or write slot there, so it is never a live row's
  slot, and what lands in it is no one's result). The pool has the same number of slots in every
  cell of a (form, state dtype, HV, T) of the run, as an engine's pool has: FlashInfer compiles a
  strided pool's kernel for its slot count, so one pool size is one compile, not one per batch;
- spare slots beyond what the sets use;
- rows ``b % 8 == 3`` are padding: read slot -1, write slot -1, and every per-token slot the
  null slot (FlashInfer's fp32 kernels skip such a row; its bf16 kernels compute it on the null
  slot);
- a strided form's pool is a view of a larger buffer (:func:`pool_view`): every other head of
  2 * HV, a spare row per head and a spare 16-byte vector per row;
- ``negative_writes``: write slots of their own, -1 in rows ``b % 4 == 1`` (computed, no state
  stored);
- ``accepted_steps`` (the recovery forms): ``(b + set) % T`` in row b, every value of 0..T-1;
- ``recovery_steps``: T // 2.

Everything is drawn on the given device from a generator of that device, so that a cell of
gigabytes of states is made in a moment (and a tiny cell on the CPU for tests).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from gdngen.problem import TORCH_DTYPES

#: the key heads and head dims of both served models (FlashInfer's kernels take K = V = 128)
KEY_HEADS, HEAD_DIM = 16, 128
#: FlashInfer's null buffer: where its kernels put a negative slot's state
NULL_SLOT = 0
#: rows ``b % PADDED_EVERY == PADDED_AT`` are padding (none at B < 4)
PADDED_EVERY, PADDED_AT = 8, 3
#: ``negative_writes``: rows ``b % NEGATIVE_EVERY == NEGATIVE_AT`` store no state
NEGATIVE_EVERY, NEGATIVE_AT = 4, 1
#: tokens per row gdngen's h200 target serves; FlashInfer's MTP kernels need T >= 2
MAX_TOKENS = 8
STATE_DTYPES = ("bf16", "fp32")

#: FlashInfer 0.7.2's entries that run the forms
PRETRANSPOSE = "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose"
MTP = "flashinfer.gdn_decode.gated_delta_rule_mtp"
BF16_MTP = "flashinfer.gdn_kernels.gdn_decode_bf16_state.gated_delta_rule_mtp"

#: the B * HV from which FlashInfer's bf16 MTP dispatch takes its wide_vec kernel, the only one
#: with fused recovery (below it, ``recovery_steps`` is refused, and ``accepted_steps`` with state
#: updates means "tokens 0..K with output, then the final write": another form)
WIDE_VEC_WORK_UNITS = 128
_RECOVERY_NOTE = (
    f"FlashInfer's fused recovery runs only on its wide_vec kernel, from B*HV = "
    f"{WIDE_VEC_WORK_UNITS}"
)


@dataclass(frozen=True)
class Form:
    """One of FlashInfer's call forms, as the bench runs it on both sides."""

    name: str
    #: what the form is, for the report
    what: str
    #: (state dtype, FlashInfer's entry) for each state dtype FlashInfer serves the form with
    entries: tuple[tuple[str, str], ...]
    #: the T the form takes: (1,) for the T = 1 pretranspose forms, else 2..MAX_TOKENS
    one_token: bool = False
    strided: bool = False
    #: ``ssm_state_indices [B, T]``
    scatter: bool = False
    negative_writes: bool = False
    #: ``enable_pdl=True`` on both sides
    pdl: bool = False
    #: ``accepted_steps [B]``: "fused" (state updates on: the recovery of tokens 0..K, their state
    #: stored, the rest decoded), "verify" (``disable_state_update=True``: tokens 0..K only, with
    #: output), "scatter" (with ``ssm_state_indices``: tokens 0..K only, each state to its slot)
    accepted: str | None = None
    #: ``recovery_steps = T // 2``
    recovery: bool = False
    #: FlashInfer serves the form from this B * HV (0: at every batch)
    min_work_units: int = 0
    #: what FlashInfer does not serve of the form, and why
    note: str = ""

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dtype for dtype, _ in self.entries)

    def entry(self, state_dtype: str) -> str:
        return dict(self.entries)[state_dtype]


_PRETRANSPOSE_BOTH = (("bf16", PRETRANSPOSE), ("fp32", PRETRANSPOSE))
_BF16_ONLY_NOTE = (
    "bf16 state only: only FlashInfer's bf16-state module has this form (its public "
    "gated_delta_rule_mtp takes fp32 state and has no accepted_steps or recovery_steps)"
)

FORMS: dict[str, Form] = {
    form.name: form
    for form in (
        Form(
            "scatter",
            "per-token scatter: `ssm_state_indices [B, T]` beside `initial_state_indices [B]`, "
            "the state after token t to its own slot, no final write",
            entries=(("bf16", BF16_MTP), ("fp32", MTP)),
            scatter=True,
            note="FlashInfer's public gated_delta_rule_mtp takes fp32 state only; its bf16 "
            "kernel takes ssm_state_indices only through the bf16-state module",
        ),
        Form(
            "strided",
            "strided pool, T = 1: the pool a view of a larger buffer (every other head of "
            "2*HV, a spare row per head, a spare 16-byte vector per row)",
            entries=_PRETRANSPOSE_BOTH,
            one_token=True,
            strided=True,
        ),
        Form(
            "strided_scatter",
            "strided pool with the per-token scatter",
            entries=(("bf16", BF16_MTP),),
            strided=True,
            scatter=True,
            note="no fp32: FlashInfer's fp32 per-token scatter addresses the pool as a dense "
            "[slots * HV, V, K] view, which a strided pool is not",
        ),
        Form(
            "negative_writes",
            "separate write slots `output_state_indices [B]`, some -1: the row computed, no "
            "state stored, T = 1",
            entries=_PRETRANSPOSE_BOTH,
            one_token=True,
            negative_writes=True,
        ),
        Form(
            "pdl",
            "`enable_pdl=True`, T = 1",
            entries=_PRETRANSPOSE_BOTH,
            one_token=True,
            pdl=True,
            note="FlashInfer 0.7.2's gated_delta_rule_decode_pretranspose has no enable_pdl: "
            "where its signature lacks the keyword it is called without it (the record's "
            "flashinfer_pdl says which)",
        ),
        Form(
            "accepted",
            "`accepted_steps [B]` = K with state updates: tokens 0..K update the state only, "
            "the state after token K stored, tokens K+1.. decoded from it with output, no "
            "final write",
            entries=(("bf16", BF16_MTP),),
            accepted="fused",
            min_work_units=WIDE_VEC_WORK_UNITS,
            note=f"{_BF16_ONLY_NOTE}; {_RECOVERY_NOTE}",
        ),
        Form(
            "recovery_steps",
            "`recovery_steps = R` (T // 2): R state-only tokens, the state after them stored, "
            "the rest decoded with output, no final write",
            entries=(("bf16", BF16_MTP),),
            recovery=True,
            min_work_units=WIDE_VEC_WORK_UNITS,
            note=f"{_BF16_ONLY_NOTE}; {_RECOVERY_NOTE}",
        ),
        Form(
            "accepted_verify",
            "`accepted_steps [B]` = K with `disable_state_update=True`: tokens 0..K with "
            "output, nothing stored, nothing past them",
            entries=(("bf16", BF16_MTP),),
            accepted="verify",
            note=_BF16_ONLY_NOTE,
        ),
        Form(
            "accepted_scatter",
            "`accepted_steps [B]` = K with `ssm_state_indices [B, T]`: tokens 0..K with output, "
            "each state to its slot, nothing past them",
            entries=(("bf16", BF16_MTP),),
            scatter=True,
            accepted="scatter",
            note=_BF16_ONLY_NOTE,
        ),
    )
}


@dataclass(frozen=True)
class FiCell:
    """One cell: ``batch`` rows of ``tokens`` tokens in ``form``, HV value heads."""

    form_name: str
    state_dtype: str
    HV: int
    tokens: int
    batch: int
    H: int = KEY_HEADS
    K: int = HEAD_DIM
    V: int = HEAD_DIM

    def __post_init__(self) -> None:
        if self.form_name not in FORMS:
            raise ValueError(f"form: expected one of {', '.join(FORMS)}; got {self.form_name!r}")
        form = self.form
        if self.state_dtype not in form.dtypes:
            raise ValueError(
                f"state_dtype: FlashInfer serves the form {form.name} with "
                f"{' and '.join(form.dtypes)} state; got {self.state_dtype!r}"
            )
        if form.one_token and self.tokens != 1:
            raise ValueError(f"tokens: the form {form.name} is T = 1; got {self.tokens}")
        if not form.one_token and not 2 <= self.tokens <= MAX_TOKENS:
            raise ValueError(
                f"tokens: expected T in 2..{MAX_TOKENS} for the form {form.name}; got "
                f"{self.tokens}"
            )
        if self.batch < 1:
            raise ValueError(f"batch: expected at least one row; got {self.batch}")
        if self.HV < self.H or self.HV % self.H:
            raise ValueError(f"HV: expected a multiple of H={self.H}; got {self.HV}")

    @property
    def form(self) -> Form:
        return FORMS[self.form_name]

    @property
    def group(self) -> tuple:
        """The cells that share one pool size: all batches of a form, state dtype, HV and T."""
        return (self.form_name, self.state_dtype, self.HV, self.tokens)

    @property
    def recovery_steps(self) -> int:
        return self.tokens // 2 if self.form.recovery else 0

    def padded_rows(self) -> list[int]:
        return [b for b in range(self.batch) if b % PADDED_EVERY == PADDED_AT]

    def slots_per_set(self) -> int:
        """The slots one input set takes: its read slots, its write slots (``negative_writes``)
        and its per-token slots (the scatter forms)."""
        B = self.batch
        return (
            B
            + (B if self.form.negative_writes else 0)
            + (B * self.tokens if self.form.scatter else 0)
        )

    def state_bytes(self) -> int:
        return self.HV * self.V * self.K * TORCH_DTYPES[self.state_dtype].itemsize

    def moved_bytes(self) -> int:
        """The bytes one call moves, about: each row's state read, the states it stores, and each
        token's 16-bit rows (q, k, v, a, b, the output)."""
        B, T, form = self.batch, self.tokens, self.form
        if form.accepted == "verify":
            stored = 0
        elif form.scatter:
            stored = B * T
        else:
            stored = B
        per_token = 2 * (2 * self.H * self.K + 2 * self.HV * self.V + 2 * self.HV)
        return (B + stored) * self.state_bytes() + B * T * per_token

    def flashinfer_refuses(self) -> str | None:
        """Why FlashInfer does not serve this cell, or None."""
        work_units = self.batch * self.HV
        if work_units < self.form.min_work_units:
            return f"{_RECOVERY_NOTE} (here B*HV = {work_units})"
        return None

    def record(self) -> dict:
        """The cell's fields, as its record starts."""
        record = dict(
            form=self.form_name, state_dtype=self.state_dtype, HV=self.HV, tokens=self.tokens,
            batch=self.batch, H=self.H, K=self.K, V=self.V, padded_rows=len(self.padded_rows()),
        )  # fmt: skip
        if self.form.recovery:
            record["recovery_steps"] = self.recovery_steps
        return record


def cell_grid(forms, dtypes, heads, tokens, batches) -> list[FiCell]:
    """The cells in the order they run: form, state dtype, HV, T, batch. A form takes the state
    dtypes FlashInfer serves it with (of ``dtypes``), and T = 1 or the ``tokens``."""
    cells = []
    for name in forms:
        if name not in FORMS:
            raise ValueError(f"--forms: expected names of {', '.join(FORMS)}; got {name!r}")
        form = FORMS[name]
        form_tokens = (1,) if form.one_token else tokens
        served = [dtype for dtype in dtypes if dtype in form.dtypes]
        for dtype, HV, T, batch in itertools.product(served, heads, form_tokens, batches):
            cells.append(FiCell(name, dtype, HV, T, batch))
    return cells


def spare_slots(used: int) -> int:
    return used // 8 + 2


def pool_slots(cells: list[FiCell], sets_for) -> dict[tuple, int]:
    """The pool size of each group of cells (``FiCell.group``): the null slot, the slots of the
    cell of the group whose sets take the most (``sets_for(cell)`` sets of
    ``cell.slots_per_set()``), and spare slots."""
    used: dict[tuple, int] = {}
    for cell in cells:
        used[cell.group] = max(used.get(cell.group, 0), sets_for(cell) * cell.slots_per_set())
    return {group: 1 + n + spare_slots(n) for group, n in used.items()}


def parameters(cell: FiCell, device, seed: int = 0) -> dict:
    """The layer's weights, shared by every input set of a cell: ``A_log``, ``dt_bias`` (fp32)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return dict(
        A_log=torch.log(torch.rand(cell.HV, generator=gen, device=device) * 15 + 1),
        dt_bias=torch.randn(cell.HV, generator=gen, device=device) * 0.5,
    )


def state_buffer(cell: FiCell, slots: int, gen: torch.Generator, device) -> torch.Tensor:
    """The memory of a cell's pool, drawn from ``gen``: the pool itself, or for a strided form the
    larger buffer :func:`pool_view` takes it from."""
    dtype = TORCH_DTYPES[cell.state_dtype]
    if cell.form.strided:
        vector = 16 // dtype.itemsize
        shape = (slots, 2 * cell.HV, cell.V + 1, cell.K + vector)
    else:
        shape = (slots, cell.HV, cell.V, cell.K)
    return torch.empty(shape, dtype=dtype, device=device).normal_(0, 0.5, generator=gen)


def pool_view(cell: FiCell, buffer: torch.Tensor) -> torch.Tensor:
    """The ``[slots, HV, V, K]`` pool in ``buffer`` (``state_buffer``'s, or a copy of it)."""
    if cell.form.strided:
        return buffer[:, ::2, : cell.V, : cell.K]
    return buffer


def outside_views(cell: FiCell, buffer: torch.Tensor) -> list[torch.Tensor]:
    """The parts of ``buffer`` outside the pool's view: the odd heads, each head's spare row, each
    row's spare vector (none for a dense pool)."""
    if not cell.form.strided:
        return []
    V, K = cell.V, cell.K
    return [buffer[:, 1::2], buffer[:, ::2, V:], buffer[:, ::2, :V, K:]]


def cell_sets(cell: FiCell, count: int, slots: int, device, seed: int = 0) -> list[dict]:
    """``count`` input sets of ``cell`` on one pool of ``slots`` slots, each set on slots of its
    own. A set: q, k, v, a, b, the weights, ``scale``, ``buffer`` and ``pool`` (shared), ``reads``
    [B], ``writes`` [B] or None, ``scatter`` [B, T] or None, ``accepted`` [B] or None (int32),
    and ``out`` [B, T, HV, V] (bf16)."""
    need = count * cell.slots_per_set()
    if need > slots - 1:
        raise ValueError(
            f"slots: {count} sets of {cell.slots_per_set()} slots need {need} besides the null "
            f"slot; got a pool of {slots}"
        )
    gen = torch.Generator(device=device).manual_seed(1000 + seed)
    params = parameters(cell, device, seed)
    buffer = state_buffer(cell, slots, gen, device)
    pool = pool_view(cell, buffer)
    free = torch.randperm(slots - 1, generator=gen, device=device) + 1
    per_set = cell.slots_per_set()
    return [
        _one_set(cell, params, buffer, pool, free[i * per_set : (i + 1) * per_set], i, gen, device)
        for i in range(count)
    ]


def _one_set(cell: FiCell, params: dict, buffer, pool, slots, index: int, gen, device) -> dict:
    B, T, H, HV, K, V = cell.batch, cell.tokens, cell.H, cell.HV, cell.K, cell.V
    form = cell.form

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * std).to(torch.bfloat16)

    rows = torch.arange(B, device=device)
    padded = rows % PADDED_EVERY == PADDED_AT
    reads = slots[:B].clone()
    reads[padded] = -1
    taken = B
    writes = scatter = accepted = None
    if form.negative_writes:
        writes = slots[taken : taken + B].clone()
        writes[padded | (rows % NEGATIVE_EVERY == NEGATIVE_AT)] = -1
        taken += B
    if form.scatter:
        scatter = slots[taken : taken + B * T].view(B, T).clone()
        scatter[padded] = NULL_SLOT
    if form.accepted:
        accepted = (rows + index) % T
    int32 = lambda t: None if t is None else t.to(torch.int32)  # noqa: E731
    return dict(
        q=randn(B, T, H, K),
        k=randn(B, T, H, K),
        v=randn(B, T, HV, V),
        a=randn(B, T, HV, std=2.0),
        b=randn(B, T, HV, std=2.0),
        A_log=params["A_log"],
        dt_bias=params["dt_bias"],
        scale=K**-0.5,
        buffer=buffer,
        pool=pool,
        reads=int32(reads),
        writes=int32(writes),
        scatter=int32(scatter),
        accepted=int32(accepted),
        out=torch.empty(B, T, HV, V, dtype=torch.bfloat16, device=device),
    )


def written_slots(cell: FiCell, s: dict) -> torch.Tensor:
    """The slots a call on set ``s`` stores states in, sorted (the null slot aside): each live
    row's per-token slots (up to its accepted step), its write slots that are not -1, or its read
    slots; none for ``accepted_verify``."""
    live = s["reads"] >= 0
    if s["scatter"] is not None:
        stored = live[:, None].expand_as(s["scatter"])
        if cell.form.accepted:
            steps = torch.arange(cell.tokens, device=live.device)
            stored = stored & (steps[None] <= s["accepted"][:, None])
        slots = s["scatter"][stored]
    elif cell.form.accepted == "verify":
        slots = s["reads"][:0]
    elif s["writes"] is not None:
        slots = s["writes"][live & (s["writes"] >= 0)]
    else:
        slots = s["reads"][live]
    return slots.long().sort().values


def defined_outputs(cell: FiCell, s: dict) -> torch.Tensor:
    """[B, T] bool: the outputs the form defines on both sides, those compared. Padded rows' are
    not (gdngen writes zeros, FlashInfer's bf16 kernels compute them on the null slot), nor the
    state-only tokens of the recovery forms, nor the tokens past an accepted step."""
    B, T = cell.batch, cell.tokens
    steps = torch.arange(T, device=s["reads"].device)[None].expand(B, T)
    form = cell.form
    if form.accepted == "fused":
        tokens = steps > s["accepted"][:, None]
    elif form.accepted:
        tokens = steps <= s["accepted"][:, None]
    elif form.recovery:
        tokens = steps >= cell.recovery_steps
    else:
        tokens = torch.ones_like(steps, dtype=torch.bool)
    return (s["reads"] >= 0)[:, None] & tokens


def gdngen_arguments(cell: FiCell, s: dict) -> dict:
    """gdn_decode's keywords for the form on set ``s`` (FlashInfer's names, as a caller of
    FlashInfer passes them)."""
    args = dict(
        q=s["q"], k=s["k"], v=s["v"], state=None, A_log=s["A_log"], a=s["a"],
        dt_bias=s["dt_bias"], b=s["b"], scale=s["scale"], output=s["out"],
        initial_state=s["pool"], initial_state_indices=s["reads"],
    )  # fmt: skip
    if s["writes"] is not None:
        args["output_state_indices"] = s["writes"]
    if s["scatter"] is not None:
        args["ssm_state_indices"] = s["scatter"]
    if s["accepted"] is not None:
        args["accepted_steps"] = s["accepted"]
    if cell.form.accepted == "verify":
        args["disable_state_update"] = True
    if cell.recovery_steps:
        args["recovery_steps"] = cell.recovery_steps
    if cell.form.pdl:
        args["enable_pdl"] = True
    return args
