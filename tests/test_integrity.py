"""Checksums in the commit record: a flipped bit or a truncated file is found and named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commprof import results
from commprof.matrix import Cell

CELL = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1)
OTHER = Cell(model="srn-100k", world_size=2, bucket_cap_mb=2)
STEPS = [{"rank": 0, "step": s, "measured": True, "step_ns": 10 + s} for s in range(3)]


def _commit(root: Path, cell: Cell) -> None:
    row = results.cell_row(cell, sweep="t", attempt=1, status="ok")
    results.write_attempt(root, row, {"steps": STEPS}, {"rank0.json.gz": b"trace bytes"})


def test_the_commit_record_holds_every_files_checksum(tmp_path: Path) -> None:
    _commit(tmp_path, CELL)
    row = results.load(tmp_path)["cells"].iloc[0]
    sums = json.loads(row["checksums_json"])
    assert sorted(sums) == [f"cells/{CELL.cell_id}-a1.parquet", f"steps/{CELL.cell_id}-a1.parquet",
                            f"traces/{CELL.cell_id}-a1/rank0.json.gz"]  # fmt: skip
    assert sums[f"cells/{CELL.cell_id}-a1.parquet"] == results.SIDECAR  # its bytes: beside it
    assert len(row["commit_sha256"]) == 64
    assert results.damaged_attempts(tmp_path) == {}


@pytest.mark.parametrize("where", ["steps", "cells", "trace"])
def test_a_flipped_bit_is_named(tmp_path: Path, where: str) -> None:
    _commit(tmp_path, CELL)
    _commit(tmp_path, OTHER)
    path = {
        "steps": tmp_path / "steps" / f"{CELL.cell_id}-a1.parquet",
        "cells": tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet",
        "trace": tmp_path / "traces" / f"{CELL.cell_id}-a1" / "rank0.json.gz",
    }[where]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    damaged = results.damaged_attempts(tmp_path)
    assert list(damaged) == [(CELL.cell_id, 1)] and str(path) in damaged[(CELL.cell_id, 1)]
    if where != "trace":  # load checks the tables; the traces on request
        with pytest.raises(results.DamagedDataset, match=CELL.cell_id):
            results.load(tmp_path)


def test_a_truncated_file_is_set_aside_and_the_rest_loads(tmp_path: Path) -> None:
    _commit(tmp_path, CELL)
    _commit(tmp_path, OTHER)
    cells_file = tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet"
    cells_file.write_bytes(cells_file.read_bytes()[:40])
    with pytest.raises(results.DamagedDataset, match="changed since it was written"):
        results.load(tmp_path)
    moved = results.set_aside_damaged(tmp_path)
    assert list(moved) == [CELL.cell_id] and moved[CELL.cell_id][0] == 1
    tables = results.load(tmp_path)
    assert tables["cells"]["cell_id"].tolist() == [OTHER.cell_id]
    assert len(tables["steps"]) == len(STEPS)  # only the intact cell's rows
    (aside,) = (tmp_path / "damaged").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["WHY.txt", "cells", "steps", "traces"]
    assert sorted(p.name for p in (aside / "cells").iterdir()) == [
        f".{CELL.cell_id}-a1.sha256",  # the commit record's own checksum goes with it
        f"{CELL.cell_id}-a1.parquet",
    ]
    assert results.latest_status(tmp_path) == {OTHER.cell_id: ("ok", 1, None)}


def test_datasets_from_before_checksums_still_load() -> None:
    # the committed dataset mixes attempts from before checksums (not verified, not refused)
    # with later ones (tests/data/results_smoke/make_dataset.py, hook_cost.yaml), verified
    data = Path(__file__).parent / "data" / "results_smoke"
    cells = results.load(data)["cells"]  # rows without checksums are not verified, not refused
    before = cells["commit_sha256"].isna()
    assert before.sum() >= 20 and (~before).sum() >= 1


@pytest.mark.parametrize("table", ["cells", "steps"])
def test_a_flipped_bit_anywhere_in_a_committed_file_is_found(tmp_path: Path, table: str) -> None:
    """Every byte counts, not only the column chunks: a flip in the Parquet footer (schema,
    key-value metadata) of the commit record passed `load` before its sidecar checksum."""
    _commit(tmp_path, CELL)
    path = tmp_path / table / f"{CELL.cell_id}-a1.parquet"
    original = path.read_bytes()
    positions = sorted({*range(0, len(original), 97), *range(len(original) - 400, len(original))})
    for position in positions:  # every 97th byte, and every byte of the file's last 400 (footer)
        data = bytearray(original)
        data[position] ^= 0x01
        path.write_bytes(bytes(data))
        damaged = results.damaged_attempts(tmp_path, traces=False)
        assert list(damaged) == [(CELL.cell_id, 1)], position
        assert "changed since it was written" in damaged[(CELL.cell_id, 1)], position
    path.write_bytes(original)
    assert results.damaged_attempts(tmp_path) == {}


def test_a_missing_sidecar_is_named(tmp_path: Path) -> None:
    _commit(tmp_path, CELL)
    sidecar = results.sidecar_path(tmp_path / "cells" / f"{CELL.cell_id}-a1.parquet")
    sidecar.unlink()
    said = rf"{sidecar.name} \(its checksum\) is missing"
    with pytest.raises(results.DamagedDataset, match=said):
        results.load(tmp_path)


def test_a_table_folder_still_reads_as_parquet(tmp_path: Path) -> None:
    """The sidecar is hidden: readers of a whole table folder skip it."""
    import pandas as pd

    _commit(tmp_path, CELL)
    _commit(tmp_path, OTHER)
    cells = pd.read_parquet(tmp_path / "cells")
    assert sorted(cells["cell_id"]) == sorted([CELL.cell_id, OTHER.cell_id])
