"""The end agreement of commprof.attach on a real FileStore, two boards as two ranks (threads):
the logic the 2-rank gloo runs of tests/test_attach_safety.py exercise, in a second."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from commprof.training.agreement import Board, Counts, RanksDisagree


def _boards(tmp_path: Path, counts: list[Counts]) -> list[Board]:
    store = dist.FileStore(str(tmp_path / "store"), 2)
    store.set_timeout(timedelta(seconds=10))
    return [Board(store, rank=r, world_size=2, counts=lambda r=r: counts[r]) for r in range(2)]


def _end_both(boards: list[Board], counts: list[Counts]) -> list[str | None]:
    """Each board ends in its own thread; what each raised (None: agreed)."""
    said: list[str | None] = [None, None]

    def end(rank: int) -> None:
        try:
            boards[rank].agree(counts[rank], wait_s=20)
        except RanksDisagree as err:
            said[rank] = str(err)

    threads = [threading.Thread(target=end, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return said


TRIALS = 20
"""Ends raced per test: the two ranks end at the same moment, in either order."""


def test_equal_ends_agree(tmp_path: Path) -> None:
    counts = [Counts(steps=6, buckets=12), Counts(steps=6, buckets=12)]
    for trial in range(TRIALS):
        (tmp_path / str(trial)).mkdir()
        assert _end_both(_boards(tmp_path / str(trial), counts), counts) == [None, None]


def test_different_step_calls_are_named_on_both_ranks(tmp_path: Path) -> None:
    counts = [Counts(steps=6, buckets=12), Counts(steps=3, buckets=12)]
    for trial in range(TRIALS):  # a rank that counted the others ended never misses a verdict
        (tmp_path / str(trial)).mkdir()
        for text in _end_both(_boards(tmp_path / str(trial), counts), counts):
            assert text is not None and "ranks disagree on the run" in text, trial
            assert "6 run.step() calls and 12 gradient buckets" in text
            assert "3 run.step() calls and 12 gradient buckets" in text


WAIT_S = 120.0
"""Rank 0's limit in the test below: what the watcher must beat."""


def test_a_rank_past_the_others_end_is_found_by_its_own_watcher(tmp_path: Path) -> None:
    counts = [Counts(steps=6, buckets=6), Counts(steps=6, buckets=7)]  # rank 1: one bucket more
    boards = _boards(tmp_path, counts)
    boards[1].start()  # rank 1 is still training (stuck in that bucket's all-reduce)
    try:
        # rank 1's watcher's verdict: rank 0 waiting out its limit would say instead that
        # rank 1 "did not end its block within" WAIT_S
        with pytest.raises(RanksDisagree, match="rank 1 went on past the end of rank 0"):
            boards[0].agree(counts[0], wait_s=WAIT_S)
    finally:
        boards[1].stop()
    assert boards[1].verdict is not None  # rank 1 knows it too, without the store


def test_a_rank_that_left_by_an_exception_is_named(tmp_path: Path) -> None:
    counts = [Counts(steps=6, buckets=6), Counts(steps=2, buckets=2)]
    boards = _boards(tmp_path, counts)
    assert boards[1].abandon("ValueError: nan loss") is None  # its own word: no other cause
    with pytest.raises(RanksDisagree, match=r"rank 1 left its commprof\.attach block"):
        boards[0].agree(counts[0], wait_s=20)
