"""The generated call up to the point where a GPU is needed: everything is checked first."""

import pytest

import generated.b200 as b200
import generated.h200 as h200
from gdngen.problem import Problem
from gdngen.runtime.store import compiled_count
from gdngen.terms import variant_pair


def _args(**fields):
    return Problem(batch=3, HV=32, pool_size=5, **fields).make("cpu")


def test_cpu_tensors_are_refused_before_any_compile():
    before = compiled_count()
    args = _args()
    pool = args["initial_state"].clone()
    with pytest.raises(ValueError, match="q: expected a CUDA tensor; got a tensor on cpu"):
        h200.gdn_decode(**args)
    assert compiled_count() == before
    assert args["initial_state"].equal(pool)


def test_bad_input_is_reported_before_the_device_check():
    args = _args()
    args["initial_state_indices"] = args["initial_state_indices"].float()
    with pytest.raises(
        TypeError, match="initial_state_indices: expected dtype int32, int64; got float32"
    ):
        h200.gdn_decode(**args)


def test_flashinfer_backend_is_refused_by_name_before_any_compile():
    """FlashInfer's keyword is taken; a value naming one of FlashInfer's own kernels is refused
    before anything compiles, the same through the call and prepare."""
    before = compiled_count()
    for call in (h200.gdn_decode, h200.gdn_decode.prepare):
        with pytest.raises(ValueError, match="backend: 'cake_gdn' asks for FlashInfer's Cake GDN"):
            call(**_args(), backend="cake_gdn")
    assert compiled_count() == before


def test_prepare_rejects_unknown_options():
    with pytest.raises(
        TypeError, match=r"prepare: unexpected keyword argument\(s\) \['state_dtype'\]"
    ):
        h200.gdn_decode.prepare(**_args(), state_dtype="bf16")


def test_unknown_variant_names_the_known_ones():
    first = h200.VARIANTS[0]
    with pytest.raises(
        ValueError, match=f"'kl_bf16_tv3_sm90' is not a variant of target h200; it has {first}, "
    ):
        h200.variant("kl_bf16_tv3_sm90")


@pytest.mark.parametrize("target", [h200, b200], ids=["h200", "b200"])
def test_each_variant_call_builds_its_own_kernel(target):
    for name in target.VARIANTS:
        call = target.variant(name)
        module = call.module(name)
        assert module.NAME == name and call.__name__ == name
        layout = {"kl": "k_last", "vl": "v_last"}[name[:2]]
        assert (module.LAYOUT, module.STATE_DTYPE) == (layout, variant_pair(name)[1])
