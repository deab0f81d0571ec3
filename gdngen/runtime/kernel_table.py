"""A target's kernels at run time: the table of its variants (generated/<target>/kernels/), a row
each, and the kernel a row builds on first use (docs/design.md, "Architecture").

A row names the body module of its variant's code shape (this target's, or that of a target whose
spec this one extends) and the numbers the variant passes to that body's ``device_code``; every
other fact of a variant (its threads, its head K dim, its host side) follows from those. So a
variant is one line of the table, not a module of its own, and adding a knob point to a spec adds
one row.

The runtime names a kernel by a dotted name, ``<target package>.kernels.<variant>`` (the compile
cache's key, a build's work item): :func:`load_kernel` turns it into the :class:`VariantKernel`
(or, for a target's step kernels and a test's own kernel, into that module), and
:func:`kernel_content_sha256` into what the disk cache fingerprints, without importing CuTe DSL.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from functools import cache
from importlib import util
from pathlib import Path
from types import ModuleType

from gdngen.terms import variant_pair

from .kernel_dir import file_content_sha256


class Row:
    """One variant of a kernels table: its canonical name, the import of its body module
    (relative to the kernels package), the numbers its body's ``device_code`` takes (keyword
    names as that function spells them) and, where not 0, launch bounds that fit
    ``min_ctas_per_sm`` CTAs on an SM."""

    __slots__ = ("name", "body", "numbers", "min_ctas_per_sm")

    def __init__(self, name: str, body: str, *, min_ctas_per_sm: int = 0, **numbers) -> None:
        self.name = name
        self.body = body
        self.numbers = dict(numbers)
        self.min_ctas_per_sm = min_ctas_per_sm

    def __repr__(self) -> str:
        numbers = "".join(f", {key}={value!r}" for key, value in self.numbers.items())
        bounds = f", min_ctas_per_sm={self.min_ctas_per_sm}" if self.min_ctas_per_sm else ""
        return f"Row({self.name!r}, {self.body!r}{bounds}{numbers})"


class VariantKernel:
    """A variant built from its row: its knobs (``LAYOUT``, ``STATE_DTYPE`` and the row's numbers,
    as upper-case attributes), its body's ``device_code`` and the ``code`` it makes for those
    numbers, the CTA that code has (``THREADS``, ``HEAD_K_DIM``) and ``launch`` (its host side,
    which CuTe DSL compiles). The call that runs it alone is its target's ``variant(name)``."""

    KIND = "decode"

    def __init__(self, package: str, row: Row) -> None:
        from gdngen.device.launch import decode_launcher

        self.NAME = row.name
        self.LAYOUT, self.STATE_DTYPE = variant_pair(row.name)
        for key, value in row.numbers.items():
            setattr(self, key, value)
        self.MIN_CTAS_PER_SM = row.min_ctas_per_sm
        self.device_code = importlib.import_module(row.body, package).device_code
        self.code = self.device_code(**row.numbers)
        self.THREADS, self.HEAD_K_DIM = self.code.threads, self.code.head_k_dim
        self.launch = decode_launcher(self.code, name=row.name, min_ctas_per_sm=row.min_ctas_per_sm)

    def __repr__(self) -> str:
        return f"<VariantKernel {self.NAME}>"


class KernelTable:
    """The rows of a target's kernels package (``package``), by name. ``table[name]`` is that
    variant's :class:`VariantKernel`, built once (importing its body imports CuTe DSL)."""

    def __init__(self, package: str, rows: tuple[Row, ...]) -> None:
        self.package = package
        self.rows = {row.name: row for row in rows}
        self._built: dict[str, VariantKernel] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.rows)

    def __contains__(self, name: object) -> bool:
        return name in self.rows

    def __getitem__(self, name: str) -> VariantKernel:
        kernel = self._built.get(name)
        if kernel is None:
            if name not in self.rows:
                raise KeyError(f"{self.package} has no variant {name}")
            with self._lock:
                kernel = self._built.get(name)
                if kernel is None:
                    kernel = self._built[name] = VariantKernel(self.package, self.rows[name])
        return kernel

    def body_path(self, name: str) -> Path:
        """The file of ``name``'s body module, found without importing it."""
        body = util.resolve_name(self.rows[name].body, self.package)
        found = util.find_spec(body)
        if found is None or found.origin is None:
            raise ModuleNotFoundError(f"{self.package}: {name}'s body {body} is not there")
        return Path(found.origin)

    def content_sha256(self, name: str) -> str:
        """What a kernel of ``name`` is built from: its row, and its body's content hash."""
        row = hashlib.sha256(repr(self.rows[name]).encode()).hexdigest()[:16]
        return f"{row}+{file_content_sha256(self.body_path(name))}"


def _table_of(qualname: str) -> tuple[KernelTable | None, str]:
    package, _, name = qualname.rpartition(".")
    try:
        table = getattr(importlib.import_module(package), "KERNELS", None) if package else None
    except ModuleNotFoundError:
        table = None
    return (table if isinstance(table, KernelTable) and name in table else None), name


def load_kernel(qualname: str) -> VariantKernel | ModuleType:
    """The kernel ``qualname`` names: a variant of a kernels table, or a module (a target's step
    kernel, a test's own kernel module)."""
    table, name = _table_of(qualname)
    return table[name] if table is not None else importlib.import_module(qualname)


@cache
def kernel_content_sha256(qualname: str) -> str:
    """The content hash of the kernel ``qualname`` names, read without importing CuTe DSL: a
    variant's :meth:`KernelTable.content_sha256`, a module's file's
    (:func:`gdngen.runtime.kernel_dir.file_content_sha256`)."""
    table, name = _table_of(qualname)
    if table is not None:
        return table.content_sha256(name)
    found = util.find_spec(qualname)
    if found is None or found.origin is None:
        raise ModuleNotFoundError(f"no module {qualname}")
    return file_content_sha256(Path(found.origin))
