"""The dataset's query layer (``commprof.query``): each question answered once, ambiguity an
error."""

from __future__ import annotations

import pandas as pd
import pytest

from commprof import query, results
from commprof.modeling.step import timeline
from commprof.modeling.step.calibration import calibrate_step
from commprof.modeling.step.simulator import NO_INTERFERENCE
from tests.test_step_spec import SMOKE


def _cells() -> pd.DataFrame:
    """Four cells, one row an attempt: ab12 failed then completed, ab34 completed, cd56 failed
    twice, ef78 was rejected; rows out of attempt order, as files are concatenated."""
    rows = [
        ("ab1200000000", 2, "ok"),
        ("ab1200000000", 1, "failed"),
        ("ab3400000000", 1, "ok"),
        ("cd5600000000", 2, "failed"),
        ("cd5600000000", 1, "failed"),
        ("ef7800000000", 1, "rejected"),
    ]
    return pd.DataFrame(rows, columns=["cell_id", "attempt", "status"])


def test_latest_attempts_are_one_row_a_cell_whatever_its_status() -> None:
    latest = query.latest_attempts(_cells())
    assert dict(zip(latest["cell_id"], latest["attempt"], strict=True)) == {
        "ab1200000000": 2, "ab3400000000": 1, "cd5600000000": 2, "ef7800000000": 1,
    }  # fmt: skip
    assert set(latest.loc[latest["cell_id"] == "cd5600000000", "status"]) == {"failed"}


def test_ok_attempts_are_the_completed_cells_latest_ok_attempt() -> None:
    cells = _cells()
    ok = query.ok_attempts(cells)
    pairs = sorted(zip(ok["cell_id"], ok["attempt"], strict=True))
    assert pairs == [("ab1200000000", 2), ("ab3400000000", 1)]
    some = query.ok_attempts(cells, ["ab3400000000", "cd5600000000"])
    assert list(some["cell_id"]) == ["ab3400000000"]
    assert list(query.only_ok(cells)["attempt"]) == [2, 1]
    assert list(query.is_ok(cells)) == [True, False, True, False, False, False]


def test_a_cell_by_its_id_or_a_unique_prefix() -> None:
    cells = _cells()
    assert query.resolve_cell(cells, "ab1200000000") == "ab1200000000"
    assert query.resolve_cell(cells, "cd") == "cd5600000000"
    row = query.ok_cell(cells, "ab12")
    assert (row["cell_id"], row["attempt"]) == ("ab1200000000", 2)


def test_an_ambiguous_prefix_is_an_error_naming_every_candidate() -> None:
    cells = _cells()
    with pytest.raises(ValueError, match=r"'ab' is ambiguous.*ab1200000000, ab3400000000.*more"):
        query.resolve_cell(cells, "ab")
    with pytest.raises(ValueError, match=r"'ab' is ambiguous"):
        query.ok_cell(cells, "ab")  # never the last, or the first, of the candidates
    with pytest.raises(ValueError, match=r"'99': no cell id starts with it.*ab1200000000"):
        query.resolve_cell(cells, "99")


def test_a_cell_that_never_completed_is_named_with_its_latest_status() -> None:
    with pytest.raises(ValueError, match=r"cd5600000000 never completed.*attempt, 2, is failed"):
        query.ok_cell(_cells(), "cd56")


def test_cell_steps_are_the_measured_rows_of_the_attempts_asked() -> None:
    steps = pd.DataFrame({
        "cell_id": ["a", "a", "a", "b"], "attempt": [1, 1, 2, 1],
        "measured": [False, True, True, True], "step_ns": [1, 2, 3, 4],
    })  # fmt: skip
    keys = query.keys_of([pd.Series({"cell_id": "a", "attempt": 1})])
    assert list(query.cell_steps({"steps": steps}, keys)["step_ns"]) == [2]
    assert list(query.cell_steps({"steps": steps}, keys, measured_only=False)["step_ns"]) == [1, 2]


def test_the_modelling_layer_asks_the_query_layer() -> None:
    tables = results.load(SMOKE)
    ids = set(query.ok_attempts(tables["cells"])["cell_id"])
    two = "1"  # 19490c77033b, 1c53534b3fb4 and 1d7deb2e3ac2 in the smoke dataset
    assert sum(i.startswith(two) for i in ids) == 3
    for ask in (
        lambda: timeline.bucket_ready_offsets(tables, two),
        lambda: calibrate_step(tables, two, [], NO_INTERFERENCE),
    ):
        with pytest.raises(ValueError, match="is ambiguous"):
            ask()
    assert len(timeline.bucket_ready_offsets(tables, "19")) >= 1  # a unique prefix
