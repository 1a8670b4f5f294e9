"""A real ``ray start`` cluster, run as README.md's cluster block says, word for word.

A head and a second node start on this machine with ``ray start`` (each with its own ports and
temp dir, stopped by PID in ``finally``: never ``ray stop``, which would stop every Ray on the
machine, the session's ``ray_cluster`` included). Everything runs in subprocesses with a HOME of
their own, so the token is the test's. The sweep runs through ``RAY_ADDRESS``, the worker node is
killed in the middle, a new one joins, and the sweep resumes through ``--address``: every cell ok
exactly once. ``commprof check`` tells the cluster that answers from the one that wants a token.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from commprof import results
from commprof.ray_address import NEEDS_TOKEN
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.ray]

README_PORT, README_HEAD = "6390", "$HEAD"
"""What the README's block says where a machine's own values go."""
ONLY = ("--only", "model=srn-100k", "--exclude", "profile=true")
"""Two cells of the smoke matrix (two caps of the smaller model, no profiler): the test's size."""


def readme_cluster_block() -> list[str]:
    """The lines of the first ``bash`` block under the README's "On a cluster" heading."""
    text = (REPO / "README.md").read_text()
    after = text[text.index("## On a cluster") :]
    body = after[after.index("```bash\n") + len("```bash\n") :]
    return [line for line in body[: body.index("```")].splitlines() if line.strip()]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _port_block(size: int) -> int:
    """The first of ``size`` consecutive free ports (Ray's fixed ports and worker ranges must not
    meet another Ray on this machine)."""
    for _ in range(200):
        base = random.randrange(30000, 60000 - size)
        if all(_bindable(p) for p in range(base, base + size)):
            return base
    raise RuntimeError("no block of free ports")


def _psutil() -> Any:
    """Ray's bundled psutil (importing ray puts it on ``sys.path``)."""
    import ray  # noqa: F401

    return importlib.import_module("psutil")


def _node_processes(temp_dir: Path) -> list[int]:
    """PIDs of a node's processes: those naming its temp dir, and everything they started
    (Ray's workers rename themselves ``ray::...``, so they are found as children)."""
    psutil = _psutil()
    roots = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid != os.getpid() and any(str(temp_dir) in a for a in proc.info["cmdline"] or []):
            roots.append(proc)
    pids = {p.pid for p in roots}
    for proc in roots:
        with contextlib.suppress(psutil.Error):
            pids.update(c.pid for c in proc.children(recursive=True))
    return sorted(pids)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _busy_rank(temp_dir: Path) -> bool:
    """Whether a rank of a cell runs on the node (a rank actor's process)."""
    psutil = _psutil()
    for pid in _node_processes(temp_dir):
        try:
            name = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if name.startswith("ray::RankActor"):
            return True
    return False


class Machine:
    """This machine playing the README's machines: the block's lines, run with the test's ports
    (substituted for the README's) and the flags two nodes on one machine need appended."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"  # the user's checkout as the README's paths see it
        self.work.mkdir()
        (self.work / "sweeps").symlink_to(REPO / "sweeps")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        python = bin_dir / "python"  # a script, not a link: a venv's python finds its venv so
        python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
        ray_cli = bin_dir / "ray"  # Ray's own CLI, from the Python that runs the tests
        ray_cli.write_text(f'#!/bin/sh\nexec {sys.executable} -m ray.scripts.scripts "$@"\n')
        ray_cli.chmod(0o755)
        home = root / "home"
        home.mkdir()
        drop = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(HOME=str(home), PATH=f"{bin_dir}:{self.env.get('PATH', '')}")
        self.env["PYTHONPATH"] = str(REPO)  # this checkout's commprof over any installed one
        self.port = str(_port_block(1))
        from ray._private.services import get_node_ip_address

        self.head = get_node_ip_address()
        self.temp_dirs: list[Path] = []
        self.lines = readme_cluster_block()

    def line(self, starts: str) -> list[str]:
        """The README line that starts with ``starts``, as argv with the test's values."""
        (line,) = [x for x in self.lines if x.startswith(starts)]
        return shlex.split(line.replace(README_PORT, self.port).replace(README_HEAD, self.head))

    def run(self, argv: list[str], *extra: str, env: dict[str, str] | None = None, **kw):  # type: ignore[no-untyped-def]
        """Run one README command (leading ``NAME=value`` words go to its environment)."""
        env = dict(env or self.env)
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            name, _, value = argv[0].partition("=")
            env[name] = value
            argv = argv[1:]
        return subprocess.Popen([*argv, *extra], cwd=self.work, env=env, **kw)

    def start_node(self, argv: list[str], *extra: str) -> Path:
        temp_dir = Path(tempfile.mkdtemp(prefix="cp-ray-", dir="/tmp"))  # short socket paths
        self.temp_dirs.append(temp_dir)
        ports = _port_block(42)
        flags = [
            f"--temp-dir={temp_dir}",
            f"--dashboard-agent-listen-port={ports}",
            f"--min-worker-port={ports + 2}",
            f"--max-worker-port={ports + 41}",
            *extra,
        ]
        done = self.run(argv, *flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = done.communicate(timeout=GUARD_S)
        assert done.returncode == 0, out[-3000:]
        return temp_dir

    def stop(self) -> None:
        for temp_dir in self.temp_dirs:
            _kill(_node_processes(temp_dir))
            shutil.rmtree(temp_dir, ignore_errors=True)


def _check(machine: Machine, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "commprof", "check"],
        env={**machine.env, "RAY_ADDRESS": f"{machine.head}:{machine.port}", **env},
        capture_output=True,
        text=True,
        timeout=GUARD_S,  # a hang is the failure; the probe answers in about a second
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.strip().startswith("ray cluster:")]
    return line


def _ok_once(out: Path, cell_ids: set[str]) -> None:
    cells = results.load(out)["cells"]
    ok = cells[cells["status"] == "ok"]
    assert sorted(ok["cell_id"]) == sorted(cell_ids), cells[["cell_id", "attempt", "status"]]


def test_the_readme_cluster_block_runs_and_resumes_after_a_lost_node(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    lines = machine.lines
    assert lines[0] == "export RAY_AUTH_MODE=token"  # the README's environment, every machine
    machine.env["RAY_AUTH_MODE"] = "token"
    head_port = _port_block(3)
    out = machine.work / "results" / "cluster"
    driver = None
    try:
        generate = machine.run(machine.line("ray get-auth-token"), stdout=subprocess.DEVNULL)
        assert generate.wait(timeout=GUARD_S) == 0
        machine.start_node(
            machine.line("ray start --head"),
            "--num-cpus=0",  # the cells run on the other node, which the test kills
            "--include-dashboard=false",
            f"--dashboard-port={head_port}",
            f"--ray-client-server-port={head_port + 1}",
        )
        worker = machine.start_node(machine.line("ray start --address"), "--num-cpus=2")

        # commprof check finds the token by itself (no RAY_AUTH_MODE) and tells a cluster that
        # wants a token this machine lacks from one that is not there
        plain = {k: v for k, v in machine.env.items() if k != "RAY_AUTH_MODE"}
        machine.env, saved = plain, machine.env
        assert f"{machine.head}:{machine.port}: answers" in _check(machine)
        assert "reachable, needs a token" in _check(machine, RAY_AUTH_TOKEN_PATH=str(tmp_path))
        assert "not reachable" in _check(machine, RAY_ADDRESS=f"127.0.0.1:{_port_block(1)}")
        machine.env = saved

        driver = machine.run(
            machine.line("RAY_ADDRESS="), *ONLY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 600
        while not _busy_rank(worker):
            assert driver.poll() is None, driver.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no cell started on the worker node"
            time.sleep(0.1)
        _kill(_node_processes(worker))  # the node is lost in the middle of the sweep
        committed = {k for k, v in results.latest_status(out).items() if v[0] == "ok"}
        driver.send_signal(signal.SIGTERM)
        log, _ = driver.communicate(timeout=GUARD_S)
        assert driver.returncode != 0, log.decode()[-3000:]  # stopped, not finished
        assert len(committed) < 2, "the node was killed after the sweep"

        machine.start_node(machine.line("ray start --address"), "--num-cpus=2")
        resume = machine.run(
            machine.line("python sweeps/run_matrix.py --address"),
            *ONLY,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        log, _ = resume.communicate(timeout=GUARD_S)
        assert resume.returncode == 0, log.decode()[-3000:]
        from commprof.matrix import load
        from commprof.sweeps.plan import select

        smoke = load(REPO / "sweeps" / "smoke.yaml")
        chosen = {c.cell_id for c in select(smoke.cells, ONLY[1:2], ONLY[3:4])}
        assert len(chosen) == 2
        _ok_once(out, chosen)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        machine.stop()


def _analyze(machine: Machine, job: Path, *flags: str, **env: str) -> tuple[int, int, str, str]:
    """``commprof analyze JOB --json FLAGS`` as a user runs it: (pid, exit code, stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "commprof", "analyze", str(job), "--json", *flags],
        env={**machine.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=GUARD_S)  # a hang is the failure
    return proc.pid, proc.returncode, out, err


def test_analyze_on_ray_attaches_to_a_ray_start_cluster_as_a_sweep_does(tmp_path: Path) -> None:
    from tests.trace_events import write_job

    machine = Machine(tmp_path)
    job = write_job(tmp_path / "job")
    plain = dict(machine.env)  # the driver's: no RAY_AUTH_MODE, the token in its HOME
    machine.env["RAY_AUTH_MODE"] = "token"  # the README's, for the `ray` commands
    address = f"{machine.head}:{machine.port}"
    head_port = _port_block(3)
    try:
        generate = machine.run(machine.line("ray get-auth-token"), stdout=subprocess.DEVNULL)
        assert generate.wait(timeout=GUARD_S) == 0
        head = machine.start_node(
            machine.line("ray start --head"),
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--dashboard-port={head_port}",
            f"--ray-client-server-port={head_port + 1}",
        )
        machine.env = plain
        pid, rc, out, err = _analyze(machine, job, "--ray", RAY_ADDRESS=address)
        assert rc == 0, err[-3000:]
        # the command was a driver of that cluster (its log lies in the head's session), and
        # its tasks gave the tables the serial parse gives
        driver_logs = (head / "session_latest" / "logs").glob(f"python-core-driver-*_{pid}.log")
        assert list(driver_logs), f"commprof analyze --ray did not run on {address}"
        _, rc, serial, err = _analyze(machine, job, "--workers", "1")
        assert rc == 0, err[-3000:]
        assert json.loads(out) == json.loads(serial)
        # a machine without the token: one line saying what to set, before Ray's own retries
        lacking = str(tmp_path / "no-token")
        _, rc, out, err = _analyze(machine, job, "--address", address, RAY_AUTH_TOKEN_PATH=lacking)
        assert rc == 2 and not out, err[-3000:]
        said = f"commprof analyze: Ray cluster {address}: {NEEDS_TOKEN}"
        assert err.strip().splitlines() == [said]
    finally:
        machine.stop()
