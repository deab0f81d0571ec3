"""Writing a target's files: write-if-changed, stale files removed, a sorted manifest.

Also the comparison behind ``gdngen emit --check``.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path

from gdngen.spec import Spec, spec_sha256
from gdngen.tune.tuning_file import Measured, set_key

from .plan import body_path, body_source, measured_sets, plan_target, unmeasured_sets
from .shape import KernelShape
from .render import render_all

MANIFEST = "MANIFEST.txt"
PACKAGE_ROOT_INIT = '"""Kernels emitted by gdngen, one package per target (see specs/)."""\n'
#: files under generated/<target>/ that the emitter owns (anything else there is left alone)
OWNED_SUFFIXES = (".py", ".txt")


def display_path(spec_path: Path, project_root: Path) -> str:
    """The spec path as headers print it: relative to the project, never absolute."""
    try:
        return spec_path.resolve().relative_to(project_root.resolve()).as_posix()
    except ValueError:
        return spec_path.name


def expected_files(
    spec: Spec,
    spec_display: str,
    tuning: Measured | None = None,
    other_gpus: dict[str, Measured] | None = None,
) -> dict[str, str]:
    """relpath -> content for every file of generated/<target>/, manifest included. ``tuning``
    is the tuning file of the spec's ``tuning.gpu``, ``other_gpus`` those of its other GPU
    models (gdngen.tune.tuning_file.load_other_tunings)."""
    other_gpus = other_gpus or {}
    planned = plan_target(spec, spec_display, tuning, other_gpus)
    files = dict(zip([p.relpath for p in planned], render_all(planned)))
    lines = [
        f"# Files emitted by gdngen for target {spec.target} from {spec_display}; do not edit.",
        f"# Regenerate: gdngen emit {spec_display}",
        f"# Spec sha256: {spec_sha256(spec)}",
    ]
    unmeasured = unmeasured_sets(spec, tuning)
    measured = [set_key(*s, spec) for s in measured_sets(spec, tuning)]
    if measured:
        lines.append(f"# Dispatch measured ({tuning.name}): {', '.join(measured)}")
    for pair, why in unmeasured.items():
        lines.append(f"# Dispatch from the spec's static rules: {pair} ({why})")
    for gpu in (spec.tuning.other_gpus if spec.tuning else ()):
        other = other_gpus.get(gpu)
        if other is None:
            lines.append(f"# Dispatch on {gpu}: no tuning file, so the default table above")
            continue
        gpu_unmeasured = unmeasured_sets(spec, other)
        gpu_measured = [set_key(*s, spec) for s in measured_sets(spec, other)]
        rest = f"; static rules for {', '.join(gpu_unmeasured)}" if gpu_unmeasured else ""
        lines.append(
            f"# Dispatch on {gpu}: its own table, measured ({other.name}): "
            f"{', '.join(gpu_measured) or 'no pair'}{rest}"
        )
    for relpath in sorted(files):
        digest = hashlib.sha256(files[relpath].encode()).hexdigest()[:16]
        lines.append(f"{digest}  {relpath}")
    files[MANIFEST] = "\n".join(lines) + "\n"
    return files


def _owned_on_disk(target_dir: Path) -> set[str]:
    if not target_dir.is_dir():
        return set()
    return {
        path.relative_to(target_dir).as_posix()
        for path in target_dir.rglob("*")
        if path.is_file() and path.suffix in OWNED_SUFFIXES and "__pycache__" not in path.parts
    }


class EmitError(RuntimeError):
    """A target that cannot be written as asked (nothing of it has been written)."""


def missing_bodies(spec: Spec, out_root: Path) -> list[str]:
    """The kernel bodies this target takes from the targets it extends that are not emitted
    under ``out_root`` (docs/design.md, "Targets that extend another"), each as a sentence
    saying which file and how to emit it."""
    missing = {}
    for variant in spec.variants:
        shape = KernelShape.of(variant)
        source = body_source(spec, shape)
        path = body_path(spec, shape)
        if source is not None and not (out_root / path).is_file():
            missing.setdefault(source[1], []).append(f"{out_root.name}/{path}")
    return [
        f"{spec.target} reuses the kernel bodies of {spec_path}, but {len(set(files))} of them are "
        f"not emitted (first: {files[0]}); run: gdngen emit {spec_path}"
        for spec_path, files in missing.items()
    ]


@dataclass
class EmitResult:
    written: list[str]
    unchanged: list[str]
    removed: list[str]


def emit(
    spec: Spec,
    spec_display: str,
    out_root: Path,
    tuning: Measured | None = None,
    other_gpus: dict[str, Measured] | None = None,
) -> EmitResult:
    missing = missing_bodies(spec, out_root)
    if missing:
        raise EmitError("; ".join(missing))
    target_dir = out_root / spec.target
    files = expected_files(spec, spec_display, tuning, other_gpus)
    result = EmitResult([], [], [])
    root_init = out_root / "__init__.py"
    if not root_init.exists():
        out_root.mkdir(parents=True, exist_ok=True)
        root_init.write_text(PACKAGE_ROOT_INIT)
    for relpath in sorted(files):
        path = target_dir / relpath
        content = files[relpath]
        if path.is_file() and path.read_text() == content:
            result.unchanged.append(relpath)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        result.written.append(relpath)
    for relpath in sorted(_owned_on_disk(target_dir) - set(files)):
        (target_dir / relpath).unlink()
        result.removed.append(relpath)
    return result


def check(
    spec: Spec,
    spec_display: str,
    out_root: Path,
    tuning: Measured | None = None,
    other_gpus: dict[str, Measured] | None = None,
) -> list[str]:
    """Differences between generated/<target>/ and what the spec produces, as diff text blocks."""
    target_dir = out_root / spec.target
    files = expected_files(spec, spec_display, tuning, other_gpus)
    problems: list[str] = missing_bodies(spec, out_root)
    on_disk = _owned_on_disk(target_dir)
    for relpath in sorted(set(files) | on_disk):
        shown = f"{out_root.name}/{spec.target}/{relpath}"
        if relpath not in files:
            problems.append(f"stale file (the spec no longer emits it): {shown}")
            continue
        if relpath not in on_disk:
            problems.append(f"missing file: {shown}")
            continue
        actual = (target_dir / relpath).read_text()
        if actual != files[relpath]:
            diff = difflib.unified_diff(
                actual.splitlines(keepends=True),
                files[relpath].splitlines(keepends=True),
                fromfile=f"{shown} (checked in)",
                tofile=f"{shown} (from spec)",
            )
            problems.append("".join(diff))
    return problems
