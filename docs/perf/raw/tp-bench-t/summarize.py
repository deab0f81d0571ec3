"""Summary tables of the TP grid's bench records (issue 19), per GPU: one row per layout, state
dtype, mode and T, against FlashInfer and FLA, and the dispatched call against the fastest single
variant timed beside it; then every cell below 1.00x FlashInfer or over the 3% dispatch gap.

usage: python summarize.py GPU_NAME DIR [GPU_NAME DIR ...]   (each DIR holds one GPU's .json
reports and the .jsonl records of runs that stopped before writing them)
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

from gdngen.bench.report import DISPATCH_TOLERANCE, dispatch_excess, speedup
from gdngen.bench.run import Result, read_record_file


def records(folder: Path) -> list[Result]:
    paths = sorted(folder.glob("*.json")) + sorted(folder.glob("*.jsonl"))
    return [result for path in paths for result in read_record_file(path)[1]]


def cells(results: list[Result]) -> dict[tuple, dict[str, Result]]:
    by_cell: dict[tuple, dict[str, Result]] = defaultdict(dict)
    for r in results:
        key = (r.layout, r.state_dtype, r.mode, r.tokens, r.HV, r.batch)
        by_cell[key][r.impl] = r  # "gdngen" (the dispatched call), a variant's name, or a peer
    return by_cell


def ratio(by_impl: dict[str, Result], peer: str) -> float | None:
    return speedup(by_impl.get("gdngen"), by_impl.get(peer))


def span(values: list[float]) -> str:
    if not values:
        return "n/a"
    mean = math.exp(sum(map(math.log, values)) / len(values))
    return f"{mean:.2f}x ({min(values):.2f}-{max(values):.2f}x)"


def main(argv: list[str]) -> None:
    for gpu, folder in zip(argv[::2], argv[1::2]):
        by_cell = cells(records(Path(folder)))
        rows: dict[tuple, list] = defaultdict(list)
        for key, by_impl in by_cell.items():
            rows[key[:4]].append((key, by_impl))
        print(f"\n### {gpu}\n")
        print("| layout | state | mode | T | cells | vs FlashInfer | vs FLA | dispatch within 3% "
              "| largest gap (HV, B) |")
        print("|---|---|---|---|---|---|---|---|---|")
        slow, far = [], []
        for group in sorted(rows):
            members = rows[group]
            fi = [x for _, c in members if (x := ratio(c, "flashinfer")) is not None]
            fla = [x for _, c in members if (x := ratio(c, "fla")) is not None]
            gaps = [(e, k) for k, c in members if (e := dispatch_excess(c)) is not None]
            within = sum(e <= DISPATCH_TOLERANCE for e, _ in gaps)
            worst = max(gaps) if gaps else None
            slow += [(k, x) for k, c in members if (x := ratio(c, "flashinfer")) and x < 1.0]
            far += [(k, e) for e, k in gaps if e > DISPATCH_TOLERANCE]
            layout, dtype, mode, tokens = group
            print(f"| {layout} | {dtype} | {mode} | {tokens} | {len(members)} | {span(fi)} "
                  f"| {span(fla)} | {within} of {len(gaps)} | "
                  + (f"{100 * worst[0]:+.1f}% ({worst[1][4]}, {worst[1][5]})" if worst else "-")
                  + " |")
        print(f"\nBelow 1.00x FlashInfer: {len(slow)} cells" + "".join(
            f"\n- {k}: {x:.3f}x" for k, x in sorted(slow)))
        print(f"\nOver the {100 * DISPATCH_TOLERANCE:g}% dispatch gap: {len(far)} cells" + "".join(
            f"\n- {k}: {100 * e:+.1f}%" for k, e in sorted(far)))


if __name__ == "__main__":
    main(sys.argv[1:])
