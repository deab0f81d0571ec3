"""``python -m gdngen.bench.fi_forms``: gdn_decode against FlashInfer 0.7.2, form by form.

FlashInfer's decode call forms, gdngen's ``gdn_decode`` against FlashInfer's own kernel for each,
side by side (docs/design.md, "Measuring").

The forms (gdngen.bench.fi_forms_inputs.FORMS): the per-token scatter ``ssm_state_indices``,
strided pools (T = 1, and with the scatter), negative ``output_state_indices`` entries,
``enable_pdl=True``, and the recovery forms of FlashInfer's bf16-state module (``accepted_steps``
with state updates, ``recovery_steps``, ``accepted_steps`` with ``disable_state_update`` or with
the scatter). A cell is a form, a state dtype FlashInfer serves it with, HV (32 or 64; H = 16,
K = V = 128), T (1 for the pretranspose forms, ``--tokens`` for the others) and a batch. Both
sides run on the same input sets (one generator for every form), timed in one process as CUDA
graphs over rotating sets (gdngen.measure.timing).

Before a cell is timed, each side runs once on set 0, FlashInfer first, the pool put back
between (``check_cell``). They must agree: every output the form defines written and within
OUTPUT_TOLERANCE, the pool changed in exactly the slots the form writes (slot 0, FlashInfer's null
buffer, aside; every other slot, and a strided pool's buffer outside its view, bit-identical),
the written states within the state dtype's tolerance (gdngen.measure.agreement). A cell that
disagrees, whose call gdngen refuses (a keyword it does not take is a TypeError) or whose call
fails is recorded with the reason and not timed, and the run exits with status 1 after the other
cells. A cell FlashInfer does not serve is recorded as skipped.

Writes ``fi_forms.json`` (after every cell) and ``fi_forms.md`` to ``--out``: per form and cell
the µs of both, FlashInfer / gdngen and the variant the dispatch picked; per form the cells where
gdngen is slower and the geometric mean (gdngen.bench.fi_forms_report). ``--forms`` and
``--batches`` split the grid over several commands; ``--tables A/fi_forms.json B/fi_forms.json
--out C`` joins their records into one report. ``--isolate`` runs each form in a process of its
own and joins them: a CUDA fault (an illegal address ends the process) then costs one form's
remaining cells, not the run's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from gdngen.bench.arguments import comma_ints, comma_words, report_arguments
from gdngen.bench.fi_forms_inputs import (
    FORMS,
    NULL_SLOT,
    STATE_DTYPES,
    FiCell,
    cell_grid,
    cell_sets,
    defined_outputs,
    gdngen_arguments,
    outside_views,
    pool_slots,
    pool_view,
    written_slots,
)
from gdngen.bench.fi_forms_peer import FlashInferForms
from gdngen.bench.fi_forms_report import FLASHINFER, GDNGEN, dump, join, markdown, ratio
from gdngen.measure.agreement import STATE_TOLERANCE, Disagreement, changed_slots
from gdngen.measure.environment import environment
from gdngen.measure.summary import relative_error
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side

#: the outputs of the two, relative to FlashInfer's (in norm over the outputs the form defines).
#: Both compute in fp32 from the same inputs and store the output in bf16: each is within 2^-8
#: of the float64 reference by the project's contract (tests/compare.py, NORM_TOL), one rounding
#: to bf16 and fp32 arithmetic, so the two are within 2^-7 of each other. A bf16 state stored
#: mid-call (the recovery forms) and read back, or carried on in fp32, moves the later tokens'
#: outputs by one bf16 rounding of the state, inside the same bound. A wrong slot, head, gate or
#: token order is off by O(1).
OUTPUT_TOLERANCE = 2**-7
#: the forms run by default (all of them), and the T of the forms that are not T = 1
DEFAULT_FORMS = ",".join(FORMS)
DEFAULT_TOKENS = "4"


class CallFailed(Exception):
    """One side's call raised during the check."""


@dataclass
class Outcome:
    """What one call left: its outputs, the pool's changed slots (the null slot aside), the slots
    whose part of the buffer outside a strided pool's view changed, and the states in the slots
    the form writes (in ``written_slots`` order)."""

    output: torch.Tensor
    changed: torch.Tensor
    outside: torch.Tensor
    states: torch.Tensor


def observe(call, cell: FiCell, s: dict, before: torch.Tensor, slots: torch.Tensor) -> Outcome:
    """Run ``call`` once on set ``s`` (its output first filled with NaN, so that an output left
    unwritten shows) and read what it left against ``before``, a copy of the buffer from before
    the call; ``slots`` are those the form writes."""
    s["out"].fill_(float("nan"))
    call()
    if s["out"].is_cuda:
        torch.cuda.synchronize()
    changed = changed_slots(s["pool"], pool_view(cell, before))
    outside = [
        changed_slots(part, part_before)
        for part, part_before in zip(outside_views(cell, s["buffer"]), outside_views(cell, before))
    ]
    return Outcome(
        output=s["out"].clone(),
        changed=changed[changed != NULL_SLOT],
        outside=torch.cat(outside).unique() if outside else changed[:0],
        states=s["pool"].index_select(0, slots.to(s["pool"].device)),
    )


def compare(
    theirs: Outcome, ours: Outcome, expected: torch.Tensor, defined: torch.Tensor, state_dtype: str
) -> dict:
    """FlashInfer's outcome (``theirs``) against gdngen's (``ours``) on one set: ``{"output",
    "state"}`` relative errors, or Disagreement naming what differs. ``expected``: the slots the
    form writes, sorted; ``defined``: [B, T], the outputs the form defines."""
    expected = expected.to(theirs.changed.device)
    for who, outcome in ((FLASHINFER, theirs), (GDNGEN, ours)):
        rows = outcome.output[defined.to(outcome.output.device)]
        unwritten = int(rows.isnan().flatten(1).any(1).sum())
        if unwritten:
            raise Disagreement(
                f"{who}: {unwritten} output row(s) of the form's left unwritten or NaN"
            )
        if not torch.equal(outcome.changed, expected):
            missed = sorted(set(expected.tolist()) - set(outcome.changed.tolist()))
            stray = sorted(set(outcome.changed.tolist()) - set(expected.tolist()))
            raise Disagreement(
                f"{who}: the pool's changed slots are not the form's: {len(missed)} slot(s) it "
                f"writes unchanged (first {missed[:4]}), {len(stray)} other slot(s) changed "
                f"(first {stray[:4]})"
            )
        if outcome.outside.numel():
            raise Disagreement(
                f"{who}: the buffer outside the pool's view changed in {outcome.outside.numel()} "
                f"slot(s) (first {outcome.outside.tolist()[:4]})"
            )
    mask = defined.to(theirs.output.device)
    errors = dict(
        output=relative_error(ours.output[mask], theirs.output[mask]) if mask.any() else 0.0,
        state=relative_error(ours.states, theirs.states) if expected.numel() else 0.0,
    )
    bounds = dict(output=OUTPUT_TOLERANCE, state=STATE_TOLERANCE[state_dtype])
    for what, error in errors.items():
        if not error <= bounds[what]:
            raise Disagreement(
                f"the {what}s differ: relative error {error:.3g} > {bounds[what]:.3g}"
            )
    return errors


def check_cell(cell: FiCell, s: dict, theirs, ours) -> dict:
    """FlashInfer's call (``theirs``) then gdngen's (``ours``) once each on set ``s``, its pool
    put back before each, then ``compare``. A call that raises is a CallFailed naming its side."""
    expected = written_slots(cell, s)
    before = s["buffer"].clone()
    outcomes = []
    for who, call in ((FLASHINFER, theirs), (GDNGEN, ours)):
        s["buffer"].copy_(before)
        try:
            outcomes.append(observe(call, cell, s, before, expected))
        except Exception as exc:  # noqa: BLE001 - the side and the error go into the record
            raise CallFailed(f"{who}'s call fails: {type(exc).__name__}: {exc}") from exc
    s["buffer"].copy_(before)
    defined = defined_outputs(cell, s)
    try:
        return compare(*outcomes, expected, defined, cell.state_dtype)
    except Disagreement as disagreement:
        # Which side is off: each one's outputs against the float64 recurrence on these inputs.
        errors = reference_errors(cell, s, outcomes, defined)
        raise Disagreement(
            f"{disagreement}; against the float64 reference: {FLASHINFER} {errors[0]:.3g}, "
            f"{GDNGEN} {errors[1]:.3g}"
        ) from None


def reference_errors(cell: FiCell, s: dict, outcomes: list, defined: torch.Tensor) -> list:
    """Each outcome's output error (relative, over the outputs the form defines) against the
    float64 reference of the form (gdngen.reference.reference_call) on set ``s``, whose pool
    holds the state from before the calls."""
    from gdngen.reference import reference_call

    args = gdngen_arguments(cell, s)
    want = reference_call(
        args["q"], args["k"], args["v"], args["initial_state"], args["A_log"], args["a"],
        args["dt_bias"], args["b"], scale=args["scale"], read_slots=args["initial_state_indices"],
        write_slots=args.get("output_state_indices"), token_slots=args.get("ssm_state_indices"),
        disable_state_update=args.get("disable_state_update", False),
        accepted_steps=args.get("accepted_steps"), recovery_steps=args.get("recovery_steps", 0),
    )  # fmt: skip
    mask = defined.to(want.output.device)
    return [relative_error(o.output[mask].double(), want.output[mask]) for o in outcomes]


def run_cell(cell: FiCell, target, flashinfer, slots: int, device: str = "cuda") -> dict:
    """One cell: FlashInfer's verdict on it, its input sets, the variant, the check, and (if the
    two agree) the timing. ``target``: a generated target (its ``gdn_decode``); ``flashinfer``:
    a FlashInferForms; ``slots``: the pool's size (``pool_slots``)."""
    started = time.perf_counter()
    record = cell.record()
    if cell.form.pdl:
        record["flashinfer_pdl"] = flashinfer.takes_pdl
    skipped = cell.flashinfer_refuses()
    if skipped:
        return dict(record, us=None, skipped=skipped)
    sets = cell_sets(cell, rotating_sets(cell.moved_bytes()), slots, device)
    record.update(sets=len(sets), pool_slots=slots)
    ours = [partial(target.gdn_decode, **gdngen_arguments(cell, s)) for s in sets]
    theirs = [flashinfer.call(cell, s) for s in sets]

    def untimed(why: str) -> dict:
        return dict(record, us=None, not_timed=why, seconds=time.perf_counter() - started)

    try:
        record["variant"] = target.gdn_decode.prepare(**gdngen_arguments(cell, sets[0]))
    except (TypeError, ValueError, LookupError) as refusal:
        return untimed(f"gdngen refuses the call: {refusal}")
    try:
        record["errors"] = check_cell(cell, sets[0], theirs[0], ours[0])
    except Disagreement as disagreement:
        return untimed(f"disagrees: {disagreement}")
    except CallFailed as failure:
        return untimed(str(failure))
    us = time_side_by_side({FLASHINFER: theirs, GDNGEN: ours})
    return dict(record, us=us, ratio=ratio(us), seconds=time.perf_counter() - started)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gdngen.bench.fi_forms", description=__doc__.split("\n")[0]
    )
    report_arguments(p, "fi_forms")
    p.add_argument(
        "--forms", type=comma_words, default=DEFAULT_FORMS, help=f"of {', '.join(FORMS)}"
    )
    p.add_argument("--batches", type=partial(comma_ints, "--batches"), default="1,4,16,64,256")
    p.add_argument(
        "--tokens", type=partial(comma_ints, "--tokens"), default=DEFAULT_TOKENS,
        help="T of the forms that are not T = 1 (2..8; e.g. 2,4,8)",
    )  # fmt: skip
    p.add_argument(
        "--heads", type=partial(comma_ints, "--heads"), default="32,64",
        help="HV: 32 is Qwen3-Next's geometry, 64 Qwen3.5's (H = 16, K = V = 128)",
    )  # fmt: skip
    p.add_argument(
        "--dtypes", type=comma_words, default=",".join(STATE_DTYPES),
        help="state dtypes (a form runs those FlashInfer serves it with)",
    )  # fmt: skip
    p.add_argument(
        "--isolate", action="store_true",
        help="run each form in a process of its own, then join their records: a CUDA fault "
        "in one form ends only that form's process",
    )  # fmt: skip
    p.add_argument(
        "--variants", type=comma_words, default="",
        help="time these variants of the target (no dispatch) in every cell, one after another: "
        "how a dispatch rule for a form is chosen",
    )  # fmt: skip
    return p


class Pinned:
    """A target whose ``gdn_decode`` is one variant's call, with no dispatch."""

    def __init__(self, target, name: str):
        self.gdn_decode = target.variant(name)


def parse_args(argv=None) -> tuple[argparse.Namespace, list[FiCell]]:
    """The arguments and the cells they ask for; a bad value exits with the parser's error."""
    p = parser()
    args = p.parse_args(argv)
    if args.tables:
        return args, []
    unknown = sorted(set(args.dtypes) - set(STATE_DTYPES))
    if unknown:
        p.error(f"--dtypes: expected state dtypes of {', '.join(STATE_DTYPES)}; got {unknown}")
    try:
        cells = cell_grid(args.forms, args.dtypes, args.heads, args.tokens, args.batches)
    except ValueError as error:
        p.error(str(error))
    if not cells:
        p.error("the grid is empty: no form of --forms is served with a state dtype of --dtypes")
    return args, cells


def write_report(out: Path, records: list[dict], env: dict) -> None:
    text = markdown(records, env)
    (out / "fi_forms.md").write_text(text)
    print(text)


def exit_status(records: list[dict]) -> int:
    """1 if a cell was not timed (refused, disagreeing or failing), else 0; a cell FlashInfer
    does not serve is no failure."""
    return 1 if any(r.get("not_timed") for r in records) else 0


def tables(paths: list[Path], out: Path) -> int:
    """One report of the records of several runs (``--tables``)."""
    records, env = join([json.loads(path.read_text()) for path in paths])
    out.mkdir(parents=True, exist_ok=True)
    (out / "fi_forms.json").write_text(dump(records, env))
    write_report(out, records, env)
    return exit_status(records)


def _without(argv: list[str], flags: tuple[str, ...], valued: tuple[str, ...]) -> list[str]:
    """``argv`` less the ``flags`` and the ``valued`` options with their values (``--x v`` or
    ``--x=v``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags or arg.split("=", 1)[0] in valued and "=" in arg:
            continue
        elif arg in valued:
            skip = True
        else:
            kept.append(arg)
    return kept


def isolated(argv: list[str], forms: list[str], out: Path) -> int:
    """``--isolate``: each form in a child process of this bench (the same arguments, the form
    alone, its own folder ``out/<form>``), then one report of every record the children wrote
    (a child that died keeps the cells it wrote before). 1 if a child failed or a cell was not
    timed, else 0."""
    kept = _without(argv, ("--isolate",), ("--forms", "--out"))
    paths, status = [], 0
    for form in forms:
        folder = out / form
        command = [sys.executable, "-m", "gdngen.bench.fi_forms", *kept, "--forms", form]
        child = subprocess.run([*command, "--out", str(folder)])
        status = 1 if child.returncode else status
        if (folder / "fi_forms.json").is_file():
            paths.append(folder / "fi_forms.json")
        if child.returncode not in (0, 1):
            print(f"fi_forms: form {form}: its process ended with status {child.returncode}",
                  file=sys.stderr)  # fmt: skip
    if not paths:
        return 1
    return max(status, tables(paths, out))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, cells = parse_args(argv)
    if args.tables:
        return tables(args.tables, args.out)
    if args.isolate:
        return isolated(argv, args.forms, args.out)
    flashinfer = FlashInferForms()
    if flashinfer.missing:
        print(f"FlashInfer is needed: {flashinfer.missing}", file=sys.stderr)
        return 2
    target = importlib.import_module(f"generated.{args.target}")
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9, flashinfer=flashinfer.version,
               target=args.target)  # fmt: skip
    sizes = pool_slots(cells, lambda cell: rotating_sets(cell.moved_bytes()))
    print(f"FlashInfer {env['flashinfer']}; {len(cells)} cells", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    served = [Pinned(target, name) for name in args.variants] or [target]
    for cell in cells:
        for callee in served:
            records.append(run_cell(cell, callee, flashinfer, sizes[cell.group]))
            torch.cuda.empty_cache()  # the next cell's pool differs in size
            print(json.dumps(records[-1]), flush=True)
            (args.out / "fi_forms.json").write_text(dump(records, env))
    write_report(args.out, records, env)
    return exit_status(records)


if __name__ == "__main__":
    sys.exit(main())
