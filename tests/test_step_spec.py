"""The step model's declared spec (``commprof.modeling.step.spec``) is the code's: its
corrections are the ones the model switches, its constants the ones the code uses, each entry
has a section of docs/design.md of at most five lines, and ``estimate --fit`` prints it."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from commprof import results
from commprof.catalog import parameter_sizes
from commprof.cli import main
from commprof.modeling.collective.cost_model import LinkParams
from commprof.modeling.step import calibration, cap_advice
from commprof.modeling.step import corrections as step_corrections
from commprof.modeling.step import model as step_model
from commprof.modeling.step.corrections import CORRECTION_NAMES, IDLE, Corrections, Scope
from commprof.modeling.step.spec import SPEC, SpecEntry, spec_doc

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
SMOKE = Path(__file__).parent / "data" / "results_smoke"
MAX_SECTION_LINES = 5


def sections() -> dict[str, list[str]]:
    """The ``###`` sections under "The step model's spec": heading -> its non-empty lines."""
    text = DESIGN.read_text(encoding="utf-8")
    body = text.split("## The step model's spec\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[str]] = {}
    for block in re.split(r"^### ", body, flags=re.M)[1:]:
        head, *lines = block.splitlines()
        out[head.strip()] = [ln for ln in lines if ln.strip()]
    return out


def test_the_spec_declares_exactly_the_corrections_the_model_switches() -> None:
    declared = [e.name for e in SPEC if e.kind == "correction"]
    assert sorted(declared) == sorted(CORRECTION_NAMES)
    removed = {e.name for e in SPEC if e.kind == "removed"}
    assert removed == {"link_scale", "straggler_wait", "queue_factor"}
    assert not removed & set(CORRECTION_NAMES)
    assert len({e.name for e in SPEC}) == len(SPEC)


def test_every_entry_names_the_code_that_fits_and_applies_it() -> None:
    for e in SPEC:
        if e.kind == "removed":
            assert e.code == (), e.name
            continue
        assert e.code and all(f.__module__.startswith("commprof.modeling.") for f in e.code)
        if e.kind == "correction":
            assert len(e.code) >= 2, e.name  # what fits it, then what applies it
    by = {e.name: e for e in SPEC}
    assert by["stall"].code[0] is step_corrections.link_stall_ns
    assert cap_advice.best_of in by["in_use_rule"].code


def test_every_entry_has_a_short_section_with_its_formula_and_why() -> None:
    found = sections()
    assert set(found) == {e.section for e in SPEC}
    for e in SPEC:
        lines = found[e.section]
        assert 1 <= len(lines) <= MAX_SECTION_LINES, (e.section, len(lines))
        text = " ".join(lines)
        if e.kind == "removed":
            assert text.startswith("Was:") and ("ablation" in text or "constant" in text)
        else:
            assert text.startswith("Formula:") and "Why:" in text, e.section


def test_the_spec_names_the_constants_the_code_uses() -> None:
    by = {e.name: e for e in SPEC}
    assert f"{cap_advice.TIE_TOLERANCE:g}" in by["advice_tolerance"].formula
    assert f"{cap_advice.TIE_TOLERANCE:g}" in by["in_use_rule"].formula
    assert f"{calibration.HOOK_QUANTILE:g} quantile" in by["hook_cost"].formula
    assert calibration.INTERFERENCE_STATISTIC in calibration.FACTOR_STATISTICS
    assert by["interference_statistic"].formula.startswith(
        f"factor = {calibration.INTERFERENCE_STATISTIC} loaded"
    )


@pytest.mark.parametrize("without", [None, "stall"])
def test_estimate_prints_the_spec_with_its_fitted_values(
    capsys: pytest.CaptureFixture[str], without: str | None
) -> None:
    args = ["estimate", "--fit", str(SMOKE), "--model", "srn-1m", "--world-size", "2"]
    args += ["--bucket-cap-mb", "25", "--json"] + (["--without", without] if without else [])
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    spec = {e["name"]: e for e in doc["spec"]}
    assert list(spec) == [e.name for e in SPEC]
    cal = doc["calibration"]
    assert spec["stall"]["on"] is (without != "stall")
    if without == "stall":
        assert spec["stall"]["value"] is None and cal["stall_ns"] == 0
    else:
        assert spec["stall"]["value"] == f"{cal['stall_ns'] / 1e6:+.3f} ms an all-reduce"
    assert spec["host_residual"]["value"] == f"{cal['host_residual_ns'] / 1e6:+.3f} ms"
    assert spec["link_scale"]["on"] is False and spec["link_scale"]["value"] is None
    assert spec["advice_tolerance"]["value"] == "1%"
    assert spec["stall"]["code"][0] == "commprof.modeling.step.corrections.link_stall_ns"


def test_the_text_names_every_entry_and_the_idle_model_is_every_correction_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["estimate", "--fit", str(SMOKE), "--model", "srn-1m", "--world-size", "2"]
    assert main(args) == 0
    text = capsys.readouterr().out
    for e in SPEC:
        if e.kind != "removed":
            assert f"spec {e.name} ({e.kind}, on)" in text
    assert "spec removed after ablations: link_scale, straggler_wait, queue_factor" in text
    assert not any(IDLE.on(n) for n in CORRECTION_NAMES)


def test_on_another_link_the_calibrated_links_corrections_show_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["estimate", "--fit", str(SMOKE), "--model", "srn-1m", "--world-size", "2"]
    assert main([*args, "--cluster", "dgx-a100", "--json"]) == 0
    spec = {e["name"]: e for e in json.loads(capsys.readouterr().out)["spec"]}
    for name in ("stall", "exposed_residual", "host_residual"):  # the calibrated link's
        assert spec[name]["on"] is False and spec[name]["value"] is None
    for name in ("interference", "hook_split"):  # the measured compute timeline's
        assert spec[name]["on"] is True


def test_the_hook_split_and_residual_lines_say_what_applies() -> None:
    tables = results.load(SMOKE)
    sizes = parameter_sizes("srn-1m")
    model = step_model.load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes)

    def value(m: step_model.StepModel, name: str, *, in_sample: bool = True) -> str:
        used = step_corrections.applied(m, link=None, in_sample=in_sample)
        doc = spec_doc(m, used, step_corrections.ALL_CORRECTIONS)
        return next(e["value"] for e in doc if e["name"] == name)

    split = calibration.split_hook(model.calibration, model.hook_fixed_ns)
    assert value(model, "hook_split") == (
        f"a = {split.hook_fixed_ns / 1e3:.1f} us, b = {split.hook_ns_per_byte:.3g} ns/B"
    )
    no_fixed = replace(model, hook_fixed_ns=0.0)
    assert value(no_fixed, "hook_split").startswith("not used: the host's cells saw one")
    two = replace(model, calibration=replace(model.calibration, hook_sizes_bytes=(1, 2)))
    assert value(two, "hook_split").endswith("not used: the calibration saw 2 sizes")
    residual = f"{model.exposed_residual_ns / 1e6:+.3f} ms"
    assert value(model, "exposed_residual") == residual
    assert value(model, "exposed_residual", in_sample=False) == (
        f"0 here, out of sample ({residual} at the calibration's buckets and world size)"
    )
    host = f"{model.host_residual_ns / 1e6:+.3f} ms"
    assert value(model, "host_residual") == host
    assert value(model, "host_residual", in_sample=False) == (
        f"0 here, out of sample ({host} at the calibration's buckets and world size)"
    )


@pytest.fixture(scope="module")
def smoke_model() -> tuple[step_model.StepModel, list[tuple[str, int]]]:
    sizes = parameter_sizes("srn-1m")
    tables = results.load(SMOKE)
    return step_model.load_step_model(tables, "srn-1m", world_size=2, param_sizes=sizes), sizes


@pytest.mark.parametrize("c", step_corrections.CORRECTIONS, ids=lambda c: c.name)
def test_each_correction_is_switched_and_scoped_by_its_object(
    smoke_model: tuple[step_model.StepModel, list[tuple[str, int]]],
    c: step_corrections.Correction,
) -> None:
    model, sizes = smoke_model
    apply = step_corrections.applied
    on = apply(model, link=None, in_sample=True)
    off = apply(model, link=None, corrections=Corrections.without([c.name]), in_sample=True)
    assert getattr(on, c.field) == getattr(model, c.field)  # in its scope: its fitted value
    assert getattr(off, c.field) == c.neutral  # off: neutral, and nothing else moves
    assert replace(off, **{c.field: getattr(on, c.field)}) == on
    # out of sample on another link, only a correction of every prediction stays
    elsewhere = apply(model, link=LinkParams(alpha_ns=0.0, beta_ns_per_byte=1.0), in_sample=False)
    expected = getattr(model, c.field) if c.scope is Scope.EVERY else c.neutral
    assert getattr(elsewhere, c.field) == expected
    # calibrated without it: its value neutral in the model itself
    assert getattr(step_model.recalibrated_without(model, [c.name], sizes), c.field) == c.neutral
    # the command line and the spec take it from the object
    assert f"--without {c.name}" in step_spec_entry(c.name).switch
    assert step_spec_entry(c.name).applies_to == c.scope.value


def step_spec_entry(name: str) -> SpecEntry:
    return next(e for e in SPEC if e.name == name)


def test_the_idle_model_is_the_list_switched_off(
    smoke_model: tuple[step_model.StepModel, list[tuple[str, int]]],
) -> None:
    model, _ = smoke_model
    assert step_corrections.applied(model, link=None, corrections=IDLE) == calibration.Applied()
    with pytest.raises(ValueError, match=r"unknown corrections \['nope'\]"):
        Corrections.without(["nope"])


def test_the_design_table_of_corrections_is_the_list() -> None:
    """docs/design.md, "The step model": a row per correction, its scope and section, in order."""
    text = DESIGN.read_text(encoding="utf-8")
    body = text.split("## The step model\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in body.splitlines() if ln.startswith("| `")]
    table = [tuple(c.strip().strip("`") for c in ln.strip("|").split("|")) for ln in rows]
    assert table == [(c.name, c.scope.value, c.section) for c in step_corrections.CORRECTIONS]
