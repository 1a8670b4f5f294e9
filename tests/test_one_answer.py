"""One question, one answer: the report's cap verdict and ``commprof estimate --fit DS
--recommend-bucket-cap`` compare against the same baseline, name it, and say the same thing, on
the committed dataset; a recommendation inside the baseline's range is "no measurable
difference" in both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commprof import cli
from commprof.analysis.dataset import load_processed
from commprof.modeling.step import cap_advice
from reporting import predicted, prose, recommend_step

DATA = Path(__file__).resolve().parent / "data" / "results_smoke"


def _estimate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    capsys.readouterr()
    assert (
        cli.main(["estimate", "--fit", str(DATA), "--recommend-bucket-cap", "--json", *argv]) == 0
    )
    recommendation = json.loads(capsys.readouterr().out)["recommendation"]
    assert isinstance(recommendation, dict)
    return recommendation


def test_the_report_and_estimate_give_one_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    advice = predicted.cap_advice(load_processed(DATA))
    assert len(advice) >= 2
    text = " ".join(recommend_step._advice_sentences(advice, prose.Quotes()))
    for r in advice.itertuples():
        got = _estimate(capsys, "--model", r.model, "--world-size", str(r.world_size))
        assert (
            got["baseline"]
            == r.baseline
            == cap_advice.baseline_label(r.calibration_cap_mb, dataset=True)
        )
        assert got["verdict_kind"] == r.verdict_kind
        assert str(got["verdict"]).startswith(f"verdict: {r.verdict_kind}")
        assert f"verdict, {r.verdict_kind}" in text and recommend_step._baseline(r.baseline) in text


def test_overlapping_ranges_are_no_measurable_difference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # against DDP's default layout srn-1m's 4 MiB is predicted 3.5 % shorter, inside both ranges
    got = _estimate(capsys, "--model", "srn-1m", "--world-size", "2", "--bucket-cap-mb", "default")
    assert got["baseline"] == cap_advice.baseline_label(None)
    assert "first 1 MiB" in str(got["baseline"])
    assert got["verdict_kind"] == "no measurable difference"
    assert str(got["verdict"]).startswith("verdict: no measurable difference: keep DDP's default")
