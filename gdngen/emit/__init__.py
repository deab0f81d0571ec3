"""Emitting a target: plan the files, render them through the templates, write them."""

from .plan import GENERATOR_VERSION, Measured, PlannedFile, VariantView, dispatch_rows, plan_target
from .render import RenderError, render
from .writer import EmitResult, check, display_path, emit, expected_files

__all__ = [
    "GENERATOR_VERSION",
    "Measured",
    "EmitResult",
    "PlannedFile",
    "RenderError",
    "VariantView",
    "check",
    "dispatch_rows",
    "display_path",
    "emit",
    "expected_files",
    "plan_target",
    "render",
]
