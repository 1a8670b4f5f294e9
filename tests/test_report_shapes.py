"""Both reports built on dataset shapes derived from the committed smoke dataset.

Each shape keeps a subset of the committed cells (and their rows in every other table), so the
reports meet one cell, one world size, two, only failures, guard rejections, repeats, traces and
a recorded load. For each: no placeholder and no sentence twice in the PDF text, every number the
prose quotes (``quoted_<report>.json``) printed and, for the headline ones, equal to the value
recomputed here from the dataset's tables, and a LaTeX log without overfull boxes or undefined
references. The builds are shared by every test (module-scoped fixture).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from commprof.analysis.dataset import Processed, process
from commprof.catalog import parameter_sizes
from commprof.modeling.collective.cluster_link import ClusterLink
from commprof.modeling.collective.clusters import builtin_clusters
from commprof.modeling.step import cap_advice
from commprof.modeling.step import model as step_model
from commprof.reporting import build, predicted, prose, report_tables
from commprof.results import load
from commprof.units import format_bytes
from tests.prereqs import needs
from tests.report_claims import contradictions

DATA = Path(__file__).parent / "data" / "results_smoke"
pytestmark = [needs(tool="latexmk"), needs(tool="pdftotext"), pytest.mark.slow]  # CI installs them

ONE_CELL = "d0edd4383678"  # srn-100k, p=2, cap 0.25 MiB: ok on its only attempt
LOAD_CPUS = 2  # the host the smoke dataset ran on reported 2 CPUs (env_json)
WHAT_IF = {"dgx-h100": 16, "a100-ethernet": 16}  # the clusters the what-if names, their GPUs
CLUSTERS = builtin_clusters()

GLOO_ERROR = (
    "2 rank(s) failed; ranks [0]: RuntimeError: [pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:43732. GLHF! \U0001f3d6\ufe0f; ranks [1]: \x1b[33m(raylet)\x1b[0m caf\u00e9 died"
)
"""An error text as a CI run recorded it (gloo's emoji, Ray's colours) and an accented word."""

SHAPES: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    "full": lambda c: pd.Series(True, index=c.index),
    "one_cell": lambda c: c["cell_id"] == ONE_CELL,
    "one_world_size": lambda c: (
        (c["world_size"] == 2) & (c["status"] == "ok") & (c["repeat"] == 0) & ~c["profile"]
    ),
    "two_world_sizes": lambda c: (c["status"] == "ok") & (c["repeat"] == 0) & ~c["profile"],
    "all_failed": lambda c: c["status"] != "ok",
    "repeats_traces_load": lambda c: (
        (c["model"] == "srn-1m") & (c["world_size"] == 2) & (c["status"] == "ok")
    ),
}
"""Shape name -> which committed ``cells`` rows (attempts) it keeps."""


def _subset(tables: dict[str, pd.DataFrame], keep: Callable[[pd.DataFrame], pd.Series]) -> dict:
    cells = tables["cells"][keep(tables["cells"])].reset_index(drop=True)
    keys = set(zip(cells["cell_id"], cells["attempt"], strict=True))
    out = {"cells": cells}
    for name, frame in tables.items():
        if name != "cells":
            mask = [k in keys for k in zip(frame["cell_id"], frame["attempt"], strict=True)]
            out[name] = frame[np.asarray(mask, dtype=bool)].reset_index(drop=True)
    return out


def _pdf_text(path: Path) -> str:
    out = subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True, check=True)
    text = out.stdout.replace("-\n", "-").replace("\u2019", "'")
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    raw = load(DATA)
    out: dict[str, dict[str, Any]] = {}
    for shape, keep in SHAPES.items():
        tables = _subset(raw, keep)
        if shape == "repeats_traces_load":  # a load column in closed form: 1.0, 1.5, 2.0, ...
            tables["cells"]["load_avg_1m"] = 1.0 + 0.5 * np.arange(len(tables["cells"]))
        if shape == "all_failed":  # an error text as gloo and Ray print it, emoji and colours
            first_failed = tables["cells"].index[tables["cells"]["status"] == "failed"][0]
            tables["cells"].loc[first_failed, "error"] = GLOO_ERROR
        data = process(tables)
        folder = tmp_path_factory.mktemp(shape)
        logs: dict[str, str] = {}  # LaTeX's logs: built in a private folder, not in ``folder``
        assert build.build_reports(data, folder, shape, logs=logs) == 0, shape
        out[shape] = {
            "dir": folder,
            "logs": logs,
            "data": data,
            "tables": tables,
            "text": {s: _pdf_text(folder / f"{s}.pdf") for s in build.REPORTS},
            "quoted": {
                s: json.loads((folder / f"quoted_{s}.json").read_text()) for s in build.REPORTS
            },
        }
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_no_placeholder_and_no_sentence_twice(built: dict, shape: str) -> None:
    for stem, text in built[shape]["text"].items():
        assert not re.search(r"\bn/a\b|\bnan\b|\binf\b", text, re.IGNORECASE), (shape, stem)
        sentences = [s for s in re.split(r"(?<=[.;])\s+", text) if len(s.split()) >= 6]
        repeated = {s for s in sentences if sentences.count(s) > 1}
        assert not repeated, (shape, stem, repeated)


@pytest.mark.parametrize("shape", SHAPES)
def test_latex_log_is_clean(built: dict, shape: str) -> None:
    for stem in build.REPORTS:
        log = built[shape]["logs"][stem]
        assert "Output written on " + stem + ".pdf" in log, (shape, stem)  # the whole log
        assert not (built[shape]["dir"] / f"{stem}.log").exists(), (shape, stem)
        assert "Overfull \\hbox" not in log and "Overfull \\vbox" not in log, (shape, stem)
        assert "undefined" not in log.lower(), (shape, stem)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_quoted_number_is_printed(built: dict, shape: str) -> None:
    for stem, quoted in built[shape]["quoted"].items():
        text = built[shape]["text"][stem]
        for name, quote in quoted.items():
            assert quote["text"] in text, (shape, stem, name, quote)


def _quote(built: dict, shape: str, stem: str, name: str) -> str:
    return built[shape]["quoted"][stem][name]["text"]


@pytest.mark.parametrize("shape", SHAPES)
def test_headline_numbers_equal_the_dataset(built: dict, shape: str) -> None:
    tables, data = built[shape]["tables"], built[shape]["data"]
    latest = tables["cells"].sort_values("attempt").groupby("cell_id").tail(1)
    counts = latest["status"].value_counts()
    for stem in build.REPORTS:
        assert _quote(built, shape, stem, "num_cells") == str(latest["cell_id"].nunique())
    for status, n in counts.items():  # the postmortem counts every status (main: "all ok")
        assert _quote(built, shape, "postmortem", f"num_cells_{status}") == f"{n:,}"
        assert (
            built[shape]["quoted"]["main"].get(f"num_cells_{status}", {"text": f"{n:,}"})["text"]
            == f"{n:,}"
        )
    main = built[shape]["quoted"]["main"]
    if data.merged.empty:
        assert "No cell completed" in built[shape]["text"]["main"]
        return
    # the largest exposed share: per configuration run without the profiler (where there is
    # one), the median over its rank-steps
    plain = data.summary[~data.summary["profile"].astype(bool)]
    cells = plain if len(plain) else data.summary
    steps = data.breakdown.merge(cells[["cell_id", "attempt", "config_key"]])
    share = 100.0 * steps.groupby("config_key")["comm_overhead_fraction"].median()
    worst = [v for k, v in main.items() if k.startswith("exposed_share[")]
    assert f"{share.max():,.1f}" == max(worst, key=lambda v: v["value"])["text"]
    # the cap gain per (model, p): median step per cap from the raw steps table
    ok = latest[(latest["status"] == "ok") & ~latest["profile"]]
    raw_steps = tables["steps"][tables["steps"]["measured"]].merge(ok)
    med = raw_steps.groupby(["model", "world_size", "bucket_cap_mb"])["step_ns"].median()
    for (model, ws), part in med.groupby(level=[0, 1]):
        name = f"cap_gain[{model},p={ws}]"
        if len(part) < 2:
            assert name not in main
        else:
            assert main[name]["text"] == f"{100 * (1 - part.min() / part.max()):,.1f}"
    # the model's per-cell error, from the per-cell sums of the bucket table
    sums = data.buckets.groupby("cell_id")[["transfer_ns", "modelled_ns"]].sum()
    err = 100 * (sums["modelled_ns"] - sums["transfer_ns"]) / sums["transfer_ns"]
    assert main["cell_abs_err_median_pct"]["text"] == f"{err.abs().median():,.1f}"


@pytest.mark.parametrize("shape", SHAPES)
def test_every_claim_holds_against_the_printed_tables(built: dict, shape: str) -> None:
    # which models, caps and world sizes ran, which cap was fastest, how many configurations:
    # each sentence's claim is checked against the table of the same report as it reads
    for stem in build.REPORTS:
        wrong, _ = contradictions(built[shape]["dir"], stem)
        assert not wrong, (shape, stem, wrong)
    claims = json.loads((built[shape]["dir"] / "claims_main.json").read_text())
    if not built[shape]["data"].merged.empty:
        assert {c["kind"] for c in claims} >= {"config", "ran"}, shape


def _html_text(path: Path) -> str:
    page = path.read_text(encoding="utf-8")
    page = re.sub(r"<(script|style)>.*?</\1>", " ", page, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", page)).replace("\u00a0", " ")
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_html_report_has_the_pdfs_sections_and_numbers(built: dict, shape: str) -> None:
    folder = built[shape]["dir"]
    for stem in build.REPORTS:
        text = _html_text(folder / f"{stem}.html")
        pdf = built[shape]["text"][stem]
        body = (folder / "latex" / "generated" / f"{stem}_body.tex").read_text()
        titles = re.findall(r"\\section\{([^}]*)\}", body)
        for n, title in enumerate(titles, start=1):
            plain = title.replace("\\", "")
            assert f"{n} {plain}" in text and plain in pdf, (shape, stem, title)
        for name, quote in built[shape]["quoted"][stem].items():
            assert quote["text"] in text, (shape, stem, name)
        # as many tables and figures in the page as floats in the PDF
        floats = len(re.findall(r"\\caption\{", body))
        page = (folder / f"{stem}.html").read_text(encoding="utf-8")
        shown = len(re.findall(r"<caption>|<figcaption>", page))
        assert shown == floats, (shape, stem, shown, floats)


def test_one_world_size_has_no_scaling_and_one_fit_sentence(built: dict) -> None:
    text = built["one_world_size"]["text"]["main"]
    assert not (built["one_world_size"]["dir"] / "figures" / "scaling.pdf").exists()
    assert "grow with the world size" not in text
    assert text.count("the fit gives") == 1
    assert built["two_world_sizes"]["text"]["main"].count("the fit gives") == 2
    assert (built["two_world_sizes"]["dir"] / "figures" / "scaling.png").exists()


@pytest.mark.parametrize("shape", ["one_cell", "one_world_size", "two_world_sizes"])
def test_no_rejection_no_repeat_no_trace_sections(built: dict, shape: str) -> None:
    main, post = built[shape]["text"]["main"], built[shape]["text"]["postmortem"]
    assert "The memory guard rejected no cell of this dataset." in main
    assert not (built[shape]["dir"] / "figures" / "memory_guard.pdf").exists()
    body = (built[shape]["dir"] / "latex" / "generated" / "main_body.tex").read_text()
    assert "fig:memory_guard" not in body
    assert "Repeatability" not in post and "pooled; how far" not in main
    assert "Hook against trace" not in post
    recorded = built[shape]["tables"]["cells"]["load_avg_1m"].notna().any()
    assert ("The dataset does not record the host's load average." in post) is not recorded


def test_rejections_are_shown_with_their_arithmetic(built: dict) -> None:
    for shape in ("full", "all_failed"):
        post = built[shape]["text"]["postmortem"].replace(" ,", ",")
        cells = built[shape]["tables"]["cells"]
        rejected = cells[cells["status"] == "rejected"].iloc[0]
        over = next(p for p in json.loads(rejected["guard_json"])["pools"] if not p["ok"])
        assert f"{over['need_bytes']:,} B" in post  # the arithmetic as it was recorded
        # the status table's reason in binary units, as every byte count a person reads
        need, budget = format_bytes(over["need_bytes"]), format_bytes(over["budget_bytes"])
        assert f"{over['pool']} needs {need} > budget {budget}" in post


def test_an_error_text_with_any_character_prints_as_ascii(built: dict) -> None:
    post = built["all_failed"]["text"]["postmortem"]
    assert "GLHF! ?; ranks [1]: (raylet) cafe died" in post
    body = (built["all_failed"]["dir"] / "latex" / "generated" / "postmortem_body.tex").read_bytes()
    assert body.isascii() and b"\x1b" not in body


def test_repeats_traces_and_load_are_quoted_from_the_data(built: dict) -> None:
    shape = built["repeats_traces_load"]
    post, quoted = shape["text"]["postmortem"], shape["quoted"]["postmortem"]
    assert "Repeatability" in post and "Hook against trace" in post
    load_avg = shape["tables"]["cells"]["load_avg_1m"]
    assert quoted["load_median"]["text"] == f"{load_avg.median():,.2f}"
    assert quoted["load_max"]["text"] == f"{load_avg.max():,.2f}"
    assert quoted["num_load_over"]["text"] == str(int((load_avg > LOAD_CPUS).sum()))
    # hook and trace overlap of the same rank-steps, from the raw trace_metrics table
    data: Processed = shape["data"]
    trace = shape["tables"]["trace_metrics"]
    keys = ["cell_id", "attempt", "rank", "step"]
    both = data.breakdown.merge(trace, on=keys, suffixes=("", "_trace"))
    both = both.dropna(subset=["overlap_efficiency", "overlap_efficiency_trace"])
    assert quoted["num_trace_steps"]["text"] == str(len(both))
    assert quoted["trace_overlap_median"]["text"] == (
        f"{both['overlap_efficiency_trace'].median():.2f}"
    )
    assert quoted["hook_overlap_median"]["text"] == f"{both['overlap_efficiency'].median():.2f}"


def test_attribution_adds_up_to_the_cells_all_reduce_time(built: dict) -> None:
    data: Processed = built["full"]["data"]
    main = built["full"]["quoted"]["main"]
    for name, quote in main.items():
        if name.startswith("attributed_ms["):
            cell_id = name[len("attributed_ms[") : -1]
            total = data.summary.set_index("cell_id").loc[cell_id, "allreduce_sum_measured_ns"]
            assert quote["text"] == f"{total / 1e6:,.2f}"


def _prose(tex: str) -> str:
    """The running text of a generated body: no floats, math, references or section titles."""
    tex = re.sub(r"\\begin\{(table|figure)\}.*?\\end\{\1\}", " ", tex, flags=re.DOTALL)
    tex = re.sub(r"\\begin\{description\}.*?\\end\{description\}", " ", tex, flags=re.DOTALL)
    tex = re.sub(r"\$[^$]*\$", " ", tex)
    tex = re.sub(r"\\(ref|label|section|title|texttt)\{[^}]*\}", " ", tex)
    tex = re.sub(r"\d+\.\d+\.\d+\S*", " ", tex)  # versions (PyTorch 2.13.0+cpu)
    return re.sub(r"[\d.]+~MiB|p=\d+|srn-\w+", " ", tex)  # configuration labels


@pytest.mark.parametrize("shape", SHAPES)
def test_every_measured_number_in_the_prose_is_a_quote(built: dict, shape: str) -> None:
    # a decimal, a count with a thousands comma or a percentage typed into the text without
    # going through Quotes (so without a recomputable record) fails here
    for stem in build.REPORTS:
        tex = (built[shape]["dir"] / "latex" / "generated" / f"{stem}_body.tex").read_text()
        quoted = {q["text"] for q in built[shape]["quoted"][stem].values()}
        numbers = re.findall(r"-?\d[\d,]*\.\d+|-?\d[\d,]*(?=\\%)|\d{1,3}(?:,\d{3})+", _prose(tex))
        assert set(numbers) <= quoted, (shape, stem, set(numbers) - quoted)


def _step_advice_expected(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The step model's quotes recomputed from the raw tables with the public step_advice API:
    per (model, world size) with an ok cell of that size to calibrate on, the cap search over
    the default grid and the caps run (the calibration cap kept on a predicted tie), and the
    out-of-sample error at every cap run other than the calibration cell's."""
    latest = tables["cells"].sort_values("attempt").groupby("cell_id").tail(1)
    ok = latest[(latest["status"] == "ok") & ~latest["profile"]]
    raw_steps = tables["steps"][tables["steps"]["measured"]].merge(ok)
    med = raw_steps.groupby(["model", "world_size", "bucket_cap_mb"])["step_ns"].median()
    expected: dict[str, float] = {}
    errors, inside = [], 0
    exposed: dict[str, float] = {}
    done = latest[latest["status"] == "ok"]
    for model, ws in sorted(set(zip(done["model"], done["world_size"], strict=True))):
        try:
            cell = step_model.select_calibration_cell(tables, model, world_size=int(ws))
        except ValueError:
            continue
        row = tables["cells"][tables["cells"]["cell_id"] == cell].iloc[-1]
        if int(row["world_size"]) != int(ws):
            continue
        cal_cap = float(row["bucket_cap_mb"])  # every committed cell names its cap
        run = med.loc[model, int(ws)] if (model, int(ws)) in med.index.droplevel(2) else None
        caps = sorted({*cap_advice.CAP_GRID_MB, cal_cap, *([] if run is None else run.index)})
        advice = cap_advice.advise_cap(tables, model, int(ws), caps_mb=caps)
        at = {c.bucket_cap_mb: c for c in advice.curve}
        best = at[advice.best_cap_mb]
        cal, key = at[cal_cap], f"[{model},p={ws}]"
        moved = not any(c is cal for c in cap_advice.tied(advice.curve))
        if moved:  # a tie keeps the calibration cap: no gain
            expected[f"step_pred_gain{key}"] = 100 * (1 - best.step_ns / cal.step_ns)
        if moved and cap_advice.verdict_kind(best, cal) == "change":
            # inside both predicted ranges the verdict is "no measurable difference": the
            # predicted gain alone is quoted, neither its range nor the measured gain
            ends = [100 * (1 - best.step_ns_range[i] / cal.step_ns_range[i]) for i in (0, 1)]
            expected[f"step_pred_gain_low{key}"] = min(ends)
            expected[f"step_pred_gain_high{key}"] = max(ends)
            if run is not None and best.bucket_cap_mb in run.index and cal_cap in run.index:
                gain = 1 - run[best.bucket_cap_mb] / run[cal_cap]
                expected[f"step_meas_gain{key}"] = 100 * gain
        sizes = parameter_sizes(model)
        fitted = step_model.load_step_model(tables, model, world_size=int(ws), param_sizes=sizes)
        for name, gpus in WHAT_IF.items():  # the collective model on the description alone
            link = ClusterLink(cluster=CLUSTERS[name])
            # the cap in use is the calibration cap: kept where best_of keeps it
            advice = cap_advice.recommend_cap(
                fitted, sizes, caps_mb=caps, link=link, world_size=gpus, in_use_mb=cal_cap
            )
            worst = advice.best.exposed_ns / 1e6
            exposed[name] = max(exposed.get(name, 0.0), worst)
        for cap, measured in [] if run is None else run.items():
            if cap != cal_cap:
                pred = at[cap]
                errors.append(100 * (pred.step_ns - measured) / measured)
                inside += pred.step_ns_range[0] <= measured <= pred.step_ns_range[1]
    if any(v > 0 for v in exposed.values()):  # all zero: said in words, no number
        expected.update({f"whatif_exposed_max_ms[{k}]": v for k, v in exposed.items()})
    if errors:
        expected["step_oos_num"] = len(errors)
        expected["step_oos_abs_err_median_pct"] = float(np.median(np.abs(errors)))
        expected["step_oos_abs_err_max_pct"] = float(np.max(np.abs(errors)))
        expected["step_oos_in_range"] = inside
        one_sign = all(e < 0 for e in errors) or all(e > 0 for e in errors)
        if not one_sign:  # one sign is said in words, mixed signs quoted
            expected["step_oos_err_median_pct"] = float(np.median(errors))
    return expected


@pytest.mark.parametrize("shape", SHAPES)
def test_step_model_numbers_equal_the_step_advice_api(built: dict, shape: str) -> None:
    main = built[shape]["quoted"]["main"]
    expected = _step_advice_expected(built[shape]["tables"])
    digits = {"step_oos_num": 0, "step_oos_in_range": 0}
    digits |= {n: 2 for n in expected if n.startswith("whatif_")}
    for name, value in expected.items():
        assert main[name]["text"] == f"{value:,.{digits.get(name, 1)}f}", (shape, name)
    quoted = {n for n in main if n.startswith(("step_pred_", "step_meas_", "step_oos_", "whatif_"))}
    assert quoted <= set(expected), (shape, quoted - set(expected))
    text = built[shape]["text"]["main"]
    if "step_oos_num" in expected:  # the Findings bullet and the section quote the same error
        err, n = main["step_oos_abs_err_median_pct"]["text"], main["step_oos_num"]["text"]
        assert f"with a median absolute error of {err}% over {n}" in text
    else:
        assert "The step model predicts the median training step" not in text


def test_step_model_section_only_where_the_data_support_it(built: dict) -> None:
    # no completed cell: no step model, no what-if; one cell (one cap): advice without any claim
    # of accuracy, since no other cap was run to check it on
    body = (built["all_failed"]["dir"] / "latex" / "generated" / "main_body.tex").read_text()
    assert "tab:step_advice" not in body and "tab:what_if" not in body
    one = built["one_cell"]
    body = (one["dir"] / "latex" / "generated" / "main_body.tex").read_text()
    assert "tab:step_advice" in body and "tab:step_oos" not in body
    assert (
        "has no out-of-sample check of it and says nothing of its accuracy" in one["text"]["main"]
    )
    assert not any(n.startswith("step_oos_") for n in one["quoted"]["main"])
    for shape in SHAPES:  # every prediction is called one
        body = (built[shape]["dir"] / "latex" / "generated" / "main_body.tex").read_text()
        for label in ("step_advice", "what_if"):
            if f"tab:{label}" in body:
                caption = re.search(rf"\\caption\{{(.*?)\}}\\label\{{tab:{label}\}}", body, re.S)
                assert caption is not None and "redicted" in caption.group(1), (shape, label)


def test_step_model_with_ddp_default_cap() -> None:
    # the same cells with the 25 MiB cap recorded as unset (DDP's default, a null in the
    # dataset): the calibration cell is at the default, which is never scored out of sample
    tables = load(DATA)
    cells = tables["cells"]
    cells.loc[cells["bucket_cap_mb"] == 25.0, "bucket_cap_mb"] = np.nan
    data = process(tables)
    advice = predicted.cap_advice(data)
    assert len(advice) == 4 and advice["calibration_cap_mb"].isna().all()
    assert not advice.loc[advice["best_cap_mb"].isna(), "moved"].any()
    oos = predicted.out_of_sample(data)
    # 0.25 and 1 MiB per (model, p), and 4 MiB (the hook-cost cells) per model at p = 2
    assert len(oos) == 2 * 4 + 2 and oos["bucket_cap_mb"].notna().all()
    body, _ = build.main_body(data, set(), "default_cap")
    assert "DDP default" in body and not re.search(r"\bnan\b", body, re.IGNORECASE)


def test_a_table_longer_than_a_page_breaks_across_pages(tmp_path: Path) -> None:
    # a sweep of many cells lists them all: past LONG_ROWS rows a table is a longtable, every
    # row printed, its column names repeated on each page, where a float would be cut off
    rows = [(f"cell{i:03d}", report_tables.fmt_int(i)) for i in range(150)]
    fragment = report_tables.booktabs([("cell", "l"), ("value", "r")], rows)
    assert "\\begin{longtable}" in fragment
    short = report_tables.booktabs([("cell", "l"), ("value", "r")], rows[: report_tables.LONG_ROWS])
    assert "\\begin{tabular}" in short and "longtable" not in short
    shutil.copy(Path(build.__file__).parent / "templates" / "postmortem.tex", tmp_path)
    (tmp_path / "generated").mkdir()
    body = prose.table("many", "Every cell.", fragment, here=True) + "\n\nAfter the table.\n"
    (tmp_path / "generated" / "postmortem_body.tex").write_text(body, encoding="ascii")
    ok, log = build.build_pdf(tmp_path / "postmortem.tex")
    assert ok, log[-2000:]
    text = _pdf_text(tmp_path / "postmortem.pdf")
    assert all(f"cell{i:03d}" in text for i in range(150))
    assert text.count("Every cell.") == 1 and text.count("cell value") >= 2
    assert text.index("cell149") < text.index("After the table.")
