"""The K-split knob (k_splits) and the prefetch knob, without a GPU.

The lane mapping below is the one body.py.j2 prints for a variant (thread -> K split, group,
lane; rows from the group, K columns from the split and the lane), rebuilt from the same derived
numbers; the tests check that it covers every (row, K column) of a CTA's tile exactly once, that
each load instruction of a warp reads contiguous memory where the knob promises it, and that the
shared-memory sums add up to the whole row's dot products.
"""

import itertools
from pathlib import Path

import pytest

from gdngen.device.lanes import lane_stride
from gdngen.emit import KernelPlan
from gdngen.spec import load_spec
from gdngen.spec.model import Variant

H200_SPEC = Path(__file__).resolve().parent.parent / "specs" / "h200.yaml"
SPEC_SPLIT_VARIANTS = [v for v in load_spec(H200_SPEC).variants if v.k_splits > 1]


def _thread_tile(variant: Variant, tidx: int) -> tuple[int, int, int, int]:
    """(k_split, group, lane, k_block) of thread ``tidx``, as the emitted kernel computes them."""
    k_split, split_tidx = divmod(tidx, variant.split_threads)
    tpg = variant.threads_per_group
    if tpg == 1:
        group, lane = split_tidx, 0
    elif variant.layout == "k_last":
        group, lane = split_tidx // tpg, split_tidx % tpg
    else:
        stride = lane_stride(variant.layout, tpg)
        lane = (split_tidx // stride) % tpg
        group = split_tidx // 32 * stride + split_tidx % stride
    return k_split, group, lane, k_split * tpg + lane


def _owned_cells(variant: Variant, tidx: int) -> list[tuple[int, int]]:
    _, group, _, k_block = _thread_tile(variant, tidx)
    return [
        (group * variant.ilp + i, k_block * variant.vec + j)
        for i in range(variant.ilp)
        for j in range(variant.vec)
    ]


@pytest.mark.parametrize("variant", SPEC_SPLIT_VARIANTS, ids=lambda v: v.name_for("sm_90a"))
def test_every_row_and_column_of_the_tile_has_one_owner(variant):
    owners = {}
    for tidx in range(variant.threads):
        for cell in _owned_cells(variant, tidx):
            assert cell not in owners, f"{cell} held by threads {owners[cell]} and {tidx}"
            owners[cell] = tidx
    assert sorted(owners) == list(
        itertools.product(range(variant.tile_v), range(variant.head_k_dim))
    )


@pytest.mark.parametrize(
    "variant",
    [v for v in SPEC_SPLIT_VARIANTS if v.layout == "v_last" and v.threads_per_group == 1],
    ids=lambda v: v.name_for("sm_90a"),
)
def test_a_warp_load_reads_one_contiguous_run_of_a_k_row(variant):
    """V-last: the state is [K, V]; load j of a lane reads rows [group*ilp, +ilp) of K column
    k_block*vec + j. With one lane per group, a warp's 32 lanes read 32 * ilp consecutive V."""
    for warp in range(variant.threads // 32):
        lanes = range(warp * 32, warp * 32 + 32)
        columns = {_thread_tile(variant, t)[3] for t in lanes}
        assert len(columns) == 1, "all lanes of a warp load the same K columns"
        first_rows = sorted(_thread_tile(variant, t)[1] * variant.ilp for t in lanes)
        assert first_rows == list(
            range(first_rows[0], first_rows[0] + 32 * variant.ilp, variant.ilp)
        )


def _split_sums(variant: Variant) -> int:
    """Values a group publishes per K split and token (the kernel's SPLIT_SUMS): q.q, k.k, q.k,
    then h.k and h.q per row."""
    return 3 + 2 * variant.ilp


@pytest.mark.parametrize("variant", SPEC_SPLIT_VARIANTS, ids=lambda v: v.name_for("sm_90a"))
def test_split_sums_add_up_to_the_row_dots(variant):
    """Each split publishes its groups' partial sums at [split, value, group]; a lane adds its
    group's entries over the splits. Partial sums here: distinct powers of two per (split, lane)."""
    sums = {}
    expected = {}
    for tidx in range(variant.threads):
        k_split, group, lane, _ = _thread_tile(variant, tidx)
        partial = {value: float(2 ** (k_split * variant.threads_per_group + lane)) * (value + 1)
                   for value in range(_split_sums(variant))}  # fmt: skip
        for value, x in partial.items():
            expected[(group, value)] = expected.get((group, value), 0.0) + x
        if lane == 0:
            # the butterfly has already summed the group's lanes within the split
            group_total = {
                value: sum(
                    float(2 ** (k_split * variant.threads_per_group + other)) * (value + 1)
                    for other in range(variant.threads_per_group)
                )
                for value in range(_split_sums(variant))
            }
            for value, x in group_total.items():
                key = (k_split, value, group)
                assert key not in sums, f"two writers of split_sums{list(key)}"
                sums[key] = x
    for tidx in range(variant.threads):
        _, group, _, _ = _thread_tile(variant, tidx)
        for value in range(_split_sums(variant)):
            total = sum(sums[(split, value, group)] for split in range(variant.k_splits))
            assert total == expected[(group, value)]


V_LAST_FP32 = dict(layout="v_last", state_dtype="fp32", tile_v=128, ilp=4)


def test_k_splits_shape_the_variant():
    v = Variant(**V_LAST_FP32, vec=16, threads_per_group=1, k_splits=8)
    assert (v.head_k_dim, v.groups, v.split_threads, v.threads) == (128, 32, 32, 256)
    assert KernelPlan.of(v, "sm_90a").butterfly_offsets == ()
    assert v.name_for("sm_90a") == "vl_fp32_tv128_ilp4_vec16_tpg1_ks8_sm90"


@pytest.mark.parametrize(
    "knobs,fragments",
    [
        (
            dict(vec=16, threads_per_group=1, k_splits=2),
            ["k_splits * threads_per_group * vec", "2 * 1 * 16 = 32"],
        ),
        (
            dict(vec=8, threads_per_group=2, k_splits=6),
            ["must be a head dimension", "6 * 2 * 8 = 96"],
        ),
        (
            dict(vec=16, threads_per_group=1, k_splits=8, solve="staged"),
            ["k_splits=8 needs solve: stepwise"],
        ),
        (
            dict(state_dtype="bf16", ilp=8, vec=32, threads_per_group=1, k_splits=4),
            ["ilp * vec = 8 * 32 = 256", "at most 128"],
        ),
        (
            dict(tile_v=64, vec=16, threads_per_group=1, k_splits=8),
            ["each K split must be whole warps", "16 threads per split"],
        ),
        (dict(vec=128, threads_per_group=1), ["ilp * vec = 4 * 128 = 512", "at most 128"]),
    ],
)
def test_bad_k_splits_are_refused(knobs, fragments):
    with pytest.raises(ValueError) as caught:
        Variant(**{**V_LAST_FP32, **knobs})
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_prefetch_needs_row_passes_and_names_itself():
    base = dict(
        layout="k_last", state_dtype="fp32", ilp=4, vec=4, threads_per_group=32, solve="staged"
    )
    v = Variant(**base, tile_v=128, row_passes=4, prefetch=True)
    assert v.name_for("sm_90a") == "kl_fp32_tv128_ilp4_vec4_tpg32_passes4_pf_staged_sm90"
    with pytest.raises(ValueError, match="needs row_passes > 1"):
        Variant(**base, tile_v=32, prefetch=True)


def test_staged_solve_needs_groups_of_eight_lanes():
    with pytest.raises(ValueError, match="threads_per_group >= 8"):
        Variant(**V_LAST_FP32, vec=32, threads_per_group=4, solve="staged")
