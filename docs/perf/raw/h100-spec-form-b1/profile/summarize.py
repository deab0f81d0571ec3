"""Summarise Nsight Compute's source page (``--page source --print-source sass --csv``) of
profile_b1.py: per form (the second launch of each), the SASS instructions, the warp-level
instructions and global loads executed, the stall samples by reason, and the most sampled
instructions.

    python summarize.py src-t8-bf16.csv.gz [TOP]
"""

import collections
import csv
import gzip
import io
import sys

FORMS = ("pos_dense", "pos_packed", "spec")
SAMPLES = "Warp Stall Sampling (All Samples)"


def launches(path: str) -> list[list[list[str]]]:
    """The CSV table of each profiled launch, in launch order."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        text = f.read()
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            current = []
            tables.append(current)
        elif current is not None and line.strip():
            current.append(line)
    return [list(csv.reader(io.StringIO("\n".join(t)))) for t in tables]


def number(text: str) -> float:
    return float(text.replace(",", "") or 0)


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    tables = launches(path)
    for form, table in zip(FORMS, tables[1::2]):  # each form's second launch
        header, rows = table[0], [r for r in table[1:] if len(r) == len(table[0])]
        col = {name: i for i, name in enumerate(header)}
        reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        stalls = collections.Counter()
        for row in rows:
            for reason in reasons:
                stalls[reason[len("stall_") :]] += number(row[col[reason]])
        executed = sum(number(r[col["Instructions Executed"]]) for r in rows)
        loads = sum(
            number(r[col["Instructions Executed"]]) for r in rows if "LDG" in r[col["Source"]]
        )
        samples = sum(number(r[col[SAMPLES]]) for r in rows)
        print(
            f"{form}: {len(rows)} SASS instructions, {executed:.0f} executed (warp level), "
            f"{loads:.0f} global loads executed, {samples:.0f} stall samples"
        )
        print("  by reason: " + ", ".join(f"{k} {v:.0f}" for k, v in stalls.most_common(8)))
        for index, row in sorted(enumerate(rows), key=lambda ir: -number(ir[1][col[SAMPLES]]))[
            :top
        ]:
            worst = max(reasons, key=lambda reason: number(row[col[reason]]))
            print(
                f"  #{index:<5} {number(row[col[SAMPLES]]):4.0f} ({worst[len('stall_'):]}) "
                f"{row[col['Source']].strip()}"
            )


if __name__ == "__main__":
    main()
