"""Every claim a report's prose makes about which configurations ran, checked against the tables
the same report prints.

The sections record their claims (``prose.Quotes.claim``; ``claims_<report>.json`` beside the
reports), computed from the frames the tables are printed from. Here the tables are read back
from the HTML page as a reader sees them (cell texts; a dagger marks a profiled row), and every
claim is checked against them: a sentence that names a configuration the table does not list,
counts rows the table does not have, or calls a cap the fastest that the table shows slower,
fails. Used by tests/test_report_shapes.py (six dataset shapes) and tests/test_demo_report.py
(the demo sweep and an attach run).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

DAGGER = "\u2020"
"""How a profiled row's model reads in the page (``$^\\dagger$``)."""


class _Tables(HTMLParser):
    """Table id -> (column names, body rows), cell texts as the page shows them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, tuple[list[str], list[list[str]]]] = {}
        self._id: str | None = None
        self._section = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._head: list[list[str]] = []
        self._body: list[list[str]] = []
        self._caption = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._id = dict(attrs).get("id") or f"table{len(self.tables)}"
            self._head, self._body = [], []
        elif tag in ("thead", "tbody"):
            self._section = tag
        elif tag == "caption":
            self._caption += 1
        elif tag == "tr" and self._id is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption":
            self._caption -= 1
        elif tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            (self._head if self._section == "thead" else self._body).append(self._row)
            self._row = None
        elif tag == "table" and self._id is not None:
            names = self._head[-1] if self._head else []
            self.tables[self._id] = (names, self._body)
            self._id = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._caption:
            self._cell.append(data)


def page_tables(page: Path) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The tables of an HTML report by label suffix (``results``): column names, body rows."""
    return tables_in(page.read_text(encoding="utf-8"))


def tables_in(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """:func:`page_tables` of HTML text."""
    parser = _Tables()
    parser.feed(text)
    return {k.removeprefix("tab-"): v for k, v in parser.tables.items()}


def _number(text: str) -> float:
    match = re.match(r"-?[\d,]*\.?\d+", text.strip())
    if match is None:
        raise AssertionError(f"no number in the cell {text!r}")
    return float(match.group().replace(",", ""))


def _rows(table: tuple[list[str], list[list[str]]]) -> list[dict[str, Any]]:
    """Rows as configurations: model, world size, cap text, profiled, and the named columns."""
    names, body = table
    out = []
    for row in body:
        cells = dict(zip(names, row, strict=False))
        model = cells.get("model", "")
        out.append(
            {
                **cells,
                "model": model.rstrip(DAGGER),
                "profiled": model.endswith(DAGGER),
                "p": int(cells["p"]) if cells.get("p", "").isdigit() else None,
                "cap": cells.get("cap (MiB)", cells.get("cap", "")),
            }
        )
    return out


def cap_text(cap: float | None) -> str:
    """A claim's cap as the table's cap column prints it (``caps.cap_number``)."""
    return "default" if cap is None else f"{cap:g}"


def _config(rows: list[dict[str, Any]], claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        r
        for r in rows
        if r["model"] == claim["model"]
        and r["p"] == claim["world_size"]
        and r["cap"].removesuffix(" MiB") == cap_text(claim["cap"])
        and ("profiled" not in claim or r["profiled"] == claim["profiled"])
    ]


def _check_config(rows: list[dict[str, Any]], claim: dict[str, Any]) -> str:
    return "" if _config(rows, claim) else "no such row"


def _check_count(rows: list[dict[str, Any]], claim: dict[str, Any]) -> str:
    if "profiled" in claim:
        rows = [r for r in rows if r["profiled"] == claim["profiled"]]
    return "" if len(rows) == claim["count"] else f"the table has {len(rows)} such rows"


def _step(row: dict[str, Any]) -> float:
    return _number(row["step (ms) [IQR]"])


def _check_fastest(rows: list[dict[str, Any]], claim: dict[str, Any]) -> str:
    mine = [
        r
        for r in rows
        if r["model"] == claim["model"] and r["p"] == claim["world_size"] and not r["profiled"]
    ]
    chosen = _config(mine, {**claim, "profiled": False})
    if len(mine) < 2 or not chosen:
        return f"{len(mine)} unprofiled rows, the claimed cap among them: {bool(chosen)}"
    fastest = min(_step(r) for r in mine)
    return "" if _step(chosen[0]) == fastest else f"the table's fastest step is {fastest}"


def _check_no_multi(rows: list[dict[str, Any]], claim: dict[str, Any]) -> str:
    seen: dict[tuple[str, int | None], int] = {}
    for r in rows:
        if not r["profiled"]:
            seen[(r["model"], r["p"])] = seen.get((r["model"], r["p"]), 0) + 1
    many = [k for k, n in seen.items() if n > 1]
    return f"unprofiled rows at two caps or more: {many}" if many else ""


def _check_ran(rows: list[dict[str, Any]], claim: dict[str, Any]) -> str:
    models = sorted({r["model"] for r in rows})
    sizes = sorted({r["p"] for r in rows})
    caps = {r["cap"] for r in rows}
    wanted = {cap_text(c) for c in claim["caps"]}
    if models != sorted(claim["models"]) or sizes != sorted(claim["world_sizes"]):
        return f"the table has models {models}, world sizes {sizes}"
    return "" if caps == wanted else f"the table has caps {sorted(caps)}"


def _check_overlap(rows: list[dict[str, Any]], claim: dict[str, Any]) -> str:
    chosen = _config(rows, claim)
    values = [_number(r["overlap"]) for r in rows if r["overlap"] not in ("--", "\u2013")]
    if not chosen:
        return "no such row"
    best = max(values)
    return "" if _number(chosen[0]["overlap"]) == best else f"the table's largest is {best}"


CHECKS: dict[str, Callable[[list[dict[str, Any]], dict[str, Any]], str]] = {
    "config": _check_config,
    "configs_count": _check_count,
    "fastest_cap": _check_fastest,
    "no_multi_cap": _check_no_multi,
    "ran": _check_ran,
    "most_overlap": _check_overlap,
}
"""A check per claim kind (``prose.CLAIM_KINDS``): '' where it holds, else what the table shows."""


def contradictions(report_dir: Path, stem: str) -> tuple[list[str], int]:
    """The claims of one report that its own tables contradict, and how many were checked.

    Args:
        report_dir: the report's output folder (``<stem>.html``, ``claims_<stem>.json``).
        stem: ``main`` or ``postmortem``.

    Returns:
        (one line per contradicted claim, the number of claims).
    """
    claims = json.loads((report_dir / f"claims_{stem}.json").read_text())
    tables = page_tables(report_dir / f"{stem}.html")
    wrong = []
    for claim in claims:
        table = tables.get(claim["table"])
        if table is None:
            wrong.append(f"{claim}: the report prints no table {claim['table']!r}")
            continue
        problem = CHECKS[claim["kind"]](_rows(table), claim)
        if problem:
            wrong.append(f"{claim}: {problem}")
    return wrong, len(claims)
