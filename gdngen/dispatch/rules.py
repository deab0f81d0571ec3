"""Dispatch rules and the one matcher: the first rule whose conditions all hold wins.

Rules and ranges are plain records, so that a generated dispatch table imports nothing heavy; a
spec's ``dispatch:`` section is validated as these records by pydantic (their field types, no
unknown keys, the checks of ``__post_init__``, and the range shorthand of :class:`SpecRange`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from itertools import product
from typing import Annotated, Iterable, Iterator, Sequence

from gdngen.terms import Intermediate, Layout, StateDtype

#: read by pydantic where a spec holds these records: a key that is no field is an error
_NO_UNKNOWN_KEYS = {"extra": "forbid"}


@dataclass(frozen=True)
class Range:
    """Inclusive integer range; ``hi: None`` means unbounded.

    In YAML: ``3`` (just 3), ``[2, 8]``, ``[257, null]`` or ``{lo: 2, hi: 8}``.
    """

    __pydantic_config__ = _NO_UNKNOWN_KEYS

    lo: int
    hi: int | None = None

    def __post_init__(self) -> None:
        if self.lo < 1:
            raise ValueError(f"a range starts at 1 or above; got lo={self.lo}")
        if self.hi is not None and self.hi < self.lo:
            raise ValueError(f"empty range: lo={self.lo} > hi={self.hi}")

    def contains(self, value: int) -> bool:
        return self.lo <= value and (self.hi is None or value <= self.hi)


def _range_fields(data: object) -> object:
    """A range as YAML may write it (``3``, ``[2, 8]``), as the fields of a :class:`Range`."""
    if isinstance(data, bool):
        return data
    if isinstance(data, int):
        return {"lo": data, "hi": data}
    if isinstance(data, (list, tuple)):
        if len(data) != 2:
            raise ValueError(f"a range is [lo, hi]; got {list(data)}")
        return {"lo": data[0], "hi": data[1]}
    return data


class _RangeShorthand:
    """Lets a spec write a range field in the shorthand (:func:`_range_fields`). pydantic calls
    the hook below while it builds the spec model's validator: only then is pydantic imported,
    and by the spec's own import, never by the dispatch tables'."""

    @staticmethod
    def __get_pydantic_core_schema__(source: object, handler):
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(_range_fields, handler(source))


#: a range field of a rule, which a spec may write in the shorthand
SpecRange = Annotated[Range, _RangeShorthand()]


@dataclass(frozen=True)
class CallShape:
    """What dispatch looks at in a call."""

    layout: str
    state_dtype: str
    tokens: int
    #: batch size times value heads (B * HV)
    batch_heads: int
    #: whether the call caches per-token states (speculative verify)
    intermediate: bool
    #: the geometry's head dims (K, V)
    head_dims: tuple[int, int]
    #: whether the call fuses the gated RMSNorm epilogue (z and norm_weight given), or any step
    #: of the decode core: the kernels that serve either are the same (see Call.fused)
    gated_norm: bool = False
    #: whether the call fuses the conv1d prologue (then gated_norm is true as well)
    conv1d: bool = False
    #: the geometry's value heads (HV); None where unknown, and then only rules for any HV serve
    heads: int | None = None
    #: whether the tokens come packed along one dimension with cu_seqlens (vLLM's forms)
    packed: bool = False
    #: whether the state slots come from a per-token [N, 1 + S] table (vLLM's spec decode)
    per_token_slots: bool = False
    #: whether the states are written to other slots than the ones read (FlashInfer's
    #: output_state_indices, or its per-token scatter ssm_state_indices)
    separate_writes: bool = False
    #: whether the state pool is a strided view of a larger buffer (FlashInfer's strided pools)
    strided_state: bool = False

    @property
    def kind(self) -> tuple:
        """What kind of call it is: every field but its sizes (T, batch*heads, HV). Whether a
        rule serves a call of one kind is settled by :meth:`Rule.serves_size` alone."""
        return (
            self.layout, self.state_dtype, self.intermediate, self.head_dims, self.gated_norm,
            self.conv1d, self.packed, self.per_token_slots, self.separate_writes,
            self.strided_state,
        )  # fmt: skip

    def describe(self) -> str:
        return (
            f"layout={self.layout} state_dtype={self.state_dtype} tokens={self.tokens} "
            f"batch_heads={self.batch_heads} intermediate={'yes' if self.intermediate else 'no'} "
            f"head_dims=K{self.head_dims[0]}xV{self.head_dims[1]}"
            + (" gated_norm=yes" if self.gated_norm else "")
            + (" conv1d=yes" if self.conv1d else "")
            + (f" HV={self.heads}" if self.heads is not None else "")
            + (" packed=yes" if self.packed else "")
            + (" per_token_slots=yes" if self.per_token_slots else "")
            + (" separate_writes=yes" if self.separate_writes else "")
            + (" strided_state=yes" if self.strided_state else "")
        )


#: (gated_norm, conv1d) of the calls a dispatch routes: see CallShape
Fusion = tuple[bool, bool]
#: the calls without any fused step
UNFUSED: tuple[Fusion, ...] = ((False, False),)
#: (packed, per_token_slots) of a call (see CallShape)
CallForm = tuple[bool, bool]
#: every call form: dense rows, packed tokens, a per-token slot table, both
CALL_FORMS: tuple[CallForm, ...] = ((False, False), (True, False), (False, True), (True, True))


#: how the ``source`` of a rule from a tuning file's cells starts
#: (gdngen.dispatch.measured.tuned_ref)
MEASURED_SOURCE = "t:"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Conditions on a call, and the variant that serves it.

    ``source`` says where an emitted table's rule came from: ``spec[i]``, the spec's dispatch
    rule i, or the measured points that chose it (gdngen.dispatch.measured.tuned_ref); a spec's
    own rules leave it empty.
    """

    __pydantic_config__ = _NO_UNKNOWN_KEYS

    layout: Layout
    state_dtype: StateDtype
    tokens: SpecRange
    batch_heads: SpecRange
    intermediate: Intermediate = "any"
    #: the head dims (K, V) the rule is for; None: any. In YAML ``head_dims: [64, 64]``. Measured
    #: rules always name the head dims they were measured at
    head_dims: tuple[int, int] | None = None
    #: whether the rule is for calls with the gated RMSNorm epilogue (true), without (false), or
    #: both (None). Measured rules are for calls without it: the tuning times the recurrence
    gated_norm: bool | None = None
    #: whether the rule is for calls with the conv1d prologue (true), without (false), or both
    #: (None); such calls also have ``gated_norm`` (their kernels are the same)
    conv1d: bool | None = None
    #: the value heads (HV) the rule is for; None: any. Measured rules name them only where cells
    #: of one batch*heads but different HV want different variants (gdngen.dispatch.measured)
    heads: SpecRange | None = None
    #: whether the rule is for calls with packed tokens (true), dense rows (false), or both
    #: (None). The tuning times dense rows, so rules that name a form are the spec's own
    packed: bool | None = None
    #: whether the rule is for calls with a per-token slot table (true), without (false), or both
    #: (None); such calls store every token's state (``intermediate: yes``)
    per_token_slots: bool | None = None
    #: the plan of the conv1d calls it serves (docs/design.md, "The conv1d step apart"): the
    #: conv as a kernel of its own, then ``use`` without the prologue (true), or the conv fused
    #: into ``use`` (false). True only in a rule for conv1d calls alone (``conv1d: true``)
    split_conv: bool = False
    use: str
    source: str = ""
    #: whether the calls it serves launch with programmatic dependent launch where the caller
    #: leaves ``enable_pdl`` unset (docs/design.md, "Programmatic dependent launch"): false
    #: where the PDL kernel measured slower. An emitted row names it only where it is false
    pdl: bool = True
    #: whether the rule is for calls that write other slots than they read (true), the same
    #: (false), or both (None): reads and writes of different slots stream through L2 apart, so
    #: they may want another variant (docs/perf/h100-2026-11-28-flashinfer-forms.md)
    separate_writes: bool | None = None
    #: whether the rule is for calls on a strided pool (true), a dense one (false), or both
    #: (None): a view's heads and rows lie apart, which may want another tile
    strided_state: bool | None = None
    #: the plan of the gated-norm calls it serves (docs/design.md, "The norm step apart"):
    #: ``use`` without the epilogue, then the norm as a kernel of its own (true), or the norm
    #: fused into ``use`` (false). True only in a rule for such calls alone
    #: (``gated_norm: true``); ``use`` then need not have the epilogue
    split_norm: bool = False

    def __post_init__(self) -> None:
        if self.split_conv and self.conv1d is not True:
            raise ValueError(
                "split_conv: a rule that splits the conv1d step off is for calls with the "
                f"prologue only (conv1d: true); got conv1d={self.conv1d}"
            )
        if self.split_norm and self.gated_norm is not True:
            raise ValueError(
                "split_norm: a rule that splits the gated RMSNorm off is for calls with the "
                f"epilogue only (gated_norm: true); got gated_norm={self.gated_norm}"
            )

    @property
    def measured(self) -> bool:
        """The rule comes from a tuning file's cells (:data:`MEASURED_SOURCE`)."""
        return self.source.startswith(MEASURED_SOURCE)

    @property
    def names_form(self) -> bool:
        """The rule holds a condition on the call's form (packed, per_token_slots)."""
        return (
            self.packed is not None
            or self.per_token_slots is not None
            or self.separate_writes is not None
            or self.strided_state is not None
        )

    def serves(self, shape: CallShape) -> bool:
        return self.serves_kind(shape) and self.serves_size(shape)

    def serves_kind(self, shape: CallShape) -> bool:
        """The rule's conditions on the kind of call (CallShape.kind)."""
        return (
            self.layout == shape.layout
            and self.state_dtype == shape.state_dtype
            and self.intermediate in ("any", "yes" if shape.intermediate else "no")
            and self.head_dims in (None, shape.head_dims)
            and self.gated_norm in (None, shape.gated_norm)
            and self.conv1d in (None, shape.conv1d)
            and self.packed in (None, shape.packed)
            and self.per_token_slots in (None, shape.per_token_slots)
            and self.separate_writes in (None, shape.separate_writes)
            and self.strided_state in (None, shape.strided_state)
        )

    def serves_size(self, shape: CallShape) -> bool:
        """The rule's conditions on the call's sizes: T, batch*heads and HV."""
        return (
            self.tokens.contains(shape.tokens)
            and self.batch_heads.contains(shape.batch_heads)
            and (
                self.heads is None or (shape.heads is not None and self.heads.contains(shape.heads))
            )
        )


def row(*values: object, **options: object) -> Rule:
    """The rule of one row of an emitted dispatch table (``generated/<target>/dispatch.py``): a
    value for each of the Rule's fields up to ``source``, in their order, a range as
    ``(lo, hi)``, a condition the rule leaves out as None; the fields after it (ROW_OPTIONS) by
    keyword, where the rule does not keep their defaults. One row per line keeps the table
    readable as a table, and a re-tune's diff to the rows it moves."""
    unknown = set(options) - set(ROW_OPTIONS)
    if unknown:
        raise TypeError(f"row: unexpected keyword(s) {sorted(unknown)}; takes {ROW_OPTIONS}")
    given = dict(zip(_RULE_FIELDS, values, strict=True), **options)
    for name in _RANGE_FIELDS:
        if given[name] is not None:
            given[name] = Range(*given[name])
    return Rule(**given)


#: the Rule fields a row takes by keyword, where they are not their defaults
ROW_OPTIONS = ("pdl", "separate_writes", "strided_state", "split_norm")
#: a Rule's fields a row takes in order (its columns), and those that hold a Range
_RULE_FIELDS = tuple(f.name for f in fields(Rule) if f.name not in ROW_OPTIONS)
_RANGE_FIELDS = ("tokens", "batch_heads", "heads")


def for_a_form(rule: Rule) -> bool:
    """The rule is for calls with the gated RMSNorm epilogue, or of a named call form: calls
    the plain tuning does not time (it times the recurrence alone, on dense rows)."""
    return bool(rule.gated_norm) or rule.names_form


def ahead_of_measured(rule: Rule) -> bool:
    """A static rule :func:`for_a_form`: such rules come before the measured rules for dense
    rows, in the order the spec gives them (the measured rules of a form, the tuning's decode
    core and per-token cells, go before them: gdngen.emit.plan.dispatch_rules)."""
    return not rule.measured and for_a_form(rule)


def table_order(rules: Sequence[Rule]) -> list[Rule]:
    """A spec's static rules in the order a dispatch table holds them: :func:`ahead_of_measured`
    rules first, then the others, each in spec order."""
    ahead = [rule for rule in rules if ahead_of_measured(rule)]
    return ahead + [rule for rule in rules if not ahead_of_measured(rule)]


def select(rules: Iterable[Rule], shape: CallShape) -> Rule | None:
    """The first rule that serves ``shape``; None if none does."""
    for rule in rules:
        if rule.serves(shape):
            return rule
    return None


class FirstMatch:
    """:func:`select` over one table, for many call shapes (emit's coverage and reach, the spec's
    checks): the same rule for every shape, with each kind of call's rules picked out of the
    table once, in table order, so a shape is held only against the rules of its kind."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)
        self._of_kind: dict[tuple, tuple[Rule, ...]] = {}

    def of_kind(self, shape: CallShape) -> tuple[Rule, ...]:
        """The rules that serve calls of ``shape``'s kind at some size, in table order."""
        rules = self._of_kind.get(shape.kind)
        if rules is None:
            rules = tuple(rule for rule in self.rules if rule.serves_kind(shape))
            self._of_kind[shape.kind] = rules
        return rules

    def __call__(self, shape: CallShape) -> Rule | None:
        for rule in self.of_kind(shape):
            if rule.serves_size(shape):
                return rule
        return None


def batch_heads_points(rules: Iterable[Rule]) -> list[int]:
    """1 and the batch*heads where one of ``rules`` starts or ends: between two of them (for
    fixed other sizes) the first match of these rules cannot change."""
    ranges = [r.batch_heads for r in rules]
    return sorted({1} | {b.lo for b in ranges} | {b.hi + 1 for b in ranges if b.hi is not None})


def heads_points(rules: Iterable[Rule]) -> list[int]:
    """The HVs where a rule for some value heads starts or ends: between them (and for a call of
    unknown HV) the rules that name no HV decide."""
    named = [r.heads for r in rules if r.heads is not None]
    return sorted({h.lo for h in named} | {h.hi + 1 for h in named if h.hi is not None})


def call_forms(rules: Iterable[Rule]) -> tuple[CallForm, ...]:
    """The call forms whose first matches can differ under ``rules``: dense rows alone where no
    rule names a form (then every form routes alike), else all of CALL_FORMS."""
    return CALL_FORMS if any(rule.names_form for rule in rules) else CALL_FORMS[:1]


#: the pool forms a rule may name (CallShape's and Rule's fields of these names)
POOL_FORMS = ("separate_writes", "strided_state")


def pool_forms(rules: Iterable[Rule]) -> list[dict[str, bool]]:
    """The combinations of the pool forms (POOL_FORMS) whose first matches can differ under
    ``rules``: each form both ways where some rule names it, else only off."""
    rules = list(rules)
    named = [form for form in POOL_FORMS if any(getattr(r, form) is not None for r in rules)]
    return [dict(zip(named, values)) for values in product((False, True), repeat=len(named))]


def boundary_shapes(
    rules: Sequence[Rule] | FirstMatch,
    pairs: Iterable[tuple[str, str]],
    head_dims: Iterable[tuple[int, int]],
    max_tokens: int,
    fusions: Iterable[Fusion] = UNFUSED,
) -> Iterator[CallShape]:
    """One call shape per distinct first-match outcome of ``rules``: every served (layout, dtype)
    pair and head dims, T in 1..max_tokens, with and without intermediate states, with each of
    ``fusions`` ((gated_norm, conv1d) pairs), in each call form (call_forms), at each batch*heads
    where a rule of that kind of call and T starts or ends (between those points the choice
    cannot change), for any HV and at each HV where such a rule for some HV starts or ends.
    Within each kind and T the shapes come in increasing batch*heads, then HV (None first), so
    the first shape with some property is the first point of the first stretch of calls that
    have it."""
    first_match = rules if isinstance(rules, FirstMatch) else FirstMatch(rules)
    dims = list(head_dims)
    fusions = list(fusions)
    forms = call_forms(first_match.rules)
    # each pool form both ways where a rule tells them apart
    pools = pool_forms(first_match.rules)
    for layout, state_dtype in pairs:
        for head in dims:
            for norm, conv in fusions:
                for tokens in range(1, max_tokens + 1):
                    for intermediate, (packed, per_token), pool in product(
                        (False, True), forms, pools
                    ):
                        if per_token and not intermediate:
                            continue  # a per-token table stores every token's state
                        shape = CallShape(
                            layout, state_dtype, tokens, 1, intermediate, head, norm, conv,
                            packed=packed, per_token_slots=per_token, **pool,
                        )  # fmt: skip
                        at_tokens = [
                            r for r in first_match.of_kind(shape) if r.tokens.contains(tokens)
                        ]
                        heads = [None, *heads_points(at_tokens)]
                        for batch_heads in batch_heads_points(at_tokens):
                            for hv in heads:
                                yield replace(shape, batch_heads=batch_heads, heads=hv)


def coverage_gap(
    rules: Sequence[Rule],
    pairs: Iterable[tuple[str, str]],
    head_dims: Iterable[tuple[int, int]],
    max_tokens: int,
    fusions: Iterable[Fusion] = UNFUSED,
) -> CallShape | None:
    """The first call shape of a served (layout, dtype) pair and head dims that no rule serves,
    or None when the rules cover every T in 1..max_tokens and every batch*heads, with and
    without intermediate states, at each of ``head_dims`` and ``fusions``."""
    first_match = FirstMatch(rules)
    for shape in boundary_shapes(first_match, pairs, head_dims, max_tokens, fusions):
        if first_match(shape) is None:
            return shape
    return None


def reached(
    rules: Sequence[Rule],
    pairs: Iterable[tuple[str, str]],
    head_dims: Iterable[tuple[int, int]],
    max_tokens: int,
    fusions: Iterable[Fusion] = UNFUSED,
) -> list[Rule]:
    """The rules that first-match serves some call of ``pairs`` at ``head_dims`` and ``fusions``
    (in table order): the others are shadowed by rules before them and can be left out."""
    return [rules[i] for i in reached_at(rules, pairs, head_dims, max_tokens, fusions)]


def reached_at(
    rules: Sequence[Rule],
    pairs: Iterable[tuple[str, str]],
    head_dims: Iterable[tuple[int, int]],
    max_tokens: int,
    fusions: Iterable[Fusion] = UNFUSED,
) -> list[int]:
    """The positions in ``rules`` of :func:`reached`'s rules: a rule the table holds twice is
    reached at its first place only (the second serves nothing the first does not)."""
    first_match = FirstMatch(rules)
    shapes = boundary_shapes(first_match, pairs, head_dims, max_tokens, fusions)
    hit = {id(first_match(shape)) for shape in shapes}
    seen: list[Rule] = []
    at = []
    for index, rule in enumerate(rules):
        if id(rule) in hit and rule not in seen:
            at.append(index)
        seen.append(rule)
    return at
