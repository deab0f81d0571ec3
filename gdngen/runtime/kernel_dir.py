"""Compiled kernels on disk: the persistent compile cache and ahead-of-time artifact directories.

Both are a :class:`KernelDir`: one shared library per compiled kernel (CuTe DSL's
``export_to_c`` object, linked with the system C compiler against the CuTe DSL runtime and
TVM-FFI), loaded back with ``tvm_ffi.load_module`` without the CuTe DSL compiler, beside a JSON
record of what it is. An entry's name is a fingerprint of everything that shaped it: every
compile-time input (the CompileKey, arch included), the content hashes of the generated kernel
module and of the device helpers it imports (gdngen/device), the CuTe DSL and TVM-FFI versions
and this format's version. An entry of other generated
code or another CuTe DSL is therefore never found, let alone loaded; an entry whose record does
not match its name, or whose library does not match the record's hash (truncated, foreign), is
ignored with a warning and rebuilt (docs/design.md, "Architecture").

Writes are atomic (a temporary file in the same folder, then a rename; the record last), so a
reader sees a whole entry or none, and processes writing the same entry at once are safe. A lock
file per entry lets one process compile while the others wait for its result.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import warnings
from contextlib import contextmanager
from functools import cache
from importlib import metadata, util
from pathlib import Path
from typing import Iterator

from .compile import CompileKey

#: bumped when an entry's files change shape
FORMAT = 1
CACHE_ENV = "GDNGEN_CACHE_DIR"


class KernelDirWarning(UserWarning):
    """An entry on disk that cannot be used (it is rebuilt or skipped)."""


def default_cache_dir() -> Path:
    """$GDNGEN_CACHE_DIR, else $XDG_CACHE_HOME/gdngen, else ~/.cache/gdngen."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gdngen"


def installed_version(module: str, distribution: str) -> str | None:
    """The version of ``distribution``, read from the ``.dist-info`` folder beside its top-level
    ``module`` (a directory listing: importlib.metadata scans every path entry, tens of ms on a
    cold start); importlib.metadata where there is no such folder."""
    spec = util.find_spec(module)
    if spec is not None:
        folders = list(spec.submodule_search_locations or [])
        folders += [os.path.dirname(spec.origin)] if spec.origin else []
        prefix = distribution.replace("-", "_").lower() + "-"
        for folder in folders:
            for entry in sorted(Path(folder).parent.glob(f"{prefix}*.dist-info")):
                return entry.name[len(prefix) : -len(".dist-info")]
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@cache
def toolchain_versions() -> dict[str, str | None]:
    """The versions an entry is only valid for (found without importing either package)."""
    return {
        "nvidia-cutlass-dsl": installed_version("nvidia_cutlass_dsl", "nvidia-cutlass-dsl"),
        "apache-tvm-ffi": installed_version("tvm_ffi", "apache-tvm-ffi"),
    }


#: the device helpers every kernel module traces through (gdngen/device): part of each kernel
DEVICE_HELPERS = Path(__file__).resolve().parent.parent / "device"


@cache
def device_helpers_sha256() -> str:
    """A hash of the device helpers' sources (gdngen/device/*.py): a kernel module imports them,
    so they shape its binary as much as the module itself, and an edited helper must never meet
    a binary built from the old one."""
    digest = hashlib.sha256()
    for path in sorted(DEVICE_HELPERS.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def file_content_sha256(path: Path) -> str:
    """The content hash a generated module's header carries (gdngen.emit.render), read from its
    file without importing it (importing a kernel body imports CuTe DSL, seconds); a module
    that is not emitted (a test's hand-written kernel) by its whole file."""
    with open(path) as handle:
        for _ in range(3):
            line = handle.readline()
            if line.startswith("# Content sha256: "):
                return line.split(":", 1)[1].strip()
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def fingerprint(key: CompileKey, module_sha256: str) -> dict:
    """Everything an entry depends on."""
    return {
        "format": FORMAT,
        "key": dataclasses.asdict(key),
        "module_sha256": module_sha256,
        "device_helpers_sha256": device_helpers_sha256(),
        "versions": toolchain_versions(),
    }


def entry_name(record: dict) -> str:
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@cache
def _preload_runtime() -> None:
    """Load CuTe DSL's runtime library globally (found without importing CuTe DSL): a kernel
    library names the folder it was linked against, which need not exist where it is loaded
    (artifacts built in another environment with the same versions)."""
    import ctypes

    spec = util.find_spec("nvidia_cutlass_dsl")
    for root in spec.submodule_search_locations if spec else ():
        for lib in sorted(Path(root).glob("cu*/lib/libcute_dsl_runtime.so")):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _link(object_file: Path, library: Path) -> None:
    """``cc -shared`` the exported object against the CuTe DSL runtime and TVM-FFI."""
    from cutlass.cute.export import aot_config

    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to link the kernel library with")
    command = [compiler, "-shared", "-o", str(library), str(object_file)]
    for lib in aot_config.get_lib_paths(enable_tvm_ffi=True):
        folder, name = os.path.dirname(lib), os.path.basename(lib)[3:].split(".so")[0]
        command += [f"-L{folder}", f"-Wl,-rpath,{folder}", f"-l{name}"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"linking {library.name} failed:\n{run.stderr}")


class KernelDir:
    """A folder of compiled kernels: ``<variant>/<entry>.so`` and ``<variant>/<entry>.json``."""

    def __init__(self, path: Path | str, *, writable: bool) -> None:
        self.path = Path(path)
        self.writable = writable

    def __repr__(self) -> str:
        return f"KernelDir({str(self.path)!r}, writable={self.writable})"

    def files(self, record: dict) -> tuple[Path, Path]:
        """The library and the record file of ``record``'s entry."""
        folder = self.path / record["key"]["variant"]
        name = entry_name(record)
        return folder / f"{name}.so", folder / f"{name}.json"

    def _verify(self, record: dict) -> Path:
        """The entry's library, once its record and hash are checked; ValueError says what is
        wrong, OSError that a file is missing."""
        library, meta = self.files(record)
        stored = json.loads(meta.read_text())
        if stored.get("fingerprint") != record:
            raise ValueError("its record is for another kernel")
        if not library.is_file() or _file_sha256(library) != stored.get("library_sha256"):
            raise ValueError("its library is missing, truncated or not the one recorded")
        return library

    def load(self, record: dict):
        """The kernel of ``record``, or None when the folder has no usable entry for it."""
        _, meta = self.files(record)
        if not meta.is_file():
            return None
        try:
            library = self._verify(record)
            import tvm_ffi

            _preload_runtime()
            return tvm_ffi.load_module(str(library))[record["key"]["variant"]]
        except Exception as exc:  # noqa: BLE001 - any unusable entry is skipped, not fatal
            warnings.warn(
                f"gdngen: ignoring kernel entry {meta} ({type(exc).__name__}: {exc}); "
                + ("it is rebuilt" if self.writable else "falling back to the cache or JIT"),
                KernelDirWarning,
                stacklevel=3,
            )
            return None

    def has(self, record: dict) -> bool:
        """Whether a complete entry for ``record`` is here (checked, not loaded)."""
        try:
            self._verify(record)
            return True
        except (OSError, ValueError):
            return False

    def save(self, record: dict, compiled) -> None:
        """Store a JIT-compiled kernel (``cute.compile`` result with TVM-FFI) as ``record``."""
        library, meta = self.files(record)
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent, prefix=".build-") as scratch:
            object_file = Path(scratch) / "kernel.o"
            built = Path(scratch) / "kernel.so"
            compiled.export_to_c(
                str(object_file), record["key"]["variant"], export_only_tvm_ffi_symbols=True
            )
            _link(object_file, built)
            data = built.read_bytes()
        _atomic_write(library, data)
        body = {
            "fingerprint": record,
            "library_sha256": hashlib.sha256(data).hexdigest(),
            "library_bytes": len(data),
        }
        _atomic_write(meta, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode())

    @contextmanager
    def locked(self, record: dict) -> Iterator[None]:
        """Hold the entry's lock file (other processes building it wait)."""
        library, _ = self.files(record)
        library.parent.mkdir(parents=True, exist_ok=True)
        with open(library.with_suffix(".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def entries(self) -> list[dict]:
        """Every complete entry's record (for `gdngen cache` and manifests)."""
        found = []
        for meta in sorted(self.path.glob("*/*.json")):
            try:
                found.append(json.loads(meta.read_text()) | {"path": str(meta.with_suffix(".so"))})
            except (OSError, ValueError):
                continue
        return found

    def clear(self) -> int:
        """Remove every entry (its library, record and lock file; then the folders left empty),
        and nothing else: a folder given by mistake keeps whatever is not a kernel entry.
        Returns how many entries there were."""
        count = 0
        for meta in sorted(self.path.glob("*/*.json")):
            try:
                is_entry = "fingerprint" in json.loads(meta.read_text())
            except (OSError, ValueError):
                is_entry = False
            if not is_entry:
                continue
            for suffix in (".so", ".lock", ".json"):
                meta.with_suffix(suffix).unlink(missing_ok=True)
            count += 1
        for folder in self.path.glob("*/"):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        return count
