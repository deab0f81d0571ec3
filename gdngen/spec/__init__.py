"""Spec models and loading: the declarative input of gdngen."""

from .load import SpecError, load_spec, parse_spec, spec_sha256
from .model import DispatchRule, Features, Geometry, Range, Spec, Variant

__all__ = [
    "DispatchRule",
    "Features",
    "Geometry",
    "Range",
    "Spec",
    "SpecError",
    "Variant",
    "load_spec",
    "parse_spec",
    "spec_sha256",
]
