"""The questions every reader of a dataset asks, each answered once.

A dataset (``commprof.results.load``) holds one ``cells`` row per attempt of a cell; a cell that
failed and was retried has several, and a cell that completed is never run again. Modelling,
analysis and the reports ask the same few things of it:

* :func:`latest_attempts`: each cell's latest attempt, whatever its status;
* :func:`ok_attempts`: each completed cell's latest ok attempt (of some cells, or all);
* :func:`only_ok` / :func:`is_ok`: the ok rows of any table with a ``status`` column;
* :func:`resolve_cell` and :func:`ok_cell`: a cell by its id or a unique prefix of it, with one
  rule for ambiguity: a prefix that matches several cells is an error naming them all, never a
  silent pick;
* :func:`cell_steps`: the (measured) ``steps`` rows of given attempts.

This module imports pandas only.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

OK = "ok"
"""The ``status`` of an attempt that completed."""

KEYS = ["cell_id", "attempt"]
"""What names one attempt of one cell in every table."""


def is_ok(frame: pd.DataFrame) -> pd.Series:
    """Per row of ``frame`` (a ``status`` column: the cells table, or one row a cell as
    ``analysis.per_cell.cell_status`` makes), whether it completed."""
    return frame["status"] == OK


def only_ok(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` whose ``status`` is ok (:func:`is_ok`)."""
    return frame[is_ok(frame)]


def latest_attempts(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell of the ``cells`` table: its latest attempt, whatever its status (rows in
    attempt order)."""
    return cells.sort_values("attempt").groupby("cell_id").tail(1)


def ok_attempts(cells: pd.DataFrame, cell_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per completed cell of the ``cells`` table (of ``cell_ids``; all by default): its
    latest ok attempt (rows in attempt order)."""
    ok = only_ok(cells)
    if cell_ids is not None:
        ok = ok[ok["cell_id"].isin(list(cell_ids))]
    return latest_attempts(ok)


def resolve_cell(cells: pd.DataFrame, id_or_prefix: str) -> str:
    """The full id of the one cell whose id is ``id_or_prefix`` or starts with it.

    Raises:
        ValueError: no cell matches (naming a few of the dataset's ids), or several do (naming
            them all: give more of the id).
    """
    ids = pd.Series(cells["cell_id"].astype(str).unique())
    if id_or_prefix in set(ids):
        return id_or_prefix
    found = sorted(ids[ids.str.startswith(id_or_prefix)]) if id_or_prefix else sorted(ids)
    if len(found) == 1:
        return str(found[0])
    if not found:
        some = ", ".join(sorted(ids)[:5]) or "none"
        raise ValueError(
            f"cell {id_or_prefix!r}: no cell id starts with it; the dataset's cells include: {some}"
        )
    raise ValueError(
        f"cell {id_or_prefix!r} is ambiguous: it starts {len(found)} cell ids "
        f"({', '.join(found)}); give more of the id"
    )


def ok_cell(cells: pd.DataFrame, id_or_prefix: str) -> pd.Series:
    """The latest ok attempt (a ``cells`` row) of the cell :func:`resolve_cell` names.

    Raises:
        ValueError: the prefix names no cell or several, or the cell never completed.
    """
    cell_id = resolve_cell(cells, id_or_prefix)
    rows = cells[cells["cell_id"] == cell_id]
    ok = only_ok(rows)
    if ok.empty:
        last = rows.sort_values("attempt").iloc[-1]
        raise ValueError(
            f"cell {cell_id} never completed (its latest attempt, {int(last['attempt'])}, is "
            f"{last['status']}): choose a cell that completed"
        )
    return ok.sort_values("attempt").iloc[-1]


def keys_of(rows: Iterable[pd.Series]) -> pd.DataFrame:
    """The ``cell_id`` and ``attempt`` of ``cells`` rows (:func:`ok_cell`'s), as a frame to merge
    other tables on."""
    rows = list(rows)
    return pd.DataFrame({
        "cell_id": [str(r["cell_id"]) for r in rows], "attempt": [int(r["attempt"]) for r in rows]
    })  # fmt: skip


def cell_steps(
    tables: dict[str, pd.DataFrame], keys: pd.DataFrame, *, measured_only: bool = True
) -> pd.DataFrame:
    """The ``steps`` rows of the attempts in ``keys`` (``cell_id``, ``attempt`` columns; the
    rows of :func:`ok_attempts` do), the measured ones (not warm-up) by default."""
    steps = tables["steps"].merge(keys[KEYS], on=KEYS)
    return steps[steps["measured"].astype(bool)] if measured_only else steps
