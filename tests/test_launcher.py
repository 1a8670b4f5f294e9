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


@pytest.mark.slow
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


@pytest.mark.slow
def test_rank_dying_silently_stops_the_others_after_the_grace() -> None:
    # The hanging rank is stopped ERROR_GRACE_S after the death is seen. Left to limit_s (past
    # its 600 s sleep) it would end by itself with a result, and rank 1 would not be "stopped".
    with pytest.raises(RankFailure) as info:
        spawn_ranks(_dies_or_hangs, 2, limit_s=1200.0)
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


def test_a_trace_the_profiler_wrote_broken_fails_the_attempt_as_transient(tmp_path: Path) -> None:
    """A CI sweep's profiled cell failed for good on a trace of its own rank that the reader
    refused ('invalid character' 2.2 MB in): the profiler's fault, which running again clears.
    The rank's error is a transient one, so the cell runs again; it names the file and the
    byte."""
    import gzip
    import traceback

    from commprof.outcomes import classify_error_texts
    from commprof.training.trainer import UnreadableTrace, trace_records

    (tmp_path / "rank0_steps2-7.json.gz").write_bytes(
        gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "op", "ts": 1, "dur": nan}]}')
    )
    with pytest.raises(UnreadableTrace, match=r"rank0_steps2-7\.json\.gz: not valid JSON") as info:
        trace_records(tmp_path, [])
    text = "".join(traceback.format_exception_only(info.value)).strip()
    assert text.startswith("commprof.training.trainer.UnreadableTrace: torch.profiler wrote")
    assert classify_error_texts([text]) == "transient"
    assert classify_error_texts([f"ValueError: {info.value.__cause__}"]) == "deterministic"


@pytest.mark.slow
def test_run_retries_a_transient_failure_and_not_a_deterministic_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``commprof run`` runs a cell again after a crashed rank, as a sweep does, and each
    attempt lands in the dataset; a configuration error is not run again, and a cell whose
    failure stands runs only with --retry-failed (the one failure policy)."""
    from commprof import cli, results
    from commprof.training import launcher

    faults: list[dict | None] = []  # the fault of each run_local call, in order

    def faulty(cell: Cell, **kwargs: object) -> list[dict]:
        return run_local(cell, **kwargs, fault=faults.pop(0))  # type: ignore[arg-type]

    monkeypatch.setattr(launcher, "run_local", faulty)
    out = tmp_path / "ds"
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--steps", "2", "--out", str(out)]
    crash = {"rank": 1, "kind": "raise"}  # a RuntimeError: transient

    faults[:] = [crash, crash]
    assert cli.main([*argv, "--max-attempts", "2"]) == 1 and not faults
    err = capsys.readouterr().err
    assert "attempt 1 failed (transient); running it again" in err
    assert "failed (attempt 2, transient)" in err
    assert cli.main(argv) == 1  # out of attempts: the failure stands, as in a sweep
    assert "pass --retry-failed" in capsys.readouterr().err
    faults[:] = [None]  # retried: numbered after the two failures, and ok
    assert cli.main([*argv, "--retry-failed"]) == 0 and not faults
    cells = results.load(out)["cells"]
    assert cells[["attempt", "status"]].values.tolist() == [[1, "failed"], [2, "failed"], [3, "ok"]]
    assert cells["error_kind"].tolist()[:2] == ["transient", "transient"]

    other = ["run", "--model", "srn-100k", "--world-size", "2", "--steps", "3", "--out", str(out)]
    faults[:] = [{**crash, "error": "ValueError"}, None, None]
    assert cli.main([*other, "--max-attempts", "3"]) == 1 and len(faults) == 2
    assert "failed (attempt 1, deterministic)" in capsys.readouterr().err
    assert cli.main([*other, "--max-attempts", "3"]) == 1 and len(faults) == 2  # would repeat
    cells = results.load(out)["cells"]
    once = cells[cells["steps"] == 3]
    assert once[["attempt", "status", "error_kind"]].values.tolist() == [
        [1, "failed", "deterministic"]
    ]


@pytest.mark.parametrize("value", ["0", "101", "two"])
def test_max_attempts_flag_is_checked(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from commprof import cli

    with pytest.raises(SystemExit) as info:
        cli.main(
            [
                "run",
                "--model",
                "srn-100k",
                "--world-size",
                "2",
                "--out",
                "x",
                "--max-attempts",
                value,
            ]
        )
    assert info.value.code == 2 and "--max-attempts" in capsys.readouterr().err
