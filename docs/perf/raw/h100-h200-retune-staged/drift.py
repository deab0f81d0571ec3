"""How far a re-tune's timings of unchanged kernels moved from the committed ones, per cell:
the median over the cell's kernels whose code did not change (every non-staged one here) of
new / committed, summarised per T; and the cells off by more than 5%
(docs/perf/h100-h200-2026-11-25-retune-staged.md).

usage: python drift.py COMMITTED_TUNING.yaml NEW_TUNE_DIR
(COMMITTED: `git show 65ea5a7:specs/h200.tuning.h100.yaml` or `...:specs/h200.tuning.yaml`;
NEW_TUNE_DIR: h100-tune.tar.xz or h200-tune.tar.xz unpacked, its rt/ folder)
"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from gdngen.tune.tuning_file import read_tuning


def cells(paths: list[Path]) -> dict[tuple, dict[str, float]]:
    return {
        (c.tokens, c.mode, c.HV, c.batch): c.times_us
        for path in paths
        for c in read_tuning(path).cells
        if (c.layout, c.state_dtype, c.K) == ("k_last", "bf16", None)
    }


def main() -> None:
    old = cells([Path(sys.argv[1])])
    new = cells(sorted(Path(sys.argv[2]).glob("*.yaml")))
    per_T = defaultdict(list)
    off = []
    for key, times in sorted(new.items()):
        ratios = [
            us / old[key][n] for n, us in times.items() if n in old[key] and "staged" not in n
        ]
        if key not in old or not ratios:
            continue
        median = statistics.median(ratios)
        per_T[key[0]].append(median)
        if abs(median - 1) > 0.05:
            off.append((key, round(median, 3)))
    for T, medians in sorted(per_T.items()):
        print(
            f"T={T}: median {statistics.median(medians):.3f} (min {min(medians):.3f}, max {max(medians):.3f})"
        )
    print("cells off by more than 5% (T, mode, HV, B):", off)


if __name__ == "__main__":
    main()
