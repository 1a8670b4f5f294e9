"""The step model's declared spec: every correction and rule between the idle ring model and a
prediction, in one frozen table (docs/design.md, "The step model's spec", a section each).

Each :class:`SpecEntry` names its formula, what it is fitted from, where it applies, how it is
switched off and, for a fitted model, its value (:func:`spec_doc`); ``commprof estimate --fit
DIR`` prints the table beside every prediction. The entries are what the code applies, not a
description beside it: the corrections' entries are made from ``step_corrections.CORRECTIONS``
(their on/off from each one's declared scope), the constants are read from the modules that use
them, and the removed entries are named so that no one adds them back without an ablation
(docs/design.md says why). This module imports no torch and no ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from commprof.modeling.step import calibration, cap_advice, simulator
from commprof.modeling.step.calibration import HOOK_QUANTILE, INTERFERENCE_STATISTIC, Applied
from commprof.modeling.step.cap_advice import TIE_TOLERANCE
from commprof.modeling.step.corrections import BY_NAME, CORRECTIONS, Correction, Corrections
from commprof.modeling.step.model import StepModel

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


def _entry(c: Correction) -> SpecEntry:
    """A correction's entry: all of it from its declaration."""
    return SpecEntry(
        name=c.name, kind="correction", formula=c.formula, fitted_from=c.fitted_from,
        applies_to=c.scope.value, switch=c.switch, section=c.section, code=(c.fit, c.apply),
    )  # fmt: skip


SPEC: Final[tuple[SpecEntry, ...]] = (
    *(_entry(c) for c in CORRECTIONS),
    SpecEntry(
        name="interference_statistic", kind="rule",
        formula=f"factor = {INTERFERENCE_STATISTIC} loaded time / {INTERFERENCE_STATISTIC} "
        "alone time",
        fitted_from="constant", applies_to="the interference factors", switch="none",
        section="Interference statistic",
        code=(calibration.interference_from_rows,),
    ),
    SpecEntry(
        name="hook_cost", kind="fitted",
        formula=f"L(n) = a + b * n on the training thread a bucket, the {HOOK_QUANTILE:g} "
        "quantile of launch - ready per bucket size",
        fitted_from="the calibration cells' timing-hook records (one size: all per byte)",
        applies_to="every prediction", switch="none: part of the calibrated timeline",
        section="Hook cost",
        code=(calibration.hook_fit, simulator.simulate_step),
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
"""The step model's spec: its corrections (in ``step_corrections.CORRECTIONS`` order), then the
fitted parts and rules, then the removed corrections."""


def _values(model: StepModel, used: Applied) -> dict[str, Callable[[], str]]:
    cal = model.calibration
    values: dict[str, Callable[[], str]] = {
        "interference_statistic": lambda: INTERFERENCE_STATISTIC,
        "hook_cost": lambda: (
            f"a = {cal.hook_fixed_ns / 1e3:.1f} us, b = {cal.hook_ns_per_byte:.3g} ns/B"
        ),
        "advice_tolerance": lambda: f"{TIE_TOLERANCE:.0%}",
        "in_use_rule": lambda: f"within {TIE_TOLERANCE:.0%}",
    }
    for c in CORRECTIONS:
        values[c.name] = lambda c=c: c.value_text(model, used)  # type: ignore[misc]
    return values


def spec_doc(
    model: StepModel, used: Applied, corrections: Corrections, *, calibrated_link: bool = True
) -> list[dict[str, Any]]:
    """The spec of a fitted model: per entry its kind, whether it is on, its value (None where
    off or removed) and its declaration.

    Args:
        model: The fitted model (``step_advice.load_step_model``).
        used: What the prediction applies (``step_corrections.applied``).
        corrections: Which corrections are switched on.
        calibrated_link: The prediction is on the calibrated link; on another (a published
            interconnect, a cluster) a correction whose scope needs that link is off (an
            in-sample one shows on at the calibrated link, its value saying whether it
            applies to this configuration).
    """
    values = _values(model, used)
    out = []
    for e in SPEC:
        on = e.kind != "removed"
        if e.kind == "correction":
            scope = BY_NAME[e.name].scope
            on = corrections.on(e.name) and scope.reaches(
                calibrated_link=calibrated_link, in_sample=True
            )
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
