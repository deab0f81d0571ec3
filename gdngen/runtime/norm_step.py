"""The norm-split plan of a call with the gated RMSNorm: the decode kernel without the epilogue,
then the norm as a kernel of its own, in place on the output (docs/design.md, "The norm step
apart"; device code: gdngen.device.norm_step).

A dispatch rule with ``split_norm`` names the decode variant that runs before the step; it need
not have the epilogue (a head over more CTAs than one cluster holds). The step reads the
output the decode kernel stored, z and the norm weight, and nothing else of the call.
"""

from __future__ import annotations

from dataclasses import replace

from gdngen.terms import norm_step_name

from .compile import CompileKey, fake_arguments
from .kernel_args import KERNEL_ARGS, LAUNCH_ONLY_ARGS, RUN_TIME_ARGS

#: the norm step's parameters, in ``launch``'s order (gdngen.device.norm_step), and where each
#: comes from: a decode kernel's argument of that name
TENSORS = ("out", "z", "norm_weight", "cu_seqlens", "norm_eps")
OPTIONS = ("T", "uniform_rows", "norm_activation", "pdl")

_AT = {arg.name: index for index, arg in enumerate(RUN_TIME_ARGS)}
#: where the step's run-time arguments sit in the decode kernel's launch tuple
TENSORS_AT = tuple(_AT[name] for name in TENSORS)
#: what the decode kernel takes only with the epilogue: None in the norm-split plan
EPILOGUE_ONLY_AT = tuple(_AT[name] for name in ("z", "norm_weight"))


def norm_step_module(kernels_package: str, arch: str) -> str:
    return f"{kernels_package}.{norm_step_name(arch)}"


def norm_step_key(key: CompileKey, variant: str) -> CompileKey:
    """The norm step's key from the call's (with the epilogue): only what the step reads is
    kept (the output's and z's form, the weight's dtype, the activation, the packed rows' form,
    PDL); the rest is set to one value, so that calls differing only there share one binary.
    K is set to V and H to HV (the step reads neither)."""
    return CompileKey(
        variant=variant, arch=key.arch, tokens=key.tokens, H=key.HV, HV=key.HV, K=key.V,
        V=key.V, io_dtype=key.io_dtype, gate_dtype="fp32", dt_bias_dtype="fp32",
        state_dtype="fp32", index_dtype=None, separate_write_slots=False, cache=False,
        write_final_state=False, use_qk_l2norm=False, cu_seqlens_dtype=key.cu_seqlens_dtype,
        uniform_rows=key.uniform_rows, norm_activation=key.norm_activation,
        norm_weight_dtype=key.norm_weight_dtype, pdl=key.pdl,
    )  # fmt: skip


def without_norm(key: CompileKey) -> CompileKey:
    """The decode kernel's key in the norm-split plan: the call's, without the epilogue."""
    return replace(key, norm_activation=None, norm_weight_dtype=None)


def fake_norm_step_arguments(key: CompileKey) -> list:
    """Stand-ins for the norm step's ``launch`` arguments (TENSORS, OPTIONS, ``launch_pdl``,
    the stream), from the decode kernel's stand-ins for the same key."""
    names = [arg.name for arg in KERNEL_ARGS + LAUNCH_ONLY_ARGS] + ["stream"]
    given = dict(zip(names, fake_arguments(key, "k_last")))
    options = dict(
        T=key.tokens, uniform_rows=key.uniform_rows, norm_activation=key.norm_activation,
        pdl=key.pdl,
    )  # fmt: skip
    return [
        *(given[name] for name in TENSORS),
        *(options[name] for name in OPTIONS),
        given["launch_pdl"],
        given["stream"],
    ]
