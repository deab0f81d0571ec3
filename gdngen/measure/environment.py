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


def environment() -> dict:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for package in ("nvidia-cutlass-dsl", "flashinfer-python", "fla-core", "apache-tvm-ffi"):
        versions[package] = version(package)
    for module, key in (("flashinfer", "flashinfer-python"), ("fla", "fla-core")):
        if versions[key] is None:
            try:
                versions[key] = getattr(__import__(module), "__version__", None)
            except Exception:  # noqa: BLE001
                pass
    return {
        "gpu": torch.cuda.get_device_name(),
        "sm": "sm_{}{}".format(*torch.cuda.get_device_capability()),
        "versions": versions,
        "gdngen_commit": source_commit(),
    }
