"""Every sm_90a variant against the float64 reference, on fresh random inputs (H100/H200)."""

import pytest

import generated.h200 as h200
from gdngen.problem import PackedProblem, Problem
from tests.gpu.check_call import run_and_check
from tests.gpu.check_form import run_form

pytestmark = pytest.mark.gpu


def _problem(variant: str, kind=Problem, **fields):
    """The case (a ``kind`` of problem) on the variant's layout and dtype; a kernel for other head
    dims than 128 runs on the target's geometry of its K (the cases' HVs are those of K = V = 128
    models)."""
    module = h200.variant(variant).module(variant)
    if module.HEAD_K_DIM != 128:
        (geometry,) = [g for g in h200.INFO.geometries if g.K == module.HEAD_K_DIM]
        fields.update(H=geometry.H, HV=geometry.HV, K=geometry.K, V=geometry.V)
    return kind(layout=module.LAYOUT, state_dtype=module.STATE_DTYPE, **fields)


#: (id, Problem fields); each case is a distinct compile key, seeds differ per case and variant
CASES = [
    ("t1_pool_padded_b5", dict(batch=5, HV=32, pool_size=16, padded_rows=(1, 4))),
    (
        "t1_pool_int64_split_b33",
        dict(
            batch=33,
            HV=64,
            pool_size=80,
            index_dtype="int64",
            separate_write_slots=True,
            padded_rows=(0,),
        ),
    ),
    (
        "t3_verify_cache5_b7",
        dict(
            batch=7,
            tokens=3,
            HV=32,
            pool_size=9,
            cache_steps=5,
            disable_state_update=True,
            padded_rows=(2,),
        ),
    ),
    ("t8_dense_update_b3", dict(batch=3, tokens=8, HV=64)),
    (
        "t5_cache_update_int64_b6",
        dict(
            batch=6,
            tokens=5,
            HV=32,
            pool_size=20,
            index_dtype="int64",
            cache_steps=6,
            separate_write_slots=True,
        ),
    ),
]


@pytest.mark.parametrize("case", [c[1] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("variant", h200.VARIANTS)
def test_variant_matches_reference(variant, case):
    seed = hash((variant, tuple(sorted(case.items())))) % 2**31
    run_and_check(h200.variant(variant), _problem(variant, seed=seed, **case))


@pytest.mark.parametrize("variant", h200.VARIANTS)
def test_variant_serves_the_vllm_spec_form(variant):
    """vLLM's speculative-decode form: T = 3 tokens a sequence, a slot table exactly T wide with
    num_accepted_tokens, slot 0 and a padded row. The form compiles code the dense cases above
    do not reach: the table's columns loaded up front, and in the stepwise solve a 16-bit state
    held in its own dtype until its first use (tile_load in gdngen/templates/_macros.j2)."""
    seed = hash((variant, "spec")) % 2**31
    problem = _problem(variant, PackedProblem, sequences=6, tokens=3, padded_rows=(1,), seed=seed)
    run_form(h200.variant(variant), problem)


@pytest.mark.parametrize(
    "fields",
    [
        dict(use_qk_l2norm=False, scale=0.3),
        dict(io_dtype="fp16", gate_dtype="fp32", dt_bias_dtype="bf16"),
        dict(tokens=2, cache_steps=2, disable_state_update=False, pool_size=12),
    ],
    ids=["no_l2norm_scale", "fp16_io_fp32_gates", "t2_cache_and_update"],
)
@pytest.mark.parametrize(
    "variant", ["kl_bf16_tv16_ilp4_vec8_tpg16_sm90", "vl_fp32_tv8_ilp4_vec8_tpg16_sm90"]
)
def test_options(variant, fields):
    run_and_check(h200.variant(variant), _problem(variant, batch=9, HV=32, seed=11, **fields))
