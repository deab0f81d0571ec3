"""Plain descriptions of a generated target, as its emitted ``__init__`` spells them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    name: str
    H: int
    HV: int
    K: int
    V: int


@dataclass(frozen=True)
class TargetInfo:
    name: str
    sm: str
    geometries: tuple[Geometry, ...]
    max_tokens: int
    index_dtypes: tuple[str, ...]
    served: tuple[tuple[str, str], ...]
