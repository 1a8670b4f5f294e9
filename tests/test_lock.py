"""One owner per dataset folder (commprof.lock), and a second driver refused by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from commprof.lock import GUARD_NAME, LOCK_NAME, STALE_S, DatasetLock, DatasetLocked

REPO = Path(__file__).resolve().parent.parent


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_held_folder_is_refused_naming_its_owner(tmp_path: Path) -> None:
    with DatasetLock(tmp_path):
        started = time.monotonic()
        with pytest.raises(DatasetLocked, match=rf"pid {os.getpid()} on host .*--wait-lock"):
            DatasetLock(tmp_path).acquire()
        assert time.monotonic() - started < 2
    assert not (tmp_path / LOCK_NAME).exists()  # released
    with DatasetLock(tmp_path):  # and free again
        pass


def test_a_second_driver_exits_within_seconds_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with DatasetLock(out):
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "sweeps/run_matrix.py", "--matrix", "smoke", "--out", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    assert run.returncode == 3, run.stderr[-2000:]
    assert f"in use by another driver: pid {os.getpid()}" in run.stderr
    assert took < 30  # process start and imports; no Ray, no cell
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
    threading.Timer(1.0, first.release).start()
    started = time.monotonic()
    with DatasetLock(tmp_path, wait_s=20):
        waited = time.monotonic() - started
    assert 0.5 < waited < 10
