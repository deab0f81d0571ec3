"""The old-vs-new table of docs/perf/h200-2026-11-24-tp-tune.md, from the tuning files.

For each cell of the H200 tuning file that the old file lacks: how far the variant each
dispatch table picks is from the fastest variant timed in that cell (mean gap over the cell's
timings, as tests/test_tuning.py measures it). "Old" is the table emit derives from the tuning
file at OLD_REV (HV 32 and 64 only), "new" the one it derives from the working tree's file; both
are rebuilt with gdngen.dispatch.measured_rules, the code emit uses. The new picks are checked
against the emitted generated/h200 dispatch. Cells of the base head dims (K = V = 128) only.

usage (repo root): .venv/bin/python docs/perf/raw/h200-tp-tune/old_vs_new.py [OLD_REV [FILE GPU]]
  OLD_REV: the commit whose tuning file is "old" (default d387eb3, before the merge)
  FILE, GPU: another GPU model's tuning file and its model, e.g. specs/h200.tuning.h100.yaml H100
  (default specs/h200.tuning.yaml H200)
"""

import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from gdngen.dispatch import CallShape, measured_rules, select
from gdngen.spec import load_spec
from gdngen.tune.tuning_file import load_tuning

ROOT = Path(__file__).resolve().parents[4]
FILE = sys.argv[2] if len(sys.argv) > 3 else "specs/h200.tuning.yaml"
GPU = sys.argv[3] if len(sys.argv) > 3 else "H200"


def rules_of(path: Path, spec, name: str):
    measured = load_tuning(path, spec, name, gpu=GPU)
    assert not measured.stale, measured.stale
    cells = [c for c in measured.cells if c.K is None]
    pairs = sorted({(c.layout, c.state_dtype) for c in cells})
    return cells, measured_rules(cells, pairs, spec.features.max_tokens, spec.tuning_head_dims)


def key(cell):
    return (cell.layout, cell.state_dtype, cell.tokens, cell.mode, cell.HV, cell.batch)


def gap(cell, rules, spec) -> float:
    """The picked variant's mean gap to the fastest, over the cell's timings."""
    shape = CallShape(
        cell.layout, cell.state_dtype, cell.tokens, cell.batch_heads,
        cell.mode == "verify", spec.tuning_head_dims, heads=cell.HV,
    )  # fmt: skip
    use = select(rules, shape).use
    gaps = [times[use] / min(times.values()) - 1 for times in cell.timings]
    return sum(gaps) / len(gaps), use


def main() -> None:
    old_rev = sys.argv[1] if len(sys.argv) > 1 else "d387eb3"
    spec = load_spec(ROOT / "specs" / "h200.yaml")
    old_text = subprocess.run(
        ["git", "show", f"{old_rev}:{FILE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / Path(FILE).name
        old_path.write_text(old_text)
        old, old_rules = rules_of(old_path, spec, FILE)
    new, new_rules = rules_of(ROOT / FILE, spec, FILE)

    import generated.h200 as emitted  # the committed table must agree with the rebuilt one

    old_keys = {key(c) for c in old}
    groups = defaultdict(list)
    all_new_off, worst_all, off_cells = 0, (0.0, None), []
    for cell in new:
        g_new, use = gap(cell, new_rules, spec)
        picked = emitted.select(
            layout=cell.layout, state_dtype=cell.state_dtype, tokens=cell.tokens,
            batch_heads=cell.batch_heads, intermediate=cell.mode == "verify",
            head_dims=spec.tuning_head_dims, gpu=GPU, heads=cell.HV,
        ).use  # fmt: skip
        assert picked == use, (key(cell), picked, use)
        best = min(min(times.values()) for times in cell.timings)
        all_new_off += g_new > 0.03
        if g_new > 0.03:
            fastest = min(cell.times_us, key=cell.times_us.get)
            off_cells.append(
                f"{key(cell)} B*HV={cell.batch_heads}: picks {use} {g_new:+.1%}, "
                f"fastest {fastest} {cell.times_us[fastest]:.2f} us"
            )
        if g_new > worst_all[0]:
            worst_all = (g_new, key(cell))
        if key(cell) in old_keys:
            continue
        g_old, _ = gap(cell, old_rules, spec)
        groups[(f"{cell.layout}/{cell.state_dtype}", cell.tokens, cell.mode)].append(
            (cell.HV, cell.batch, best, g_old, g_new)
        )

    print(
        "| pair | T | mode | cells | old: > 3% off | old: worst (cell, its best time) "
        "| new: > 3% off | new: worst |"
    )
    print("|---|---|---|---|---|---|---|---|")
    totals = [0, 0, 0]
    worst_old = (0.0, None)
    for (pair, tokens, mode), rows in sorted(groups.items()):
        rows.sort()
        o = max(rows, key=lambda r: r[3])  # first (HV, B) at the worst
        n = max(rows, key=lambda r: r[4])
        off_old = sum(r[3] > 0.03 for r in rows)
        off_new = sum(r[4] > 0.03 for r in rows)
        totals = [totals[0] + len(rows), totals[1] + off_old, totals[2] + off_new]
        if o[3] > worst_old[0]:
            worst_old = (o[3], (pair, tokens, mode, o[0], o[1]))
        print(
            f"| {pair} | {tokens} | {mode} | {len(rows)} | {off_old} "
            f"| {o[3]:+.1%} (HV={o[0]}, B={o[1]}, {o[2]:.1f} us) | {off_new} "
            f"| {n[4]:+.1%} (HV={n[0]}, B={n[1]}) |"
        )
    print()
    print(f"new cells: {totals[0]}; old table > 3% off in {totals[1]}, new table in {totals[2]}")
    print(f"old worst: {worst_old[0]:+.1%} at {worst_old[1]}")
    print(
        f"all {len(new)} K = 128 cells of the file: new table > 3% off in {all_new_off}; "
        f"worst {worst_all[0]:+.1%} at {worst_all[1]}"
    )
    for line in off_cells:
        print(f"  > 3% off: {line}")


if __name__ == "__main__":
    main()
