"""A kernel's code shape: which branches of the kernel templates a variant takes.

The spec's knobs (gdngen.spec.model.Variant) are what a person writes; this module holds what the
emitter decides from them about the code's structure. Two variants of one shape differ only in
their numbers (tile_v, ilp, vec, threads per group, ...), so they share one emitted body module,
``generated/<target>/bodies/<shape name>.py``, which takes those numbers as Python values at trace
time (docs/design.md, "Architecture"). The decisions that come from measurements say where.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdngen.spec.model import Variant
from gdngen.terms import LAYOUT_PREFIX, SCALED_STATE_DTYPES


def holds_state_behind_slot_table(variant: Variant) -> bool:
    """Whether a 16-bit state stays in its own dtype until its first use where its load waits for
    a per-token slot table (vLLM's spec form), as it does behind the conv1d prologue: in the
    stepwise solve with preloaded tokens, where the tokens' loads then go out before the state
    arrives, and at ILP 2 only. On an H100, held, the spec form of `tv8_ilp2_pre` ran 4-7% faster
    at B = 1, T = 2-3; that of `tv16_ilp4_pre` ran 3% slower at T = 4 (bf16) and 4-5% slower at
    T = 8 (fp16) (docs/design.md, "Call forms"; docs/perf/h100-2026-11-27-held-state.md)."""
    return variant.solve == "stepwise" and variant.preload_tokens and variant.ilp <= 2


def gates_in_token_loop_behind_slot_table(variant: Variant) -> bool:
    """Whether, behind a per-token slot table (vLLM's spec form), the preloading stepwise K-last
    kernels that convert the state as it is loaded (ILP > 2) compute each token's gates in the
    token loop instead of before it. Before it, ptxas placed the tokens' q, k and v loads behind
    the gates' arithmetic, which waits for the gates' loads, which went out after the state
    arrived; in the loop, every token's loads go out ahead of the state's (docs/design.md, "Call
    forms"; docs/perf/h100-2026-11-27-gates-in-loop.md)."""
    return (
        variant.solve == "stepwise"
        and variant.preload_tokens
        and variant.layout == "k_last"
        and not holds_state_behind_slot_table(variant)
    )


@dataclass(frozen=True)
class KernelShape:
    """The structure of a kernel's code: every branch the body template takes, and nothing else
    (no number), so that the body renders from the shape alone."""

    layout: str
    solve: str
    #: one lane per group (threads_per_group 1): no butterfly, a group is a lane
    one_lane_groups: bool
    #: K split over copies of the group layout, their sums added in shared memory (k_splits > 1)
    k_split: bool
    packed_fma: bool
    #: the state moves through copy atoms that carry cache operators (a non-default
    #: state_load_cache or state_store_cache)
    cache_ops: bool
    preload_tokens: bool
    #: the rows walked in passes (row_passes > 1); the staged solve's with prefetch or unrolled
    #: (the stepwise solve takes prefetch and async_tiles as numbers, PREFETCH and ASYNC_TILES)
    row_passes: bool
    prefetch: bool
    unroll_passes: bool
    #: :func:`holds_state_behind_slot_table`
    holds_state_behind_slot_table: bool
    #: :func:`gates_in_token_loop_behind_slot_table`
    gates_in_token_loop_behind_slot_table: bool
    #: the state is stored quantized with a scale per row (int8, fp8 e4m3: docs/design.md,
    #: "Quantized state"): dequantized at its first use, its rows' amax reduced and quantized as
    #: it is stored
    scaled_state: bool = False

    @classmethod
    def of(cls, variant: Variant) -> "KernelShape":
        return cls(
            layout=variant.layout,
            solve=variant.solve,
            one_lane_groups=variant.threads_per_group == 1,
            k_split=variant.k_splits > 1,
            packed_fma=variant.packed_fma,
            cache_ops=(
                variant.state_load_cache != "all" or variant.state_store_cache != "write_back"
            ),
            preload_tokens=variant.preload_tokens,
            row_passes=variant.row_passes > 1,
            prefetch=variant.prefetch and variant.solve == "staged",
            unroll_passes=variant.unroll_passes,
            holds_state_behind_slot_table=holds_state_behind_slot_table(variant),
            gates_in_token_loop_behind_slot_table=gates_in_token_loop_behind_slot_table(variant),
            scaled_state=variant.state_dtype in SCALED_STATE_DTYPES,
        )

    @property
    def numbers(self) -> tuple[tuple[str, str], ...]:
        """The numbers a body of this shape takes (its ``device_code``'s keywords) and their
        types: the knobs every shape has, then those of its branches."""
        return (
            (("TILE_V", "int"), ("ILP", "int"), ("VEC", "int"), ("THREADS_PER_GROUP", "int"))
            + ((("K_SPLITS", "int"),) if self.k_split else ())
            + ((("ROW_PASSES", "int"),) if self.takes_row_passes else ())
            + (
                (("STATE_VECTOR", "int"), ("LOAD_CACHE_MODE", "str"), ("STORE_CACHE_MODE", "str"))
                if self.cache_ops
                else ()
            )
            + (
                (("PREFETCH", "bool"), ("ASYNC_TILES", "bool"))
                if self.solve == "stepwise" and self.row_passes
                else ()
            )
            + ((("LATE_STORES", "bool"),) if self.scaled_state and self.solve == "stepwise" else ())
        )

    @property
    def takes_row_passes(self) -> bool:
        """Whether the body takes ROW_PASSES, its groups walking ILP rows a pass: the staged solve
        always (one pass or more), the stepwise solve with row passes."""
        return self.solve == "staged" or self.row_passes

    @property
    def fuses_conv_and_norm(self) -> bool:
        """Whether the body has the conv1d prologue and the gated RMSNorm epilogue: the stepwise
        solve in one pass (gdngen.spec.model.Variant.serves_gated_norm)."""
        return self.solve == "stepwise" and not self.row_passes

    @property
    def state_raw_until_use(self) -> str:
        """Where a 16-bit or int8 state stays in its own dtype until the solve's first use of it
        (the templates' tile_load): "scaled" (an int8 or fp8 state, always, but for the rows of a
        staged solve's passes: docs/design.md, "Quantized state"), "always" (the staged solve in
        one pass, whose staging runs while the state is in flight: docs/design.md, "Kernel
        design", staged solve), "slot_table" (behind the conv1d prologue or a per-token slot
        table: holds_state_behind_slot_table) or "conv" (behind the conv1d prologue only:
        docs/design.md, "The conv1d prologue")."""
        if self.scaled_state and not (self.solve == "staged" and self.row_passes):
            return "scaled"
        if self.solve == "staged" and not self.row_passes:
            return "always"
        return "slot_table" if self.holds_state_behind_slot_table else "conv"

    @property
    def summary(self) -> str:
        """The body docstring's sentence on what the shape does."""
        state = "K-last [pool, HV, V, K]" if self.layout == "k_last" else "V-last [pool, HV, K, V]"
        if self.solve == "stepwise":
            over = ["the K splits in shared memory"] if self.k_split else []
            if not self.one_lane_groups:
                over.insert(0, "the group with a butterfly")
            parts = [
                "the tokens solved one by one, a lane's dot products reduced over "
                + (" and over ".join(over) if over else "nothing (a group is one lane)")
            ]
            if self.preload_tokens:
                parts.append("every token's q, k, v and gates loaded before the first")
            if self.holds_state_behind_slot_table:
                parts.append("a 16-bit state held in its own dtype behind a per-token slot table")
            if self.gates_in_token_loop_behind_slot_table:
                parts.append(
                    "behind a per-token slot table, each token's gates computed in its turn"
                )
            if self.row_passes:
                parts.append(
                    "a group's rows walked in passes, at T = 1 over one read of the token's q, k "
                    "and gates"
                )
        else:
            parts = [
                "the tokens solved staged: q, k and the gates staged once per CTA in shared "
                "memory, the dots against the initial state reduce-scattered, the deltas solved in "
                "closed form"
            ]
            if self.row_passes:
                parts.append(
                    "a group's rows walked in passes"
                    + (", in an unrolled loop" if self.unroll_passes else "")
                    + (
                        ", each pass's tile loaded while the one before computes"
                        if self.prefetch
                        else ""
                    )
                )
        if self.packed_fma:
            parts.append("packed fp32x2 FMAs")
        if self.cache_ops:
            parts.append("the state moved by copy atoms that carry cache operators")
        if self.scaled_state:
            parts.append(
                "a quantized state (int8 or fp8 e4m3) with a scale per row, dequantized at its "
                "first use and quantized as stored"
            )
        return f"{state} state; " + "; ".join(parts) + "."

    @property
    def name(self) -> str:
        """The body module's name: the layout, the solve, then a token per branch taken, in the
        order of the variant names' tokens (e.g. ``kl_stepwise_pre_gates_in_loop``)."""
        tokens = [
            ("tpg1", self.one_lane_groups),
            ("ks", self.k_split),
            ("pfma", self.packed_fma),
            ("passes", self.row_passes),
            ("pf", self.prefetch),
            ("pre", self.preload_tokens),
            ("held", self.holds_state_behind_slot_table),
            ("gates_in_loop", self.gates_in_token_loop_behind_slot_table),
            ("unroll", self.unroll_passes),
            ("cache_ops", self.cache_ops),
            ("scaled", self.scaled_state),
        ]
        return "_".join(
            [LAYOUT_PREFIX[self.layout], self.solve] + [token for token, on in tokens if on]
        )
