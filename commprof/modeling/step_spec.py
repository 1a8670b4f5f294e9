"""The step model's declared spec: every correction and rule between the idle ring model and a
prediction, in one frozen table (docs/design.md, "The step model's spec", a section each).

Each :class:`SpecEntry` names its formula, what it is fitted from, where it applies, how it is
switched off and, for a fitted model, its value (:func:`spec_doc`); ``commprof estimate --fit
DIR`` prints the table beside every prediction. The entries are what the code applies, not a
description beside it: the corrections are :data:`step_advice.CORRECTION_NAMES` (checked by
``tests/test_step_spec.py``), the constants are read from the modules that use them, and the
removed entries are named so that no one adds them back without an ablation
(docs/design.md says which removed them and why). This module imports no torch and no ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from commprof.modeling import cap_advice, step_advice, step_model, step_sim
from commprof.modeling.cap_advice import TIE_TOLERANCE
from commprof.modeling.step_advice import Applied, Corrections, StepModel
from commprof.modeling.step_model import HOOK_QUANTILE, INTERFERENCE_STATISTIC

Kind = Literal["correction", "fitted", "rule", "removed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpecEntry:
    """One correction or rule of the step model."""

    name: str
    """Its name (a correction's is the one ``--without`` takes)."""
    kind: Kind
    """``correction``: fitted, applied, switched off on its own; ``fitted``: a part of the
    calibration, always on; ``rule``: a constant of the advice or the fit; ``removed``: once a
    correction, gone after an ablation."""
    formula: str
    """What it adds or decides, as a formula."""
    fitted_from: str
    """Where its value comes from."""
    applies_to: str
    """The predictions it applies to."""
    switch: str
    """How it is switched off."""
    section: str
    """Its heading in docs/design.md."""
    code: tuple[Callable[..., Any], ...] = ()
    """The functions that fit it, then those that apply it (none for a removed entry)."""


def _ms(ns: float) -> str:
    return f"{ns / 1e6:+.3f} ms"


SPEC: Final[tuple[SpecEntry, ...]] = (
    SpecEntry(
        name="stall", kind="correction",
        formula="t_k = alpha + beta * n_k + stall, for every all-reduce k",
        fitted_from="the host's microbenchmarks: mean minus median time of a cell's iterations "
        "(all sizes), median over cells",
        applies_to="the calibrated link", switch="--without stall", section="Stall",
        code=(step_advice.link_stall_ns, step_model.predict_step),
    ),
    SpecEntry(
        name="interference", kind="correction",
        formula="an all-reduce of n bytes runs comm_factor(n) times slower while compute runs; "
        "compute compute_factor(n) times slower while it runs",
        fitted_from="the interference arms of every cell of the host, median over cells",
        applies_to="every prediction", switch="--without interference (--no-interference)",
        section="Interference",
        code=(step_model.interference_from_rows, step_sim.simulate_step),
    ),
    SpecEntry(
        name="interference_statistic", kind="rule",
        formula=f"factor = {INTERFERENCE_STATISTIC} loaded time / {INTERFERENCE_STATISTIC} "
        "alone time",
        fitted_from="constant", applies_to="the interference factors", switch="none",
        section="Interference statistic",
        code=(step_model.interference_from_rows,),
    ),
    SpecEntry(
        name="hook_cost", kind="fitted",
        formula=f"L(n) = a + b * n on the training thread a bucket, the {HOOK_QUANTILE:g} "
        "quantile of launch - ready per bucket size",
        fitted_from="the calibration cells' timing-hook records (one size: all per byte)",
        applies_to="every prediction", switch="none: part of the calibrated timeline",
        section="Hook cost",
        code=(step_model.hook_fit, step_sim.simulate_step),
    ),
    SpecEntry(
        name="hook_split", kind="correction",
        formula="where the calibration saw one bucket size n0: L(n) = a_host + (L(n0) - a_host) "
        "/ n0 * n, a_host at most L(n0)",
        fitted_from="the intercept of the hook-cost line over every bucket size of the host's "
        "cells with the calibration's hook, unprofiled",
        applies_to="every prediction", switch="--without hook_split", section="Hook split",
        code=(step_model.host_hook_fixed_ns, step_model.split_hook),
    ),
    SpecEntry(
        name="exposed_residual", kind="correction",
        formula="exposed += measured exposed - model exposed at the calibration cap, in sample "
        "only (the calibration's buckets and world size)",
        fitted_from="the calibration cells", applies_to="the calibrated link",
        switch="--without exposed_residual", section="Exposed residual",
        code=(step_advice.exposed_residual_ns, step_model.with_exposed_residual),
    ),
    SpecEntry(
        name="host_residual", kind="correction",
        formula="step += measured step - model step at the calibration cap, in sample only "
        "(the calibration's buckets and world size)",
        fitted_from="the calibration cells", applies_to="the calibrated link",
        switch="--without host_residual", section="Host residual",
        code=(step_advice.host_residual_ns, step_model.predict_step),
    ),
    SpecEntry(
        name="advice_tolerance", kind="rule",
        formula=f"caps with step <= (1 + {TIE_TOLERANCE:g}) * the shortest are tied; of them "
        "the fewest buckets",
        fitted_from="constant", applies_to="the cap advice, with or without a dataset",
        switch="none",
        section="Advice tolerance",
        code=(cap_advice.tied, cap_advice.best_of),
    ),
    SpecEntry(
        name="in_use_rule", kind="rule",
        formula=f"keep the cap in use where its step <= (1 + {TIE_TOLERANCE:g}) * the tied "
        "pick's",
        fitted_from="constant", applies_to="the cap advice, with or without a dataset",
        switch="none",
        section="In-use rule",
        code=(cap_advice.best_of,),
    ),
    SpecEntry(
        name="link_scale", kind="removed",
        formula="(was) the link's times times the factor that replays the calibration's "
        "exposed time",
        fitted_from="-", applies_to="-", switch="removed", section="Link scale (removed)",
    ),
    SpecEntry(
        name="straggler_wait", kind="removed",
        formula="(was) exposed += median exposed of every rank-step - the slowest rank's",
        fitted_from="-", applies_to="-", switch="removed", section="Straggler wait (removed)",
    ),
    SpecEntry(
        name="queue_factor", kind="removed",
        formula="(was) a queued all-reduce's time times the comm_burst arm's factor",
        fitted_from="-", applies_to="-", switch="removed", section="Queue factor (removed)",
    ),
)  # fmt: skip
"""The step model's spec, in the order a prediction applies it."""


def _values(model: StepModel, used: Applied) -> dict[str, Callable[[], str]]:
    cal = model.calibration
    f = model.interference
    return {
        "stall": lambda: f"{_ms(used.stall_ns)} an all-reduce",
        "interference": lambda: (
            f"comm x{min(f.comm_slowdown):.2f} to x{max(f.comm_slowdown):.2f}, compute "
            f"x{min(f.compute_slowdown):.2f} to x{max(f.compute_slowdown):.2f} over "
            f"{len(f.sizes_bytes)} size(s)"
        ),
        "interference_statistic": lambda: INTERFERENCE_STATISTIC,
        "hook_cost": lambda: (
            f"a = {cal.hook_fixed_ns / 1e3:.1f} us, b = {cal.hook_ns_per_byte:.3g} ns/B"
        ),
        "hook_split": lambda: _hook_split(model, used),
        "exposed_residual": lambda: _residual(used.exposed_residual_ns, model.exposed_residual_ns),
        "host_residual": lambda: _residual(used.host_residual_ns, model.host_residual_ns),
        "advice_tolerance": lambda: f"{TIE_TOLERANCE:.0%}",
        "in_use_rule": lambda: f"within {TIE_TOLERANCE:.0%}",
    }


def _residual(used_ns: float, fitted_ns: float) -> str:
    """An in-sample residual's value: as applied, or 0 and the fitted value out of sample."""
    if used_ns or not fitted_ns:
        return _ms(used_ns)
    return f"0 here, out of sample ({_ms(fitted_ns)} at the calibration's buckets and world size)"


def _hook_split(model: StepModel, used: Applied) -> str:
    """The hook split's value: the split line, or why there is none."""
    sizes = len(model.calibration.hook_sizes_bytes)
    fixed = used.hook_fixed_ns / 1e3
    if sizes != 1:
        return f"a_host = {fixed:.1f} us, not used: the calibration saw {sizes} sizes"
    if used.hook_fixed_ns <= 0:
        return "not used: the host's cells saw one bucket size (no fixed part to take)"
    split = step_model.split_hook(model.calibration, used.hook_fixed_ns)
    return f"a = {split.hook_fixed_ns / 1e3:.1f} us, b = {split.hook_ns_per_byte:.3g} ns/B"


def spec_doc(
    model: StepModel, used: Applied, corrections: Corrections, *, calibrated_link: bool = True
) -> list[dict[str, Any]]:
    """The spec of a fitted model: per entry its kind, whether it is on, its value (None where
    off or removed) and its declaration.

    Args:
        model: The fitted model (``step_advice.load_step_model``).
        used: What the prediction applies (``step_advice.applied``).
        corrections: Which corrections are switched on.
        calibrated_link: The prediction is on the calibrated link; on another (a published
            interconnect, a cluster) the entries that apply to "the calibrated link" are off.
    """
    values = _values(model, used)
    out = []
    for e in SPEC:
        on = getattr(corrections, e.name) if e.kind == "correction" else e.kind != "removed"
        on = on and (calibrated_link or e.applies_to != "the calibrated link")
        out.append({
            "name": e.name, "kind": e.kind, "on": bool(on),
            "value": values[e.name]() if e.name in values and on else None,
            "formula": e.formula, "fitted_from": e.fitted_from, "applies_to": e.applies_to,
            "switch": e.switch, "code": [f"{f.__module__}.{f.__qualname__}" for f in e.code],
        })  # fmt: skip
    return out


def spec_text(doc: list[dict[str, Any]]) -> str:
    """The spec as lines: ``spec <name> (<kind>, on|off): <value>; <formula>``."""
    lines = []
    for e in doc:
        if e["kind"] == "removed":
            continue
        state = "on" if e["on"] else "off"
        value = f"{e['value']}; " if e["value"] is not None else ""
        lines.append(f"spec {e['name']} ({e['kind']}, {state}): {value}{e['formula']}")
    removed = [e["name"] for e in doc if e["kind"] == "removed"]
    lines.append(f"spec removed after ablations: {', '.join(removed)} (docs/design.md)")
    return "\n".join(lines)
