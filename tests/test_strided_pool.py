"""FlashInfer's strided state pools: a pool whose [HV, V, K] dims are a view into a larger buffer
(docs/design.md, "Call forms"). The checks accept such a view where every stride is a whole
number of 16-byte vectors and no two slots, heads or rows share an address; the kernel then takes
the head and row strides at run time (CompileKey.strided_state) and keeps its vector loads. As in
tests/test_checks.py, check_call gets FakeCuda tensors."""

import importlib
from dataclasses import replace

import pytest
import torch

import generated.h200
from gdngen.runtime.checks import check_call
from gdngen.runtime.compile import CompileKey
from gdngen.runtime.launcher import call_key
from gdngen.runtime.resources import kernel_resources
from gdngen.terms import variant_pair
from gdngen.runtime.kernel_table import load_kernel
from tests.test_checks import on_fake_cuda, raises
from tests.test_forms_checks import HV, K, POOL, V, call_args

INFO = generated.h200.INFO
BF16 = torch.bfloat16


def with_pool(pool: torch.Tensor) -> dict:
    return call_args(2, 1, 2, initial_state=pool)


def padded(every_other_head: bool = False, rows_pad: int = 0, columns_pad: int = 0):
    """A [POOL, HV, V, K] view of a buffer with twice the heads (every other one taken), more
    rows or more columns."""
    heads = 2 * HV if every_other_head else HV
    buffer = torch.zeros(POOL, heads, V + rows_pad, K + columns_pad, dtype=BF16)
    return buffer[:, :: heads // HV, :V, :K]


@pytest.mark.parametrize(
    "view",
    [padded(columns_pad=8), padded(every_other_head=True), padded(rows_pad=3, columns_pad=16)],
    ids=["row_stride", "head_stride", "both"],
)
def test_a_strided_view_is_its_own_compile_key(view):
    call = check_call(INFO, **on_fake_cuda(with_pool(view)))
    dense = check_call(INFO, **on_fake_cuda(with_pool(torch.zeros(POOL, HV, V, K, dtype=BF16))))
    assert call.strided_state and not dense.strided_state
    variant = generated.h200.VARIANTS[0]
    assert CompileKey.for_call(variant, "sm_90a", call).strided_state
    assert not CompileKey.for_call(variant, "sm_90a", dense).strided_state


def test_a_padded_slot_stride_alone_is_the_dense_form():
    view = torch.zeros(POOL, HV * V * K + 64, dtype=BF16)[:, : HV * V * K].view(POOL, HV, V, K)
    assert not check_call(INFO, **on_fake_cuda(with_pool(view))).strided_state


def test_the_signature_tells_the_strides_apart():
    def key(pool):
        args = dict(with_pool(pool), state=None, state_layout="k_last", backend="auto")
        args.pop("check_indices", None)
        return call_key(**args)

    assert key(padded(columns_pad=8)) != key(padded(every_other_head=True))
    assert key(padded(columns_pad=8)) == key(padded(columns_pad=8))


# fmt: off
BAD = [
    ("last_dim_strided", torch.zeros(POOL, HV, K, V, dtype=BF16).transpose(2, 3), ValueError,
     "initial_state: its last dim (K) must be contiguous"),
    ("rows_overlap", torch.zeros(POOL * HV * V * K, dtype=BF16).as_strided(
        (POOL, HV, V, K), (HV * V * K, V * K, K // 2, 1)), ValueError,
     "initial_state: rows overlap (stride of dim 2 is 64; one of its rows spans 128 elements"),
    ("heads_overlap", torch.zeros(POOL * HV * V * K, dtype=BF16).as_strided(
        (POOL, HV, V, K), (HV * V * K, V * K // 2, K, 1)), ValueError,
     "initial_state: heads overlap"),
    ("slots_overlap", torch.zeros(POOL * HV * V * (K + 8), dtype=BF16).as_strided(
        (POOL, HV, V, K), (HV * V * K, V * (K + 8), K + 8, 1)), ValueError,
     "initial_state: slots overlap"),
    ("row_stride_not_a_vector", padded(columns_pad=3), ValueError,
     "initial_state: stride of dim 2 must be a multiple of 8 elements (16 bytes); got 131"),
]
# fmt: on


@pytest.mark.parametrize("name,pool,exc,fragment", BAD, ids=[b[0] for b in BAD])
def test_a_pool_the_kernel_cannot_take_is_refused_by_name(name, pool, exc, fragment):
    raises(exc, on_fake_cuda(with_pool(pool)), fragment)


@pytest.mark.parametrize(
    "variant",
    ["kl_bf16_tv64_ilp8_vec8_tpg16_ldcs_stcs_sm90", "vl_bf16_tv128_ilp4_vec16_tpg1_ks8_sm90",
     "kl_fp32_tv16_ilp4_vec4_tpg32_staged_sm90"],
)  # fmt: skip
def test_the_strided_kernel_keeps_its_vector_loads(variant):
    module = load_kernel(f"generated.h200.kernels.{variant}")
    key = CompileKey(
        variant=variant, arch="sm_90a", tokens=2, H=16, HV=64, K=128, V=128, io_dtype="bf16",
        gate_dtype="bf16", dt_bias_dtype="fp32", state_dtype=variant_pair(variant)[1],
        index_dtype="int32", separate_write_slots=False, cache=True, write_final_state=False,
        use_qk_l2norm=True,
    )  # fmt: skip
    dense, strided = kernel_resources(module, key), kernel_resources(
        module, replace(key, strided_state=True)
    )
    assert strided.vector_loads == dense.vector_loads
    assert strided.spill_store_bytes == 0 and strided.stack_bytes == 0
