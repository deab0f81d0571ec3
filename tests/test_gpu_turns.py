"""Tune processes sharing one GPU take turns: no two turns overlap, and a turn ends only after
its GPU work is finished (gdngen.tune.gpu_turns)."""

import multiprocessing
import time

import pytest

from gdngen.measure.gpu_turns import gpu_turns

WORK_SECONDS = 0.1


def _take_turns(lock_path, log_path, who, turns):
    finished_at = []

    def finish():  # stands in for waiting on the GPU: it takes a while, inside the turn
        time.sleep(WORK_SECONDS / 2)
        finished_at.append(time.monotonic())

    turn = gpu_turns(lock_path, finish=finish)
    for _ in range(turns):
        with turn():
            began = time.monotonic()
            time.sleep(WORK_SECONDS)
        with open(log_path, "a") as log:
            log.write(f"{who} {began} {finished_at[-1]}\n")


def test_turns_of_several_processes_never_overlap(tmp_path):
    lock_path, log_path = tmp_path / "gpu.lock", tmp_path / "turns.log"
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_take_turns, args=(lock_path, log_path, who, 2)) for who in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    spans = sorted(
        (float(began), float(finished), who)
        for who, began, finished in (line.split() for line in log_path.read_text().splitlines())
    )
    assert len(spans) == 6 and len({who for _, _, who in spans}) == 3
    for (_, finished, who), (began, _, next_who) in zip(spans, spans[1:]):
        # the next turn starts only once this one's work (and its finish) is over
        assert began > finished, (who, next_who)


def test_a_turn_lets_go_when_its_work_fails(tmp_path):
    finished = []
    turn = gpu_turns(tmp_path / "gpu.lock", finish=lambda: finished.append(True))
    with pytest.raises(RuntimeError):
        with turn():
            raise RuntimeError("a check failed")
    assert finished == [True]
    with turn():  # not left locked: the next turn begins at once
        pass
