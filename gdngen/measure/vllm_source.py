"""Which Python files of a vLLM wheel its GDN decode chain needs, and the small archive of them
that travels to a GPU machine (``tools/vllm_bundle.py``; docs/design.md, "Measuring").

The chain is vLLM's Triton kernels of a Qwen3-Next / Qwen3.5 GDN layer at decode: the conv
update, the packed-decode recurrence (T = 1), the recurrence of speculative decode (T > 1) and
the FLA-style gated RMSNorm (``KERNEL_MODULES``); beside them, the Triton port of the fused
speculative-decode op that vLLM's default path calls after the conv (recurrence and gated
RMSNorm in one op; the GPU tests hold gdngen's adapter of that op against it). The archive holds those modules and every
vLLM module they import at their top level, found by reading the files (nothing is run), except
the modules that ``gdngen.measure.vllm_kernels`` stands in for (``STOOD_IN``). Imports under an
``if`` (another platform's kernels) and inside functions are not followed. No package
``__init__`` is taken: the loader never runs one (vLLM's own ``__init__`` imports the engine).

Only the archive is made here; its files are vLLM's, read where they are loaded, never copied
into this project.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

#: the modules of the chain's kernels, by the role each plays
KERNEL_MODULES = {
    "conv": "vllm.model_executor.layers.mamba.ops.causal_conv1d",
    "packed_decode": "vllm.third_party.flash_linear_attention.ops.fused_recurrent",
    "spec_decode": "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating",
    "triton_norm": "vllm.third_party.flash_linear_attention.ops.layernorm_guard",
    "mtp_decode": "vllm.third_party.flash_linear_attention.ops.fused_gdn_decode_post_conv_mtp",
}
#: read for its constants only (the null block id of the index tables), never imported
CONSTANTS_MODULE = "vllm.v1.attention.backends.utils"
#: vLLM modules the kernel files import whose code is not run: the loader puts stand-ins in
#: their place (the platform query, the logger, Triton itself, the SM count, the constants)
STOOD_IN = frozenset(
    {
        "vllm.platforms",
        "vllm.logger",
        "vllm.triton_utils",
        "vllm.utils.platform_utils",
        CONSTANTS_MODULE,
    }
)
#: the record written at the archive's root: the wheel, vLLM's version, every file's sha256
MANIFEST = "gdngen_vllm_bundle.json"
#: the archive's entries carry this time, so that one wheel gives one archive byte for byte
FIXED_MTIME = 1_795_737_600  # 2026-11-27


def module_path(module: str) -> str:
    """A module's file inside a wheel or an unpacked bundle: ``vllm/x/y.py``."""
    return module.replace(".", "/") + ".py"


def _top_level_imports(source: str, module: str) -> set[str]:
    """The modules ``module``'s unconditional top-level imports name (``from p import n`` names
    both ``p`` and ``p.n``, as n may be a submodule), relative ones resolved."""
    package = module.rsplit(".", 1)[0]
    names: set[str] = set()

    def statements(body):
        for node in body:
            if isinstance(node, ast.Try):  # an optional import is still taken when it works
                yield from statements(node.body)
            else:
                yield node

    for node in statements(ast.parse(source).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            names.add(origin)
            names.update(f"{origin}.{alias.name}" for alias in node.names)
    return names


def module_closure(read: Callable[[str], str | None]) -> list[str]:
    """Every vLLM module the chain's kernels need, sorted: ``KERNEL_MODULES`` and what they import
    at their top level, transitively, less ``STOOD_IN``. ``read(path)`` returns a file's text, or
    None where there is no such file (a package, or a name that is not a module)."""
    found: set[str] = set()
    pending = list(KERNEL_MODULES.values())
    while pending:
        module = pending.pop()
        if module in found or module in STOOD_IN:
            continue
        source = read(module_path(module))
        if source is None:
            continue
        found.add(module)
        pending += [name for name in _top_level_imports(source, module) if name.startswith("vllm.")]
    missing = [m for m in KERNEL_MODULES.values() if m not in found]
    if missing:
        raise ValueError(f"the wheel has no {', '.join(missing)}: not a vLLM wheel this serves")
    return sorted(found)


def _wheel_version(wheel: zipfile.ZipFile) -> str:
    for name in wheel.namelist():
        if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", name):
            text = wheel.read(name).decode()
            match = re.search(r"^Version: (\S+)$", text, re.MULTILINE)
            if match:
                return match.group(1)
    raise ValueError("the wheel has no vllm-*.dist-info/METADATA with a Version: not vLLM's")


def bundle_files(wheel_path: str | Path) -> dict[str, bytes]:
    """The archive's files (path -> bytes): the module closure, the constants module, and the
    manifest."""
    with zipfile.ZipFile(wheel_path) as wheel:
        names = set(wheel.namelist())

        def read(path: str) -> str | None:
            return wheel.read(path).decode() if path in names else None

        modules = module_closure(read) + [CONSTANTS_MODULE]
        files = {module_path(m): wheel.read(module_path(m)) for m in modules}
        version = _wheel_version(wheel)
    manifest = dict(
        wheel=Path(wheel_path).name,
        vllm_version=version,
        kernel_modules=KERNEL_MODULES,
        files={path: hashlib.sha256(data).hexdigest() for path, data in sorted(files.items())},
    )
    files[MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode()
    return files


def write_bundle(wheel_path: str | Path, out: str | Path) -> dict:
    """Write the archive (``.tar.xz``, deterministic) and return its manifest."""
    files = bundle_files(wheel_path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=9) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(files[path]), FIXED_MTIME, 0o644
            tar.addfile(info, io.BytesIO(files[path]))
    Path(out).write_bytes(buffer.getvalue())
    return json.loads(files[MANIFEST])
