"""An ablation, not for main: rewrite gdngen/device/rows.py in a tree copy so that
  tok:  a packed row's tokens sit at n*T + t (cu_seqlens not read: right for uniform rows only)
  slot: a per-token table's initial slot is column 0 (num_accepted not read: right for 1 only)
usage: python ablate_rows.py TREE tok|slot|both"""

import sys

path = sys.argv[1] + "/gdngen/device/rows.py"
what = sys.argv[2]
s = open(path).read()
if what in ("tok", "both"):
    old = "    total = Int64(total_tokens)\n"
    assert old in s
    s = s.replace(
        old,
        "    base = n64 * T\n    return Int64(0), [base + t for t in range(T)], [Int64(t) < Int64(T) for t in range(T)]\n"
        + old,
        1,
    )
if what in ("slot", "both"):
    old = "        if num_accepted is not None:\n            column = Int64(num_accepted[n64]) - 1\n        columns"
    assert old in s
    s = s.replace(old, "        columns", 1)
open(path, "w").write(s)
print("ablated", what, path)
