"""vLLM's fused MTP op through gdngen (``VllmGdn.fused_gdn_decode_post_conv_mtp``, one
gdn_decode call that the dispatch serves) on vLLM's inputs (tests/vllm_mtp.py): against the
float64 reference (the normed outputs, every written state, every other slot bit-identical,
rows of no sequence left as they were), and against vLLM's own Triton port of the op loaded from
the bundle of its wheel (``GDNGEN_VLLM_SRC``; tools/vllm_bundle.py makes it).

    GDNGEN_VLLM_SRC=/path/to/vllm-gdn.tar.xz python -m pytest -q tests/gpu/test_vllm_mtp_gpu.py
"""

import sys

import pytest
import torch

import generated.h200 as h200
import gdngen.measure.vllm_kernels as vllm_kernels_module
from gdngen.engines.vllm import VllmGdn
from gdngen.measure.vllm_kernels import vllm_kernels
from tests.compare import assert_close
from tests.vllm_mtp import MtpCase, check_mtp, expected_mtp, fresh, mtp_args

pytestmark = pytest.mark.gpu

GDN = VllmGdn(h200.gdn_decode)


def run_and_check(case: MtpCase, **options) -> dict:
    """One adapter call on ``case``'s inputs, checked against the float64 reference; returns the
    arguments as the call left them."""
    args = mtp_args(case)
    pool_before = args["state"].clone()
    expected = expected_mtp(args, case)
    returned = GDN.fused_gdn_decode_post_conv_mtp(**args, **options)
    torch.cuda.synchronize()
    assert returned is args["out"]
    check_mtp("gdngen", args, expected, pool_before)
    return args


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
@pytest.mark.parametrize("lengths", ["uniform", "mixed"])
def test_against_the_reference(state_dtype, tokens, lengths):
    """Every num_accepted_tokens value (rows take 1 .. 1 + S in turn), padded rows with slot 0
    and -1 (one of them empty when the lengths are mixed), a live row's null column, token
    padding past cu_seqlens[N]; both gate activations, both norm weight and dt_bias dtypes."""
    case = MtpCase(
        sequences=2 * tokens + 5, tokens=tokens, state_dtype=state_dtype,
        mixed_lengths=lengths == "mixed", activation="sigmoid" if tokens % 2 else "silu",
        norm_weight_dtype="fp32" if tokens > 2 else "bf16",
        dt_bias_dtype="bf16" if tokens in (2, 3) else "fp32", seed=10 * tokens,
    )  # fmt: skip
    run_and_check(case)


@pytest.mark.parametrize("batch", [1, 7, 64, 300])
@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_batches_cross_the_dispatch(batch, state_dtype):
    """B * HV from 64 to 19200 at T = 4 (the norm rules' ranges pick other kernels)."""
    case = MtpCase(
        sequences=batch, tokens=4, state_dtype=state_dtype,
        padded_rows=(0, batch - 1) if batch > 2 else (), seed=batch,
    )  # fmt: skip
    run_and_check(case)


@pytest.mark.parametrize("tokens", [2, 4])
def test_qwen3_next_heads(tokens):
    """HV = 32 (qwen3-next's geometry; vLLM calls the op for Qwen3.5, any HV / H of 1-8)."""
    run_and_check(MtpCase(sequences=9, tokens=tokens, HV=32, seed=70 + tokens))


def test_the_uniform_promise():
    """uniform_seqlen=True (every sequence of 1 + S tokens at n * (1 + S)), token padding after."""
    case = MtpCase(sequences=11, tokens=4, mixed_lengths=False, seed=80)
    run_and_check(case, uniform_seqlen=True)


def test_out_none_is_allocated_and_returned():
    case = MtpCase(sequences=5, tokens=3, seed=90)
    args = mtp_args(case)
    pool_before = args["state"].clone()
    expected = expected_mtp(args, case)
    returned = GDN.fused_gdn_decode_post_conv_mtp(**dict(args, out=None))
    torch.cuda.synchronize()
    assert returned.shape == args["out"].shape and returned.dtype == torch.bfloat16
    written = ~torch.isnan(expected.output)
    args["out"][written] = returned[written]  # rows of no sequence are uninitialised memory
    check_mtp("gdngen (out=None)", args, expected, pool_before)


def test_graph_replay_follows_new_index_contents():
    """Captured once, as vLLM captures its decode graphs; then the lengths, accepted counts and
    table rows change in place between replays. A host sync or a per-call allocation in the
    adapter would break the capture."""
    case = MtpCase(sequences=8, tokens=4, seed=21)
    args = mtp_args(case)
    GDN.fused_gdn_decode_post_conv_mtp(**fresh(args))  # loads the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        GDN.fused_gdn_decode_post_conv_mtp(**args)
    torch.cuda.current_stream().wait_stream(stream)
    cu = args["cu_seqlens"]
    for seed in (22, 23, 24):
        order = torch.randperm(case.sequences, generator=torch.Generator().manual_seed(seed))
        order = order.cuda()
        lengths = (cu[1:] - cu[:-1])[order]
        cu[1:] = lengths.cumsum(0).to(cu.dtype)
        accepted = args["num_accepted_tokens"]
        accepted.copy_(accepted[order].roll(1))
        args["state_indices"].copy_(args["state_indices"][order])
        args["out"].fill_(float("nan"))
        pool_before = args["state"].clone()
        expected = expected_mtp(args, case)
        graph.replay()
        torch.cuda.synchronize()
        check_mtp(f"replay {seed}", args, expected, pool_before)


def test_bad_input_writes_nothing():
    case = MtpCase(sequences=4, tokens=4, seed=40)
    args = mtp_args(case)
    pool_before, out_before = args["state"].clone(), args["out"].clone()
    wide = torch.ones(4, 12, dtype=torch.int32, device="cuda")
    for changes, message in [
        (dict(output_gate_activation="gelu"), "^output_gate_activation"),
        (dict(state_indices=wide), r"^state_indices\.shape\[1\]"),
        (dict(num_accepted_tokens=None), "^num_accepted_tokens"),
        (dict(out=args["out"][:-1]), "^out"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            GDN.fused_gdn_decode_post_conv_mtp(**dict(args, **changes))
    torch.cuda.synchronize()
    assert torch.equal(args["state"], pool_before)
    assert torch.equal(args["out"].isnan(), out_before.isnan())


# -- against vLLM's Triton port ------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_port():
    """The port from ``$GDNGEN_VLLM_SRC``; afterwards the loader's stand-in ``vllm`` modules
    leave this process again, so that a later test may load another source."""
    kernels = vllm_kernels()
    if isinstance(kernels, str):
        pytest.skip(f"vLLM's Triton port of the op is not at hand: {kernels}")
    yield kernels.mtp_decode
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    vllm_kernels_module._load.cache_clear()


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_against_vllms_triton_port(vllm_port, state_dtype, tokens):
    """The same inputs through vLLM's port and through gdngen. Each meets the float64 reference
    (the port's rounds the recurrence's output to bf16 before the norm, as the port does); the
    two write the same slots, zero the same rows, leave the same rows of no sequence, and their
    outputs and states agree within the stored dtypes' rounding."""
    case = MtpCase(
        sequences=2 * tokens + 7, tokens=tokens, state_dtype=state_dtype,
        activation="silu" if tokens % 2 else "sigmoid", seed=100 + tokens,
    )  # fmt: skip
    args = mtp_args(case)
    pool_before = args["state"].clone()
    theirs, ours = fresh(args), fresh(args)
    returned = vllm_port(**theirs)
    torch.cuda.synchronize()
    assert returned is theirs["out"]
    check_mtp("vLLM's port", theirs, expected_mtp(args, case, torch.bfloat16), pool_before)
    GDN.fused_gdn_decode_post_conv_mtp(**ours)
    torch.cuda.synchronize()
    check_mtp("gdngen", ours, expected_mtp(args, case), pool_before)

    assert torch.equal(ours["out"].isnan(), theirs["out"].isnan()), "rows of no sequence differ"
    assert torch.equal(ours["out"] == 0, theirs["out"] == 0), "zero (padded) outputs differ"
    live = ~ours["out"].isnan() & (ours["out"] != 0)
    assert_close("gdngen vs vLLM's port: output", ours["out"][live], theirs["out"][live].double(),
                 torch.bfloat16)  # fmt: skip
    written = (theirs["state"] != pool_before).flatten(1).any(1)
    assert torch.equal((ours["state"] != pool_before).flatten(1).any(1), written)
    assert_close(
        "gdngen vs vLLM's port: states", ours["state"][written],
        theirs["state"][written].double(), theirs["state"].dtype,
    )  # fmt: skip
