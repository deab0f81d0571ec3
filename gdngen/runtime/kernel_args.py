"""The decode call's arguments, declared once: the public keywords of ``gdn_decode`` and the
kernel's parameters, in order.

Everything that lists them derives from the two tables here (docs/design.md, "Architecture"):
``DecodeCall``'s signature, ``DecodeCall.CHECKED`` and the argument tuple it launches with
(gdngen.runtime.launcher), the fake arguments of an ahead-of-time compile
(gdngen.runtime.compile), and the parameter list of every emitted ``decode_kernel``
(gdngen/templates/decode.py.j2, through the emit plan). ``launch`` (gdngen.device.launch) is
a traced function whose parameters CuTe DSL reads from its source, so it spells them; a test
holds it to :data:`KERNEL_ARGS`. Adding an argument is one row here, its checks, and its use.

Plain dataclasses: the runtime imports this on every target import (no pydantic there).
"""

from __future__ import annotations

from dataclasses import dataclass

#: a kernel argument's role; the first four are tensors, passed (or None) on every launch
INPUT = "input"  # a tensor the kernel reads
IN_PLACE = "in place"  # a tensor the kernel writes (the state, the output, the caches)
INDEX = "index"  # an index table: slots, sequence offsets, cache rows
WORKSPACE = "workspace"  # a tensor the runtime owns (gdngen.runtime.workspace)
SCALAR = "scalar"  # a run-time number
OPTION = "option"  # a compile-time value (Constexpr): part of the CompileKey
LAUNCH = "launch"  # a run-time value of the launch itself, which the kernel does not take
TENSOR_ROLES = (INPUT, IN_PLACE, INDEX, WORKSPACE)


@dataclass(frozen=True)
class Keyword:
    """One keyword of the public call, ``gdn_decode(q, k, v, state, A_log, a, dt_bias, b, *,
    ...)``."""

    name: str
    default: object = None
    #: one of the leading tensors, which may be passed by position
    positional: bool = False
    #: check_call takes it (``mixed_qkv`` is turned into q, k, v before: gdngen.runtime.views)
    checked: bool = True


@dataclass(frozen=True)
class KernelArg:
    """One parameter of ``decode_kernel`` and ``launch``."""

    name: str
    role: str
    #: the parameter's annotation; "" for a tensor that is None when the call has no use for it
    annotation: str = ""
    #: where its value comes from: for a run-time argument, the name the call's launch holds it
    #: under (a keyword, or what the call derives from them); for an option, the CompileKey field
    source: str = ""
    #: an option's value when its CompileKey field is None (the feature is off)
    default: object = None

    @property
    def compile_time(self) -> bool:
        return self.role == OPTION

    @property
    def value(self) -> str:
        return self.source or self.name


def _tensors(role: str, *names: str, annotation: str = "") -> list[KernelArg]:
    return [KernelArg(name, role, annotation) for name in names]


#: the public call, in its signature's order
KEYWORDS: tuple[Keyword, ...] = (
    *(
        Keyword(name, positional=True)
        for name in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")
    ),
    Keyword("scale"),
    Keyword("output"),
    Keyword("use_qk_l2norm", True),
    Keyword("initial_state"),
    Keyword("initial_state_indices"),
    Keyword("output_state_indices"),
    Keyword("intermediate_states_buffer"),
    Keyword("disable_state_update", False),
    Keyword("backend", "auto"),
    Keyword("state_layout", "k_last"),
    Keyword("check_indices", False),
    Keyword("null_slot", -1),
    Keyword("cu_seqlens"),
    Keyword("max_seqlen"),
    Keyword("uniform_seqlen", False),
    Keyword("num_accepted_tokens"),
    Keyword("intermediate_state_indices"),
    Keyword("ssm_state_indices"),
    Keyword("accepted_steps"),
    Keyword("recovery_steps", 0),
    Keyword("mixed_qkv", checked=False),
    Keyword("z"),
    Keyword("norm_weight"),
    Keyword("norm_eps", 1e-6),
    Keyword("norm_activation", "silu"),
    Keyword("conv_state"),
    Keyword("conv_weight"),
    Keyword("conv_bias"),
    Keyword("conv_activation", "silu"),
    Keyword("intermediate_conv_windows"),
    Keyword("enable_pdl"),
    Keyword("state_scales"),
    Keyword("intermediate_states_scales"),
)

#: the kernel's parameters, in ``decode_kernel``'s (and ``launch``'s) order: the decode core's
#: tensors, scale and options, then the gated RMSNorm's, then the conv1d prologue's
KERNEL_ARGS: tuple[KernelArg, ...] = (
    *_tensors(INPUT, "q", "k", "v", "a", "b", "A_log", "dt_bias", annotation="cute.Tensor"),
    KernelArg("state", IN_PLACE, "cute.Tensor", source="pool"),
    KernelArg("read_slots", INDEX, source="initial_state_indices"),
    # output_state_indices [N], or FlashInfer's per-token table ssm_state_indices [N, T]
    KernelArg("write_slots", INDEX, source="write_slots"),
    KernelArg("num_accepted", INDEX, source="num_accepted_tokens"),
    KernelArg("cu_seqlens", INDEX),
    KernelArg("cache_rows", INDEX, source="intermediate_state_indices"),
    # FlashInfer's state recovery: each row's last accepted token [N] (docs/design.md, "State
    # recovery")
    KernelArg("accepted_steps", INDEX),
    KernelArg("out", IN_PLACE, "cute.Tensor", source="output"),
    KernelArg("cache", IN_PLACE, source="intermediate_states_buffer"),
    KernelArg("scale", SCALAR, "Float32", source="plan.scale"),
    KernelArg("T", OPTION, "Constexpr[int]", source="tokens"),
    *(
        KernelArg(name, OPTION, f"Constexpr[{kind}]", source=name)
        for name, kind in (
            ("use_qk_l2norm", "bool"),
            ("write_final_state", "bool"),
            ("null_slot", "int"),
            ("per_token_slots", "bool"),
            ("uniform_rows", "bool"),
            ("exact_slot_table", "bool"),
            ("recovery_steps", "int"),
        )
    ),
    *_tensors(INPUT, "z", "norm_weight"),
    KernelArg("norm_eps", SCALAR, "Float32", source="plan.norm_eps"),
    KernelArg("norm_activation", OPTION, "Constexpr[str]", "norm_activation", default="silu"),
    KernelArg("conv_state", IN_PLACE),
    KernelArg("conv_weight", INPUT, source="conv_weight_view"),
    KernelArg("conv_bias", INPUT),
    KernelArg("conv_arrivals", WORKSPACE, source="plan.conv_arrivals"),
    KernelArg("conv_windows", IN_PLACE, source="intermediate_conv_windows"),
    KernelArg("conv_activation", OPTION, "Constexpr[str]", "conv_activation", default="silu"),
    # Programmatic dependent launch (docs/design.md, "Programmatic dependent launch"): the
    # kernel waits for the grid before it only where it first reads what that grid may write
    KernelArg("pdl", OPTION, "Constexpr[bool]", "pdl", default=False),
    # A quantized (int8, fp8) state's fp32 scale per row [slots, HV, V] (docs/design.md,
    # "Quantized state")
    KernelArg("state_scales", IN_PLACE),
    # and its verify cache's, one per row of each cache row's steps and heads [R, steps, HV, V]
    KernelArg("cache_scales", IN_PLACE, source="intermediate_states_scales"),
)

#: what ``launch`` takes after the kernel's parameters: whether this launch may overlap the
#: kernel before it on the stream (a run-time value, so that one binary serves both:
#: gdngen.runtime.pdl decides it per call)
LAUNCH_ONLY_ARGS: tuple[KernelArg, ...] = (KernelArg("launch_pdl", LAUNCH, "Int32"),)

#: what a launch of the compiled kernel takes, in order (the options are compiled in)
RUN_TIME_ARGS = tuple(arg for arg in KERNEL_ARGS + LAUNCH_ONLY_ARGS if not arg.compile_time)
COMPILE_TIME_ARGS = tuple(arg for arg in KERNEL_ARGS if arg.compile_time)
#: the keywords check_call takes, with the call's defaults
CHECKED = {keyword.name: keyword.default for keyword in KEYWORDS if keyword.checked}
