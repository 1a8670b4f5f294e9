"""Filesystems that refuse a write, and a dataset the report cannot fit: each ends in one line
naming the path and a non-zero exit (a traceback, before). Real commands, a real tmpfs filled in
a private mount namespace, a real read-only folder (tests/mounts.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from commprof import results
from tests.hang import GUARD_S
from tests.mounts import argv, lines_of, read_only, run_mounted, tmpfs
from tests.prereqs import needs

REPO = Path(__file__).resolve().parent.parent
SMOKE = Path(__file__).parent / "data" / "results_smoke"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
PYTHON = [sys.executable, "-m", "commprof"]


@pytest.mark.slow
@needs(tool="unshare")
def test_a_full_disk_at_commit_names_the_path(tmp_path: Path) -> None:
    out = tmp_path / "full"
    run = argv(*PYTHON, "run", "--model", "srn-100k", "--world-size", "2", "--steps", "3",
               "--out", out)  # fmt: skip
    # 32 KiB: the lock file and the first tables fit, the attempt's files do not
    said = run_mounted(
        tmpfs(str(out), "32k"),
        f"{run}; echo RC=$?; find {argv(out)} -name '*.parquet' -o -name '*.tmp'",
        env=ENV,
        timeout=GUARD_S,
    )
    assert lines_of(said, "RC=") == ["RC=2"], said[-3000:]
    (error,) = lines_of(said, "error: ")
    assert error.startswith(f"error: cannot write {out}/") and "No space left on device" in error
    assert "Traceback" not in said
    committed = [line for line in said.splitlines() if "/cells/" in line or line.endswith(".tmp")]
    assert committed == [], said  # no commit record and no temporary file left behind


@pytest.mark.slow
@needs(tool="unshare")
def test_report_on_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    shutil.copytree(SMOKE, data)
    said = run_mounted(
        read_only(str(data)),
        f"{argv(*PYTHON, 'report', data)}; echo RC=$?",
        env=ENV,
        timeout=GUARD_S,
    )
    assert lines_of(said, "RC=") == ["RC=2"], said[-3000:]
    assert lines_of(said, "error: ") == [
        f"error: cannot write to {data}/report (Read-only file system); pass --out DIR to write "
        "the output elsewhere"
    ], said[-3000:]
    assert "Traceback" not in said


def _one_size_dataset(root: Path) -> Path:
    """One ok cell of the committed smoke dataset, its microbenchmark cut to one matrix size
    (and the model's bucket sizes): what a matrix with one microbenchmark size collected."""
    import pyarrow.parquet as pq

    stem = "06eb2cf7979c-a1.parquet"
    rows = {
        table: [
            {k: v for k, v in row.items() if k not in ("cell_id", "attempt")}
            for row in pq.read_table(SMOKE / table / stem).to_pylist()
        ]
        for table in results.TABLES
        if (SMOKE / table / stem).is_file()
    }
    (cell_row,) = pq.read_table(SMOKE / "cells" / stem).to_pylist()
    rows.pop("cells")
    smallest = min(r["num_bytes"] for r in rows["microbench"] if r["source"] == "sizes")
    rows["microbench"] = [
        r for r in rows["microbench"] if r["source"] == "bucket" or r["num_bytes"] == smallest
    ]
    for key in ("checksums_json", "commit_sha256"):
        cell_row.pop(key, None)  # the smoke data predate checksums
    out = root / "onesize"
    results.write_attempt(out, cell_row, rows)
    return out


def test_report_on_a_dataset_with_one_microbenchmark_size_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from commprof import cli

    data = _one_size_dataset(tmp_path)
    sizes = results.load(data)["microbench"]["num_bytes"].nunique()
    assert sizes < 3  # too few for the link fit, as a matrix of one size collects
    status = cli.main(["report", str(data)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot process the dataset {data}: ") and "3" in err
