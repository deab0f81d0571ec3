"""Cold start and eager host cost of generated.h200 (issue: zero cold start, lean call path).

    python docs/perf/raw/h100-coldstart/coldstart.py first-call MODE   # one fresh process per MODE
    python docs/perf/raw/h100-coldstart/coldstart.py warmup            # the 80-shape engine warm-up
    python docs/perf/raw/h100-coldstart/coldstart.py eager             # host us per eager call
    python docs/perf/raw/h100-coldstart/coldstart.py graphs            # JIT vs loaded, CUDA graphs

MODE: jit (no disk cache, no artifacts), cache (disk cache filled by an earlier run), aot
($GDNGEN_ARTIFACTS). Each prints one JSON line.
"""

import json
import statistics
import sys
import time

T_START = time.perf_counter()
import torch  # noqa: E402

T_TORCH = time.perf_counter()


def problem_args(batch, tokens, seed=0, verify=False):
    from gdngen.problem import Problem

    return Problem(
        batch=batch, tokens=tokens, HV=64, pool_size=batch, layout="k_last", state_dtype="bf16",
        cache_steps=tokens if verify else None, disable_state_update=verify, seed=seed,
    ).make("cuda")


def first_call(mode):
    args = problem_args(1, 1)
    torch.cuda.synchronize()
    t00 = time.perf_counter()
    import tvm_ffi  # noqa: F401  (the target imports it too: timed apart here)

    t0 = time.perf_counter()
    import generated.h200 as h200

    t1 = time.perf_counter()
    out, _ = h200.gdn_decode(**args)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    from gdngen.runtime import store

    print(json.dumps({
        "what": "first_call", "mode": mode, "import_torch_s": T_TORCH - T_START,
        "import_tvm_ffi_ms": 1e3 * (t0 - t00), "import_target_ms": 1e3 * (t1 - t0),
        "first_call_ms": 1e3 * (t2 - t1),
        "sources": store.sources(), "cutlass_imported": "cutlass" in sys.modules,
        "finite": bool(torch.isfinite(out).all()),
    }))


def first_call_profile():
    """Where a first call's time goes (disk cache or artifacts), by cumulative time."""
    import cProfile
    import io
    import pstats

    args = problem_args(1, 1)
    torch.cuda.synchronize()
    import generated.h200 as h200

    profile = cProfile.Profile()
    profile.enable()
    h200.gdn_decode(**args)
    torch.cuda.synchronize()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    print(text.getvalue(), file=sys.stderr)


BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def warmup():
    import generated.h200 as h200

    t0 = time.perf_counter()
    summary = h200.warmup(geometry="qwen3.5", layout="k_last", state_dtype="bf16",
                          index_dtype="int32", max_tokens=8, modes=("update",), progress=False)
    t1 = time.perf_counter()
    for T in range(1, 9):
        for B in BATCHES:
            h200.gdn_decode.prepare(**problem_args(B, T))
    t2 = time.perf_counter()
    from gdngen.runtime import store

    print(json.dumps({
        "what": "warmup_80_shapes", "warmup_s": t1 - t0, "prepare_80_shapes_s": t2 - t1,
        "kernels": len(summary.kernels), "by_source": summary.by_source,
        "store_sources": store.sources(), "cutlass_imported": "cutlass" in sys.modules,
    }))


def per_call_us(fn, calls=400, repeats=7):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        samples.append(1e6 * (t1 - t0) / calls)
    return statistics.median(samples)


def eager(rounds=15):
    """Host microseconds per eager call, every implementation measured in turns over ``rounds``
    rounds (so a change of CPU speed during the run hits all of them alike); medians."""
    import generated.h200 as h200
    from gdngen.measure.impls import FLA, FlashInfer
    from gdngen.problem import Problem

    problem = Problem(batch=1, tokens=1, HV=64, pool_size=1, layout="k_last", state_dtype="bf16")
    args = problem.make("cuda")
    out = torch.empty(1, 1, 64, 128, dtype=torch.bfloat16, device="cuda")
    x = torch.zeros(1024, device="cuda")
    runs = {
        "gdngen (output given)": lambda: h200.gdn_decode(**args, output=out),
        "gdngen (output allocated)": lambda: h200.gdn_decode(**args),
        "torch x.add_(1.0)": lambda: x.add_(1.0),
    }
    missing = {}
    for peer in (FlashInfer(), FLA()):
        if peer.missing:
            missing[peer.name] = peer.missing
            continue
        ran = peer.adapt(problem)
        runs[peer.name] = peer.bind(ran, ran.make("cuda")).run
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            samples[name].append(per_call_us(fn, calls=200, repeats=1))
    result = {name: statistics.median(values) for name, values in samples.items()}
    spread = {name: [min(values), max(values)] for name, values in samples.items()}
    print(json.dumps({"what": "eager_host_us_per_call", "B": 1, "T": 1, "HV": 64,
                      "rounds": rounds, **result, "min_max": spread, "missing": missing}))


def graphs():
    """The same kernels JIT-compiled and loaded from disk, timed side by side in CUDA graphs."""
    import importlib

    import generated.h200 as h200
    from gdngen.measure.timing import rotating_sets, time_side_by_side
    from gdngen.problem import Problem
    from gdngen.runtime.compile import CompileKey, compile_kernel
    from gdngen.runtime.store import find_kernel

    rows = []
    for B in (1, 64, 512):
        problem = Problem(batch=B, tokens=1, HV=64, pool_size=B, layout="k_last", state_dtype="bf16")
        variant = h200.select(layout="k_last", state_dtype="bf16", tokens=1, batch_heads=64 * B,
                              intermediate=False).use
        key = CompileKey(variant=variant, arch="sm_90a", tokens=1, H=16, HV=64, K=128, V=128,
                         io_dtype="bf16", gate_dtype="bf16", dt_bias_dtype="fp32",
                         state_dtype="bf16", index_dtype="int32", separate_write_slots=False,
                         cache=False, write_final_state=True, use_qk_l2norm=True)
        module_name = f"generated.h200.kernels.{variant}"
        found = find_kernel(module_name, key)
        jit = compile_kernel(importlib.import_module(module_name), key)
        sets = rotating_sets(problem.moved_bytes())
        inputs = [problem.with_(seed=s).make("cuda") for s in range(sets)]

        def runner(kernel, a):
            out = torch.empty(B, 1, 64, 128, dtype=torch.bfloat16, device="cuda")
            return lambda: kernel(a["q"], a["k"], a["v"], a["a"], a["b"], a["A_log"],
                                  a["dt_bias"], a["initial_state"], a["initial_state_indices"],
                                  None, out, None, 128 ** -0.5)

        times = time_side_by_side({
            f"loaded ({found.source})": [runner(found.kernel, a) for a in inputs],
            "jit": [runner(jit, a) for a in inputs],
        }, replays=25)
        rows.append({"B": B, "variant": variant, **times})
    print(json.dumps({"what": "graph_kernel_us", "rows": rows}))


if __name__ == "__main__":
    {"first-call": lambda: first_call(sys.argv[2]), "warmup": warmup, "eager": eager,
     "graphs": graphs, "first-call-profile": first_call_profile}[sys.argv[1]]()
