"""Resuming never runs a complete cell again, whatever else in the folder is damaged: an older
attempt's damaged file is set aside and the ok attempt stands; a dangling symbolic link in a
table folder is set aside (or ignored) instead of blocking every resume. Real files; the last
test runs `commprof run` (real gloo ranks) twice on one folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commprof import results
from commprof.attempts import FailurePolicy, plan_cells, resume_state
from commprof.matrix import Cell
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
CELL = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1, steps=3)
OTHER = Cell(model="srn-100k", world_size=2, bucket_cap_mb=2, steps=3)
STEPS = [{"rank": r, "step": s, "measured": s > 0, "step_ns": 10} for r in (0, 1) for s in range(3)]


def _failed_then_ok(root: Path, cell: Cell) -> None:
    failed = results.cell_row(
        cell, sweep="t", attempt=1, status="failed", error="boom", error_kind="transient"
    )
    results.write_attempt(root, failed, {})
    ok = results.cell_row(cell, sweep="t", attempt=2, status="ok")
    results.write_attempt(root, ok, {"steps": STEPS})


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


def test_a_damaged_older_attempt_leaves_the_ok_one_standing(tmp_path: Path) -> None:
    _failed_then_ok(tmp_path, CELL)
    _truncate(tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet")
    latest = resume_state(tmp_path)
    assert latest == {CELL.cell_id: ("ok", 2, None)}  # not "damaged": nothing runs again
    plan = plan_cells([CELL], latest, lambda _: True, FailurePolicy(max_attempts=2))
    assert plan.skipped == {CELL.cell_id: "ok"} and plan.todo == []
    (aside,) = (tmp_path / "damaged").iterdir()  # the damaged attempt kept aside, with why
    assert aside.name.startswith(f"{CELL.cell_id}-a1-") and (aside / "WHY.txt").is_file()
    tables = results.load(tmp_path)
    assert tables["cells"]["attempt"].tolist() == [2] and len(tables["steps"]) == len(STEPS)


def test_a_damaged_latest_attempt_runs_again_after_it(tmp_path: Path) -> None:
    _failed_then_ok(tmp_path, CELL)
    _truncate(tmp_path / "steps" / f"{CELL.cell_id}-a2.parquet")  # the ok attempt's rows
    assert resume_state(tmp_path) == {CELL.cell_id: ("damaged", 2, None)}


def test_dangling_links_in_table_folders_do_not_block_resume(tmp_path: Path) -> None:
    row = results.cell_row(OTHER, sweep="t", attempt=1, status="ok")
    results.write_attempt(tmp_path, row, {"steps": STEPS})
    # a link named like a commit record, pointing nowhere; and one named like nothing of ours
    os.symlink(tmp_path / "gone", tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet")
    os.symlink(tmp_path / "gone", tmp_path / "steps" / "notes")
    latest = resume_state(tmp_path)  # FileNotFoundError in setting it aside, before
    assert latest == {OTHER.cell_id: ("ok", 1, None), CELL.cell_id: ("damaged", 1, None)}
    (aside,) = (tmp_path / "damaged").iterdir()
    assert (aside / "cells" / f"{CELL.cell_id}-a1.parquet").is_symlink()  # moved, not followed
    assert "cannot be read" in (aside / "WHY.txt").read_text()
    assert resume_state(tmp_path) == {OTHER.cell_id: ("ok", 1, None)}  # and again: nothing left
    assert results.load(tmp_path)["cells"]["cell_id"].tolist() == [OTHER.cell_id]
    assert results.check_writable(tmp_path) == tmp_path


def _commprof_run(out: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        "run",
        "--model",
        "srn-100k",
        "--world-size",
        "2",
        "--steps",
        "3",
        "--bucket-cap-mb",
        "1",
    ]
    return subprocess.run(
        [sys.executable, "-m", "commprof", *argv, "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"},
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )


@pytest.mark.slow
def test_commprof_run_never_reruns_a_complete_cell(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    cell = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1, steps=3)
    failed = results.cell_row(
        cell, sweep="run", attempt=1, status="failed", error="boom", error_kind="transient"
    )
    results.write_attempt(out, failed, {})  # a transient failure: the next run tries again
    done = _commprof_run(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert results.latest_status(out) == {cell.cell_id: ("ok", 2, None)}
    _truncate(out / "cells" / f"{cell.cell_id}-a1.parquet")  # the old failure's record damaged
    done = _commprof_run(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "already complete" in done.stderr and "set aside (its ok attempt 2 stands)" in done.stderr
    )
    tables = results.load(out)
    assert tables["cells"][["attempt", "status"]].values.tolist() == [[2, "ok"]]
    assert len(tables["steps"]) == 2 * 3  # one ok attempt's rows, not two
