"""The staged solve's lane bookkeeping, checked without a GPU.

gdngen.device.lanes.reduce_scatter computes the reduce-scatter rounds, the rows a lane owns
afterwards and which lane writes them; the generated kernels import it. Here a group of lanes is
simulated with those numbers exactly as the kernel template uses them, and every row's h.k and h.q must end up
fully reduced on the lanes that claim them. The per-warp product lists must cover every token
pair once.
"""

import itertools

import pytest

from gdngen.device.lanes import lane_stride, reduce_scatter
from gdngen.device.staging import output_products, solve_products
from gdngen.spec.model import Variant

KNOB_POINTS = [
    dict(layout=layout, state_dtype=dtype, tile_v=tile_v, ilp=ilp, vec=vec, threads_per_group=tpg)
    for layout, dtype, tile_v, ilp, vec, tpg in [
        ("k_last", "bf16", 8, 1, 8, 16),
        ("k_last", "bf16", 16, 2, 8, 16),
        ("k_last", "bf16", 16, 4, 8, 16),
        ("k_last", "bf16", 64, 8, 8, 16),
        ("k_last", "bf16", 128, 16, 8, 16),
        ("k_last", "fp32", 32, 8, 4, 32),
        ("k_last", "fp32", 16, 4, 4, 32),
        ("v_last", "bf16", 128, 4, 16, 8),
        ("v_last", "bf16", 64, 8, 8, 16),
        ("v_last", "fp32", 32, 4, 8, 16),
    ]
]


def _scatter(variant: Variant):
    return reduce_scatter(variant.ilp, variant.threads_per_group, _stride(variant))


def _stride(variant: Variant) -> int:
    return lane_stride(variant.layout, variant.threads_per_group)


def _simulate(variant: Variant) -> list[list[float]]:
    """Run the template's reduce-scatter over one group; returns each lane's held values."""
    tpg, ilp = variant.threads_per_group, variant.ilp
    scatter = _scatter(variant)
    # Lane `lane`'s partial sum for value index x (x < ilp: h.k of row x, else h.q of row x - ilp):
    # distinct powers so any wrong or missing term shows.
    partial = [[float((lane + 1) * 1000 + x) for x in range(2 * ilp)] for lane in range(tpg)]
    sums = [row[:] for row in partial]
    for offset, mask, half in scatter.levels:
        assert offset == _stride(variant) * mask
        sent = []
        for lane in range(tpg):
            upper = bool(lane & mask)
            sent.append([sums[lane][s] if upper else sums[lane][s + half] for s in range(half)])
        new = []
        for lane in range(tpg):
            upper = bool(lane & mask)
            partner = lane ^ mask
            keep = [sums[lane][s + half] if upper else sums[lane][s] for s in range(half)]
            new.append([keep[s] + sent[partner][s] for s in range(half)])
        sums = new
    for offset in scatter.rest_offsets:
        mask = offset // _stride(variant)
        sums = [
            [sums[lane][s] + sums[lane ^ mask][s] for s in range(scatter.rows_held)]
            for lane in range(tpg)
        ]
    return sums


@pytest.mark.parametrize(
    "knobs", KNOB_POINTS, ids=lambda k: Variant(**k, solve="staged").name_for("sm_90a")
)
def test_reduce_scatter_leaves_each_lane_its_rows(knobs):
    variant = Variant(**knobs, solve="staged")
    tpg, ilp = variant.threads_per_group, variant.ilp
    held = _simulate(variant)
    scatter = _scatter(variant)
    total = {x: sum(float((lane + 1) * 1000 + x) for lane in range(tpg)) for x in range(2 * ilp)}
    writers = {}
    for lane in range(tpg):
        row_first = sum((lane // mask) % 2 * rows for mask, rows in scatter.row_bits)
        query = bool(lane & scatter.query_mask)
        assert len(held[lane]) == scatter.rows_held
        for j in range(scatter.rows_held):
            index = (ilp if query else 0) + row_first + j
            assert held[lane][j] == total[index], (lane, j)
        # The h.k / h.q partner holds the other half of the same rows.
        partner = lane ^ scatter.query_mask
        partner_first = sum((partner // mask) % 2 * rows for mask, rows in scatter.row_bits)
        assert partner_first == row_first and bool(partner & scatter.query_mask) != query
        if lane & scatter.writer_mask == 0:
            for j in range(scatter.rows_held):
                assert row_first + j not in writers, "two lanes write one row"
                writers[row_first + j] = lane
    assert sorted(writers) == list(range(ilp)), "every row has exactly one writer"


@pytest.mark.parametrize("tokens,warps", list(itertools.product([1, 2, 3, 5, 8, 16], [1, 2, 4, 8])))
def test_token_products_cover_each_pair_once(tokens, warps):
    output = [p for w in range(warps) for p in output_products(tokens, warps, w)]
    solve = [p for w in range(warps) for p in solve_products(tokens, warps, w)]
    assert sorted(output) == [(t, s) for t in range(tokens) for s in range(t + 1)]
    assert sorted(solve) == [(t, s) for t in range(tokens) for s in range(t)]
    loads = [
        len(output_products(tokens, warps, w)) + len(solve_products(tokens, warps, w))
        for w in range(warps)
    ]
    assert max(loads) - min(loads) <= 1, "the products are spread evenly over the warps"


def test_row_passes_fit_the_tile():
    base = dict(layout="k_last", state_dtype="bf16", ilp=4, vec=8, threads_per_group=16)
    staged = Variant(**base, tile_v=128, row_passes=4, solve="staged")
    assert staged.groups == 8 and staged.threads == 128
    assert staged.name_for("sm_90a") == "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_staged_sm90"
    with pytest.raises(ValueError, match="multiple of ilp \\* row_passes"):
        Variant(**base, tile_v=16, row_passes=8, solve="staged")
    with pytest.raises(ValueError, match="power of two"):
        Variant(**base, tile_v=96, row_passes=3, solve="staged")
