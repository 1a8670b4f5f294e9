"""One ledger row per benchmark run, in the format of benchmarks/README.md's "Ledger".

A benchmark keeps only its latest result (``benchmarks/results/<name>.json``, raw data compressed
beside it) and one row per run in the README's ledger; git history holds the older results. Each
``bench_*.py`` prints its run's row after writing the result, so the row comes with the run: a
Markdown table row of benchmark, run, date, recorded in, change declared before it, headline
figures and raw data.

The run number follows the benchmark's last row. ``recorded in`` and ``raw data`` say ``this
commit``: commit the row (after the benchmark's last one) with the result, and when the next
run's row is added, replace them in the row before with its hash (``git log -1 --format=%h --
<result file>``), so that ``git show <hash>:benchmarks/results/<file>`` retrieves that run's
files once they are overwritten.
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
README = HERE / "README.md"
RESULTS = HERE / "results"
LEDGER_HEADING = "## Ledger"
CHANGE_PLACEHOLDER = "(say what changed: --change)"
"""The change cell when the run was started without ``--change``."""


def add_change_argument(parser: argparse.ArgumentParser) -> None:
    """``--change TEXT``: the change declared before the run, for its ledger row."""
    parser.add_argument(
        "--change", default=None, metavar="TEXT",
        help="the change declared before this run, one short phrase (its ledger row)",
    )  # fmt: skip


def _ledger_rows(readme: Path) -> list[list[str]]:
    """The cells of every row of the ledger's table (none if the README has no ledger)."""
    if not readme.is_file():
        return []
    lines = readme.read_text(encoding="utf-8").splitlines()
    if LEDGER_HEADING not in lines:
        return []
    rows = []
    for line in lines[lines.index(LEDGER_HEADING) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip().strip("`") for cell in line.strip().strip("|").split("|")])
    return rows


def next_run(benchmark: str, readme: Path = README) -> int:
    """One more than the highest run number of ``benchmark`` in the ledger (1 if none)."""
    numbers = [
        int(r[1])
        for r in _ledger_rows(readme)
        if len(r) > 1 and r[0] == benchmark and re.fullmatch(r"\d+", r[1])
    ]
    return max(numbers, default=0) + 1


def _shown(path: Path | str) -> str:
    """A file as the ledger names it: relative to ``benchmarks/results`` (or else to the
    repository) when inside it."""
    resolved = Path(path).resolve()
    for root in (RESULTS, REPO):
        if resolved.is_relative_to(root):
            return resolved.relative_to(root).as_posix()
    return str(resolved)


def row(
    benchmark: str, *, change: str | None, figures: str, files: Sequence[Path | str],
    date: str | None = None, readme: Path = README,
) -> str:  # fmt: skip
    """The ledger row of a run that has just written ``files``.

    Args:
        benchmark: the benchmark's name in the ledger (``trace_parse``, ``step_model``, ...).
        change: the change declared before the run, one short phrase; None or empty gives a
            placeholder to fill in.
        figures: the headline figures, as the README quotes them (ratios where timing is
            involved, the load average last).
        files: the result and raw-data files the run wrote (shown relative to
            ``benchmarks/results``).
        date: the run's UTC date (``YYYY-MM-DD``); today by default.
        readme: the README whose ledger numbers the run.

    Returns:
        One Markdown table row (``|`` inside a cell becomes ``/``).
    """
    if not files:
        raise ValueError(f"{benchmark}: a ledger row needs the files the run wrote (files=)")
    day = date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    paths = ", ".join(f"`{_shown(f)}`" for f in files)
    cells = [
        benchmark, str(next_run(benchmark, readme)), day, "this commit",
        (change or "").strip() or CHANGE_PLACEHOLDER, figures, f"this commit: {paths}",
    ]  # fmt: skip
    return "| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |"


def print_row(
    benchmark: str, *, change: str | None, figures: str, files: Sequence[Path | str],
    date: str | None = None,
) -> None:  # fmt: skip
    """Print the run's ledger row (:func:`row`) and where it goes."""
    line = row(benchmark, change=change, figures=figures, files=files, date=date)
    print(f"\nLedger row (benchmarks/README.md, after the last {benchmark} row):\n{line}")
    if not (change or "").strip():
        print("Fill in the change declared before this run (or pass --change next time).")
