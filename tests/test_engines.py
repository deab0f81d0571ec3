"""The engine adapters (gdngen.engines, docs/engines.md), on the CPU.

A recording stand-in for gdn_decode shows which keywords each engine function passes on: the
call form, the padding slot, the token bound, the index tensors (views, never copies). The
target's real gdn_decode then shows that each form passes all of its checks; a CPU tensor is the
last thing it refuses. The expected signatures are read from the wheels of vLLM 0.33.0 and
SGLang 0.5.23 (they cannot be imported without CUDA and Triton).
"""

import ast
import inspect
import zipfile
from pathlib import Path

import pytest
import torch

import gdngen.engines
import generated.h200 as h200
from gdngen.engines import EngineAdapter
from gdngen.engines.sglang import SglangGdn
from gdngen.engines.vllm import VllmGdn
from gdngen.runtime.store import compiled_count

NO_DEFAULT = inspect.Parameter.empty
# (name, default) in order, from vllm/third_party/flash_linear_attention/ops/fused_recurrent.py
# and sglang/kernels/ops/attention/fla/fused_recurrent.py (the same in both engines)
PACKED_DECODE = [
    ("mixed_qkv", NO_DEFAULT),
    ("a", NO_DEFAULT),
    ("b", NO_DEFAULT),
    ("A_log", NO_DEFAULT),
    ("dt_bias", NO_DEFAULT),
    ("scale", NO_DEFAULT),
    ("initial_state", NO_DEFAULT),
    ("out", NO_DEFAULT),
    ("ssm_state_indices", NO_DEFAULT),
    ("use_qk_l2norm_in_kernel", False),
]
# vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py
VLLM_UPDATE = [
    ("A_log", NO_DEFAULT),
    ("a", NO_DEFAULT),
    ("b", NO_DEFAULT),
    ("dt_bias", NO_DEFAULT),
    ("q", NO_DEFAULT),
    ("k", NO_DEFAULT),
    ("v", NO_DEFAULT),
    ("beta", 1.0),
    ("threshold", 20.0),
    ("scale", None),
    ("initial_state", None),
    ("inplace_final_state", True),
    ("cu_seqlens", None),
    ("ssm_state_indices", None),
    ("num_accepted_tokens", None),
    ("use_qk_l2norm_in_kernel", False),
    ("is_kda", False),
]
# sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py
SGLANG_UPDATE = [
    ("A_log", NO_DEFAULT),
    ("a", NO_DEFAULT),
    ("dt_bias", NO_DEFAULT),
    ("softplus_beta", NO_DEFAULT),
    ("softplus_threshold", NO_DEFAULT),
    ("q", NO_DEFAULT),
    ("k", NO_DEFAULT),
    ("v", NO_DEFAULT),
    ("b", NO_DEFAULT),
    ("initial_state_source", NO_DEFAULT),
    ("initial_state_indices", NO_DEFAULT),
    ("scale", None),
    ("use_qk_l2norm_in_kernel", False),
    ("cu_seqlens", None),
    ("is_kda", False),
    ("lower_bound", None),
    ("disable_state_update", False),
    ("intermediate_states_buffer", None),
    ("intermediate_state_indices", None),
    ("cache_steps", None),
    ("retrieve_parent_token", None),
    ("cache_ring", False),
    ("replayssm_rawv", None),
    ("replayssm_rawk", None),
    ("replayssm_g", None),
    ("replayssm_beta", None),
    ("match_cutedsl_decode", False),
]


class Recorder:
    """Stands in for a target's gdn_decode: keeps each call's keywords, returns (output, pool)."""

    __name__ = "recorder"

    def __init__(self, error: Exception | None = None):
        self.calls: list[dict] = []
        self.error = error

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        output = kwargs.get("output")
        if output is None:
            output = torch.zeros(3)
        return output, kwargs["initial_state"]

    @property
    def last(self) -> dict:
        assert len(self.calls) == 1, f"expected one gdn_decode call, got {len(self.calls)}"
        return self.calls[0]


# Small stand-in shapes for the recorder (it checks nothing): H=2, HV=4, K=V=8.
H, HV, K, V = 2, 4, 8, 8
WIDTH = 2 * H * K + HV * V
i32 = torch.int32


def _views(tensor: torch.Tensor, base: torch.Tensor) -> bool:
    """The tensor is a view of ``base``'s storage (nothing was copied)."""
    return tensor.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def _packed_decode_args(B=3):
    rows = torch.zeros(B, WIDTH + HV * V)  # strided rows, as Qwen3.5's mixed_qkvz split
    ba = torch.zeros(B, 2 * HV)
    b, a = ba.chunk(2, -1)
    return dict(
        mixed_qkv=rows[:, :WIDTH],
        a=a,
        b=b,
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV),
        scale=K**-0.5,
        initial_state=torch.zeros(6, HV, V, K),
        out=torch.empty(B, 1, HV, V),
        ssm_state_indices=torch.tensor([1, 0, 2], dtype=i32),
        use_qk_l2norm_in_kernel=True,
    )


def _packed_tokens(total):
    q = torch.zeros(1, total, H, K)
    return dict(
        q=q,
        k=torch.zeros_like(q),
        v=torch.zeros(1, total, HV, V),
        a=torch.zeros(total, HV),
        b=torch.zeros(total, HV),
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV),
    )


# -- signatures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, expected",
    [
        (VllmGdn.fused_recurrent_gated_delta_rule_packed_decode, PACKED_DECODE),
        (SglangGdn.fused_recurrent_gated_delta_rule_packed_decode, PACKED_DECODE),
        (VllmGdn.fused_sigmoid_gating_delta_rule_update, VLLM_UPDATE),
        (SglangGdn.fused_sigmoid_gating_delta_rule_update, SGLANG_UPDATE),
    ],
    ids=["vllm-packed", "sglang-packed", "vllm-update", "sglang-update"],
)
def test_signatures_are_the_engines(method, expected):
    """Same names, order and defaults as the engine's function (so positional and keyword
    calls both work); the only additions are the keyword-only max_seqlen, uniform_seqlen and
    state_scales (an int8 pool's), and SGLang's update, whose target verify fills a buffer,
    intermediate_states_scales (that buffer's beside an int8 pool)."""
    parameters = list(inspect.signature(method).parameters.values())[1:]  # past self
    positional = [p for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == expected
    extra = {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    added = {"max_seqlen": None, "uniform_seqlen": False, "state_scales": None}
    if method is SglangGdn.fused_sigmoid_gating_delta_rule_update:
        added["intermediate_states_scales"] = None
    assert extra == ({"state_scales": None} if "packed" in method.__name__ else added)
    assert len(positional) + len(extra) == len(parameters)


def test_package_exports_the_adapters():
    assert gdngen.engines.VllmGdn is VllmGdn and gdngen.engines.SglangGdn is SglangGdn
    assert VllmGdn.null_slot == 0 and SglangGdn.null_slot == -1
    assert repr(VllmGdn(h200.gdn_decode)) == "VllmGdn(gdn_decode)"
    with pytest.raises(TypeError, match="gdn_decode: expected a target's call"):
        EngineAdapter("h200")


# -- packed decode (mixed_qkv) ---------------------------------------------------------------------


@pytest.mark.parametrize("adapter, null_slot", [(VllmGdn, 0), (SglangGdn, -1)])
def test_packed_decode_passes_the_mixed_buffer(adapter, null_slot):
    """mixed_qkv goes through as gdn_decode's mixed_qkv (no q, k, v), out as the output written
    in place, ssm_state_indices as the read/write slots; padding is each engine's sentinel; the
    return is the engine's (out, initial_state)."""
    fake = Recorder()
    args = _packed_decode_args()
    result = getattr(adapter(fake), "fused_recurrent_gated_delta_rule_packed_decode")(**args)
    call = fake.last
    assert call["mixed_qkv"] is args["mixed_qkv"]
    assert not {"q", "k", "v", "cu_seqlens", "max_seqlen"} & set(call)
    assert call["a"] is args["a"] and call["b"] is args["b"]
    assert call["output"] is args["out"]
    assert call["initial_state"] is args["initial_state"]
    assert call["initial_state_indices"] is args["ssm_state_indices"]
    assert call["null_slot"] == null_slot
    assert call["use_qk_l2norm"] is True and call["scale"] == K**-0.5
    assert result[0] is args["out"] and result[1] is args["initial_state"]


@pytest.mark.parametrize("adapter", [VllmGdn, SglangGdn])
def test_packed_decode_passes_an_int8_pools_scales(adapter):
    fake = Recorder()
    scales = torch.ones(3)
    adapter(fake).fused_recurrent_gated_delta_rule_packed_decode(
        **_packed_decode_args(), state_scales=scales
    )
    assert fake.last["state_scales"] is scales
    fake = Recorder()
    adapter(fake).fused_recurrent_gated_delta_rule_packed_decode(**_packed_decode_args())
    assert fake.last["state_scales"] is None


def test_packed_decode_positional_call_and_default_norm():
    fake = Recorder()
    args = _packed_decode_args()
    del args["use_qk_l2norm_in_kernel"]
    VllmGdn(fake).fused_recurrent_gated_delta_rule_packed_decode(*args.values())
    assert fake.last["use_qk_l2norm"] is False  # the engines' default
    assert fake.last["initial_state_indices"] is args["ssm_state_indices"]


# -- vLLM fused_sigmoid_gating_delta_rule_update ---------------------------------------------------


def test_vllm_decode_tokens_of_a_mixed_batch():
    """[N] indices (sized for the padded batch) with cu_seqlens: packed form, one token per
    sequence, the first N index rows as a view, NULL_BLOCK_ID 0 as padding."""
    fake = Recorder()
    args = _packed_tokens(3)
    indices = torch.tensor([4, 0, 5, 0, 0, 0, 0, 0], dtype=i32)
    cu_seqlens = torch.arange(4, dtype=i32)
    pool = torch.zeros(6, HV, V, K)
    output, state = VllmGdn(fake).fused_sigmoid_gating_delta_rule_update(
        **args,
        initial_state=pool,
        inplace_final_state=True,
        cu_seqlens=cu_seqlens,
        ssm_state_indices=indices,
        use_qk_l2norm_in_kernel=True,
    )
    call = fake.last
    assert call["cu_seqlens"] is cu_seqlens and call["max_seqlen"] == 1
    assert call["null_slot"] == 0
    assert call["initial_state"] is pool and state is pool
    slots = call["initial_state_indices"]
    assert slots.shape == (3,) and _views(slots, indices) and slots.tolist() == [4, 0, 5]
    assert call["num_accepted_tokens"] is None
    assert call["q"] is args["q"] and call["v"] is args["v"]
    assert call["a"].shape == (1, 3, HV) and _views(call["a"], args["a"])
    assert call["b"].shape == (1, 3, HV) and _views(call["b"], args["b"])
    assert call["use_qk_l2norm"] is True and call["scale"] is None
    assert not call.get("disable_state_update", False)
    assert "intermediate_states_buffer" not in call and "output" not in call


def test_vllm_spec_decode_uses_per_token_slots():
    """[N, 1 + S] slots + num_accepted_tokens: per-token slots, T = 1 + S, both tensors cut to
    the N sequences of cu_seqlens (views), no final-write switch."""
    fake = Recorder()
    S, N = 3, 2
    args = _packed_tokens(7)
    table = torch.arange(5 * (1 + S), dtype=i32).view(5, 1 + S)  # padded batch of 5
    accepted = torch.tensor([2, 1, 1, 1, 1], dtype=i32)
    cu_seqlens = torch.tensor([0, 4, 7], dtype=i32)
    VllmGdn(fake).fused_sigmoid_gating_delta_rule_update(
        **args,
        initial_state=torch.zeros(32, HV, V, K),
        cu_seqlens=cu_seqlens,
        ssm_state_indices=table,
        num_accepted_tokens=accepted,
        use_qk_l2norm_in_kernel=True,
    )
    call = fake.last
    assert call["max_seqlen"] == 1 + S
    assert call["initial_state_indices"].shape == (N, 1 + S)
    assert _views(call["initial_state_indices"], table)
    assert call["num_accepted_tokens"].tolist() == [2, 1]
    assert _views(call["num_accepted_tokens"], accepted)
    assert call["null_slot"] == 0
    assert "disable_state_update" not in call and "output_state_indices" not in call


def test_vllm_dense_call_splits_token_major_gates():
    """Without cu_seqlens: the dense form; a, b [B*T, HV] become [B, T, HV] views."""
    fake = Recorder()
    q = torch.zeros(2, 3, H, K)
    a, b = torch.zeros(6, HV), torch.zeros(6, HV)
    table = torch.zeros(2, 4, dtype=i32)
    VllmGdn(fake).fused_sigmoid_gating_delta_rule_update(
        torch.zeros(HV), a, b, torch.zeros(HV), q, q, torch.zeros(2, 3, HV, V),
        initial_state=torch.zeros(4, HV, V, K), ssm_state_indices=table,
    )  # fmt: skip
    call = fake.last
    assert call["cu_seqlens"] is None and call["max_seqlen"] is None
    assert call["a"].shape == (2, 3, HV) and _views(call["a"], a)
    assert call["b"].shape == (2, 3, HV) and _views(call["b"], b)
    assert call["initial_state_indices"] is not None and _views(
        call["initial_state_indices"], table
    )


@pytest.mark.parametrize("uniform", [None, True])
@pytest.mark.parametrize("adapter", [VllmGdn, SglangGdn])
def test_max_seqlen_and_the_uniform_promise_can_be_given(adapter, uniform):
    """max_seqlen reaches gdn_decode; so does uniform_seqlen, off unless the engine says so
    (the adapters never infer it: only the engine knows every sequence has max_seqlen tokens)."""
    fake = Recorder()
    promise = {} if uniform is None else dict(uniform_seqlen=uniform)
    args = _packed_tokens(6)
    method = adapter(fake).fused_sigmoid_gating_delta_rule_update
    cu_seqlens = torch.tensor([0, 3, 6], dtype=i32)
    indices = torch.tensor([1, 2], dtype=i32)
    if adapter is VllmGdn:
        method(**args, initial_state=torch.zeros(3, HV, V, K), cu_seqlens=cu_seqlens,
               ssm_state_indices=indices, max_seqlen=3, **promise)  # fmt: skip
    else:
        method(**args, initial_state_source=torch.zeros(3, HV, V, K),
               initial_state_indices=indices, cu_seqlens=cu_seqlens, softplus_beta=1.0,
               softplus_threshold=20.0, max_seqlen=3, **promise)  # fmt: skip
    assert fake.last["max_seqlen"] == 3
    assert fake.last["uniform_seqlen"] is bool(uniform)


def _vllm_call(fake, **changes):
    args = _packed_tokens(3)
    args.update(
        initial_state=torch.zeros(4, HV, V, K),
        cu_seqlens=torch.arange(4, dtype=i32),
        ssm_state_indices=torch.tensor([1, 2, 3], dtype=i32),
    )
    args.update(changes)
    return VllmGdn(fake).fused_sigmoid_gating_delta_rule_update(**args)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(beta=2.0), r"^beta: gdngen's kernels compute softplus with beta 1\.0"),
        (dict(threshold=10.0), r"^threshold: .*threshold 20\.0; got threshold=10\.0"),
        (dict(inplace_final_state=False), r"^inplace_final_state: gdngen writes the states"),
        (dict(is_kda=True), r"^is_kda: gdngen serves the Gated Delta Net gate"),
        (dict(initial_state=None), r"^initial_state: gdngen needs the state pool"),
        (dict(ssm_state_indices=None), r"^ssm_state_indices: gdngen reads and writes the pool"),
        (dict(q=torch.zeros(3, 1, H, K)), r"^q: with cu_seqlens, q is \[1, total_tokens, H, K\]"),
        (
            dict(cu_seqlens=None, q=torch.zeros(1, 3, H, K)),
            r"^ssm_state_indices: \[B\] indices serve one token per request; q has T=3",
        ),
    ],
    ids=["beta", "threshold", "inplace", "kda", "no-state", "no-indices", "lead", "dense-T"],
)
def test_vllm_refusals_name_the_argument(changes, message):
    fake = Recorder()
    with pytest.raises(ValueError, match=message):
        _vllm_call(fake, **changes)
    assert fake.calls == []


# -- SGLang fused_sigmoid_gating_delta_rule_update -------------------------------------------------


def _sglang_args(tokens, N, **changes):
    mixed = torch.zeros(tokens, WIDTH)
    q, k, v = torch.split(mixed, [H * K, H * K, HV * V], -1)  # strided views, as SGLang passes
    args = dict(
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV),
        q=q.view(1, tokens, H, K),
        k=k.view(1, tokens, H, K),
        v=v.view(1, tokens, HV, V),
        a=torch.zeros(tokens, HV),
        b=torch.zeros(tokens, HV),
        initial_state_source=torch.zeros(6, HV, V, K),
        initial_state_indices=torch.tensor([3, -1, 5, -1, -1, -1, -1, -1], dtype=i32)[: N + 2],
        cu_seqlens=torch.arange(0, tokens + 1, tokens // N, dtype=i32),
        use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0,
        softplus_threshold=20.0,
    )
    args.update(changes)
    return args


def test_sglang_decode_returns_the_output_alone():
    fake = Recorder()
    args = _sglang_args(3, 3)
    result = SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(**args)
    call = fake.last
    assert isinstance(result, torch.Tensor)  # SGLang's op returns o, not (o, state)
    assert call["max_seqlen"] == 1 and call["null_slot"] == -1
    assert call["initial_state"] is args["initial_state_source"]
    assert call["initial_state_indices"].tolist() == [3, -1, 5]
    assert _views(call["initial_state_indices"], args["initial_state_indices"])
    assert call["q"] is args["q"] and call["k"] is args["k"] and call["v"] is args["v"]
    assert call["a"].shape == (1, 3, HV) and _views(call["a"], args["a"])
    assert call["intermediate_states_buffer"] is None
    assert call["intermediate_state_indices"] is None
    assert call["disable_state_update"] is False


def test_sglang_target_verify_uses_the_pool_row_cache():
    """Verify: the pool-row buffer and its row indices (cut to N, a view), T = cache_steps, no
    pool write."""
    fake = Recorder()
    D, N = 4, 2
    buffer = torch.zeros(7, D, HV, V, K)
    rows = torch.tensor([0, 1, 6, 6, 6], dtype=i32)  # padded with pool_size, as SGLang does
    args = _sglang_args(
        N * D, N, is_kda=False, disable_state_update=True, intermediate_states_buffer=buffer,
        intermediate_state_indices=rows, cache_steps=D, retrieve_parent_token=None,
    )  # fmt: skip
    SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(**args)
    call = fake.last
    assert call["max_seqlen"] == D
    assert call["intermediate_states_buffer"] is buffer
    assert call["intermediate_state_indices"].tolist() == [0, 1]
    assert _views(call["intermediate_state_indices"], rows)
    assert call["initial_state_indices"].shape == (N,)
    assert call["disable_state_update"] is True
    assert call["cu_seqlens"].tolist() == [0, D, 2 * D]


def test_sglang_target_verify_passes_a_quantized_buffers_scales():
    # beside an int8 pool the buffer is int8, its rows' scales beside it (keyword only)
    fake = Recorder()
    buffer = torch.zeros(7, 4, HV, V, K, dtype=torch.int8)
    scales = torch.ones(7, 4, HV, V)
    args = _sglang_args(
        8, 2, disable_state_update=True, intermediate_states_buffer=buffer, cache_steps=4
    )
    SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(
        **args, state_scales=torch.ones(3), intermediate_states_scales=scales
    )
    assert fake.last["intermediate_states_scales"] is scales
    fake = Recorder()
    SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(**args)
    assert fake.last["intermediate_states_scales"] is None


def test_sglang_verify_without_cache_steps_takes_the_buffer_steps():
    fake = Recorder()
    buffer = torch.zeros(7, 5, HV, V, K)
    args = _sglang_args(8, 2, intermediate_states_buffer=buffer, disable_state_update=True)
    SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(**args)
    assert fake.last["max_seqlen"] == 5


def test_sglang_dense_call_splits_token_major_gates():
    fake = Recorder()
    q = torch.zeros(2, 3, H, K)
    args = _sglang_args(6, 2, q=q, k=q, v=torch.zeros(2, 3, HV, V), cu_seqlens=None)
    SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(**args)
    call = fake.last
    assert call["max_seqlen"] is None and call["cu_seqlens"] is None
    assert call["a"].shape == (2, 3, HV) and call["initial_state_indices"].shape == (2,)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(retrieve_parent_token=torch.zeros(2, 4, dtype=i32)), r"^retrieve_parent_token: tree"),
        (dict(softplus_beta=0.5), r"^softplus_beta: .*got softplus_beta=0\.5"),
        (dict(softplus_threshold=15.0), r"^softplus_threshold: .*got softplus_threshold=15\.0"),
        (dict(is_kda=True), r"^is_kda: KDA's per-channel gate is not served"),
        (
            dict(lower_bound=-5.0),
            r"^lower_bound: the KDA lower-bounded gate .*got lower_bound=-5\.0",
        ),
        (dict(cache_ring=True), r"^cache_ring: the ReplaySSM ring write is not served"),
        (dict(match_cutedsl_decode=True), r"^match_cutedsl_decode: .* is not served"),
        (dict(initial_state_source=None), r"^initial_state_source: gdngen needs the state pool"),
        (dict(initial_state_indices=None), r"^initial_state_indices: gdngen needs the state"),
    ],
    ids=["tree", "beta", "threshold", "kda", "lower-bound", "ring", "cutedsl", "no-pool", "no-idx"],
)
def test_sglang_refusals_name_the_argument(changes, message):
    fake = Recorder()
    with pytest.raises(ValueError, match=message):
        SglangGdn(fake).fused_sigmoid_gating_delta_rule_update(**_sglang_args(8, 2, **changes))
    assert fake.calls == []


# -- errors of gdn_decode, under the engine's names ------------------------------------------------


def test_gdn_decode_errors_name_the_engine_argument():
    error = TypeError("initial_state_indices: expected dtype int32, int64; got float32")
    with pytest.raises(TypeError) as raised:
        VllmGdn(Recorder(error)).fused_recurrent_gated_delta_rule_packed_decode(
            **_packed_decode_args()
        )
    assert str(raised.value) == (
        "ssm_state_indices (gdn_decode's initial_state_indices): expected dtype int32, int64; "
        "got float32"
    )
    assert raised.value.__cause__ is error

    error = ValueError("initial_state: slots overlap")
    with pytest.raises(ValueError, match=r"^initial_state_source \(gdn_decode's initial_state\)"):
        SglangGdn(Recorder(error)).fused_sigmoid_gating_delta_rule_update(**_sglang_args(3, 3))

    # a name the engine shares with gdn_decode, or no argument name: raised as it was
    error = ValueError("cu_seqlens: expected shape [N + 1]")
    with pytest.raises(ValueError) as raised:
        SglangGdn(Recorder(error)).fused_sigmoid_gating_delta_rule_update(**_sglang_args(3, 3))
    assert raised.value is error


# -- the real target: every form passes gdn_decode's checks ----------------------------------------

# qwen3-next on the h200 target; CPU tensors pass every check but the device's.
RH, RHV, RK, RV = 16, 32, 128, 128
RWIDTH = 2 * RH * RK + RHV * RV
bf16 = torch.bfloat16


def _real_update_tokens(total):
    mixed = torch.zeros(total, RWIDTH, dtype=bf16)
    q, k, v = torch.split(mixed, [RH * RK, RH * RK, RHV * RV], -1)
    return dict(
        q=q.view(1, total, RH, RK),
        k=k.view(1, total, RH, RK),
        v=v.view(1, total, RHV, RV),
        a=torch.zeros(total, RHV, dtype=bf16),
        b=torch.zeros(total, RHV, dtype=bf16),
        A_log=torch.zeros(RHV),
        dt_bias=torch.zeros(RHV),
    )


def _real_forms():
    pool = torch.zeros(8, RHV, RV, RK, dtype=bf16)
    big = torch.zeros(3, RWIDTH + RHV * RV, dtype=bf16)
    ba = torch.zeros(3, 2 * RHV, dtype=bf16)
    b, a = ba.chunk(2, -1)
    packed = dict(
        mixed_qkv=big[:, :RWIDTH], a=a, b=b, A_log=torch.zeros(RHV), dt_bias=torch.zeros(RHV),
        scale=RK**-0.5, initial_state=pool, out=torch.empty(3, 1, RHV, RV, dtype=bf16),
        ssm_state_indices=torch.tensor([1, 0, 2], dtype=i32), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    vllm_decode = dict(
        _real_update_tokens(3), initial_state=pool, cu_seqlens=torch.arange(4, dtype=i32),
        ssm_state_indices=torch.tensor([1, 2, 0, 0, 0], dtype=i32), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    vllm_spec = dict(
        _real_update_tokens(7), initial_state=pool, cu_seqlens=torch.tensor([0, 4, 7], dtype=i32),
        ssm_state_indices=torch.arange(20, dtype=i32).view(5, 4) % 8,
        num_accepted_tokens=torch.ones(5, dtype=i32), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    sglang_decode = dict(
        _real_update_tokens(3), initial_state_source=pool,
        initial_state_indices=torch.tensor([1, -1, 2, -1], dtype=i32),
        cu_seqlens=torch.arange(4, dtype=i32), use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0,
    )  # fmt: skip
    sglang_verify = dict(
        sglang_decode, **_real_update_tokens(8), cu_seqlens=torch.arange(0, 9, 4, dtype=i32),
        disable_state_update=True,
        intermediate_states_buffer=torch.zeros(9, 4, RHV, RV, RK, dtype=bf16),
        intermediate_state_indices=torch.tensor([0, 1, 8, 8], dtype=i32), cache_steps=4,
    )  # fmt: skip
    return {
        "vllm-packed": (VllmGdn, "fused_recurrent_gated_delta_rule_packed_decode", packed),
        "sglang-packed": (SglangGdn, "fused_recurrent_gated_delta_rule_packed_decode", packed),
        "vllm-decode": (VllmGdn, "fused_sigmoid_gating_delta_rule_update", vllm_decode),
        "vllm-spec": (VllmGdn, "fused_sigmoid_gating_delta_rule_update", vllm_spec),
        "sglang-decode": (SglangGdn, "fused_sigmoid_gating_delta_rule_update", sglang_decode),
        "sglang-verify": (SglangGdn, "fused_sigmoid_gating_delta_rule_update", sglang_verify),
    }


@pytest.mark.parametrize("form", list(_real_forms()))
def test_every_form_passes_the_targets_checks(form):
    """The engine's shapes, strides and index tables in the engine's own form reach the device
    check of the real gdn_decode, its last: nothing compiled, no state touched."""
    adapter, method, args = _real_forms()[form]
    before = compiled_count()
    with pytest.raises(ValueError, match=r"expected a CUDA tensor; got a tensor on cpu"):
        getattr(adapter(h200.gdn_decode), method)(**args)
    assert compiled_count() == before


def test_the_targets_bound_is_named_by_the_engine_argument():
    adapter, method, args = _real_forms()["vllm-spec"]
    args["ssm_state_indices"] = torch.zeros(2, 12, dtype=i32)
    with pytest.raises(
        ValueError,
        match=r"^ssm_state_indices\.shape\[1\] \(gdn_decode's max_seqlen\): expected 1\.\.8",
    ):
        getattr(adapter(h200.gdn_decode), method)(**args)
    adapter, method, args = _real_forms()["sglang-verify"]
    args["cache_steps"] = 9
    with pytest.raises(
        ValueError, match=r"^cache_steps \(gdn_decode's max_seqlen\): expected 1\.\.8"
    ):
        getattr(adapter(h200.gdn_decode), method)(**args)


# -- the fused core --------------------------------------------------------------------------------


def _core_args(total, table):
    mixed = torch.zeros(total, WIDTH + 16)[:, :WIDTH]  # strided rows, as the engines' split
    return dict(
        mixed_qkv=mixed, a=torch.zeros(total, HV), b=torch.zeros(total, HV),
        A_log=torch.zeros(HV), dt_bias=torch.zeros(HV), ssm_state=torch.zeros(16, HV, V, K),
        ssm_state_indices=table, conv_state=torch.zeros(16, 6, WIDTH).transpose(1, 2),
        conv_weights=torch.zeros(WIDTH, 1, 4), conv_bias=None, z=torch.zeros(total, HV, V),
        norm_weight=torch.ones(V),
    )  # fmt: skip


@pytest.mark.parametrize("adapter", [VllmGdn, SglangGdn])
def test_decode_core_passes_every_step(adapter):
    """Decode, one token a request: the pre-conv buffer, both states, the conv's and the norm's
    arguments, all passed on as they came (views), the engine's padding slot."""
    fake = Recorder()
    args = _core_args(3, torch.tensor([1, 2, 3, 0, 0], dtype=i32))
    adapter(fake).decode_core(**args, norm_eps=1e-5, activation="swish")
    call = fake.last
    assert call["mixed_qkv"] is args["mixed_qkv"] and call["z"] is args["z"]
    assert call["initial_state"] is args["ssm_state"]
    assert call["conv_state"] is args["conv_state"] and call["conv_weight"] is args["conv_weights"]
    assert call["conv_activation"] == "silu" and call["norm_eps"] == 1e-5
    assert call["initial_state_indices"].tolist() == [1, 2, 3]
    assert _views(call["initial_state_indices"], args["ssm_state_indices"])
    assert call["cu_seqlens"] is None and call["null_slot"] == adapter.null_slot


def test_decode_core_vllm_spec_decode():
    """vLLM's speculative form: the [N, 1 + S] table and num_accepted_tokens cut to the N
    sequences of query_start_loc; T = 1 + S; no conv activation maps to identity."""
    fake = Recorder()
    table = torch.arange(5 * 4, dtype=i32).view(5, 4)
    args = _core_args(7, table)
    VllmGdn(fake).decode_core(
        **args, activation=None, query_start_loc=torch.tensor([0, 4, 7], dtype=i32),
        num_accepted_tokens=torch.tensor([2, 1, 1, 1, 1], dtype=i32),
    )  # fmt: skip
    call = fake.last
    assert call["max_seqlen"] == 4 and call["conv_activation"] == "identity"
    assert call["initial_state_indices"].shape == (2, 4)
    assert call["num_accepted_tokens"].tolist() == [2, 1]


def test_decode_core_errors_name_the_engine_argument():
    error = ValueError("conv_weight: a width of 5 taps; target h200 serves [2, 3, 4]")
    with pytest.raises(ValueError, match=r"^conv_weights \(gdn_decode's conv_weight\): a width"):
        VllmGdn(Recorder(error)).decode_core(**_core_args(3, torch.zeros(3, dtype=i32)))


@pytest.mark.parametrize("engine", ["vllm-spec", "sglang-decode"])
def test_decode_core_passes_the_targets_checks(engine):
    """The engine's own shapes reach the real gdn_decode's last check (the device)."""
    pool = torch.zeros(8, RHV, RV, RK, dtype=bf16)
    if engine == "vllm-spec":
        adapter, total, extra = VllmGdn, 7, dict(
            ssm_state_indices=torch.arange(20, dtype=i32).view(5, 4) % 8 + 1,
            num_accepted_tokens=torch.ones(5, dtype=i32),
            query_start_loc=torch.tensor([0, 4, 7], dtype=i32),
            conv_state=torch.zeros(8, 3 + 3, RWIDTH, dtype=bf16).transpose(1, 2),
        )  # fmt: skip
    else:
        adapter, total, extra = SglangGdn, 3, dict(
            ssm_state_indices=torch.tensor([1, -1, 2], dtype=i32),
            conv_state=torch.zeros(8, RWIDTH, 3, dtype=bf16),
        )  # fmt: skip
    big = torch.zeros(total, RWIDTH + 64, dtype=bf16)
    args = dict(
        mixed_qkv=big[:, :RWIDTH], a=torch.zeros(total, RHV, dtype=bf16),
        b=torch.zeros(total, RHV, dtype=bf16), A_log=torch.zeros(RHV), dt_bias=torch.zeros(RHV),
        ssm_state=pool, conv_weights=torch.zeros(RWIDTH, 4, dtype=bf16),
        conv_bias=torch.zeros(RWIDTH, dtype=bf16), z=torch.zeros(total, RHV, RV, dtype=bf16),
        norm_weight=torch.ones(RV, dtype=bf16), **extra,
    )  # fmt: skip
    before = compiled_count()
    with pytest.raises(ValueError, match=r"expected a CUDA tensor; got a tensor on cpu"):
        adapter(h200.gdn_decode).decode_core(**args)
    assert compiled_count() == before


# -- vLLM fused_gdn_decode_post_conv_mtp -----------------------------------------------------------

# The op's schema, as registered in vllm/_C_stable_libtorch.abi3.so of the vLLM 0.33.0 wheel
# (read with `strings`); its Python wrapper vllm/_custom_ops.py (what the GDN layer calls on CUDA)
# takes the same names in the same order, gives `out` the default None (it then allocates
# empty_like(output_gate)) and `scale` the default 128**-0.5, and returns `out`.
MTP_SCHEMA = (
    "fused_gdn_decode_post_conv_mtp(Tensor mixed_qkv, Tensor a, Tensor b, Tensor A_log, "
    "Tensor dt_bias, Tensor state_indices, Tensor cu_seqlens, Tensor num_accepted_tokens, "
    "Tensor! state, Tensor output_gate, Tensor norm_weight, Tensor! out, float scale, "
    "float norm_eps=1e-5, str output_gate_activation='silu') -> ()"
)
# (name, default) from vllm/_custom_ops.py's fused_gdn_decode_post_conv_mtp
VLLM_MTP = [
    ("mixed_qkv", NO_DEFAULT),
    ("a", NO_DEFAULT),
    ("b", NO_DEFAULT),
    ("A_log", NO_DEFAULT),
    ("dt_bias", NO_DEFAULT),
    ("state_indices", NO_DEFAULT),
    ("cu_seqlens", NO_DEFAULT),
    ("num_accepted_tokens", NO_DEFAULT),
    ("state", NO_DEFAULT),
    ("output_gate", NO_DEFAULT),
    ("norm_weight", NO_DEFAULT),
    ("out", None),
    ("scale", 128**-0.5),
    ("norm_eps", 1e-5),
    ("output_gate_activation", "silu"),
]


def _schema_parameters(schema: str) -> list[tuple[str, object]]:
    """(name, default) of a torch op schema's arguments (NO_DEFAULT where it has none)."""
    inside = schema[schema.index("(") + 1 : schema.rindex(") ->")]
    parameters = []
    for argument in inside.split(", "):
        declaration, _, default = argument.partition("=")
        name = declaration.split()[-1]
        parameters.append((name, NO_DEFAULT if not default else ast.literal_eval(default)))
    return parameters


def test_mtp_signature_is_the_ops():
    """The schema's names in its order, with its defaults; out and scale default as vLLM's
    wrapper has them (so the method stands in for the wrapper and for the op); the additions are
    the keyword-only uniform_seqlen and state_scales."""
    method = VllmGdn.fused_gdn_decode_post_conv_mtp
    parameters = list(inspect.signature(method).parameters.values())[1:]  # past self
    positional = [p for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == VLLM_MTP
    schema = _schema_parameters(MTP_SCHEMA)
    assert [name for name, _ in schema] == [name for name, _ in VLLM_MTP]
    for (name, default), (_, ours) in zip(schema, VLLM_MTP):
        assert default is NO_DEFAULT or default == ours, name
    extra = {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert extra == {"uniform_seqlen": False, "state_scales": None}
    assert len(positional) + len(extra) == len(parameters)


#: where the lead's machines keep a downloaded vLLM wheel; CI has none, and skips what needs it
WHEELS = sorted(Path("/tmp/vllm").glob("vllm-*.whl"))


@pytest.mark.skipif(not WHEELS, reason="no vLLM wheel in /tmp/vllm")
def test_mtp_signature_is_the_wheels():
    """Where a vLLM wheel is at hand: its wrapper's and its Triton port's parameters, read from
    the files (not run), are the method's."""

    def parameters(path: str, function: str) -> list[tuple[str, object]]:
        with zipfile.ZipFile(WHEELS[-1]) as wheel:
            tree = ast.parse(wheel.read(path).decode())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
        names = [a.arg for a in node.args.args]
        defaults = [NO_DEFAULT] * (len(names) - len(node.args.defaults))
        # the defaults are constant expressions (128**-0.5), evaluated with no names in scope
        defaults += [eval(compile(ast.Expression(d), path, "eval"), {}) for d in node.args.defaults]
        return list(zip(names, defaults))

    wrapper = parameters("vllm/_custom_ops.py", "fused_gdn_decode_post_conv_mtp")
    assert wrapper == VLLM_MTP
    port = parameters(
        "vllm/third_party/flash_linear_attention/ops/fused_gdn_decode_post_conv_mtp.py",
        "fused_gdn_decode_post_conv_mtp_triton",
    )
    assert [name for name, _ in port] == [name for name, _ in VLLM_MTP]


def _mtp_args(total=7, N=2, columns=4):
    """The layer's tensors in the recorder's small shapes: post-conv rows, b and a as halves of
    ba, the table as a column slice of the block table, the gate as a view of the projection."""
    projection = torch.zeros(total, WIDTH + HV * V)
    ba = torch.zeros(total, 2 * HV)
    b, a = ba.chunk(2, -1)
    blocks = torch.arange(N * 6, dtype=i32).view(N, 6)
    return dict(
        mixed_qkv=torch.zeros(total, WIDTH),
        a=a,
        b=b,
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV),
        state_indices=blocks[:, :columns],
        cu_seqlens=torch.tensor([0, 4, 7], dtype=i32),
        num_accepted_tokens=torch.tensor([2, 1], dtype=i32),
        state=torch.zeros(16, HV, V, K),
        output_gate=projection[:, WIDTH:].unflatten(-1, (HV, V)),
        norm_weight=torch.ones(V),
        out=torch.zeros(total, HV, V),
        scale=K**-0.5,
        norm_eps=1e-6,
        output_gate_activation="sigmoid",
    )


def test_mtp_is_one_packed_per_token_call_with_the_norm():
    """Every tensor passed on as it came (no copy, no view): mixed_qkv as gdn_decode's
    mixed_qkv, the table as per-token slots with num_accepted_tokens, slot 0 as padding, T the
    table's width, q and k always L2-normalised, output_gate as z, the norm's weight, eps and
    activation, out written in place and returned."""
    fake = Recorder()
    args = _mtp_args()
    returned = VllmGdn(fake).fused_gdn_decode_post_conv_mtp(**args)
    call = fake.last
    for ours, theirs in [
        ("mixed_qkv", "mixed_qkv"), ("a", "a"), ("b", "b"), ("A_log", "A_log"),
        ("dt_bias", "dt_bias"), ("initial_state", "state"), ("initial_state_indices", "state_indices"),
        ("num_accepted_tokens", "num_accepted_tokens"), ("cu_seqlens", "cu_seqlens"),
        ("z", "output_gate"), ("norm_weight", "norm_weight"), ("output", "out"),
    ]:  # fmt: skip
        assert call[ours] is args[theirs], ours
    assert not {"q", "k", "v", "state", "output_state_indices", "disable_state_update"} & set(call)
    assert not {"intermediate_states_buffer", "conv_state"} & set(call)
    assert call["null_slot"] == 0 and call["max_seqlen"] == 4
    assert call["use_qk_l2norm"] is True and call["uniform_seqlen"] is False
    assert call["scale"] == K**-0.5 and call["norm_eps"] == 1e-6
    assert call["norm_activation"] == "sigmoid"
    assert returned is args["out"]


def test_mtp_positional_call_and_the_wrappers_defaults():
    """A positional call with the schema's required arguments (what a torch op call passes), and
    the wrapper's defaults: out None (gdn_decode allocates it; that is what returns), scale
    128**-0.5, norm_eps 1e-5, silu."""
    fake = Recorder()
    args = _mtp_args()
    required = [args[name] for name, default in VLLM_MTP if default is NO_DEFAULT]
    returned = VllmGdn(fake).fused_gdn_decode_post_conv_mtp(*required)
    call = fake.last
    assert call["output"] is None and isinstance(returned, torch.Tensor)
    assert call["scale"] == 128**-0.5 and call["norm_eps"] == 1e-5
    assert call["norm_activation"] == "silu"
    positional = [args[name] for name, _ in VLLM_MTP]
    assert VllmGdn(fake).fused_gdn_decode_post_conv_mtp(*positional) is args["out"]


def test_mtp_passes_the_uniform_promise_when_given():
    fake = Recorder()
    VllmGdn(fake).fused_gdn_decode_post_conv_mtp(**_mtp_args(8, 2, 4), uniform_seqlen=True)
    assert fake.last["uniform_seqlen"] is True and fake.last["max_seqlen"] == 4


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(cu_seqlens=None), r"^cu_seqlens: vLLM's op packs the sequences' tokens"),
        (dict(num_accepted_tokens=None), r"^num_accepted_tokens: vLLM's op reads .* got None"),
        (
            dict(state_indices=torch.tensor([1, 2], dtype=i32)),
            r"^state_indices: vLLM's op takes a per-token slot table \[N, 1 \+ S\] .*got shape \[2\]",
        ),
        (dict(state_indices=None), r"^state_indices: .*got NoneType"),
    ],
    ids=["no-cu-seqlens", "no-accepted", "row-slots", "no-table"],
)
def test_mtp_refusals_name_the_argument(changes, message):
    fake = Recorder()
    with pytest.raises(ValueError, match=message):
        VllmGdn(fake).fused_gdn_decode_post_conv_mtp(**dict(_mtp_args(), **changes))
    assert fake.calls == []


def test_mtp_errors_of_gdn_decode_name_the_ops_argument():
    for raised_as, named in [
        ("norm_activation", "output_gate_activation"), ("z", "output_gate"), ("output", "out"),
        ("initial_state", "state"), ("initial_state_indices", "state_indices"),
        ("max_seqlen", r"state_indices\.shape\[1\]"), ("q", "mixed_qkv"),
        ("z/norm_weight", "output_gate/norm_weight"),
    ]:  # fmt: skip
        error = ValueError(f"{raised_as}: something")
        with pytest.raises(ValueError, match=rf"^{named} \(gdn_decode's {raised_as}\): something"):
            VllmGdn(Recorder(error)).fused_gdn_decode_post_conv_mtp(**_mtp_args())


def _real_mtp_args(total=9, N=3, columns=4):
    """vLLM's tensors on the h200 target's qwen3-next geometry (CPU: every check but the
    device's passes). Token rows past cu_seqlens[N] are a graph's padding."""
    projection = torch.zeros(total, RWIDTH + RHV * RV, dtype=bf16)
    ba = torch.zeros(total, 2 * RHV, dtype=bf16)
    b, a = ba.chunk(2, -1)
    blocks = torch.arange(1, 1 + N * 6, dtype=i32).view(N, 6)
    blocks[1] = 0  # a padded request
    return dict(
        mixed_qkv=torch.zeros(total, RWIDTH, dtype=bf16),
        a=a,
        b=b,
        A_log=torch.zeros(RHV),
        dt_bias=torch.zeros(RHV, dtype=bf16),
        state_indices=blocks[:, :columns],
        cu_seqlens=torch.tensor([0, 4, 4, 7], dtype=i32),
        num_accepted_tokens=torch.tensor([2, 1, 4], dtype=i32),
        state=torch.zeros(24, RHV, RV, RK, dtype=bf16),
        output_gate=projection[:, RWIDTH:].unflatten(-1, (RHV, RV)),
        norm_weight=torch.ones(RV),
        out=torch.zeros(total, RHV, RV, dtype=bf16),
        scale=RK**-0.5,
        norm_eps=1e-6,
        output_gate_activation="silu",
    )


@pytest.mark.parametrize("state_dtype", [bf16, torch.float32])
def test_mtp_passes_the_targets_checks(state_dtype):
    """vLLM's shapes, strides and dtypes (bf16 or fp32 state, fp32 norm weight, bf16 dt_bias)
    reach the real gdn_decode's last check, the device's: nothing compiled, nothing written."""
    args = _real_mtp_args()
    args["state"] = args["state"].to(state_dtype)
    before = compiled_count()
    with pytest.raises(ValueError, match=r"expected a CUDA tensor; got a tensor on cpu"):
        VllmGdn(h200.gdn_decode).fused_gdn_decode_post_conv_mtp(**args)
    assert compiled_count() == before
    assert not args["out"].any() and not args["state"].any()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(output_gate_activation="gelu"), r"^output_gate_activation \(gdn_decode's norm_activation\): expected one of"),
        (dict(out=torch.zeros(9, 1, RHV, RV, dtype=bf16)), r"^out \(gdn_decode's output\)"),
        (dict(out=torch.zeros(9, RHV, RV)), r"^out \(gdn_decode's output\): expected dtype"),
        (dict(output_gate=torch.zeros(9, RHV, RV)), r"^output_gate \(gdn_decode's z\): expected dtype bfloat16 \(as q\)"),
        (dict(output_gate=torch.zeros(8, RHV, RV, dtype=bf16)), r"^output_gate \(gdn_decode's z\)"),
        (dict(norm_weight=torch.ones(RV, dtype=torch.int32)), r"^norm_weight: expected dtype"),
        (dict(norm_eps=0.0), r"^norm_eps: expected a finite number > 0"),
        (dict(state=torch.zeros(24, RHV, RK, RV + 8, dtype=bf16)), r"^state \(gdn_decode's initial_state\)"),
        (dict(state_indices=torch.ones(3, 12, dtype=i32)), r"^state_indices\.shape\[1\] \(gdn_decode's max_seqlen\): expected 1\.\.8"),
        (dict(state_indices=torch.ones(2, 4, dtype=i32)), r"^state_indices \(gdn_decode's initial_state_indices\)"),
        (dict(num_accepted_tokens=torch.ones(3, dtype=torch.int64)), r"^num_accepted_tokens: expected dtype int32"),
        (dict(cu_seqlens=torch.tensor([0, 4, 7], dtype=i32)), r"^state_indices \(gdn_decode's initial_state_indices\)"),
        (dict(mixed_qkv=torch.zeros(9, RWIDTH + 128, dtype=bf16)), r"^mixed_qkv: a row width of"),
    ],
    ids=["activation", "out-rank", "out-dtype", "gate-dtype", "gate-tokens", "weight-dtype", "eps",
         "state-shape", "too-wide", "table-rows", "accepted-dtype", "cu-rows", "width"],
)  # fmt: skip
def test_mtp_bad_input_is_named_by_the_ops_argument_before_anything_runs(changes, message):
    args = dict(_real_mtp_args(), **changes)
    before = compiled_count()
    with pytest.raises((ValueError, TypeError), match=message):
        VllmGdn(h200.gdn_decode).fused_gdn_decode_post_conv_mtp(**args)
    assert compiled_count() == before
    assert not args["out"].any() and not args["state"].any()
