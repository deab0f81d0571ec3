"""`gdngen tune SPEC`: time every candidate variant of every tuning cell on this GPU.

All candidates of a cell run over the same rotating input sets and are timed side by side
(interleaved, see gdngen.measure.timing); each is checked against the float64 reference before it
is timed, so a wrong kernel can never win a cell, and every candidate is timed twice, so a lucky
sample cannot either.

A ranking may still differ between processes or GPUs of one model: ``gdngen tune --retime``
times the contenders of the cells already in the file once more, in its own process and on
whatever GPU it gets, and adds that timing to each cell; the dispatch then takes, per cell, the
variant whose mean gap to the fastest over all timings is least (see
gdngen.dispatch.measured.verdicts).

Compiling the candidates takes most of a tune's time and needs no GPU, so several tune
processes (one per pair or token count) may share one GPU with ``--gpu-lock``: their compiles
overlap, and whatever they run on the GPU runs in turns (see gdngen.measure.gpu_turns).
"""

from __future__ import annotations

import datetime
import importlib
import itertools
import math
import shlex
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager, TextIO

import torch

from gdngen.measure.check import (
    check_against_reference,
    check_packed_against_reference,
    check_tolerance,
)
from gdngen.measure.environment import environment
from gdngen.measure.impls import Gdngen
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.problem import PackedProblem, Problem, state_copy
from gdngen.spec.model import Spec

from .tuning_file import (
    Cell,
    TuningFile,
    cell_set,
    gpu_model,
    pair_sha256,
    set_key,
    stale_pairs,
    tuning_gpus,
)

#: a variant whose check error exceeds this is a bug, not a tuning result
CHECK_TOL = 5e-3
#: --retime times the variants within this margin of a cell's best in any of its timings: wider
#: than the differences seen between processes and GPUs of one model
RETIME_MARGIN = 0.05


class TuneError(RuntimeError):
    pass


def time_variants(
    target: str,
    problem: Problem | PackedProblem,
    names: list[str],
    *,
    replays: int,
    gpu_turn: Callable[[], ContextManager] = nullcontext,
) -> dict[str, float]:
    """Microseconds per call of each of ``names`` on ``problem``, each checked first.

    ``gpu_turn`` brackets the work on the GPU (drawing the inputs; binding, checking and
    timing); the compiles between run outside it, so that other tune processes may time meanwhile.
    """
    sets = rotating_sets(problem.moved_bytes())
    with gpu_turn():
        inputs = [problem.with_(seed=seed).make("cuda") for seed in range(sets)]
    impls = {name: Gdngen(target, name) for name in names}
    for impl in impls.values():  # compiles (no GPU work)
        impl.compile(problem, inputs[0])
    with gpu_turn():
        bounds = {
            name: [impl.bind(problem, args) for args in inputs] for name, impl in impls.items()
        }
        runs = {}
        for name in names:
            args = inputs[0]
            if isinstance(problem, PackedProblem):
                error = check_packed_against_reference(problem, args, bounds[name][0])
            else:
                error = check_against_reference(problem, args, bounds[name][0], state_copy(args))
            if not error <= check_tolerance(problem.state_dtype, CHECK_TOL):
                raise TuneError(
                    f"{name} disagrees with the reference on {problem}: error {error:.3g}"
                )
            runs[name] = [b.run for b in bounds[name]]

        def time_some(chosen: list[str]) -> dict[str, float]:
            return time_side_by_side({name: runs[name] for name in chosen}, replays=replays)

        times = settle(time_some(names), time_some)
        del inputs, runs, bounds
        torch.cuda.empty_cache()
    return times


#: a cell whose second timing differs from its first by more than this, as the median over its
#: variants of their ratios, had one of them disturbed (another process's work on the GPU, a
#: clock change): every variant moved together, which no kernel's own noise does
ROUND_DRIFT = 0.03
#: how many more timings a disturbed cell gets to find two that agree
EXTRA_ROUNDS = 2


def round_drift(one: dict[str, float], other: dict[str, float]) -> float:
    """How far apart two timings of a cell are as a whole: |log| of the median over its variants
    of their ratios. One variant's noise hardly moves that median; a disturbance that slowed
    every variant moves it by as much."""
    return abs(math.log(statistics.median(other[name] / one[name] for name in one)))


def settle(
    first: dict[str, float], retime: Callable[[list[str]], dict[str, float]]
) -> dict[str, float]:
    """A cell's timings, each variant's the slower of two that agree as a whole.

    All the variants are timed a second time side by side, in the reverse order, and each keeps
    the slower of its two timings: a single lucky sample cannot win a cell, and a variant whose
    timing swings from run to run is ranked by its slow side.

    The second timing takes every variant, not only the close ones, because a kernel's time
    depends on what is timed around it: on an H200, large-batch K-last kernels timed in a group
    of three or four heavy kernels read 2-6% slower than inside the full set. Re-timing only the
    variants within 3% of the best therefore ranked those by that slower group and the
    others by the full set, and steady variants timed once won cells from faster ones.

    When the two timings disagree as a whole (:func:`round_drift` over ROUND_DRIFT), one of them
    was disturbed, and keeping the slower figure would rank the variants by the disturbance: in
    a K-last bf16 re-tune on an H100 (docs/perf/h100-h200-2026-11-25-retune-staged.md) most
    variants of three cells read 10-35% slower than in the run before while the other cells
    matched it, and the slower figure of each decided those cells. The cell is then timed up to
    EXTRA_ROUNDS more times, alternating the order, and the two timings that agree best are kept.
    """
    if len(first) < 2:
        return dict(first)
    timings = [first, retime(list(reversed(first)))]

    def closest() -> tuple[dict[str, float], dict[str, float]]:
        return min(itertools.combinations(timings, 2), key=lambda pair: round_drift(*pair))

    while round_drift(*closest()) > ROUND_DRIFT and len(timings) < 2 + EXTRA_ROUNDS:
        order = list(first) if len(timings) % 2 == 0 else list(reversed(first))
        timings.append(retime(order))
    one, other = closest()
    return {name: max(one[name], other[name]) for name in first}


def shortlist(cells: list[Cell], factor: float, family: dict[str, str] | None = None) -> list[str]:
    """Variants within ``factor`` of the best of their family in at least one of ``cells``.

    ``family`` maps a variant to its solve (stepwise, staged): a staged kernel pays for its
    barriers at T = 1 and wins at T > 1, so each family is ranked against itself.
    """
    family = family or {}
    keep = set()
    for times in (times for cell in cells for times in cell.timings):
        best: dict[str, float] = {}
        for name, us in times.items():
            kind = family.get(name, "")
            best[kind] = min(us, best.get(kind, us))
        keep |= {name for name, us in times.items() if us <= best[family.get(name, "")] * factor}
    return sorted(keep)


def cell_problem(
    mode: str, B: int, T: int, geometry, HV: int, layout: str, state_dtype: str
) -> Problem | PackedProblem:
    """The call a cell of ``mode`` times (``Tuning.modes``): dense rows, the final state stored
    ("update") or every token's in a positional cache ("verify"); or vLLM's speculative-decode
    form ("spec"): B sequences of T tokens packed (``uniform_seqlen``), a [B, T] per-token slot
    table, every token's state stored in the pool."""
    g = geometry
    if mode == "spec":
        return PackedProblem(
            sequences=B, tokens=T, H=g.H, HV=HV, K=g.K, V=g.V, layout=layout,
            state_dtype=state_dtype, uniform_seqlen=True,
        )  # fmt: skip
    return Problem(
        batch=B, tokens=T, H=g.H, HV=HV, K=g.K, V=g.V, layout=layout, state_dtype=state_dtype,
        pool_size=B, cache_steps=T if mode == "verify" else None,
        disable_state_update=mode == "verify",
    )  # fmt: skip


def grid_sets(
    spec: Spec,
    pairs: list[tuple[str, str]],
    head_dims: tuple[tuple[int, int], ...] | None = None,
    heads: tuple[int, ...] | None = None,
) -> list[tuple[str, str, tuple[int, int], list[str], tuple[int, ...]]]:
    """What a run measures, one set (a pair at one head dims) at a time: ``(layout, state dtype,
    head dims, candidates, HVs)`` for each of ``pairs`` at each of ``head_dims`` (default: every
    head dims of the grid) that the pair has candidates for, at the grid's HVs for those head dims
    (only those in ``heads``, if given)."""
    sets = []
    for layout, state_dtype, dims in spec.tuning_sets(pairs):
        HVs = tuple(hv for hv in spec.tuning_heads(dims) if heads is None or hv in heads)
        if HVs and (head_dims is None or dims in head_dims):
            candidates = spec.tuning_candidates(layout, state_dtype, dims)
            sets.append(
                (layout, state_dtype, dims, sorted(map(spec.variant_name, candidates)), HVs)
            )
    return sets


def earlier_first_token_cells(earlier: TuningFile | None, spec: Spec, gpu: str) -> list[Cell]:
    """The T = 1 cells of ``earlier`` (the file a run merges into) that still hold for ``spec`` on
    this GPU: they shortlist the T > 1 candidates of a run that does not measure T = 1 itself
    (``--tokens 4,8 --merge`` after ``--tokens 1,2``), as the run's own T = 1 cells would."""
    if earlier is None or earlier.gpu != gpu:
        return []
    stale = stale_pairs(earlier, spec)
    # (the update cells: a core cell's timings are of plans, not variants)
    return [
        c
        for c in earlier.cells
        if c.tokens == 1 and c.mode == "update" and cell_set(c, spec) not in stale
    ]


def retime_names(cell: Cell, spec: Spec) -> list[str]:
    """The variants ``--retime`` times again in ``cell``: those within RETIME_MARGIN of the best
    in any of its timings that the spec still has."""
    return [name for name in cell.within(RETIME_MARGIN) if name in spec.variants_by_name]


def tune(
    spec: Spec,
    argv: list[str],
    *,
    pairs: list[tuple[str, str]] | None = None,
    tokens: tuple[int, ...] | None = None,
    heads: tuple[int, ...] | None = None,
    head_dims: tuple[tuple[int, int], ...] | None = None,
    modes: tuple[str, ...] | None = None,
    replays: int = 15,
    earlier: TuningFile | None = None,
    retime: bool = False,
    progress: TextIO = sys.stderr,
    gpu_turn: Callable[[], ContextManager] = nullcontext,
) -> TuningFile:
    """Time the candidates of every cell of the spec's tuning grid (or of ``pairs``, ``tokens``,
    ``heads`` and ``head_dims``, see :func:`grid_sets`; of ``modes`` of the grid's call forms), as
    a tuning file of the cells measured.

    With ``retime``, only cells already in ``earlier`` are timed, and only their contenders
    (:func:`retime_names`); each comes back as the earlier cell with the new timing added.
    """
    if spec.tuning is None:
        raise TuneError("the spec has no `tuning:` section (the grid to measure)")
    grid = spec.tuning
    target = importlib.import_module(f"generated.{spec.target}")
    gpu = this_gpu(spec)
    with gpu_turn():
        copy_bw = copy_bandwidth()
    cells: list[Cell] = []
    started = time.time()
    families = {name: v.solve for name, v in spec.variants_by_name.items()}
    measured_pairs = list(pairs or spec.served)
    run_tokens = sorted(tokens or grid.tokens)
    earlier_first = [] if 1 in run_tokens else earlier_first_token_cells(earlier, spec, gpu)
    if retime and (earlier is None or earlier.gpu != gpu):
        raise TuneError(
            "--retime adds timings to the cells of a tuning file measured on this GPU model; "
            + ("there is none" if earlier is None else f"the file's are from {earlier.gpu!r}")
        )
    # (cells of pairs whose variants changed since are stale: those are not added to)
    stale = stale_pairs(earlier, spec) if retime else {}
    earlier_cells = {
        _cell_key(c): c for c in (earlier.cells if retime else []) if cell_set(c, spec) not in stale
    }
    base = spec.tuning_head_dims
    sets = grid_sets(spec, measured_pairs, head_dims, heads)
    for layout, state_dtype, dims, candidates, HVs in sets:
        # a cell at the base head dims leaves K and V out (files from before other head dims)
        K, V = (None, None) if dims == base else dims
        first_cells = [
            c
            for c in earlier_first
            if (c.layout, c.state_dtype, c.head_dims(base)) == (layout, state_dtype, dims)
        ]
        for T in run_tokens:
            for mode in modes or grid.modes:
                if mode in ("verify", "spec") and T == 1:
                    continue
                names = (
                    shortlist(first_cells, grid.multi_token_shortlist, families)
                    if T > 1 and first_cells
                    else candidates
                )
                for HV in HVs:
                    g = spec.tuning_geometry(HV, dims)
                    for B in grid.batch:
                        where = (
                            f"{set_key(layout, state_dtype, dims, spec)} T={T} {mode:6s} "
                            f"HV={HV:3d} B={B:4d}"
                        )
                        key = (layout, state_dtype, T, mode, HV, B, K, V)
                        timed = names
                        if retime:
                            before = earlier_cells.get(key)
                            timed = retime_names(before, spec) if before else []
                            if len(timed) < 2:
                                why = "one contender" if before else "not in the file"
                                print(f"{where}: {why}, not retimed", file=progress, flush=True)
                                continue
                        problem = cell_problem(mode, B, T, g, HV, layout, state_dtype)
                        try:
                            times = time_variants(
                                spec.target, problem, timed, replays=replays, gpu_turn=gpu_turn
                            )
                        except torch.cuda.OutOfMemoryError:
                            # A verify cell of the largest B and K (its per-token states: B*T*HV*
                            # K*V elements) can outgrow this GPU beside the checks' copies; the
                            # dispatch serves it from the nearest measured point instead.
                            torch.cuda.empty_cache()
                            print(
                                f"{where}: not measured: its inputs and checks do not fit in "
                                "this GPU's memory",
                                file=progress,
                                flush=True,
                            )
                            continue
                        rounded = {n: round(us, 2) for n, us in times.items()}
                        if retime:
                            cell = before.model_copy(
                                update={"retimed_us": [*before.retimed_us, rounded]}
                            )
                        else:
                            cell = Cell(
                                layout=layout, state_dtype=state_dtype, tokens=T, mode=mode,
                                HV=HV, batch=B, K=K, V=V, times_us=rounded,
                            )  # fmt: skip
                        cells.append(cell)
                        if T == 1:
                            first_cells.append(cell)
                        report(progress, started, where, times)
    hashes = {
        set_key(layout, state_dtype, dims, spec): pair_sha256(spec, layout, state_dtype, dims)
        for layout, state_dtype, dims, _, _ in sets
    }
    return tuning_file(spec, argv, gpu, copy_bw, hashes, cells)


def this_gpu(spec: Spec) -> str:
    """This GPU's name; a TuneError where it is none of the spec's GPU models."""
    gpu = torch.cuda.get_device_name()
    if gpu_model(spec, gpu) is None:
        raise TuneError(
            f"this GPU is {gpu!r}; the spec measures {', '.join(map(repr, tuning_gpus(spec)))} "
            "(tuning.gpu and tuning.other_gpus): add its model to tuning.other_gpus to measure it"
        )
    return gpu


def report(progress: TextIO, started: float, where: str, times: dict[str, float]) -> None:
    """One measured cell's line: when, where, the fastest candidate and of how many."""
    best = min(times, key=times.get)
    print(
        f"{time.time() - started:6.0f}s {where}: best {best} {times[best]:.2f} us of {len(times)}",
        file=progress,
        flush=True,
    )


def tuning_file(
    spec: Spec,
    argv: list[str],
    gpu: str,
    copy_bw: float,
    hashes: dict[str, str],
    cells: list[Cell],
) -> TuningFile:
    """A run's tuning file: its cells, and what they were measured with."""
    meta = environment()
    return TuningFile(
        target=spec.target,
        sm=spec.sm,
        gpu=gpu,
        date=datetime.date.today().isoformat(),
        command="gdngen " + shlex.join(argv),
        variants_sha256=hashes,
        copy_bw_tbps=round(copy_bw / 1e12, 3),
        versions=dict(meta["versions"]),
        cells=cells,
    )


def merge(
    old: TuningFile | None, new: TuningFile, spec: Spec, *, retimed_by: str | None = None
) -> TuningFile:
    """``new`` plus the cells of ``old`` that it did not re-measure and that still hold.

    A cell of ``old`` still holds when it was measured on the same GPU and its pair's variants
    are unchanged in ``spec`` (same :func:`pair_sha256`); cells of stale pairs are dropped, as
    ``gdngen emit`` would refuse them. ``new`` may re-measure only some cells of a pair (e.g.
    one token count); the pair's other cells are kept if the pair is still fresh.

    ``retimed_by`` (the line :func:`retime_record` made for a ``--retime`` run) says that ``new``
    only added timings to cells of ``old``: the header (what first measured them) stays ``old``'s
    and the line is added to its ``retimed`` list once.
    """
    if retimed_by is not None:
        if old is None or old.gpu != new.gpu:
            raise TuneError("a --retime run adds to a tuning file of the same GPU model")
        retimed = old.retimed if retimed_by in old.retimed else [*old.retimed, retimed_by]
        new = old.model_copy(update={"cells": new.cells, "retimed": retimed})
    if old is None or old.gpu != new.gpu:
        return new
    stale = stale_pairs(old, spec)
    remeasured = {_cell_key(c) for c in new.cells}
    kept = [
        c for c in old.cells if cell_set(c, spec) not in stale and _cell_key(c) not in remeasured
    ]
    kept_sets = {cell_set(c, spec) for c in kept}
    hashes = {key: sha for key, sha in old.variants_sha256.items() if key in kept_sets}
    hashes.update(new.variants_sha256)
    # The runs that retimed kept cells stay named in the header, before those of ``new``.
    retimed = old.retimed if any(c.retimed_us for c in kept) else []
    retimed = retimed + [line for line in new.retimed if line not in retimed]
    return new.model_copy(
        update={"cells": kept + list(new.cells), "variants_sha256": hashes, "retimed": retimed}
    )


def merge_runs(tunings: list[TuningFile], spec: Spec, command: str) -> TuningFile:
    """One tuning file from the files of several tune runs (e.g. one process per pair and token
    count, see --gpu-lock), in order: a cell measured by more than one run keeps the last run's
    timing. All must come from one GPU model; ``command`` says how they were combined."""
    if not tunings:
        raise TuneError("nothing to merge")
    gpus = sorted({t.gpu for t in tunings})
    if len(gpus) > 1:
        raise TuneError(f"the files were measured on different GPU models: {', '.join(gpus)}")
    merged = None
    for tuning in tunings:
        merged = merge(merged, tuning, spec)
    stale = stale_pairs(merged, spec)
    if stale:
        raise TuneError(
            "stale timings (re-tune these pairs): "
            + "; ".join(f"{pair}: {why}" for pair, why in stale.items())
        )
    return merged.model_copy(update={"command": command})


def retime_record(gpu: str, uuid: str | None, argv: list[str]) -> str:
    """The line a --retime run adds to the file's ``retimed`` list: when, on which GPU (its UUID
    tells whether the run had the same physical GPU as an earlier one) and how."""
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"{when} {gpu}{f' ({uuid})' if uuid else ''}: gdngen {shlex.join(argv)}"


def _cell_key(cell: Cell) -> tuple:
    """What identifies a cell of the grid: a re-measured cell replaces the old one."""
    return (
        cell.layout,
        cell.state_dtype,
        cell.tokens,
        cell.mode,
        cell.HV,
        cell.batch,
        cell.K,
        cell.V,
    )


def write(path: Path, tuning: TuningFile) -> None:
    from .tuning_file import dump_tuning

    path.write_text(dump_tuning(tuning))
