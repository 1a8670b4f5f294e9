"""An embedded Ray leaves nothing behind when its driver is killed.

Ray ties the processes it starts for an embedded cluster (GCS, raylet, workers, monitors) to the
driver: they end within a second or two of a SIGKILL of the driver. The raylet's two agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) do not: they notice the raylet gone after
two seconds, then try to report it to the GCS, which is gone too, and wait about 90 s for it
before they exit.

:func:`start_reaper` closes that gap. Right after ``ray.init`` it records the raylet's children
(the agents among them) with their start times and hands the list to a small watcher process of
its own session. The watcher reads its stdin until end of file, which comes when the driver
exits, however it exits (a SIGKILL included); it then gives the processes ``GRACE_S`` to end on
their own and kills those still there (SIGTERM, then SIGKILL), each only if its pid still
belongs to the process recorded (same start time). Linux only (``/proc``); elsewhere nothing is
started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 2.0
"""How long the watcher lets the recorded processes end on their own after the driver."""
AGENT_WAIT_S = 10.0
"""Longest wait after ``ray.init`` for the raylet's agents to appear."""
AGENTS = ("DashboardAgent", "dashboard/agent.py", "RuntimeEnvAgent", "runtime_env/agent/main.py")
"""What the agents' command lines hold (their process titles, or the scripts before those)."""

WATCHER = """
import os, signal, sys, time
procs = [tuple(map(int, line.split())) for line in sys.stdin if line.strip()]
def start(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
def alive():
    return [(p, s) for p, s in procs if start(p) == s]
deadline = time.monotonic() + float(sys.argv[1])
while alive() and time.monotonic() < deadline:
    time.sleep(0.1)
for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.0)):
    for p, s in alive():
        try:
            os.kill(p, sig)
        except OSError:
            pass
    time.sleep(wait)
"""
"""The watcher: reads ``pid start`` lines until the driver goes, then ends what is left."""

_WATCHERS: list[subprocess.Popen[bytes]] = []
"""The watchers this process started (their stdin pipes stay open while it lives)."""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, None where it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode("utf-8", "replace")
        )
    except OSError:
        return ""


def _children(parent: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process whose parent is ``parent``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] == parent:
                out.append((int(entry), stat[1]))
    return out


def ray_processes() -> list[tuple[int, int]]:
    """(pid, start time) of the processes of this driver's embedded Ray: its children that are
    Ray's, and the raylet's children (the agents); waits up to ``AGENT_WAIT_S`` for the agents."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        mine = [(p, s) for p, s in _children(os.getpid()) if "/ray/" in _cmdline(p)]
        raylets = [p for p, _ in mine if "raylet/raylet" in _cmdline(p)]
        under = [c for r in raylets for c in _children(r)]
        agents = [p for p, _ in under if any(a in _cmdline(p) for a in AGENTS)]
        if len(agents) >= 2 or time.monotonic() >= deadline:
            return mine + under
        time.sleep(0.2)


def start_reaper() -> subprocess.Popen[bytes] | None:
    """Start the watcher over this driver's embedded Ray (see the module docstring); call it
    right after ``ray.init`` started one. None where there is no ``/proc``."""
    if not Path("/proc/self/stat").is_file():
        return None
    procs = ray_processes()
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(GRACE_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the driver's terminal is not for it
        close_fds=True,
    )
    assert watcher.stdin is not None
    watcher.stdin.write("".join(f"{p} {s}\n" for p, s in procs).encode())
    watcher.stdin.flush()
    _WATCHERS.append(watcher)  # the pipe stays open until this process ends
    return watcher
