"""What a generated target serves, as its emitted ``__init__`` spells it."""

from __future__ import annotations

from dataclasses import dataclass

from gdngen.geometry import Geometry


@dataclass(frozen=True)
class TargetInfo:
    name: str
    sm: str
    geometries: tuple[Geometry, ...]
    max_tokens: int
    index_dtypes: tuple[str, ...]
    #: the (layout, state dtype) pairs its dispatch serves
    served: tuple[tuple[str, str], ...]
    #: the spec it was emitted from, as emit was given it (errors say what to add there)
    spec: str = ""
    #: the call takes the gated RMSNorm epilogue's z and norm_weight (features.gated_rmsnorm)
    gated_rmsnorm: bool = False
    #: the conv1d prologue's widths (features.conv1d_widths); empty: no prologue
    conv1d_widths: tuple[int, ...] = ()

    def serves_geometry(self, H: int, HV: int, K: int, V: int) -> bool:
        return any((g.H, g.HV, g.K, g.V) == (H, HV, K, V) for g in self.geometries)

    def served_geometries(self) -> str:
        """Its geometries, named with their shapes, for messages."""
        return ", ".join(
            f"{g.name} (H={g.H}, HV={g.HV}, K={g.K}, V={g.V})" for g in self.geometries
        )

    def add_to_spec(self, what: str) -> str:
        """How to make the target serve something: ``what`` to add, and the command after."""
        spec = self.spec or f"the spec of target {self.name}"
        regenerate = f"gdngen emit {self.spec}" if self.spec else "gdngen emit on it"
        return f"To serve it, add {what} to {spec} and run `{regenerate}`."
