"""Which kernels a deployment can need: the compile keys of every call form, geometry and token
count, for every variant the dispatch can pick at some batch size. ``gdngen build`` compiles
them ahead of time and ``warmup`` loads them (docs/design.md, "Architecture")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from gdngen.dispatch import CallShape, Rule, batch_heads_points, select

from gdngen.terms import conv_step_name, norm_step_name

from .compile import CompileKey
from .conv_step import conv_step_key, without_prologue
from .norm_step import norm_step_key, without_norm


def reachable_rules(
    table: Sequence[Rule],
    layout: str,
    state_dtype: str,
    tokens: int,
    intermediate: bool,
    head_dims: tuple[int, int],
    heads: int | None = None,
    packed: bool = False,
    per_token_slots: bool = False,
    gated_norm: bool = False,
    conv1d: bool = False,
    separate_writes: bool = False,
) -> list[Rule]:
    """Every rule the first-match dispatch picks for some batch*heads at these head dims (K, V)
    and value heads (None: rules for any HV only), in a call of this form (packed tokens, a
    per-token slot table, the fused steps, write slots apart from the read ones), in table
    order. The choice only changes where a
    rule's batch*heads range starts or ends, so those points (tried with the one selector) find
    them all."""
    found: dict[Rule, None] = {}
    for batch_heads in batch_heads_points(table):
        shape = CallShape(
            layout, state_dtype, tokens, batch_heads, intermediate, head_dims, gated_norm,
            conv1d, heads, packed, per_token_slots, separate_writes,
        )  # fmt: skip
        rule = select(table, shape)
        if rule is not None:
            found[rule] = None
    return list(found)


def reachable_variants(*args, **kwargs) -> list[str]:
    """The variants of :func:`reachable_rules`, without repeats, in table order."""
    return list(dict.fromkeys(rule.use for rule in reachable_rules(*args, **kwargs)))


#: what each mode of a Form stores (docs/design.md, "Call forms"): "update" writes the final
#: state; "verify" caches every token's state in a positional buffer [B, steps, ...] and writes
#: no final state; "spec" writes every token's state into the pool slots of a per-token table
#: [N, 1 + S] read at num_accepted_tokens (vLLM); "verify_rows" caches them in the buffer rows
#: that intermediate_state_indices names, no final write (SGLang). All but "update" need T >= 2.
MODES = ("update", "verify", "spec", "verify_rows")


@dataclass(frozen=True)
class Form:
    """One compile-time call form (everything of a CompileKey but the variant, T and geometry)."""

    mode: str
    index_dtype: str | None
    separate_write_slots: bool = False
    io_dtype: str = "bf16"
    gate_dtype: str = "bf16"
    dt_bias_dtype: str = "fp32"
    use_qk_l2norm: bool = True
    #: tokens packed with cu_seqlens (of the index dtype, int32 without slots)
    packed: bool = False
    null_slot: int = -1
    #: packed rows placed at n * T (the call's uniform_seqlen promise), a per-token table of
    #: exactly T columns (its shape): CompileKey's uniform_rows and exact_slot_table
    uniform_rows: bool = False
    exact_slot_table: bool = False
    #: the fused steps (docs/design.md, "The fused decode core"): the gated RMSNorm epilogue
    #: (its gate activation and weight dtype), and the conv1d prologue's width (None: without
    #: it), bias and activation; a conv1d call's split plan adds the conv step's key
    norm_activation: str | None = None
    norm_weight_dtype: str = "bf16"
    conv_width: int | None = None
    conv_bias: bool = True
    conv_activation: str = "silu"
    #: programmatic dependent launch as the calls pass ``enable_pdl`` (None: unset, so each
    #: rule's ``pdl``)
    pdl: bool | None = None

    @property
    def stores_token_states(self) -> bool:
        return self.mode != "update"

    @property
    def gated_norm(self) -> bool:
        """Whether the form's calls take the fused-core rules (the norm, the conv, or both)."""
        return self.norm_activation is not None or self.conv_width is not None

    def keys(self, rule: Rule, arch: str, tokens: int, geometry, state_dtype: str):
        """The keys a call of this form compiles to under ``rule``: the rule's variant's, and on
        a split plan its steps' (the conv step for either conv state, moved in vectors or not;
        the norm step) and the variant's without what they do."""
        pdl = rule.pdl if self.pdl is None else self.pdl
        key = self.key(rule.use, arch, tokens, geometry, state_dtype, pdl)
        keys, kernel_key = [], key
        if rule.split_conv and self.conv_width is not None:
            step = conv_step_name(arch)
            keys += [conv_step_key(key, step, channels_last) for channels_last in (True, False)]
            kernel_key = without_prologue(kernel_key)
        if rule.split_norm and self.norm_activation is not None:
            keys.append(norm_step_key(key, norm_step_name(arch)))
            kernel_key = without_norm(kernel_key)
        return keys + [kernel_key]

    @property
    def separate_writes(self) -> bool:
        """Its calls write other slots than they read (a dispatch condition, CallShape's)."""
        return self.separate_write_slots and self.index_dtype is not None and self.mode != "spec"

    def key(
        self, variant: str, arch: str, tokens: int, geometry, state_dtype: str, pdl: bool = True
    ) -> CompileKey:
        slotted = self.index_dtype is not None
        return CompileKey(
            variant=variant, arch=arch, tokens=tokens, H=geometry.H, HV=geometry.HV,
            K=geometry.K, V=geometry.V, io_dtype=self.io_dtype, gate_dtype=self.gate_dtype,
            dt_bias_dtype=self.dt_bias_dtype, state_dtype=state_dtype,
            index_dtype=self.index_dtype,
            separate_write_slots=self.separate_writes,
            cache=self.mode in ("verify", "verify_rows"), write_final_state=self.mode == "update",
            use_qk_l2norm=self.use_qk_l2norm, null_slot=self.null_slot if slotted else -1,
            cu_seqlens_dtype=(self.index_dtype or "int32") if self.packed else None,
            per_token_slots=self.mode == "spec", num_accepted=self.mode == "spec",
            cache_rows=self.mode == "verify_rows",
            uniform_rows=self.packed and self.uniform_rows,
            exact_slot_table=self.mode == "spec" and self.exact_slot_table,
            norm_activation=self.norm_activation,
            norm_weight_dtype=None if self.norm_activation is None else self.norm_weight_dtype,
            conv_width=self.conv_width, conv_bias=self.conv_width is not None and self.conv_bias,
            conv_activation=None if self.conv_width is None else self.conv_activation,
            pdl=pdl,
        )  # fmt: skip


def key_mode(key: CompileKey) -> str:
    """The MODES entry a compile key was made for."""
    if key.per_token_slots:
        return "spec"
    if key.cache:
        return "verify_rows" if key.cache_rows else "verify"
    return "update"


def compile_keys(
    tables: Sequence[Sequence[Rule]],
    *,
    arch: str,
    geometries: Iterable,
    pairs: Iterable[tuple[str, str]],
    max_tokens: int,
    forms: Iterable[Form],
) -> list[CompileKey]:
    """Every key a call of these forms can compile to under any of these dispatch tables (a
    target's default table and its GPU models' tables), without repeats, in a fixed order."""
    keys: dict[CompileKey, None] = {}
    forms, geometries, pairs = list(forms), list(geometries), list(pairs)
    for table in tables:
        for geometry in geometries:
            for layout, state_dtype in pairs:
                for tokens in range(1, max_tokens + 1):
                    for form in forms:
                        if form.stores_token_states and tokens == 1:
                            continue
                        if form.mode in ("spec", "verify_rows") and form.index_dtype is None:
                            continue  # these name slots or rows: no dense-state form
                        intermediate = form.stores_token_states
                        for rule in reachable_rules(
                            table, layout, state_dtype, tokens, intermediate,
                            (geometry.K, geometry.V), geometry.HV, form.packed,
                            form.mode == "spec", form.gated_norm, form.conv_width is not None,
                            form.separate_writes,
                        ):  # fmt: skip
                            for key in form.keys(rule, arch, tokens, geometry, state_dtype):
                                keys[key] = None
    return list(keys)


def spec_forms(build) -> list[Form]:
    """The forms a spec's ``build:`` section declares (gdngen.spec.model.CallForms)."""
    return [
        Form(
            mode=mode, index_dtype=None if slots == "none" else slots,
            separate_write_slots=build.separate_write_slots, io_dtype=build.io_dtype,
            gate_dtype=build.gate_dtype, dt_bias_dtype=build.dt_bias_dtype,
            use_qk_l2norm=build.use_qk_l2norm, packed=packed, null_slot=null_slot,
            uniform_rows=uniform, exact_slot_table=exact,
            norm_activation=None if fused == "none" else build.norm_activation,
            conv_width=build.conv_width if fused == "core" else None, pdl=pdl,
        )  # fmt: skip
        for pdl in build.pdl
        for fused in build.fused
        for mode in build.modes
        for slots in build.slots
        for packed in build.packed
        for null_slot in build.null_slots
        # a packed call's kernel depends on whether its caller promises uniform rows, a spec
        # call's on whether its slot table is exactly T wide: both kinds are built
        for uniform in ((False, True) if packed else (False,))
        for exact in ((False, True) if mode == "spec" and slots != "none" else (False,))
    ]
