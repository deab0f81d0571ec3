"""A generated target at run time: its info, its dispatch table and its kernel modules."""

from __future__ import annotations

from .checks import Call
from .dispatch import Row, select
from .info import Geometry, TargetInfo
from .launcher import DecodeCall

__all__ = ["Geometry", "Target", "TargetInfo"]


class Target:
    def __init__(
        self,
        info: TargetInfo,
        table: tuple[Row, ...],
        variants: tuple[str, ...],
        *,
        kernels_package: str,
    ) -> None:
        self.info = info
        self.table = table
        self.variants = variants
        self.kernels_package = kernels_package
        unknown = sorted({row.variant for row in table} - set(variants))
        if unknown:
            raise ImportError(f"target {info.name}: dispatch rows name unknown variants {unknown}")
        self.gdn_decode = DecodeCall(
            "gdn_decode", lambda: info, self._choose, lambda: kernels_package
        )

    def select(
        self, *, layout: str, state_dtype: str, tokens: int, batch_heads: int, intermediate: bool
    ) -> Row:
        """The dispatch row that serves a call of this shape."""
        return select(
            self.table,
            layout=layout,
            state_dtype=state_dtype,
            tokens=tokens,
            batch_heads=batch_heads,
            intermediate=intermediate,
        )

    def _choose(self, call: Call) -> str:
        return self.select(
            layout=call.layout,
            state_dtype=call.state_dtype,
            tokens=call.tokens,
            batch_heads=call.batch_heads,
            intermediate=call.cache,
        ).variant

    def variant(self, name: str) -> DecodeCall:
        """One variant's call, with no dispatch (for tests, benchmarks and pinning)."""
        if name not in self.variants:
            raise ValueError(
                f"variant: {name!r} is not a variant of target {self.info.name}; "
                f"it has {', '.join(self.variants)}"
            )
        return DecodeCall(name, lambda: self.info, lambda call: name, lambda: self.kernels_package)
