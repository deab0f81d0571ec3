"""The words every part of gdngen shares: state layouts, state dtypes, SM targets, index dtypes.

Spec models, dispatch rules, tuning files and the runtime checks all validate against these, so
a new layout or dtype is added here once (see docs/design.md, "Features").
"""

from __future__ import annotations

from types import ModuleType
from typing import Literal, NamedTuple, get_args

Layout = Literal["k_last", "v_last"]
StateDtype = Literal["bf16", "fp16", "fp32", "int8", "fp8_e4m3"]
#: state dtypes stored quantized, each value row with its fp32 scale in ``state_scales``, and
#: the format of gdngen.reference.state_formats each is (docs/design.md, "Quantized state")
SCALED_STATE_FORMATS = {"int8": "int8_row", "fp8_e4m3": "fp8_e4m3_row"}
SCALED_STATE_DTYPES = tuple(SCALED_STATE_FORMATS)
#: the largest value each stores, in units of its row's scale (scale = the row's amax / it): the
#: int8 range, and the largest finite e4m3fn (torch.finfo(torch.float8_e4m3fn).max)
SCALED_STATE_MAX = {"int8": 127.0, "fp8_e4m3": 448.0}
#: bytes per state element, by state dtype (a scaled dtype's scales apart)
STATE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int8": 1, "fp8_e4m3": 1}
#: the SM targets a spec may name; gdngen.sm has what each offers a kernel
SmTarget = Literal["sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a"]
IndexDtype = Literal["int32", "int64"]
#: which calls a dispatch rule serves: those that cache per-token states ("yes", speculative
#: verify), those that do not ("no", plain decode), or both ("any")
Intermediate = Literal["any", "yes", "no"]
#: the activations of the gate z in the gated RMSNorm epilogue: silu(z) = z * sigmoid(z), sigmoid
NORM_ACTIVATIONS = ("silu", "sigmoid")
#: the conv1d prologue's activations ("identity": none)
CONV_ACTIVATIONS = ("silu", "identity")


def require_activation(argument: str, value: str, allowed: tuple[str, ...]) -> None:
    """ValueError naming ``argument`` unless ``value`` is one of ``allowed`` (the launchers'
    trace-time check of an activation the checks have not seen, as in an ahead-of-time build)."""
    if value not in allowed:
        raise ValueError(f"{argument}: expected one of {allowed}; got {value!r}")


#: the most CTAs a thread-block cluster may have on every SM target without a non-portable
#: opt-in: the gated RMSNorm epilogue's CTAs of one head form a cluster (gdngen.device.norm)
PORTABLE_CLUSTER = 8


def kernel_serves_head_dims(module: ModuleType, K: int, V: int) -> bool:
    """Whether an emitted kernel module (its HEAD_K_DIM and TILE_V) is built for head dims (K, V):
    its K, and V a multiple of its tile (the knobs' side: gdngen.spec.model.Variant)."""
    return module.HEAD_K_DIM == K and V % module.TILE_V == 0


def sm_suffix(sm: str) -> str:
    """How a variant's name ends for an SM target: ``sm_90a`` -> ``sm90``."""
    return sm.removesuffix("a").replace("_", "")


def step_name(kind: str, sm: str) -> str:
    """A step kernel's module in a target's kernels package (``kind``: its device module,
    ``conv_step`` or ``norm_step``): ``conv_step_sm90`` for sm_90a."""
    return f"{kind}_{sm_suffix(sm)}"


def conv_step_name(sm: str) -> str:
    """The conv step's module (gdngen.runtime.conv_step)."""
    return step_name("conv_step", sm)


def norm_step_name(sm: str) -> str:
    """The norm step's module (gdngen.runtime.norm_step)."""
    return step_name("norm_step", sm)


#: how a tuning file names the split plan of a variant (the conv step, then the variant):
#: ``split:<variant>``, and its steps plan (the conv step, the variant without the norm, the
#: norm step): ``steps:<variant>``; the variant's own name is its fused plan. A plan launched
#: without programmatic dependent launch begins ``nopdl:`` (docs/design.md, "Tuning the
#: decode core")
SPLIT_PLAN = "split:"
STEPS_PLAN = "steps:"
NO_PDL_PLAN = "nopdl:"


class Plan(NamedTuple):
    """A decode-core plan (:func:`plan_name`): its variant, which steps run as kernels of their
    own, and whether the kernels launch with programmatic dependent launch."""

    variant: str
    split_conv: bool = False
    split_norm: bool = False
    pdl: bool = True


def plan_name(variant: str, split_conv: bool, split_norm: bool = False, pdl: bool = True) -> str:
    """A decode-core plan's name in a tuning file: the variant, ``split:<variant>`` or
    ``steps:<variant>``, after ``nopdl:`` without PDL. A core cell's plans split the norm off
    only with the conv."""
    if split_norm and not split_conv:
        raise ValueError("split_norm: a core plan that splits the norm off splits the conv too")
    name = STEPS_PLAN + variant if split_norm else SPLIT_PLAN + variant if split_conv else variant
    return name if pdl else NO_PDL_PLAN + name


def plan_parts(name: str) -> Plan:
    """The :class:`Plan` a plan's name (:func:`plan_name`) stands for."""
    pdl = not name.startswith(NO_PDL_PLAN)
    name = name if pdl else name[len(NO_PDL_PLAN) :]
    if name.startswith(STEPS_PLAN):
        return Plan(name[len(STEPS_PLAN) :], True, True, pdl)
    if name.startswith(SPLIT_PLAN):
        return Plan(name[len(SPLIT_PLAN) :], True, False, pdl)
    return Plan(name, False, False, pdl)


def pair_key(layout: str, state_dtype: str) -> str:
    """How a (layout, state dtype) pair is named in files and messages: ``k_last/bf16``."""
    return f"{layout}/{state_dtype}"


#: how a variant's canonical name begins, by layout (gdngen.spec.model.Variant.name_for)
LAYOUT_PREFIX = {"k_last": "kl", "v_last": "vl"}


def variant_pair(name: str) -> tuple[str, str]:
    """The (layout, state dtype) a canonical variant name spells: ``kl_bf16_...`` -> k_last/bf16.
    (The runtime reads it from the name, so that it need not import the kernel's code.)"""
    prefix, _, rest = name.partition("_")
    layouts = {p: layout for layout, p in LAYOUT_PREFIX.items()}
    return layouts[prefix], next(d for d in _DTYPES_LONGEST_FIRST if rest.startswith(d + "_"))


#: the state dtypes, longest first: the one a variant name's rest begins with is the longest that
#: matches (fp8_e4m3 has a "_" of its own)
_DTYPES_LONGEST_FIRST = sorted(get_args(StateDtype), key=len, reverse=True)
