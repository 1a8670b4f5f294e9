"""Matrix files: expansion, stable ids, and errors that name file, key and allowed values."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from commprof import matrix
from commprof.catalog import MODEL_NAMES
from commprof.matrix import Cell, MatrixError

REPO = Path(__file__).resolve().parent.parent

GOOD = """
name: t
axes:
  model: [srn-100k, srn-1m]
  world_size: [2, 4]
  bucket_cap_mb: [1, 25.5]
defaults:
  steps: 5
repeats: 2
run:
  max_attempts: 3
"""


def _load(tmp_path: Path, text: str) -> matrix.Matrix:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return matrix.load(path)


def test_expands_the_product_times_repeats(tmp_path: Path) -> None:
    m = _load(tmp_path, GOOD)
    assert len(m.cells) == 2 * 2 * 2 * 2
    assert {c.repeat for c in m.cells} == {0, 1}
    assert all(c.steps == 5 for c in m.cells)
    assert m.run.max_attempts == 3
    assert len({c.cell_id for c in m.cells}) == len(m.cells)


def test_cell_id_is_stable_and_depends_on_config_only(tmp_path: Path) -> None:
    a = Cell(model="srn-1m", world_size=2, bucket_cap_mb=25)
    b = Cell(model="srn-1m", world_size=2, bucket_cap_mb=25.0)
    assert a.cell_id == b.cell_id
    assert len(a.cell_id) == 12
    assert Cell(model="srn-1m", world_size=2, bucket_cap_mb=25, repeat=1).cell_id != a.cell_id
    # the same file read twice gives the same ids, in the same order
    ids = [c.cell_id for c in _load(tmp_path, GOOD).cells]
    assert ids == [c.cell_id for c in _load(tmp_path, GOOD).cells]
    assert matrix.cell_from_config(a.config()) == a
    # a field added later is hashed only where it differs from the value earlier cells had
    old_config = {k: v for k, v in a.config().items() if k != "microbench_passes"}
    assert a.config()["microbench_passes"] == 1
    assert matrix.config_hash(old_config) == a.cell_id
    assert matrix.cell_from_config(old_config) == a
    two = Cell(model="srn-1m", world_size=2, bucket_cap_mb=25, microbench_passes=2)
    assert two.cell_id != a.cell_id and matrix.cell_from_config(two.config()) == two


def test_committed_dataset_ids_are_recomputed_from_their_configs() -> None:
    # cells written by earlier versions keep their ids, so a sweep over them resumes
    cells = pd.concat(
        pd.read_parquet(path)
        for path in sorted((REPO / "tests" / "data" / "results_smoke" / "cells").glob("*.parquet"))
    )
    assert len(cells) >= 20
    for cell_id, config_json in cells[["cell_id", "config_json"]].itertuples(index=False):
        assert matrix.cell_from_config(json.loads(config_json)).cell_id == cell_id


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            GOOD.replace("bucket_cap_mb: [1, 25.5]", "bucket_cap_mb: [1]\n  colour: [red]"),
            ["axes.colour", "allowed here", "bucket_cap_mb"],
        ),
        (
            GOOD.replace("world_size: [2, 4]", "world_size: [two]"),
            ["axes.world_size", "'two'", "expected int"],
        ),
        (
            GOOD.replace("world_size: [2, 4]", "world_size: [0]"),
            ["world_size", ">= 1", "got 0", "m.yaml"],
        ),
        (GOOD.replace("steps: 5", "steps: 5\n  stepz: 3"), ["defaults.stepz"]),
        (
            GOOD.replace("steps: 5", "steps: 5\n  microbench_passes: 0"),
            ["microbench_passes", ">= 1", "got 0"],
        ),
        (GOOD.replace("max_attempts: 3", "max_attempts: true"), ["run.max_attempts", "bool"]),
        (GOOD.replace("[srn-100k, srn-1m]", "[srn-7q]"), ["srn-7q", "srn-100k", "gpt2-small"]),
        (GOOD.replace("name: t", "name: ../evil"), ["key 'name'"]),
        (GOOD.replace("name: t", "name: run"), ["key 'name'", "commprof run"]),
        (GOOD + "budget:\n  host_ram: 5\n", ["budget.host_ram", "host_ram_bytes"]),
        (GOOD.replace("steps: 5", "steps: 5\n  backend: nccl"), ["nccl", "cuda"]),
        ("axes: [1, 2]\n", ["axes", "mapping"]),
        ("- just\n- a list\n", ["mapping"]),
        ("name: t\naxes:\n  model: [srn-1m]\n", ["axes.world_size", "required"]),
        (GOOD + "env:\n  CUDA_VISIBLE_DEVICES: '0'\n", ["env.CUDA_VISIBLE_DEVICES", "NCCL_"]),
        (GOOD + "env:\n  nccl_debug: INFO\n", ["env.nccl_debug", "upper case"]),
        (GOOD + "env:\n  NCCL_NTHREADS: 64\n", ["env.NCCL_NTHREADS", "int", "quote it"]),
        (GOOD + "env: [NCCL_DEBUG]\n", ["key 'env'", "mapping"]),
    ],
)
def test_bad_matrix_names_file_and_key(tmp_path: Path, text: str, needles: list[str]) -> None:
    with pytest.raises(MatrixError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert str(tmp_path / "m.yaml") in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_env_section_reaches_the_matrix(tmp_path: Path) -> None:
    text = (
        GOOD
        + "env:\n  NCCL_DEBUG: INFO\n  GLOO_SOCKET_IFNAME: eth0\n  TORCH_NCCL_BLOCKING_WAIT: '1'\n"
    )
    loaded = _load(tmp_path, text)
    assert loaded.env == {
        "NCCL_DEBUG": "INFO",
        "GLOO_SOCKET_IFNAME": "eth0",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
    }
    # not part of any cell's id: the same cells as without it
    assert [c.cell_id for c in loaded.cells] == [c.cell_id for c in _load(tmp_path, GOOD).cells]


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="cannot read"):
        matrix.load(tmp_path / "missing.yaml")
    with pytest.raises(MatrixError, match="not valid YAML"):
        _load(tmp_path, "axes: [unclosed\n")


def test_geometric_microbench_sizes(tmp_path: Path) -> None:
    m = _load(tmp_path, GOOD + "microbench:\n  min_bytes: 1024\n  max_bytes: 8192\n")
    assert m.cells[0].microbench_sizes_bytes == (1024, 2048, 4096, 8192)


@pytest.mark.parametrize("name", ["smoke.yaml", "matrix.yaml"])
def test_shipped_matrices_are_valid(name: str) -> None:
    m = matrix.load(REPO / "sweeps" / name)
    assert m.cells
    assert {c.model for c in m.cells} <= set(MODEL_NAMES)


def test_only_and_exclude_filters(tmp_path: Path) -> None:
    from commprof.sweeps.driver import select

    cells = _load(tmp_path, GOOD).cells
    only_1m = select(cells, ("model=srn-1m",), ())
    assert {c.model for c in only_1m} == {"srn-1m"} and len(only_1m) == len(cells) // 2
    both = select(cells, ("model=srn-1m", "world_size=2"), ())
    assert len(both) == len(cells) * 3 // 4  # any term matches
    no_4 = select(cells, (), ("world_size=4",))
    assert {c.world_size for c in no_4} == {2}
    one = select(cells, (cells[3].cell_id[:8],), ())
    assert one == [cells[3]]
    # a field hashed only away from its old value can still be filtered on at that value
    assert select(cells, ("microbench_passes=1",), ()) == list(cells)
    with pytest.raises(ValueError, match="no cell key 'colour'"):
        select(cells, ("colour=red",), ())


def test_rejected_cells_are_decided_again_when_budgets_change(tmp_path: Path) -> None:
    from commprof import results
    from commprof.sweeps.driver import Driver, DriverOptions

    text = GOOD.replace("repeats: 2", "repeats: 1")
    small = _load(tmp_path, text + "budget:\n  host_ram_bytes: 1000\n")
    out = tmp_path / "out"
    plan = Driver(small, DriverOptions(out=out)).plan()
    todo, rejected = plan.todo, plan.rejected
    assert not todo and len(rejected) == len(small.cells)
    cell, attempt = rejected[0]
    row = results.cell_row(cell, sweep="t", attempt=attempt, status="rejected", error="host")
    results.write_attempt(out, row, {})
    # the same budget: still rejected, not written again
    plan = Driver(small, DriverOptions(out=out)).plan()
    todo, rejected = plan.todo, plan.rejected
    assert cell.cell_id not in {c.cell_id for c, _ in todo + rejected}
    # a budget that fits: planned to run, as the next attempt
    roomy = _load(tmp_path, text)
    todo = Driver(roomy, DriverOptions(out=out)).plan().todo
    assert (cell, attempt + 1) in todo


def test_max_concurrent_must_be_positive(tmp_path: Path) -> None:
    from commprof.sweeps.driver import DriverOptions

    with pytest.raises(ValueError, match="--max-concurrent must be >= 1"):
        DriverOptions(out=tmp_path, max_concurrent=0)
