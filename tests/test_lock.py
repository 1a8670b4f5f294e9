"""One owner per dataset folder (commprof.lock), and a second driver refused by it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from commprof.lock import GUARD_NAME, LOCK_NAME, STALE_S, DatasetLock, DatasetLocked
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
HANG_S = 600
"""A command that has not reached the point a test waits for after this long hangs: a guard
only, never what a test asserts."""


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class _CountedLooks(DatasetLock):
    """A lock that counts its looks at the lock file: one look is no wait, each retry is one
    look more."""

    looks = 0

    def _holder(self) -> dict[str, Any] | None:
        self.looks += 1
        return super()._holder()


def test_a_held_folder_is_refused_naming_its_owner(tmp_path: Path) -> None:
    with DatasetLock(tmp_path):
        contender = _CountedLooks(tmp_path)
        with pytest.raises(DatasetLocked, match=rf"pid {os.getpid()} on host .*--wait-lock"):
            contender.acquire()
        assert contender.looks == 1  # refused at its first look: no wait was asked for
    assert not (tmp_path / LOCK_NAME).exists()  # released
    with DatasetLock(tmp_path):  # and free again
        pass


def test_a_second_driver_exits_within_seconds_and_writes_nothing(tmp_path: Path) -> None:
    out, ray_tmp = tmp_path / "ds", tmp_path / "ray"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with DatasetLock(out):
        run = subprocess.run(
            [sys.executable, "sweeps/run_matrix.py", "--matrix", "smoke", "--out", str(out)],
            cwd=REPO,
            env={**env, "RAY_TMPDIR": str(ray_tmp)},  # where a Ray it started would live
            capture_output=True,
            text=True,
            timeout=GUARD_S,  # a hang is the failure
        )
    assert run.returncode == 3, run.stderr[-2000:]
    assert f"in use by another driver: pid {os.getpid()}" in run.stderr
    assert not ray_tmp.exists()  # refused before any Ray started
    # nothing of a sweep was written (the guard file is the lock's own, and stays)
    assert sorted(p.name for p in out.iterdir()) == [GUARD_NAME]


def test_stale_locks_are_taken_over(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_NAME
    # an owner on this host that no longer runs
    lock.write_text(json.dumps({"host": os.uname().nodename, "pid": _dead_pid(), "token": "x"}))
    with DatasetLock(tmp_path) as mine:
        assert json.loads(lock.read_text())["token"] == mine.token
    # an owner elsewhere whose heartbeat stopped
    lock.write_text(json.dumps({"host": "another-node", "pid": 1, "token": "y"}))
    old = time.time() - STALE_S - 5
    os.utime(lock, (old, old))
    with DatasetLock(tmp_path) as mine:
        assert json.loads(lock.read_text())["token"] == mine.token
    # ... but not one whose heartbeat is fresh
    lock.write_text(json.dumps({"host": "another-node", "pid": 1, "token": "z"}))
    with pytest.raises(DatasetLocked, match="another-node"):
        DatasetLock(tmp_path).acquire()
    assert json.loads(lock.read_text())["token"] == "z"  # and it is left alone


def test_waiting_for_the_owner(tmp_path: Path) -> None:
    first = DatasetLock(tmp_path)
    first.acquire()
    said: list[str] = []

    def release() -> None:
        said.append("releasing")  # before: the waiter may take the folder the moment it is free
        first.release()

    waiter = _CountedLooks(tmp_path, wait_s=3600)  # a wait this test would never sit out
    threading.Timer(1.0, release).start()
    done = threading.Thread(target=lambda: (waiter.acquire(), said.append("taken")), daemon=True)
    done.start()
    done.join(timeout=GUARD_S)  # a guard: taken within a look of the release, or it hangs
    assert not done.is_alive(), "not taken at the owner's release: it waits out wait_s"
    # it found the owner, looked again until the release, and took the folder then
    assert said == ["releasing", "taken"] and waiter.looks >= 2
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == waiter.token
    waiter.release()


# -- the takeover race, with real processes ---------------------------------------------------

RACERS = 6
"""Processes that find the same dead owner's lock at once (the issue's case)."""
RACE_TRIALS = {"plain": 100, "dawdling": 40}
"""Trials per run of the race test: each has every racer try once, the holders hold until all
have tried, so a second holder at any moment shows as two successes in the trial. The lock
before the guard had two holders in 5 of 200 plain trials and 200 of 200 dawdling ones."""


class _SlowLook(DatasetLock):
    """A lock that dawdles between finding the owner dead and taking over: the interleaving
    where two racers both decide on the same stale record (without the guard, 100 % overlap)."""

    def _stale(self, holder: dict[str, object]) -> bool:
        stale = super()._stale(holder)  # type: ignore[arg-type]
        time.sleep(0.003)
        return stale


def _racer(
    index: int, root: str, trials: int, start: Any, tried: Any, wins: Any, slow: bool
) -> None:  # pragma: no cover - child
    kind = _SlowLook if slow else DatasetLock
    for trial in range(trials):
        folder = Path(root) / f"t{trial}"
        start.wait()
        lock = kind(folder)
        try:
            lock.acquire()
        except DatasetLocked:
            lock = None  # type: ignore[assignment]
        if lock is not None:
            with wins.get_lock():
                wins[trial] += 1
        tried.wait()  # everyone has tried while the holder still holds
        if lock is not None:
            lock.release()


@pytest.mark.slow  # six processes, 140 trials
@pytest.mark.parametrize("kind", ["plain", "dawdling"])
def test_racing_takeovers_of_a_dead_owner_leave_one_holder(tmp_path: Path, kind: str) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    dead, trials, slow = _dead_pid(), RACE_TRIALS[kind], kind == "dawdling"
    for trial in range(trials):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        (folder / LOCK_NAME).write_text(json.dumps({"host": os.uname().nodename, "pid": dead}))
    start, tried = ctx.Barrier(RACERS), ctx.Barrier(RACERS)
    wins = ctx.Array("i", trials)
    procs = [
        ctx.Process(target=_racer, args=(i, str(tmp_path), trials, start, tried, wins, slow))
        for i in range(RACERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=GUARD_S)
        assert proc.exitcode == 0
    # exactly one holder per trial: the dead owner's lock went to one racer, and the others
    # found that racer's lock, live
    assert list(wins) == [1] * trials


def _owner(root: Path, *commands: str) -> subprocess.Popen[str]:
    """A process that takes the folder, says so, then runs what stdin tells it."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from commprof import results
from commprof.lock import DatasetLock
from commprof.matrix import Cell
lock = DatasetLock({str(root)!r})
lock.acquire()
print("held", flush=True)
for line in sys.stdin:
    if line.strip() == "commit":
        cell = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1)
        row = results.cell_row(cell, sweep="t", attempt=1, status="ok")
        try:
            with lock.writing():
                results.write_attempt({str(root)!r}, row, {{}})
            print("committed", flush=True)
        except Exception as err:
            print(type(err).__name__, err, flush=True)
    if line.strip() == "release":
        lock.release()
        print("released", flush=True)
        break
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _tell(proc: subprocess.Popen[str], command: str) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_an_owner_alive_on_this_host_keeps_the_folder_while_stopped(tmp_path: Path) -> None:
    owner = _owner(tmp_path)
    try:
        os.kill(owner.pid, signal.SIGSTOP)  # stopped: its heartbeat stops too
        lock = tmp_path / LOCK_NAME
        old = time.time() - 10 * STALE_S  # what a heartbeat stopped ten minutes looks like
        os.utime(lock, (old, old))
        contender = DatasetLock(tmp_path, stale_s=1.0)
        with pytest.raises(DatasetLocked, match=rf"pid {owner.pid} on host"):
            contender.acquire()
        time.sleep(1.5)  # and past a short stale_s in real time
        with pytest.raises(DatasetLocked, match=rf"pid {owner.pid} on host"):
            contender.acquire()
        os.kill(owner.pid, signal.SIGCONT)
        assert _tell(owner, "commit") == "committed"  # it still owns the folder
        assert _tell(owner, "release") == "released"
        assert owner.wait(timeout=GUARD_S) == 0
    finally:
        if owner.poll() is None:
            os.kill(owner.pid, signal.SIGCONT)
            owner.kill()
    with DatasetLock(tmp_path):  # free once its owner let go
        pass


def test_an_owner_that_lost_the_folder_stops_before_writing(tmp_path: Path) -> None:
    owner = _owner(tmp_path)
    try:
        # another node presumed it dead (its heartbeat looked old there) and took the folder
        lock = tmp_path / LOCK_NAME
        lock.write_text(json.dumps({"host": "another-node", "pid": 7, "token": "theirs"}))
        said = _tell(owner, "commit")
        assert said.startswith("LockLost") and "pid 7 on host another-node took it over" in said
        assert "stopped before writing" in said
        assert not (tmp_path / "cells").exists()  # nothing written
        assert _tell(owner, "release") == "released"
        assert owner.wait(timeout=GUARD_S) == 0
    finally:
        if owner.poll() is None:
            owner.kill()
    assert json.loads(lock.read_text())["token"] == "theirs"  # the new owner's lock stays


@pytest.mark.slow
def test_commprof_run_that_lost_its_folder_exits_without_writing(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--steps", "4", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "commprof", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = out / LOCK_NAME
    deadline = time.monotonic() + HANG_S
    while not lock.exists():  # the run holds the folder; its ranks start
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "commprof run hangs before taking its folder"
        time.sleep(0.05)
    # a driver on another node presumed it dead and took the folder over
    lock.write_text(json.dumps({"host": "another-node", "pid": 7, "token": "theirs"}))
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 3, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert "no longer owns the folder: pid 7 on host another-node took it over" in line
    assert "stopped before writing" in line and "Traceback" not in err
    assert not (out / "cells").exists()  # nothing committed
    assert json.loads(lock.read_text())["token"] == "theirs"  # and its lock left alone


@pytest.mark.slow
@pytest.mark.ray
def test_a_sweep_that_lost_its_folder_stops_without_writing(tmp_path: Path) -> None:
    from commprof import results

    path = tmp_path / "m.yaml"
    path.write_text(
        "name: lost\naxes:\n  model: [srn-100k]\n  world_size: [2]\n"
        "  bucket_cap_mb: [0.5, 1, 2, 4, 8, 16]\ndefaults:\n  steps: 12\n"
    )
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "commprof", "sweep", "--matrix", str(path), "--out", str(out)],
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + HANG_S
    while not results.latest_status(out):  # one cell committed: the sweep is under way
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the sweep hangs before its first commit"
        time.sleep(0.1)
    (out / LOCK_NAME).write_text(json.dumps({"host": "another-node", "pid": 7, "token": "x"}))
    before = set(results.latest_status(out))
    _, err = proc.communicate(timeout=GUARD_S)  # a hang is the failure
    assert proc.returncode == 3, err[-3000:]
    assert "took it over" in err and "stopped before writing" in err and "Traceback" not in err
    # stopped at the next heartbeat or commit: at most the commit that was under way when the
    # lock was replaced, nothing after it (the sweep's other cells never ran)
    assert len(set(results.latest_status(out)) - before) <= 1
