"""``python -m gdngen.bench.startup``: N processes starting at once, one per GPU, sharing one
empty disk cache, as a tensor-parallel engine starts (docs/design.md, "Architecture").

For each N of ``--processes``, a fresh cache folder and N worker processes started together,
worker i seeing only GPU i (CUDA_VISIBLE_DEVICES, as engines run one process per GPU). A worker
imports the target and makes the first call of each problem of ``PROBLEMS``, checks each against
the float64 reference and prints one JSON line: when it finished, where its kernels came from
(``store.sources()``: "compiled" or "cache") and the worst relative error. The parent records
each worker's seconds from the common start to its last first call, checks every entry the run
left in the cache folder (record and library hash), and writes ``startup.json`` and
``startup.md`` to ``--out``.

What it shows: the kernels are compiled once per machine (the compiled counts over all workers
add up to the distinct kernels; the others wait on the entry's lock and load it), the entries
are whole, every result is right, and what N processes cost against one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gdngen.runtime.kernel_dir import CACHE_ENV
from gdngen.runtime.store import ARTIFACTS_ENV, DISK_CACHE_ENV

#: the first calls of a worker (gdngen.problem.Problem fields): decode from a pool with padding,
#: and verify with a cache; two kernels
PROBLEMS = [
    dict(batch=8, HV=32, pool_size=12, padded_rows=(3,)),
    dict(batch=4, tokens=2, HV=32, pool_size=4, cache_steps=2, disable_state_update=True),
]

WORKER = """
import json, sys, time
import torch
import generated.{target} as package
from gdngen.problem import Problem, state_of
from gdngen.reference import reference_decode
from gdngen.runtime import store

worst = 0.0
for fields in {problems!r}:
    problem = Problem(**fields)
    args = problem.make("cuda")
    before = state_of(args).clone()
    out, _ = package.gdn_decode(**args)
    torch.cuda.synchronize()
    ref = reference_decode(
        args["q"], args["k"], args["v"], before, args["A_log"], args["a"], args["dt_bias"],
        args["b"], read_slots=args.get("initial_state_indices"),
        disable_state_update=problem.disable_state_update,
    )
    live = ref.live
    error = float((out[live].double() - ref.output[live]).norm() / ref.output[live].norm())
    worst = max(worst, error)
print(json.dumps({{"finished": time.time(), "sources": store.sources(), "error": worst}}))
"""


def worker_environment(gpu: int, cache: Path, base: dict | None = None) -> dict:
    """The environment of the worker on GPU ``gpu`` (an index among the GPUs the caller sees):
    the caller's, seeing that GPU alone, with the disk cache on and in ``cache``, and no
    ahead-of-time artifact directory (a worker starts as an engine process does on a machine
    with an empty cache, whatever the calling shell set)."""
    base = os.environ if base is None else base
    environment = {name: value for name, value in base.items() if name != ARTIFACTS_ENV}
    visible = base.get("CUDA_VISIBLE_DEVICES")
    device = visible.split(",")[gpu].strip() if visible else str(gpu)
    environment.update({"CUDA_VISIBLE_DEVICES": device, CACHE_ENV: str(cache), DISK_CACHE_ENV: "1"})
    return environment


def run_processes(count: int, target: str, cache: Path, root: Path) -> dict:
    """Start ``count`` workers at once (worker i on GPU i) on the cache folder ``cache``."""
    code = WORKER.format(target=target, problems=PROBLEMS)
    start = time.time()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=root,
            env=worker_environment(gpu, cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for gpu in range(count)
    ]
    results = []
    for gpu, worker in enumerate(workers):
        stdout, stderr = worker.communicate(timeout=1800)
        if worker.returncode != 0:
            raise RuntimeError(f"worker on GPU {gpu} failed:\n{stderr[-4000:]}")
        line = json.loads(stdout.strip().splitlines()[-1])
        results.append(dict(gpu=gpu, seconds=line["finished"] - start, **line))
    return dict(processes=count, workers=results, entries=check_entries(cache))


def check_entries(cache: Path) -> dict:
    """How many entries the folder holds and how many of them are whole."""
    from gdngen.runtime.kernel_dir import KernelDir

    folder = KernelDir(cache, writable=False)
    entries = folder.entries()
    whole = sum(folder.has(entry["fingerprint"]) for entry in entries)
    return dict(count=len(entries), whole=whole)


def markdown(runs: list[dict], env: dict) -> str:
    lines = [
        f"GPU: {env.get('gpu')} x {env.get('gpus')}",
        "",
        "| processes | slowest first calls (s) | each worker (s) | compiled, all workers | "
        "from the cache | entries (whole) | worst error |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        workers = run["workers"]
        compiled = sum(w["sources"].get("compiled", 0) for w in workers)
        cached = sum(w["sources"].get("cache", 0) for w in workers)
        lines.append(
            f"| {run['processes']} | {max(w['seconds'] for w in workers):.1f} | "
            + ", ".join(f"{w['seconds']:.1f}" for w in workers)
            + f" | {compiled} | {cached} | {run['entries']['count']} "
            f"({run['entries']['whole']}) | {max(w['error'] for w in workers):.2e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    import torch

    from gdngen.measure.environment import environment

    parser = argparse.ArgumentParser(prog="python -m gdngen.bench.startup", description=__doc__)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--processes", default="1,2", help="comma-separated process counts")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.processes.split(",")]
    if max(counts) > torch.cuda.device_count():
        parser.error(
            f"--processes: {max(counts)} processes need as many GPUs; "
            f"this machine has {torch.cuda.device_count()}"
        )
    root = Path(__file__).resolve().parents[2]
    runs = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="gdngen-startup-") as cache:
            runs.append(run_processes(count, args.target, Path(cache), root))
    env = dict(environment(), gpus=torch.cuda.device_count())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(dict(environment=env, runs=runs), indent=1))
    (args.out / "startup.md").write_text(markdown(runs, env))
    print(markdown(runs, env))


if __name__ == "__main__":
    main()
