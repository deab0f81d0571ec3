"""The fused MTP bench's report (gdngen.bench.mtp): one row per cell, the geometric means of
vLLM's port over gdngen's adapter per (state dtype, model) and overall, and whether the target
holds (a geometric mean of at least TARGET_SPEEDUP and no cell where the adapter is slower).

A record is one cell's dict as the bench writes it: the cell's fields, ``us`` (µs per call of
each entry) and ``ratio`` (port / adapter), or ``us`` None and ``not_timed`` (why: the two disagree, or gdngen refuses the call).
"""

from __future__ import annotations

import json

from gdngen.bench.run_records import join_runs
from gdngen.measure.summary import geometric_mean

#: the bench's entries, as ``us`` names them
PORT, ADAPTER = "vllm triton port", "gdngen adapter"
#: the issue's target: the port over the adapter, in geometric mean
TARGET_SPEEDUP = 1.2


def ratio(us: dict[str, float]) -> float:
    """vLLM's port over gdngen's adapter: above 1, the adapter is faster."""
    return us[PORT] / us[ADAPTER]


def timed(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("us") is not None]


def summary(records: list[dict]) -> dict:
    """The geometric mean of the ratios per (state dtype, model) in the order the cells ran, and
    over every timed cell; the cells where the adapter is slower; the cells not timed; and
    whether the target holds (every cell timed, the overall mean >= TARGET_SPEEDUP, none
    slower)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in timed(records):
        groups.setdefault((r["state_dtype"], r["model"]), []).append(r["ratio"])
    ratios = [r["ratio"] for r in timed(records)]
    overall = geometric_mean(ratios) if ratios else None
    slower = [_where(r) for r in timed(records) if r["ratio"] < 1]
    untimed = [_where(r) for r in records if r.get("us") is None]
    return dict(
        groups=[
            dict(state_dtype=dtype, model=model, cells=len(values), geomean=geometric_mean(values))
            for (dtype, model), values in groups.items()
        ],
        overall=overall,
        cells=len(ratios),
        slower=slower,
        untimed=untimed,
        target_met=bool(ratios and not untimed and not slower and overall >= TARGET_SPEEDUP),
    )


def _where(r: dict) -> str:
    return f"{r['state_dtype']} {r['model']} 1+S={r['tokens']} B={r['batch']}"


def dump(records: list[dict], env: dict) -> str:
    """The JSON record: the environment, every cell, and the summary."""
    return json.dumps(dict(environment=env, records=records, summary=summary(records)), indent=1)


def join(saved: list[dict]) -> tuple[list[dict], dict]:
    """The records of several runs' JSON (``dump``'s, read back) as one run's
    (gdngen.bench.run_records.join_runs): a cell is its state dtype, HV, 1 + S and batch."""
    return join_runs(
        saved, key=lambda r: (r["state_dtype"], r["HV"], r["tokens"], r["batch"]), where=_where
    )


def _versions(env: dict) -> str:
    versions = env.get("versions") or {}
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v) or "unknown"


def markdown(records: list[dict], env: dict) -> str:
    """The cells as one table, then the geometric means and the verdict on the target."""
    lines = [
        f"GPU: {env.get('gpu')} ({env.get('sm')}, driver {env.get('driver')}); "
        f"copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s; gdngen {env.get('gdngen_commit')}",
        f"vLLM's port: {env.get('vllm')}; versions: {_versions(env)}",
        "",
        f"| state | model | HV | 1+S | B | {PORT} µs | {ADAPTER} µs | port / adapter "
        "| gdngen variant | output error | state error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        head = f"| {r['state_dtype']} | {r['model']} | {r['HV']} | {r['tokens']} | {r['batch']} "
        if r.get("us") is None:
            lines.append(
                head + f"| - | - | not timed: {r['not_timed']} | `{r.get('variant')}` | - | - |"
            )
            continue
        errors = r["errors"]
        lines.append(
            head + f"| {r['us'][PORT]:.2f} | {r['us'][ADAPTER]:.2f} | {r['ratio']:.2f} "
            f"| `{r['variant']}` | {errors['output']:.2g} | {errors['state']:.2g} |"
        )
    figures = summary(records)
    lines += ["", "| state | model | cells | geometric mean port / adapter |", "|---|---|---|---|"]
    for group in figures["groups"]:
        lines.append(
            f"| {group['state_dtype']} | {group['model']} | {group['cells']} "
            f"| {group['geomean']:.2f}x |"
        )
    if figures["overall"] is not None:
        lines.append(f"| all | all | {figures['cells']} | {figures['overall']:.2f}x |")
    lines.append("")
    lines.append(
        f"Target (geometric mean >= {TARGET_SPEEDUP}x, no cell slower): "
        + ("met." if figures["target_met"] else "not met.")
    )
    if figures["slower"]:
        lines.append("Cells where the adapter is slower: " + "; ".join(figures["slower"]) + ".")
    if figures["untimed"]:
        lines.append("Cells not timed: " + "; ".join(figures["untimed"]) + ".")
    return "\n".join(lines) + "\n"
