"""`gdngen bench`: the side-by-side benchmark of docs/design.md ("Measuring") as a command."""

from __future__ import annotations

import argparse
import datetime
import importlib
import shlex
import signal
import sys
from dataclasses import asdict
from pathlib import Path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _words(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="h200", help="generated target to run (default h200)")
    parser.add_argument("--tokens", type=_ints, default=[1], help="T values, e.g. 1 or 2,4,8")
    parser.add_argument("--batch", type=_ints, default=[1, 4, 16, 64, 256, 512])
    parser.add_argument(
        "--hv", type=_ints, default=[32, 64], help="value heads, multiples of --qk-heads"
    )
    parser.add_argument(
        "--qk-heads",
        type=int,
        default=16,
        help="q/k heads (default 16, the shipped models at TP 1; 8, 4 and 2 are their TP 2, 4 "
        "and 8 shards, e.g. --qk-heads 2 --hv 4,6,8; not --h, which other tools read as --help)",
    )
    parser.add_argument(
        "--head-dim",
        type=_ints,
        default=[128],
        help="head dims K = V (default 128), e.g. 64,128,256: each with --qk-heads and --hv of a "
        "geometry the target serves (the shipped specs' head-dim-64 and head-dim-256 are H 16, "
        "HV 32)",
    )
    parser.add_argument("--layout", type=_words, default=["k_last", "v_last"])
    parser.add_argument("--state-dtype", type=_words, default=["bf16", "fp32"])
    parser.add_argument(
        "--mode",
        type=_words,
        default=["update"],
        help="update (final state written, no cache) and/or verify (cache, no final write)",
    )
    parser.add_argument(
        "--variants",
        default="none",
        help="single variants to time side by side with the dispatched call in each cell: none, "
        "all, candidates (every variant of the cell's layout and state dtype), contenders (those "
        "the tuning file timed within --contender-margin of the cell's best), or a comma list",
    )
    parser.add_argument(
        "--tuning",
        default=None,
        help="tuning file for --variants contenders (default: the running GPU model's, e.g. "
        "specs/TARGET.tuning.yaml or specs/TARGET.tuning.h100.yaml)",
    )
    parser.add_argument("--contender-margin", type=float, default=None, help="default 0.10")
    parser.add_argument("--peers", type=_words, default=["flashinfer", "fla"], help="or: none")
    parser.add_argument("--replays", type=int, default=25)
    parser.add_argument(
        "--out", default=None, help="write OUT.json (machine-readable) and OUT.md (table)"
    )
    parser.add_argument(
        "--gpu-lock",
        metavar="FILE",
        help="share the GPU with other bench or tune processes naming the same FILE: compiles "
        "run side by side, GPU work (inputs, checks, timings) in turns",
    )


def running_gpus_tuning_file(target) -> Path:
    """The tuning file of the GPU model this process runs on, per the target's spec (the spec's
    default one without a GPU, or for a model the spec does not list)."""
    import torch

    from gdngen.spec import load_spec
    from gdngen.tune.tuning_file import default_path, tuning_path_for_gpu

    spec_path = Path(target.INFO.spec or f"specs/{target.INFO.name}.yaml")
    if not spec_path.is_file():
        return default_path(spec_path)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return tuning_path_for_gpu(spec_path, load_spec(spec_path), gpu)


def run(args: argparse.Namespace, argv_for_record: list[str]) -> int:
    import torch

    from .contenders import CONTENDER_MARGIN, ContenderError, picker

    try:
        target = importlib.import_module(f"generated.{args.target}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("generated", f"generated.{args.target}"):
            raise  # the target exists but something it imports is missing: show that
        print(
            f"gdngen bench: --target {args.target!r}: no generated target generated/{args.target}/ "
            f"(emit it with gdngen emit specs/{args.target}.yaml)",
            file=sys.stderr,
        )
        return 2
    uneven = [hv for hv in args.hv if args.qk_heads < 1 or hv % args.qk_heads]
    if uneven:
        print(
            f"gdngen bench: --hv: value heads must be multiples of --qk-heads {args.qk_heads}; "
            f"got {uneven}",
            file=sys.stderr,
        )
        return 2
    info = target.INFO
    unserved = [
        f"H={args.qk_heads} HV={hv} K=V={d}"
        for d in args.head_dim
        for hv in args.hv
        if not info.serves_geometry(args.qk_heads, hv, d, d)
    ]
    if unserved:
        print(
            f"gdngen bench: --head-dim/--hv/--qk-heads: {args.target} serves no geometry "
            f"{', '.join(unserved)}; it serves {info.served_geometries()}. "
            + info.add_to_spec("each geometry under `geometries:`"),
            file=sys.stderr,
        )
        return 2
    tuning = Path(args.tuning) if args.tuning else running_gpus_tuning_file(target)
    try:
        variants_for = picker(
            args.variants, target, tuning_path=tuning,
            margin=CONTENDER_MARGIN if args.contender_margin is None else args.contender_margin,
        )  # fmt: skip
    except ContenderError as exc:
        print(f"gdngen bench: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gdngen bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    from gdngen.measure.environment import environment
    from gdngen.measure.gpu_turns import gpu_turns
    from gdngen.measure.impls import FLA, FlashInfer
    from gdngen.measure.timing import copy_bandwidth

    from .report import dump_record, markdown
    from .run import grid, read_records, run_grid, stopped_note, write_meta_line

    gpu_turn = gpu_turns(args.gpu_lock)

    peers = []
    available = {"flashinfer": FlashInfer, "fla": FLA}
    for peer in args.peers:
        if peer == "none":
            continue
        if peer not in available:
            print(
                f"gdngen bench: unknown peer {peer!r} (known: {sorted(available)})", file=sys.stderr
            )
            return 2
        impl = available[peer]()
        if impl.missing:
            print(f"gdngen bench: peer {peer} missing: {impl.missing}", file=sys.stderr)
        peers.append(impl)

    with gpu_turn():
        copy_bw = copy_bandwidth()
    meta = environment()
    meta["copy_bw"] = copy_bw
    meta["date"] = datetime.date.today().isoformat()
    meta["command"] = "gdngen " + shlex.join(argv_for_record)
    print(f"{meta['gpu']}: copy bandwidth {copy_bw / 1e12:.2f} TB/s", file=sys.stderr)
    problems = grid(
        tokens=args.tokens, batches=args.batch, heads=args.hv, layouts=args.layout,
        state_dtypes=args.state_dtype, modes=args.mode, H=args.qk_heads, head_dims=args.head_dim,
    )  # fmt: skip
    meta["cells"] = len(problems)
    jsonl = None
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        jsonl = open(f"{args.out}.jsonl", "w")
        write_meta_line(jsonl, meta)
    # A run stopped by `timeout`, a job limit or Ctrl-C still writes the tables of the cells it
    # finished (the .jsonl holds each cell once it is complete).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = run_grid(
            problems, args.target, copy_bw, variants_for=variants_for, peers=peers, jsonl=jsonl,
            replays=args.replays, gpu_turn=gpu_turn,
        )  # fmt: skip
    except KeyboardInterrupt:
        if jsonl is None:
            raise
        jsonl.close()
        results = read_records(f"{args.out}.jsonl")
        meta["stopped"] = stopped_note(results, len(problems))
        print(f"gdngen bench: {meta['stopped']}; writing their tables", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if jsonl is not None:
            jsonl.close()
    table = markdown(results, meta)
    print(table)
    if args.out:
        record = {"meta": meta, "results": [asdict(r) for r in results]}
        Path(f"{args.out}.json").write_text(dump_record(record))
        Path(f"{args.out}.md").write_text(table + "\n")
        Path(f"{args.out}.jsonl").unlink(missing_ok=True)
    return 1 if "stopped" in meta else 0


def tables(paths: list[str], out: str | None) -> int:
    """`gdngen bench-tables`: the markdown tables of bench records, from the ``.json`` of a
    finished run or the ``.jsonl`` of one that ended before writing it (stopped, killed, or its
    machine taken back); with ``out``, also OUT.json and OUT.md of the records together."""
    from .report import dump_record, markdown
    from .run import Result, read_record_file, stopped_note

    meta: dict = {}
    results: list[Result] = []
    for path in paths:
        if not path.endswith((".json", ".jsonl")):
            print(
                f"gdngen bench-tables: {path}: expected a .json or .jsonl bench record",
                file=sys.stderr,
            )
            return 2
        file_meta, file_results = read_record_file(path)
        if path.endswith(".jsonl") and file_meta:  # still there: a run that ended early
            file_meta.setdefault("stopped", stopped_note(file_results, file_meta.get("cells")))
        meta = meta or file_meta
        results += file_results
    if not meta:
        print(
            "gdngen bench-tables: none of the records has its run's metadata (GPU, versions, "
            "command); a bench run writes it on the first line of its .jsonl, runs before "
            "2026-11-25 did not",
            file=sys.stderr,
        )
        return 2
    table = markdown(results, meta)
    print(table)
    if out:
        Path(f"{out}.json").write_text(
            dump_record({"meta": meta, "results": [asdict(r) for r in results]})
        )
        Path(f"{out}.md").write_text(table + "\n")
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
