"""The stepwise solve's warps share each token's gates from T = SHARED_GATES_FROM_T, without a
GPU: in the PTX, one token's gates a lane (its exponentials) and two shuffles a token instead of
every token's gates on every lane (gdngen/device/gates.py, lane_token; docs/design.md, "Gates
shared by the warp")."""

import re

import pytest

from gdngen.device.gates import SHARED_GATES_FROM_T
from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.kernel_table import load_kernel

BASE = dict(
    H=16, HV=32, K=128, V=128, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
    index_dtype="int32", separate_write_slots=False, cache=False, write_final_state=True,
    use_qk_l2norm=True,
)  # fmt: skip
#: vLLM's spec form: packed rows, a per-token slot table (the preloading ILP 4 kernels compute
#: their gates in the token loop there, every lane every token's)
SPEC = dict(
    cu_seqlens_dtype="int32", null_slot=0, per_token_slots=True, num_accepted=True,
    write_final_state=False,
)  # fmt: skip
#: exponentials of one token's gates (softplus's exp, g's, beta's sigmoid), and the head's
#: exp(A_log) once
EXP_PER_TOKEN, EXP_ONCE = 3, 1


def ptx_counts(tmp_path, variant: str, T: int, **form) -> tuple[int, int]:
    """(ex2 instructions, indexed shuffles) in the PTX of ``variant`` at T tokens."""
    module = load_kernel(f"generated.h200.kernels.{variant}")
    key = CompileKey(
        variant=variant, arch="sm_90a", tokens=T, state_dtype=module.STATE_DTYPE,
        **dict(BASE, **form),
    )  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    compile_kernel(module, key, dump_dir=tmp_path)
    ptx = next(tmp_path.glob("*.ptx")).read_text()
    return len(re.findall(r"\bex2\.approx", ptx)), len(re.findall(r"\bshfl\.sync\.idx", ptx))


@pytest.mark.parametrize(
    "variant,form",
    [
        ("kl_bf16_tv32_ilp4_vec8_tpg16_sm90", {}),  # dense rows: token t at position t
        ("kl_bf16_tv32_ilp4_vec8_tpg16_sm90", dict(cu_seqlens_dtype="int32", pdl=True)),  # packed
        ("kl_int8_tv8_ilp2_vec8_tpg16_pre_sm90", SPEC),
        ("vl_bf16_tv16_ilp8_vec8_tpg16_pre_sm90", {}),
    ],
    ids=["k_last", "k_last_packed_pdl", "int8_preloaded_spec", "v_last_preloaded"],
)
@pytest.mark.parametrize("T", [SHARED_GATES_FROM_T - 1, SHARED_GATES_FROM_T, 8])
def test_a_lane_computes_one_tokens_gates_from_t_3(tmp_path, variant, form, T):
    exps, shuffles = ptx_counts(tmp_path, variant, T, **form)
    if T >= SHARED_GATES_FROM_T:
        assert (exps, shuffles) == (EXP_ONCE + EXP_PER_TOKEN, 2 * T)
    else:
        assert (exps, shuffles) == (EXP_ONCE + EXP_PER_TOKEN * T, 0)


def test_the_preloading_ilp_4_kernels_keep_every_tokens_gates_in_the_loop_behind_a_slot_table(
    tmp_path,
):
    """Shared by the warp there, T = 8 at B = 1 ran 7-9% slower on an H200
    (docs/perf/h200-2026-11-29-warp-gates.md); in the cache's form they share them."""
    variant = "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90"
    assert ptx_counts(tmp_path / "spec", variant, 8, **SPEC) == (EXP_ONCE + EXP_PER_TOKEN * 8, 0)
    cache = dict(cache=True, write_final_state=False)
    assert ptx_counts(tmp_path / "cache", variant, 8, **cache) == (EXP_ONCE + EXP_PER_TOKEN, 16)
