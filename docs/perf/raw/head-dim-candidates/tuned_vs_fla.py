"""The head-dims table of docs/perf/h100-2026-11-25-head-dims-tuned.md, from a bench record.

The bench (run.sh) timed every candidate of head dims 64 and 256 side by side with FLA and with
the call dispatched by the static rules of the time. This reads, for each cell, the variant the
dispatch tables emitted since (generated/h200, tuned) pick and that variant's time in the same
bench, so the tuned picks are judged on timings the tune did not take.

usage (repo root): .venv/bin/python docs/perf/raw/head-dim-candidates/tuned_vs_fla.py RECORD GPU
  RECORD: hd64.json or hd256.json of a bench; GPU: H100 or H200 (the table of that model)
"""

import json
import math
import sys
from collections import defaultdict

import generated.h200 as h200


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> None:
    record, gpu = sys.argv[1], sys.argv[2]
    cells = defaultdict(dict)
    for r in json.load(open(record))["results"]:
        if r["status"] == "ok":
            key = (r["layout"], r["state_dtype"], r["K"], r["V"], r["tokens"], r["HV"], r["batch"])
            cells[key][r["impl"]] = r["us"]
    tables = defaultdict(list)
    for (layout, dtype, K, V, T, HV, B), times in sorted(cells.items()):
        use = h200.select(
            layout=layout, state_dtype=dtype, tokens=T, batch_heads=B * HV, intermediate=False,
            head_dims=(K, V), gpu=f"NVIDIA {gpu}", heads=HV,
        ).use  # fmt: skip
        variants = {n: us for n, us in times.items() if n not in ("gdngen", "fla", "flashinfer")}
        fastest = min(variants.values())
        tables[(layout, dtype, K, T)].append(
            (
                times["fla"] / times["gdngen"],
                times["fla"] / variants[use],
                variants[use] / fastest - 1,
                use,
            )
        )
    print(
        "| layout | state | K=V | T | static dispatch vs FLA | tuned dispatch vs FLA (min-max) "
        "| tuned pick vs fastest candidate (worst) | tuned picks |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (layout, dtype, K, T), rows in tables.items():
        tuned = [r[1] for r in rows]
        picks = sorted({r[3].removesuffix("_sm90") for r in rows})
        print(
            f"| {layout} | {dtype} | {K} | {T} | {geomean([r[0] for r in rows]):.2f}x "
            f"| {geomean(tuned):.2f}x ({min(tuned):.2f}-{max(tuned):.2f}) "
            f"| {max(r[2] for r in rows):+.1%} | {', '.join(picks)} |"
        )


if __name__ == "__main__":
    main()
