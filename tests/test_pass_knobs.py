"""The unroll_passes, min_ctas_per_sm and state cache knobs, without a GPU: their checks, names, and
that each changes only the lines of the emitted kernel it is about."""

import pytest

from gdngen.emit import KernelPlan
from gdngen.emit.shape import KernelShape
from gdngen.spec.model import Variant
from tests.spec_helpers import changed_code_lines, kernel_text, variant_text

STAGED = dict(
    layout="k_last", state_dtype="bf16", tile_v=128, ilp=4, row_passes=4, vec=8,
    threads_per_group=16, solve="staged",
)  # fmt: skip
NAME = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_staged_sm90"


def _kernel_text(**knobs) -> str:
    """The device code (body) of the STAGED variant with ``knobs`` changed, in a one-variant spec."""
    return kernel_text({**STAGED, **knobs})


def _variant_text(**knobs) -> str:
    """The row of the STAGED variant with ``knobs`` changed (its knobs), with its comment."""
    return variant_text({**STAGED, **knobs})


def test_names():
    assert Variant(**STAGED).name_for("sm_90a") == NAME
    assert (
        Variant(**STAGED, unroll_passes=True, prefetch=True).name_for("sm_90a")
        == "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_pf_unroll_staged_sm90"
    )
    occupancy = Variant(**STAGED, min_ctas_per_sm=5)
    assert occupancy.name_for("sm_90a") == "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_occ5_staged_sm90"
    assert occupancy.register_cap == 65536 // (5 * 128) == 102
    assert Variant(**STAGED).register_cap is None


@pytest.mark.parametrize(
    "knobs,fragments",
    [
        (dict(row_passes=1, tile_v=32, unroll_passes=True), ["unroll_passes", "row_passes > 1"]),
        (dict(min_ctas_per_sm=17), ["min_ctas_per_sm=17", "128 threads", "2048 threads"]),
        (
            dict(min_ctas_per_sm=16),
            ["min_ctas_per_sm=16", "32 registers", "32-register state tile"],
        ),
    ],
    ids=["unroll_without_passes", "more_threads_than_an_sm", "cap_below_the_state_tile"],
)
def test_bad_knobs_are_refused(knobs, fragments):
    with pytest.raises(ValueError) as caught:
        Variant(**{**STAGED, **knobs})
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_unroll_passes_changes_only_the_pass_loop():
    rolled, unrolled = _kernel_text(), _kernel_text(unroll_passes=True)
    assert "for row_pass in cutlass.range(ROW_PASSES, unroll=1):" in rolled
    assert "for row_pass in cutlass.range_constexpr(ROW_PASSES):" in unrolled
    changed = changed_code_lines(rolled, unrolled)
    assert sorted(changed) == sorted(
        [
            "-        # A loop, not unrolled: a pass holds the registers of ILP rows only.",
            "-        for row_pass in cutlass.range(ROW_PASSES, unroll=1):",
            "+        # Unrolled: the compiler may issue a pass's loads during the pass before.",
            "+        for row_pass in cutlass.range_constexpr(ROW_PASSES):",
        ]
    ), changed


def test_min_ctas_per_sm_changes_only_the_launch():
    assert _kernel_text() == _kernel_text(min_ctas_per_sm=5)  # one body
    plain, bounded = _variant_text(), _variant_text(min_ctas_per_sm=5)
    assert "min_ctas_per_sm" not in plain
    said = " ".join(line.strip(" #") for line in bounded.splitlines())
    assert "Launch bounds fit 5 CTAs on an SM (at most 102 registers a thread)." in said
    # The row: its name, and the bound it passes to the shared launcher (gdngen/device/launch.py
    # turns it into launch bounds).
    plain_row, bounded_row = plain.splitlines()[-1], bounded.splitlines()[-1]
    occupancy_name = "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_occ5_staged_sm90"
    assert bounded_row == plain_row.replace(NAME, occupancy_name).replace(
        "),", ", min_ctas_per_sm=5),"
    )


def test_cache_knob_names():
    streaming = Variant(**STAGED, state_load_cache="streaming", state_store_cache="streaming")
    assert streaming.name_for("sm_90a") == (
        "kl_bf16_tv128_ilp4_vec8_tpg16_passes4_ldcs_stcs_staged_sm90"
    )
    assert KernelShape.of(streaming).cache_ops and not KernelShape.of(Variant(**STAGED)).cache_ops
    only_store = Variant(**STAGED, state_store_cache="global")
    assert only_store.name_for("sm_90a").endswith("_passes4_stcg_staged_sm90")
    plan = KernelPlan.of(only_store, "sm_90a")
    assert (plan.load_cache_mode, plan.store_cache_mode) == ("ALWAYS", "GLOBAL")
    with pytest.raises(ValueError, match="state_load_cache"):
        Variant(**STAGED, state_load_cache="evict_first")


@pytest.mark.parametrize("knobs", [dict(), dict(prefetch=True)], ids=["passes", "prefetch"])
def test_cache_knobs_change_only_the_state_accesses(knobs):
    streaming = dict(state_load_cache="streaming", state_store_cache="streaming")
    variant = _variant_text(**knobs, **streaming)
    assert 'LOAD_CACHE_MODE="STREAMING"' in variant and 'STORE_CACHE_MODE="STREAMING"' in variant
    plain, hinted = _kernel_text(**knobs), _kernel_text(**knobs, **streaming)
    assert (
        "LoadCacheMode[LOAD_CACHE_MODE]" in hinted and "StoreCacheMode[STORE_CACHE_MODE]" in hinted
    )
    assert "cute.nvgpu" not in plain and "_through" not in plain
    changed = changed_code_lines(plain, hinted)
    # Removed: the numbers the body takes (it takes the vector width and the operators too, and
    # says so) and the plain tile accesses, which become copies through the atoms; added: their
    # replacements, the atoms, the numbers and the helpers' import.
    removed = [line for line in changed if line.startswith("-")]
    assert removed[0].startswith("-    TILE_V: int, ") and removed[1].startswith('-    """')
    plain_accesses = removed[2:]
    assert plain_accesses and all(
        line.endswith(("_src.load().to(Float32))", "_src.load())", ".element_type))"))
        for line in plain_accesses
    ), changed
    added = [line for line in changed if line.startswith("+")]
    through = [line for line in added if "load_through(" in line or "store_through(" in line]
    assert len(through) == len(plain_accesses), changed
    assert "+from gdngen.device.cache_copy import load_through, store_through" in added
    assert sum("make_copy_atom(" in line for line in added) == 2, changed
