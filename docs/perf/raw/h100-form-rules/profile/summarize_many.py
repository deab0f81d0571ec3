"""Summarise the Nsight Compute source page of profile_many.py (prof.sh): per form, the stall
samples per launch (launches 2 to 1 + N, the first of each form skipped), by reason and by tenth
of the program, and the most sampled instructions.

    python summarize_many.py src-t8.csv.gz [N] [TOP]     (N: the launches after the warm-up, 6)
"""

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "h100-spec-form-b1" / "profile"))
from summarize import SAMPLES, launches, number  # noqa: E402

FORMS = ("pos_dense", "spec", "spec_dense")  # profile_many.py's order


def main() -> None:
    path = sys.argv[1]
    per_form = 1 + (int(sys.argv[2]) if len(sys.argv) > 2 else 6)
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    tables = launches(path)
    for index, form in enumerate(FORMS):
        group = tables[index * per_form + 1 : (index + 1) * per_form]
        header = group[0][0]
        col = {name: i for i, name in enumerate(header)}
        reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        by_reason, by_line = collections.Counter(), collections.Counter()
        for table in group:
            rows = [r for r in table[1:] if len(r) == len(header)]
            for i, row in enumerate(rows):
                by_line[i] += number(row[col[SAMPLES]])
                for reason in reasons:
                    by_reason[reason[len("stall_") :]] += number(row[col[reason]])
        source = [r[col["Source"]] for r in group[0][1:] if len(r) == len(header)]
        k, n = len(group), len(source)
        print(f"{form}: {n} SASS instructions, {sum(by_line.values()) / k:.0f} samples a launch")
        print("  by reason: " + ", ".join(f"{r} {v / k:.0f}" for r, v in by_reason.most_common(8)))
        tenths = [
            sum(by_line[i] for i in range(n * q // 10, n * (q + 1) // 10)) / k for q in range(10)
        ]
        print("  by tenth of the program: " + " ".join(f"{t:.0f}" for t in tenths))
        for i, samples in by_line.most_common(top):
            print(f"  {i:5d} {samples / k:7.1f}  {source[i].strip()[:60]}")


if __name__ == "__main__":
    main()
