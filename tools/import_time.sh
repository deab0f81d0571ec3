#!/usr/bin/env bash
# Usage (repository root, on a GPU machine with the runtime installed): OUT=dir bash tools/import_time.sh
# `import generated.h200` after torch, in fresh processes (median of 9), with bytecode cached
# (a warm-up import writes it) and without; then where the time goes (-X importtime).
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}"
one() { python - <<'PY'
import time, torch
t = time.perf_counter()
import generated.h200
print(f"{(time.perf_counter() - t) * 1e3:.1f}")
PY
}
export PYTHONPYCACHEPREFIX=/tmp/pyc-it
for mode in cached none; do
  if [ $mode = cached ]; then unset PYTHONDONTWRITEBYTECODE; one > /dev/null; else export PYTHONDONTWRITEBYTECODE=1; rm -rf /tmp/pyc-it; fi
  for i in 1 2 3 4 5 6 7 8 9; do one; done | sort -n | awk -v m=$mode '{a[NR]=$1} END {print "bytecode " m ": median " a[5] " ms, min " a[1] ", max " a[NR] " (9 processes)"}'
done
unset PYTHONDONTWRITEBYTECODE; one > /dev/null
python -X importtime -c "import torch, generated.h200" 2> $OUT/importtime.txt
python - "$OUT/importtime.txt" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith("import time:") and "self [us]" not in line:
        a, b, c = line[len("import time:"):].split("|")
        rows.append((int(a), int(b), c.rstrip()))
i = next(k for k, (s, c, n) in enumerate(rows) if n.strip() == "torch" and len(n) - len(n.lstrip()) == 1)
after = rows[i + 1:]
print(f"after torch, self time of every module: {sum(s for s, c, n in after) / 1e3:.1f} ms")
for s, c, n in sorted(after, reverse=True)[:15]:
    print(f"{s / 1e3:7.1f} ms self {c / 1e3:8.1f} ms cumulative {n}")
PY
