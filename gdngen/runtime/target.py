"""A generated target at run time: its info, its dispatch table and its kernel modules."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field, replace

import torch

from gdngen.dispatch import CallShape, Rule, select
from gdngen.terms import CONV_ACTIVATIONS, NORM_ACTIVATIONS

from .checks import Call
from .core_checks import check_enable_pdl
from .forms import MODES, Form, compile_keys, key_mode
from .info import TargetInfo
from .launcher import Choice, DecodeCall
from .store import find_kernel

__all__ = ["TableChoice", "Target", "TargetInfo", "WarmupSummary"]

log = logging.getLogger("gdngen")


@dataclass
class WarmupSummary:
    """What ``warmup`` did: every kernel it made ready, and where each came from."""

    #: (variant, T, mode, source) per kernel
    kernels: list[tuple[str, int, str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def by_source(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for *_, source in self.kernels:
            counts[source] = counts.get(source, 0) + 1
        return counts

    def __str__(self) -> str:
        sources = ", ".join(f"{n} from {s}" for s, n in sorted(self.by_source.items()))
        return f"{len(self.kernels)} kernels ready in {self.seconds:.2f} s ({sources or 'none'})"


@dataclass(frozen=True)
class TableChoice:
    """Which dispatch table a GPU gets, and a sentence saying why."""

    table: tuple[Rule, ...]
    reason: str
    #: the GPU model has no measured table of its own: it borrows the default one
    fallback: bool = False


class Target:
    def __init__(
        self,
        info: TargetInfo,
        table: tuple[Rule, ...],
        variants: tuple[str, ...],
        *,
        kernels_package: str,
        tables: dict[str, tuple[Rule, ...]] | None = None,
        table_gpu: str | None = None,
    ) -> None:
        self.info = info
        self.table = table
        #: GPU model -> the table measured on it; devices matching none use ``table``
        self.tables = dict(tables or {})
        #: the GPU model ``table`` was measured on (None: the spec's static rules)
        self.table_gpu = table_gpu
        self.variants = variants
        self.kernels_package = kernels_package
        unknown = sorted({rule.use for t in self.every_table for rule in t} - set(variants))
        if unknown:
            raise ImportError(f"target {info.name}: dispatch rules name unknown variants {unknown}")
        self._table_of_device: dict[int, tuple[Rule, ...]] = {}
        self.gdn_decode = DecodeCall(
            "gdn_decode", lambda: info, self._choose, lambda: kernels_package
        )

    @property
    def every_table(self) -> list[tuple[Rule, ...]]:
        """The default table, then each GPU model's."""
        return [self.table, *self.tables.values()]

    def table_for(self, gpu: str) -> TableChoice:
        """The dispatch table for a GPU (its name, e.g. ``NVIDIA H100 80GB HBM3``), and why
        (docs/design.md, "Dispatch per GPU model")."""
        for model, table in self.tables.items():
            if model.lower() in gpu.lower():
                return TableChoice(table, f"{gpu}: the table measured on {model}")
        if self.table_gpu is None:
            return TableChoice(self.table, f"{gpu}: the spec's static rules")
        if self.table_gpu.lower() in gpu.lower():
            return TableChoice(self.table, f"{gpu}: the table measured on {self.table_gpu}")
        models = ", ".join([self.table_gpu, *self.tables])
        return TableChoice(
            self.table,
            f"{gpu}: target {self.info.name} has no table measured on this GPU model (it has "
            f"{models}); using the default table, measured on {self.table_gpu}. To measure one, "
            f"add the model to tuning.other_gpus in {self.info.spec or 'the spec'} and run "
            "`gdngen tune` on it",
            fallback=True,
        )

    def _device_table(self, device) -> tuple[Rule, ...]:
        """The table of a CUDA device, looked up once per device and said once: at INFO level,
        or as a warning where the device's GPU model has no measured table of its own."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        table = self._table_of_device.get(index)
        if table is None:
            choice = self.table_for(torch.cuda.get_device_name(index))
            level = logging.WARNING if choice.fallback else logging.INFO
            log.log(level, "gdngen dispatch on cuda:%d, %s", index, choice.reason)
            table = self._table_of_device[index] = choice.table
        return table

    def select(
        self,
        *,
        layout: str,
        state_dtype: str,
        tokens: int,
        batch_heads: int,
        intermediate: bool,
        head_dims: tuple[int, int],
        gpu: str | None = None,
        gated_norm: bool = False,
        conv1d: bool = False,
        heads: int | None = None,
        packed: bool = False,
        per_token_slots: bool = False,
        separate_writes: bool = False,
        strided_state: bool = False,
    ) -> Rule:
        """The dispatch rule that serves a call of this shape (``head_dims``: the geometry's
        (K, V); ``gated_norm``: with the gated RMSNorm epilogue, ``conv1d``: with the conv1d
        prologue as well; ``heads``: its value heads HV, None for the rules of any HV;
        ``packed``, ``per_token_slots``, ``separate_writes``, ``strided_state``: its form, as
        CallShape has them) on ``gpu`` (a device name; None: the current CUDA device's, or the
        default table without one);
        LookupError if none does."""
        if gpu is None and torch.cuda.is_available():
            table = self._device_table(torch.device("cuda", torch.cuda.current_device()))
        else:
            table = self.table if gpu is None else self.table_for(gpu).table
        shape = CallShape(
            layout, state_dtype, tokens, batch_heads, intermediate, tuple(head_dims),
            gated_norm, conv1d, heads, packed, per_token_slots, separate_writes, strided_state,
        )  # fmt: skip
        return self._rule(table, shape)

    def _rule(self, table: tuple[Rule, ...], shape: CallShape) -> Rule:
        rule = select(table, shape)
        if rule is None:
            raise LookupError(
                f"target {self.info.name}: no dispatch rule serves {shape.describe()}"
            )
        return rule

    def _shape(self, call: Call, conv1d: bool) -> CallShape:
        return CallShape(
            call.layout, call.state_dtype, call.tokens, call.batch_heads,
            call.stores_token_states, (call.K, call.V), call.fused, conv1d, call.HV,
            call.packed, call.per_token_slots, call.separate_write_slots, call.strided_state,
        )  # fmt: skip

    def _choose(self, call: Call) -> Choice:
        rule = self._rule(self._device_table(call.pool.device), self._shape(call, bool(call.conv)))
        return Choice(rule.use, rule.split_conv, rule.split_norm, rule.pdl)

    def split_conv_call(self) -> DecodeCall:
        """``gdn_decode`` with every conv1d call on the split plan: the conv step, then the
        variant the dispatch picks for the same call without the prologue (for tests and
        benchmarks that compare the plans; gdngen.runtime.conv_step)."""

        def choose(call: Call) -> Choice:
            rule = self._rule(self._device_table(call.pool.device), self._shape(call, False))
            return Choice(rule.use, split_conv=True, pdl=rule.pdl)

        return DecodeCall("gdn_decode", lambda: self.info, choose, lambda: self.kernels_package)

    def split_steps_call(self) -> DecodeCall:
        """``gdn_decode`` with every fused step as a kernel of its own: a conv1d call runs the
        conv step, a call with the gated RMSNorm runs the variant the dispatch picks for the
        bare recurrence and then the norm step (for tests and benchmarks that compare the plans;
        gdngen.runtime.split_launch)."""

        def choose(call: Call) -> Choice:
            shape = replace(self._shape(call, False), gated_norm=False)
            rule = self._rule(self._device_table(call.pool.device), shape)
            return Choice(rule.use, split_conv=True, split_norm=True, pdl=rule.pdl)

        return DecodeCall("gdn_decode", lambda: self.info, choose, lambda: self.kernels_package)

    def fused_conv_call(self) -> DecodeCall:
        """``gdn_decode`` with every conv1d call on the fused plan: the prologue inside the
        variant the dispatch picks, where a rule would split the conv off (for tests and
        benchmarks that compare the plans)."""

        def choose(call: Call) -> Choice:
            return replace(self._choose(call), split_conv=False)

        return DecodeCall("gdn_decode", lambda: self.info, choose, lambda: self.kernels_package)

    def variant(self, name: str, split_conv: bool = False, split_norm: bool = False) -> DecodeCall:
        """One variant's call, with no dispatch (for tests, benchmarks and pinning); with
        ``split_conv``, a conv1d call runs the conv step first, then the variant without the
        prologue (gdngen.runtime.conv_step); with ``split_norm``, a call with the gated RMSNorm
        runs the variant without the epilogue, then the norm step (gdngen.runtime.norm_step)."""
        if name not in self.variants:
            raise ValueError(
                f"variant: {name!r} is not a variant of target {self.info.name}; "
                f"it has {', '.join(self.variants)}"
            )
        choice = Choice(name, split_conv, split_norm)
        return DecodeCall(
            name, lambda: self.info, lambda call: choice, lambda: self.kernels_package
        )

    def warmup(
        self,
        *,
        geometry: str | None = None,
        layout: str = "k_last",
        state_dtype: str = "bf16",
        index_dtype: str | None = "int32",
        max_tokens: int | None = None,
        modes: tuple[str, ...] = ("update", "verify"),
        separate_write_slots: bool = False,
        io_dtype: str = "bf16",
        gate_dtype: str = "bf16",
        dt_bias_dtype: str = "fp32",
        use_qk_l2norm: bool = True,
        packed: bool = False,
        null_slot: int = -1,
        norm_activation: str | None = None,
        conv_width: int | None = None,
        conv_bias: bool = True,
        conv_activation: str = "silu",
        norm_weight_dtype: str = "bf16",
        enable_pdl: bool | None = None,
        progress: bool = True,
    ) -> WarmupSummary:
        """Load (from artifacts or the disk cache) or compile every kernel that calls of one engine
        configuration can dispatch to: each T in 1..max_tokens, each mode (gdngen.runtime.forms.
        MODES: "update", "verify", "spec", "verify_rows"; all but "update" for T >= 2), every
        batch size. It launches nothing and needs no GPU, so it is safe before CUDA-graph capture.
        ``geometry`` names one of the target's geometries, the engine's per-GPU shard (None: all
        of them, every TP shard included); ``index_dtype`` None is a dense state; ``packed`` is
        the cu_seqlens form (T is then max_seqlen); ``null_slot`` the padding sentinel the
        engine uses. The fused steps (docs/design.md, "The fused decode core"):
        ``norm_activation`` ("silu" or "sigmoid") for calls with the gated RMSNorm epilogue, its
        weight's ``norm_weight_dtype``; ``conv_width`` for calls with the conv1d prologue as
        well (the engine's decode_core), its ``conv_bias`` and ``conv_activation``; where the
        dispatch splits the conv off, the conv step's kernel is warmed too. ``enable_pdl`` as the
        calls will pass it (None, gdn_decode's default: as each dispatch rule says)."""
        info = self.info
        if (layout, state_dtype) not in info.served:
            served = ", ".join(f"{a}/{b}" for a, b in info.served)
            raise ValueError(
                f"layout/state_dtype: target {info.name} serves {served}; got {layout}/{state_dtype}"
            )
        geometries = [g for g in info.geometries if geometry in (None, g.name)]
        if not geometries:
            names = ", ".join(g.name for g in info.geometries)
            raise ValueError(f"geometry: target {info.name} has {names}; got {geometry!r}")
        if index_dtype is not None and index_dtype not in info.index_dtypes:
            raise ValueError(
                f"index_dtype: target {info.name} takes {'/'.join(info.index_dtypes)} or None; "
                f"got {index_dtype!r}"
            )
        max_tokens = info.max_tokens if max_tokens is None else max_tokens
        if not 1 <= max_tokens <= info.max_tokens:
            raise ValueError(f"max_tokens: expected 1..{info.max_tokens}; got {max_tokens}")
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise ValueError(
                f"modes: expected some of {', '.join(map(repr, MODES))}; got {modes!r}"
            )
        if isinstance(null_slot, bool) or not isinstance(null_slot, int) or null_slot < -1:
            raise ValueError(f"null_slot: expected an int >= -1; got {null_slot!r}")
        if norm_activation is not None and not info.gated_rmsnorm:
            raise ValueError(
                f"norm_activation: target {info.name} has no gated RMSNorm epilogue; got "
                f"{norm_activation!r} (pass None)"
            )
        if norm_activation not in (None, *NORM_ACTIVATIONS):
            raise ValueError(
                f"norm_activation: expected None or one of {NORM_ACTIVATIONS}; got "
                f"{norm_activation!r}"
            )
        if conv_width is not None and conv_width not in info.conv1d_widths:
            raise ValueError(
                f"conv_width: target {info.name} serves conv1d widths "
                f"{list(info.conv1d_widths)}; got {conv_width!r}"
            )
        if conv_width is not None and norm_activation is None:
            raise ValueError(
                "norm_activation: the conv1d prologue's calls (conv_width) fuse the gated "
                'RMSNorm too; pass its activation ("silu" or "sigmoid")'
            )
        if conv_activation not in CONV_ACTIVATIONS:
            raise ValueError(
                f"conv_activation: expected one of {CONV_ACTIVATIONS}; got {conv_activation!r}"
            )
        pdl = check_enable_pdl(enable_pdl)
        forms = [
            Form(
                mode=mode, index_dtype=index_dtype, separate_write_slots=separate_write_slots,
                io_dtype=io_dtype, gate_dtype=gate_dtype, dt_bias_dtype=dt_bias_dtype,
                use_qk_l2norm=use_qk_l2norm, packed=packed, null_slot=null_slot,
                norm_activation=norm_activation, norm_weight_dtype=norm_weight_dtype,
                conv_width=conv_width, conv_bias=conv_bias, conv_activation=conv_activation,
                pdl=pdl,
            )  # fmt: skip
            for mode in modes
        ]
        # The current GPU's table; without a GPU (warming a disk cache), every table's kernels.
        if torch.cuda.is_available():
            tables = [self._device_table(torch.device("cuda", torch.cuda.current_device()))]
        else:
            tables = self.every_table
        keys = compile_keys(
            tables, arch=info.sm, geometries=geometries, pairs=[(layout, state_dtype)],
            max_tokens=max_tokens, forms=forms,
        )  # fmt: skip
        summary = WarmupSummary()
        started = time.perf_counter()
        for index, key in enumerate(keys):
            found = find_kernel(f"{self.kernels_package}.{key.variant}", key)
            mode = key_mode(key)
            summary.kernels.append((key.variant, key.tokens, mode, found.source))
            if progress:
                done = (index + 1) * 30 // len(keys)
                print(
                    f"\rgdngen warmup [{'#' * done}{'.' * (30 - done)}] {index + 1}/{len(keys)} "
                    f"{key.variant} T={key.tokens} {mode} ({found.source})\033[K",
                    end="" if index + 1 < len(keys) else "\n",
                    file=sys.stderr,
                    flush=True,
                )
        summary.seconds = time.perf_counter() - started
        return summary
