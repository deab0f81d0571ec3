"""Benchmark results as a readable markdown table (and the metadata that makes it reproducible)."""

from __future__ import annotations

import math
import platform
import subprocess
from collections import defaultdict
from importlib import metadata

import torch

from .run import Result

PEER_TITLES = {"flashinfer": "FlashInfer", "fla": "FLA"}
LAYOUT_TITLES = {"k_last": "K-last [B,HV,V,K]", "v_last": "V-last [B,HV,K,V]"}


def environment() -> dict:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
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
        "gdngen_commit": commit,
    }


def _cell(result: Result | None) -> str:
    if result is None:
        return "-"
    if result.us is None:
        return "n/a" if result.status.startswith("n/a") else "failed"
    text = f"{result.us:.2f} ({100 * result.sol:.0f}%)"
    if result.status != "ok":
        text += " !"
    return text


def _speedup(ours: Result | None, peer: Result | None) -> float | None:
    if ours is None or peer is None or ours.us is None or peer.us is None:
        return None
    return peer.us / ours.us


def markdown(results: list[Result], meta: dict, ours: str = "gdngen") -> str:
    peers = [name for name in PEER_TITLES if any(r.impl == name for r in results)]
    groups: dict[tuple, dict[tuple, dict[str, Result]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        groups[(r.layout, r.state_dtype, r.mode, r.tokens)][(r.HV, r.batch)][r.impl] = r
    lines = [
        f"GPU: {meta['gpu']} ({meta['sm']}), copy bandwidth {meta['copy_bw'] / 1e12:.2f} TB/s "
        f"(1 GiB device-to-device copy, read + write).",
        f"Date: {meta['date']}. Command: `{meta['command']}`.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v) + ".",
        "",
        "Each cell: microseconds per call (percent of copy bandwidth for the bytes the call must "
        "move: state read, state written unless verify, intermediate states if cached, plus q/k/v/"
        "gates/output). CUDA graph of back-to-back calls over rotating input sets >= 4x L2, median "
        "of 25 replays; every implementation checked against the float64 reference first, all in "
        "one process. Speedup = peer time / gdngen time. `n/a`: the peer has no such path; `!`: "
        "its check against the reference failed.",
        "",
    ]
    for (layout, state_dtype, mode, tokens), cells in sorted(groups.items()):
        lines.append(f"### {LAYOUT_TITLES[layout]}, {state_dtype} state, T={tokens}, {mode}")
        lines.append("")
        header = ["HV", "B", "gdngen us (%SOL)", "variant"]
        header += [f"{PEER_TITLES[p]} us (%SOL)" for p in peers]
        header += [f"vs {PEER_TITLES[p]}" for p in peers]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for (HV, batch), by_impl in sorted(cells.items()):
            mine = by_impl.get(ours)
            row = [str(HV), str(batch), _cell(mine), f"`{mine.variant}`" if mine and mine.variant else "-"]
            row += [_cell(by_impl.get(p)) for p in peers]
            for p in peers:
                s = _speedup(mine, by_impl.get(p))
                row.append("-" if s is None else f"{s:.2f}x")
            lines.append("| " + " | ".join(row) + " |")
        for p in peers:
            ratios = [
                s for cell in cells.values() if (s := _speedup(cell.get(ours), cell.get(p))) is not None
            ]
            if ratios:
                geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                lines.append("")
                lines.append(
                    f"vs {PEER_TITLES[p]}: geometric mean {geo:.2f}x, min {min(ratios):.2f}x, "
                    f"max {max(ratios):.2f}x over {len(ratios)} cells."
                )
        lines.append("")
    problems = [r for r in results if r.status not in ("ok",) and not r.status.startswith("n/a")]
    if problems:
        lines.append("### Problems")
        lines.append("")
        for r in problems:
            lines.append(
                f"- {r.impl} {r.layout} {r.state_dtype} {r.mode} T={r.tokens} HV={r.HV} "
                f"B={r.batch}: {r.status}"
            )
        lines.append("")
    return "\n".join(lines)
