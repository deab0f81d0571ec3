"""The gated RMSNorm epilogue (features.gated_rmsnorm) on a GPU, against the float64 reference:
the recurrence's reference output, normed and gated by gdngen.reference.gated_rmsnorm."""

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import TORCH_DTYPES, Problem, state_of
from gdngen.reference import gated_rmsnorm, reference_decode
from gdngen.terms import SCALED_STATE_DTYPES
from tests.compare import assert_close
from tests.gpu.check_call import as_k_last
from tests.gpu.check_quantized import check_quantized_call

pytestmark = pytest.mark.gpu

SERVED = [("k_last", "bf16"), ("k_last", "fp16"), ("k_last", "fp32"), ("v_last", "bf16"),
          ("v_last", "fp16"), ("v_last", "fp32")]  # fmt: skip


def norm_inputs(problem: Problem, *, weight_dtype=torch.bfloat16, z_view=False):
    """z [B, T, HV, V] (or a column view of a wider projection row) and norm_weight [V]."""
    gen = torch.Generator(device="cuda").manual_seed(problem.seed + 1000)
    B, T, HV, V = problem.batch, problem.tokens, problem.HV, problem.V
    io = TORCH_DTYPES[problem.io_dtype]
    if z_view:  # the gate as engines slice it from a projection row [.., 64 | HV*V | 64]
        rows = torch.randn(B, T, HV * V + 128, generator=gen, device="cuda").to(io)
        z = rows[..., 64 : 64 + HV * V].unflatten(-1, (HV, V))
    else:
        z = torch.randn(B, T, HV, V, generator=gen, device="cuda").to(io)
    weight = (1 + 0.5 * torch.randn(V, generator=gen, device="cuda")).to(weight_dtype)
    return z, weight


def run_norm_and_check(
    call, problem: Problem, *, activation="silu", eps=1e-6, norm_split=False, **norm_options
):
    """``norm_split``: the call runs the norm as a step of its own (gdngen.runtime.norm_step),
    which normalises the recurrence's output as stored, rounded once to the output's dtype (as
    an engine's norm kernel does): the reference rounds it too."""
    args = problem.make("cuda")
    z, weight = norm_inputs(problem, **norm_options)
    if problem.state_dtype in SCALED_STATE_DTYPES:  # its own checks: tests/gpu/check_quantized.py
        read_slots = args.get("initial_state_indices")
        norm = (z, weight, eps, activation)
        check_quantized_call(
            args, read_slots=read_slots, call=call, norm=norm, norm_split=norm_split
        )
        return
    pool = state_of(args)
    pool_before = pool.clone()
    io = TORCH_DTYPES[problem.io_dtype]
    B, T, HV, V = problem.batch, problem.tokens, problem.HV, problem.V
    output = torch.full((B, T, HV, V), float("nan"), dtype=io, device="cuda")
    z_before = z.clone()

    out, _ = call(
        **args, output=output, z=z, norm_weight=weight, norm_eps=eps, norm_activation=activation
    )
    torch.cuda.synchronize()

    ref = reference_decode(
        args["q"], args["k"], args["v"], pool_before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], scale=problem.scale, use_qk_l2norm=problem.use_qk_l2norm,
        read_slots=args.get("initial_state_indices"),
        disable_state_update=problem.disable_state_update, state_layout=problem.layout,
    )  # fmt: skip
    live = ref.live
    o = ref.output.to(io).to(ref.output.dtype) if norm_split else ref.output
    normed = gated_rmsnorm(o, z, weight, eps=eps, activation=activation)
    assert_close("normed output", out[live], normed[live], io)
    if (~live).any():
        assert (out[~live] == 0).all(), "padded rows must have zero output"
    assert torch.equal(z, z_before), "z is an input"

    state_dtype = TORCH_DTYPES[problem.state_dtype]
    touched = torch.zeros(pool.shape[0], dtype=torch.bool, device="cuda")
    if not problem.disable_state_update:
        slots = (
            torch.arange(B, device="cuda")
            if args["state"] is not None
            else args["initial_state_indices"].long()
        )
        touched[slots[live]] = True
        got = as_k_last(pool[slots[live]], problem.layout)
        assert_close("final state", got, ref.final_state[live], state_dtype)
    assert torch.equal(
        pool[~touched], pool_before[~touched]
    ), "a slot the call does not own changed"
    cache = args.get("intermediate_states_buffer")
    if cache is not None:
        got = as_k_last(cache[live, :T], problem.layout)
        assert_close("intermediate states", got, ref.intermediates[live], state_dtype)
    return out


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_dispatched_norm(layout, state_dtype, tokens):
    verify = tokens > 1 and tokens % 4 != 0
    problem = Problem(
        batch=5 + tokens, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=24, padded_rows=(1, 4), cache_steps=tokens if verify else None,
        disable_state_update=verify, seed=tokens,
    )  # fmt: skip
    run_norm_and_check(h200.gdn_decode, problem, activation="silu" if tokens % 2 else "sigmoid")


@pytest.mark.parametrize("batch", [1, 3, 33, 64, 300])
def test_batch_sizes_cross_rules(batch):
    # B*HV from 64 to 19200: every K-last bf16 norm rule's range (the large ones pick other tiles).
    problem = Problem(batch=batch, HV=64, pool_size=batch + 3, seed=batch)
    run_norm_and_check(h200.gdn_decode, problem, weight_dtype=torch.float32)


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_other_head_dims(layout, state_dtype, head_dim):
    problem = Problem(
        batch=3, tokens=2, HV=32, K=head_dim, V=head_dim, layout=layout, state_dtype=state_dtype,
        pool_size=6, padded_rows=(0,), seed=head_dim,
    )  # fmt: skip
    run_norm_and_check(h200.gdn_decode, problem)


def _norm_variants(split_norm: bool = False):
    """The variants the norm rules name: those that fuse the norm, or (``split_norm``) the bare
    variants of steps-plan rules, which have no epilogue of their own."""
    names = {
        rule.use for table in (h200.dispatch.TABLE, *h200.dispatch.TABLES.values()) for rule in table
        if rule.gated_norm and rule.split_norm == split_norm
    }  # fmt: skip
    return sorted(names)


@pytest.mark.parametrize("name", _norm_variants())
def test_every_norm_rule_variant(name):
    module = h200.variant(name).module(name)
    K = module.HEAD_K_DIM
    problem = Problem(
        batch=4, tokens=3, HV=32, K=K, V=K, layout=module.LAYOUT, state_dtype=module.STATE_DTYPE,
        pool_size=9, padded_rows=(2,), seed=7,
    )  # fmt: skip
    run_norm_and_check(h200.variant(name), problem)


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens,batch", [(1, 3), (1, 300), (4, 9)])
def test_the_norm_split_plan(layout, state_dtype, tokens, batch):
    # The bare recurrence's variant (a head over up to 16 CTAs at large batch), then the step.
    problem = Problem(
        batch=batch, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=batch + 5, padded_rows=(1,), seed=batch + tokens,
    )  # fmt: skip
    call = h200.split_steps_call()
    args = problem.make("cuda")
    z, weight = norm_inputs(problem)
    named = call.prepare(**args, z=z, norm_weight=weight)
    assert named.endswith(" + norm_step_sm90"), named
    run_norm_and_check(
        call, problem, norm_split=True, activation="sigmoid" if tokens > 1 else "silu"
    )


@pytest.mark.parametrize("name", _norm_variants(split_norm=True))
def test_every_norm_split_rule_variant(name):
    # a steps-plan rule's bare variant, then the norm step: the plan its rule runs
    module = h200.variant(name).module(name)
    problem = Problem(
        batch=4, tokens=3, HV=32, layout=module.LAYOUT, state_dtype=module.STATE_DTYPE,
        pool_size=9, padded_rows=(2,), seed=8,
    )  # fmt: skip
    run_norm_and_check(h200.variant(name, split_norm=True), problem, norm_split=True)


@pytest.mark.parametrize(
    "name", ["kl_fp32_tv8_ilp8_vec4_tpg32_sm90", "kl_bf16_tv128_ilp8_vec8_tpg16_sm90"]
)
def test_the_norm_split_plan_of_one_variant(name):
    # a head over 16 CTAs (no epilogue of its own), and one CTA a head; HV 48: 6 CTAs of the
    # step a row
    module = h200.variant(name).module(name)
    problem = Problem(
        batch=5, tokens=2, HV=48, layout=module.LAYOUT, state_dtype=module.STATE_DTYPE,
        pool_size=9, padded_rows=(0, 3), seed=17,
    )  # fmt: skip
    run_norm_and_check(h200.variant(name, split_norm=True), problem, norm_split=True)


@pytest.mark.parametrize("head_dim", [64, 256])
def test_the_norm_split_plan_at_other_head_dims(head_dim):
    # the spec's geometries at these head dims (HV 32). V = 64: 8 lanes a head, 16 heads a CTA;
    # V = 256: 32 lanes, 4 heads
    problem = Problem(
        batch=3, tokens=1, HV=32, K=head_dim, V=head_dim, pool_size=6, padded_rows=(2,),
        seed=head_dim,
    )  # fmt: skip
    run_norm_and_check(
        h200.split_steps_call(), problem, norm_split=True, weight_dtype=torch.float32
    )


def test_z_as_a_strided_view_of_the_projection():
    problem = Problem(batch=6, tokens=2, HV=32, pool_size=8, seed=11)
    run_norm_and_check(h200.gdn_decode, problem, z_view=True)


def test_large_eps_and_zero_state_rows():
    # eps comparable to mean(o^2) changes the scale: checks eps is added inside the root.
    problem = Problem(batch=4, HV=32, pool_size=6, padded_rows=(3,), seed=5)
    run_norm_and_check(h200.gdn_decode, problem, eps=0.5)


def test_graph_replay_with_new_inputs():
    problem = Problem(batch=8, tokens=1, HV=32, pool_size=12, seed=21)
    args = problem.make("cuda")
    z, weight = norm_inputs(problem)
    out = torch.empty(8, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    call = dict(args, output=out, z=z, norm_weight=weight)
    h200.gdn_decode.prepare(**{k: v for k, v in call.items()})
    pool = state_of(args)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        h200.gdn_decode(**call)  # warm, outside the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    fresh = problem.with_(seed=22).make("cuda")
    z2, _ = norm_inputs(problem.with_(seed=22))
    with torch.cuda.graph(graph):
        h200.gdn_decode(**call)
    # New contents in the captured tensors: the replay must read them.
    for name in ("q", "k", "v", "a", "b"):
        args[name].copy_(fresh[name])
    z.copy_(z2)
    pool_before = pool.clone()
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_decode(
        args["q"], args["k"], args["v"], pool_before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], read_slots=args["initial_state_indices"],
    )  # fmt: skip
    normed = gated_rmsnorm(ref.output, z, weight, eps=1e-6)
    assert_close("replayed normed output", out, normed, torch.bfloat16)
