"""``python -m gdngen.bench.mtp``: gdngen's adapter of vLLM's fused speculative-decode op against
vLLM's own Triton port of that op (docs/design.md, "Measuring").

vLLM 0.33's default speculative decode of a Qwen3.5 GDN layer calls, after its conv update, one
op for the recurrence and the gated RMSNorm: ``torch.ops._C.fused_gdn_decode_post_conv_mtp``, a
CUDA kernel of vLLM's own build. The wheel also carries a Triton port of it with the same
arguments (``vllm/third_party/flash_linear_attention/ops/fused_gdn_decode_post_conv_mtp.py``,
loaded from the bundle ``tools/vllm_bundle.py`` makes; ``--vllm-src`` or ``$GDNGEN_VLLM_SRC``);
gdngen serves the op with ``VllmGdn.fused_gdn_decode_post_conv_mtp`` (gdngen/engines/vllm.py),
one ``gdn_decode`` call with the norm fused. Per cell (state dtype, HV, 1 + S, batch) both run on
vLLM's inputs of plain MTP decode (gdngen.bench.mtp_inputs), side by side in one process as
CUDA graphs over rotating input sets (gdngen.measure.timing).

Before a cell is timed, both run once on copies of the same set, and must agree (``compare``):
every output row written, the outputs within OUTPUT_TOLERANCE, each pool changed in exactly the
slots of the table (every other slot bit-identical), and the written states within
STATE_TOLERANCE. A cell that disagrees (or whose call gdngen refuses) is recorded with the
reason and not timed, and the run exits with status 1 after the other cells.

Writes ``mtp.json`` (after every cell) and ``mtp.md``: per cell the µs of both, port / adapter
and the variant the dispatch picked for the adapter's call; the geometric means per (state
dtype, model) and overall (gdngen.bench.mtp_report). ``--tables A/mtp.json B/mtp.json --out C``
joins the records of runs split over several commands into one report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from functools import partial
from pathlib import Path

import torch

from gdngen.bench.arguments import comma_ints, report_arguments
from gdngen.bench.mtp_inputs import (
    STATE_DTYPES,
    MtpCell,
    cell_grid,
    copy_for_check,
    mtp_set,
    parameters,
    written_slots,
)
from gdngen.bench.mtp_report import ADAPTER, PORT, dump, join, markdown, ratio
from gdngen.engines.vllm import VllmGdn
from gdngen.measure.agreement import STATE_TOLERANCE, Disagreement, changed_slots, slot_error
from gdngen.measure.environment import environment
from gdngen.measure.summary import relative_error
from gdngen.measure.timing import copy_bandwidth, rotating_sets, time_side_by_side
from gdngen.measure.vllm_kernels import SOURCE_ENV, vllm_kernels

#: the outputs of the two, relative to the port's (in norm over the whole output). Rounding to
#: bf16 moves an element by at most 2^-8 of it (its unit roundoff), 2^-8 / sqrt(3) in rms over
#: many elements. Both store the output in bf16, and the port also rounds the recurrence's output
#: to bf16 before its norm (docs/design.md, "The gated RMSNorm epilogue"), which the norm carries
#: through: three roundings, under 2^-8 in rms together, so 2^-7 leaves a factor of two. A wrong
#: slot, head, gate or token order is off by O(1).
OUTPUT_TOLERANCE = 2**-7


def compare(before: torch.Tensor, theirs: dict, ours: dict, state_dtype: str) -> dict:
    """The port's call (``theirs``: its arguments as the call left them) against the adapter's
    (``ours``) on copies of one set whose pool was ``before``: ``{"output", "state"}`` relative
    errors, or Disagreement naming what differs."""
    expected = written_slots(theirs).to(before.device)
    for who, args in ((PORT, theirs), (ADAPTER, ours)):
        unwritten = int(args["out"].isnan().flatten(1).any(1).sum())
        if unwritten:
            raise Disagreement(f"{who}: {unwritten} output row(s) left unwritten or NaN")
        changed = changed_slots(args["state"], before)
        if not torch.equal(changed, expected):
            missed = sorted(set(expected.tolist()) - set(changed.tolist()))
            stray = sorted(set(changed.tolist()) - set(expected.tolist()))
            raise Disagreement(
                f"{who}: the pool's changed slots are not the table's: {len(missed)} slot(s) of "
                f"the table unwritten (first {missed[:4]}), {len(stray)} other slot(s) changed "
                f"(first {stray[:4]})"
            )
    errors = dict(
        output=relative_error(ours["out"], theirs["out"]),
        state=slot_error(ours["state"], theirs["state"], expected),
    )
    bounds = dict(output=OUTPUT_TOLERANCE, state=STATE_TOLERANCE[state_dtype])
    for what, error in errors.items():
        if not error <= bounds[what]:
            raise Disagreement(
                f"the {what}s differ: relative error {error:.3g} > {bounds[what]:.3g}"
            )
    return errors


def check_cell(s: dict, port, adapter, state_dtype: str) -> dict:
    """Both calls once, each on its own copy of set ``s`` (whose pool stays as it was), then
    ``compare``."""
    theirs, ours = copy_for_check(s), copy_for_check(s)
    port(**theirs)
    adapter(**ours)
    if s["state"].is_cuda:
        torch.cuda.synchronize()
    return compare(s["state"], theirs, ours, state_dtype)


def dispatched_variant(gdn_decode, s: dict) -> str:
    """The variant the dispatch picks for the adapter's call on ``s``: the adapter maps the op's
    arguments onto gdn_decode's (recorded here, nothing launched), and ``gdn_decode.prepare``
    names the kernel that call would launch."""
    recorded: dict = {}

    def record(**arguments):
        recorded.update(arguments)
        return arguments["output"], arguments["initial_state"]

    VllmGdn(record).fused_gdn_decode_post_conv_mtp(**s)
    return gdn_decode.prepare(**recorded)


def run_cell(cell: MtpCell, target, port, device: str = "cuda") -> dict:
    """One cell: its input sets, the variant, the check, and (if both agree) the timing.
    ``target``: a generated target (its ``gdn_decode``); ``port``: vLLM's op."""
    record = dict(
        batch=cell.batch, tokens=cell.tokens, H=cell.H, HV=cell.HV, K=cell.K, V=cell.V,
        model=cell.model, state_dtype=cell.state_dtype,
    )  # fmt: skip
    params = parameters(cell, device)
    sets = [mtp_set(cell, params, i, device) for i in range(rotating_sets(cell.moved_bytes()))]
    adapter = VllmGdn(target.gdn_decode).fused_gdn_decode_post_conv_mtp
    record["sets"] = len(sets)
    try:
        record["variant"] = dispatched_variant(target.gdn_decode, sets[0])
    except (TypeError, ValueError, LookupError) as refusal:
        return dict(record, us=None, not_timed=f"gdngen refuses the call: {refusal}")
    try:
        record["errors"] = check_cell(sets[0], port, adapter, cell.state_dtype)
    except Disagreement as disagreement:
        return dict(record, us=None, not_timed=f"disagrees: {disagreement}")
    us = time_side_by_side(
        {
            PORT: [partial(port, **s) for s in sets],
            ADAPTER: [partial(adapter, **s) for s in sets],
        }
    )
    return dict(record, us=us, ratio=ratio(us))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gdngen.bench.mtp", description=__doc__.split("\n")[0]
    )
    report_arguments(p, "mtp")
    p.add_argument("--batches", type=partial(comma_ints, "--batches"), default="1,4,16,64,256")
    p.add_argument(
        "--tokens", type=partial(comma_ints, "--tokens"), default="2,4",
        help="1 + S: tokens per request (the target token and S drafts)",
    )  # fmt: skip
    p.add_argument(
        "--heads", type=partial(comma_ints, "--heads"), default="32,64",
        help="HV: 32 is Qwen3-Next's geometry, 64 Qwen3.5's (H = 16, K = V = 128)",
    )  # fmt: skip
    p.add_argument(
        "--dtypes", type=lambda text: text.split(","), default="bf16,fp32",
        help=f"state dtypes, of {', '.join(STATE_DTYPES)}",
    )  # fmt: skip
    p.add_argument(
        "--vllm-src", default=None,
        help=f"vLLM's source: a folder or .tar.xz that tools/vllm_bundle.py made (default "
        f"${SOURCE_ENV})",
    )  # fmt: skip
    return p


def parse_args(argv=None) -> tuple[argparse.Namespace, list[MtpCell]]:
    """The arguments and the cells they ask for; a bad value exits with the parser's error."""
    p = parser()
    args = p.parse_args(argv)
    try:
        cells = cell_grid(args.batches, args.tokens, args.heads, args.dtypes)
    except ValueError as error:
        p.error(str(error))
    if not cells:
        p.error(
            "the grid is empty: every one of --batches, --tokens, --heads, --dtypes needs a value"
        )
    return args, cells


def write_report(out: Path, records: list[dict], env: dict) -> None:
    text = markdown(records, env)
    (out / "mtp.md").write_text(text)
    print(text)


def tables(paths: list[Path], out: Path) -> int:
    """One report of the records of several runs (``--tables``)."""
    records, env = join([json.loads(path.read_text()) for path in paths])
    out.mkdir(parents=True, exist_ok=True)
    (out / "mtp.json").write_text(dump(records, env))
    write_report(out, records, env)
    return 1 if any(r["us"] is None for r in records) else 0


def main(argv=None) -> int:
    args, cells = parse_args(argv)
    if args.tables:
        return tables(args.tables, args.out)
    vllm = vllm_kernels(args.vllm_src)
    if isinstance(vllm, str):
        print(f"vLLM's Triton port is needed: {vllm}", file=sys.stderr)
        return 2
    target = importlib.import_module(f"generated.{args.target}")
    env = dict(environment(), copy_GBps=copy_bandwidth() / 1e9, vllm=vllm.version,
               vllm_source=vllm.source, target=args.target)  # fmt: skip
    print(f"vLLM's port: {env['vllm']}; {len(cells)} cells", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for cell in cells:
        records.append(run_cell(cell, target, vllm.mtp_decode))
        torch.cuda.empty_cache()  # the next cell's pools differ in size
        print(json.dumps(records[-1]), flush=True)
        (args.out / "mtp.json").write_text(dump(records, env))
    write_report(args.out, records, env)
    return 1 if any(r["us"] is None for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
