"""The spec: what a deployment needs, as pydantic models.

A spec names one target (an output folder under ``generated/``), the SM it compiles for, the
model geometries it serves, the kernel variants (points in the knob space, docs/design.md "Knobs")
and the static dispatch rules that map a call to a variant where no measurement does. Every constraint between knobs is checked
here, so that templates only ever see consistent variants, and a bad spec fails with the field and
the reason instead of a traceback from the compiler. Geometries and dispatch rules are plain
records (gdngen.geometry, gdngen.dispatch), validated here where the spec holds them, so that the
generated targets that name them need not import pydantic.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from gdngen.device.lanes import WARP
from gdngen.dispatch import Fusion, Rule, boundary_shapes, coverage_gap, select, table_order
from gdngen.geometry import HEAD_DIMS, Geometry
from gdngen.sm import MAX_THREADS_PER_SM, PACKED_FMA_TARGETS, SM_FACTS
from gdngen.terms import (
    LAYOUT_PREFIX,
    PORTABLE_CLUSTER,
    SCALED_STATE_DTYPES,
    STATE_BYTES,
    IndexDtype,
    Layout,
    SmTarget,
    StateDtype,
    sm_suffix,
)

#: width of one vector load or store, in bytes, that a lane may issue
LOAD_BYTES = (8, 16)
#: sizes of one cp.async copy (PTX cp.async: 4, 8 or 16 bytes)
ASYNC_COPY_BYTES = (4, 8, 16)
#: vector loads a K-last lane may spend on its vec columns of one row: two 16-byte loads let a
#: warp cover a 256-column fp32 row, the widest head dim, without splitting K over warps
MAX_ROW_LOADS = 2
MAX_THREADS_PER_CTA = 1024
#: fp32 registers a lane may spend on its state tile
MAX_STATE_REGS = 128
#: the widest causal conv1d the prologue serves (engines use 4)
MAX_CONV_WIDTH = 8
#: how a kernel walks the T tokens (see Variant.solve)
Solve = Literal["stepwise", "staged"]
#: cache operators of the state's loads and stores (CuTe's LoadCacheMode / StoreCacheMode),
#: with their PTX qualifiers (which name the variant)
LoadCache = Literal["all", "global", "streaming", "last_use"]
StoreCache = Literal["write_back", "global", "streaming"]
LOAD_CACHE_PTX = {"all": "ca", "global": "cg", "streaming": "cs", "last_use": "lu"}
STORE_CACHE_PTX = {"write_back": "wb", "global": "cg", "streaming": "cs"}
#: registers of one SM (every target in gdngen.sm), shared by its resident CTAs' threads
SM_REGISTERS = 65536


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Variant(_Strict):
    """One point of the knob space: everything that shapes a kernel's code.

    A lane holds a register tile of ``ilp`` state rows by ``vec`` consecutive K columns, for the
    whole call (all T tokens). ``threads_per_group`` lanes of a warp cover ``tpg * vec`` columns of
    a row and reduce the row's dot products with a butterfly of ``log2(tpg)`` shuffles. A CTA owns
    ``tile_v`` rows of one (batch, value head) state, so it has ``tile_v / ilp`` groups.

    ``k_splits`` splits the K columns further, over that many copies of the group layout in other
    warps (``K = k_splits * tpg * vec``); their partial sums meet in shared memory, one barrier per
    token. On a V-last state this is what lets a warp read whole rows: with ``tpg = 1`` the 32
    lanes of a warp hold 32 neighbouring groups' rows at the same K columns, so one load
    instruction reads ``32 * ilp`` consecutive elements of one K row.

    K-last state: a lane loads ``vec`` contiguous K elements of each of its ``ilp`` rows
    (``ilp`` independent loads of ``vec * S`` bytes). V-last state: a lane loads ``ilp``
    contiguous rows of each of its ``vec`` K columns (``vec`` loads of ``ilp * S`` bytes).

    ``solve`` is how the tokens are walked. ``stepwise``: token by token, each group normalises q
    and k itself, reduces its rows' h.k and h.q with a full butterfly and updates the state before
    the next token. ``staged``: the CTA stages the normalised q, k and the gates of all T tokens in
    shared memory once; every dot product is taken against the initial state and reduced with a
    reduce-scatter (each lane ends up owning whole rows), the lane solves its rows' T deltas in
    closed form, and the state is updated once (or once per token when per-token states are
    cached). Fewer shuffles and no per-token dependency chain, for a few barriers.
    """

    layout: Layout
    state_dtype: StateDtype
    tile_v: int = Field(gt=0)
    ilp: int = Field(gt=0)
    vec: int = Field(gt=0)
    threads_per_group: Literal[1, 2, 4, 8, 16, 32]
    #: copies of the group layout, each on its own slice of the K columns (see above)
    k_splits: int = Field(default=1, ge=1, le=32)
    packed_fma: bool = False
    solve: Solve = "stepwise"
    #: a group walks its rows in this many passes of ``ilp`` rows, so a CTA covers more rows
    #: without holding more registers: staged, with one staging; stepwise (a quantized state's),
    #: with the token's q, k, norms and gates read once for every pass at T = 1
    #: (docs/design.md, "Row passes")
    row_passes: int = Field(default=1, ge=1, le=8)
    #: with row passes: load the next pass's tile while this pass computes (a second register
    #: tile in the state dtype), so a CTA overlaps its own loads with its own arithmetic
    prefetch: bool = False
    #: a quantized state's stepwise row passes only: copy every later pass's tile and scales into
    #: shared memory as the kernel starts (cp.async), so all of a CTA's state loads are in flight
    #: at once without a register held for them (docs/design.md, "Row passes in the stepwise
    #: solve")
    async_tiles: bool = False
    #: with row passes: unroll the pass loop, so the compiler may schedule a pass's loads into
    #: the pass before (as registers allow) instead of a rolled loop holding one pass's registers
    unroll_passes: bool = False
    #: stepwise solve only: load every token's q, k, v rows and gates before the first token is
    #: solved. Loaded inside the token loop, each token's loads wait behind the previous token's
    #: output and cache stores (the compiler may not move a load above a store that could alias
    #: it), one memory round trip per token; preloaded, all T tokens' loads share one
    preload_tokens: bool = False
    #: a quantized state's stepwise solve only: store each token's output row and state
    #: (per-token slots, verify cache) after the next token's dot products, not after its own
    #: update. A store is a branch and a branch a wall to the compilers' scheduling: after the
    #: update, each token's quantization and stores came between it and the next token's work;
    #: late, they overlap it, for the registers that hold them meanwhile (latency for occupancy:
    #: docs/design.md, "Late stores")
    late_stores: bool = False
    #: CTAs the compiler must fit on one SM (launch bounds; 0: no bound): caps the registers of
    #: a thread at SM_REGISTERS / (min_ctas_per_sm * threads), trading spills for occupancy
    min_ctas_per_sm: int = Field(default=0, ge=0, le=32)
    #: cache operator of the state's loads (PTX ld.global.ca / .cg / .cs / .lu): the state is
    #: read once per call, so ``streaming`` and ``last_use`` mark its lines evict-first and
    #: ``global`` keeps them out of L1
    state_load_cache: LoadCache = "all"
    #: cache operator of the state's stores, pool and per-token cache alike (st.global.wb / .cg
    #: / .cs): ``streaming`` marks the written lines evict-first
    state_store_cache: StoreCache = "write_back"
    #: a kernel kept for calls with the gated RMSNorm epilogue only (e.g. one CTA a head, no
    #: cluster): the tuning, which times the recurrence alone, leaves it out, and only rules with
    #: ``gated_norm: true`` may use it. The kernel's code does not change, nor does its name.
    gated_norm_only: bool = False

    # -- derived numbers the knob constraints need (the emit plan derives the code's own:
    # gdngen/emit/plan.py, gdngen/emit/shape.py) ------------------------------------------------

    @property
    def state_bytes(self) -> int:
        return STATE_BYTES[self.state_dtype]

    @property
    def head_k_dim(self) -> int:
        """K this variant serves: one row is split over the group's lanes and the K splits."""
        return self.k_splits * self.threads_per_group * self.vec

    def serves_gated_norm(self, V: int) -> bool:
        """Whether the kernel has the gated RMSNorm epilogue for head dim V: the stepwise solve,
        whole warps, and at most PORTABLE_CLUSTER CTAs a head (their sums meet in a cluster)."""
        return (
            self.solve == "stepwise"
            and self.row_passes == 1
            and self.threads % WARP == 0
            and V % self.tile_v == 0
            and V // self.tile_v <= PORTABLE_CLUSTER
        )

    def serves_head_dims(self, K: int, V: int) -> bool:
        """Whether the kernel is built for head dims (K, V): its K, and V a multiple of tile_v."""
        return self.head_k_dim == K and V % self.tile_v == 0

    @property
    def row_loads(self) -> int:
        """Vector loads a lane spends on its part of one state row: K-last, its vec columns, in
        loads of at most 16 bytes; V-last, one (a load covers ilp rows of one column)."""
        if self.layout == "v_last":
            return 1
        return max(1, self.vec * self.state_bytes // max(LOAD_BYTES))

    @property
    def load_elems(self) -> int:
        """Elements in one vector load or store of state (along the contiguous dimension)."""
        return self.vec // self.row_loads if self.layout == "k_last" else self.ilp

    @property
    def load_bytes(self) -> int:
        return self.load_elems * self.state_bytes

    @property
    def register_cap(self) -> int | None:
        """Registers a thread may use under min_ctas_per_sm (None: no bound)."""
        if not self.min_ctas_per_sm:
            return None
        return SM_REGISTERS // (self.min_ctas_per_sm * self.threads)

    @property
    def groups(self) -> int:
        return self.tile_v // (self.ilp * self.row_passes)

    @property
    def split_threads(self) -> int:
        """Threads of one K split: the groups' lanes on one slice of the K columns."""
        return self.groups * self.threads_per_group

    @property
    def threads(self) -> int:
        return self.split_threads * self.k_splits

    @property
    def state_regs(self) -> int:
        """fp32 registers a lane spends on its state tile."""
        return self.ilp * self.vec

    def name_for(self, sm: SmTarget) -> str:
        """The canonical variant name: file name, symbol, dispatch key, pytest id, cache key."""
        parts = [
            LAYOUT_PREFIX[self.layout],
            self.state_dtype,
            f"tv{self.tile_v}",
            f"ilp{self.ilp}",
            f"vec{self.vec}",
            f"tpg{self.threads_per_group}",
        ]
        if self.k_splits > 1:
            parts.append(f"ks{self.k_splits}")
        if self.packed_fma:
            parts.append("pfma")
        if self.row_passes > 1:
            parts.append(f"passes{self.row_passes}")
        if self.prefetch:
            parts.append("pf")
        if self.async_tiles:
            parts.append("async")
        if self.preload_tokens:
            parts.append("pre")
        if self.late_stores:
            parts.append("late")
        if self.unroll_passes:
            parts.append("unroll")
        if self.min_ctas_per_sm:
            parts.append(f"occ{self.min_ctas_per_sm}")
        if self.state_load_cache != "all":
            parts.append(f"ld{LOAD_CACHE_PTX[self.state_load_cache]}")
        if self.state_store_cache != "write_back":
            parts.append(f"st{STORE_CACHE_PTX[self.state_store_cache]}")
        if self.solve != "stepwise":
            parts.append(self.solve)
        parts.append(sm_suffix(sm))
        return "_".join(parts)

    def _scaled_fits(self) -> None:
        """A quantized (int8, fp8 e4m3) state row's scale is the amax of its K values, which its
        group reduces with a butterfly as it stores: a K-last solve, one group a row
        (docs/design.md, "Quantized state")."""
        limits = (
            ("layout", self.layout, "k_last"),
            ("k_splits", self.k_splits, 1),
            ("state_load_cache", self.state_load_cache, "all"),
            ("state_store_cache", self.state_store_cache, "write_back"),
        )
        for knob, value, needed in limits:
            if value != needed:
                raise ValueError(
                    f"{knob}: an {self.state_dtype} state is served by the K-last solves without "
                    f"K splits or cache operators ({knob}: {needed}); got {knob}: {value}"
                )

    @model_validator(mode="after")
    def _knobs_fit(self) -> "Variant":
        if self.ilp & (self.ilp - 1) or self.vec & (self.vec - 1):
            raise ValueError(
                f"ilp and vec must be powers of two; got ilp={self.ilp}, vec={self.vec}"
            )
        if self.row_loads > MAX_ROW_LOADS:
            raise ValueError(
                f"a K-last lane loads its vec columns of a row in at most {MAX_ROW_LOADS} loads of "
                f"{max(LOAD_BYTES)} bytes; vec gives {self.vec} x {self.state_bytes} B = "
                f"{self.vec * self.state_bytes} B"
            )
        if self.load_bytes not in LOAD_BYTES:
            along = (
                "vec (K-last loads vec elements of a row)"
                if self.layout == "k_last"
                else "ilp (V-last loads ilp consecutive rows of a column)"
            )
            raise ValueError(
                f"one state load must be {' or '.join(map(str, LOAD_BYTES))} bytes; "
                f"{along} gives {self.load_elems} x {self.state_bytes} B = {self.load_bytes} B"
            )
        if self.head_k_dim not in HEAD_DIMS:
            raise ValueError(
                f"k_splits * threads_per_group * vec must be a head dimension K in {HEAD_DIMS}; "
                f"got {self.k_splits} * {self.threads_per_group} * {self.vec} = {self.head_k_dim}"
            )
        if self.state_regs > MAX_STATE_REGS:
            raise ValueError(
                f"a lane's state tile is ilp * vec = {self.ilp} * {self.vec} = {self.state_regs} "
                f"fp32 registers; at most {MAX_STATE_REGS} leave room for the rest of the kernel"
            )
        if self.state_dtype in SCALED_STATE_DTYPES:
            self._scaled_fits()
        if self.k_splits > 1 and self.solve != "stepwise":
            raise ValueError(
                f"k_splits={self.k_splits} needs solve: stepwise (the staged solve reduce-scatters "
                f"within one warp)"
            )
        if self.k_splits > 1 and self.split_threads % WARP:
            raise ValueError(
                f"each K split must be whole warps: tile_v / ilp * threads_per_group = "
                f"{self.tile_v} / {self.ilp} * {self.threads_per_group} = {self.split_threads} "
                f"threads per split"
            )
        if self.row_passes & (self.row_passes - 1):
            raise ValueError(f"row_passes must be a power of two; got {self.row_passes}")
        if (
            self.row_passes > 1
            and self.solve == "stepwise"
            and (
                self.state_dtype not in SCALED_STATE_DTYPES
                or self.k_splits > 1
                or self.preload_tokens
            )
        ):
            raise ValueError(
                f"row_passes={self.row_passes} with solve: stepwise is a knob of the quantized "
                f"states (state_dtype one of {', '.join(SCALED_STATE_DTYPES)}: their lanes' "
                f"fixed work, which the passes share, is what bounds them at T = 1), without "
                f"k_splits or preload_tokens; got state_dtype: {self.state_dtype}, k_splits="
                f"{self.k_splits}, preload_tokens={self.preload_tokens}"
            )
        if self.prefetch and self.row_passes == 1:
            raise ValueError("prefetch loads the next row pass's tile, so it needs row_passes > 1")
        if self.async_tiles and (self.solve != "stepwise" or self.row_passes == 1 or self.prefetch):
            raise ValueError(
                f"async_tiles copies the later row passes' tiles of a quantized state's stepwise "
                f"solve into shared memory, so it needs solve: stepwise, row_passes > 1 and no "
                f"prefetch (which loads the next tile into registers instead); got solve: "
                f"{self.solve}, row_passes={self.row_passes}, prefetch={self.prefetch}"
            )
        if self.async_tiles and self.vec * self.state_bytes not in ASYNC_COPY_BYTES:
            raise ValueError(
                f"async_tiles copies a lane's part of a row in one cp.async of "
                f"{' or '.join(map(str, ASYNC_COPY_BYTES))} bytes; got vec={self.vec} of "
                f"{self.state_dtype} ({self.vec * self.state_bytes} bytes)"
            )
        if self.unroll_passes and self.row_passes == 1:
            raise ValueError("unroll_passes unrolls the row-pass loop, so it needs row_passes > 1")
        if self.unroll_passes and self.solve == "stepwise":
            raise ValueError(
                "unroll_passes is a knob of the staged solve: the stepwise solve's pass loop is "
                "always unrolled (its passes share the tokens' inputs, read in the first)"
            )
        if self.late_stores and (
            self.solve != "stepwise" or self.state_dtype not in SCALED_STATE_DTYPES
        ):
            raise ValueError(
                f"late_stores is a knob of the quantized states' stepwise solve (solve: stepwise, "
                f"state_dtype one of {', '.join(SCALED_STATE_DTYPES)}: a 16-bit state's stores "
                f"hold no butterfly, and deferred they ran slower); got solve: {self.solve}, "
                f"state_dtype: {self.state_dtype}"
            )
        if self.preload_tokens and self.solve != "stepwise":
            raise ValueError(
                "preload_tokens needs solve: stepwise (the staged solve stages every token's "
                "inputs in shared memory already)"
            )
        if self.tile_v % (self.ilp * self.row_passes):
            raise ValueError(
                f"tile_v must be a multiple of ilp * row_passes (each group owns ilp rows per "
                f"pass); got tile_v={self.tile_v}, ilp={self.ilp}, row_passes={self.row_passes}"
            )
        if self.threads % WARP:
            raise ValueError(
                f"a CTA must be whole warps: tile_v / ilp * threads_per_group = "
                f"{self.tile_v} / {self.ilp} * {self.threads_per_group} = {self.threads} threads"
            )
        if self.solve == "staged" and self.threads_per_group < 8:
            raise ValueError(
                f"solve: staged needs threads_per_group >= 8 (its reduce-scatter is built and "
                f"tested for groups of 8, 16 or 32 lanes); got {self.threads_per_group}"
            )
        if self.threads > MAX_THREADS_PER_CTA:
            raise ValueError(f"{self.threads} threads per CTA exceeds {MAX_THREADS_PER_CTA}")
        if self.min_ctas_per_sm and self.min_ctas_per_sm * self.threads > MAX_THREADS_PER_SM:
            raise ValueError(
                f"min_ctas_per_sm={self.min_ctas_per_sm} CTAs of {self.threads} threads exceed the "
                f"{MAX_THREADS_PER_SM} threads an SM holds"
            )
        if self.register_cap is not None and self.register_cap < 2 * self.state_regs:
            raise ValueError(
                f"min_ctas_per_sm={self.min_ctas_per_sm} leaves {self.register_cap} registers a "
                f"thread, under twice its {self.state_regs}-register state tile: it would spill "
                f"the tile"
            )
        if self.packed_fma and self.vec % 2:
            raise ValueError("packed_fma pairs K columns, so vec must be even")
        return self


class Features(_Strict):
    """What the target's call supports beyond the single-token dense update."""

    max_tokens: int = Field(default=8, ge=1, le=16)
    index_dtypes: tuple[IndexDtype, ...] = ("int32", "int64")
    #: the gated RMSNorm epilogue (docs/design.md, "The fused decode core"): the call takes
    #: ``z`` and ``norm_weight``, and the dispatch needs rules with ``gated_norm: true``
    gated_rmsnorm: bool = False
    #: the causal conv1d prologue (docs/design.md, "The conv1d prologue"): the call takes the
    #: pre-convolution q, k, v (or mixed_qkv) with ``conv_state`` and ``conv_weight`` of one of
    #: these widths (taps). Its calls take the fused-core rules (``gated_norm: true``)
    conv1d_widths: tuple[int, ...] = ()

    @field_validator("conv1d_widths")
    @classmethod
    def _widths(cls, widths: tuple[int, ...]) -> tuple[int, ...]:
        for width in widths:
            if not 2 <= width <= MAX_CONV_WIDTH:
                raise ValueError(
                    f"conv1d_widths: {width} is outside 2..{MAX_CONV_WIDTH} (a width-1 conv has "
                    "no state; wider ones would keep more columns in registers than a lane holds)"
                )
        if len(set(widths)) != len(widths):
            raise ValueError(f"conv1d_widths: {list(widths)} repeats a width")
        return tuple(sorted(widths))

    @model_validator(mode="after")
    def _conv_needs_fused_rules(self) -> "Features":
        if self.conv1d_widths and not self.gated_rmsnorm:
            raise ValueError(
                "conv1d_widths: the conv1d prologue's calls take the fused-core rules "
                "(`gated_norm: true`), so it needs `gated_rmsnorm: true` as well"
            )
        return self


class CoreGrid(_Strict):
    """The decode core's grid (``gdngen tune SPEC --core``; docs/design.md, "Tuning the decode
    core"): calls with the conv1d prologue and the gated RMSNorm epilogue, in vLLM's call forms,
    at the grid's base head dims. Each cell times both plans of every variant that has the
    epilogue: the fused kernel, and the conv step before the kernel (the split plan); with
    ``steps``, also the steps plan of the variant the GPU's dispatch gives the cell's bare
    recurrence (docs/design.md, "The norm step apart")."""

    #: the (layout, state dtype) pairs measured, as ``layout/dtype`` (e.g. ``k_last/bf16``)
    pairs: tuple[str, ...] = Field(min_length=1)
    tokens: tuple[int, ...] = (1, 2, 4)
    batch: tuple[int, ...] = (1, 4, 16, 64, 256, 512)
    heads: tuple[int, ...] = (32, 64)
    #: the conv width the cells run (engines use 4; the width is a compile key, not a rule's)
    conv_width: int = 4
    #: each cell also times its steps plan (``steps:<variant>``: the conv step, the variant the
    #: dispatch gives the bare recurrence, the norm step); the pair's cells then depend on the
    #: variants of the plain tuning as well (gdngen.tune.tuning_file.pair_sha256)
    steps: bool = False

    @model_validator(mode="after")
    def _grid(self) -> "CoreGrid":
        if any(t < 1 for t in self.tokens) or any(b < 1 for b in self.batch):
            raise ValueError("core: tokens and batch sizes must be >= 1")
        for pair in self.pairs:
            parts = pair.split("/")
            if len(parts) != 2 or parts[0] not in LAYOUT_PREFIX or parts[1] not in STATE_BYTES:
                raise ValueError(
                    f"core.pairs: expected layout/dtype items like k_last/bf16; got {pair!r}"
                )
        return self

    @property
    def pair_tuples(self) -> tuple[tuple[str, str], ...]:
        return tuple(tuple(p.split("/")) for p in self.pairs)  # type: ignore[misc]


class Tuning(_Strict):
    """The grid ``gdngen tune`` measures on a GPU, and the GPU its tuning file must come from.

    Without a tuning file next to the spec, emit uses the static ``dispatch`` rules; with one,
    the measured (layout, state dtype) pairs get dispatch rows chosen by the timings.
    """

    gpu: str = Field(
        min_length=1, description="substring of the GPU name the timings must come from"
    )
    #: more GPU models of this SM, each measured on its own (its tuning file beside the spec's,
    #: gdngen.tune.tuning_file.tuning_path) and dispatched by its own table, picked at run time
    #: from the device's name; a part matching none of them uses ``gpu``'s table
    other_gpus: tuple[str, ...] = ()
    tokens: tuple[int, ...] = (1, 2, 4, 8)
    batch: tuple[int, ...] = (1, 4, 16, 64, 256, 512)
    heads: tuple[int, ...] = (32, 64)
    #: the call forms timed: "update" (dense rows, the final state stored), "verify" (a
    #: positional cache of every token's state, the pool left as it was) and "spec" (vLLM's
    #: speculative-decode form: B sequences of T tokens packed, a [B, T] per-token slot table,
    #: every token's state stored in the pool; T >= 2), each with rules of its own
    modes: tuple[Literal["update", "verify", "spec"], ...] = ("update", "verify")
    #: more head dims (K, V) the grid measures besides its HVs' (``heads``): each at the HVs of
    #: the spec's geometries with those head dims, with the variants built for them
    head_dims: tuple[tuple[int, int], ...] = ()
    #: for T > 1, time only the variants within this factor of the best at T = 1 somewhere
    multi_token_shortlist: float = Field(default=1.10, ge=1.0)
    #: the decode core's grid (``gdngen tune --core``), if the spec measures it
    core: CoreGrid | None = None

    @model_validator(mode="after")
    def _grid(self) -> "Tuning":
        if 1 not in self.tokens:
            raise ValueError("tokens must include 1 (T = 1 rows are the base of every table)")
        if any(t < 1 for t in self.tokens) or any(b < 1 for b in self.batch):
            raise ValueError("tokens and batch sizes must be >= 1")
        models = [self.gpu, *self.other_gpus]
        for index, model in enumerate(models):
            if not model.strip() or not any(c.isalnum() for c in model):
                raise ValueError(f"other_gpus: expected GPU model names; got {model!r}")
            clash = [
                m
                for m in models[:index]
                if m.lower() in model.lower() or model.lower() in m.lower()
            ]
            if clash:
                raise ValueError(
                    f"other_gpus: {model!r} and {clash[0]!r} would both match one GPU's name; "
                    "each GPU model must be named once"
                )
        return self


class CallForms(_Strict):
    """The compile-time forms of a call that ``gdngen build`` compiles ahead of time (and that a
    default ``warmup`` loads): for every geometry, served layout/dtype and T = 1..max_tokens,
    every variant the dispatch can pick at some batch size, in each combination of these forms
    (docs/design.md, "Call forms"). Modes that store per-token states are built for T >= 2,
    ``update`` for every T."""

    #: "update", "verify" (positional cache), "spec" (vLLM per-token slots), "verify_rows"
    #: (SGLang pool-row cache): see gdngen.runtime.forms.MODES
    modes: tuple[Literal["update", "verify", "spec", "verify_rows"], ...] = ("update", "verify")
    #: "none": a dense per-batch state (no slot indices); else the slot index dtype
    slots: tuple[Literal["none", "int32", "int64"], ...] = ("int32",)
    #: whether tokens come packed with cu_seqlens (true), as [B, T] rows (false), or both
    packed: tuple[bool, ...] = (False,)
    #: padding sentinels: a slot <= null_slot is padding (-1: negative slots; 0: vLLM's slot 0)
    null_slots: tuple[Annotated[int, Field(ge=-1)], ...] = (-1,)
    separate_write_slots: bool = False
    io_dtype: Literal["bf16", "fp16"] = "bf16"
    gate_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    dt_bias_dtype: Literal["bf16", "fp32"] = "fp32"
    use_qk_l2norm: bool = True
    #: the fused steps of the calls built (docs/design.md, "The fused decode core"): "none" (the
    #: recurrence alone), "norm" (the gated RMSNorm epilogue: vLLM's fused MTP op), "core" (the
    #: conv1d prologue of ``conv_width`` and the norm: an engine's decode_core, whose split plan
    #: builds the conv step with the variant it runs before); the norm's gate activation
    fused: tuple[Literal["none", "norm", "core"], ...] = ("none",)
    norm_activation: Literal["silu", "sigmoid"] = "silu"
    conv_width: int = 4
    #: programmatic dependent launch as the calls pass ``enable_pdl`` (docs/design.md,
    #: "Programmatic dependent launch"): null, unset (each dispatch rule's ``pdl``), or the bool
    pdl: tuple[bool | None, ...] = (None,)
    #: the geometries (by name) built ahead of time; None: all of them. Every geometry is served:
    #: the others compile on first use (or with `gdngen build --geometries`), so a spec can carry
    #: every tensor-parallel shard of a model without multiplying the default build
    geometries: tuple[str, ...] | None = None


class Spec(_Strict):
    """A whole spec file."""

    target: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    sm: SmTarget
    description: str = ""
    geometries: Annotated[list[Geometry], Field(min_length=1)]
    features: Features = Features()
    variants: Annotated[list[Variant], Field(min_length=1)]
    #: static dispatch rules: first match wins; measured rules replace a pair's (gdngen.dispatch)
    dispatch: Annotated[list[Rule], Field(min_length=1)]
    tuning: Tuning | None = None
    build: CallForms = CallForms()
    #: the specs this one extends, nearest first, with the paths they were read from (set by
    #: gdngen.spec.load; not part of the spec's meaning or hash)
    _ancestors: tuple[tuple["Spec", str], ...] = PrivateAttr(default=())
    #: variants_by_name, made at its first use from the variants it holds (tuning files look
    #: names up per cell; a copy with other variants makes its own)
    _variants_by_name: tuple[object, Mapping[str, Variant]] | None = PrivateAttr(default=None)

    def tuning_geometry(self, HV: int, head_dims: tuple[int, int] | None = None) -> Geometry:
        """The geometry ``gdngen tune`` measures a cell of ``HV`` value heads on: the first with
        that HV (and ``head_dims``, if given) in the spec's order. Shards of several models can
        share an HV (Qwen3-Next at TP 1 and Qwen3.5 at TP 2 both have 32) with other q/k head
        counts; listing each model at TP 1 before its shards keeps the cells of HV 32 and 64 on
        the full models."""
        return next(
            g
            for g in self.geometries
            if g.HV == HV and (head_dims is None or (g.K, g.V) == head_dims)
        )

    def build_geometries(self, names: tuple[str, ...] | None = None) -> list[Geometry]:
        """The geometries ``gdngen build`` compiles: ``names`` (a ValueError names any the spec
        lacks), else the ``build:`` section's, else all."""
        names = names if names is not None else self.build.geometries
        if names is None:
            return list(self.geometries)
        known = {g.name: g for g in self.geometries}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"geometries: {', '.join(unknown)} not in target {self.target} "
                f"(it has {', '.join(known)})"
            )
        return [known[n] for n in names]

    @property
    def ancestors(self) -> tuple[tuple["Spec", str], ...]:
        return self._ancestors

    def variant_name(self, variant: Variant) -> str:
        return variant.name_for(self.sm)

    @property
    def variants_by_name(self) -> Mapping[str, Variant]:
        made = self._variants_by_name
        if made is None or made[0] is not self.variants:
            names = {self.variant_name(v): v for v in self.variants}
            made = self._variants_by_name = (self.variants, MappingProxyType(names))
        return made[1]

    @model_validator(mode="after")
    def _consistent(self) -> "Spec":
        names = [self.variant_name(v) for v in self.variants]
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                raise ValueError(f"variants[{index}]: duplicate variant {name}")
            seen.add(name)
        for index, variant in enumerate(self.variants):
            if variant.packed_fma and self.sm not in PACKED_FMA_TARGETS:
                raise ValueError(
                    f"variants[{index}] ({names[index]}): packed_fma needs "
                    f"{' or '.join(PACKED_FMA_TARGETS)}; this spec targets {self.sm}, which "
                    f"has no packed fp32x2 FMA"
                )
            sm_threads = SM_FACTS[self.sm].threads
            if variant.min_ctas_per_sm * variant.threads > sm_threads:
                raise ValueError(
                    f"variants[{index}] ({names[index]}): min_ctas_per_sm="
                    f"{variant.min_ctas_per_sm} CTAs of {variant.threads} threads exceed the "
                    f"{sm_threads} threads an SM of {self.sm} holds"
                )
            served = [g for g in self.geometries if variant.serves_head_dims(g.K, g.V)]
            if not served:
                raise ValueError(
                    f"variants[{index}] ({names[index]}): serves K={variant.head_k_dim} with "
                    f"tile_v={variant.tile_v}, but no geometry has that K and a V divisible by tile_v"
                )
        geometry_names = [g.name for g in self.geometries]
        if len(set(geometry_names)) != len(geometry_names):
            raise ValueError(f"geometries: names must be unique, got {geometry_names}")
        unknown_builds = [n for n in self.build.geometries or () if n not in geometry_names]
        if unknown_builds:
            raise ValueError(
                f"build.geometries: {', '.join(unknown_builds)} not among the spec's geometries "
                f"({', '.join(geometry_names)})"
            )
        known = set(names)
        for index, rule in enumerate(self.dispatch):
            if rule.use not in known:
                raise ValueError(
                    f"dispatch[{index}].use: unknown variant {rule.use!r}; "
                    f"this spec defines {sorted(known)}"
                )
            variant = self.variants_by_name[rule.use]
            if (variant.layout, variant.state_dtype) != (rule.layout, rule.state_dtype):
                raise ValueError(
                    f"dispatch[{index}]: rule is for {rule.layout}/{rule.state_dtype} but "
                    f"{rule.use} is a {variant.layout}/{variant.state_dtype} kernel"
                )
            if rule.head_dims is not None and rule.head_dims not in self.head_dims:
                raise ValueError(
                    f"dispatch[{index}].head_dims: {list(rule.head_dims)} is not the (K, V) of "
                    f"any geometry ({', '.join(str(list(d)) for d in self.head_dims)})"
                )
            if rule.tokens.hi is not None and rule.tokens.hi > self.features.max_tokens:
                raise ValueError(
                    f"dispatch[{index}].tokens: hi={rule.tokens.hi} exceeds "
                    f"features.max_tokens={self.features.max_tokens}"
                )
        if self.tuning is not None:
            too_many = [t for t in self.tuning.tokens if t > self.features.max_tokens]
            if too_many:
                raise ValueError(
                    f"tuning.tokens: {too_many} exceed features.max_tokens={self.features.max_tokens}"
                )
            heads = {g.HV for g in self.geometries}
            unknown = [hv for hv in self.tuning.heads if hv not in heads]
            if unknown:
                raise ValueError(
                    f"tuning.heads: {unknown} are not the HV of any geometry ({sorted(heads)})"
                )
            measured_dims = {
                (g.K, g.V) for g in (self.tuning_geometry(hv) for hv in self.tuning.heads)
            }
            if len(measured_dims) > 1:
                raise ValueError(
                    f"tuning.heads: their geometries have head dims {sorted(measured_dims)}; the "
                    f"tuning grid measures one (K, V), the first geometry with each HV's"
                )
            for index, dims in enumerate(self.tuning.head_dims):
                if dims not in self.head_dims or dims in measured_dims:
                    raise ValueError(
                        f"tuning.head_dims[{index}]: {list(dims)} must be the (K, V) of a "
                        f"geometry ({', '.join(str(list(d)) for d in self.head_dims)}) other "
                        f"than tuning.heads' {list(next(iter(measured_dims)))}"
                    )
        gap = coverage_gap(
            self.dispatch, self.served, self.head_dims, self.features.max_tokens, self.fusions
        )
        if gap is not None:
            raise ValueError(
                f"dispatch: no rule serves {gap.describe()}; every served layout/dtype needs "
                f"rules for T=1..{self.features.max_tokens} and all batch*heads, at the head "
                f"dims of every geometry"
                + (", with and without gated_norm" if self.features.gated_rmsnorm else "")
            )
        for index, rule in enumerate(self.dispatch):
            if rule.gated_norm and not self.features.gated_rmsnorm:
                raise ValueError(
                    f"dispatch[{index}].gated_norm: the spec's features do not have the gated "
                    "RMSNorm epilogue; add `gated_rmsnorm: true` under `features:`"
                )
            if rule.per_token_slots and rule.intermediate == "no":
                raise ValueError(
                    f"dispatch[{index}].per_token_slots: a call with a per-token slot table "
                    "stores every token's state, so a rule with `intermediate: no` serves none; "
                    "drop one of the two"
                )
            if rule.conv1d and not (self.features.conv1d_widths and rule.gated_norm):
                raise ValueError(
                    f"dispatch[{index}].conv1d: a rule for calls with the conv1d prologue needs "
                    "`conv1d_widths` under `features:` and `gated_norm: true` on the rule (the "
                    "fused-core kernels serve it)"
                )
        fused = set(self.build.fused) - {"none"}
        if fused and not self.features.gated_rmsnorm:
            raise ValueError(
                f"build.fused: {sorted(fused)} needs `gated_rmsnorm: true` under `features:`"
            )
        if "core" in fused and self.build.conv_width not in self.features.conv1d_widths:
            raise ValueError(
                f"build.conv_width: {self.build.conv_width} is not among the spec's "
                f"conv1d_widths {list(self.features.conv1d_widths)}"
            )
        self._check_rules_fit_calls()
        if self.tuning is not None and self.tuning.core is not None:
            self._check_core_grid(self.tuning.core)
        return self

    def _check_core_grid(self, core: CoreGrid) -> None:
        if not (self.features.gated_rmsnorm and self.features.conv1d_widths):
            raise ValueError(
                "tuning.core: the decode core needs `gated_rmsnorm: true` and `conv1d_widths` "
                "under `features:`"
            )
        if core.conv_width not in self.features.conv1d_widths:
            raise ValueError(
                f"tuning.core.conv_width: {core.conv_width} is not among the spec's "
                f"conv1d_widths {list(self.features.conv1d_widths)}"
            )
        too_many = [t for t in core.tokens if t > self.features.max_tokens]
        if too_many:
            raise ValueError(
                f"tuning.core.tokens: {too_many} exceed features.max_tokens="
                f"{self.features.max_tokens}"
            )
        base = self.tuning_head_dims
        heads = {g.HV for g in self.geometries if (g.K, g.V) == base}
        unknown = [hv for hv in core.heads if hv not in heads]
        if unknown:
            raise ValueError(
                f"tuning.core.heads: {unknown} are not the HV of a geometry with the grid's head "
                f"dims {list(base)} ({sorted(heads)})"
            )
        for layout, state_dtype in core.pair_tuples:
            if (layout, state_dtype) not in self.served:
                raise ValueError(
                    f"tuning.core.pairs: {layout}/{state_dtype} is not a pair the target serves"
                )
            if not self.core_candidates(layout, state_dtype):
                raise ValueError(
                    f"tuning.core.pairs: no {layout}/{state_dtype} variant has the gated RMSNorm "
                    f"epilogue at head dims {list(base)}"
                )

    def core_candidates(self, layout: str, state_dtype: str) -> list[str]:
        """The variants ``gdngen tune --core`` times (each on both plans) in the cells of one
        pair: those built for the grid's base head dims with the gated RMSNorm epilogue, the
        ``gated_norm_only`` ones among them."""
        K, V = self.tuning_head_dims
        return [
            self.variant_name(v)
            for v in self.variants
            if (v.layout, v.state_dtype) == (layout, state_dtype)
            and v.serves_head_dims(K, V)
            and v.serves_gated_norm(V)
        ]

    @property
    def fusions(self) -> tuple[Fusion, ...]:
        """The calls the dispatch must route, as (gated_norm, conv1d): unfused; with the gated
        RMSNorm epilogue where the spec's features have it; and with the conv1d prologue too
        where they have that."""
        fusions = [(False, False)]
        if self.features.gated_rmsnorm:
            fusions.append((True, False))
        if self.features.conv1d_widths:
            fusions.append((True, True))
        return tuple(fusions)

    def _check_rules_fit_calls(self) -> None:
        """Every call the static rules can route must land on a variant built for its head dims
        (K = the variant's k_splits * threads_per_group * vec, V a multiple of its tile_v) and,
        for a call with the gated RMSNorm epilogue, a variant that has it; a `gated_norm_only`
        variant serves those calls only."""
        by_name = self.variants_by_name
        for index, rule in enumerate(self.dispatch):
            if by_name[rule.use].gated_norm_only and rule.gated_norm is not True:
                raise ValueError(
                    f"dispatch[{index}].use: {rule.use} is `gated_norm_only`, but the rule also "
                    "serves calls without the gated RMSNorm; give the rule `gated_norm: true`"
                )
        ordered = table_order(self.dispatch)  # as every emitted table holds them
        for shape in boundary_shapes(
            ordered, self.served, self.head_dims, self.features.max_tokens, self.fusions
        ):
            rule = select(ordered, shape)
            variant = by_name[rule.use]
            K, V = shape.head_dims
            if shape.gated_norm and not rule.split_norm and not variant.serves_gated_norm(V):
                index = self.dispatch.index(rule)
                raise ValueError(
                    f"dispatch[{index}].use: {rule.use} is the first rule for calls with the "
                    f"gated RMSNorm at {shape.describe()}, but it has no epilogue for V={V} (it "
                    f"needs the stepwise solve, whole warps and V / tile_v <= {PORTABLE_CLUSTER}); "
                    "give a rule with `gated_norm: true` and such a variant first"
                )
            if not variant.serves_head_dims(K, V):
                index = self.dispatch.index(rule)
                geometry = next(g.name for g in self.geometries if (g.K, g.V) == (K, V))
                raise ValueError(
                    f"dispatch[{index}].use: {rule.use} serves K={variant.head_k_dim} with V "
                    f"divisible by {variant.tile_v}, but it is the first rule for calls of "
                    f"geometry {geometry} (K={K}, V={V}); give a rule for those head dims first, "
                    f"with head_dims: [{K}, {V}] and a variant built for them"
                )

    @property
    def head_dims(self) -> tuple[tuple[int, int], ...]:
        """The (K, V) of the spec's geometries, each once, sorted: the dispatch covers each."""
        return tuple(sorted({(g.K, g.V) for g in self.geometries}))

    @property
    def tuning_head_dims(self) -> tuple[int, int] | None:
        """The (K, V) the tuning grid measures at its HVs (``tuning.heads``), the base of its
        tables; None without a grid."""
        if self.tuning is None:
            return None
        g = self.tuning_geometry(self.tuning.heads[0])
        return (g.K, g.V)

    @property
    def tuned_head_dims(self) -> tuple[tuple[int, int], ...]:
        """Every (K, V) the tuning grid measures: ``tuning_head_dims`` first, then
        ``tuning.head_dims``."""
        if self.tuning is None:
            return ()
        return (self.tuning_head_dims, *self.tuning.head_dims)

    def tuning_sets(
        self, pairs: list[tuple[str, str]] | None = None
    ) -> list[tuple[str, str, tuple[int, int] | None]]:
        """The sets a tuning file can hold: each of ``pairs`` (default: the served ones) at each
        head dims of the grid it has candidates for, as ``(layout, state dtype, head dims)``; at
        head dims None (any) without a grid."""
        pairs = self.served if pairs is None else pairs
        if self.tuning is None:
            return [(layout, state_dtype, None) for layout, state_dtype in pairs]
        return [
            (layout, state_dtype, dims)
            for layout, state_dtype in pairs
            for dims in self.tuned_head_dims
            if self.tuning_candidates(layout, state_dtype, dims)
        ]

    def tuning_heads(self, head_dims: tuple[int, int]) -> tuple[int, ...]:
        """The HVs the grid measures at ``head_dims``: ``tuning.heads`` at the base head dims,
        else those of the spec's geometries with these head dims."""
        if head_dims == self.tuning_head_dims:
            return self.tuning.heads
        return tuple(sorted({g.HV for g in self.geometries if (g.K, g.V) == head_dims}))

    def tuning_candidates(
        self, layout: str, state_dtype: str, head_dims: tuple[int, int] | None = None
    ) -> list[Variant]:
        """The variants ``gdngen tune`` times in the cells of one (layout, dtype) pair at
        ``head_dims`` (default: the base, ``tuning_head_dims``): those built for them (every
        variant of the pair without a tuning grid)."""
        head_dims = head_dims or self.tuning_head_dims
        return [
            v
            for v in self.variants
            if (v.layout, v.state_dtype) == (layout, state_dtype)
            and (head_dims is None or v.serves_head_dims(*head_dims))
            and not v.gated_norm_only
        ]

    @property
    def served(self) -> tuple[tuple[str, str], ...]:
        """The (layout, state dtype) pairs this target's call accepts: those with dispatch rules."""
        return tuple(sorted({(rule.layout, rule.state_dtype) for rule in self.dispatch}))
