"""`gdngen tune SPEC`: time every candidate variant of every tuning cell on this GPU.

All candidates of a cell run over the same rotating input sets; each is checked against the
float64 reference before it is timed, so a wrong kernel can never win a cell.
"""

from __future__ import annotations

import datetime
import importlib
import shlex
import sys
import time
from pathlib import Path
from typing import TextIO

import torch

from gdngen.bench.impls import Gdngen
from gdngen.bench.report import environment
from gdngen.bench.run import check_against_reference
from gdngen.bench.timing import copy_bandwidth, rotating_sets, time_calls
from gdngen.problem import Problem, state_of
from gdngen.spec.model import Spec

from .tuning_file import Cell, TuningFile, variants_sha256

#: a variant whose check error exceeds this is a bug, not a tuning result
CHECK_TOL = 5e-3


class TuneError(RuntimeError):
    pass


def time_variants(
    target: str, problem: Problem, names: list[str], *, replays: int
) -> dict[str, float]:
    sets = rotating_sets(problem.moved_bytes())
    inputs = [problem.with_(seed=seed).make("cuda") for seed in range(sets)]
    times = {}
    for name in names:
        impl = Gdngen(target, name)
        bounds = [impl.bind(problem, args) for args in inputs]
        args = inputs[0]
        pool = state_of(args)
        error = check_against_reference(problem, args, bounds[0], pool.clone())
        if not error <= CHECK_TOL:
            raise TuneError(f"{name} disagrees with the reference on {problem}: error {error:.3g}")
        times[name] = time_calls([b.run for b in bounds], replays=replays)
    del inputs
    torch.cuda.empty_cache()
    return times


def shortlist(cells: list[Cell], factor: float) -> list[str]:
    """Variants within ``factor`` of the best in at least one of ``cells``."""
    keep = set()
    for cell in cells:
        best = min(cell.times_us.values())
        keep |= {name for name, us in cell.times_us.items() if us <= best * factor}
    return sorted(keep)


def tune(
    spec: Spec,
    argv: list[str],
    *,
    pairs: list[tuple[str, str]] | None = None,
    tokens: tuple[int, ...] | None = None,
    replays: int = 15,
    progress: TextIO = sys.stderr,
) -> TuningFile:
    if spec.tuning is None:
        raise TuneError("the spec has no `tuning:` section (the grid to measure)")
    grid = spec.tuning
    target = importlib.import_module(f"generated.{spec.target}")
    gpu = torch.cuda.get_device_name()
    if grid.gpu.lower() not in gpu.lower():
        raise TuneError(f"the spec's tuning.gpu is {grid.gpu!r}; this GPU is {gpu!r}")
    copy_bw = copy_bandwidth()
    geometry_by_heads = {g.HV: g for g in spec.geometries}
    cells: list[Cell] = []
    started = time.time()
    for layout, state_dtype in pairs or spec.served:
        candidates = sorted(
            name
            for name, v in spec.variants_by_name.items()
            if (v.layout, v.state_dtype) == (layout, state_dtype)
        )
        first_cells: list[Cell] = []
        for T in sorted(tokens or grid.tokens):
            for mode in grid.modes:
                if mode == "verify" and T == 1:
                    continue
                names = (
                    shortlist(first_cells, grid.multi_token_shortlist)
                    if T > 1 and first_cells
                    else candidates
                )
                for HV in grid.heads:
                    g = geometry_by_heads[HV]
                    for B in grid.batch:
                        problem = Problem(
                            batch=B, tokens=T, H=g.H, HV=HV, K=g.K, V=g.V, layout=layout,
                            state_dtype=state_dtype, pool_size=B,
                            cache_steps=T if mode == "verify" else None,
                            disable_state_update=mode == "verify",
                        )  # fmt: skip
                        times = time_variants(spec.target, problem, names, replays=replays)
                        cell = Cell(
                            layout=layout, state_dtype=state_dtype, tokens=T, mode=mode, HV=HV,
                            batch=B, times_us={n: round(us, 2) for n, us in times.items()},
                        )  # fmt: skip
                        cells.append(cell)
                        if T == 1:
                            first_cells.append(cell)
                        best = min(times, key=times.get)
                        print(
                            f"{time.time() - started:6.0f}s {layout} {state_dtype} T={T} {mode:6s} "
                            f"HV={HV:3d} B={B:4d}: best {best} {times[best]:.2f} us of {len(times)}",
                            file=progress,
                            flush=True,
                        )
    meta = environment()
    return TuningFile(
        target=spec.target,
        sm=spec.sm,
        gpu=gpu,
        date=datetime.date.today().isoformat(),
        command="gdngen " + shlex.join(argv),
        variants_sha256=variants_sha256(spec),
        copy_bw_tbps=round(copy_bw / 1e12, 3),
        versions={k: v for k, v in meta["versions"].items()},
        cells=cells,
    )


def merge(old: TuningFile | None, new: TuningFile) -> TuningFile:
    """``new`` with the cells of ``old`` that it did not re-measure (same GPU and variants)."""
    if old is None or old.variants_sha256 != new.variants_sha256 or old.gpu != new.gpu:
        return new
    key = lambda c: (c.layout, c.state_dtype, c.tokens, c.mode, c.HV, c.batch)  # noqa: E731
    fresh = {key(c) for c in new.cells}
    kept = [c for c in old.cells if key(c) not in fresh]
    return new.model_copy(update={"cells": kept + list(new.cells)})


def write(path: Path, tuning: TuningFile) -> None:
    from .tuning_file import dump_tuning

    path.write_text(dump_tuning(tuning))
