"""Emitting a target: plan the files, render them through the templates, write them."""

from .plan import KernelPlan, PlannedFile, dispatch_rules, plan_target, unmeasured_sets
from .render import RenderError, render
from .writer import EmitError, EmitResult, check, display_path, emit, expected_files

__all__ = [
    "EmitError",
    "EmitResult",
    "KernelPlan",
    "PlannedFile",
    "RenderError",
    "check",
    "dispatch_rules",
    "display_path",
    "emit",
    "expected_files",
    "plan_target",
    "render",
    "unmeasured_sets",
]
