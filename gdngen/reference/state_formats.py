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
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
INT8_MAX = 127.0
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


def scales(h: torch.Tensor, fmt: str) -> torch.Tensor:
    """The fp32 scale of every element's row or tile, broadcast to ``h``'s shape: amax / the
    format's largest value (1 where the row or tile is all zeros, so that nothing divides by 0)."""
    rows = h.abs().amax(-1, keepdim=True)  # [..., V, 1]
    if fmt == "fp8_e4m3_tile32":
        *lead, V, _ = rows.shape
        tiles = rows.reshape(*lead, V // TILE_ROWS, TILE_ROWS).amax(-1, keepdim=True)
        rows = tiles.expand(*lead, V // TILE_ROWS, TILE_ROWS).reshape(*lead, V, 1)
    top = FP8_E4M3_MAX if fmt.startswith("fp8") else INT8_MAX
    return torch.where(rows > 0, rows / top, torch.ones_like(rows)).float().expand_as(h)


def _quantize(x: torch.Tensor, fmt: str, generator: torch.Generator | None) -> torch.Tensor:
    """``x`` (in units of its scale) rounded to the format's grid, still as fp32 values."""
    if fmt.startswith("fp8"):
        return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()
    if fmt == "int8_row_sr":
        noise = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return torch.floor(x + noise).clamp(-INT8_MAX, INT8_MAX)
    return torch.round(x).clamp(-INT8_MAX, INT8_MAX)


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
    scale = scales(h, fmt)
    loaded = _quantize(h / scale, fmt, generator) * scale
    return loaded, (h - loaded if fmt == "int8_row_ef" else None)


def bytes_per_element(fmt: str, K: int) -> float:
    """Bytes a stored state element costs, scales (fp32) and the error-feedback residual
    included, for rows of ``K`` elements."""
    if fmt in CAST_DTYPES:
        return float(torch.finfo(CAST_DTYPES[fmt]).bits // 8)
    per_scale = K * (TILE_ROWS if fmt == "fp8_e4m3_tile32" else 1)
    residual = 4.0 if fmt == "int8_row_ef" else 0.0
    return 1.0 + 4.0 / per_scale + residual
