"""What a measurement ran on: GPU, versions and the source commit, recorded with every result."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata

import torch


def source_commit(cwd: str | None = None) -> str | None:
    """The checkout's commit hash (tags ignored), ``-dirty`` appended when tracked files differ
    from it: a record timed on uncommitted kernels must not pass for one of the commit's."""
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
            capture_output=True, text=True, check=True, cwd=cwd,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def gpu_uuid() -> str | None:
    """The current GPU's UUID as nvidia-smi prints it (GPU-...), None where torch has none."""
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return None if uuid is None else f"GPU-{uuid}"


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi prints it (e.g. 570.133.20), None without one."""
    try:
        lines = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return lines[0] if lines else None


def environment() -> dict:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    versions = {"torch": torch.__version__, "python": platform.python_version()}
    packages = ("nvidia-cutlass-dsl", "triton", "flashinfer-python", "fla-core", "apache-tvm-ffi")
    for package in packages:
        versions[package] = version(package)
    for module, key in (("flashinfer", "flashinfer-python"), ("fla", "fla-core")):
        if versions[key] is None:
            try:
                versions[key] = getattr(__import__(module), "__version__", None)
            except Exception:  # noqa: BLE001
                pass
    return {
        "gpu": torch.cuda.get_device_name(),
        # which card of the machine (runs side by side on several GPUs of one host each record
        # theirs: CUDA_VISIBLE_DEVICES renumbers the cards, the UUID does not)
        "gpu_uuid": gpu_uuid(),
        "sm": "sm_{}{}".format(*torch.cuda.get_device_capability()),
        "driver": driver_version(),
        "versions": versions,
        "gdngen_commit": source_commit(),
    }
