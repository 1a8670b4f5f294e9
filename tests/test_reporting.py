"""Tests of reporting/: style rules, macros, figures, and both PDFs built from the dataset."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from commprof.analysis.dataset import Processed, load_processed
from commprof.reporting import build, figures, report_tables, viz
from commprof.results import load

DATA = Path(__file__).parent / "data" / "results_smoke"
TEMPLATES = Path(build.__file__).parent / "templates"
HAVE_LATEX = shutil.which("latexmk") is not None and shutil.which("pdftotext") is not None


@pytest.fixture(scope="module")
def processed() -> Processed:
    return load_processed(DATA)


def test_measured_and_modelled_styles_differ_in_every_cue() -> None:
    for i in range(12):
        m = viz.measured(i)
        assert m.color != viz.MODELLED.color  # vermillion is reserved for the model
        assert m.linestyle != viz.MODELLED.linestyle
        assert m.marker != viz.MODELLED.marker
        assert m.filled and not viz.MODELLED.filled
    assert set(viz.SERIES_COLORS) <= set(viz.OKABE_ITO.values())


def test_axis_label_requires_a_unit() -> None:
    assert viz.axis_label("Step time", "ms") == "Step time (ms)"
    assert viz.axis_label("Overlap efficiency", "1") == "Overlap efficiency (ratio)"
    with pytest.raises(ValueError, match="needs a unit"):
        viz.axis_label("Step time", "")


def test_macros_reject_bad_names_and_duplicates(tmp_path: Path) -> None:
    m = report_tables.Macros()
    m.add("NumCells", "12")
    with pytest.raises(ValueError, match="letters only"):
        m.add("P2Alpha", "1")
    with pytest.raises(ValueError, match="twice"):
        m.add("NumCells", "13")
    m.write(tmp_path / "m.tex", tmp_path / "m.json")
    assert "\\newcommand{\\NumCells}{12}" in (tmp_path / "m.tex").read_text()
    assert json.loads((tmp_path / "m.json").read_text()) == {"NumCells": "12"}


def test_escape_and_number_format() -> None:
    assert report_tables.escape("a_b 50% {x}") == r"a\_b 50\% \{x\}"
    assert report_tables.fmt(1234.5678, 2) == "1,234.57"
    assert report_tables.fmt(float("nan")) == report_tables.MISSING
    assert report_tables.number_word(4) == "Four"
    assert report_tables.number_word(32) == "ThreeTwo"


def test_tables_are_booktabs(processed: Processed, tmp_path: Path) -> None:
    paths = report_tables.write_latex_tables(processed, tmp_path)
    assert {p.name for p in paths} == {f"tab_{n}.tex" for n in report_tables.TABLES}
    for path in paths:
        text = path.read_text(encoding="ascii")
        if "tabular" in text:
            assert "\\toprule" in text and "\\bottomrule" in text and "\\hline" not in text


def test_every_template_macro_is_generated(processed: Processed) -> None:
    notes = {name: "" for name in figures.FIGURES}
    macros = report_tables.build_macros(processed, figure_notes=notes, dataset_name="x")
    defined = set(macros.as_dict())
    for template in TEMPLATES.glob("*.tex"):
        used = set(re.findall(r"\\([A-Z][A-Za-z]+)", template.read_text()))
        latex_builtins = {"Large"}  # capitalised LaTeX commands the templates may use
        assert used - defined - latex_builtins == set(), template.name


def test_figures_without_latex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no latexmk, no pdflatex
    assert build.report_main(DATA, tmp_path) == 0
    err = capsys.readouterr().err
    assert "LaTeX not found" in err and "apt-get install" in err
    for name in figures.FIGURES:
        path = tmp_path / "figures" / f"{name}.pdf"
        assert path.is_file() and path.stat().st_size > 0, name
    for stem in build.REPORTS:
        assert (tmp_path / f"{stem}.tex").is_file()
    assert (tmp_path / "generated" / "macros.tex").stat().st_size > 0
    assert not (tmp_path / "main.pdf").exists()


def test_missing_dataset_is_exit_2(tmp_path: Path) -> None:
    assert build.figures_main(tmp_path / "nope", None) == 2


@pytest.mark.parametrize("what", ["figures", "report"])
@pytest.mark.parametrize("folder", ["parent", "empty", "no_cells"])
def test_folder_without_cells_is_exit_2(
    what: str, folder: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # parent: results/ instead of results/<sweep>/; no_cells: tables but no committed cell.
    if folder == "parent":
        root = tmp_path / "results"
        shutil.copytree(DATA, root / "smoke")
    elif folder == "empty":
        root = tmp_path
    else:
        root = tmp_path / "ds"
        shutil.copytree(DATA, root)
        shutil.rmtree(root / "cells")
    out = tmp_path / "out"
    assert build.main([what, str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"no dataset in {root} (no committed cells); pass a dataset folder such as " in err
    assert "results/<sweep>/" in err
    assert not out.exists()  # no placeholder figures


def _pdf_text(path: Path) -> str:
    out = subprocess.run(
        ["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True
    )
    return re.sub(r"\s+", " ", out.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert build.report_main(DATA, out) == 0
    return out


@pytest.mark.skipif(not HAVE_LATEX, reason="latexmk/pdftotext not installed (CI installs them)")
def test_pdfs_quote_the_dataset(built: Path) -> None:
    main, post = _pdf_text(built / "main.pdf"), _pdf_text(built / "postmortem.pdf")
    tables = load(DATA)
    cells = tables["cells"]
    latest = cells.sort_values("attempt").groupby("cell_id").tail(1)
    counts = latest["status"].value_counts()
    # counts, recomputed from the raw dataset, as the abstract words them
    assert f"holds {cells['cell_id'].nunique()} cells" in main
    assert f"({counts['ok']} ok, {counts['failed']} failed, {counts['rejected']} rejected" in main
    # the fastest configuration's median step (repeats pooled), from the raw steps table
    ok = latest[latest["status"] == "ok"]
    steps = tables["steps"].merge(ok[["cell_id", "attempt", "config_json"]])
    steps = steps[steps["measured"]]
    config = steps["config_json"].map(
        lambda s: json.dumps({k: v for k, v in json.loads(s).items() if k != "repeat"})
    )
    fastest_ms = steps.groupby(config)["step_ns"].median().min() / 1e6
    assert f"from {fastest_ms:,.2f} ms" in main
    # every numeric macro the prose uses is printed as generated
    macros = json.loads((built / "macros.json").read_text())
    for template, text in (("main.tex", main), ("postmortem.tex", post)):
        used = set(re.findall(r"\\([A-Z][A-Za-z]+)", (built / template).read_text()))
        for name in sorted(used & set(macros)):
            value = macros[name]
            if re.fullmatch(r"-?[\d,]+(\.\d+)?", value):
                assert value in text, (template, name, value)
    # the rejected cell's arithmetic is in the postmortem
    guard = json.loads(latest[latest["status"] == "rejected"].iloc[0]["guard_json"])
    over = next(p for p in guard["pools"] if not p["ok"])
    assert f"{over['need_bytes']:,} B" in post.replace(" ,", ",")


@pytest.mark.skipif(not HAVE_LATEX, reason="latexmk/pdftotext not installed (CI installs them)")
def test_pdfs_and_figures_exist_without_overfull_boxes(built: Path) -> None:
    for stem in build.REPORTS:
        pdf = built / f"{stem}.pdf"
        assert pdf.is_file() and pdf.stat().st_size > 0
        assert "Overfull \\hbox" not in (built / f"{stem}.log").read_text(errors="replace")
    for name in figures.FIGURES:
        path = built / "figures" / f"{name}.pdf"
        assert path.is_file() and path.stat().st_size > 0, name
    assert (
        pd.read_csv(built / "tables" / "status.csv").shape[0]
        == load(DATA)["cells"]["cell_id"].nunique()
    )
