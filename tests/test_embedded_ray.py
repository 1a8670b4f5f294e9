"""The embedded Ray of a sweep listens on loopback only: its GCS, raylet, workers, agents and
metrics endpoints (before, on every interface, three Prometheus ports without a token). Checked
with ``ss -ltnp`` while a real embedded sweep runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commprof import results
from tests.hang import GUARD_S
from tests.prereqs import needs

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.ray, pytest.mark.slow, needs(tool="ss")]
LOOPBACK = re.compile(r"^(127\.0\.0\.1|\[::1\]|\[::ffff:127\.0\.0\.1\]):\d+$")
MATRIX = """
name: loopback
axes:
  model: [srn-100k]
  world_size: [2]
  bucket_cap_mb: [1, 2]
defaults:
  steps: 20
"""


def _tree(root: int) -> set[int]:
    """``root`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        seen.add(pid)
        todo.extend(children.get(pid, []))
    return seen


def _listening(pids: set[int]) -> set[tuple[str, str]]:
    """(local address, process name) of every TCP socket a process of ``pids`` listens on."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        owners = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        for name, pid in owners:
            if int(pid) in pids:
                found.add((line.split()[3], name))
    return found


def test_an_embedded_sweep_listens_on_loopback_only(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "commprof", "sweep", "--matrix", str(path), "--out", "out"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 1800  # a hang guard: under a 2x CPU hog 300 s was not enough
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= _listening(_tree(proc.pid))
        time.sleep(0.2)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err[-3000:]
    assert "listening on 127.0.0.1 only" in err
    names = {name for _, name in seen}
    assert {"gcs_server", "raylet"} <= names, seen  # the servers were seen while it ran
    assert any(name.startswith("ray::") for name in names), seen  # and its workers
    assert {address for address, _ in seen if not LOOPBACK.match(address)} == set(), seen
    assert {s for s, _, _ in results.latest_status(tmp_path / "out").values()} == {"ok"}
