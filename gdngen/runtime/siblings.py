"""The targets emitted beside one another, and what to tell a caller on the wrong GPU.

A target's kernels run only on its own SM (``sm_90a`` code does not load on an sm_100a GPU, nor
the other way round). A call whose tensors sit on another SM's GPU is refused before anything is
compiled, with the import that serves that GPU, found among the packages emitted beside it.
"""

from __future__ import annotations

import importlib
import pkgutil

from gdngen.sm import SM_FACTS

from .info import TargetInfo


def targets_built_for(arch: str, package: str) -> list[str]:
    """The target packages under ``package`` (e.g. ``generated``) whose kernels are for ``arch``."""
    try:
        parent = importlib.import_module(package)
    except ImportError:
        return []
    found = []
    for entry in pkgutil.iter_modules(parent.__path__):
        if not entry.ispkg:
            continue
        name = f"{package}.{entry.name}"
        try:
            info = importlib.import_module(name).INFO
        except (ImportError, AttributeError):
            continue  # not a target package, or one that does not import here
        if getattr(info, "sm", None) == arch:
            found.append(name)
    return sorted(found)


def wrong_gpu_message(info: TargetInfo, arch: str, device_name: str, package: str) -> str:
    """Why a call on an ``arch`` GPU cannot run this target, and what would serve it."""
    facts = SM_FACTS.get(info.sm)
    built_for = f"{info.sm} ({facts.parts})" if facts else info.sm
    head = (
        f"q: target {info.name} is built for {built_for}; the tensors are on {device_name}, an "
        f"{arch} GPU."
    )
    serving = targets_built_for(arch, package)
    if serving:
        imports = " or ".join(f"`from {name} import gdn_decode`" for name in serving)
        return f"{head} Use {imports}."
    if arch in SM_FACTS:
        return (
            f"{head} No target under {package}/ is built for {arch}: write a spec with "
            f"`sm: {arch}` (specs/ has one for each SM gdngen supports) and run `gdngen emit` "
            f"on it."
        )
    return f"{head} gdngen has no {arch} target; it builds for {', '.join(SM_FACTS)}."
