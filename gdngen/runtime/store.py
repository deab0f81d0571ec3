"""Where a compiled kernel comes from, in order: this process's memory, ahead-of-time artifact
directories (``gdngen build``; $GDNGEN_ARTIFACTS or :func:`add_artifact_dir`), the persistent
disk cache (:mod:`.kernel_dir`), and last the JIT compile, whose result goes into the disk cache.

Only the JIT step imports the kernel's code (and with it CuTe DSL, seconds); a kernel found on
disk is loaded with TVM-FFI alone. Each kernel is compiled at most once per process (threads wait
for the one compiling it) and, through the disk cache's entry locks, once per machine.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from .compile import CompileKey, compile_kernel
from .kernel_dir import (
    KernelDir,
    KernelDirWarning,
    default_cache_dir,
    fingerprint,
)
from .kernel_table import kernel_content_sha256, load_kernel

ARTIFACTS_ENV = "GDNGEN_ARTIFACTS"
#: set to 0 to keep compiled kernels out of the disk cache (JIT in every process, as before)
DISK_CACHE_ENV = "GDNGEN_DISK_CACHE"

_kernels: dict[tuple[str, CompileKey], object] = {}
#: where each kernel of _kernels came from: "artifact", "cache" or "compiled"
_sources: dict[tuple[str, CompileKey], str] = {}
_compile_lock = threading.Lock()
_key_locks: dict[tuple[str, CompileKey], threading.Lock] = {}
_key_locks_guard = threading.Lock()
_extra_artifact_dirs: list[Path] = []


@dataclass(frozen=True)
class Found:
    kernel: object
    #: "memory", "artifact", "cache" or "compiled"
    source: str


def add_artifact_dir(path: Path | str) -> None:
    """Also look for kernels in ``path`` (a ``gdngen build`` output), before the disk cache."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"artifact directory {path} does not exist (run gdngen build)")
    if path not in _extra_artifact_dirs:
        _extra_artifact_dirs.append(path)


def artifact_dirs() -> list[KernelDir]:
    paths = [Path(p) for p in os.environ.get(ARTIFACTS_ENV, "").split(os.pathsep) if p]
    return [KernelDir(p, writable=False) for p in paths + _extra_artifact_dirs]


def cache_dir() -> KernelDir | None:
    if os.environ.get(DISK_CACHE_ENV, "1") == "0":
        return None
    return KernelDir(default_cache_dir(), writable=True)


def _key_lock(cache_key) -> threading.Lock:
    with _key_locks_guard:
        return _key_locks.setdefault(cache_key, threading.Lock())


def find_kernel(qualname: str, key: CompileKey) -> Found:
    """The kernel ``qualname`` names (gdngen.runtime.kernel_table.load_kernel) for ``key``, and
    its source."""
    cache_key = (qualname, key)
    kernel = _kernels.get(cache_key)
    if kernel is not None:
        return Found(kernel, "memory")
    with _key_lock(cache_key):
        kernel = _kernels.get(cache_key)
        if kernel is not None:
            return Found(kernel, "memory")
        record = fingerprint(key, kernel_content_sha256(qualname))
        found = None
        for folder in artifact_dirs():
            kernel = folder.load(record)
            if kernel is not None:
                found = Found(kernel, "artifact")
                break
        disk = cache_dir() if found is None else None
        if disk is not None:
            try:
                found = _from_disk_cache(qualname, key, record, disk)
            except OSError as exc:  # a cache folder that cannot be written: compile, say so
                warnings.warn(
                    f"gdngen: the disk cache {disk.path} is not usable ({exc}); compiling "
                    f"{key.variant} without it (set GDNGEN_CACHE_DIR, or GDNGEN_DISK_CACHE=0)",
                    KernelDirWarning,
                    stacklevel=2,
                )
        if found is None:
            found = Found(_compile(qualname, key, record, None), "compiled")
        _kernels[cache_key] = found.kernel
        _sources[cache_key] = found.source
        return found


def _from_disk_cache(qualname: str, key: CompileKey, record: dict, disk: KernelDir) -> Found:
    kernel = disk.load(record)
    if kernel is not None:
        return Found(kernel, "cache")
    with disk.locked(record):  # (OSError where the folder cannot be made or locked)
        kernel = disk.load(record)  # another process may have built it meanwhile
        if kernel is not None:
            return Found(kernel, "cache")
        return Found(_compile(qualname, key, record, disk), "compiled")


def _compile(qualname: str, key: CompileKey, record: dict, disk: KernelDir | None):
    module = load_kernel(qualname)
    with _compile_lock:  # one CuTe DSL compile at a time in a process
        compiled = compile_kernel(module, key)
    if disk is not None:
        try:
            disk.save(record, compiled)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written is not fatal
            warnings.warn(
                f"gdngen: could not store {key.variant} in the disk cache {disk.path}: {exc}",
                KernelDirWarning,
                stacklevel=3,
            )
    return compiled


def kernel_for(qualname: str, key: CompileKey):
    return find_kernel(qualname, key).kernel


def compiled_count() -> int:
    """How many kernels this process holds (tests use it to catch recompiles)."""
    return len(_kernels)


def sources() -> dict[str, int]:
    """How many of this process's kernels came from each source."""
    counts: dict[str, int] = {}
    for source in _sources.values():
        counts[source] = counts.get(source, 0) + 1
    return counts
