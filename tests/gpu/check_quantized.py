"""One call on a quantized (int8, fp8 e4m3) state against the float64 reference: its output, every
slot and scale of the pool (the ones it owns within the format's rounding bound, the others to
the bit) and its verify cache. The checks of tests/gpu/check_call.py and the gated-norm tests hand
a quantized problem to these."""

import torch

import generated.h200 as h200
from gdngen.reference.decode import reference_call
from gdngen.reference.norm import gated_rmsnorm
from tests.compare import assert_close
from tests.quantized_state import assert_quantized_pool


def _state_name(args: dict) -> str:
    return "initial_state" if args.get("initial_state") is not None else "state"


def check_quantized_call(
    args: dict, *, read_slots, null_slot=-1, cu_seqlens=None, num_accepted=None, norm=None,
    call=h200.gdn_decode, flashinfer=None, ref=None, norm_split=False,
):  # fmt: skip
    """One call on ``args`` (a dense state or a pool, with its ``state_scales``) against the
    reference. ``norm``: (z, norm_weight, eps, activation) of the gated RMSNorm, or (z,
    norm_weight) for eps 1e-6 and silu; ``norm_split``: the call normalises the output as stored
    (rounded to its dtype first). ``flashinfer``: FlashInfer's form keywords for the call,
    ``ref`` the same form as reference_call names it."""
    name = _state_name(args)
    before, scales_before = args[name].clone(), args["state_scales"].clone()
    cache = args.get("intermediate_states_buffer")
    forms = dict(ref or {})
    forms.setdefault("write_slots", args.get("output_state_indices"))
    if cache is not None:  # the verify cache, in the pool's format with its scales
        forms.update(
            cache=cache.clone(), cache_scales=args["intermediate_states_scales"].clone(),
            cache_rows=args.get("intermediate_state_indices"),
            disable_state_update=args["disable_state_update"],
        )  # fmt: skip
    output = torch.full(args["v"].shape, float("nan"), dtype=args["v"].dtype, device="cuda")
    extra = {}
    if norm is not None:
        z, weight, eps, activation = (*norm, 1e-6, "silu")[:4]
        extra = dict(z=z, norm_weight=weight, norm_eps=eps, norm_activation=activation)
    call(**args, output=output, **extra, **(flashinfer or {}))
    torch.cuda.synchronize()
    expected = assert_quantized_call(
        args, output, before, scales_before, read_slots=read_slots, null_slot=null_slot,
        cu_seqlens=cu_seqlens, num_accepted=num_accepted, norm=norm, norm_split=norm_split,
        **forms,
    )  # fmt: skip
    if cache is not None:
        _assert_cache(args, expected, forms["cache"], forms["cache_scales"])


def assert_quantized_call(
    args, output, before, scales_before, *, read_slots, norm=None, norm_split=False, **forms
):
    """What the call left in ``output`` and in its state against the reference's, from the state
    ``before`` it and its scales (``forms``: reference_call's null_slot, cu_seqlens, ...)."""
    expected = reference_call(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=args.get("scale"), use_qk_l2norm=args.get("use_qk_l2norm", True),
        state_layout=args.get("state_layout", "k_last"), read_slots=read_slots,
        state_scales=scales_before, **forms,
    )  # fmt: skip
    ref = expected.output
    if norm is not None:
        z, weight, eps, activation = (*norm, 1e-6, "silu")[:4]
        if norm_split:  # the norm step reads the output as stored
            ref = ref.to(output.dtype).to(ref.dtype)
        ref = gated_rmsnorm(ref, z, weight, eps=eps, activation=activation)
    live = ~torch.isnan(ref)
    assert_close("output", output[live], ref[live], output.dtype)
    values, scales = args[_state_name(args)], args["state_scales"]
    assert_quantized_pool(values, scales, expected.pool, expected.scales, before, scales_before)
    return expected


def _assert_cache(args, expected, cache_before, scales_before):
    """The verify cache the call left against the reference's: the (row, step) entries the
    reference wrote within the pool's bound (tests/quantized_state.py), every other entry as it
    was before the call (gdngen.problem.verify_cache's poison), values and scales, to the bit."""
    cache, scales = args["intermediate_states_buffer"], args["intermediate_states_scales"]

    def entries(t):  # [R, steps, ...] -> one (row, step) entry a line
        return t.flatten(0, 1)

    written = ~entries(expected.cache_scales).isnan().flatten(1).all(1)
    assert written.any(), "the reference wrote no cache entry"
    unwritten = ~written
    assert torch.equal(
        entries(cache)[unwritten].view(torch.int8),
        entries(cache_before)[unwritten].view(torch.int8),
    ), "a cache entry the call does not own changed"
    assert torch.equal(
        entries(scales)[unwritten].view(torch.int32),
        entries(scales_before)[unwritten].view(torch.int32),
    ), "a cache scale the call does not own changed"
    assert_quantized_pool(
        entries(cache)[written], entries(scales)[written], entries(expected.cache)[written],
        entries(expected.cache_scales)[written], entries(cache_before)[written],
        entries(scales_before)[written],
    )  # fmt: skip
