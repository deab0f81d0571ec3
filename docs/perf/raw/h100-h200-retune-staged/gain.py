"""Per re-tuned cell, the kernel one dispatch table picks against the kernel another picks, both
timed in the same cell of the new tune; then the register-capped one-pass staged kernel against
the uncapped one at B >= 64 (docs/perf/h100-h200-2026-11-25-retune-staged.md).

usage: python gain.py OLD_DISPATCH.py NEW_DISPATCH.py H100_TUNE_DIR H200_TUNE_DIR
(OLD: `git show 65ea5a7:generated/h200/dispatch.py`; NEW: the merged branch's; the dirs hold
the tune jobs' .yaml files, e.g. h100-tune.tar.xz unpacked)
"""

import collections
import importlib.util
import math
import sys
from pathlib import Path

from gdngen.dispatch.rules import CallShape, select
from gdngen.tune.tuning_file import read_tuning


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table(module, gpu: str):
    return module.TABLE if module.TABLE_GPU == gpu else module.TABLES[gpu]


def main() -> None:
    old, new = load(sys.argv[1], "old_dispatch"), load(sys.argv[2], "new_dispatch")
    print(
        "| GPU | T | mode | cells | old pick / new pick | max (HV, B) | new pick over fastest, max |"
    )
    print("|---|---|---|---|---|---|---|")
    for gpu, folder in (("H100", sys.argv[3]), ("H200", sys.argv[4])):
        rows = collections.defaultdict(list)
        for path in sorted(Path(folder).glob("*.yaml")):
            for c in read_tuning(path).cells:
                shape = CallShape(
                    c.layout, c.state_dtype, c.tokens, c.batch * c.HV, c.mode == "verify",
                    (c.K or 128, c.V or 128), heads=c.HV,
                )  # fmt: skip
                before = select(table(old, gpu), shape).use
                after = select(table(new, gpu), shape).use
                times = c.times_us
                rows[(c.tokens, c.mode)].append(
                    (
                        times[before] / times[after],
                        times[after] / min(times.values()),
                        c.HV,
                        c.batch,
                    )
                )
        for (T, mode), cells in sorted(rows.items()):
            mean = math.exp(sum(math.log(x[0]) for x in cells) / len(cells))
            top = max(cells, key=lambda x: x[0])
            off = max(cells, key=lambda x: x[1])
            print(
                f"| {gpu} | {T} | {mode} | {len(cells)} | {mean:.3f} | {top[0]:.3f} ({top[2]}, "
                f"{top[3]}) | {100 * (off[1] - 1):+.1f}% ({off[2]}, {off[3]}) |"
            )
    capped()


UNCAPPED = "kl_bf16_tv128_ilp8_vec8_tpg16_staged_sm90"
CAPPED = "kl_bf16_tv128_ilp8_vec8_tpg16_occ2_staged_sm90"


def capped() -> None:
    print("\n| GPU | T | mode | uncapped / occ2 (min-max) | occ2 the cell's fastest |")
    print("|---|---|---|---|---|")
    for gpu, folder in (("H100", sys.argv[3]), ("H200", sys.argv[4])):
        rows = collections.defaultdict(list)
        for path in sorted(Path(folder).glob("*.yaml")):
            for c in read_tuning(path).cells:
                if c.tokens in (4, 8) and c.batch >= 64:
                    fastest = min(c.times_us, key=c.times_us.get) == CAPPED
                    rows[(c.tokens, c.mode)].append(
                        (c.times_us[UNCAPPED] / c.times_us[CAPPED], fastest)
                    )
        for (T, mode), cells in sorted(rows.items()):
            ratios = [r for r, _ in cells]
            mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            wins = sum(w for _, w in cells)
            print(
                f"| {gpu} | {T} | {mode} | {mean:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
                f"{wins} of {len(cells)} |"
            )


if __name__ == "__main__":
    main()
