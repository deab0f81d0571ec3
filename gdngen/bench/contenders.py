"""Which single variants `gdngen bench` times beside the dispatched call of a cell.

``--variants`` picks them: a fixed list of names, ``candidates`` (every variant of the cell's
layout and state dtype) or ``contenders`` (the variants the tuning file timed within a margin of
the cell's best in any of its timings: the ones that could be the fastest in this run too; for a
batch the tune did not measure, those of its tuned neighbours below and above).
Timed side by side with the dispatched call on the same inputs, they show whether the dispatch
picked the fastest variant.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable

from gdngen.problem import Problem
from gdngen.terms import kernel_serves_head_dims
from gdngen.tune.tuning_file import Cell, TuningFile, read_tuning

#: default margin of ``contenders``: a variant the tune timed more than 10% behind a cell's best
#: would have to gain over twice the run-to-run spread seen on H100 (up to 4%) to come within 3%
CONTENDER_MARGIN = 0.10


class ContenderError(ValueError):
    pass


def pair_variants(
    target: ModuleType, layout: str, state_dtype: str, head_dims: tuple[int, int]
) -> list[str]:
    """The target's variants for one layout and state dtype built for head dims (K, V), by name."""
    call = target.variant(target.VARIANTS[0])  # any variant's call loads every kernel module
    modules = [call.module(name) for name in target.VARIANTS]
    return [
        m.NAME
        for m in modules
        if (m.LAYOUT, m.STATE_DTYPE) == (layout, state_dtype)
        and kernel_serves_head_dims(m, *head_dims)
    ]


def problem_variants(target: ModuleType, problem: Problem) -> list[str]:
    """:func:`pair_variants` of a problem's layout, state dtype and head dims."""
    return pair_variants(target, problem.layout, problem.state_dtype, (problem.K, problem.V))


def _problems_cells(tuning: TuningFile, problem: Problem, target: ModuleType) -> dict[int, Cell]:
    """The tuning file's cells of ``problem``'s layout, state dtype, T, mode, HV and head dims, by
    batch (a cell of the grid's base head dims names no K, so the variants of it that the target
    still has must be kernels of the problem's head dims)."""
    key = (problem.layout, problem.state_dtype, problem.tokens, problem.mode, problem.HV)
    served = set(problem_variants(target, problem))
    found: dict[int, Cell] = {}
    for cell in tuning.cells:
        if (cell.layout, cell.state_dtype, cell.tokens, cell.mode, cell.HV) != key:
            continue
        if cell.K is not None:
            if (cell.K, cell.V) == (problem.K, problem.V):
                found[cell.batch] = cell
        elif set(cell.times_us) & set(target.VARIANTS) <= served:
            found[cell.batch] = cell
    return found


def tuned_cell(tuning: TuningFile, problem: Problem, target: ModuleType) -> Cell | None:
    """The tuning file's cell for ``problem``, if the tune measured that very cell."""
    return _problems_cells(tuning, problem, target).get(problem.batch)


def neighbour_cells(tuning: TuningFile, problem: Problem, target: ModuleType) -> list[Cell]:
    """For a batch the tune did not measure: its tuned cells at the nearest batch below and the
    nearest above (same layout, state dtype, T, mode, HV and head dims), those that exist."""
    cells = _problems_cells(tuning, problem, target)
    below = [b for b in cells if b < problem.batch]
    above = [b for b in cells if b > problem.batch]
    return [cells[b] for b in ([max(below)] if below else []) + ([min(above)] if above else [])]


def picker(
    choice: str,
    target: ModuleType,
    *,
    tuning_path: Path | None = None,
    margin: float = CONTENDER_MARGIN,
) -> Callable[[Problem], tuple[list[str], str]]:
    """A function giving, for a problem, the variants to time beside the dispatched call and a
    line saying why those.

    ``choice`` is ``none``, ``all`` (every variant of the target), ``candidates``, ``contenders``
    or a comma list of names. Raises ContenderError for an unknown name or a missing tuning file.
    """
    if choice == "none":
        return lambda problem: ([], "")
    if choice == "all":
        names = list(target.VARIANTS)
        return lambda problem: (names, "all variants of the target")
    if choice == "candidates":
        return lambda problem: (
            problem_variants(target, problem),
            "every variant of the layout, state dtype and head dims",
        )
    if choice == "contenders":
        if tuning_path is None or not tuning_path.is_file():
            raise ContenderError(
                f"--variants contenders needs the target's tuning file; {tuning_path} "
                "does not exist (give it with --tuning)"
            )
        if not 0 <= margin <= 1:
            raise ContenderError(f"--contender-margin must be within [0, 1], got {margin}")
        tuning = read_tuning(tuning_path)

        def contenders(problem: Problem) -> tuple[list[str], str]:
            fitting = problem_variants(target, problem)

            def within(cell: Cell) -> list[str]:
                return [name for name in cell.within(margin) if name in fitting]

            cell = tuned_cell(tuning, problem, target)
            names = within(cell) if cell is not None else []
            if names:
                return names, f"within {100 * margin:g}% of the best in {tuning_path.name}"
            # A batch between tuned ones: whatever is fastest there was close to the best at a
            # neighbouring batch (the dispatch serves it from one of them too).
            neighbours = neighbour_cells(tuning, problem, target)
            names = list(dict.fromkeys(name for c in neighbours for name in within(c)))
            if names:
                batches = " and ".join(f"B={c.batch}" for c in neighbours)
                return names, (
                    f"cell not in {tuning_path.name}: within {100 * margin:g}% of the best at "
                    f"{batches}"
                )
            return (
                fitting,
                "cell not in the tuning file: every variant of the layout, state dtype and head "
                "dims",
            )

        return contenders
    names = [name for name in choice.split(",") if name]
    unknown = [name for name in names if name not in target.VARIANTS]
    if unknown:
        raise ContenderError(
            f"--variants: unknown variant(s) {', '.join(unknown)}; the target has "
            f"{len(target.VARIANTS)} (e.g. {target.VARIANTS[0]}), or use none, all, candidates, "
            "contenders"
        )
    return lambda problem: (names, "named on the command line")
