"""The dispatching call: batch sizes, padding patterns, CUDA graphs, streams, bad inputs, big sizes."""

import importlib

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import Problem
from gdngen.reference import reference_decode
from gdngen.runtime.store import compiled_count
from tests.compare import assert_close
from tests.gpu.check_call import replay_and_check, run_and_check

pytestmark = pytest.mark.gpu

SERVED = [("k_last", "bf16"), ("k_last", "fp16"), ("k_last", "fp32"), ("v_last", "bf16"),
          ("v_last", "fp16"), ("v_last", "fp32")]  # fmt: skip


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("batch", [1, 2, 5, 31, 64, 129])
def test_dispatch_t1(layout, state_dtype, batch):
    problem = Problem(batch=batch, HV=64, layout=layout, state_dtype=state_dtype, seed=batch)
    run_and_check(h200.gdn_decode, problem)


@pytest.mark.parametrize("layout,state_dtype", SERVED, ids=[f"{l}_{d}" for l, d in SERVED])
@pytest.mark.parametrize("tokens", [2, 3, 4, 5, 8])
def test_dispatch_multi_token(layout, state_dtype, tokens):
    problem = Problem(
        batch=3 + tokens, tokens=tokens, HV=32, layout=layout, state_dtype=state_dtype,
        pool_size=40, padded_rows=(1,), cache_steps=tokens + 1, disable_state_update=tokens % 2 == 0,
        index_dtype="int64" if tokens > 3 else "int32", seed=tokens,
    )  # fmt: skip
    run_and_check(h200.gdn_decode, problem)


@pytest.mark.parametrize("pattern", ["all_padded", "alternate", "last_only_live"])
def test_padding_patterns(pattern):
    batch = 12
    padded = {
        "all_padded": tuple(range(batch)),
        "alternate": tuple(range(0, batch, 2)),
        "last_only_live": tuple(range(batch - 1)),
    }[pattern]
    problem = Problem(batch=batch, HV=32, pool_size=30, padded_rows=padded, seed=len(padded))
    run_and_check(h200.gdn_decode, problem)


def test_output_allocated_when_not_given():
    run_and_check(h200.gdn_decode, Problem(batch=4, HV=32, seed=3), pass_output=False)


def test_no_recompile_for_new_batch_sizes():
    # Batch sizes inside the dispatch row that serves B=300 (read from the table, which the tune
    # rewrites): one variant, one compile key, so no new compile.
    HV = 64
    row = h200.select(
        layout="k_last", state_dtype="bf16", tokens=1, batch_heads=300 * HV, intermediate=False,
        head_dims=(128, 128),
    )  # fmt: skip
    lo, hi = row.batch_heads.lo, row.batch_heads.hi
    first, last = -(-lo // HV), (hi // HV if hi is not None else 1024)
    batches = sorted({first, first + 1, (first + last) // 2, last})
    assert len(batches) >= 3, f"row {row.batch_heads} holds too few batch sizes at HV={HV}"
    base = Problem(batch=batches[0], HV=HV, layout="k_last", state_dtype="bf16")
    run_and_check(h200.gdn_decode, base.with_(seed=1))
    before = compiled_count()
    for batch in batches[1:]:
        run_and_check(h200.gdn_decode, base.with_(batch=batch, seed=batch))
    assert compiled_count() == before


def test_side_stream():
    problem = Problem(batch=6, HV=32, pool_size=8, seed=5)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run_and_check(h200.gdn_decode, problem)


def test_cuda_graph_capture_and_replay():
    problem = Problem(
        batch=8, tokens=2, HV=64, pool_size=20, padded_rows=(3,), cache_steps=2, seed=21
    )
    args = problem.make("cuda")
    output = torch.empty(8, 2, 64, 128, dtype=torch.bfloat16, device="cuda")
    h200.gdn_decode.prepare(**args)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        h200.gdn_decode(**args, output=output)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        h200.gdn_decode(**args, output=output)
    replay_and_check(graph, problem, args, output, seed=100)


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_large_multi_token_with_cache(state_dtype):
    """B=512, T=8, HV=64 with caching: the cache holds more than 2^31 elements' offsets."""
    batch, tokens = 512, 8
    problem = Problem(
        batch=batch, tokens=tokens, HV=64, state_dtype=state_dtype, pool_size=batch + 8,
        cache_steps=tokens, padded_rows=(5,), seed=7,
    )  # fmt: skip
    args = problem.make("cuda")
    pool = args["initial_state"]
    cache = args["intermediate_states_buffer"]
    assert cache.numel() > 2**31
    before = pool.clone()
    out, _ = h200.gdn_decode(**args)
    torch.cuda.synchronize()
    rows = torch.tensor([0, 1, 5, 255, 256, 510, 511], device="cuda")  # includes the far end
    sub = {name: args[name][rows] for name in ("q", "k", "v", "a", "b")}
    ref = reference_decode(
        sub["q"], sub["k"], sub["v"], before, args["A_log"], sub["a"], args["dt_bias"], sub["b"],
        read_slots=args["initial_state_indices"][rows],
    )  # fmt: skip
    live = ref.live
    dtype = torch.bfloat16 if state_dtype == "bf16" else torch.float32
    assert_close("output", out[rows][live], ref.output[live], torch.bfloat16)
    got_cache = cache[rows][live]
    assert_close("cache", got_cache, ref.intermediates[live], dtype)
    written = args["initial_state_indices"][rows].long()[live]
    assert_close("state", pool[written], ref.final_state[live], dtype)


def _unchanged(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN included."""
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize(
    "bad,error",
    [
        (dict(initial_state_indices="float"), TypeError),
        (dict(intermediate_states_buffer="transposed"), ValueError),
        (dict(intermediate_states_buffer="short"), ValueError),
        (dict(output="fp32"), TypeError),
        (dict(A_log="bf16"), TypeError),
        (dict(check_indices="out_of_range"), ValueError),
    ],
    ids=[
        "float_indices",
        "non_contiguous_cache",
        "cache_steps_lt_T",
        "output_dtype",
        "A_log_dtype",
        "index_past_pool",
    ],
)
@pytest.mark.parametrize("after_a_good_call", [False, True], ids=["cold", "signature_known"])
def test_bad_inputs_leave_state_untouched(bad, error, after_a_good_call):
    problem = Problem(batch=4, tokens=2, HV=32, pool_size=8, cache_steps=2, seed=13)
    args = problem.make("cuda")
    pool = args["initial_state"]
    cache = args["intermediate_states_buffer"]
    if after_a_good_call:  # the call path has planned this signature: the bad one differs from it
        h200.gdn_decode(**args)
        torch.cuda.synchronize()
    before, cache_before = pool.clone(), cache.clone()
    kind = next(iter(bad.values()))
    if kind == "float":
        args["initial_state_indices"] = args["initial_state_indices"].float()
    elif kind == "transposed":
        args["intermediate_states_buffer"] = cache.transpose(-1, -2)
    elif kind == "short":
        args["intermediate_states_buffer"] = cache[:, :1]
    elif kind == "fp32":
        args["output"] = torch.empty(4, 2, 32, 128, dtype=torch.float32, device="cuda")
    elif kind == "bf16":
        args["A_log"] = args["A_log"].bfloat16()
    elif kind == "out_of_range":
        args["initial_state_indices"][2] = 8
        args["check_indices"] = True
    with pytest.raises(error):
        h200.gdn_decode(**args)
    torch.cuda.synchronize()
    assert _unchanged(pool, before) and _unchanged(cache, cache_before)


def test_slot_past_the_pool_without_checks_touches_nothing():
    """With check_indices off, a slot >= pool size is never dereferenced: its rows get NaN."""
    problem = Problem(batch=4, HV=32, pool_size=6, seed=17)
    args = problem.make("cuda")
    args["initial_state_indices"][1] = 6
    pool = args["initial_state"]
    before = pool.clone()
    out, _ = h200.gdn_decode(**args)
    torch.cuda.synchronize()
    assert torch.isnan(out[1].float()).all()
    assert not torch.isnan(out[[0, 2, 3]].float()).any()
    untouched = torch.ones(6, dtype=torch.bool, device="cuda")
    untouched[args["initial_state_indices"][[0, 2, 3]].long()] = False
    assert _unchanged(pool[untouched], before[untouched])


@pytest.mark.parametrize("other", ["b200", "b300", "rtx_blackwell", "dgx_spark"])
def test_a_target_for_another_sm_names_the_import_for_this_gpu(other):
    """This GPU is sm_90a: another SM's target refuses the call before compiling or writing
    anything, and names the import that serves it."""
    target = importlib.import_module(f"generated.{other}")
    args = Problem(batch=2, HV=32, pool_size=4).make("cuda")
    pool = args["initial_state"].clone()
    before = compiled_count()
    with pytest.raises(ValueError, match=rf"q: target {other} is built for {target.INFO.sm} .*an sm_90a GPU\. Use `from generated\.h200 import gdn_decode`\."):  # fmt: skip
        target.gdn_decode(**args)
    assert compiled_count() == before
    assert args["initial_state"].equal(pool)


@pytest.mark.parametrize(
    "layout,state_dtype", [("k_last", "bf16"), ("v_last", "fp32"), ("k_last", "fp16")]
)
def test_the_dispatch_follows_this_gpus_model(layout, state_dtype):
    """An H100 gets the table measured on an H100, an H200 the default one (measured on an H200),
    another sm_90a part the default one; the call, `select` and `table_for` agree."""
    from gdngen.dispatch import CallShape, select

    name = torch.cuda.get_device_name()
    own = next(
        (t for model, t in h200.dispatch.TABLES.items() if model.lower() in name.lower()),
        h200.dispatch.TABLE,
    )
    for batch in (1, 64, 512):
        problem = Problem(
            batch=batch, HV=64, layout=layout, state_dtype=state_dtype, pool_size=batch
        )
        chosen = h200.gdn_decode.prepare(**problem.make("cuda"))
        shape = CallShape(layout, state_dtype, 1, batch * 64, False, (128, 128))
        assert chosen == select(own, shape).use
        assert chosen == h200.select(layout=layout, state_dtype=state_dtype, tokens=1,
                                     batch_heads=batch * 64, intermediate=False,
                                     head_dims=(128, 128)).use  # fmt: skip


@pytest.mark.parametrize("pair", h200.INFO.served, ids="/".join)
@pytest.mark.parametrize(
    "geometry",
    [g for g in h200.INFO.geometries if (g.K, g.V) != (128, 128)],
    ids=lambda g: g.name,
)
def test_one_call_serves_head_dims_64_and_256(geometry, pair):
    """The same gdn_decode serves every head dims of the target, in every layout and state dtype:
    the dispatch picks a kernel built for the call's K and V (plain decode on a padded pool,
    multi-token update, verify with a positional cache)."""
    layout, state_dtype = pair
    shape = dict(H=geometry.H, HV=geometry.HV, K=geometry.K, V=geometry.V, layout=layout,
                 state_dtype=state_dtype)  # fmt: skip
    seed = sum(map(ord, geometry.name + layout + state_dtype))
    for problem in (
        Problem(batch=9, pool_size=16, padded_rows=(3,), seed=seed, **shape),
        Problem(batch=4, tokens=3, pool_size=6, seed=seed + 1, **shape),
        Problem(batch=3, tokens=4, pool_size=8, cache_steps=4, disable_state_update=True,
                padded_rows=(1,), seed=seed + 2, **shape),
    ):  # fmt: skip
        chosen = h200.gdn_decode.prepare(**problem.make("cuda"))
        assert f"_{state_dtype}_" in chosen and chosen.startswith(layout[0] + "l_")
        assert h200.variant(chosen).module(chosen).HEAD_K_DIM == geometry.K
        run_and_check(h200.gdn_decode, problem)


@pytest.mark.parametrize("geometry", h200.INFO.geometries, ids=lambda g: g.name)
def test_each_tensor_parallel_shard_matches_the_reference(geometry):
    """Every geometry the target serves (each model at TP 1, 2, 4, 8), through the dispatch:
    plain decode on a padded pool, and verify with a positional cache."""
    shape = dict(H=geometry.H, HV=geometry.HV, K=geometry.K, V=geometry.V)
    seed = sum(map(ord, geometry.name))
    run_and_check(h200.gdn_decode, Problem(batch=5, pool_size=12, padded_rows=(2,), seed=seed,
                                           **shape))  # fmt: skip
    run_and_check(
        h200.gdn_decode,
        Problem(batch=3, tokens=4, layout="v_last", state_dtype="fp32", pool_size=8,
                cache_steps=4, disable_state_update=True, seed=seed + 1, **shape),
    )  # fmt: skip
