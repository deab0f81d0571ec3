"""A model's recurrent-layer shape, as a plain record.

The spec lists geometries (pydantic validates each as this record: its field types, no unknown
keys, and the checks of ``__post_init__``), and every generated target names the ones it serves
in its ``INFO``. The record imports nothing heavy, so that importing a generated target does not
import pydantic (docs/design.md, "Architecture").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: the head dimensions the kernels are built and tested for (docs/design.md, "Features")
HEAD_DIMS = (64, 128, 256)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class Geometry:
    """One model's recurrent-layer shape: H q/k heads, HV value heads, head dims K and V."""

    # read by pydantic where a spec holds geometries: a key that is no field is an error
    __pydantic_config__ = {"extra": "forbid"}

    name: str
    H: int
    HV: int
    K: int
    V: int

    def __post_init__(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(
                f"name must match {NAME_PATTERN.pattern} (letters, digits, '_', '.', '-'); "
                f"got {self.name!r}"
            )
        if self.H <= 0 or self.HV <= 0:
            raise ValueError(f"H and HV must be positive; got H={self.H}, HV={self.HV}")
        for dim, value in (("K", self.K), ("V", self.V)):
            if value not in HEAD_DIMS:
                raise ValueError(f"{dim}: head dimension must be one of {HEAD_DIMS}, got {value}")
        if self.HV % self.H:
            raise ValueError(
                f"HV must be a multiple of H (each value head reads q/k head hv // (HV // H)); "
                f"got H={self.H}, HV={self.HV}"
            )
