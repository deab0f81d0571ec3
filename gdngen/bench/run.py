"""Running a benchmark grid: check each implementation against the reference, then time it."""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, TextIO

import torch

from gdngen.problem import Problem, state_of
from gdngen.reference import reference_decode

from .impls import Gdngen, Impl
from .timing import rotating_sets, time_calls

#: rows of a cell the correctness check compares (the first few and the last)
CHECK_ROWS = 6
#: a peer whose error against the reference exceeds this is flagged (ours are held to the
#: dtype tolerances of the test suite; peers round q/k/v/gates to bf16 and use fast math)
CHECK_TOL = 2e-2


@dataclass
class Result:
    impl: str
    variant: str | None
    layout: str
    state_dtype: str
    mode: str
    tokens: int
    HV: int
    batch: int
    us: float | None = None
    bytes: int = 0
    sol: float | None = None
    check_error: float | None = None
    status: str = "ok"
    sets: int = 0
    extra: dict = field(default_factory=dict)


def mode_of(problem: Problem) -> str:
    if problem.cache_steps is not None and problem.disable_state_update:
        return "verify"
    if problem.cache_steps is None and not problem.disable_state_update:
        return "update"
    return "cache+update" if problem.cache_steps is not None else "no-write"


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def check_against_reference(problem: Problem, args: dict, bound, pool_before: torch.Tensor) -> float:
    """Largest relative error (output, written state) over a few batch rows, after one run."""
    bound.run()
    torch.cuda.synchronize()
    B = problem.batch
    rows = torch.tensor(sorted({*range(min(B, CHECK_ROWS - 1)), B - 1}), device="cuda")
    reads = args.get("initial_state_indices")
    writes = args.get("output_state_indices", reads)
    ref = reference_decode(
        args["q"][rows], args["k"][rows], args["v"][rows], pool_before, args["A_log"],
        args["a"][rows], args["dt_bias"], args["b"][rows], scale=problem.scale,
        use_qk_l2norm=problem.use_qk_l2norm,
        read_slots=None if reads is None else reads[rows],
        write_slots=None if writes is None else writes[rows],
        disable_state_update=problem.disable_state_update, state_layout=problem.layout,
    ) if reads is not None else reference_decode(
        args["q"][rows], args["k"][rows], args["v"][rows], pool_before[rows], args["A_log"],
        args["a"][rows], args["dt_bias"], args["b"][rows], scale=problem.scale,
        use_qk_l2norm=problem.use_qk_l2norm, disable_state_update=problem.disable_state_update,
        state_layout=problem.layout,
    )  # fmt: skip
    errors = [_rel(bound.read_output()[rows], ref.output)]
    if not problem.disable_state_update:
        state = bound.read_state()
        slots = rows if bound.slots is None else bound.slots.long()[rows]
        got = state[slots]
        if problem.layout == "v_last":
            got = got.transpose(-1, -2)
        errors.append(_rel(got, ref.final_state))
    return max(errors)


def measure(
    impl: Impl, problem: Problem, copy_bw: float, *, replays: int = 25
) -> Result:
    ran = impl.adapt(problem)
    variant = impl.chosen_variant(ran) if isinstance(impl, Gdngen) else None
    result = Result(
        impl=impl.name, variant=variant, layout=problem.layout, state_dtype=problem.state_dtype,
        mode=mode_of(problem), tokens=problem.tokens, HV=problem.HV, batch=problem.batch,
        bytes=problem.moved_bytes(),
    )  # fmt: skip
    reason = impl.supports(ran)
    if reason is not None:
        result.status = f"n/a: {reason}"
        return result
    sets = rotating_sets(ran.moved_bytes())
    result.sets = sets
    try:
        inputs = [ran.with_(seed=seed).make("cuda") for seed in range(sets)]
        bounds = [impl.bind(ran, args) for args in inputs]
        first_pool = state_of(inputs[0])
        result.check_error = check_against_reference(ran, inputs[0], bounds[0], first_pool.clone())
        if not result.check_error <= CHECK_TOL:
            result.status = f"check failed: error {result.check_error:.3g} > {CHECK_TOL}"
        result.us = time_calls([b.run for b in bounds], replays=replays)
        result.sol = result.bytes / (result.us * 1e-6) / copy_bw
    except Exception as exc:  # noqa: BLE001 - a failing peer is a result, not a crash
        result.status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    finally:
        inputs = bounds = None
        gc.collect()
        torch.cuda.empty_cache()
    return result


def run_grid(
    problems: Iterable[Problem],
    impls: list[Impl],
    copy_bw: float,
    *,
    jsonl: TextIO | None = None,
    progress: TextIO = sys.stderr,
    replays: int = 25,
) -> list[Result]:
    problems = list(problems)
    total = len(problems) * len(impls)
    results: list[Result] = []
    started = time.time()
    for index, problem in enumerate(problems):
        for position, impl in enumerate(impls):
            done = index * len(impls) + position + 1
            result = measure(impl, problem, copy_bw, replays=replays)
            results.append(result)
            if jsonl is not None:
                jsonl.write(json.dumps(asdict(result)) + "\n")
                jsonl.flush()
            shown = (
                f"{result.us:9.2f} us {100 * result.sol:5.1f}% SOL"
                if result.us is not None
                else result.status
            )
            print(
                f"[{done:4d}/{total}] {time.time() - started:6.0f}s  T={problem.tokens} "
                f"HV={problem.HV:3d} B={problem.batch:4d} {problem.layout} {problem.state_dtype} "
                f"{mode_of(problem):7s} {result.impl:38s} {shown}",
                file=progress,
                flush=True,
            )
    return results


def grid(
    *,
    tokens: Iterable[int],
    batches: Iterable[int],
    heads: Iterable[int],
    layouts: Iterable[str],
    state_dtypes: Iterable[str],
    modes: Iterable[str],
    H: int = 16,
    K: int = 128,
    V: int = 128,
) -> list[Problem]:
    """Problems of the benchmark grid; every call uses a pool with int32 slot indices."""
    problems = []
    for layout in layouts:
        for state_dtype in state_dtypes:
            for mode in modes:
                for T in tokens:
                    if mode == "verify" and T == 1:
                        continue
                    for HV in heads:
                        for B in batches:
                            problems.append(
                                Problem(
                                    batch=B, tokens=T, H=H, HV=HV, K=K, V=V, layout=layout,
                                    state_dtype=state_dtype, pool_size=B,
                                    cache_steps=T if mode == "verify" else None,
                                    disable_state_update=mode == "verify",
                                )  # fmt: skip
                            )
    return problems
