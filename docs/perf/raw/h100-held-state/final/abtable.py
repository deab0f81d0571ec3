"""Markdown table of packed_forms.py runs side by side: per cell, each run's dense / packed /
spec µs and spec over dense. From a folder of `ab-NAME.jsonl` files:

    python abtable.py NAME [NAME ...]
"""

import json
import sys


def load(path):
    cells = {}
    try:
        with open(path) as lines:
            for line in lines:
                rec = json.loads(line)
                cells[(rec["B"], rec["T"], rec["dtype"])] = rec
    except FileNotFoundError:
        pass
    return cells


names = sys.argv[1:]
runs = {name: load(f"ab-{name}.jsonl") for name in names}
print("| cell | kernel | " + " | ".join(f"{n}: dense / packed / spec (÷)" for n in names) + " |")
for cell in runs[names[0]]:
    row = []
    for name in names:
        rec = runs[name].get(cell)
        if not rec:
            row.append("-")
            continue
        us = rec["us"]
        ratio = us["spec"] / us["pos_dense"]
        row.append(
            f"{us['pos_dense']:.2f} / {us['pos_packed']:.2f} / {us['spec']:.2f} ({ratio:.3f})"
        )
    kernel = runs[names[0]][cell]["variants"]["pos_dense"].replace("_sm90", "")
    B, T, dtype = cell
    print(f"| {dtype} T = {T}, B = {B} | `{kernel}` | " + " | ".join(row) + " |")
