"""The lean call path and the kernel store on a GPU: signatures planned once, changes noticed,
concurrent first calls, capture after warm-up, and a first call served from artifacts."""

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import generated.h200 as h200
from gdngen.problem import Problem
from gdngen.runtime import store
from gdngen.runtime.kernel_dir import KernelDir, fingerprint
from gdngen.runtime.kernel_table import kernel_content_sha256, load_kernel
from tests.gpu.check_call import run_and_check

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def test_a_known_signature_is_planned_once_and_any_change_is_noticed():
    call = h200.variant("kl_bf16_tv16_ilp4_vec8_tpg16_sm90")  # a fresh call: nothing planned
    problem = Problem(batch=5, HV=32, pool_size=9, seed=21)
    run_and_check(call, problem)
    assert call.signatures() == 1
    run_and_check(call, problem.with_(seed=22))  # new tensors, same signature
    assert call.signatures() == 1
    run_and_check(call, problem.with_(batch=6, seed=23))  # a new batch size: a new signature
    assert call.signatures() == 2
    args = problem.make("cuda")
    call(**args)
    torch.cuda.synchronize()
    # The same call with k's rows strided differently: a new signature, checked in full.
    wide = torch.empty(5, 1, 16, 256, dtype=torch.bfloat16, device="cuda")
    wide[..., :128] = args["k"]
    pool = args["initial_state"]
    before = pool.clone()
    with pytest.raises(ValueError, match=r"k: its last 2 dim\(s\) \[H, K\] must be contiguous"):
        call(**{**args, "k": wide[..., ::2]})
    # A wrong dtype after a planned signature: rejected, nothing written.
    with pytest.raises(TypeError, match="b: expected dtype"):
        call(**{**args, "b": args["b"].float()})
    # A q whose base is not 16-byte aligned (same shape, strides and dtype as the planned one)
    flat = torch.empty(args["q"].numel() + 8, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1 : 1 + args["q"].numel()].view(args["q"].shape)
    shifted.copy_(args["q"])
    with pytest.raises(ValueError, match="q: data pointer must be 16-byte aligned"):
        call(**{**args, "q": shifted})
    torch.cuda.synchronize()
    assert torch.equal(pool, before)
    assert call.signatures() == 3  # (the call without output above is one); refused: none


def test_concurrent_first_calls_compile_once_and_are_correct():
    name = "kl_bf16_tv32_ilp4_vec8_tpg16_sm90"
    call = h200.variant(name)
    problems = [
        Problem(batch=3 + i % 2, tokens=3, HV=32, pool_size=8, seed=40 + i) for i in range(8)
    ]

    def compiled():  # this process's kernels of the variant for these problems (T = 3, HV = 32)
        return [
            key for qualname, key in store._kernels
            if key.variant == name and key.tokens == 3 and key.HV == 32
        ]  # fmt: skip

    assert compiled() == []
    errors = []
    barrier = threading.Barrier(len(problems))

    def run(problem):
        try:
            barrier.wait()
            run_and_check(call, problem)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in problems]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(compiled()) == 1 and call.signatures() == 2


def test_capture_right_after_warmup():
    summary = h200.warmup(geometry="qwen3-next", max_tokens=2, modes=("update",), progress=False)
    assert summary.kernels and all(k[1] <= 2 for k in summary.kernels)
    problem = Problem(batch=7, tokens=2, HV=32, pool_size=7, seed=5)
    args = problem.make("cuda")
    pool_before = args["initial_state"].clone()
    output = torch.empty(7, 2, 32, 128, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph):  # the first call of this signature, inside the capture
            h200.gdn_decode(**args, output=output)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert torch.equal(args["initial_state"], pool_before)  # captured, not run
    graph.replay()
    torch.cuda.synchronize()
    eager = problem.make("cuda")
    expected, _ = h200.gdn_decode(**eager)
    torch.cuda.synchronize()
    assert torch.equal(output, expected) and torch.equal(
        args["initial_state"], eager["initial_state"]
    )


def test_first_call_in_a_fresh_process_comes_from_the_artifacts(tmp_path):
    name = "kl_bf16_tv16_ilp2_vec8_tpg16_sm90"
    module = f"generated.h200.kernels.{name}"
    from gdngen.runtime.compile import compile_kernel

    # The key the call below compiles (its forms and the PDL default of this GPU), from a call of
    # the same signature in this process.
    h200.variant(name)(**Problem(batch=3, HV=32, pool_size=5, seed=1).make("cuda"))
    plain = dict(tokens=1, HV=32, io_dtype="bf16", index_dtype="int32", cache=False,
                 separate_write_slots=False, cu_seqlens_dtype=None, norm_activation=None,
                 conv_width=None)  # fmt: skip
    (key,) = {
        key for qualname, key in store._kernels
        if qualname == module and all(getattr(key, f) == value for f, value in plain.items())
    }  # fmt: skip
    folder = KernelDir(tmp_path, writable=True)
    folder.save(
        fingerprint(key, kernel_content_sha256(module)),
        compile_kernel(load_kernel(module), key),
    )
    code = f"""
        import json, sys, time
        import torch
        import generated.h200 as h200
        from gdngen.problem import Problem
        from gdngen.reference import reference_decode
        from gdngen.runtime import store
        problem = Problem(batch=3, HV=32, pool_size=5, seed=9)
        args = problem.make("cuda")
        before = args["initial_state"].clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out, pool = h200.variant("{name}")(**args)
        torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0)
        ref = reference_decode(args["q"], args["k"], args["v"], before, args["A_log"], args["a"],
                               args["dt_bias"], args["b"], read_slots=args["initial_state_indices"])
        error = float((out.double() - ref.output).norm() / ref.output.norm())
        print(json.dumps({{"sources": store.sources(), "cutlass": "cutlass" in sys.modules,
                          "error": error, "ms": ms}}))
    """
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "GDNGEN_ARTIFACTS": str(tmp_path), "GDNGEN_DISK_CACHE": "0"},
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["sources"] == {"artifact": 1} and not found["cutlass"]
    assert found["error"] < 1e-2  # bf16 output against the float64 reference
