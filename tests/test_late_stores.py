"""Late stores (the variant knob ``late_stores``; docs/design.md, "Late stores"), without a GPU:
each token's output row and state stores come after the next token's dot products, with the
same stores as the kernel without the knob, whose body takes it as a number; and the spec
refuses the knob where it has no meaning."""

import math
import re

import pytest

from gdngen.emit.plan import KernelPlan
from gdngen.emit.shape import KernelShape
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.kernel_table import load_kernel
from gdngen.spec.model import Variant

#: vLLM's verify form at T = 2: packed rows, a per-token slot table, every token's state stored
SPEC_FORM = dict(
    H=16, HV=32, K=128, V=128, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
    index_dtype="int32", separate_write_slots=False, cache=False, use_qk_l2norm=True,
    cu_seqlens_dtype="int32", null_slot=0, per_token_slots=True, num_accepted=True,
    write_final_state=False, tokens=2,
)  # fmt: skip


def stores_and_butterflies_before_them(tmp_path, variant: str) -> tuple[int, int]:
    """(global stores, butterfly shuffles ahead of the first) in the PTX of ``variant``."""
    module = load_kernel(f"generated.h200.kernels.{variant}")
    key = CompileKey(variant=variant, arch="sm_90a", state_dtype=module.STATE_DTYPE, **SPEC_FORM)
    tmp_path.mkdir(parents=True, exist_ok=True)
    compile_kernel(module, key, dump_dir=tmp_path)
    lines = next(tmp_path.glob("*.ptx")).read_text().splitlines()
    stores = [i for i, line in enumerate(lines) if re.search(r"\bst\.global\b", line)]
    return len(stores), sum("shfl.sync.bfly" in line for line in lines[: stores[0]])


@pytest.mark.parametrize(
    "early,late",
    [
        ("kl_int8_tv32_ilp4_vec8_tpg16_sm90", "kl_int8_tv32_ilp4_vec8_tpg16_late_sm90"),
        (
            "kl_fp8_e4m3_tv8_ilp2_vec8_tpg16_pre_sm90",
            "kl_fp8_e4m3_tv8_ilp2_vec8_tpg16_pre_late_sm90",
        ),
    ],
)
def test_late_stores_follow_the_next_tokens_dot_products(tmp_path, early, late):
    kernel = load_kernel(f"generated.h200.kernels.{late}")
    steps = int(math.log2(kernel.THREADS_PER_GROUP))
    # a token's butterflies: its norms (q.q, k.k, q.k) and its rows' h.k and h.q; a quantized
    # row's amax has its own
    token, amax = (3 + 2 * kernel.ILP) * steps, kernel.ILP * steps
    early_stores, before_early = stores_and_butterflies_before_them(tmp_path / "early", early)
    late_stores, before_late = stores_and_butterflies_before_them(tmp_path / "late", late)
    # Without the knob, token 0's output row goes out after its own reductions; with it, after
    # token 1's as well (and token 0's quantization, which comes after its update).
    assert before_early == token
    assert before_late == 2 * token + amax
    assert late_stores == early_stores


def test_the_knob_names_its_variants_and_is_a_number_of_their_body():
    variant = Variant(
        layout="k_last", state_dtype="int8", tile_v=8, ilp=2, vec=8, threads_per_group=16,
        preload_tokens=True, late_stores=True,
    )  # fmt: skip
    plan = KernelPlan.of(variant, "sm_90a")
    assert plan.name == "kl_int8_tv8_ilp2_vec8_tpg16_pre_late_sm90"
    # the body of the same point without the knob, which takes it as LATE_STORES
    assert plan.shape == KernelShape.of(variant.model_copy(update={"late_stores": False}))
    assert plan.device_numbers["LATE_STORES"] is True


@pytest.mark.parametrize(
    "knobs",
    [
        dict(state_dtype="int8", solve="staged"),  # the staged solve's loop: update and stores
        dict(state_dtype="bf16"),  # no butterfly in a 16-bit state's stores
    ],
)
def test_the_knob_is_refused_outside_the_quantized_stepwise_solve(knobs):
    with pytest.raises(ValueError, match="late_stores is a knob of the quantized states'"):
        Variant(
            layout="k_last", tile_v=64, ilp=8, vec=8, threads_per_group=16, late_stores=True,
            **knobs,
        )  # fmt: skip
