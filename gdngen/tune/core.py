"""`gdngen tune SPEC --core`: time both plans of every candidate variant in each cell of the
spec's decode-core grid (``tuning.core``; docs/design.md, "Tuning the decode core").

A core cell is a call with the conv1d prologue and the gated RMSNorm epilogue in vLLM's call
forms (gdngen.measure.core_cell), at one (layout, state dtype, T, HV, B). Its plans are each
variant with the epilogue (:meth:`gdngen.spec.model.Spec.core_candidates`) run fused (the
prologue inside the kernel) and split (the conv step, then the variant:
``split:<variant>``, gdngen.terms.plan_name); with the grid's ``steps``, also the steps plan of
the variant this GPU's dispatch gives the cell's bare recurrence (``steps:<variant>``: the conv
step, the variant, the norm step; docs/design.md, "The norm step apart"); and where the spec
holds PDL off for the cell's calls (a ``pdl: false`` rule), that rule's plan launched without
PDL (``nopdl:<plan>``), so that the cell ranks it against the plans with PDL. As in the plain
tune, every plan is checked against the float64 reference before it is timed, all are timed
side by side over the same rotating input sets, and twice (:func:`gdngen.tune.run.settle`).
The cells join the tuning file with ``mode: core``; emit turns them into the GPU model's rules
for such calls.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from contextlib import nullcontext
from typing import Callable, ContextManager, TextIO

import torch

from gdngen.dispatch import CallShape, rule_plan
from gdngen.measure.core_cell import (
    CoreCheck,
    core_bytes,
    core_inputs,
    core_kwargs,
    core_problem,
)
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.spec.model import Spec
from gdngen.terms import plan_name, plan_parts

from .run import TuneError, report, settle, this_gpu, tuning_file
from .tuning_file import Cell, TuningFile, pair_sha256, set_key

#: a plan whose check error exceeds this is a bug, not a tuning result: bf16 outputs and
#: conv-step rows (the split plan rounds the convolved rows to bf16 once) are a few bf16
#: roundings off the float64 reference (2^-8 each)
CORE_CHECK_TOL = 2**-7


def core_plans(spec: Spec, layout: str, state_dtype: str) -> list[str]:
    """Every plan a core cell of the pair times: each candidate fused, then split."""
    variants = spec.core_candidates(layout, state_dtype)
    return [plan_name(v, split) for split in (False, True) for v in variants]


def _call_shape(problem, core: bool) -> dict:
    """What dispatch sees of a core cell's call (vLLM's forms: dense rows at T = 1, packed
    tokens and a per-token table at T > 1), with the conv and the norm (``core``) or
    without."""
    T = problem.tokens
    return dict(
        layout=problem.layout, state_dtype=problem.state_dtype, tokens=T,
        batch_heads=problem.sequences * problem.HV, intermediate=T > 1,
        head_dims=(problem.K, problem.V), heads=problem.HV, packed=T > 1, per_token_slots=T > 1,
        gated_norm=core, conv1d=core,
    )  # fmt: skip


def steps_plan(module, problem) -> str:
    """The steps plan of a core cell: the variant the target's dispatch on this GPU gives the
    cell's call without the conv and the norm, between the two steps."""
    rule = module.select(**_call_shape(problem, core=False))
    return plan_name(rule.use, split_conv=True, split_norm=True)


def pdl_off_plans(spec: Spec, problem) -> list[str]:
    """The plans the spec's rules hold PDL off for on a core cell's call (``pdl: false``, see
    gdngen.emit.plan's held rules), launched without PDL: the tune ranks them against the
    plans with PDL, which a call gets by default."""
    shape = CallShape(**_call_shape(problem, core=True))
    return [
        rule_plan(rule, pdl=False)
        for rule in spec.dispatch
        if rule.conv1d and not rule.pdl and rule.serves(shape)
    ]


def time_core_plans(
    target: str,
    problem,
    plans: list[str],
    *,
    conv_width: int,
    replays: int,
    gpu_turn: Callable[[], ContextManager] = nullcontext,
) -> dict[str, float]:
    """Microseconds per call of each plan on the core cell ``problem``, each checked first."""
    module = importlib.import_module(f"generated.{target}")
    sets = rotating_sets(core_bytes(problem, conv_width))
    with gpu_turn():
        inputs = [core_inputs(problem, seed, conv_width=conv_width) for seed in range(sets)]
    calls = {}
    for plan in plans:  # compiles (planning a signature also zeroes its small workspaces)
        variant, split_conv, split_norm, pdl = plan_parts(plan)
        call = module.variant(variant, split_conv=split_conv, split_norm=split_norm)
        call.prepare(**core_kwargs(inputs[0]), enable_pdl=pdl)
        calls[plan] = functools.partial(call, enable_pdl=pdl)
    with gpu_turn():
        runs = {}
        check = CoreCheck(inputs[0], problem)
        for plan, call in calls.items():
            error = check.error(call)
            if not error <= CORE_CHECK_TOL:
                raise TuneError(
                    f"{plan} disagrees with the reference on {problem}: error {error:.3g}"
                )
            runs[plan] = [lambda call=call, s=s: call(**core_kwargs(s)) for s in inputs]

        def time_some(chosen: list[str]) -> dict[str, float]:
            return time_side_by_side({plan: runs[plan] for plan in chosen}, replays=replays)

        times = settle(time_some(plans), time_some)
        del inputs, runs
        torch.cuda.empty_cache()
    return times


def tune_core(
    spec: Spec,
    argv: list[str],
    *,
    pairs: list[tuple[str, str]] | None = None,
    tokens: tuple[int, ...] | None = None,
    heads: tuple[int, ...] | None = None,
    replays: int = 15,
    progress: TextIO = sys.stderr,
    gpu_turn: Callable[[], ContextManager] = nullcontext,
) -> TuningFile:
    """Time the plans of every cell of the spec's core grid (or of its ``pairs``, ``tokens`` and
    ``heads``), as a tuning file of the cells measured (``mode: core``)."""
    grid = spec.tuning.core if spec.tuning else None
    if grid is None:
        raise TuneError("the spec has no `tuning.core:` section (the decode core's grid)")
    gpu = this_gpu(spec)
    measured_pairs = list(pairs or grid.pair_tuples)
    unknown = [p for p in measured_pairs if p not in grid.pair_tuples]
    if unknown:
        raise TuneError(f"--pairs: {unknown} are not in tuning.core.pairs {list(grid.pairs)}")
    with gpu_turn():
        copy_bw = copy_bandwidth()
    dims = spec.tuning_head_dims
    module = importlib.import_module(f"generated.{spec.target}")
    cells: list[Cell] = []
    started = time.time()
    for layout, state_dtype in measured_pairs:
        plans = core_plans(spec, layout, state_dtype)
        for T in sorted(tokens or grid.tokens):
            for HV in (hv for hv in grid.heads if heads is None or hv in heads):
                g = spec.tuning_geometry(HV, dims)
                for B in grid.batch:
                    where = f"{layout}/{state_dtype} core T={T} HV={HV:3d} B={B:4d}"
                    problem = core_problem(B, T, HV, state_dtype, H=g.H, K=g.K, V=g.V,
                                           layout=layout)  # fmt: skip
                    cell_plans = plans + ([steps_plan(module, problem)] if grid.steps else [])
                    cell_plans += pdl_off_plans(spec, problem)
                    try:
                        times = time_core_plans(
                            spec.target, problem, cell_plans, conv_width=grid.conv_width,
                            replays=replays, gpu_turn=gpu_turn,
                        )  # fmt: skip
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        print(f"{where}: not measured: out of memory", file=progress, flush=True)
                        continue
                    cell = Cell(
                        layout=layout, state_dtype=state_dtype, tokens=T, mode="core", HV=HV,
                        batch=B, times_us={n: round(us, 2) for n, us in times.items()},
                    )  # fmt: skip
                    cells.append(cell)
                    report(progress, started, where, times)
    hashes = {
        set_key(layout, state_dtype, dims, spec, core=True): pair_sha256(
            spec, layout, state_dtype, core=True
        )
        for layout, state_dtype in measured_pairs
    }
    return tuning_file(spec, argv, gpu, copy_bw, hashes, cells)
