"""`commprof analyze` on many ranks: parallel parsing (processes, Ray), subfolders, pipes, JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commprof.traces.analyze import analyze, run
from commprof.traces.rank_pool import analyze_files
from tests.trace_events import OFFSET_US, write_job

GOLDEN = Path(__file__).parent / "data" / "golden_gloo2"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic 4-rank job of tests/trace_events.py written as rank files."""
    return write_job(tmp_path_factory.mktemp("job"))


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_processes_give_the_serial_tables(job_dir: Path) -> None:
    serial = analyze(job_dir, workers=1)
    pooled = analyze(job_dir, workers=2)
    for name, table in serial.tables().items():
        _same(table, pooled.tables()[name])
    assert serial.cross is not None
    offsets = serial.cross.offsets["offset_ns"].to_numpy()
    assert offsets.tolist() == np.rint(np.array(OFFSET_US) * 1000).astype(np.int64).tolist()


@pytest.mark.ray
@pytest.mark.slow
def test_ray_tasks_give_the_serial_tables(job_dir: Path, ray_cluster: str) -> None:
    serial = analyze(job_dir, workers=1)
    on_ray = analyze(job_dir, use_ray=True)
    for name, table in serial.tables().items():
        _same(table, on_ray.tables()[name])


def _cli_json(job: Path, *flags: str, env: dict[str, str]) -> object:
    done = subprocess.run(
        [sys.executable, "-m", "commprof", "analyze", str(job), "--json", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a hang is the failure; an embedded Ray starts in seconds
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.ray
def test_the_cli_on_ray_with_no_cluster_starts_its_own(job_dir: Path, tmp_path: Path) -> None:
    """``commprof analyze --ray`` where no cluster runs: an embedded Ray of the command, which
    gives the serial tables (the CLI's own path: no Ray of the test process runs the tasks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    ray_tmp = tempfile.mkdtemp(prefix="cp-ray-", dir="/tmp")  # no cluster recorded there
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path), RAY_TMPDIR=ray_tmp)
    try:
        on_ray = _cli_json(job_dir, "--ray", env=env)
        assert list(Path(ray_tmp).glob("ray/session_*")), "no embedded Ray started"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert on_ray == _cli_json(job_dir, "--workers", "1", env=env)


def test_every_failed_trace_is_named(tmp_path: Path) -> None:
    for name in ("rank0.json", "rank1.json"):
        (tmp_path / name).write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    with pytest.raises(ValueError, match=r"rank0\.json.*rank1\.json.*2 of 2 traces failed"):
        analyze_files(sorted(tmp_path.iterdir()), workers=2)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        analyze_files([], workers=0)


def test_json_cross_rank_section(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(job_dir, None, True, None, workers=1) == 0
    doc = json.loads(capsys.readouterr().out)
    cross = doc["cross_rank"]
    assert cross["reference_rank"] == 0 and cross["matched_by"] == {"pg 0": "seq"}
    assert [o["offset_ns"] for o in cross["clock_offsets"]] == [round(o * 1000) for o in OFFSET_US]
    assert cross["residual_max_ns"] == 0 and cross["stragglers"][0]["rank"] == 2
    assert all("other_ns" in r for r in doc["steps"])
    assert run(job_dir, None, False, None, workers=1) == 0
    text = capsys.readouterr().out
    assert "Clock offsets (ms" in text and "Stragglers" in text and "window_source" in text


def test_one_rank_has_no_cross_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(GOLDEN / "rank0_steps2-4.json.gz", tmp_path)
    assert run(tmp_path, None, True, None) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cross_rank"] is None and doc["cross_rank_note"] == "one rank"


def test_traces_in_subfolders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cell = tmp_path / "sweep" / "traces" / "abc123-a1"
    cell.mkdir(parents=True)
    for name in ("rank0_steps2-4.json.gz", "rank1_steps2-4.json.gz"):
        shutil.copy(GOLDEN / name, cell / name)
    assert run(tmp_path, None, True, None) == 0
    captured = capsys.readouterr()
    assert f"reading the traces in {cell}" in captured.err
    assert len(json.loads(captured.out)["steps"]) == 6
    other = tmp_path / "sweep" / "traces" / "def456-a1"
    shutil.copytree(cell, other)
    assert run(tmp_path, None, True, None) == 2
    err = capsys.readouterr().err
    assert "2 of its subfolders" in err and "abc123-a1" in err and "def456-a1" in err


def test_closed_stdout_is_no_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "commprof", "analyze", str(GOLDEN), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written (`| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_workers_flag_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from commprof.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(GOLDEN), "--workers", "0"])
    assert exc.value.code == 2 and "--workers" in capsys.readouterr().err
