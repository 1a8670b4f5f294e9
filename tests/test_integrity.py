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
    assert sorted(sums) == [f"steps/{CELL.cell_id}-a1.parquet",
                            f"traces/{CELL.cell_id}-a1/rank0.json.gz"]  # fmt: skip
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
    with pytest.raises(results.DamagedDataset, match="cannot be read"):
        results.load(tmp_path)
    moved = results.set_aside_damaged(tmp_path)
    assert list(moved) == [CELL.cell_id] and moved[CELL.cell_id][0] == 1
    tables = results.load(tmp_path)
    assert tables["cells"]["cell_id"].tolist() == [OTHER.cell_id]
    assert len(tables["steps"]) == len(STEPS)  # only the intact cell's rows
    (aside,) = (tmp_path / "damaged").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["WHY.txt", "cells", "steps", "traces"]
    assert results.latest_status(tmp_path) == {OTHER.cell_id: ("ok", 1, None)}


def test_datasets_from_before_checksums_still_load() -> None:
    # the committed dataset mixes attempts from before checksums (not verified, not refused)
    # with later ones (tests/data/results_smoke/make_dataset.py, hook_cost.yaml), verified
    data = Path(__file__).parent / "data" / "results_smoke"
    cells = results.load(data)["cells"]
    before = cells["commit_sha256"].isna()
    assert before.sum() >= 20 and (~before).sum() >= 1
