"""The `gdngen` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_emit(args: argparse.Namespace) -> int:
    from gdngen.emit import EmitError, check, display_path, emit, unmeasured_sets
    from gdngen.emit.render import RenderError
    from gdngen.spec import SpecError, load_spec
    from gdngen.tune.tuning_file import (
        TuningError,
        default_path,
        load_other_tunings,
        load_tuning,
        remeasure_command,
        spec_of_tuning_file,
    )

    out_root = Path(args.out)
    project_root = out_root.resolve().parent
    status = 0
    # A tuning file lives beside its spec (so `specs/*.yaml` names both): it stands for the
    # spec that reads it, and each spec is emitted once.
    spec_paths: dict[Path, None] = {}
    for spec_arg in args.specs:
        spec_path = Path(spec_arg)
        owner = spec_of_tuning_file(spec_path)
        if owner is not None:
            print(
                f"gdngen emit: {spec_arg} is a tuning file of {owner.as_posix()}, which reads "
                "it: taken as that spec",
                file=sys.stderr,
            )
            spec_path = owner
        spec_paths.setdefault(spec_path, None)
    for spec_path in spec_paths:
        try:
            spec = load_spec(spec_path)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            return 2
        shown = display_path(spec_path, project_root)
        command = f"gdngen emit {shown}"
        measured = None
        tuning_path = default_path(spec_path)
        try:
            if tuning_path.exists():
                measured = load_tuning(tuning_path, spec, display_path(tuning_path, project_root))
            other_gpus = load_other_tunings(spec_path, spec, project_root)
        except TuningError as exc:
            print(exc, file=sys.stderr)
            return 2
        # Pairs whose timings do not hold (or were never measured) use the static rules; say so,
        # and how to measure them, wherever their dispatch is not what a tune would pick.
        unmeasured = unmeasured_sets(spec, measured)
        if measured is not None and unmeasured:
            for pair, why in unmeasured.items():
                print(
                    f"gdngen emit: {shown}: {pair} is unmeasured ({why}); its dispatch uses "
                    f"the spec's static rules",
                    file=sys.stderr,
                )
            print(
                f"  re-measure on a {spec.tuning.gpu if spec.tuning else 'GPU'}: "
                f"{remeasure_command(shown, spec, list(unmeasured))}",
                file=sys.stderr,
            )
        source = (
            "the spec's static rules"
            + (f" ({'no tuning file' if measured is None else 'no pair measured'})")
            if measured is None or len(unmeasured) == len(spec.tuning_sets())
            else measured.name
            + (f" (static rules for {', '.join(unmeasured)})" if unmeasured else "")
        ) + "".join(f"; on {gpu}: {other.name}" for gpu, other in other_gpus.items())
        try:
            if args.check:
                problems = check(spec, shown, out_root, measured, other_gpus)
                if problems:
                    for problem in problems:
                        print(problem.rstrip("\n"), file=sys.stderr)
                    print(
                        f"\n{out_root.name}/{spec.target}/ is not what {shown} produces "
                        f"({len(problems)} file(s) differ). Run:\n    {command}\nand commit the result.",
                        file=sys.stderr,
                    )
                    status = 1
                else:
                    print(
                        f"{out_root.name}/{spec.target}/ is up to date with {shown}; dispatch "
                        f"from {source}"
                    )
                continue
            result = emit(spec, shown, out_root, measured, other_gpus)
        except (RenderError, TuningError, EmitError) as exc:
            print(f"gdngen: {exc}", file=sys.stderr)
            return 3
        print(
            f"{out_root.name}/{spec.target}/: {len(result.written)} written, "
            f"{len(result.unchanged)} unchanged, {len(result.removed)} removed; dispatch from "
            + source
        )
        for relpath in result.written:
            print(f"  wrote   {relpath}")
        for relpath in result.removed:
            print(f"  removed {relpath}")
    return status


def _cmd_tune(args: argparse.Namespace) -> int:
    import torch

    from gdngen.measure.gpu_turns import gpu_turns
    from gdngen.spec import SpecError, load_spec
    from gdngen.tune.run import TuneError, merge, retime_record, tune, write
    from gdngen.tune.tuning_file import (
        TuningError,
        head_dims_arg,
        parse_head_dims,
        read_tuning,
        stale_pairs,
        tuning_path_for_gpu,
    )

    spec_path = Path(args.spec)
    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    if spec.tuning is None:
        print(
            f"gdngen tune: {spec_path} has no `tuning:` section (the grid to measure)",
            file=sys.stderr,
        )
        return 2
    try:
        heads = tuple(int(h) for h in args.heads.split(",")) if args.heads else None
    except ValueError:
        print(
            f"gdngen tune: --heads expects HV values like 4,6,8; got {args.heads!r}",
            file=sys.stderr,
        )
        return 2
    if args.core:
        return _tune_core(args, spec, spec_path, heads)
    grid_heads = sorted({hv for dims in spec.tuned_head_dims for hv in spec.tuning_heads(dims)})
    unknown = [h for h in heads or () if h not in grid_heads]
    if unknown:
        print(
            f"gdngen tune: --heads {unknown} are not HVs the grid of {spec_path} measures "
            f"({grid_heads}: tuning.heads, and the HVs of tuning.head_dims' geometries); add "
            "them to tuning.heads first",
            file=sys.stderr,
        )
        return 2
    try:
        head_dims = parse_head_dims(args.head_dims) if args.head_dims else None
    except ValueError as exc:
        print(f"gdngen tune: {exc}", file=sys.stderr)
        return 2
    unknown = [d for d in head_dims or () if d not in spec.tuned_head_dims]
    if unknown:
        print(
            f"gdngen tune: --head-dims {','.join(map(head_dims_arg, unknown))}: the grid of "
            f"{spec_path} measures {','.join(map(head_dims_arg, spec.tuned_head_dims))} (the "
            "geometries of tuning.heads, and tuning.head_dims); add them to tuning.head_dims first",
            file=sys.stderr,
        )
        return 2
    modes = tuple(args.modes.split(",")) if args.modes else None
    unknown = [m for m in modes or () if m not in spec.tuning.modes]
    if unknown:
        print(
            f"gdngen tune: --modes {unknown}: the grid of {spec_path} times "
            f"{list(spec.tuning.modes)} (tuning.modes); add them there first",
            file=sys.stderr,
        )
        return 2
    # The running GPU's own tuning file (tune refuses a GPU model the spec does not list).
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    out = Path(args.out or tuning_path_for_gpu(spec_path, spec, gpu))
    if args.retime and not out.is_file():
        print(
            f"gdngen tune: --retime adds timings to the cells of {out}, which does not exist; "
            "measure them first (without --retime)",
            file=sys.stderr,
        )
        return 2
    if not gpu:
        print("gdngen tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",")] if args.pairs else None
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else None
    old = None
    if (args.merge or args.retime) and out.exists():
        # Not load_tuning: a file with some stale pairs still has fresh ones to keep; merge drops
        # the stale ones (and everything if the GPU differs).
        try:
            old = read_tuning(out)
        except TuningError as exc:
            print(f"gdngen tune: not merging with {out}: {exc}", file=sys.stderr)
            if args.retime:
                return 2
        else:
            for pair, reason in stale_pairs(old, spec).items():
                print(f"gdngen tune: dropping stale cells of {pair}: {reason}", file=sys.stderr)
    gpu_turn = gpu_turns(args.gpu_lock)
    retimed_by = None
    if args.retime:
        device = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = str(getattr(device, "uuid", "")) or None
        retimed_by = retime_record(torch.cuda.get_device_name(), uuid, sys.argv[1:])
    # One pair and token count at a time, each written as it completes: a long run that is cut
    # off keeps what it measured, and T > 1 shortlists from the T = 1 cells already written.
    for pair in pairs or list(spec.served):
        for T in sorted(tokens or spec.tuning.tokens):
            try:
                measured = tune(
                    spec, sys.argv[1:], pairs=[pair], tokens=(T,), heads=heads,
                    head_dims=head_dims, modes=modes, replays=args.replays, earlier=old,
                    retime=args.retime, gpu_turn=gpu_turn,
                )  # fmt: skip
                old = merge(old, measured, spec, retimed_by=retimed_by)
            except TuneError as exc:
                print(f"gdngen tune: {exc}", file=sys.stderr)
                return 1
            write(out, old)
            done = "retimed" if args.retime else "measured"
            print(
                f"wrote {out}: {'/'.join(pair)} T={T} {done} ({len(measured.cells)} cells)",
                flush=True,
            )
    print(f"now run: gdngen emit {spec_path}")
    return 0


def _tune_core(args: argparse.Namespace, spec, spec_path: Path, heads) -> int:
    """``gdngen tune SPEC --core``: the decode core's grid (gdngen.tune.core), merged into the
    GPU's tuning file one pair and T at a time."""
    import torch

    from gdngen.measure.gpu_turns import gpu_turns
    from gdngen.tune.core import tune_core
    from gdngen.tune.run import TuneError, merge, write
    from gdngen.tune.tuning_file import TuningError, read_tuning, tuning_path_for_gpu

    grid = spec.tuning.core
    if grid is None:
        print(
            f"gdngen tune --core: {spec_path} has no `tuning.core:` section (the decode core's "
            "grid)",
            file=sys.stderr,
        )
        return 2
    if args.retime or args.head_dims:
        print(
            "gdngen tune --core: --retime and --head-dims are for the plain grid; the core grid "
            "is measured at the grid's base head dims",
            file=sys.stderr,
        )
        return 2
    unknown = [h for h in heads or () if h not in grid.heads]
    if unknown:
        print(
            f"gdngen tune --core: --heads {unknown} are not in tuning.core.heads "
            f"{list(grid.heads)}",
            file=sys.stderr,
        )
        return 2
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",")] if args.pairs else None
    unknown = [p for p in pairs or () if p not in grid.pair_tuples]
    if unknown:
        print(
            f"gdngen tune --core: --pairs {['/'.join(p) for p in unknown]} are not in "
            f"tuning.core.pairs {list(grid.pairs)}",
            file=sys.stderr,
        )
        return 2
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else None
    if not torch.cuda.is_available():
        print("gdngen tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out or tuning_path_for_gpu(spec_path, spec, torch.cuda.get_device_name()))
    old = None
    if out.exists():  # core cells join the file's plain ones (always merged)
        try:
            old = read_tuning(out)
        except TuningError as exc:
            print(f"gdngen tune --core: not merging with {out}: {exc}", file=sys.stderr)
            return 2
        if old.gpu != torch.cuda.get_device_name():
            print(
                f"gdngen tune --core: {out} was measured on {old.gpu!r}, this GPU is "
                f"{torch.cuda.get_device_name()!r}: its cells would be dropped; pass --out to "
                "write the core cells to a file of their own (then gdngen merge-tuning)",
                file=sys.stderr,
            )
            return 2
    gpu_turn = gpu_turns(args.gpu_lock)
    # One pair, T and HV at a time, each written as it completes: a run cut off keeps what it
    # measured (its largest cells take the longest).
    for pair in pairs or list(grid.pair_tuples):
        for T in sorted(tokens or grid.tokens):
            for HV in [hv for hv in grid.heads if heads is None or hv in heads]:
                try:
                    measured = tune_core(
                        spec, sys.argv[1:], pairs=[pair], tokens=(T,), heads=(HV,),
                        replays=args.replays, gpu_turn=gpu_turn,
                    )  # fmt: skip
                    old = merge(old, measured, spec)
                except TuneError as exc:
                    print(f"gdngen tune --core: {exc}", file=sys.stderr)
                    return 1
                write(out, old)
                print(f"wrote {out}: {'/'.join(pair)} core T={T} HV={HV} "
                      f"({len(measured.cells)} cells)", flush=True)  # fmt: skip
    print(f"now run: gdngen emit {spec_path}")
    return 0


def _cmd_merge_tuning(args: argparse.Namespace) -> int:
    import shlex

    from gdngen.spec import SpecError, load_spec
    from gdngen.tune.run import TuneError, merge_runs, write
    from gdngen.tune.tuning_file import TuningError, read_tuning, tuning_path_for_gpu

    spec_path = Path(args.spec)
    try:
        spec = load_spec(spec_path)
        runs = [read_tuning(Path(path)) for path in args.files]
        command = "gdngen " + shlex.join(sys.argv[1:])
        # One tune run's command as the example; a file merged before (often the first, the
        # tuning file itself) would nest every earlier merge's command into the header.
        example = next(
            (r.command for r in runs if not r.command.startswith("gdngen merge-tuning")),
            runs[0].command,
        )
        merged = merge_runs(runs, spec, f"{command}, of {len(runs)} runs like: {example}")
    except (SpecError, TuningError, TuneError) as exc:
        print(f"gdngen merge-tuning: {exc}", file=sys.stderr)
        return 2
    # The file of the GPU model the runs measured.
    out = Path(args.out) if args.out else tuning_path_for_gpu(spec_path, spec, merged.gpu)
    write(out, merged)
    print(f"wrote {out}: {len(merged.cells)} cells from {len(runs)} files")
    print(f"now run: gdngen emit {spec_path}")
    return 0


def _stale(spec, shown: str, generated: Path, measured, other_gpus) -> bool:
    from gdngen.emit import check  # (renders through black)

    return bool(check(spec, shown, generated, measured, other_gpus))


def _cmd_build(args: argparse.Namespace) -> int:
    import importlib

    from gdngen.runtime.build import build_artifacts
    from gdngen.spec import SpecError, load_spec
    from gdngen.tune.tuning_file import (
        TuningError,
        default_path,
        load_other_tunings,
        load_tuning,
    )

    spec_path = Path(args.spec)
    try:
        spec = load_spec(spec_path)
        tuning_path = default_path(spec_path)
        shown = spec_path.as_posix()
        measured = (
            load_tuning(tuning_path, spec, tuning_path.as_posix()) if tuning_path.exists() else None
        )
        other_gpus = load_other_tunings(spec_path, spec, Path(args.generated).resolve().parent)
    except (SpecError, TuningError) as exc:
        print(exc, file=sys.stderr)
        return 2
    # Kernels are built from the generated modules: they must be what the spec produces.
    if not args.no_check and _stale(spec, shown, Path(args.generated), measured, other_gpus):
        print(
            f"gdngen build: {args.generated}/{spec.target}/ is not what {shown} produces; run "
            f"gdngen emit {shown} first",
            file=sys.stderr,
        )
        return 2
    target = importlib.import_module(f"{Path(args.generated).name}.{spec.target}")
    out = Path(args.out or f"build/{spec.target}")
    geometries = tuple(args.geometries.split(",")) if args.geometries else None
    try:
        spec.build_geometries(geometries)
    except ValueError as exc:
        print(f"gdngen build: {exc}", file=sys.stderr)
        return 2
    manifest = build_artifacts(spec, target, out, jobs=args.jobs, geometries=geometries)
    print(
        f"{out}/: {manifest['kernels']} kernels ({manifest['built']} built, the rest already "
        f"there); use them with GDNGEN_ARTIFACTS={out}"
    )
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from gdngen.runtime.kernel_dir import CACHE_ENV, KernelDir, default_cache_dir

    folder = KernelDir(Path(args.dir) if args.dir else default_cache_dir(), writable=True)
    if args.clear:
        removed = folder.clear() if folder.path.is_dir() else 0
        print(f"{folder.path}: removed {removed} kernels")
        return 0
    entries = folder.entries()
    size = sum(e.get("library_bytes", 0) for e in entries)
    print(f"gdngen disk cache: {folder.path} (set {CACHE_ENV} to move it)")
    print(f"{len(entries)} kernels, {size / 1e6:.1f} MB")
    by_variant: dict[str, int] = {}
    for entry in entries:
        name = entry["fingerprint"]["key"]["variant"]
        by_variant[name] = by_variant.get(name, 0) + 1
    for name, count in sorted(by_variant.items()):
        print(f"  {count:4d}  {name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gdngen", description="Generate GDN decode kernels (CuTe DSL) from declarative specs."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_emit = sub.add_parser("emit", help="write generated/<target>/ from a spec (no GPU needed)")
    p_emit.add_argument(
        "specs", nargs="+", metavar="SPEC", help="spec file(s), e.g. specs/b200.yaml"
    )
    p_emit.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff if generated/ differs from what the spec produces",
    )
    p_emit.add_argument("--out", default="generated", help="output root (default: generated)")
    p_emit.set_defaults(func=_cmd_emit)

    from gdngen.bench import cli as bench_cli

    p_bench = sub.add_parser(
        "bench", help="time the generated kernels beside FlashInfer and FLA (needs a GPU)"
    )
    bench_cli.add_arguments(p_bench)
    p_bench.set_defaults(func=lambda args: bench_cli.run(args, sys.argv[1:]))

    p_tables = sub.add_parser(
        "bench-tables",
        help="the markdown tables of bench records: a run's .json, or the .jsonl of a run that "
        "ended before writing it (no GPU)",
    )
    p_tables.add_argument("records", nargs="+", metavar="RECORD", help="OUT.json or OUT.jsonl")
    p_tables.add_argument("--out", help="also write OUT.json and OUT.md of the records together")
    p_tables.set_defaults(func=lambda args: bench_cli.tables(args.records, args.out))

    p_tune = sub.add_parser(
        "tune", help="time every candidate variant per dispatch cell; write SPEC.tuning.yaml (GPU)"
    )
    p_tune.add_argument("spec", metavar="SPEC")
    p_tune.add_argument("--out", help="tuning file (default: next to the spec, <stem>.tuning.yaml)")
    p_tune.add_argument(
        "--pairs", help="only these layout/dtype pairs, e.g. k_last/bf16,v_last/fp32"
    )
    p_tune.add_argument("--tokens", help="only these T values (default: the spec's tuning.tokens)")
    p_tune.add_argument(
        "--modes", help="only these call forms of tuning.modes, e.g. spec (default: all of them)"
    )
    p_tune.add_argument(
        "--heads", help="only these HV values of tuning.heads, e.g. 4,6,8 (default: all of them)"
    )
    p_tune.add_argument(
        "--head-dims",
        help="only these head dims of the grid, K (for K = V) or KxV, e.g. 256 or 128,64 "
        "(default: tuning.heads' and every one of tuning.head_dims)",
    )
    p_tune.add_argument(
        "--merge", action="store_true", help="keep cells of the existing file not re-measured"
    )
    p_tune.add_argument(
        "--retime",
        action="store_true",
        help="time the contenders of the cells already in the file again (in this process, on "
        "this GPU) and add that timing to each cell: the dispatch then takes the variant whose "
        "mean gap to the fastest over all timings is least. Run it on another GPU of the same "
        "model, or at least in another process, to catch a ranking that differs between them",
    )
    p_tune.add_argument(
        "--core",
        action="store_true",
        help="measure the decode core's grid (tuning.core: the conv1d prologue and the gated "
        "RMSNorm, both plans of every variant with the epilogue) into the GPU's tuning file, "
        "beside its other cells",
    )
    p_tune.add_argument("--replays", type=int, default=15)
    p_tune.add_argument(
        "--gpu-lock",
        metavar="FILE",
        help="share the GPU with other tune processes naming the same FILE: compiles run "
        "side by side, GPU work (inputs, checks, timings) in turns. E.g. one process per pair",
    )
    p_tune.set_defaults(func=_cmd_tune)

    p_merge = sub.add_parser(
        "merge-tuning",
        help="combine the tuning files of several tune runs (e.g. one per pair, --gpu-lock) into "
        "SPEC's tuning file; a cell in more than one file keeps the last file's timing (no GPU)",
    )
    p_merge.add_argument("spec", metavar="SPEC")
    p_merge.add_argument("files", nargs="+", metavar="FILE")
    p_merge.add_argument("--out", help="tuning file (default: next to the spec)")
    p_merge.set_defaults(func=_cmd_merge_tuning)

    p_build = sub.add_parser(
        "build",
        help="compile every kernel the target's dispatch can pick, for the spec's geometries and "
        "call forms (its build: section), into an artifact directory (no GPU needed)",
    )
    p_build.add_argument("spec", metavar="SPEC")
    p_build.add_argument("--out", help="artifact directory (default: build/<target>)")
    p_build.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    p_build.add_argument("--generated", default="generated", help="generated root (default)")
    p_build.add_argument(
        "--geometries",
        help="comma list of geometry names to build (default: the spec's build.geometries, "
        "else all), e.g. qwen3.5-tp2",
    )
    p_build.add_argument(
        "--no-check",
        action="store_true",
        help="build from generated/ as it is, without comparing it with the spec (a machine "
        "without black, where CI's emit --check has already compared them)",
    )
    p_build.set_defaults(func=_cmd_build)

    p_cache = sub.add_parser("cache", help="show (or --clear) the disk cache of compiled kernels")
    p_cache.add_argument("--clear", action="store_true", help="remove every cached kernel")
    p_cache.add_argument("--dir", help="the cache folder (default: $GDNGEN_CACHE_DIR or ~/.cache)")
    p_cache.set_defaults(func=_cmd_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
