"""One request, one result: every mode of ``commprof estimate`` answers one versioned JSON schema
(docs/prediction.md), its flags come from the request's fields, and one check refuses what does
not go together."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from commprof.cli import main
from commprof.commands.estimate_request import EstimateRequest, FlagSpec, add_arguments
from commprof.modeling.prediction import (
    ENVELOPE,
    PREDICTION_SCHEMA,
    SCHEMA_VERSION,
    Assumption,
    Interval,
    Prediction,
    render_text,
)
from commprof.modeling.step.idle import DEFAULT_ALPHA_NS
from tests.test_trace_replay import ddp_trace, write

DATA = Path(__file__).parent / "data" / "results_smoke"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "prediction.md"


def estimate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["estimate", *args, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, PREDICTION_SCHEMA)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert list(doc)[: len(ENVELOPE)] == list(ENVELOPE)
    return doc


def test_every_mode_answers_the_one_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    idle = estimate_json(
        capsys, "--model", "srn-1m", "--world-size", "2", "--interconnect", "nvlink4"
    )
    assert (idle["mode"], idle["world_size"], idle["interval"]) == ("idle", 2, None)
    assert "nvlink4" in idle["link"] and idle["estimate"]["buckets"]
    cluster = estimate_json(
        capsys, "--model", "srn-1m", "--world-size", "16", "--cluster", "dgx-h100"
    )
    spread = cluster["interval"]
    assert spread["quantity"] == "total_comm_ns"
    assert spread["low_ns"] <= cluster["estimate"]["total_comm_ns"] <= spread["high_ns"]
    step = estimate_json(capsys, "--model", "srn-1m", "--world-size", "2", "--fit", str(DATA))
    assert step["mode"] == "step" and step["interval"]["quantity"] == "step_ns"
    pred = step["prediction"]
    assert step["interval"]["low_ns"] == pred["step_ns_low"]
    assert step["interval"]["high_ns"] == pred["step_ns_high"]
    trace = estimate_json(capsys, "--trace", str(write(tmp_path, ddp_trace())))
    assert (trace["mode"], trace["link"], trace["world_size"]) == ("trace", None, 2)
    what_if = estimate_json(capsys, "--trace", str(tmp_path / "trace"), "--interconnect", "nvlink3")
    assert "nvlink3" in what_if["link"] and what_if["what_if"]["world_size"] == 2
    for doc in (idle, cluster, step, trace, what_if):
        names = [a["name"] for a in doc["assumptions"]]
        assert names and len(names) == len(set(names)), doc["mode"]  # each said once


def test_the_schema_refuses_what_is_not_a_prediction() -> None:
    good = Prediction(
        mode="idle", link="l", world_size=2, interval=None,
        body={"estimate": {}, "in_sample": None}, lines=(),
        assumptions=(Assumption(name="link", value="l", source="--interconnect l"),),
    ).to_dict()  # fmt: skip
    jsonschema.validate(good, PREDICTION_SCHEMA)
    for broken in (
        {**good, "schema_version": SCHEMA_VERSION + 1},
        {**good, "mode": "guess"},
        {k: v for k, v in good.items() if k != "estimate"},  # the idle body's key
        {**good, "assumptions": {"link": {"value": "l", "source": "s"}}},  # the old dict
        {**good, "assumptions": [{"name": "link", "value": "l"}]},  # no source
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, PREDICTION_SCHEMA)
    with pytest.raises(ValueError, match="envelope"):
        Prediction(
            mode="idle", link=None, world_size=None, interval=None, assumptions=(),
            body={"mode": "step"}, lines=(),
        )  # fmt: skip


def test_one_renderer_says_the_report_its_interval_and_what_it_assumed() -> None:
    pred = Prediction(
        mode="step", link="l", world_size=4,
        interval=Interval(quantity="step_ns", low_ns=1e6, high_ns=3e6, basis="b", title="range"),
        assumptions=(
            Assumption(name="latency", value=12_000, source="--alpha-us", unit="ns"),
            Assumption(name="compute", value=None, source="measured"),
        ),
        body={}, lines=("TABLE",), notes=("NOTE",),
    )  # fmt: skip
    assert render_text(pred).splitlines() == [
        "TABLE",
        "range 1.000 to 3.000 ms (b)",
        "assumed latency: 12.0 us (--alpha-us)",
        "assumed compute: (measured)",
        "NOTE",
    ]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_the_flags_are_the_requests_fields() -> None:
    declared = {
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(EstimateRequest)
        if isinstance(f.metadata.get("flag"), FlagSpec)
    }
    flags = {o for a in parser()._actions for o in a.option_strings if o.startswith("--")}
    assert flags - {"--help"} == declared
    assert "--bucket-cap-mb-given" not in flags  # set with --bucket-cap-mb, no flag of its own
    args = parser().parse_args(
        ["--params-file", "p.yaml", "--world-size", "8", "--cluster", "c", "--nccl-tests", "a",
         "b", "--bucket-cap-mb", "default"]
    )  # fmt: skip
    request = EstimateRequest.from_namespace(args)
    assert (request.params_file, request.world_size, request.nccl_tests) == (
        "p.yaml",
        8,
        ("a", "b"),
    )
    assert request.bucket_cap_mb is None and request.bucket_cap_mb_given
    assert request.mode == "idle" and request.alpha_ns == DEFAULT_ALPHA_NS
    default = EstimateRequest.from_namespace(parser().parse_args(["--model", "m"]))
    assert default == EstimateRequest(model="m")  # the parser's defaults are the fields'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "t", "--same-host"], r"^--same-host do\(es\) not apply with --trace"),
        (["--trace", "t", "--fit", "f", "--cell", "c"], "^--fit, --cell do"),
        (["--model", "m", "--interconnect", "x"], "--world-size N is required"),
        (["--model", "m", "--world-size", "2"], "give --interconnect NAME, --cluster"),
        (["--model", "m", "--world-size", "2", "--nccl-tests", "l"], "give --cluster"),
        (
            ["--model", "m", "--world-size", "2", "--cluster", "c", "--alpha-us", "3"],
            r"--cluster c: --alpha-us do\(es\) not apply to a cluster",
        ),
        (
            ["--model", "m", "--world-size", "2", "--interconnect", "x", "--timeline", "d"],
            "--timeline RESULTS and --cell ID go together",
        ),
        (
            ["--params-file", "p", "--world-size", "2", "--fit", str(DATA)],
            "--fit DIR with --params-file needs --cell ID",
        ),
    ],
)
def test_validate_is_the_one_check(argv: list[str], message: str) -> None:
    request = EstimateRequest.from_namespace(parser().parse_args(argv))
    with pytest.raises(ValueError, match=message):
        request.validate()


def test_the_documented_schema_is_the_codes() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert f"schema_version` is {SCHEMA_VERSION}" in text
    for key in ENVELOPE:
        assert f"`{key}`" in text, key
