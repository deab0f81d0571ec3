"""``gdngen build``: compile every kernel a target's dispatch can pick, ahead of time.

For each geometry, served layout/dtype, T and call form the spec declares (its ``build:``
section), every variant the dispatch can pick at some batch size is compiled (no GPU needed) into
an artifact directory laid out like the disk cache, with a ``MANIFEST.json``. A process pointed at
it ($GDNGEN_ARTIFACTS, or gdngen.runtime.store.add_artifact_dir) loads those kernels without the
compiler; entries of other generated code or another CuTe DSL are never loaded.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType

from .compile import CompileKey, compile_kernel
from .forms import compile_keys, key_mode, spec_forms
from .kernel_dir import KernelDir, fingerprint, toolchain_versions
from .kernel_table import kernel_content_sha256, load_kernel

MANIFEST = "MANIFEST.json"


def target_keys(spec, target: ModuleType, geometries=None) -> list[CompileKey]:
    """The compile keys of ``spec``'s build forms over every table of its generated target's
    dispatch (the default one and each GPU model's): one artifact directory serves each GPU.
    ``geometries`` (names) overrides the spec's build geometries."""
    return compile_keys(
        [target.dispatch.TABLE, *target.dispatch.TABLES.values()], arch=spec.sm,
        geometries=spec.build_geometries(geometries), pairs=spec.served,
        max_tokens=spec.features.max_tokens, forms=spec_forms(spec.build),
    )  # fmt: skip


def _build_one(qualname: str, key: CompileKey, out: str) -> str:
    folder = KernelDir(out, writable=True)
    record = fingerprint(key, kernel_content_sha256(qualname))
    if folder.has(record):
        return "present"
    with folder.locked(record):
        if folder.has(record):
            return "present"
        folder.save(record, compile_kernel(load_kernel(qualname), key))
    return "built"


def build_artifacts(
    spec,
    target: ModuleType,
    out: Path,
    *,
    jobs: int = 1,
    geometries: tuple[str, ...] | None = None,
    progress=sys.stderr,
) -> dict:
    """Build (or find already built) every kernel of :func:`target_keys` in ``out``; returns the
    manifest written there."""
    out.mkdir(parents=True, exist_ok=True)
    package = f"{target.__name__}.kernels"
    keys = target_keys(spec, target, geometries)
    started = time.perf_counter()
    outcomes: list[str] = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_build_one, f"{package}.{k.variant}", k, str(out)) for k in keys]
        for index, (key, future) in enumerate(zip(keys, futures)):
            outcomes.append(future.result())
            print(
                f"[{index + 1}/{len(keys)}] {time.perf_counter() - started:6.1f}s "
                f"{key.variant} T={key.tokens} {key_mode(key)} "
                f"HV={key.HV} slots={key.index_dtype}: {outcomes[-1]}",
                file=progress,
                flush=True,
            )
    folder = KernelDir(out, writable=True)
    entries = []
    for key in keys:
        record = fingerprint(key, kernel_content_sha256(f"{package}.{key.variant}"))
        library, _ = folder.files(record)
        entries.append({"key": dataclasses.asdict(key), "library": str(library.relative_to(out))})
    manifest = {
        "target": spec.target,
        "sm": spec.sm,
        "versions": toolchain_versions(),
        "build": spec.build.model_dump(mode="json"),
        "kernels": len(keys),
        "built": outcomes.count("built"),
        "entries": entries,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
