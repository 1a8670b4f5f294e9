"""Ray leaves nothing behind after a killed driver (issue #44): a driver with an embedded Ray is
killed with SIGKILL; once its watcher (commprof.ray_reaper) is done, no process of that Ray is
left, the raylet's dashboard and runtime-env agents included (they outlived the driver by about
90 s before). A real embedded Ray in a real driver process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commprof.ray_reaper import _cmdline, _stat
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = """
import json, sys, time
from commprof.ray_address import init_local
from commprof import ray_reaper
init_local(num_cpus=1, include_dashboard=False, log_to_driver=False)
procs = ray_reaper.ray_processes()
print(json.dumps({"procs": procs, "watcher": ray_reaper._WATCHERS[0].pid,
                  "agents": [p for p, _ in procs if any(a in ray_reaper._cmdline(p)
                                                         for a in ray_reaper.AGENTS)]}), flush=True)
time.sleep(600)
"""


def _alive(pid: int, start: int) -> bool:
    """The process is there and not a zombie (ended, its exit status not yet collected: under a
    loaded host a killed agent stays one a while, and its command line reads empty)."""
    stat = _stat(pid)
    if stat is None or stat[1] != start:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def test_a_killed_driver_leaves_no_ray_process(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        doc = json.loads(driver.stdout.readline())
    finally:
        driver.send_signal(signal.SIGKILL)  # no atexit, no ray.shutdown
        driver.wait(timeout=GUARD_S)
    procs = [(int(p), int(s)) for p, s in doc["procs"]]
    assert len(doc["agents"]) >= 2, [_cmdline(p) for p, _ in procs]  # both agents recorded
    watcher = doc["watcher"]
    watcher_start = _stat(watcher)
    for _ in range(1200):  # the watcher ends once it has ended what was left (or nothing was)
        if watcher_start is None or not _alive(watcher, watcher_start[1]):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the watcher did not end")
    left = [(p, _cmdline(p)[:80]) for p, s in procs if _alive(p, s)]
    assert not left, left
