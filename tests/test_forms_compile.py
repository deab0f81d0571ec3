"""The engine call forms compile for both SM targets without a GPU, and leave the default form's
code alone: a stepwise and a staged kernel of each target, in vLLM's spec-decode form (packed,
per-token slots, num_accepted_tokens, slot 0 as padding) and SGLang's verify form (packed, cache
rows, no final write)."""

import dataclasses
import importlib
import re

import pytest

from gdngen.runtime.compile import CompileKey, compile_kernel
from gdngen.runtime.kernel_table import load_kernel

BASE = dict(
    tokens=4, H=16, HV=32, K=128, V=128, io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
    state_dtype="bf16", index_dtype="int32", separate_write_slots=False, cache=False,
    write_final_state=True, use_qk_l2norm=True,
)  # fmt: skip
FORMS = {
    "vllm_spec": dict(
        null_slot=0,
        cu_seqlens_dtype="int32",
        per_token_slots=True,
        num_accepted=True,
        write_final_state=False,
    ),
    "sglang_verify": dict(
        cu_seqlens_dtype="int32", cache=True, cache_rows=True, write_final_state=False
    ),
    # FlashInfer's write slots, a negative entry storing nothing (the row still computed), with
    # the verify cache beside them
    "flashinfer_write_slots": dict(separate_write_slots=True, cache=True),
    # FlashInfer's per-token scatter: [N] read slots, ssm_state_indices [N, T]
    "flashinfer_token_scatter": dict(
        per_token_slots=True,
        separate_write_slots=True,
        write_final_state=False,
        exact_slot_table=True,
    ),
    # FlashInfer's state recovery: every row replays its first 2 tokens, stores the state after
    # them, decodes the rest; per row from accepted_steps; accepted_steps truncating the rows of
    # a verify call (no state update, the cache); truncating the per-token scatter
    "flashinfer_recovery_steps": dict(separate_write_slots=True, recovery_steps=2),
    "flashinfer_accepted_steps": dict(accepted_steps_dtype="int32"),
    "flashinfer_accepted_verify": dict(
        accepted_steps_dtype="int32", cache=True, write_final_state=False
    ),
    "flashinfer_accepted_scatter": dict(
        per_token_slots=True,
        separate_write_slots=True,
        write_final_state=False,
        exact_slot_table=True,
        accepted_steps_dtype="int32",
    ),
}
KERNELS = [
    ("h200", "sm_90a", "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90"),
    ("h200", "sm_90a", "kl_bf16_tv64_ilp8_vec8_tpg16_staged_sm90"),
    ("b200", "sm_100a", None),
]


def _b200_variant() -> str:
    from generated.b200.kernels import VARIANTS

    return next(v for v in VARIANTS if v.startswith("kl_bf16"))


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize(
    "target,arch,variant", KERNELS, ids=["h200_stepwise", "h200_staged", "b200"]
)
def test_engine_form_compiles(tmp_path, target, arch, variant, form):
    variant = variant or _b200_variant()
    module = load_kernel(f"generated.{target}.kernels.{variant}")
    key = CompileKey(variant=variant, arch=arch, **dict(BASE, **FORMS[form]))
    compile_kernel(module, key, dump_dir=tmp_path)
    ptx = next(tmp_path.glob("*.ptx")).read_text()
    assert "ld.global" in ptx and "st.global" in ptx


def test_forms_are_compile_keys():
    plain = CompileKey(variant="x", arch="sm_90a", **BASE)
    for form in FORMS.values():
        assert dataclasses.replace(plain, **form) != plain
    assert plain.null_slot == -1 and not plain.packed


def _scalar_loads(tmp_path, **changes) -> int:
    variant = "kl_bf16_tv16_ilp4_vec8_tpg16_pre_sm90"
    module = load_kernel(f"generated.h200.kernels.{variant}")
    folder = tmp_path / "_".join(sorted(changes)) if changes else tmp_path / "plain"
    key = CompileKey(variant=variant, arch="sm_90a", **dict(BASE, **FORMS["vllm_spec"], **changes))
    compile_kernel(module, key, dump_dir=folder)
    ptx = next(folder.glob("*.ptx")).read_text()
    return len(re.findall(r"\bld\.global(?:\.\w+)*\.[bsu](?:32|64)\s", ptx))


def test_uniform_rows_keep_reading_cu_seqlens_and_an_exact_table_loads_fewer(tmp_path):
    """vLLM's spec form at T = 4. Uniform rows (the caller's uniform_seqlen) still load both
    cu_seqlens entries of a row, beside the tokens instead of before them: they decide which
    tokens are live and whether the row is placed at all (a row that is not owns no slot). An
    exact table loads its T columns once, beside num_accepted_tokens, where the general kernel
    loads the initial slot after it and a slot again before each token's state store (one load
    fewer in all). docs/perf/h100-2026-11-26-spec-chains.md has what the chains cost."""
    plain = _scalar_loads(tmp_path)
    assert _scalar_loads(tmp_path, uniform_rows=True) == plain
    assert _scalar_loads(tmp_path, exact_slot_table=True) == plain - 1
    assert _scalar_loads(tmp_path, uniform_rows=True, exact_slot_table=True) == plain - 1
