"""Storage formats of the recurrent state, as CPU round trips (issue 51: the precision contract
of a quantized state, measured by :mod:`gdngen.bench.drift`).

A kernel computes in fp32 and stores the state once per call; the next call loads it and widens
it to fp32 again. :func:`round_trip` is that store followed by that load. The state is K-last,
``[..., V, K]``: a *row* is one value index (K elements), a *tile* 32 consecutive rows.

- ``fp32``, ``bf16``, ``fp16``: plain casts (round to nearest even).
- ``fp8_e4m3_row``: ``torch.float8_e4m3fn`` with one fp32 scale per row, ``amax / 448``.
- ``fp8_e4m3_tile32``: the same with one scale per 32-row tile (SGLang's proposal, #40706).
  The scale maps the tile's amax onto 448, the largest e4m3fn value. SGLang's proposal divides
  by 240, the largest value of e4m3fnuz (AMD's variant); on e4m3fn that leaves the top binade
  unused and pushes the small elements of the tile one binade nearer to the subnormals, where
  the relative step grows, for no gain.
- ``int8_row``: symmetric int8, one fp32 scale per row, ``amax / 127``, round to nearest.
- ``int8_row_sr``: the same with stochastic rounding (``floor(x / s + U[0, 1))``): unbiased, so
  updates smaller than half a step survive in expectation instead of being dropped.
- ``int8_row_ef``: the same with error feedback: the rounding residual of the previous store is
  added to the state before it is quantized again, so the errors of successive stores cancel
  instead of adding up. The residual is a second fp32 tensor of the state's size kept between
  calls: 4 more bytes per element, more than the fp32 state it was meant to replace.

:func:`store` and :func:`load` are the same two halves with the state as a quantized pool would
hold it (:class:`StoredState`): the values in the format's storage dtype (int8, float8_e4m3fn)
and the scales as their own fp32 tensor, one per row (``[..., V]``) or per tile
(``[..., V // 32]``), indexed like the state; :func:`round_trip` is ``load(store(h))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdngen.terms import SCALED_STATE_MAX

FP8_E4M3_MAX = SCALED_STATE_MAX["fp8_e4m3"]  # torch.finfo(torch.float8_e4m3fn).max
INT8_MAX = SCALED_STATE_MAX["int8"]
TILE_ROWS = 32

CAST_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FORMATS = (
    "fp32",
    "bf16",
    "fp16",
    "fp8_e4m3_row",
    "fp8_e4m3_tile32",
    "int8_row",
    "int8_row_sr",
    "int8_row_ef",
)


#: the storage dtype of each scaled format's values
STORAGE_DTYPES = {
    "fp8_e4m3_row": torch.float8_e4m3fn,
    "fp8_e4m3_tile32": torch.float8_e4m3fn,
    "int8_row": torch.int8,
    "int8_row_sr": torch.int8,
    "int8_row_ef": torch.int8,
}


def stored_scales(h: torch.Tensor, fmt: str) -> torch.Tensor:
    """The fp32 scales a pool of ``fmt`` holds for the state ``h`` ``[..., V, K]``: one per row
    (``[..., V]``) or per 32-row tile (``[..., V // 32]``), amax / the format's largest value (1
    where the row or tile is all zeros, so that nothing divides by 0)."""
    amax = h.abs().amax(-1)  # [..., V]
    if fmt == "fp8_e4m3_tile32":
        *lead, V = amax.shape
        if V % TILE_ROWS:
            raise ValueError(f"state: {fmt} needs V a multiple of {TILE_ROWS}; got V={V}")
        amax = amax.reshape(*lead, V // TILE_ROWS, TILE_ROWS).amax(-1)
    top = FP8_E4M3_MAX if fmt.startswith("fp8") else INT8_MAX
    return torch.where(amax > 0, amax / top, torch.ones_like(amax)).float()


def _per_element(scale: torch.Tensor, fmt: str, shape: torch.Size) -> torch.Tensor:
    """Stored scales broadcast to the state's ``[..., V, K]``."""
    if fmt == "fp8_e4m3_tile32":
        scale = scale.repeat_interleave(TILE_ROWS, dim=-1)
    return scale.unsqueeze(-1).expand(shape)


def scales(h: torch.Tensor, fmt: str) -> torch.Tensor:
    """The fp32 scale of every element's row or tile, broadcast to ``h``'s shape
    (:func:`stored_scales`)."""
    return _per_element(stored_scales(h, fmt), fmt, h.shape)


def _quantize(x: torch.Tensor, fmt: str, generator: torch.Generator | None) -> torch.Tensor:
    """``x`` (in units of its scale) rounded to the format's grid, still as fp32 values."""
    if fmt.startswith("fp8"):
        return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()
    if fmt == "int8_row_sr":
        noise = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return torch.floor(x + noise).clamp(-INT8_MAX, INT8_MAX)
    return torch.round(x).clamp(-INT8_MAX, INT8_MAX)


@dataclass(frozen=True)
class StoredState:
    """A state as a pool of a scaled format holds it: ``values`` ``[..., V, K]`` in the
    format's storage dtype, ``scales`` fp32 per row or tile (:func:`stored_scales`)."""

    values: torch.Tensor
    scales: torch.Tensor


def store(h: torch.Tensor, fmt: str, *, generator: torch.Generator | None = None) -> StoredState:
    """``h`` (``[..., V, K]``) quantized into a scaled format (not a cast, not error feedback's
    residual: :func:`round_trip` adds that before the store)."""
    if fmt not in STORAGE_DTYPES:
        raise ValueError(f"fmt: expected one of {tuple(STORAGE_DTYPES)}; got {fmt!r}")
    h = h.float()
    scale = stored_scales(h, fmt)
    grid = _quantize(h / _per_element(scale, fmt, h.shape), fmt, generator)
    return StoredState(grid.to(STORAGE_DTYPES[fmt]), scale)


def load(stored: StoredState, fmt: str) -> torch.Tensor:
    """The fp32 state a kernel computes with, from a pool of a scaled format."""
    values = stored.values
    if values.dtype != STORAGE_DTYPES.get(fmt):
        raise ValueError(
            f"values: a {fmt} pool holds {STORAGE_DTYPES.get(fmt)}; got {values.dtype}"
        )
    return values.float() * _per_element(stored.scales, fmt, values.shape)


def round_trip(
    h: torch.Tensor,
    fmt: str,
    *,
    generator: torch.Generator | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Store ``h`` (fp32, ``[..., V, K]``) in ``fmt`` and load it back as fp32.

    Returns the loaded state and, for ``int8_row_ef``, the residual to pass to the next store
    (``residual`` is the previous one, None at the first store); None for the other formats.
    ``generator`` drives stochastic rounding (``int8_row_sr``)."""
    h = h.float()
    if fmt in CAST_DTYPES:
        return h.to(CAST_DTYPES[fmt]).float(), None
    if fmt == "int8_row_ef" and residual is not None:
        h = h + residual
    loaded = load(store(h, fmt, generator=generator), fmt)
    return loaded, (h - loaded if fmt == "int8_row_ef" else None)


def bytes_per_element(fmt: str, K: int) -> float:
    """Bytes a stored state element costs, scales (fp32) and the error-feedback residual
    included, for rows of ``K`` elements."""
    if fmt in CAST_DTYPES:
        return float(torch.finfo(CAST_DTYPES[fmt]).bits // 8)
    per_scale = K * (TILE_ROWS if fmt == "fp8_e4m3_tile32" else 1)
    residual = 4.0 if fmt == "int8_row_ef" else 0.0
    return 1.0 + 4.0 / per_scale + residual
