"""Compile (into the disk cache, no GPU work) the T=1 update kernels of one shard geometry, both
state dtypes, K-last: python warm_shards.py GEOMETRY (run one process per geometry)."""
import sys

import generated.h200 as h200

for dtype in ("bf16", "fp32"):
    print(sys.argv[1], dtype, h200.warmup(geometry=sys.argv[1], state_dtype=dtype, max_tokens=1,
                                          modes=("update",), progress=False), flush=True)
