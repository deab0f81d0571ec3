"""Programmatic dependent launch (docs/design.md, "Programmatic dependent launch"): a PDL call
reads nothing its producer writes before the producer is done, writes nothing before it, and
lets its consumer read only what it finished; a gdngen call right after another on the same pool
waits for it in full.

The producer (gdngen.bench.pdl_kernels) releases its dependents at its start and writes a new
input pattern only after a long spin, so a call that read an input before its wait would read
the last replay's. Every replay's output is kept by a PDL consumer, and every output and the
pools after 1,000 replays of a captured graph must equal, bit for bit, the same calls run
eagerly without PDL (the same arithmetic: the PDL kernel only moves loads). One test shows the
overlap itself: a producer that breaks the contract by writing the state pool, late, is not seen
by a PDL call (its state loads come first), and is seen without PDL.

    python -m pytest -q tests/gpu/test_pdl_gpu.py
"""

import pytest
import torch

import generated.h200 as h200
from gdngen.bench.pdl_kernels import pattern, produce
from gdngen.bench.pdl_layer import Layer, decode, make_layer, run_layer
from gdngen.runtime.pdl import STREAM_WRITES

pytestmark = pytest.mark.gpu

REPLAYS = 1000
#: the producer's spin before it writes: long against a call's loads before its wait
SPIN = 2000


def layer_of(batch: int, state_dtype: str, core: bool, seed: int, call=None) -> Layer:
    return make_layer(
        call or h200.gdn_decode, batch, state_dtype, core, seed=seed, history_rows=REPLAYS + 2
    )


def step_once(layer: Layer, *, calls: int) -> None:
    """One layer step as an engine runs it: the step counter moves on (a plain kernel), then the
    PDL chain: the producer writes the step's inputs, ``calls`` decode calls on the same pool,
    the consumer keeps the output in the step's row."""
    layer.step[:1].add_(1)
    run_layer(layer, pdl=True, calls=calls, spin=SPIN)


def eager_reference(layer: Layer, pool0, conv0, steps: int, calls: int) -> tuple:
    """The same steps without PDL or graphs, from the same pools: (history, pool, conv pool)."""
    pool = pool0.clone()
    over = dict(initial_state=pool)
    conv = None
    if conv0 is not None:
        conv = conv0.clone()
        over["conv_state"] = conv.transpose(1, 2)
    history = torch.zeros_like(layer.history)
    for s in range(1, steps + 1):
        layer.buffer.copy_(pattern(layer.buffer.numel(), s, layer.buffer.dtype, "cuda"))
        for _ in range(calls):
            decode(layer, pdl=False, **over)
        history[s] = layer.output.view(-1)
    torch.cuda.synchronize()
    return history, pool, conv


def replay_and_compare(layer: Layer, *, calls: int) -> None:
    pool0 = layer.pool.clone()
    conv0 = None if layer.conv_pool is None else layer.conv_pool.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step_once(layer, calls=calls)  # plans and compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    layer.pool.copy_(pool0)
    if conv0 is not None:
        layer.conv_pool.copy_(conv0)
    layer.step.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step_once(layer, calls=calls)
    for _ in range(REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    assert int(layer.step[0]) == REPLAYS
    history, pool, conv = eager_reference(layer, pool0, conv0, REPLAYS, calls)
    got = layer.history[1 : REPLAYS + 1].view(torch.int16)
    want = history[1 : REPLAYS + 1].view(torch.int16)
    differs = (got != want).any(dim=1)
    assert not differs.any(), f"replays {(differs.nonzero()[:8, 0] + 1).tolist()} differ"
    assert torch.equal(layer.pool, pool), "the state pool differs from the eager run's"
    if conv is not None:
        assert torch.equal(layer.conv_pool, conv), "the conv pool differs from the eager run's"


@pytest.mark.parametrize("core", [False, True], ids=["plain", "core"])
@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("batch", [1, 5])
def test_a_captured_pdl_chain_reads_every_replays_inputs(batch, state_dtype, core):
    replay_and_compare(layer_of(batch, state_dtype, core, seed=batch), calls=1)


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_the_split_plan_under_pdl(state_dtype):
    """The conv step is the call's first kernel, the decode kernel overlaps it."""
    layer = layer_of(5, state_dtype, True, seed=11, call=h200.split_conv_call())
    replay_and_compare(layer, calls=1)


@pytest.mark.parametrize("core", [False, True], ids=["plain", "core"])
def test_two_calls_on_one_pool_back_to_back_wait_for_each_other(core):
    """The second call's state loads would come before the first call's stores without the
    record of gdngen.runtime.pdl: it is launched without the attribute."""
    replay_and_compare(layer_of(3, "bf16", core, seed=12), calls=2)


def test_eager_pdl_calls_on_one_pool_match_the_calls_without_pdl():
    layer = layer_of(4, "bf16", False, seed=13)
    pool0 = layer.pool.clone()
    layer.buffer.copy_(pattern(layer.buffer.numel(), 7, torch.bfloat16, "cuda"))
    outputs = []
    for _ in range(200):
        decode(layer, pdl=True)
        outputs.append(layer.output.clone())
    pdl_pool = layer.pool.clone()
    layer.pool.copy_(pool0)
    for i in range(200):
        decode(layer, pdl=False)
        assert torch.equal(layer.output, outputs[i]), f"call {i}"
    assert torch.equal(layer.pool, pdl_pool)


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_a_pdl_call_loads_the_state_before_its_producer_is_done(state_dtype):
    """The attribute reaches the launch (TVM-FFI path): a producer that writes the state pool
    late (against the contract) is overlapped by a PDL call, which computes from the pool as it
    was; without PDL, the call sees the producer's pool. One row on a kernel of 128 CTAs of 128
    or 256 threads: all in the first wave, and resident beside the producer's CTAs, so every CTA
    loads its state before its wait."""
    two_ctas_a_head = {"bf16": "kl_bf16_tv64_ilp8_vec8_tpg16_sm90",
                       "fp32": "kl_fp32_tv64_ilp8_vec4_tpg32_sm90"}  # fmt: skip
    call = h200.variant(two_ctas_a_head[state_dtype])
    layer = layer_of(1, state_dtype, False, seed=14, call=call)
    layer.buffer.copy_(pattern(layer.buffer.numel(), 3, torch.bfloat16, "cuda"))
    old = layer.pool.clone()
    step = torch.tensor([5, 0], dtype=torch.int32, device="cuda")
    new = pattern(old.numel(), 5, old.dtype, "cuda").view_as(old)  # what the producer writes

    def from_pool(pool):
        layer.pool.copy_(pool)
        decode(layer, pdl=False)
        return layer.output.clone()

    from_old, from_new = from_pool(old), from_pool(new)
    assert not torch.equal(from_old, from_new)
    decode(layer, pdl=True)  # plans (and compiles) the PDL call: the producer must not wait on it
    torch.cuda.synchronize()
    for pdl, want in ((True, from_old), (False, from_new)):
        layer.pool.copy_(old)
        STREAM_WRITES.forget()  # the calls above wrote this pool: their record would hold PDL off
        produce(layer.pool.view(-1), step, spin=200_000, pdl=True)
        decode(layer, pdl=pdl)
        torch.cuda.synchronize()
        assert torch.equal(layer.output, want), f"enable_pdl={pdl}"
