"""The dataset: atomic attempt writes, committed-only loading, and resume bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from commprof import results
from commprof.matrix import Cell

CELL = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1)


def _steps(n: int) -> list[dict[str, int | bool]]:
    return [
        {
            "rank": r,
            "step": s,
            "measured": s > 0,
            "step_ns": 10 + s,
            "forward_ns": 1,
            "backward_ns": 2,
            "optimizer_ns": 3,
        }
        for r in range(2)
        for s in range(n)
    ]


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok", num_params=99_912)
    results.write_attempt(tmp_path, row, {"steps": _steps(3)})
    tables = results.load(tmp_path)
    assert set(tables) == set(results.TABLES)
    assert len(tables["cells"]) == 1
    assert tables["cells"].loc[0, "cell_id"] == CELL.cell_id
    assert len(tables["steps"]) == 2 * 3
    assert (tables["steps"]["cell_id"] == CELL.cell_id).all()
    assert tables["buckets"].empty and list(tables["buckets"].columns) == (
        results.SCHEMAS["buckets"].names
    )
    assert results.latest_status(tmp_path) == {CELL.cell_id: ("ok", 1, None)}


def test_uncommitted_rows_are_invisible(tmp_path: Path) -> None:
    # A driver killed after writing steps but before the cells row: nothing shows.
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok")
    results.write_attempt(tmp_path, row, {"steps": _steps(2)})
    (tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet").unlink()
    (tmp_path / "steps" / ".leftover.tmp").write_bytes(b"half a file")
    tables = results.load(tmp_path)
    assert tables["cells"].empty and tables["steps"].empty
    assert results.latest_status(tmp_path) == {}


def test_attempts_are_separate_and_latest_wins(tmp_path: Path) -> None:
    failed = results.cell_row(
        CELL, sweep="t", attempt=1, status="failed", error="boom", error_kind="transient"
    )
    results.write_attempt(tmp_path, failed, {})
    ok = results.cell_row(CELL, sweep="t", attempt=2, status="ok")
    results.write_attempt(tmp_path, ok, {"steps": _steps(2)})
    assert results.latest_status(tmp_path)[CELL.cell_id] == ("ok", 2, None)
    cells = results.load(tmp_path)["cells"]
    assert sorted(cells["attempt"]) == [1, 2]
    assert cells.set_index("attempt").loc[1, "error"] == "boom"


def test_files_have_the_schema(tmp_path: Path) -> None:
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok")
    results.write_attempt(tmp_path, row, {"steps": _steps(1)})
    schema = pq.read_schema(tmp_path / "steps" / f"{CELL.cell_id}-a1.parquet")
    assert schema.names == results.SCHEMAS["steps"].names


def test_bad_rows_and_tables_are_rejected(tmp_path: Path) -> None:
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok")
    with pytest.raises(ValueError, match="no columns"):
        results.write_attempt(tmp_path, row, {"steps": [{"rank": 0, "colour": "red"}]})
    with pytest.raises(ValueError, match="unknown table"):
        results.write_attempt(tmp_path, row, {"stepz": [{"rank": 0}]})
    with pytest.raises(ValueError, match="status"):
        results.cell_row(CELL, sweep="t", attempt=1, status="done")
    # nothing half-written is left behind as a committed attempt
    assert results.latest_status(tmp_path) == {}


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no dataset folder"):
        results.load(tmp_path / "nope")


def test_leftovers_of_an_uncommitted_attempt_are_not_adopted(tmp_path: Path) -> None:
    # A driver killed after writing attempt 1's steps and a trace, before its cells row ...
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok")
    results.write_attempt(tmp_path, row, {"steps": _steps(2)}, {"rank0.json.gz": b"old"})
    (tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet").unlink()
    # ... then attempt 1 runs again and fails: no steps, no traces of the old run remain.
    failed = results.cell_row(CELL, sweep="t", attempt=1, status="failed", error="lost")
    results.write_attempt(tmp_path, failed, {})
    tables = results.load(tmp_path)
    assert tables["steps"].empty
    assert not (tmp_path / "traces" / f"{CELL.cell_id}-a1").exists()


def test_a_committed_attempt_is_never_overwritten(tmp_path: Path) -> None:
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok")
    results.write_attempt(tmp_path, row, {"steps": _steps(2)})
    failed = results.cell_row(CELL, sweep="t", attempt=1, status="failed", error="late writer")
    with pytest.raises(ValueError, match=r"attempt 1 of cell \w+ is already committed"):
        results.write_attempt(tmp_path, failed, {})
    tables = results.load(tmp_path)
    assert tables["cells"]["status"].tolist() == ["ok"] and len(tables["steps"]) == len(_steps(2))


def test_load_average_is_recorded_and_older_rows_still_verify(tmp_path: Path) -> None:
    import pyarrow as pa

    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok", load_avg_1m=1.25)
    results.write_attempt(tmp_path, row, {"steps": _steps(2)})
    assert results.load(tmp_path)["cells"].loc[0, "load_avg_1m"] == 1.25
    # A cells file written before the column existed (and before the file's sidecar checksum):
    # no load_avg_1m column at all, and a digest over the row without it. It loads (null load)
    # and verifies.
    old = tmp_path / "old"
    row = results.cell_row(CELL, sweep="t", attempt=1, status="ok")
    results.write_attempt(old, row, {})
    path = old / "cells" / f"{CELL.cell_id}-a1.parquet"
    results.sidecar_path(path).unlink()
    table = pq.read_table(path).drop(["load_avg_1m"])
    table = table.set_column(
        table.schema.get_field_index("checksums_json"), "checksums_json", pa.array(["{}"])
    )
    fields = {k: v for k, v in table.to_pylist()[0].items() if k != "commit_sha256"}
    digest = results.hashlib.sha256(
        results.json.dumps(fields, sort_keys=True, default=str).encode()
    ).hexdigest()
    table = table.set_column(
        table.schema.get_field_index("commit_sha256"), "commit_sha256", pa.array([digest])
    )
    pq.write_table(table, path)
    cells = results.load(old)["cells"]
    assert cells["load_avg_1m"].isna().all() and results.damaged_attempts(old) == {}
    assert results.host_load_avg_1m() is None or results.host_load_avg_1m() >= 0.0
