"""gdngen.reference.state_formats: each format's round-trip error within the bound its rounding
implies, stochastic rounding unbiased, error feedback's errors cancelling, and a short drift run
(gdngen.bench.drift) that tells fp32 from bf16. CPU only."""

import math

import pytest
import torch

from gdngen.bench.drift import make_inputs, simulate
from gdngen.reference.state_formats import (
    FP8_E4M3_MAX,
    INT8_MAX,
    STORAGE_DTYPES,
    StoredState,
    bytes_per_element,
    load,
    round_trip,
    scales,
    store,
    stored_scales,
)

SHAPE = (3, 64, 128)  # [heads, V, K]: two 32-row tiles per head
FP32_SLACK = 1e-6  # relative error of the fp32 divide and multiply around the quantizer


def state(seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes, as a state's rows are."""
    gen = torch.Generator().manual_seed(seed)
    row_size = torch.exp(4 * torch.randn(SHAPE[0], SHAPE[1], 1, generator=gen))
    return torch.randn(*SHAPE, generator=gen) * row_size


def test_fp32_is_exact():
    h = state()
    loaded, residual = round_trip(h, "fp32")
    assert torch.equal(loaded, h) and residual is None


@pytest.mark.parametrize("fmt, mantissa_bits", [("bf16", 7), ("fp16", 10)])
def test_casts_within_half_an_ulp(fmt, mantissa_bits):
    """Round to nearest: |error| <= half an ulp <= 2^-(mantissa_bits + 1) * |h| for a normal value
    (the state here stays well inside fp16's normal range: 6.1e-5 to 65504)."""
    h = state().clamp(-6e4, 6e4)
    h = torch.where(h.abs() < 1e-4, torch.full_like(h, 1e-4), h)
    loaded, _ = round_trip(h, fmt)
    assert ((loaded - h).abs() <= 2.0 ** -(mantissa_bits + 1) * h.abs()).all()


@pytest.mark.parametrize("fmt", ["int8_row", "fp8_e4m3_row", "fp8_e4m3_tile32"])
def test_quantized_within_half_a_step(fmt):
    """int8: the quantizer rounds x / s to the nearest integer, so |error| <= s / 2. e4m3: 3
    mantissa bits, so a normal x / s is off by at most 2^-4 of itself, a subnormal one (spacing
    2^-9) by at most 2^-10; in state units |error| <= 2^-4 |h| + 2^-10 s."""
    h = state()
    s = scales(h, fmt)
    loaded, _ = round_trip(h, fmt)
    if fmt.startswith("int8"):
        bound = s / 2
    else:
        bound = 2.0**-4 * h.abs() + 2.0**-10 * s
    assert ((loaded - h).abs() <= bound * (1 + FP32_SLACK) + FP32_SLACK * h.abs()).all()


def test_scales_per_row_and_per_tile():
    h = state()
    row_amax = h.abs().amax(-1, keepdim=True)
    assert torch.allclose(scales(h, "int8_row")[..., :1], row_amax / INT8_MAX)
    assert torch.allclose(scales(h, "fp8_e4m3_row")[..., :1], row_amax / FP8_E4M3_MAX)
    tile = scales(h, "fp8_e4m3_tile32")[..., :1].reshape(SHAPE[0], -1, 32)
    tile_amax = row_amax.reshape(SHAPE[0], -1, 32).amax(-1, keepdim=True)
    assert torch.allclose(tile, (tile_amax / FP8_E4M3_MAX).expand_as(tile))


def test_zero_state_round_trips_to_zero():
    for fmt in ("int8_row", "int8_row_sr", "fp8_e4m3_row", "fp8_e4m3_tile32"):
        loaded, _ = round_trip(torch.zeros(SHAPE), fmt)
        assert torch.equal(loaded, torch.zeros(SHAPE))


def test_stochastic_rounding_is_unbiased():
    """Every element sits a quarter step above a grid point, where round to nearest is biased by
    s / 4. A stochastic round lands on one of the two neighbours, so one draw's error has variance
    at most s^2 / 4, and the mean of N draws a standard deviation at most s / (2 sqrt(N)). Six of
    those bound all 128 elements' means (two-sided 6-sigma: 2e-9 each)."""
    draws = 4096
    s = 1.0 / INT8_MAX
    row = torch.cat([torch.tensor([1.0]), (torch.arange(-60, 67) + 0.25) * s])[None, None, :]
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros_like(row)
    for _ in range(draws):
        total += round_trip(row, "int8_row_sr", generator=gen)[0]
    bias = (total / draws - row).abs()
    bound = 6 * s / (2 * math.sqrt(draws))
    assert (bias <= bound).all()
    nearest_bias = (round_trip(row, "int8_row")[0] - row).abs()[..., 1:]
    assert (nearest_bias > bound).all()  # the test tells the two apart


def test_error_feedback_cancels_over_many_stores():
    """Storing a constant state n times with error feedback: store i loads x_i - r_i where
    x_i = h + r_(i-1), so sum_i (loaded_i - h) = -r_n, at most half a step whatever n; round to
    nearest repeats the same error n times. In fp32 each store's two additions (h + r, x - loaded)
    round by at most 2^-24 of a value below |h| + s, which n stores may add up."""
    h = state()
    stores = 1000
    residual = None
    total_error = torch.zeros(SHAPE, dtype=torch.float64)
    largest_scale = torch.zeros(SHAPE)
    for _ in range(stores):
        stored = h if residual is None else h + residual
        largest_scale = torch.maximum(largest_scale, scales(stored, "int8_row"))
        loaded, residual = round_trip(h, "int8_row_ef", residual=residual)
        total_error += loaded.double() - h.double()
    fp32_rounding = stores * 2 * 2.0**-24 * (h.abs() + largest_scale)
    assert (total_error.abs() <= largest_scale / 2 + fp32_rounding).all()
    nearest_total = stores * (round_trip(h, "int8_row")[0].double() - h.double()).abs()
    assert (nearest_total > largest_scale / 2 + fp32_rounding).any()  # would fail the bound


@pytest.mark.parametrize("fmt", list(STORAGE_DTYPES))
def test_a_pool_holds_values_in_the_storage_dtype_and_compact_scales(fmt):
    h = state(3)
    h[1, 7] = 0  # an all-zero row: scale 1, values 0
    stored = store(h, fmt, generator=torch.Generator().manual_seed(0))
    assert stored.values.dtype == STORAGE_DTYPES[fmt] and stored.values.shape == h.shape
    heads, V, _ = SHAPE
    per = 32 if fmt == "fp8_e4m3_tile32" else 1
    assert stored.scales.dtype == torch.float32 and stored.scales.shape == (heads, V // per)
    assert torch.equal(stored.scales, stored_scales(h, fmt))
    values = stored.values.float()
    top = FP8_E4M3_MAX if fmt.startswith("fp8") else INT8_MAX
    assert values.abs().max() <= top and (values[1, 7] == 0).all()
    if fmt.startswith("int8"):  # the full grid is used: each row's amax lands on +-127
        assert (values.abs().amax(-1)[h.abs().amax(-1) > 0] == INT8_MAX).all()
    # what the kernels compute with is the round trip (stochastic rounding: the same draws)
    again, _ = round_trip(h, fmt, generator=torch.Generator().manual_seed(0))
    if fmt != "int8_row_ef":
        assert torch.equal(load(stored, fmt), again)


def test_stored_scales_broadcast_to_every_elements_scale():
    h = state(4)
    for fmt in STORAGE_DTYPES:
        row = stored_scales(h, fmt)
        if fmt == "fp8_e4m3_tile32":
            row = row.repeat_interleave(32, dim=-1)
        assert torch.equal(scales(h, fmt), row.unsqueeze(-1).expand(SHAPE))


def test_store_and_load_name_a_wrong_format_or_dtype():
    h = state()
    with pytest.raises(ValueError, match="fmt: expected one of .*got 'bf16'"):
        store(h, "bf16")
    stored = store(h, "int8_row")
    with pytest.raises(
        ValueError, match="values: a fp8_e4m3_row pool holds .*float8.*got torch.int8"
    ):
        load(stored, "fp8_e4m3_row")
    with pytest.raises(ValueError, match="fp8_e4m3_tile32 needs V a multiple of 32; got V=48"):
        store(torch.ones(2, 48, 8), "fp8_e4m3_tile32")
    assert isinstance(stored, StoredState)


def test_bytes_per_element():
    assert bytes_per_element("fp32", 128) == 4 and bytes_per_element("bf16", 128) == 2
    assert bytes_per_element("int8_row", 128) == 1 + 4 / 128
    assert bytes_per_element("fp8_e4m3_tile32", 128) == 1 + 4 / (32 * 128)
    assert bytes_per_element("int8_row_ef", 128) == 5 + 4 / 128


def test_short_drift_tells_fp32_from_bf16():
    """64 steps on 2 heads: fp32 state carries only fp32 arithmetic error (~1e-7 relative),
    bf16 one rounding of 2^-9 relative per store at least."""
    errors = simulate(make_inputs(64, 2, seed=0), formats=("fp32", "bf16"))
    fp32, bf16 = errors["fp32"]["state"], errors["bf16"]["state"]
    assert fp32.max() < 1e-5
    assert bf16[-1] > 1e-4
    assert (fp32 * 100 < bf16).all()
