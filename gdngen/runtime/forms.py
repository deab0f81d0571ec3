"""Which kernels a deployment can need: the compile keys of every call form, geometry and token
count, for every variant the dispatch can pick at some batch size. ``gdngen build`` compiles
them ahead of time and ``warmup`` loads them (docs/design.md, "Architecture")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from gdngen.dispatch import CallShape, Rule, select

from .compile import CompileKey


def reachable_variants(
    table: Sequence[Rule], layout: str, state_dtype: str, tokens: int, intermediate: bool
) -> list[str]:
    """Every variant the first-match dispatch picks for some batch*heads, in table order. The
    choice only changes where a rule's batch*heads range starts or ends, so those points (tried
    with the one selector) find them all."""
    points = sorted(
        {1}
        | {r.batch_heads.lo for r in table}
        | {r.batch_heads.hi + 1 for r in table if r.batch_heads.hi is not None}
    )
    found: dict[str, None] = {}
    for batch_heads in points:
        rule = select(table, CallShape(layout, state_dtype, tokens, batch_heads, intermediate))
        if rule is not None:
            found[rule.use] = None
    return list(found)


@dataclass(frozen=True)
class Form:
    """One compile-time call form (everything of a CompileKey but the variant, T and geometry)."""

    mode: str  # "update" (final state written) or "verify" (per-token states, no final write)
    index_dtype: str | None
    separate_write_slots: bool = False
    io_dtype: str = "bf16"
    gate_dtype: str = "bf16"
    dt_bias_dtype: str = "fp32"
    use_qk_l2norm: bool = True


def compile_keys(
    table: Sequence[Rule],
    *,
    arch: str,
    geometries: Iterable,
    pairs: Iterable[tuple[str, str]],
    max_tokens: int,
    forms: Iterable[Form],
) -> list[CompileKey]:
    """Every key a call of these forms can compile to, without repeats, in a fixed order."""
    keys: dict[CompileKey, None] = {}
    forms = list(forms)
    for geometry in geometries:
        for layout, state_dtype in pairs:
            for tokens in range(1, max_tokens + 1):
                for form in forms:
                    verify = form.mode == "verify"
                    if verify and tokens == 1:
                        continue
                    for variant in reachable_variants(table, layout, state_dtype, tokens, verify):
                        key = CompileKey(
                            variant=variant, arch=arch, tokens=tokens, H=geometry.H,
                            HV=geometry.HV, K=geometry.K, V=geometry.V, io_dtype=form.io_dtype,
                            gate_dtype=form.gate_dtype, dt_bias_dtype=form.dt_bias_dtype,
                            state_dtype=state_dtype, index_dtype=form.index_dtype,
                            separate_write_slots=(
                                form.separate_write_slots and form.index_dtype is not None
                            ),
                            cache=verify, write_final_state=not verify,
                            use_qk_l2norm=form.use_qk_l2norm,
                        )  # fmt: skip
                        keys[key] = None
    return list(keys)


def spec_forms(build) -> list[Form]:
    """The forms a spec's ``build:`` section declares (gdngen.spec.model.CallForms)."""
    return [
        Form(
            mode=mode, index_dtype=None if slots == "none" else slots,
            separate_write_slots=build.separate_write_slots, io_dtype=build.io_dtype,
            gate_dtype=build.gate_dtype, dt_bias_dtype=build.dt_bias_dtype,
            use_qk_l2norm=build.use_qk_l2norm,
        )  # fmt: skip
        for mode in build.modes
        for slots in build.slots
    ]
