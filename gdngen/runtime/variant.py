"""The per-variant call that every emitted kernel module exposes as ``gdn_decode``."""

from __future__ import annotations

import importlib

from .launcher import Choice, DecodeCall


def bind_variant(module_name: str) -> DecodeCall:
    """``generated.<target>.kernels.<variant>`` -> that variant's call, checked against the
    target's info (imported on first use, so that importing a kernel module stays cheap)."""
    kernels_package, _, variant = module_name.rpartition(".")
    target_package = kernels_package.rpartition(".")[0]

    def info():
        return importlib.import_module(target_package).INFO

    return DecodeCall(variant, info, lambda call: Choice(variant), lambda: kernels_package)
