"""Running a benchmark grid: check each implementation against the reference, then time it."""

from __future__ import annotations

import gc
import itertools
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, ContextManager, Iterable, TextIO

import torch

from gdngen.measure.check import check_against_reference, check_tolerance
from gdngen.measure.impls import Gdngen, Impl
from gdngen.measure.timing import rotating_sets, time_side_by_side
from gdngen.problem import Problem, state_copy

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
    #: head dims (K = q/k, V = value); records written before they were kept are K = V = 128
    K: int = 128
    V: int = 128


def _result(impl: Impl, problem: Problem, ran: Problem) -> Result:
    variant = None
    if isinstance(impl, Gdngen):
        try:
            variant = impl.chosen_variant(ran)
        except LookupError:  # no dispatch row: supports() says why
            pass
    return Result(
        impl=impl.name,
        variant=variant,
        layout=problem.layout, state_dtype=problem.state_dtype, mode=problem.mode,
        tokens=problem.tokens, HV=problem.HV, batch=problem.batch, bytes=problem.moved_bytes(),
        K=problem.K, V=problem.V,
    )  # fmt: skip


def _error(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _check(result: Result, problem: Problem, args: dict, bound) -> None:
    result.check_error = check_against_reference(problem, args, bound, state_copy(args))
    tolerance = check_tolerance(problem.state_dtype, CHECK_TOL)
    if not result.check_error <= tolerance:
        result.status = f"check failed: error {result.check_error:.3g} > {tolerance}"


def measure_side_by_side(
    impls: list[Impl],
    problem: Problem,
    copy_bw: float,
    *,
    replays: int = 25,
    gpu_turn: Callable[[], ContextManager] = nullcontext,
) -> list[Result]:
    """Implementations of one cell that run the same form of ``problem`` (gdngen's dispatched
    call and single variants, or one peer): the same input sets, each checked against the
    reference, then all timed side by side (interleaved), so they compare within the cell's
    noise. A failure (unsupported, wrong, crashed) is a result, not an exception.

    ``gpu_turn`` brackets the work on the GPU (drawing the inputs; binding, checking and
    timing); gdngen's compiles run between two turns, so that other processes may time meanwhile.
    A bind may launch small kernels (index conversions) or allocate: outside a turn these would
    land in the middle of another process's timing.
    """
    ran = impls[0].adapt(problem)
    results = [_result(impl, problem, ran) for impl in impls]
    runs: dict[str, list] = {}
    inputs = bound = None
    supported = []
    for index, (impl, result) in enumerate(zip(impls, results)):
        reason = impl.supports(ran)
        if reason is None:
            supported.append(index)
        else:
            result.status = f"n/a: {reason}"
    if not supported:  # e.g. a peer without this mode: no inputs drawn, no GPU turn taken
        return results
    try:
        sets = rotating_sets(ran.moved_bytes())
        with gpu_turn():
            inputs = [ran.with_(seed=seed).make("cuda") for seed in range(sets)]
        compiled = []
        for index in supported:
            impl, result = impls[index], results[index]
            result.sets = sets
            try:
                impl.compile(ran, inputs[0])
                compiled.append(index)
            except Exception as exc:  # noqa: BLE001 - one failing variant or peer is a result
                result.status = _error(exc)
        bound = {}
        with gpu_turn():
            for index in compiled:
                try:
                    bound[index] = [impls[index].bind(ran, args) for args in inputs]
                except Exception as exc:  # noqa: BLE001 - as above
                    results[index].status = _error(exc)
            for index, bounds in bound.items():
                try:
                    _check(results[index], ran, inputs[0], bounds[0])
                    runs[str(index)] = [b.run for b in bounds]
                except Exception as exc:  # noqa: BLE001 - as above
                    results[index].status = _error(exc)
            if runs:
                for index, us in time_side_by_side(runs, replays=replays).items():
                    result = results[int(index)]
                    result.us = us
                    result.sol = result.bytes / (result.us * 1e-6) / copy_bw
    except Exception as exc:  # noqa: BLE001 - e.g. no memory for the inputs: all results say so
        for result in results:
            if result.us is None and result.status == "ok":
                result.status = _error(exc)
    finally:
        inputs = runs = bound = None
        gc.collect()
        torch.cuda.empty_cache()
    return results


def write_meta_line(jsonl: TextIO, meta: dict) -> None:
    """The first line of a run's ``.jsonl``: its metadata (GPU, versions, command, planned cells),
    so the file alone can be rendered however the run ended (see ``read_record_file``)."""
    jsonl.write(json.dumps({"meta": meta}) + "\n")
    jsonl.flush()


def read_record_file(path) -> tuple[dict, list[Result]]:
    """The metadata and results of a bench record: a finished run's ``.json``, or a run's
    ``.jsonl`` (written cell by cell, each cell once it is complete; its metadata is empty in a
    file written before it was kept)."""
    if str(path).endswith(".json"):
        with open(path) as handle:
            record = json.load(handle)
        return record["meta"], [Result(**r) for r in record["results"]]
    meta: dict = {}
    results = []
    with open(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            entry = json.loads(line)
            if "meta" in entry:
                meta = entry["meta"]
            else:
                results.append(Result(**entry))
    return meta, results


def read_records(path) -> list[Result]:
    """The results of a run's ``.jsonl`` (see ``read_record_file``)."""
    return read_record_file(path)[1]


def stopped_note(results: list[Result], planned: int | None) -> str:
    """What a stopped run's record says of itself: how many of its planned cells it finished."""
    done = len({(r.layout, r.state_dtype, r.mode, r.tokens, r.HV, r.batch, r.K) for r in results})
    return f"stopped after {done} of {planned if planned else 'its'} cells"


def run_grid(
    problems: Iterable[Problem],
    target: str,
    copy_bw: float,
    *,
    variants_for: Callable[[Problem], tuple[list[str], str]] = lambda problem: ([], ""),
    peers: list[Impl] = (),
    jsonl: TextIO | None = None,
    progress: TextIO = sys.stderr,
    replays: int = 25,
    gpu_turn: Callable[[], ContextManager] = nullcontext,
) -> list[Result]:
    """Every problem: gdngen's dispatched call with the single variants ``variants_for`` names for
    it (side by side), then each peer on its own."""
    problems = list(problems)
    results: list[Result] = []
    started = time.time()
    for index, problem in enumerate(problems):
        names, why = variants_for(problem)
        ours = [Gdngen(target)] + [Gdngen(target, name) for name in dict.fromkeys(names)]
        cell = measure_side_by_side(ours, problem, copy_bw, replays=replays, gpu_turn=gpu_turn)
        for result in cell[1:]:
            result.extra["chosen_as"] = why
        for peer in peers:
            cell += measure_side_by_side(
                [peer], problem, copy_bw, replays=replays, gpu_turn=gpu_turn
            )
        results += cell
        if jsonl is not None:  # one write a cell: a stopped run's file holds whole cells
            jsonl.write("".join(json.dumps(asdict(result)) + "\n" for result in cell))
            jsonl.flush()
        for result in cell:
            shown = (
                f"{result.us:9.2f} us {100 * result.sol:5.1f}% SOL"
                if result.us is not None
                else result.status
            )
            print(
                f"[{index + 1:4d}/{len(problems)}] {time.time() - started:6.0f}s  "
                f"T={problem.tokens} HV={problem.HV:3d} B={problem.batch:4d} {problem.layout} "
                f"{problem.state_dtype} {problem.mode:7s} {result.impl:38s} {shown}",
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
    head_dims: Iterable[int] = (128,),
) -> list[Problem]:
    """Problems of the benchmark grid (``head_dims``: K = V values); every call uses a pool with
    int32 slot indices."""
    return [
        Problem(
            batch=B, tokens=T, H=H, HV=HV, K=head_dim, V=head_dim, layout=layout,
            state_dtype=state_dtype, pool_size=B, cache_steps=T if mode == "verify" else None,
            disable_state_update=mode == "verify",
        )  # fmt: skip
        for head_dim, layout, state_dtype, mode, T, HV, B in itertools.product(
            head_dims, layouts, state_dtypes, modes, tokens, heads, batches
        )
        if not (mode == "verify" and T == 1)
    ]
