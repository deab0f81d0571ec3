"""Spec models and loading: the declarative input of gdngen."""

from gdngen.dispatch import Range, Rule

from .load import SpecError, load_spec, parse_spec, spec_sha256
from .model import Features, Geometry, Spec, Variant

__all__ = [
    "Features",
    "Geometry",
    "Range",
    "Rule",
    "Spec",
    "SpecError",
    "Variant",
    "load_spec",
    "parse_spec",
    "spec_sha256",
]
