"""Joining the JSON records of one bench split over several commands (each command a part of the
grid, e.g. one state dtype or one form) into one run's records, so that one report covers the
whole grid. A record file is ``{"environment": ..., "records": [...], ...}``."""

from __future__ import annotations

from typing import Callable, Hashable


def join_runs(
    saved: list[dict], key: Callable[[dict], Hashable], where: Callable[[dict], str]
) -> tuple[list[dict], dict]:
    """The records of several runs' JSON as one run's: their cells in order, and the first run's
    environment, with ``joined`` giving each run's GPU UUID and commit. ``key`` names a record's
    cell and ``where`` says it in words. Runs on different GPU models, or a cell measured twice,
    are refused (ValueError)."""
    if not saved:
        raise ValueError("saved: expected at least one run's JSON; got none")
    gpus = {run["environment"].get("gpu") for run in saved}
    if len(gpus) > 1:
        raise ValueError(f"saved: the runs are of different GPUs {sorted(map(str, gpus))}")
    records, seen = [], set()
    for run in saved:
        for r in run["records"]:
            if key(r) in seen:
                raise ValueError(f"saved: the cell {where(r)} is in more than one run")
            seen.add(key(r))
            records.append(r)
    env = dict(saved[0]["environment"])
    env["joined"] = [
        dict(gpu_uuid=run["environment"].get("gpu_uuid"),
             gdngen_commit=run["environment"].get("gdngen_commit"))
        for run in saved
    ]  # fmt: skip
    return records, env
