"""Tests of reporting/: style rules, macros, figures, and both PDFs built from the dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from commprof.analysis.dataset import Processed, load_processed
from commprof.reporting import build, figures, prose, report_tables, viz

DATA = Path(__file__).parent / "data" / "results_smoke"
TEMPLATES = Path(build.__file__).parent / "templates"


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


def test_quotes_reject_non_finite_and_conflicting_values(tmp_path: Path) -> None:
    q = prose.Quotes()
    assert q.num("x", 1234.5678, 2) == "1,234.57"
    assert q.num("x", 1234.5711, 2) == "1,234.57"  # the same number said twice: allowed
    assert q.pct("share", 0.1234) == "12.3"
    assert q.num("zero", -0.0004, 2) == "0.00"  # no "-0.00"
    with pytest.raises(ValueError, match="finite"):
        q.num("y", float("nan"))
    with pytest.raises(ValueError, match="printed as"):
        q.num("x", 1.0)
    q.write(tmp_path / "q.json")
    assert json.loads((tmp_path / "q.json").read_text())["share"]["text"] == "12.3"


def test_escape_and_table_number_format() -> None:
    assert prose.escape("a_b 50% {x}") == r"a\_b 50\% \{x\}"
    outside = "\x1b[33m(raylet)\x1b[0m caf\u00e9 \u2013 3\u00d74 \u2026 \U0001f3d6\ufe0f"
    assert prose.escape(outside) == "(raylet) cafe -- 3x4 ... ?"
    assert report_tables.fmt(1234.5678, 2) == "1,234.57"
    assert report_tables.fmt(float("nan")) == "--"
    assert report_tables.fmt(-0.4, 0) == "0" and report_tables.fmt(-1.4, 0) == "-1"
    assert prose.words(["a", "b", "c"]) == "a, b and c"


def test_log_axis_ticks_are_readable() -> None:
    # 1-2-5 within a decade or two; powers of ten over many; never one labelled tick
    assert viz._decimal_ticks(0.3, 12) == [0.5, 1, 2, 5, 10]
    assert viz._decimal_ticks(1e-5, 3) == [1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1]
    assert len(viz._decimal_ticks(4.1, 7.9)) >= 3  # narrow: every 1-9 multiple
    ticks = viz._binary_ticks(1024, 4 * 2**20)
    assert ticks[0] == 1024 and len(ticks) <= viz.MAX_LOG_TICKS - 2
    assert viz.bytes_label(4 * 2**20) == "4 MiB" and viz.bytes_label(512) == "512 B"


def test_tables_are_booktabs(processed: Processed, tmp_path: Path) -> None:
    paths = report_tables.write_latex_tables(processed, tmp_path)
    assert {p.name for p in paths} == {f"tab_{n}.tex" for n in report_tables.TABLES}
    for path in paths:
        text = path.read_text(encoding="ascii")
        if "tabular" in text:
            assert "\\toprule" in text and "\\bottomrule" in text and "\\hline" not in text


def test_figures_without_latex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no latexmk, no pdflatex
    assert build.report_main(DATA, tmp_path) == 0
    err = capsys.readouterr().err
    assert "LaTeX not found" in err and "apt-get install" in err
    for name in figures.FIGURES:
        for suffix in (".pdf", ".png"):
            path = tmp_path / "figures" / f"{name}{suffix}"
            assert path.is_file() and path.stat().st_size > 0, path
    for stem in build.REPORTS:
        assert (tmp_path / "latex" / f"{stem}.tex").is_file()
        assert (tmp_path / "latex" / "generated" / f"{stem}_body.tex").stat().st_size > 0
    assert not (tmp_path / "main.pdf").exists()
    # the folder holds the reports and what they show; the LaTeX sources sit apart in latex/
    pages = {f"{stem}.html" for stem in build.REPORTS}
    numbers = {f"{kind}_{stem}.json" for kind in ("quoted", "claims") for stem in build.REPORTS}
    top = {p.name for p in tmp_path.iterdir()}
    assert top == pages | numbers | {"figures", "tables", build.LATEX_DIR}, top


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


def test_wall_time_is_said_only_where_recorded() -> None:
    from commprof.analysis.dataset import process
    from commprof.reporting import post_sections
    from commprof.results import load

    tables = load(DATA)
    recorded = post_sections.environment(process(tables), prose.Quotes()).body
    total = float(tables["cells"]["wall_s"].sum())
    assert f"The cells took {report_tables.fmt(total, 1)}~s of wall time." in recorded
    # cells committed without it (a benchmark's own commit path): no "0.0 s"
    tables["cells"]["wall_s"] = float("nan")
    missing = post_sections.environment(process(tables), prose.Quotes()).body
    assert "does not record the cells' wall time" in missing and "of wall time" not in missing


def _relabelled(origin: str) -> dict:
    """The smoke dataset's tables with every row as ``origin`` writes it."""
    from commprof.results import load

    tables = load(DATA)
    cells = tables["cells"]
    if origin == "run":
        cells["sweep"] = "run"
    elif origin == "attach":
        cells["config_json"] = [
            json.dumps({**json.loads(c), "source": "attach"}) for c in cells["config_json"]
        ]
    elif origin == "other":  # rows written without nodes (a benchmark's commit path)
        cells["nodes"], cells["sweep"] = "", "bench"
    return tables


@pytest.mark.parametrize("origin", ["ray", "run", "attach", "other"])
def test_method_names_the_one_origin_of_a_dataset(origin: str) -> None:
    from commprof.analysis.dataset import process
    from commprof.reporting import main_sections

    tables = _relabelled(origin)  # "ray": the smoke dataset as recorded, one Ray sweep
    ok = tables["cells"][tables["cells"]["status"] == "ok"]  # rejected rows record no nodes
    assert {main_sections.cell_origin(row) for _, row in ok.iterrows()} == {origin}
    quotes = prose.Quotes()
    body = main_sections.method(process(tables), quotes).body
    assert main_sections.ORIGINS[origin] in body and "of the completed cells" not in body
    others = set(main_sections.ORIGINS) - {origin, "other"}  # "other" is every phrase's stem
    assert not any(main_sections.ORIGINS[o] in body for o in others)
    assert ("Ray" in body) == (origin == "ray")
    assert not any(name.startswith("cells_") for name in quotes.as_dict())


def test_method_counts_the_origins_of_a_mixed_dataset() -> None:
    from commprof.analysis.dataset import process
    from commprof.reporting import main_sections

    tables = _relabelled("ray")
    cells = tables["cells"]
    ok = cells.index[cells["status"] == "ok"]
    run_ids = set(cells.loc[ok[:2], "cell_id"])  # two cells as `commprof run` writes them
    attached = cells["cell_id"] == cells.loc[ok[2], "cell_id"]  # one as commprof.attach does
    cells.loc[cells["cell_id"].isin(run_ids), "sweep"] = "run"
    configs = cells.loc[attached, "config_json"]
    cells.loc[attached, "config_json"] = [
        json.dumps({**json.loads(c), "source": "attach"}) for c in configs
    ]
    quotes = prose.Quotes()
    mixed = main_sections.method(process(tables), quotes).body
    assert all(main_sections.ORIGINS[o] in mixed for o in ("ray", "run", "attach"))
    said = quotes.as_dict()
    completed = cells[cells["status"] == "ok"]["cell_id"].nunique()
    assert said["cells_run"]["value"] == 2 and said["cells_attach"]["value"] == 1
    assert said["cells_ray"]["value"] == completed - 3


def test_series_colours_differ_in_grey_too() -> None:
    # the colours of up to three series drawn together read apart without hue (CIE L*)
    first = viz.SERIES_COLORS[: viz.GREY_SAFE_SERIES]
    for i, a in enumerate(first):
        for b in first[i + 1 :]:
            assert abs(viz.lightness(a) - viz.lightness(b)) >= viz.MIN_LIGHTNESS_STEP, (a, b)
    assert viz.lightness("#000000") == pytest.approx(0) and viz.lightness("#FFFFFF") == 100
    # the postmortem's hook-against-trace figure draws the first two, dashed apart as well
    assert viz.SERIES_COLORS[:2] == (viz.OKABE_ITO["blue"], viz.OKABE_ITO["orange"])


def test_an_interval_below_zero_is_said_not_printed_negative() -> None:
    assert report_tables.alpha_cell(41_200, 12_000, 70_300) == "41.2 [12.0, 70.3]"
    cell = report_tables.alpha_cell(145_300, -12_200, 302_800)
    assert cell == "145.3 [$<$ 0, 302.8]" and "-" not in cell


def test_modules_read_by_name_and_class() -> None:
    from commprof.analysis.attribution import module_label

    assert module_label("2", "Linear") == "2: Linear"  # an nn.Sequential index, with its class
    assert module_label("blocks.3.fc1", "Linear") == "blocks.3.fc1: Linear"
    assert module_label("", "Sequential") == "(root): Sequential"
    assert module_label("2", "") == "module 2"  # a dataset from before the class was recorded
    assert module_label("head", "") == "head"
