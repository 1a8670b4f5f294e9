"""The HTML reports: the LaTeX of the sections rendered (tables, lists, math, references), the
pages written with or without LaTeX and the exit status that says which reports were written,
and the pages of the committed dataset in a real headless Chromium (no console error, every
figure shown, nothing fetched, a table sorted by a click)."""

from __future__ import annotations

import html as html_lib
import os
import re
import sys
from pathlib import Path

import pytest

from commprof.analysis.dataset import process
from commprof.reporting import build, prose, report_tables
from commprof.reporting.latex_html import LaTeXToHTML, Numbers, UnknownLatex
from commprof.results import load
from tests.prereqs import needs
from tests.report_claims import contradictions, tables_in

DATA = Path(__file__).parent / "data" / "results_smoke"
ONE_CELL = "d0edd4383678"  # srn-100k, p=2, cap 0.25 MiB


def _render(latex: str, labels: tuple[str, ...] = ()) -> str:
    numbers = Numbers()
    for label in labels:
        numbers.add(label)
    return LaTeXToHTML(numbers, Path(".")).render(latex)


def test_a_booktabs_table_renders_head_spans_and_rows() -> None:
    columns = [("model", "l"), ("$p$", "r"), ("err. (\\%)", "r")]
    head = "\\multicolumn{2}{c}{fit} & out \\\\\n\\cmidrule(lr){1-2}\\cmidrule(lr){3-3}"
    rows = [["srn-1m$^\\dagger$", "2", "-1.5"], ["a\\_b", "4", "--"]]
    fragment = report_tables.booktabs(columns, rows, head=head)
    page = _render(prose.table("x", "A caption, Table~\\ref{tab:x}.", fragment), ("tab:x",))
    assert '<table class="booktabs" id="tab-x">' in page
    assert "<caption><span" in page and "Table 1:" in page and 'href="#tab-x">1</a>' in page
    assert '<th colspan="2">fit</th>' in page
    names, body = tables_in(page)["x"]
    assert names == ["model", "p", "err. (%)"]
    assert body == [["srn-1m\u2020", "2", "-1.5"], ["a_b", "4", "\u2013"]]
    assert '<td class="num">-1.5</td>' in page  # numbers right-aligned, sortable as numbers


def test_a_long_table_renders_every_row_and_its_names_once() -> None:
    rows = [[f"cell{i:03d}", report_tables.fmt_int(i * 1000)] for i in range(60)]
    fragment = report_tables.booktabs([("cell", "l"), ("value", "r")], rows)
    assert "\\begin{longtable}" in fragment
    page = _render(prose.table("many", "Every cell.", fragment), ("tab:many",))
    names, body = tables_in(page)["many"]
    assert names == ["cell", "value"] and len(body) == 60
    assert body[59] == ["cell059", "59,000"] and page.count("Every cell.") == 1


def test_text_lists_math_and_references() -> None:
    latex = (
        "\\paragraph{Model.} The ring, $T(n,p) = 2(p-1)\\alpha + 2\\frac{p-1}{p} n \\beta$, "
        "at 50\\% of 1~MiB -- see Section~\\ref{sec:a}.\n\n"
        "\\begin{itemize}\n\\item one \\texttt{x\\_y}\n\\item two \\emph{z}\n\\end{itemize}\n\n"
        "\\begin{description}\n\\item[\\texttt{id}] head\\\\\n{\\footnotesize\\raggedright "
        "\\texttt{a} \\\\ \\texttt{b}\\par}\n\\end{description}"
    )
    page = _render(latex, ("sec:a",))
    text = re.sub(r" +", " ", html_lib.unescape(re.sub(r"<[^>]+>", "", page)))
    assert "Model. The ring, T(n,p) = 2(p-1)\u03b1 + 2(p-1)/p n \u03b2, at 50%" in text
    assert "1\u00a0MiB \u2013 see Section\u00a01." in text
    assert "<ul><li><p>one <code>x_y</code></p></li><li><p>two <em>z</em></p></li></ul>" in page
    assert "<dt><code>id</code></dt>" in page and "<code>a</code> <br> <code>b</code>" in page
    for bad in ("\\unknowncommand{x}", "\\begin{verbatim}x\\end{verbatim}", "\\ref{sec:none}"):
        with pytest.raises(UnknownLatex):
            _render(bad)


@pytest.fixture(scope="module")
def one_cell_data() -> object:
    tables = load(DATA)
    keep = tables["cells"]["cell_id"] == ONE_CELL
    out = {"cells": tables["cells"][keep].reset_index(drop=True)}
    for name, frame in tables.items():
        if name != "cells":
            out[name] = frame[frame["cell_id"] == ONE_CELL].reset_index(drop=True)
    return process(out)


@pytest.mark.slow
def test_without_latex_the_html_reports_are_written_and_said(
    one_cell_data: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a PATH with python alone: no latexmk, no pdflatex
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    monkeypatch.setenv("PATH", str(bare))
    assert not build.latex_available()
    assert build.build_reports(one_cell_data, tmp_path / "auto", "one", pdf="auto") == 0  # type: ignore[arg-type]
    out = capsys.readouterr()
    for stem in build.REPORTS:
        assert (tmp_path / "auto" / f"{stem}.html").stat().st_size > 0
        assert not (tmp_path / "auto" / f"{stem}.pdf").exists()
        assert f"report {tmp_path / 'auto' / stem}.html" in out.out
    assert "LaTeX not found: no PDFs (the HTML reports above are complete" in out.err
    # PDFs asked for and not possible: exit 1, the HTML still written
    assert build.build_reports(one_cell_data, tmp_path / "yes", "one", pdf="yes") == 1  # type: ignore[arg-type]
    assert (tmp_path / "yes" / "main.html").is_file()
    assert "LaTeX not found" in capsys.readouterr().err
    assert build.build_reports(one_cell_data, tmp_path / "no", "one", pdf="no") == 0  # type: ignore[arg-type]
    assert "LaTeX not found" not in capsys.readouterr().err
    with pytest.raises(ValueError, match="pdf='maybe'"):
        build.build_reports(one_cell_data, tmp_path / "x", "one", pdf="maybe")  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_pdf_that_fails_to_build_is_exit_1(
    one_cell_data: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # latexmk present but failing (a stand-in that exits 12): the PDF asked for is not written
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("latexmk", "pdflatex"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 12\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert build.build_reports(one_cell_data, tmp_path / "out", "one") == 1  # type: ignore[arg-type]
    assert (tmp_path / "out" / "main.html").is_file()


def test_the_html_pages_carry_everything_they_show(one_cell_data: object, tmp_path: Path) -> None:
    assert build.build_reports(one_cell_data, tmp_path, "one", pdf="no") == 0  # type: ignore[arg-type]
    for stem in build.REPORTS:
        page = (tmp_path / f"{stem}.html").read_text(encoding="utf-8")
        # nothing fetched: no link or source outside the page (the companion report aside)
        assert not re.search(r"""(src|href)=["'](?!data:|#|main\.html|postmortem\.html)""", page)
        assert "<link" not in page and "@import" not in page and "http" not in page
        assert page.count("<img") == len(re.findall(r'<img src="data:image/svg\+xml;base64,', page))
        assert "\\" not in re.sub(r"<(script|style)>.*?</\1>", "", page, flags=re.S)  # no LaTeX
        wrong, checked = contradictions(tmp_path, stem)
        assert not wrong and (checked > 0 or stem == "postmortem"), wrong


def test_claims_that_the_tables_contradict_are_found(one_cell_data: object, tmp_path: Path) -> None:
    # the check can fail: a claim of a cap or a configuration the table does not print
    import json

    assert build.build_reports(one_cell_data, tmp_path, "one", pdf="no") == 0  # type: ignore[arg-type]
    path = tmp_path / "claims_main.json"
    claims = json.loads(path.read_text())
    claims += [
        {"kind": "config", "table": "results", "model": "srn-1m", "world_size": 2, "cap": 0.25},
        {"kind": "configs_count", "table": "results", "count": 3},
        {
            "kind": "ran",
            "table": "results",
            "models": ["srn-100k"],
            "world_sizes": [2],
            "caps": [25.0],
        },
        {"kind": "config", "table": "nosuch", "model": "srn-100k", "world_size": 2, "cap": 0.25},
    ]
    path.write_text(json.dumps(claims))
    wrong, _ = contradictions(tmp_path, "main")
    assert len(wrong) == 4, wrong


@needs(tool="chromium")
@needs(tool="chromedriver")
@pytest.mark.slow
def test_the_pages_in_a_headless_chromium(one_cell_data: object, tmp_path: Path) -> None:
    from tests.browser import check_page, chrome

    full = process(load(DATA))
    assert build.build_reports(full, tmp_path / "full", "full", pdf="no") == 0
    assert build.build_reports(one_cell_data, tmp_path / "one", "one", pdf="no") == 0  # type: ignore[arg-type]
    shots = Path(os.environ.get("COMMPROF_SCREENSHOTS", tmp_path / "shots"))
    driver = chrome()
    try:
        for folder in ("full", "one"):
            for stem in build.REPORTS:
                page = tmp_path / folder / f"{stem}.html"
                seen = check_page(driver, page, shots / f"{folder}-{stem}.png")
                assert seen.console == [], seen.console
                assert seen.resources == []  # nothing fetched
                expected = page.read_text().count("<img")
                assert len(seen.images) == expected
                assert all(im["naturalWidth"] > 0 and im["complete"] for im in seen.images)
                assert seen.sorted_ok
                assert (shots / f"{folder}-{stem}.png").stat().st_size > 10_000
    finally:
        driver.quit()


def test_a_dataset_profiled_throughout_says_so_and_claims_nothing_else(tmp_path: Path) -> None:
    # the bundled demo before this was such a dataset: every cell profiled, so no cap choice
    # (profiled cells are left out of it) while its table shows two caps per model
    tables = load(DATA)
    keep = (tables["cells"]["world_size"] == 2) & (tables["cells"]["status"] == "ok")
    cells = tables["cells"][keep].assign(profile=True).reset_index(drop=True)
    ids = set(cells["cell_id"])
    subset = {"cells": cells}
    for name, frame in tables.items():
        if name != "cells":
            subset[name] = frame[frame["cell_id"].isin(ids)].reset_index(drop=True)
    data = process(subset)
    assert build.build_reports(data, tmp_path, "all_profiled", pdf="no") == 0
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "main.html").read_text()))
    text = re.sub(r"\s+", " ", text)
    assert "run without the profiler" not in text
    assert "configurations (every one run under the profiler)" in text
    no_choice = "No model ran with more than one bucket cap at one world size without the profiler"
    assert no_choice in text
    for stem in build.REPORTS:
        wrong, _ = contradictions(tmp_path, stem)
        assert not wrong, wrong
