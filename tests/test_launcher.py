"""Launcher: rank errors grouped by text, a cell that fails in every rank, a rank that dies."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from commprof.matrix import Cell
from commprof.outcomes import RankFailure, group_errors
from commprof.training.launcher import run_local, spawn_ranks


def test_group_errors_groups_by_first_line() -> None:
    errors = {
        2: "ValueError: bad\nTraceback (most recent call last): rank 2 frame",
        0: "ValueError: bad\nTraceback (most recent call last): rank 0 frame",
        1: "RuntimeError: peer closed\n...",
        3: "",
    }
    assert group_errors(errors) == (
        "4 rank(s) failed; ranks [0, 2]: ValueError: bad; "
        "ranks [1]: RuntimeError: peer closed; ranks [3]: ?"
    )


def test_group_errors_single_rank() -> None:
    assert (
        group_errors({5: "  OSError: disk full  \n"})
        == "1 rank(s) failed; ranks [5]: OSError: disk full"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_every_rank_failing_gives_one_group() -> None:
    # device='cuda' raises in every rank before it joins the group: both report the same text.
    cell = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1.0, device="cuda", steps=3)
    with pytest.raises(RankFailure) as info:
        run_local(cell, timeout_s=30)
    message = str(info.value)
    assert message.startswith("2 rank(s) failed; ranks [0, 1]: ")
    assert "asks for device 'cuda'" in message
    assert message.count("ranks [") == 1
    assert "Traceback" not in message  # one line per group, not the whole traceback


def _dies_or_hangs(rank: int, world_size: int, store_path: str) -> None:  # pragma: no cover
    if rank == 0:
        os._exit(3)  # dies without reporting, as a segfault or an OOM kill does
    time.sleep(600)


def test_rank_dying_silently_stops_the_others_after_the_grace() -> None:
    limit_s = 300.0
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn_ranks(_dies_or_hangs, 2, limit_s=limit_s)
    # The hanging rank is stopped ERROR_GRACE_S after the death is seen, not at limit_s.
    assert time.monotonic() - started < limit_s / 3
    assert info.value.errors == {
        0: "process exited with code 3",
        1: "gave no result in time; stopped",
    }


def _sleeps(rank: int, world_size: int, store_path: str) -> None:  # pragma: no cover
    time.sleep(60)


def test_a_failed_start_kills_the_ranks_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where fork fails part-way (a pids limit), no started rank outlives the call."""
    import multiprocessing.context as mpc

    started: list[mpc.SpawnProcess] = []
    real_start = mpc.SpawnProcess.start

    def start(self: mpc.SpawnProcess) -> None:
        if started:
            raise OSError(11, "Resource temporarily unavailable")  # what fork says at the limit
        real_start(self)
        started.append(self)

    monkeypatch.setattr(mpc.SpawnProcess, "start", start)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        spawn_ranks(_sleeps, 3, limit_s=30)
    assert len(started) == 1 and started[0].exitcode is not None  # killed, not left running


def test_run_refuses_a_world_size_the_machine_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from commprof import cli

    argv = ["run", "--model", "srn-100k", "--world-size", "1000000", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "cores, and commprof run starts at most" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before the dataset folder was touched


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("OverflowError: Python int too large to convert to C long", "deterministic"),
        ("commprof.matrix.MatrixError: steps must be >= 1", "deterministic"),
        ("TypeError: unsupported operand", "deterministic"),
        ("RuntimeError: [enforce fail] gloo connection closed by peer", "transient"),
        ("RuntimeError: DefaultCPUAllocator: can't allocate memory", "deterministic"),
    ],
)
def test_errors_that_repeat_are_not_retried(text: str, kind: str) -> None:
    from commprof.outcomes import classify_error_texts

    assert classify_error_texts([text]) == kind
