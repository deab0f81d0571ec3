"""The conv1d prologue (features.conv1d_widths) on a GPU, against the float64 reference: the
causal conv1d update of gdngen.reference.conv, then the recurrence (and the gated RMSNorm where
the call fuses it), with both states checked slot by slot.

Every test runs both plans of a conv1d call (docs/design.md, "The conv1d step apart"): the conv
fused into the decode kernel, and the conv step as a kernel of its own (the split plan), whose
workspace holds the convolved rows in q's dtype: for it the reference's conv outputs are
rounded to that dtype once, as the workspace rounds them."""

import sys
from functools import partial

import pytest
import torch

import generated.h200 as h200
from gdngen.engines.sglang import SglangGdn
from gdngen.engines.vllm import VllmGdn
from gdngen.reference import causal_conv1d_update as reference_conv
from gdngen.reference import (
    conv_windows,
    gated_rmsnorm,
    reference_call,
    reference_decode,
)
from gdngen.problem import PackedProblem
from gdngen.reference.core import split_mixed_qkv
from gdngen.reference.decode import reference_call
from gdngen.terms import SCALED_STATE_DTYPES
from tests.compare import assert_close
from tests.gpu.check_call import as_k_last
from tests.gpu.check_form import check_against, expected_of
from tests.quantized_state import assert_quantized_pool, quantized_pool

pytestmark = pytest.mark.gpu

#: the plan the current test runs (set by the ``plan`` fixture)
PLAN = "fused"
SPLIT_CALL = h200.split_conv_call()
FUSED_CALL = h200.fused_conv_call()
#: every step a kernel of its own: the conv step, the bare recurrence's variant, the norm step
STEPS_CALL = h200.split_steps_call()


@pytest.fixture(params=["fused", "split"], autouse=True)
def plan(request, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PLAN", request.param)
    return request.param


def core():
    """The dispatching call, on the current plan."""
    return {"fused": FUSED_CALL, "split": SPLIT_CALL, "steps": STEPS_CALL}[PLAN]


def pinned(name):
    """One variant's call, on the current plan."""
    return h200.variant(name, split_conv=PLAN == "split")


def rounded_inputs():
    """What the split plan's workspace rounds the recurrence's inputs to (None when fused):
    tests.compare.assert_close's ``inputs_rounded_to``."""
    return None if PLAN == "fused" else torch.bfloat16


def causal_conv1d_update(x, *args, **kwargs):
    """The reference conv; on the split plan its outputs rounded once to x's dtype."""
    out, after = reference_conv(x, *args, **kwargs)
    if PLAN != "fused":
        out = out.to(x.dtype).to(out.dtype)
    return out, after


SERVED = [("k_last", "bf16"), ("k_last", "fp16"), ("k_last", "fp32"), ("v_last", "bf16"),
          ("v_last", "fp16"), ("v_last", "fp32")]  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def conv_pool(slots, channels, width, layout, gen, columns=None):
    """A conv state pool [slots, D, columns] (W - 1 by default): channels-first, or the view
    engines take of a [slots, columns, D] buffer (channels-last)."""
    columns = columns or width - 1
    if layout == "channels_first":
        return torch.randn(slots, channels, columns, generator=gen, device="cuda").bfloat16()
    kept = torch.randn(slots, columns, channels, generator=gen, device="cuda").bfloat16()
    return kept.transpose(1, 2)


def make_case(*, B, T, H=16, HV=32, K=128, V=128, layout="k_last", state_dtype="bf16", slots=None,
              padded=(), null_slot=-1, width=4, bias=True, conv_layout="channels_first", seed=0):  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(seed)
    channels = 2 * H * K + HV * V

    def randn(*shape, std=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen, device="cuda") * std).to(dtype)

    pool_size = slots if slots is not None else B
    head = (V, K) if layout == "k_last" else (K, V)
    case = dict(
        mixed_qkv=randn(B, T, channels),
        A_log=torch.log(torch.rand(HV, generator=gen, device="cuda") * 15 + 1),
        a=randn(B, T, HV, std=2.0),
        b=randn(B, T, HV, std=2.0),
        dt_bias=randn(HV, std=0.5, dtype=torch.float32),
        state_layout=layout,
        conv_weight=randn(channels, width, std=0.5),
        conv_bias=randn(channels, std=0.2) if bias else None,
        conv_state=conv_pool(pool_size, channels, width, conv_layout, gen),
    )
    quantized = state_dtype in SCALED_STATE_DTYPES  # drawn in fp32, stored with its row scales
    pool = randn(pool_size, HV, *head, std=0.5, dtype=DTYPES.get(state_dtype, torch.float32))
    if slots is None:
        case["state"] = pool
    else:
        perm = torch.randperm(slots, generator=gen, device="cuda")
        perm = perm[perm > null_slot] if null_slot >= 0 else perm
        reads = perm[:B].clone()
        for row in padded:
            reads[row] = null_slot
        case.update(initial_state=pool, initial_state_indices=reads.int(), null_slot=null_slot)
    return quantized_pool(case, state_dtype) if quantized else case


def expected(
    case, *, H, K, HV, V, activation="silu", z=None, norm_weight=None, eps=1e-6, scales=None
):
    """The reference outputs, pools and live rows of one dense call; with ``scales`` (those of a
    quantized pool, before the call), reference_call's ExpectedCall in place of the rows."""
    pool = case.get("state", case.get("initial_state"))
    slots = case.get("initial_state_indices")
    null_slot = case.get("null_slot", -1)
    conv_out, conv_after = causal_conv1d_update(
        case["mixed_qkv"], case["conv_state"], case["conv_weight"], case["conv_bias"],
        activation=None if activation == "identity" else "silu", slots=slots, null_slot=null_slot,
    )  # fmt: skip
    q, k, v = split_mixed_qkv(conv_out, H, K, HV, V)
    read = None if slots is None else torch.where(slots.long() <= null_slot, -1, slots.long())
    reference = reference_decode if scales is None else partial(reference_call, state_scales=scales)
    ref = reference(
        q, k, v, pool, case["A_log"], case["a"], case["dt_bias"], case["b"], read_slots=read,
        state_layout=case["state_layout"],
    )  # fmt: skip
    out = ref.output
    if PLAN == "steps":  # the norm step reads the recurrence's output as stored
        out = out.to(torch.bfloat16).to(out.dtype)
    if z is not None:
        out = gated_rmsnorm(out, z, norm_weight, eps=eps, activation="silu")
    return out, ref, conv_after


def run_and_check(case, *, H=16, K=128, HV=32, V=128, activation="silu", norm=True, call=None):
    call = call or core()
    B, T = case["mixed_qkv"].shape[:2]
    gen = torch.Generator(device="cuda").manual_seed(7)
    z = norm_weight = None
    if norm:
        z = torch.randn(B, T, HV, V, generator=gen, device="cuda").bfloat16()
        norm_weight = (1 + 0.5 * torch.randn(V, generator=gen, device="cuda")).bfloat16()
    pool = case.get("state", case.get("initial_state"))
    pool_before, conv_before = pool.clone(), case["conv_state"].clone()
    scales = case.get("state_scales")  # a quantized pool's (tests/gpu/check_quantized.py)
    scales_before = None if scales is None else scales.clone()
    ref_out, ref, conv_after = expected(
        case, H=H, K=K, HV=HV, V=V, activation=activation, z=z, norm_weight=norm_weight,
        scales=scales_before,
    )  # fmt: skip
    out, _ = call(**case, conv_activation=activation, z=z, norm_weight=norm_weight)
    torch.cuda.synchronize()

    slots = case.get("initial_state_indices")
    live = (
        torch.ones(B, dtype=torch.bool, device="cuda")
        if slots is None
        else slots.long() > case.get("null_slot", -1)
    )
    assert_close("output", out[live], ref_out[live], torch.bfloat16)
    if (~live).any():
        assert (out[~live] == 0).all(), "padded rows must have zero output"
    slots = torch.arange(B, device="cuda") if slots is None else slots.long()
    owned = torch.zeros(pool.shape[0], dtype=torch.bool, device="cuda")
    owned[slots[live]] = True
    if scales is not None:
        assert_quantized_pool(pool, scales, ref.pool, ref.scales, pool_before, scales_before)
    else:
        assert_close("final state", as_k_last(pool[slots[live]], case["state_layout"]),
                     ref.final_state[live], pool.dtype, rounded_inputs())  # fmt: skip
        assert torch.equal(pool[~owned], pool_before[~owned]), "a recurrent slot not owned changed"
    # The new conv columns are inputs or kept columns, moved: exact.
    assert torch.equal(case["conv_state"][owned], conv_after[owned]), "conv state"
    assert torch.equal(
        case["conv_state"][~owned], conv_before[~owned]
    ), "a conv slot not owned changed"
    return out


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_full_core(layout, state_dtype, tokens):
    # conv1d -> recurrence -> gated RMSNorm in one call, a pool with padding, both conv layouts.
    case = make_case(
        B=4 + tokens, T=tokens, layout=layout, state_dtype=state_dtype, slots=20, padded=(1,),
        conv_layout="channels_last" if tokens % 2 else "channels_first", seed=tokens,
    )  # fmt: skip
    run_and_check(case)


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens", [1, 4])
def test_full_core_as_separate_steps(layout, state_dtype, tokens, monkeypatch):
    # The chain of gdngen's own kernels (split_steps_call); runs once under each plan fixture.
    monkeypatch.setattr(sys.modules[__name__], "PLAN", "steps")
    case = make_case(
        B=5 + tokens, T=tokens, layout=layout, state_dtype=state_dtype, slots=20, padded=(2,),
        conv_layout="channels_last", seed=40 + tokens,
    )  # fmt: skip
    run_and_check(case)


def _core_rule_variants(steps: bool = False):
    """Every kernel a rule for fused-core calls (the norm, and the conv1d prologue or either)
    names, K = 128, in any GPU model's table: those of rules that fuse the norm, or (``steps``)
    the bare variants of steps-plan rules (split_norm), which have no epilogue of their own."""
    tables = (h200.dispatch.TABLE, *h200.dispatch.TABLES.values())
    return sorted(
        {
            rule.use for table in tables for rule in table
            if rule.gated_norm and rule.conv1d is not False and rule.head_dims in (None, (128, 128))
            and rule.split_norm == steps
        }
    )  # fmt: skip


@pytest.mark.parametrize("name", _core_rule_variants())
def test_every_core_rule_variant(name):
    # Each kernel on its own, so a rule for large batches (fp32 T = 1 from B*HV = 2048) is
    # checked at a batch the dispatch tests do not reach.
    module = h200.variant(name).module(name)
    case = make_case(
        B=5, T=2, layout=module.LAYOUT, state_dtype=module.STATE_DTYPE, slots=12, padded=(3,),
        conv_layout="channels_last", seed=11,
    )  # fmt: skip
    run_and_check(case, call=pinned(name))


@pytest.mark.parametrize("name", _core_rule_variants(steps=True))
def test_every_steps_rule_variant(name, monkeypatch):
    # A steps-plan rule's bare variant between the conv step and the norm step (the plan its
    # rule runs); runs once under each plan fixture.
    monkeypatch.setattr(sys.modules[__name__], "PLAN", "steps")
    module = h200.variant(name).module(name)
    case = make_case(
        B=5, T=2, layout=module.LAYOUT, state_dtype=module.STATE_DTYPE, slots=12, padded=(3,),
        conv_layout="channels_last", seed=12,
    )  # fmt: skip
    run_and_check(case, call=h200.variant(name, split_conv=True, split_norm=True))


# (kernel, H, HV): a key head's q/k conv state is read by (HV / H) * (V / tile_v) CTAs, which
# count themselves in before its last reader writes it (gdngen.device.conv): 2, 3, 4, 6, 8 and 16
# readers, each kernel on its own.
KEY_HEAD_READERS = [
    ("kl_bf16_tv128_ilp8_vec8_tpg16_sm90", 16, 32),  # 1 x 2
    ("kl_bf16_tv128_ilp8_vec8_tpg16_sm90", 16, 48),  # 1 x 3
    ("kl_bf16_tv128_ilp8_vec8_tpg16_sm90", 4, 16),  # 1 x 4
    ("kl_fp32_tv64_ilp8_vec4_tpg32_sm90", 16, 48),  # 2 x 3
    ("kl_fp32_tv64_ilp8_vec4_tpg32_sm90", 16, 64),  # 2 x 4
    ("kl_bf16_tv32_ilp4_vec8_tpg16_sm90", 16, 32),  # 4 x 2
    ("vl_bf16_tv64_ilp8_vec8_tpg16_sm90", 16, 32),  # 2 x 2
    ("kl_bf16_tv32_ilp4_vec8_tpg16_sm90", 16, 64),  # 4 x 4
    ("kl_bf16_tv16_ilp4_vec8_tpg16_sm90", 16, 32),  # 8 x 2
]


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "no_norm"])
@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize(
    "name,H,HV", KEY_HEAD_READERS, ids=[f"{n[:20]}-{h}-{hv}" for n, h, hv in KEY_HEAD_READERS]
)
def test_every_reader_count_of_a_key_head(name, H, HV, tokens, norm):
    module = h200.variant(name).module(name)
    case = make_case(
        B=7, T=tokens, H=H, HV=HV, layout=module.LAYOUT, state_dtype=module.STATE_DTYPE,
        slots=11, padded=(2,), conv_layout="channels_last" if tokens > 1 else "channels_first",
        seed=HV + tokens,
    )  # fmt: skip
    run_and_check(case, H=H, HV=HV, norm=norm, call=pinned(name))
    # A second call goes on from the states the first one left (and the count back at zero).
    run_and_check(case, H=H, HV=HV, norm=norm, call=pinned(name))


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("tokens", [1, 3])
def test_widths_without_norm_or_bias(width, tokens):
    case = make_case(B=6, T=tokens, width=width, bias=False, slots=9, padded=(0, 5), seed=width)
    run_and_check(case, norm=False, activation="identity" if width == 3 else "silu")


@pytest.mark.parametrize("batch", [1, 2, 17, 130])
@pytest.mark.parametrize("heads", [(16, 32), (16, 64), (16, 48), (4, 8)])
def test_geometries_and_batches(batch, heads):
    # Every key head is read by HV/H value heads' CTAs (3 at 16/48: counts not a power of two).
    H, HV = heads
    case = make_case(B=batch, T=1 + batch % 2, H=H, HV=HV, seed=batch + HV)
    run_and_check(case, H=H, HV=HV)


def test_vllm_null_slot_zero():
    # vLLM pads with slot 0 (its null block): rows naming it, and slot 0 itself, are untouched.
    case = make_case(B=7, T=1, slots=12, padded=(2, 6), null_slot=0, conv_layout="channels_last")
    run_and_check(case)


def test_repeated_calls_and_graph_replay():
    # The reader counts must be back at zero after every call: five calls in a row, each checked
    # against the reference, then a captured graph replayed on new inputs.
    for step in range(3):
        run_and_check(make_case(B=5, T=2, slots=11, padded=(3,), seed=100 + step))
    case = make_case(B=5, T=1, slots=11, padded=(3,), seed=200)
    fresh = make_case(B=5, T=1, slots=11, padded=(3,), seed=201)
    core()(**case)  # plan outside the capture
    graph_case = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = core()(**graph_case)
    for key, value in fresh.items():
        if isinstance(value, torch.Tensor):
            graph_case[key].copy_(value)
    pool_before = graph_case["initial_state"].clone()
    conv_before = graph_case["conv_state"].clone()
    expect = dict(fresh, initial_state=pool_before, conv_state=conv_before)
    ref_out, ref, conv_after = expected(expect, H=16, K=128, HV=32, V=128)
    graph.replay()
    torch.cuda.synchronize()
    live = ref.live
    assert_close("graph output", out[live], ref_out[live], torch.bfloat16)
    slots = graph_case["initial_state_indices"].long()[live]
    assert torch.equal(graph_case["conv_state"][slots], conv_after[slots])
    run_and_check(make_case(B=5, T=1, slots=11, seed=300))


@pytest.mark.parametrize("T", [2, 4, 8])
def test_packed_mixed_lengths(T):
    # Sequences of 0..T tokens in one [total, D] buffer: each advances its conv state by its own
    # length. The reference runs each sequence on its own.
    H, K, HV, V = 16, 128, 32, 128
    gen = torch.Generator().manual_seed(T)
    lengths = torch.randint(1, T + 1, (9,), generator=gen)
    lengths[4] = 0
    cu = torch.zeros(10, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    total = int(cu[-1])
    case = make_case(B=total, T=1, slots=15, seed=T, conv_layout="channels_last")
    slots = torch.randperm(15, generator=gen)[:9].int().cuda()
    pool, conv = case["initial_state"], case["conv_state"]
    pool_ref, conv_ref = pool.clone(), conv.clone()
    mixed, a, b = case["mixed_qkv"][:, 0], case["a"][:, 0], case["b"][:, 0]
    outs = []
    for n in range(9):
        lo, hi = int(cu[n]), int(cu[n + 1])
        if hi == lo:
            continue
        one = dict(case, mixed_qkv=mixed[None, lo:hi], a=a[None, lo:hi], b=b[None, lo:hi],
                   initial_state=pool_ref, initial_state_indices=slots[n : n + 1],
                   conv_state=conv_ref)  # fmt: skip
        out, ref, conv_after = expected(one, H=H, K=K, HV=HV, V=V)
        pool_ref, conv_ref = ref.pool, conv_after
        outs.append(out[0])
    got, _ = core()(
        mixed_qkv=mixed, a=a, b=b, A_log=case["A_log"], dt_bias=case["dt_bias"],
        initial_state=pool, initial_state_indices=slots, cu_seqlens=cu.cuda(), max_seqlen=T,
        conv_state=conv, conv_weight=case["conv_weight"], conv_bias=case["conv_bias"],
    )  # fmt: skip
    torch.cuda.synchronize()
    assert_close("packed output", got, torch.cat(outs), torch.bfloat16)
    assert torch.equal(conv, conv_ref), "conv state"
    assert_close("states", pool.double(), pool_ref.double(), torch.bfloat16)


def test_disable_state_update_leaves_both_states():
    # Verify without a cache: the outputs as the reference's, no recurrent or conv state written.
    case = make_case(B=6, T=3, slots=13, padded=(2,), seed=41, conv_layout="channels_last")
    pool, conv = case["initial_state"], case["conv_state"]
    pool_before, conv_before = pool.clone(), conv.clone()
    ref_out, ref, _ = expected(case, H=16, K=128, HV=32, V=128)
    out, _ = core()(**case, disable_state_update=True)
    torch.cuda.synchronize()
    assert_close("output", out[ref.live], ref_out[ref.live], torch.bfloat16)
    assert torch.equal(pool, pool_before), "the recurrent state changed"
    assert torch.equal(conv, conv_before), "the conv state changed"


def test_separate_write_slots():
    # Both states read from the read slots and written to the write slots; the read slots keep
    # their contents.
    B, slots = 5, 16
    case = make_case(B=B, T=2, slots=slots, seed=43)
    gen = torch.Generator(device="cuda").manual_seed(44)
    perm = torch.randperm(slots, generator=gen, device="cuda")
    reads, writes = perm[:B].int(), perm[B : 2 * B].int()
    # no write slot (FlashInfer's meaning): the row is computed from its read slot, and neither
    # of its states is stored anywhere
    writes[3] = -1
    case["initial_state_indices"] = reads
    pool, conv = case["initial_state"], case["conv_state"]
    pool_before, conv_before = pool.clone(), conv.clone()
    conv_out, conv_after = causal_conv1d_update(
        case["mixed_qkv"], conv_before, case["conv_weight"], case["conv_bias"], slots=reads
    )
    q, k, v = split_mixed_qkv(conv_out, 16, 128, 32, 128)
    written = writes >= 0
    ref = reference_decode(
        q, k, v, pool_before, case["A_log"], case["a"], case["dt_bias"], case["b"],
        read_slots=reads.long(), write_slots=writes.long(),
    )  # fmt: skip
    out, _ = core()(**case, output_state_indices=writes)
    torch.cuda.synchronize()
    assert ref.output[3].abs().max() > 0
    assert_close("output", out, ref.output, torch.bfloat16)
    conv_expected = conv_before.clone()
    conv_expected[writes[written].long()] = conv_after[reads[written].long()]
    assert torch.equal(conv, conv_expected), "conv state"
    pool_expected = pool_before.clone()
    pool_expected[writes[written].long()] = ref.pool[writes[written].long()].to(pool.dtype)
    untouched = torch.ones(slots, dtype=torch.bool, device="cuda")
    untouched[writes[written].long()] = False
    assert torch.equal(pool[untouched], pool_before[untouched]), "a slot not written changed"
    assert_close("final state", pool[writes[written].long()].double(),
                 ref.pool[writes[written].long()].double(), torch.bfloat16)  # fmt: skip


def test_wider_conv_state_keeps_its_extra_columns():
    # vLLM sizes every conv slot for speculative decoding (W - 2 + (1 + S) columns); plain decode
    # uses the first W - 1 and leaves the rest.
    gen = torch.Generator(device="cuda").manual_seed(45)
    case = make_case(B=4, T=1, slots=9, padded=(1,), null_slot=0, seed=45)
    case["conv_state"] = conv_pool(9, case["conv_weight"].shape[0], 4, "channels_last", gen, 7)
    run_and_check(case)


def spec_decode_case(problem: PackedProblem, *, width=4, conv_layout="channels_last", seed=0):
    """vLLM's speculative-decoding form with the prologue: per-token slots, num_accepted_tokens,
    packed sequences, pre-conv mixed_qkv, and a conv state of W - 2 + (1 + S) columns a slot."""
    args = problem.make("cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    H, K, HV, V = problem.H, problem.K, problem.HV, problem.V
    channels = 2 * H * K + HV * V
    slots = args["initial_state"].shape[0]
    args.update(
        conv_state=conv_pool(slots, channels, width, conv_layout, gen, width - 2 + problem.tokens),
        conv_weight=(torch.randn(channels, width, generator=gen, device="cuda") * 0.5).bfloat16(),
        conv_bias=(torch.randn(channels, generator=gen, device="cuda") * 0.2).bfloat16(),
    )
    return args


def spec_decode_expected(args: dict, problem: PackedProblem):
    """Each sequence convolved on its own (its conv slot: column 0 of its table row; its window
    at column num_accepted - 1), then the recurrence of the whole call on the conv outputs."""
    channels = args["conv_weight"].shape[0]
    x = args["mixed_qkv"].reshape(-1, channels)
    convolved = torch.zeros(x.shape, dtype=torch.float64, device="cuda")
    conv_after = args["conv_state"].clone()
    table, accepted = args["initial_state_indices"].long(), args["num_accepted_tokens"].long()
    cu, null_slot = args["cu_seqlens"].long(), args["null_slot"]
    for n in range(table.shape[0]):
        lo, hi = int(cu[n]), int(cu[n + 1])
        read = int(table[n, accepted[n] - 1])
        if hi == lo or read <= null_slot or int(table[n, 0]) <= null_slot:
            continue
        out, conv_after = causal_conv1d_update(
            x[None, lo:hi], conv_after, args["conv_weight"], args["conv_bias"],
            slots=table[n : n + 1, 0], null_slot=null_slot, accepted=accepted[n : n + 1],
        )  # fmt: skip
        convolved[lo:hi] = out[0]
    pool_before = args["initial_state"].clone()
    post = dict(args, mixed_qkv=convolved.view(args["mixed_qkv"].shape))
    return expected_of(post, problem, pool_before, None), conv_after, pool_before


@pytest.mark.parametrize("tokens", [2, 4, 8])
@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_vllm_spec_decode(tokens, state_dtype):
    # Every num_accepted_tokens value (rows take 1 .. 1 + S in turn), mixed lengths (one empty),
    # padded rows under vLLM's null slot 0, the conv state in vLLM's channels-last view.
    problem = PackedProblem(
        sequences=3 * tokens + 1, tokens=tokens, HV=32, state_dtype=state_dtype, mixed_qkv=True,
        mixed_lengths=True, padded_rows=(2, 5), seed=tokens,
    )  # fmt: skip
    args = spec_decode_case(problem, seed=tokens)
    expected_call, conv_after, pool_before = spec_decode_expected(args, problem)
    out, pool = core()(**args)
    torch.cuda.synchronize()
    check_against(expected_call, out, pool, None, problem, pool_before, None, rounded_inputs())
    assert torch.equal(args["conv_state"], conv_after), "conv state"


def test_vllm_spec_decode_graph_replay():
    # A captured spec-decode call replayed with new inputs, and its rows (table, accepted count,
    # length) shuffled: new contents of every index tensor.
    problem = PackedProblem(sequences=9, tokens=4, HV=32, mixed_qkv=True, mixed_lengths=True,
                            padded_rows=(3,), seed=50)  # fmt: skip
    args = spec_decode_case(problem, seed=50)
    core()(**args)  # plan outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = core()(**args)
    gen = torch.Generator(device="cuda").manual_seed(51)
    order = torch.randperm(9, generator=gen, device="cuda")
    table, accepted, cu = (
        args["initial_state_indices"],
        args["num_accepted_tokens"],
        args["cu_seqlens"],
    )
    lengths = (cu[1:] - cu[:-1])[order]
    table.copy_(table[order])
    accepted.copy_(accepted[order])
    cu[1:] = lengths.cumsum(0).to(cu.dtype)
    args["mixed_qkv"].copy_(torch.randn(args["mixed_qkv"].shape, generator=gen, device="cuda"))
    expected_call, conv_after, pool_before = spec_decode_expected(args, problem)
    graph.replay()
    torch.cuda.synchronize()
    check_against(
        expected_call,
        out,
        args["initial_state"],
        None,
        problem,
        pool_before,
        None,
        rounded_inputs(),
    )
    assert torch.equal(args["conv_state"], conv_after), "conv state"


def test_vllm_decode_core_adapter():
    # The whole core through VllmGdn.decode_core, in vLLM's speculative form: conv, recurrence
    # and gated RMSNorm against the reference, both states checked.
    problem = PackedProblem(sequences=7, tokens=4, HV=32, mixed_qkv=True, mixed_lengths=True,
                            padded_rows=(1,), flat=True, seed=60)  # fmt: skip
    args = spec_decode_case(problem, seed=60)
    expected_call, conv_after, pool_before = spec_decode_expected(args, problem)
    total = args["mixed_qkv"].shape[0]
    gen = torch.Generator(device="cuda").manual_seed(61)
    z = torch.randn(total, 32, 128, generator=gen, device="cuda").bfloat16()
    norm_weight = (1 + 0.5 * torch.randn(128, generator=gen, device="cuda")).bfloat16()
    out = VllmGdn(core()).decode_core(
        args["mixed_qkv"], args["a"], args["b"], args["A_log"], args["dt_bias"],
        args["initial_state"], args["initial_state_indices"], args["conv_state"],
        args["conv_weight"], args["conv_bias"], z, norm_weight, 1e-6,
        query_start_loc=args["cu_seqlens"], num_accepted_tokens=args["num_accepted_tokens"],
    )  # fmt: skip
    torch.cuda.synchronize()
    expected_out = gated_rmsnorm(
        expected_call.output.view(total, 32, 128), z, norm_weight, eps=1e-6
    )
    assert_close("core output", out, expected_out, torch.bfloat16)
    assert torch.equal(args["conv_state"], conv_after), "conv state"
    assert_close("states", args["initial_state"].double(), expected_call.pool.double(),
                 torch.bfloat16)  # fmt: skip


def nan_windows(rows, steps, channels, width, layout):
    """An intermediate_conv_windows buffer [rows, steps, D, W - 1] of NaN, and the tensor that
    holds its memory: "dense"; "channels_last" (each column's channels contiguous); or SGLang's
    deduplicated view of one [rows, D, steps + W - 2] buffer, whose consecutive steps overlap."""
    kept = width - 1
    if layout == "dense":
        held = torch.full((rows, steps, channels, kept), float("nan"), device="cuda")
        held = held.bfloat16()
        return held, held
    if layout == "channels_last":
        held = torch.full((rows, steps, kept, channels), float("nan"), device="cuda").bfloat16()
        return held.transpose(2, 3), held
    held = torch.full((rows, channels, steps + kept - 1), float("nan"), device="cuda").bfloat16()
    view = held.as_strided((rows, steps, channels, kept), (held.stride(0), 1, held.stride(1), 1))
    return view, held


def assert_windows(held, held_before, windows_view_of, expected_rows):
    """Every window the call owns equals the reference's (exact: inputs moved, not computed);
    every other element is as it was. ``expected_rows``: (cache row, [tokens, D, W - 1])."""
    expected = held_before.clone()
    view = windows_view_of(expected)
    for row, windows in expected_rows:
        for t in range(windows.shape[0]):  # a step at a time: SGLang's view overlaps across steps
            view[row, t] = windows[t].to(expected.dtype)
    torch.testing.assert_close(held, expected, rtol=0, atol=0, equal_nan=True)


def restride(view):
    """``view``'s geometry over another tensor laid out as the one it views."""
    return lambda other: other.as_strided(view.shape, view.stride())


@pytest.mark.parametrize("windows_layout", ["dense", "channels_last"])
@pytest.mark.parametrize("update", [False, True], ids=["verify", "verify_and_update"])
def test_verify_cache_with_conv_windows(windows_layout, update):
    # Dense rows of a pool with padding: the recurrent state after every token in the cache's
    # row n, the conv window after every token in the windows' row n, and the pools written
    # (or not, with disable_state_update) as the reference says.
    B, T, width = 6, 4, 4
    case = make_case(B=B, T=T, slots=15, padded=(2,), seed=70, conv_layout="channels_last")
    channels = case["conv_weight"].shape[0]
    pool, conv = case["initial_state"], case["conv_state"]
    cache = torch.full((B, T, 32, 128, 128), float("nan"), device="cuda").bfloat16()
    windows, held = nan_windows(B, T, channels, width, windows_layout)
    pool_before, conv_before, held_before = pool.clone(), conv.clone(), held.clone()
    slots = case["initial_state_indices"]
    conv_out, conv_after = causal_conv1d_update(
        case["mixed_qkv"], conv_before, case["conv_weight"], case["conv_bias"], slots=slots
    )
    expected_windows = conv_windows(case["mixed_qkv"], conv_before, width, slots=slots)
    q, k, v = split_mixed_qkv(conv_out, 16, 128, 32, 128)
    expected = reference_call(
        q, k, v, pool_before, case["A_log"], case["a"], case["dt_bias"], case["b"],
        read_slots=slots, disable_state_update=not update, cache=cache.clone(),
    )  # fmt: skip
    out, _ = core()(
        **case, intermediate_states_buffer=cache, intermediate_conv_windows=windows,
        disable_state_update=not update,
    )  # fmt: skip
    torch.cuda.synchronize()
    live = slots >= 0
    assert_close("output", out[live], expected.output[live], torch.bfloat16)
    assert (out[~live] == 0).all()
    filled = ~torch.isnan(expected.cache.float())
    assert_close("cached states", cache[filled], expected.cache[filled].double(), torch.bfloat16)
    assert torch.isnan(cache[~filled].float()).all(), "a padded row's cache was written"
    rows = [(n, expected_windows[n]) for n in range(B) if live[n]]
    assert_windows(held, held_before, restride(windows), rows)
    if update:
        assert torch.equal(conv, conv_after), "conv state"
        changed = (expected.pool != pool_before).flatten(1).any(1)
        assert_close("states", pool[changed], expected.pool[changed].double(), torch.bfloat16)
        assert torch.equal(pool[~changed], pool_before[~changed])
    else:
        assert torch.equal(conv, conv_before) and torch.equal(pool, pool_before)


def sglang_verify_case(problem: PackedProblem, *, width=4, seed=0):
    """SGLang's target verify with the prologue: pool-row caches (the recurrent one and the
    deduplicated conv windows), packed draft tokens, pre-conv mixed_qkv, a channels-first
    conv state a slot."""
    args = spec_decode_case(problem, width=width, conv_layout="channels_first", seed=seed)
    args["conv_state"] = args["conv_state"][..., : width - 1].contiguous()
    rows = args["intermediate_states_buffer"].shape[0]
    channels = args["conv_weight"].shape[0]
    windows, held = nan_windows(rows, problem.tokens, channels, width, "deduplicated")
    return args, windows, held


@pytest.mark.parametrize("tokens", [2, 4, 8])
def test_sglang_verify_core_with_conv_windows(tokens):
    # SGLang's verify through SglangGdn.decode_core: mixed lengths, a padded sequence (slot and
    # cache row -1), its deduplicated window view; output normed; no state written.
    problem = PackedProblem(
        sequences=2 * tokens + 1, tokens=tokens, HV=32, slots="row", null_slot=-1,
        cache="rows", cache_rows=4 * tokens + 3, disable_state_update=True, mixed_qkv=True,
        flat=True, mixed_lengths=True, padded_rows=(1,), seed=80 + tokens,
    )  # fmt: skip
    args, windows, held = sglang_verify_case(problem, seed=tokens)
    cache = args["intermediate_states_buffer"]
    pool, conv = args["initial_state"], args["conv_state"]
    pool_before, conv_before = pool.clone(), conv.clone()
    cache_before, held_before = cache.clone(), held.clone()
    channels = args["conv_weight"].shape[0]
    x = args["mixed_qkv"].reshape(-1, channels)
    convolved = torch.zeros(x.shape, dtype=torch.float64, device="cuda")
    slots, rows = args["initial_state_indices"].long(), args["intermediate_state_indices"].long()
    cu = args["cu_seqlens"].long()
    expected_rows = []
    for n in range(slots.shape[0]):
        lo, hi = int(cu[n]), int(cu[n + 1])
        if hi == lo or slots[n] < 0:
            continue
        sequence = x[None, lo:hi]
        convolved[lo:hi] = causal_conv1d_update(
            sequence, conv_before, args["conv_weight"], args["conv_bias"], slots=slots[n : n + 1]
        )[0][0]
        if rows[n] >= 0:
            windows_n = conv_windows(sequence, conv_before, 4, slots=slots[n : n + 1])[0]
            expected_rows.append((int(rows[n]), windows_n))
    post = dict(args, mixed_qkv=convolved.view(args["mixed_qkv"].shape))
    expected = expected_of(post, problem, pool_before, cache_before)
    total = x.shape[0]
    gen = torch.Generator(device="cuda").manual_seed(90 + tokens)
    z = torch.randn(total, 32, 128, generator=gen, device="cuda").bfloat16()
    norm_weight = (1 + 0.5 * torch.randn(128, generator=gen, device="cuda")).bfloat16()
    out = SglangGdn(core()).decode_core(
        args["mixed_qkv"], args["a"], args["b"], args["A_log"], args["dt_bias"], pool,
        args["initial_state_indices"], conv, args["conv_weight"], args["conv_bias"], z,
        norm_weight, 1e-6, query_start_loc=args["cu_seqlens"],
        intermediate_states_buffer=cache,
        intermediate_state_indices=args["intermediate_state_indices"],
        intermediate_conv_window=windows, disable_state_update=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    live = ~torch.isnan(expected.output.view(total, 32, 128)).any(-1).any(-1)
    live &= (expected.output.view(total, 32, 128) != 0).any(-1).any(-1)
    expected_out = gated_rmsnorm(expected.output.view(total, 32, 128), z, norm_weight, eps=1e-6)
    assert_close("core output", out[live], expected_out[live], torch.bfloat16)
    assert (out[~live] == 0).all(), "padded tokens must have zero output"
    filled = ~torch.isnan(expected.cache.float())
    assert_close("cached states", cache[filled], expected.cache[filled].double(), torch.bfloat16)
    assert torch.isnan(cache[~filled].float()).all(), "a cache entry not owned was written"
    assert_windows(held, held_before, restride(windows), expected_rows)
    assert torch.equal(pool, pool_before) and torch.equal(conv, conv_before)


def test_verify_cache_with_conv_windows_graph_replay():
    # A captured SGLang verify replayed after the cache rows and the inputs change.
    problem = PackedProblem(
        sequences=5, tokens=3, HV=32, slots="row", null_slot=-1, cache="rows", cache_rows=12,
        disable_state_update=True, mixed_qkv=True, flat=True, seed=95,
    )  # fmt: skip
    args, windows, held = sglang_verify_case(problem, seed=95)
    call = dict(args, intermediate_conv_windows=windows)
    core()(**call)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        core()(**call)
    held.fill_(float("nan"))
    rows = args["intermediate_state_indices"]
    rows.copy_(torch.tensor([11, -1, 0, 7, 3], dtype=rows.dtype, device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(96)
    args["mixed_qkv"].copy_(torch.randn(args["mixed_qkv"].shape, generator=gen, device="cuda"))
    held_before = held.clone()
    graph.replay()
    torch.cuda.synchronize()
    channels = args["conv_weight"].shape[0]
    x = args["mixed_qkv"].reshape(-1, channels)
    slots, cu = args["initial_state_indices"].long(), args["cu_seqlens"].long()
    expected_rows = [
        (int(rows[n]), conv_windows(x[None, int(cu[n]) : int(cu[n + 1])], args["conv_state"], 4,
                                    slots=slots[n : n + 1])[0])
        for n in range(5) if rows[n] >= 0
    ]  # fmt: skip
    assert_windows(held, held_before, restride(windows), expected_rows)
