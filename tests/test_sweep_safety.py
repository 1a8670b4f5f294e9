"""Sweeps that cannot lose data, with real drivers on real Ray clusters.

Two drivers on one dataset folder (embedded Rays, and a shared ``ray.cluster_utils.Cluster``);
a driver that never attaches to another driver's embedded Ray; a cluster busy with another
driver's cells (they wait, never "cannot be placed"); a cluster lost in the middle of a sweep;
SIGINT and SIGTERM (a damaged attempt run again: tests/test_sweep.py).

Each cluster lives in its own process (``CLUSTER_OWNER``) so that a test can take it away from
under a driver the way ``ray stop`` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commprof import matrix, results
from commprof.lock import LOCK_NAME
from commprof.sweeps.cluster import EXIT_CLUSTER_LOST
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.ray, pytest.mark.slow]

MATRIX = """
name: {name}
axes:
  model: [srn-100k]
  world_size: [2]
  bucket_cap_mb: {caps}
defaults:
  steps: {steps}
  batch_size: 8
run:
  max_attempts: {attempts}
  cell_timeout_s: {cell_timeout_s}
  pg_timeout_s: 30
"""
MAX_ATTEMPTS, CELL_TIMEOUT_S = 2, 1200
"""The cell's limit is a hang guard too: no cell here is meant to time out, and under a CPU hog
beside a second suite a 120 s limit ran out (tests/hang.py)."""

AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Ray's authentication settings; an embedded Ray of this session sets ``RAY_AUTH_MODE`` in the
test process's environment, so a cluster test names its own."""
STRAY_TOKEN = {"RAY_AUTH_TOKEN": "0123456789abcdef" * 4}
"""A token at hand where the cluster wants none (as on any machine where an embedded Ray once
wrote ``~/.ray/auth_token``): a driver that turned token authentication on for it had its
actors destroyed by the cluster, which took the driver for dead."""

CLUSTER_OWNER = """
import sys
import ray
from ray.cluster_utils import Cluster
from ray._common.utils import reset_ray_address

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": int(sys.argv[1])})
print(cluster.address, flush=True)
try:
    sys.stdin.readline()  # the test says when the cluster goes
    cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False)
finally:
    reset_ray_address()  # leave no address behind for later drivers to find
"""


def _matrix(tmp_path: Path, name: str, caps: str, steps: int = 4) -> matrix.Matrix:
    path = tmp_path / f"{name}.yaml"
    text = MATRIX.format(
        name=name, caps=caps, steps=steps, attempts=MAX_ATTEMPTS, cell_timeout_s=CELL_TIMEOUT_S
    )
    path.write_text(text)
    return matrix.load(path)


def _driver(
    m: matrix.Matrix,
    out: Path,
    ray_address: str | None,
    *,
    stray_token: bool = False,
    **extra_env: str,
) -> subprocess.Popen[str]:
    """The driver as a user starts it; ``None``: no address (it starts its own Ray).
    ``stray_token``: no authentication settings but :data:`STRAY_TOKEN` (for the ``cluster``
    fixture's cluster, which has no authentication)."""
    drop = {"RAY_ADDRESS", *(AUTH_VARIABLES if stray_token else ())}
    env = {k: v for k, v in os.environ.items() if k not in drop} | extra_env
    if stray_token:
        env |= STRAY_TOKEN
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    command = [sys.executable, str(REPO / "sweeps" / "run_matrix.py"), "--matrix", m.source]
    return subprocess.Popen(
        [*command, "--out", str(out)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_committed(out: Path, proc: subprocess.Popen[str]) -> None:
    """Wait until the driver has committed a cell (the sweep is under way); fail where it ended
    first, or hangs (:data:`~tests.hang.GUARD_S`)."""
    deadline = time.monotonic() + GUARD_S
    while not results.latest_status(out):
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the driver ended early ({proc.returncode}): {err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"the driver hangs: no cell committed or failed: {err[-3000:]}")
        time.sleep(0.1)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=GUARD_S)
    return proc.returncode, out, err


def _statuses(out: Path) -> list[tuple[str, int, str]]:
    cells = results.load(out)["cells"]
    rows = cells[["cell_id", "attempt", "status"]].itertuples(index=False, name=None)
    return sorted((str(c), int(a), str(s)) for c, a, s in rows)


def _all_ok_once(out: Path, m: matrix.Matrix) -> None:
    assert _statuses(out) == sorted((c.cell_id, 1, "ok") for c in m.cells)
    steps = results.load(out)["steps"]
    assert len(steps) == sum(c.world_size * c.steps for c in m.cells)


@pytest.fixture
def cluster() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A one-node Ray cluster with 2 CPUs and no authentication, owned by another process;
    yields (address, owner)."""
    owner = subprocess.Popen(
        [sys.executable, "-c", CLUSTER_OWNER, "2"],
        env={k: v for k, v in os.environ.items() if k not in AUTH_VARIABLES},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert owner.stdout is not None and owner.stdin is not None
    address = owner.stdout.readline().strip()
    assert address, "the cluster did not start"
    try:
        yield address, owner
    finally:
        if owner.poll() is None:
            owner.stdin.write("go\n")
            owner.stdin.flush()
            owner.wait(timeout=GUARD_S)


def _take_away(owner: subprocess.Popen[str]) -> None:
    """Kill every process of the cluster (what `ray stop` does on its node)."""
    assert owner.stdin is not None
    owner.stdin.write("go\n")
    owner.stdin.flush()
    owner.wait(timeout=GUARD_S)


def test_drivers_on_embedded_rays_share_no_folder_and_no_ray(tmp_path: Path) -> None:
    m = _matrix(tmp_path, "first", caps="[0.5, 1, 2]", steps=12)
    other = _matrix(tmp_path, "second", caps="[4]")
    first = _driver(m, tmp_path / "a", ray_address=None)
    _wait_committed(tmp_path / "a", first)
    assert (tmp_path / "a" / LOCK_NAME).exists()
    # a second driver on the same folder: refused before anything else, naming the owner; it
    # started no Ray (nothing in the Ray temp folder it was given) and ran no cell
    before = _statuses(tmp_path / "a")
    second_ray = tmp_path / "second-ray"
    second = _driver(m, tmp_path / "a", ray_address=None, RAY_TMPDIR=str(second_ray))
    rc, _, err = _finish(second)
    assert rc == 3 and f"in use by another driver: pid {first.pid}" in err, err[-2000:]
    assert not second_ray.exists() and "starting an embedded one" not in err, err[-2000:]
    assert set(_statuses(tmp_path / "a")) >= set(before)  # the first's cells, nothing undone
    # a driver on another folder starts a Ray of its own instead of attaching to the first's
    rc, _, err = _finish(_driver(other, tmp_path / "b", ray_address=None))
    assert rc == 0, err[-3000:]
    assert "starting an embedded one" in err
    rc, _, err = _finish(first)
    assert rc == 0, err[-3000:]
    _all_ok_once(tmp_path / "a", m)
    _all_ok_once(tmp_path / "b", other)


def test_a_busy_cluster_makes_cells_wait_and_a_second_owner_is_refused(
    tmp_path: Path, cluster: tuple[str, subprocess.Popen[str]]
) -> None:
    address, _ = cluster
    m = _matrix(tmp_path, "busy", caps="[0.5, 1]", steps=12)
    other = _matrix(tmp_path, "waits", caps="[2, 4]")
    first = _driver(m, tmp_path / "a", ray_address=address, stray_token=True)
    _wait_committed(tmp_path / "a", first)
    # same cluster, same folder: refused by the folder's owner, nothing of it touched
    before = _statuses(tmp_path / "a")
    second = _driver(m, tmp_path / "a", ray_address=address, stray_token=True)
    rc, _, err = _finish(second)
    assert rc == 3, err[-2000:]
    assert set(before) <= set(_statuses(tmp_path / "a"))
    # same cluster, another folder: the 2-CPU cluster is full with the first driver's gang,
    # so these cells wait for it instead of being recorded as "cannot be placed"
    rc, _, err = _finish(_driver(other, tmp_path / "b", ray_address=address, stray_token=True))
    assert rc == 0, err[-3000:]
    rc, _, err = _finish(first)
    assert rc == 0, err[-3000:]
    _all_ok_once(tmp_path / "a", m)
    _all_ok_once(tmp_path / "b", other)


def test_a_lost_cluster_stops_the_sweep_and_a_rerun_resumes(
    tmp_path: Path, cluster: tuple[str, subprocess.Popen[str]]
) -> None:
    address, owner = cluster
    m = _matrix(tmp_path, "lost", caps="[0.5, 1, 2, 4, 8]", steps=12)
    out = tmp_path / "out"
    proc = _driver(m, out, ray_address=address, stray_token=True)
    _wait_committed(out, proc)
    _take_away(owner)
    rc, _, err = _finish(proc)
    # commprof's watch ended it (its exit status, its message); Ray alone would have ended it
    # after its own 60 s reconnect limit, with neither
    assert rc == EXIT_CLUSTER_LOST, err[-3000:]
    assert "stopped answering" in err and "Traceback" not in err
    done = _statuses(out)
    assert 1 <= len(done) < len(m.cells)
    assert {status for _, _, status in done} == {"ok"}  # nothing rejected or failed for it
    # a new cluster, the same command: the rest runs, nothing runs twice
    rerun = _driver(m, out, ray_address=None)  # no cluster recorded now: an embedded Ray
    rc, _, err = _finish(rerun)
    assert rc == 0, err[-3000:]
    _all_ok_once(out, m)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_cleanly_and_a_rerun_resumes(
    ray_cluster: str, tmp_path: Path, sig: signal.Signals
) -> None:
    m = _matrix(tmp_path, "signal", caps="[0.5, 1, 2, 4, 8]", steps=12)
    out = tmp_path / "out"
    proc = _driver(m, out, ray_address=ray_cluster)
    _wait_committed(out, proc)
    proc.send_signal(sig)
    rc, stdout, err = _finish(proc)
    assert rc == 128 + sig.value, err[-3000:]
    assert f"stopped by {sig.name}" in stdout and "Traceback" not in err
    assert not (out / LOCK_NAME).exists()  # the folder is free again
    assert {status for _, _, status in _statuses(out)} == {"ok"}
    rc, _, err = _finish(_driver(m, out, ray_address=ray_cluster))
    assert rc == 0, err[-3000:]
    _all_ok_once(out, m)
