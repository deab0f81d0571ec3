"""Two GPUs: calls whose tensors live on a GPU that is not the current one (the launch runs on the
tensors' device and that device's stream, eager and in a CUDA graph, and the current device is
left as it was; docs/design.md, "Architecture", Devices), and processes, one per GPU, starting
at once on one empty disk cache. Skipped with fewer than two GPUs."""

from pathlib import Path

import pytest
import torch

import generated.h200 as h200
from gdngen.bench import startup
from gdngen.problem import Problem
from tests.gpu.check_call import replay_and_check, run_and_check

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
)

SECOND = "cuda:1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def first_gpu_current():
    previous = torch.cuda.current_device()
    torch.cuda.set_device(0)
    yield
    torch.cuda.set_device(previous)


@pytest.mark.parametrize(
    "problem",
    [
        Problem(batch=5, HV=32, pool_size=9, padded_rows=(2,), seed=3),
        Problem(batch=3, tokens=4, HV=64, state_dtype="fp32", pool_size=3, cache_steps=4,
                disable_state_update=True, seed=4),
        Problem(batch=4, HV=32, layout="v_last", state_dtype="bf16", seed=5),
    ],
    ids=["pool_padded", "verify_fp32", "dense_v_last"],
)  # fmt: skip
def test_a_call_with_tensors_on_the_second_gpu_runs_there(first_gpu_current, problem):
    run_and_check(h200.gdn_decode, problem, device=SECOND)
    assert torch.cuda.current_device() == 0, "the call must leave the current device as it was"


def test_the_same_signature_on_both_gpus(first_gpu_current):
    """One call object, the same shapes on each GPU in turn: each signature keeps its own device."""
    problem = Problem(batch=6, HV=32, pool_size=8, seed=6)
    for device in ("cuda:0", SECOND, "cuda:0", SECOND):
        run_and_check(h200.gdn_decode, problem, device=device)
        run_and_check(h200.gdn_decode, problem, device=device, pass_output=False)


def test_a_graph_captured_on_the_second_gpu_replays_there(first_gpu_current):
    problem = Problem(batch=8, tokens=2, HV=64, pool_size=12, padded_rows=(1,), cache_steps=2)
    args = problem.make(SECOND)
    output = torch.empty(8, 2, 64, 128, dtype=torch.bfloat16, device=SECOND)
    h200.gdn_decode.prepare(**args, output=output)  # compile and load before the capture
    assert torch.cuda.current_device() == 0
    stream = torch.cuda.Stream(device=SECOND)
    with torch.cuda.stream(stream):
        h200.gdn_decode(**args, output=output)  # warm up on the capture stream
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        h200.gdn_decode(**args, output=output)
    assert torch.cuda.current_device() == 0
    replay_and_check(graph, problem, args, output, device=SECOND, seed=200)


def test_processes_one_per_gpu_share_an_empty_cache(tmp_path):
    """Two processes, one per GPU, start at once on one empty disk cache: each kernel is compiled
    once on the machine (the other process waits on the entry and loads it), every entry is
    whole, every result is right."""
    run = startup.run_processes(2, "h200", tmp_path, ROOT)
    kernels = len(startup.PROBLEMS)  # each problem needs its own kernel
    workers = run["workers"]
    assert sum(w["sources"].get("compiled", 0) for w in workers) == kernels, workers
    assert all(sum(w["sources"].values()) == kernels for w in workers), workers
    assert run["entries"] == {"count": kernels, "whole": kernels}
    assert max(w["error"] for w in workers) < 1e-2  # bf16 outputs against the float64 reference
