"""vLLM's Triton kernels of the GDN decode chain, loaded from an unpacked bundle of its source
(``tools/vllm_bundle.py``) without importing vLLM: for the core bench's vLLM chain
(gdngen.bench.vllm_chain; docs/design.md, "Measuring") and the GPU test of the fused
speculative-decode adapter (tests/gpu/test_vllm_mtp_gpu.py).

``import vllm`` needs the whole engine and its dependencies. The kernel modules need little of
it: so the loader registers stand-in packages for ``vllm`` and each package on the way (their
``__path__`` is the bundle's folder, so a submodule loads from its file and no ``__init__``
runs), and stand-ins for the few modules whose code the kernels do not need
(``vllm_source.STOOD_IN``): vLLM's CUDA platform queries as vLLM answers them, a logger, Triton
itself, the SM count, and the index-table constants, read from vLLM's file without running it.
``einops``, imported by the norm module for its reference function only, gets a stand-in while
the modules load if it is not installed.

``vllm_kernels()`` returns the kernels, or why it cannot (a string), like the other optional
peers: the bench then reports the entries as missing.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import tarfile
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gdngen.measure.vllm_source import (
    CONSTANTS_MODULE,
    KERNEL_MODULES,
    MANIFEST,
    module_path,
)

#: where the bench finds the bundle when no ``--vllm-src`` is given: an unpacked folder or the
#: ``.tar.xz`` itself
SOURCE_ENV = "GDNGEN_VLLM_SRC"
#: marks the stand-ins this loader registered, to tell them from an imported vLLM
STAND_IN_MARK = "__gdngen_stand_in__"


@dataclass(frozen=True)
class VllmKernels:
    """vLLM's functions of the chain, called as vLLM's GDN layer calls them."""

    causal_conv1d_update: Callable
    packed_decode: Callable  # fused_recurrent_gated_delta_rule_packed_decode
    spec_decode: Callable  # fused_sigmoid_gating_delta_rule_update
    rmsnorm_fn: Callable  # the FLA-style Triton gated RMSNorm
    #: fused_gdn_decode_post_conv_mtp_triton: the Triton port of the fused speculative-decode
    #: op (recurrence and gated RMSNorm) with the arguments of torch.ops._C's
    mtp_decode: Callable
    null_block_id: int  # the slot id that marks a padded row (slot 0, the null block)
    version: str  # vLLM's, and the Triton that compiles its kernels here
    source: str


def vllm_kernels(source: str | Path | None = None) -> VllmKernels | str:
    """The kernels from ``source`` (a folder holding ``vllm/`` or the bundle's ``.tar.xz``;
    default ``$GDNGEN_VLLM_SRC``), or the reason they are missing."""
    source = source or os.environ.get(SOURCE_ENV)
    if not source:
        return (
            f"no vLLM source: pass --vllm-src or set {SOURCE_ENV} to a bundle that "
            "tools/vllm_bundle.py made from a vLLM wheel"
        )
    return _load(str(Path(source).resolve()))


@functools.cache
def _load(source: str) -> VllmKernels | str:
    path = Path(source)
    if path.is_file() and path.name.endswith(".tar.xz"):
        folder = Path(tempfile.mkdtemp(prefix="gdngen-vllm-src-"))
        with tarfile.open(path) as tar:
            tar.extractall(folder, filter="data")
        path = folder
    if not path.is_dir():
        return f"vLLM source {source}: expected a folder or a .tar.xz bundle; there is none"
    missing = [
        module_path(m)
        for m in [*KERNEL_MODULES.values(), CONSTANTS_MODULE]
        if not (path / module_path(m)).is_file()
    ]
    if missing:
        return f"vLLM source {path}: no {', '.join(missing)} (make it with tools/vllm_bundle.py)"
    if importlib.util.find_spec("triton") is None:
        return "vLLM's kernels need Triton, which is not installed"
    present = sys.modules.get("vllm")
    if present is not None and not getattr(present, STAND_IN_MARK, False):
        return "a vllm package is imported in this process: its kernels cannot load beside it"
    if present is not None and present.__path__ != [str(path / "vllm")]:
        return f"vLLM's kernels are loaded from {present.__path__[0]} already, not {path}"
    manifest = path / MANIFEST
    version = json.loads(manifest.read_text())["vllm_version"] if manifest.is_file() else "?"
    registered: list[str] = []
    try:
        _register_stand_ins(path, registered)
        with _einops_while_loading():
            modules = {role: importlib.import_module(m) for role, m in KERNEL_MODULES.items()}
    except Exception as error:  # noqa: BLE001: any failure makes the peer missing, with why
        for name in registered:
            sys.modules.pop(name, None)
        return f"loading vLLM's kernels from {path} failed: {type(error).__name__}: {error}"
    return VllmKernels(
        causal_conv1d_update=modules["conv"].causal_conv1d_update,
        packed_decode=modules["packed_decode"].fused_recurrent_gated_delta_rule_packed_decode,
        spec_decode=modules["spec_decode"].fused_sigmoid_gating_delta_rule_update,
        rmsnorm_fn=modules["triton_norm"].rmsnorm_fn,
        mtp_decode=modules["mtp_decode"].fused_gdn_decode_post_conv_mtp_triton,
        null_block_id=_constants(path)["NULL_BLOCK_ID"],
        version=f"{version} (Triton {sys.modules['triton'].__version__})",
        source=str(path),
    )


def _constants(folder: Path) -> dict[str, int]:
    """The integer constants assigned at the top of vLLM's index-table module, read without
    running it (it imports much of the engine)."""
    tree = ast.parse((folder / module_path(CONSTANTS_MODULE)).read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("NULL_BLOCK_ID", "PAD_SLOT_ID"):
                found[target.id] = ast.literal_eval(node.value)
    if set(found) != {"NULL_BLOCK_ID", "PAD_SLOT_ID"}:
        raise ValueError(f"{CONSTANTS_MODULE}: expected NULL_BLOCK_ID and PAD_SLOT_ID; got {found}")
    return found


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    setattr(module, STAND_IN_MARK, True)
    return module


def _register_stand_ins(folder: Path, registered: list[str]) -> None:
    """Stand-in packages for every folder of the bundle's ``vllm/`` and stand-in modules for
    ``STOOD_IN``, each name appended to ``registered`` as it is."""

    def register(name: str, module: types.ModuleType) -> None:
        sys.modules[name] = module
        registered.append(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)

    packages = [folder / "vllm"] + sorted(p for p in (folder / "vllm").rglob("*") if p.is_dir())
    for directory in packages:
        name = ".".join(directory.relative_to(folder).parts)
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(directory)]
        register(name, _module(name, __path__=[str(directory)], __spec__=spec, __package__=name))
    for name, module in _stood_in_modules(folder).items():
        for ancestor in _ancestors(name):  # a stood-in module's package need not be in the bundle
            if ancestor not in sys.modules:
                spec = importlib.machinery.ModuleSpec(ancestor, None, is_package=True)
                register(ancestor, _module(ancestor, __path__=[], __spec__=spec))
        register(name, module)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _stood_in_modules(folder: Path) -> dict[str, types.ModuleType]:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    platform = CudaPlatformStandIn()
    constants = _constants(folder)
    return {
        "vllm.platforms": _module("vllm.platforms", current_platform=platform),
        "vllm.logger": _module("vllm.logger", init_logger=logging.getLogger),
        "vllm.triton_utils": _module(
            "vllm.triton_utils", HAS_TRITON=True, triton=triton, tl=tl, tldevice=libdevice
        ),
        "vllm.utils.platform_utils": _module(
            "vllm.utils.platform_utils",
            num_compute_units=functools.cache(platform.num_compute_units),
        ),
        CONSTANTS_MODULE: _module(CONSTANTS_MODULE, **constants),
    }


class _EinopsStandIn(types.ModuleType):
    """In place of einops while the modules load: the norm module imports ``rearrange`` for its
    reference function, which the chain never calls."""

    def __init__(self):
        super().__init__("einops")

    @staticmethod
    def rearrange(*args, **kwargs):
        raise NotImplementedError("einops is not installed: its stand-in only let vLLM load")


class _einops_while_loading:
    def __enter__(self):
        self.standing_in = importlib.util.find_spec("einops") is None
        if self.standing_in:
            sys.modules["einops"] = _EinopsStandIn()

    def __exit__(self, *exc):
        if self.standing_in:
            sys.modules.pop("einops", None)


class _Capability(tuple):
    """vLLM's DeviceCapability: (major, minor), ``to_int()`` = major * 10 + minor."""

    def to_int(self) -> int:
        return self[0] * 10 + self[1]


class CudaPlatformStandIn:
    """The queries the kernel modules make of vLLM's ``current_platform``, answered as vLLM's
    CUDA platform answers them (vllm/platforms/cuda.py, interface.py): a CUDA platform whose
    capability queries read torch's device, and which launches with programmatic dependent
    launch from SM 9.0 on."""

    device_type = "cuda"

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def get_device_capability(self, device_id: int = 0) -> _Capability | None:
        import torch

        if not torch.cuda.is_available():
            return None
        return _Capability(torch.cuda.get_device_capability(device_id))

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        wanted = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return current.to_int() >= wanted

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        wanted = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return current.to_int() == wanted

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        return current is not None and current.to_int() // 10 == capability // 10

    def is_arch_support_pdl(self) -> bool:
        import torch

        try:
            major, _ = torch.cuda.get_device_capability(torch.cuda.current_device())
        except Exception:  # noqa: BLE001: no device, no PDL (vLLM's own answer)
            return False
        return major >= 9

    def num_compute_units(self, device_id: int = 0) -> int:
        import torch

        return torch.cuda.get_device_properties(device_id).multi_processor_count

    def get_device_name(self, device_id: int = 0) -> str:
        import torch

        return torch.cuda.get_device_name(device_id)
