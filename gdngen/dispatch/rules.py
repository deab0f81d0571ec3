"""Dispatch rules and the one matcher: the first rule whose conditions all hold wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gdngen.terms import Intermediate, Layout, StateDtype


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Range(_Strict):
    """Inclusive integer range; ``hi: None`` means unbounded.

    In YAML: ``3`` (just 3), ``[2, 8]``, ``[257, null]`` or ``{lo: 2, hi: 8}``.
    """

    lo: int = Field(ge=1)
    hi: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: object) -> object:
        if isinstance(data, bool):
            return data
        if isinstance(data, int):
            return {"lo": data, "hi": data}
        if isinstance(data, (list, tuple)):
            if len(data) != 2:
                raise ValueError(f"a range is [lo, hi]; got {list(data)}")
            return {"lo": data[0], "hi": data[1]}
        return data

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if self.hi is not None and self.hi < self.lo:
            raise ValueError(f"empty range: lo={self.lo} > hi={self.hi}")
        return self

    def contains(self, value: int) -> bool:
        return self.lo <= value and (self.hi is None or value <= self.hi)


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

    def describe(self) -> str:
        return (
            f"layout={self.layout} state_dtype={self.state_dtype} tokens={self.tokens} "
            f"batch_heads={self.batch_heads} intermediate={'yes' if self.intermediate else 'no'} "
            f"head_dims=K{self.head_dims[0]}xV{self.head_dims[1]}"
            + (" gated_norm=yes" if self.gated_norm else "")
            + (" conv1d=yes" if self.conv1d else "")
            + (f" HV={self.heads}" if self.heads is not None else "")
        )


#: (gated_norm, conv1d) of the calls a dispatch routes: see CallShape
Fusion = tuple[bool, bool]
#: the calls without any fused step
UNFUSED: tuple[Fusion, ...] = ((False, False),)


class Rule(_Strict):
    """Conditions on a call, and the variant that serves it.

    ``source`` says where the rule came from (a spec rule, or the measurements that chose it);
    a spec's own rules leave it empty.
    """

    layout: Layout
    state_dtype: StateDtype
    tokens: Range
    batch_heads: Range
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
    heads: Range | None = None
    use: str
    source: str = ""

    def serves(self, shape: CallShape) -> bool:
        return (
            self.layout == shape.layout
            and self.state_dtype == shape.state_dtype
            and self.tokens.contains(shape.tokens)
            and self.batch_heads.contains(shape.batch_heads)
            and self.intermediate in ("any", "yes" if shape.intermediate else "no")
            and self.head_dims in (None, shape.head_dims)
            and self.gated_norm in (None, shape.gated_norm)
            and self.conv1d in (None, shape.conv1d)
            and (
                self.heads is None or (shape.heads is not None and self.heads.contains(shape.heads))
            )
        )


def select(rules: Iterable[Rule], shape: CallShape) -> Rule | None:
    """The first rule that serves ``shape``; None if none does."""
    for rule in rules:
        if rule.serves(shape):
            return rule
    return None


def heads_points(rules: Iterable[Rule]) -> list[int]:
    """The HVs where a rule for some value heads starts or ends: between them (and for a call of
    unknown HV) the rules that name no HV decide."""
    named = [r.heads for r in rules if r.heads is not None]
    return sorted({h.lo for h in named} | {h.hi + 1 for h in named if h.hi is not None})


def boundary_shapes(
    rules: Sequence[Rule],
    pairs: Iterable[tuple[str, str]],
    head_dims: Iterable[tuple[int, int]],
    max_tokens: int,
    fusions: Iterable[Fusion] = UNFUSED,
) -> Iterator[CallShape]:
    """One call shape per distinct first-match outcome of ``rules``: every served (layout, dtype)
    pair and head dims, T in 1..max_tokens, with and without intermediate states, with each of
    ``fusions`` ((gated_norm, conv1d) pairs), at each batch*heads where some rule starts or
    ends (between those points the choice cannot change), for any HV and at each HV where a rule
    for some HV starts or ends."""
    starts = sorted(
        {1}
        | {r.batch_heads.lo for r in rules}
        | {r.batch_heads.hi + 1 for r in rules if r.batch_heads.hi is not None}
    )
    heads = [None, *heads_points(rules)]
    dims = list(head_dims)
    fusions = list(fusions)
    for layout, state_dtype in pairs:
        for head in dims:
            for norm, conv in fusions:
                for tokens in range(1, max_tokens + 1):
                    for intermediate in (False, True):
                        for batch_heads in starts:
                            for hv in heads:
                                yield CallShape(
                                    layout, state_dtype, tokens, batch_heads, intermediate, head,
                                    norm, conv, hv,
                                )  # fmt: skip


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
    for shape in boundary_shapes(rules, pairs, head_dims, max_tokens, fusions):
        if select(rules, shape) is None:
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
    shapes = boundary_shapes(rules, pairs, head_dims, max_tokens, fusions)
    hit = {id(select(rules, shape)) for shape in shapes}
    return [rule for rule in rules if id(rule) in hit]
