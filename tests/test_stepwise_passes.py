"""Row passes in the stepwise solve (a quantized state's; docs/design.md, "Row passes"), without a
GPU: at T = 1 a lane reads and reduces its token's q, k, norms and gates once for all its
passes, and stores every pass's rows; above T = 1 each pass solves its tokens as a one-pass
kernel does. With async_tiles the later passes' tiles are copied into shared memory as the
kernel starts. The spec refuses the knobs where they have no meaning, and the shape has neither
the conv1d prologue nor the gated RMSNorm epilogue."""

import math
import re

import pytest

from gdngen.emit.plan import KernelPlan
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.kernel_table import load_kernel
from gdngen.spec.model import Variant
from generated.h200.kernels import KERNELS

ONE_PASS = "kl_int8_tv32_ilp4_vec16_tpg8_sm90"
TWO_PASSES = "kl_int8_tv64_ilp4_vec16_tpg8_passes2_sm90"
TWO_PASSES_ASYNC = "kl_int8_tv64_ilp4_vec16_tpg8_passes2_async_sm90"

#: dense rows, [B] slots, the final state written
DENSE = dict(
    H=16, HV=32, K=128, V=128, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
    state_dtype="int8", index_dtype="int32", separate_write_slots=False, cache=False,
    write_final_state=True, use_qk_l2norm=True,
)  # fmt: skip


def ptx_counts(tmp_path, variant: str, tokens: int) -> dict[str, int]:
    """Butterfly shuffles, ex2 (the gates' exponentials), global loads and stores, and the async
    copies into shared memory, their commits and waits and the shared loads, in the PTX of
    ``variant`` at T = ``tokens``."""
    key = CompileKey(variant=variant, arch="sm_90a", tokens=tokens, **DENSE)
    tmp_path.mkdir(parents=True, exist_ok=True)
    compile_kernel(load_kernel(f"generated.h200.kernels.{variant}"), key, dump_dir=tmp_path)
    ptx = next(tmp_path.glob("*.ptx")).read_text()
    patterns = {
        "butterflies": r"shfl\.sync\.bfly",
        "ex2": r"\bex2\.approx",
        "loads": r"\bld\.global\b",
        "stores": r"\bst\.global\b",
        "row_copies": r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 16;",
        "scale_copies": r"cp\.async\.ca\.shared\.global \[[^]]*\], \[[^]]*\], 4;",
        "commits": r"cp\.async\.commit_group",
        "waits": r"cp\.async\.wait_group",
        "shared_loads": r"\bld\.shared\b",
    }
    return {name: len(re.findall(pattern, ptx)) for name, pattern in patterns.items()}


def test_at_one_token_the_passes_share_the_tokens_inputs(tmp_path):
    one = ptx_counts(tmp_path / "one", ONE_PASS, 1)
    two = ptx_counts(tmp_path / "two", TWO_PASSES, 1)
    kernel = load_kernel(f"generated.h200.kernels.{TWO_PASSES}")
    steps = int(math.log2(kernel.THREADS_PER_GROUP))
    norms, rows = 3 * steps, 3 * kernel.ILP * steps  # q.q, k.k, q.k; a row's h.k, h.q, amax
    assert one["butterflies"] == norms + rows
    assert two["butterflies"] == norms + 2 * rows  # the norms once, each pass its rows
    assert two["ex2"] == one["ex2"]  # the gates once
    # each pass loads its tile, scales and v rows and stores its rows, out rows and scales; the
    # token's q, k and gate inputs are loaded once
    assert two["stores"] == 2 * one["stores"]
    assert two["loads"] < 2 * one["loads"]


def test_above_one_token_each_pass_solves_its_tokens(tmp_path):
    one = ptx_counts(tmp_path / "one", ONE_PASS, 2)
    two = ptx_counts(tmp_path / "two", TWO_PASSES, 2)
    assert two["butterflies"] == 2 * one["butterflies"]
    assert two["stores"] == 2 * one["stores"]


@pytest.mark.parametrize("tokens", [1, 2])
def test_async_tiles_copy_the_second_pass_into_shared_memory(tmp_path, tokens):
    plain = ptx_counts(tmp_path / "plain", TWO_PASSES, tokens)
    copied = ptx_counts(tmp_path / "async", TWO_PASSES_ASYNC, tokens)
    ilp = load_kernel(f"generated.h200.kernels.{TWO_PASSES_ASYNC}").ILP
    # the second pass's ILP rows of 16 bytes and their ILP scales, one commit group, one wait
    assert copied["row_copies"] == ilp and copied["scale_copies"] == ilp
    assert copied["commits"] == 1 and copied["waits"] == 1
    assert plain["row_copies"] == plain["scale_copies"] == plain["commits"] == 0
    # read back from shared memory instead of global memory; the rest of the kernel as before
    assert copied["shared_loads"] > 0 and copied["loads"] < plain["loads"]
    assert copied["butterflies"] == plain["butterflies"] and copied["stores"] == plain["stores"]


def test_the_knob_names_its_variants_and_is_a_number_of_their_body():
    variant = Variant(
        layout="k_last", state_dtype="fp8_e4m3", tile_v=128, ilp=4, row_passes=4, prefetch=True,
        vec=16, threads_per_group=8,
    )  # fmt: skip
    plan = KernelPlan.of(variant, "sm_90a")
    assert plan.name == "kl_fp8_e4m3_tv128_ilp4_vec16_tpg8_passes4_pf_sm90"
    # prefetch is a number of the body, not a shape of its own (one body with and without it)
    assert plan.shape.name == "kl_stepwise_passes_scaled"
    assert plan.device_numbers["ROW_PASSES"] == 4 and plan.device_numbers["PREFETCH"] is True
    assert variant.groups == 8 and variant.threads == 64
    # no conv1d prologue and no gated RMSNorm: the rows a CTA holds at once are not its tile's
    assert not plan.shape.fuses_conv_and_norm and not variant.serves_gated_norm(128)
    # async_tiles is a number of the same body
    copied = KernelPlan.of(
        variant.model_copy(update=dict(prefetch=False, async_tiles=True)), "sm_90a"
    )
    assert copied.name == "kl_fp8_e4m3_tv128_ilp4_vec16_tpg8_passes4_async_sm90"
    assert copied.shape == plan.shape and copied.device_numbers["ASYNC_TILES"] is True


def test_its_body_has_no_conv_prologue_or_norm_epilogue():
    text = KERNELS.body_path(TWO_PASSES).read_text()
    assert "gdngen.device.conv" not in text and "gdngen.device.norm" not in text
    assert "gated_norm=False" in text


@pytest.mark.parametrize(
    "knobs,fragments",
    [
        (dict(state_dtype="bf16"), ["quantized states", "state_dtype: bf16"]),
        (dict(preload_tokens=True), ["without k_splits or preload_tokens"]),
        (dict(unroll_passes=True), ["unroll_passes is a knob of the staged solve"]),
        (dict(row_passes=1, async_tiles=True), ["async_tiles", "row_passes=1"]),
        (dict(prefetch=True, async_tiles=True), ["async_tiles", "prefetch=True"]),
        (dict(solve="staged", async_tiles=True), ["async_tiles", "solve: staged"]),
        (dict(vec=32, tile_v=128, async_tiles=True), ["async_tiles", "vec=32", "32 bytes"]),
    ],
    ids=[
        "a_16_bit_state",
        "with_preloaded_tokens",
        "unrolled_by_a_knob",
        "async_in_one_pass",
        "async_with_prefetch",
        "async_in_the_staged_solve",
        "async_rows_of_32_bytes",
    ],
)
def test_the_knob_is_refused_where_it_has_no_meaning(knobs, fragments):
    base = dict(
        layout="k_last", state_dtype="int8", tile_v=64, ilp=4, row_passes=2, vec=16,
        threads_per_group=8,
    )  # fmt: skip
    with pytest.raises(ValueError) as caught:
        Variant(**{**base, **knobs})
    for fragment in fragments:
        assert fragment in str(caught.value)
