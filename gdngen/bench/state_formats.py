"""``python -m gdngen.bench.state_formats``: the state formats side by side (docs/design.md,
"Quantized state"): the same call on a pool of each format (bf16, fp32, int8, fp8 e4m3, ...)
through the target's dispatch, and at T = 1 FlashInfer's decode on a bf16 pool, in one process
as CUDA graphs over rotating input sets (gdngen.measure.timing).

A cell is (HV, T, B), K = V = 128. At T = 1 the call is dense rows with ``[B]`` slots
(``Problem``). At T > 1, ``--form spec`` (the default) is vLLM's verify form: B sequences of T
tokens packed, a ``[B, T]`` per-token slot table, every token's state stored in the pool
(``PackedProblem``); ``--form cache`` the verify cache's (FlashInfer's MTP, SGLang's target
verify): dense rows with ``[B]`` slots, every token's state stored into a cache of the pool's
format (a quantized one with its scales), no final state written.

Before a cell is timed, each format's call runs once on its first input set and its output is
compared with the float64 reference's on the same pool (dequantized for a quantized format):
within the check tolerance of its state dtype (gdngen.measure.check), or the cell is recorded
with the reason, not timed, and the run exits with status 1 after the other cells.

Writes ``state_formats.json`` (after every cell) and ``state_formats.md``: per cell each
entry's µs, bf16 over each other format and FlashInfer's bf16 over each, and the variant the
dispatch picked per format.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from functools import partial
from pathlib import Path

import torch

from gdngen.bench.arguments import comma_ints, comma_words
from gdngen.measure.check import check_tolerance
from gdngen.measure.environment import environment
from gdngen.measure.impls import FlashInfer
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.problem import PackedProblem, Problem, state_copy
from gdngen.reference.decode import reference_call
from gdngen.terms import STATE_BYTES

#: the entry of FlashInfer's bf16 state, as ``us`` names it
FLASHINFER = "flashinfer bf16"
#: the format the others are compared with
BASELINE = "bf16"
#: a 16-bit or fp32 state's output against the float64 reference's, in norm: the output is
#: stored in bf16 (2^-8 an element at most) and the dots run in fp32; a wrong slot, head or gate
#: is off by O(1). A quantized state's is its own, wider (gdngen.measure.check).
OUTPUT_TOL = 2**-6
REPORT = "state_formats"


#: the call forms at T > 1 (the module docstring says which is which)
FORMS = ("spec", "cache")


def cell_problem(
    HV: int, T: int, B: int, state_dtype: str, form: str = "spec"
) -> Problem | PackedProblem:
    """The cell's call on a pool of ``state_dtype`` (the module docstring says which form)."""
    if T == 1:
        return Problem(batch=B, HV=HV, pool_size=B + 8, state_dtype=state_dtype)
    if form == "cache":
        return Problem(
            batch=B, tokens=T, HV=HV, pool_size=B + 8, cache_steps=T, disable_state_update=True,
            state_dtype=state_dtype,
        )  # fmt: skip
    return PackedProblem(sequences=B, tokens=T, HV=HV, uniform_seqlen=True, state_dtype=state_dtype)


def output_error(problem, args: dict, output: torch.Tensor) -> float:
    """Relative error (in norm) of a call's ``output`` against the float64 reference's on the
    pool ``args`` held before the call (padding rows excluded)."""
    packed = isinstance(problem, PackedProblem)
    expected = reference_call(
        args["q"], args["k"], args["v"], state_copy(args), args["A_log"], args["a"],
        args["dt_bias"], args["b"], read_slots=args["initial_state_indices"],
        null_slot=args.get("null_slot", -1), cu_seqlens=args.get("cu_seqlens") if packed else None,
        num_accepted=args.get("num_accepted_tokens") if packed else None,
    ).output  # fmt: skip
    live = ~torch.isnan(expected)
    ref = expected[live]
    got = output.to(ref.device)[live].double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def run_cell(
    target, HV: int, T: int, B: int, formats: list[str], replays: int, form: str = "spec"
) -> dict:
    record = dict(HV=HV, T=T, B=B, us=None, variants={}, errors={})
    runs = {}
    for fmt in formats:
        problem = cell_problem(HV, T, B, fmt, form)
        states = B * T * HV * 128 * 128
        count = rotating_sets(int(2 * states * (STATE_BYTES[fmt] + 4 / 128)))
        sets = [problem.with_(seed=seed).make("cuda") for seed in range(count)]
        outputs = [torch.empty(s["v"].shape, dtype=torch.bfloat16, device="cuda") for s in sets]
        record["variants"][fmt] = target.gdn_decode.prepare(**sets[0], output=outputs[0])
        first = dict(sets[0])
        for name in ("initial_state", "state_scales"):
            if first.get(name) is not None:
                first[name] = first[name].clone()
        target.gdn_decode(**first, output=outputs[0])
        error = output_error(problem, sets[0], outputs[0])
        record["errors"][fmt] = error
        if not error <= check_tolerance(fmt, OUTPUT_TOL):
            record["not_timed"] = f"{fmt}: output off the reference by {error:.3g}"
            return record
        runs[fmt] = [
            partial(target.gdn_decode, **s, output=o) for s, o in zip(sets, outputs)
        ]  # fmt: skip
    peer = FlashInfer()
    base = cell_problem(HV, T, B, BASELINE)
    if T == 1 and peer.supports(base) is None:
        count = rotating_sets(2 * B * HV * 128 * 128 * 2)
        runs[FLASHINFER] = [
            peer.bind(base, base.with_(seed=s).make("cuda")).run for s in range(count)
        ]
    record["us"] = time_side_by_side(runs, replays=replays)
    return record


def markdown(records: list[dict], env: dict) -> str:
    formats = [f for f in env["formats"] if f != BASELINE]
    lines = [
        f"# State formats side by side ({env.get('gpu', '?')}, target {env['target']})",
        "",
        f"Call form at T > 1: {env.get('form', 'spec')} (python -m gdngen.bench.state_formats "
        "--help says which).",
        "",
        f"Copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s. µs per call; `bf16 / X` above 1: "
        "X is faster than gdngen's bf16 state; `FlashInfer / X`: FlashInfer's bf16 state over X.",
        "",
    ]
    entries = env["formats"] + [FLASHINFER]
    head = ["HV", "T", "B"] + [f"{e} µs" for e in entries]
    head += [f"bf16 / {f}" for f in formats] + [f"FlashInfer / {f}" for f in formats]
    head += [f"{f} variant" for f in env["formats"]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        row = [str(r["HV"]), str(r["T"]), str(r["B"])]
        us = r.get("us")
        if us is None:
            lines.append("| " + " | ".join(row) + f" | not timed: {r.get('not_timed')} |")
            continue
        row += [f"{us[e]:.2f}" if e in us else "n/a" for e in entries]
        row += [f"{us[BASELINE] / us[f]:.3f}" for f in formats]
        row += [f"{us[FLASHINFER] / us[f]:.3f}" if FLASHINFER in us else "n/a" for f in formats]
        row += [f"`{r['variants'][f]}`" for f in env["formats"]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m gdngen.bench.state_formats", description=__doc__)
    p.add_argument("--target", default="h200", help="the generated target (generated.<target>)")
    p.add_argument("--out", type=Path, required=True, help=f"folder for {REPORT}.json and .md")
    p.add_argument("--heads", type=partial(comma_ints, "--heads"), default=[64, 32])
    p.add_argument("--tokens", type=partial(comma_ints, "--tokens"), default=[1, 4, 8])
    p.add_argument(
        "--batches", type=partial(comma_ints, "--batches"), default=None,
        help="batch sizes of every T (default: 1,4,16,64,256,512 at T = 1, fewer at T > 1)",
    )  # fmt: skip
    p.add_argument("--formats", type=comma_words, default=["bf16", "fp32", "int8", "fp8_e4m3"])
    p.add_argument("--form", choices=FORMS, default="spec", help="the call form at T > 1")
    p.add_argument("--replays", type=int, default=10)
    args = p.parse_args(argv)
    unknown = [f for f in args.formats if f not in STATE_BYTES]
    if unknown:
        p.error(f"--formats: expected state dtypes of {sorted(STATE_BYTES)}; got {unknown}")
    if BASELINE not in args.formats:
        p.error(f"--formats: the comparison needs {BASELINE}; got {args.formats}")
    if any(t < 1 for t in args.tokens) or any(b < 1 for b in args.batches or [1]):
        p.error("--tokens and --batches: expected positive integers")
    return args


#: the batch sizes of a T when --batches is not given
DEFAULT_BATCHES = {1: [1, 4, 16, 64, 256, 512]}


def cells(args) -> list[tuple[int, int, int]]:
    return [
        (HV, T, B)
        for HV in args.heads
        for T in args.tokens
        for B in (args.batches or DEFAULT_BATCHES.get(T, [1, 16, 64, 256, 512]))
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    target = importlib.import_module(f"generated.{args.target}")
    missing = [f for f in args.formats if ("k_last", f) not in target.INFO.served]
    if missing:
        print(f"--formats: target {args.target} does not serve K-last {missing}", file=sys.stderr)
        return 2
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9, target=args.target)
    env.update(formats=args.formats, gpu=torch.cuda.get_device_name(), form=args.form)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for HV, T, B in cells(args):
        records.append(run_cell(target, HV, T, B, args.formats, args.replays, args.form))
        torch.cuda.empty_cache()
        print(json.dumps(records[-1]), flush=True)
        (args.out / f"{REPORT}.json").write_text(json.dumps(dict(env=env, records=records)))
    text = markdown(records, env)
    (args.out / f"{REPORT}.md").write_text(text)
    print(text)
    return 1 if any(r["us"] is None for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
