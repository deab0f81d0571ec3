"""The FlashInfer forms bench's report (gdngen.bench.fi_forms): per form a table of its cells,
and a line with the count of cells where gdngen is slower than FlashInfer and the geometric mean
of FlashInfer / gdngen; the same over every form.

A record is one cell's dict as the bench writes it: the cell's fields (``FiCell.record``) and
either ``us`` (µs per call of each side) with ``ratio`` (FlashInfer / gdngen), or ``us`` None
with ``not_timed`` (why: gdngen refuses the call, the two disagree, or a call fails) or
``skipped`` (FlashInfer does not serve the cell).
"""

from __future__ import annotations

import json

from gdngen.bench.fi_forms_inputs import FORMS
from gdngen.bench.run_records import join_runs
from gdngen.measure.summary import geometric_mean

#: the bench's two sides, as ``us`` names them
FLASHINFER, GDNGEN = "flashinfer", "gdngen"


def ratio(us: dict[str, float]) -> float:
    """FlashInfer over gdngen: above 1, gdngen is faster."""
    return us[FLASHINFER] / us[GDNGEN]


def where(r: dict) -> str:
    return f"{r['form']} {r['state_dtype']} HV={r['HV']} T={r['tokens']} B={r['batch']}"


def key(r: dict) -> tuple:
    return (r["form"], r["state_dtype"], r["HV"], r["tokens"], r["batch"])


def _tally(records: list[dict]) -> dict:
    timed = [r for r in records if r.get("us") is not None]
    ratios = [r["ratio"] for r in timed]
    return dict(
        cells=len(timed),
        slower=[where(r) for r in timed if r["ratio"] < 1],
        geomean=geometric_mean(ratios) if ratios else None,
        untimed=[where(r) for r in records if r.get("not_timed")],
        skipped=[where(r) for r in records if r.get("skipped")],
    )


def summary(records: list[dict]) -> dict:
    """Per form (in the order the cells ran) and over all of them: the cells timed, those where
    gdngen is slower (FlashInfer / gdngen < 1), the geometric mean of FlashInfer / gdngen, the
    cells not timed, the cells FlashInfer does not serve."""
    forms: dict[str, list[dict]] = {}
    for r in records:
        forms.setdefault(r["form"], []).append(r)
    return dict(
        forms={name: _tally(group) for name, group in forms.items()}, overall=_tally(records)
    )


def dump(records: list[dict], env: dict) -> str:
    """The JSON record: the environment, every cell, and the summary."""
    return json.dumps(dict(environment=env, records=records, summary=summary(records)), indent=1)


def join(saved: list[dict]) -> tuple[list[dict], dict]:
    """The records of several runs' JSON (``dump``'s, read back) as one run's
    (gdngen.bench.run_records.join_runs)."""
    return join_runs(saved, key=key, where=where)


def _versions(env: dict) -> str:
    versions = env.get("versions") or {}
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v) or "unknown"


def _tally_line(name: str, tally: dict) -> str:
    if tally["geomean"] is None:
        line = f"{name}: no cell timed"
    else:
        line = (
            f"{name}: {tally['cells']} cells timed, {len(tally['slower'])} slower than "
            f"FlashInfer, geometric mean FlashInfer / gdngen {tally['geomean']:.2f}x"
        )
    if tally["slower"]:
        line += f"; slower: {'; '.join(tally['slower'])}"
    if tally["untimed"]:
        line += f"; not timed: {len(tally['untimed'])}"
    if tally["skipped"]:
        line += f"; not served by FlashInfer: {len(tally['skipped'])}"
    return line + "."


def _row(r: dict) -> str:
    head = f"| {r['state_dtype']} | {r['HV']} | {r['tokens']} | {r['batch']} "
    variant = f"`{r['variant']}`" if r.get("variant") else "-"
    if r.get("us") is None:
        why = f"not timed: {r['not_timed']}" if r.get("not_timed") else f"skipped: {r['skipped']}"
        return head + f"| - | - | {why} | {variant} | - | - |"
    errors = r["errors"]
    return head + (
        f"| {r['us'][FLASHINFER]:.2f} | {r['us'][GDNGEN]:.2f} | {r['ratio']:.2f} | {variant} "
        f"| {errors['output']:.2g} | {errors['state']:.2g} |"
    )


def markdown(records: list[dict], env: dict) -> str:
    """The environment, a section per form (what it is, FlashInfer's entry, its cells, its
    line), and the lines over every form."""
    lines = [
        f"GPU: {env.get('gpu')} ({env.get('sm')}, driver {env.get('driver')}); "
        f"copy bandwidth {env.get('copy_GBps', 0):.0f} GB/s; gdngen {env.get('gdngen_commit')}",
        f"FlashInfer {env.get('flashinfer')}; versions: {_versions(env)}",
    ]
    figures = summary(records)
    for name, tally in figures["forms"].items():
        form = FORMS[name]
        entries = ", ".join(f"{dtype}: `{entry}`" for dtype, entry in form.entries)
        lines += ["", f"### {name}", "", f"{form.what}. FlashInfer: {entries}."]
        if form.note:
            lines.append(f"Note: {form.note}.")
        pdl = {r.get("flashinfer_pdl") for r in records if r["form"] == name} - {None}
        if pdl:
            lines.append(
                "FlashInfer called with enable_pdl=True."
                if pdl == {True}
                else "FlashInfer called without enable_pdl (its entry has no such keyword)."
            )
        lines += [
            "",
            f"| state | HV | T | B | {FLASHINFER} µs | {GDNGEN} µs | {FLASHINFER} / {GDNGEN} "
            "| gdngen variant | output error | state error |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_row(r) for r in records if r["form"] == name]
        lines += ["", _tally_line(name, tally)]
    lines += [
        "",
        "## All forms",
        "",
        "| form | cells | slower | geometric mean |",
        "|---|---|---|---|",
    ]
    for name, tally in [*figures["forms"].items(), ("all", figures["overall"])]:
        geomean = "-" if tally["geomean"] is None else f"{tally['geomean']:.2f}x"
        lines.append(f"| {name} | {tally['cells']} | {len(tally['slower'])} | {geomean} |")
    lines += ["", _tally_line("All forms", figures["overall"])]
    if figures["overall"]["untimed"]:
        lines.append("Cells not timed: " + "; ".join(figures["overall"]["untimed"]) + ".")
    return "\n".join(lines) + "\n"
