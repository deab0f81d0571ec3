"""What a generated target serves, as its emitted ``__init__`` spells it."""

from __future__ import annotations

from dataclasses import dataclass

from gdngen.spec.model import Geometry


@dataclass(frozen=True)
class TargetInfo:
    name: str
    sm: str
    geometries: tuple[Geometry, ...]
    max_tokens: int
    index_dtypes: tuple[str, ...]
    #: the (layout, state dtype) pairs its dispatch serves
    served: tuple[tuple[str, str], ...]
