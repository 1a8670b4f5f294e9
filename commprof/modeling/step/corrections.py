"""The step model's corrections of the idle ring model, each one declared object.

A :class:`Correction` names the :class:`~commprof.modeling.step.model.StepModel` field that holds
its fitted value, the function that fits it, the one that applies it, its declared
:class:`Scope`, its formula and its section of docs/design.md. :data:`CORRECTIONS` is the one
list: ``commprof estimate --without NAME`` takes its names, ``step_spec`` prints it, the
step-model benchmark's ablation has a row for each correction that acts out of sample, and
docs/design.md's table of corrections is checked against it (``tests/test_step_spec.py``). The
idle model is the same list switched off (:data:`IDLE`).

Adding a correction: a field on ``StepModel`` and on :class:`step_model.Applied` (its value as a
prediction applies it; neutral is the idle model's), the simulator's use of it, one entry here,
one section of docs/design.md, one test.

This module imports no torch and no ray, and nothing above ``step_model``: the residuals' fits
are handed the prediction they measure against (:data:`Predict`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

import pandas as pd

from commprof.modeling.buckets import ParamSize
from commprof.modeling.step.calibration import (
    Applied,
    host_hook_fixed_ns,
    interference_from_rows,
    predict_step,
    split_hook,
    with_exposed_residual,
)
from commprof.modeling.step.simulator import NO_INTERFERENCE, simulate_step

if TYPE_CHECKING:
    from commprof.modeling.step.model import StepModel


class Scope(enum.Enum):
    """Where a correction applies (its declared scope; :meth:`reaches`)."""

    EVERY = "every prediction"
    """Part of the measured compute timeline, which every what-if keeps."""
    CALIBRATED_LINK = "the calibrated link"
    """The calibrated link's in training, on its host: not on a published interconnect or a
    cluster."""
    IN_SAMPLE = "in sample only: the calibration's buckets and world size on the calibrated link"
    """The gap between the model and the calibration cells' measurement, given back where a
    prediction is their own configuration only."""

    @property
    def short(self) -> str:
        """The scope in a few words (``--help``)."""
        return self.value.partition(":")[0]

    def reaches(self, *, calibrated_link: bool, in_sample: bool) -> bool:
        """Whether a correction of this scope applies to a prediction on the calibrated link
        (or not) at the calibration's configuration (or not)."""
        if self is Scope.EVERY:
            return True
        if self is Scope.CALIBRATED_LINK:
            return calibrated_link
        return calibrated_link and in_sample


class Prediction(Protocol):
    """What a residual's fit reads of a prediction."""

    @property
    def step_ns(self) -> float:
        """Predicted step."""

    @property
    def exposed_ns(self) -> float:
        """Predicted exposed communication."""


Predict = Callable[["StepModel", Sequence[ParamSize], "Corrections"], Prediction]
"""The model at its calibration's cap and world size on the calibrated link, with the given
corrections (``step_advice.with_residuals`` passes ``predict_cap`` so)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Correction:
    """One correction of the idle model: what it is, where it applies, how it is fitted."""

    name: str
    """What ``--without`` takes, the ablation's ``no_<name>`` row and the spec's entry."""
    field: str
    """The ``StepModel`` field of its fitted value, and the ``step_model.Applied`` field of its
    value as a prediction applies it."""
    neutral: Any
    """Its value switched off (the idle model's)."""
    scope: Scope
    """Where it applies (:meth:`Scope.reaches`)."""
    residual: bool
    """Fitted on the model itself against its calibration cells (``fit(model, sizes,
    predict)``), again whenever another correction is switched off; else fitted from the
    dataset when the model is loaded (``step_advice.load_step_model``)."""
    fit: Callable[..., Any]
    """The function that fits its value."""
    apply: Callable[..., Any]
    """The function that applies it in a prediction."""
    formula: str
    """What it adds, as a formula (docs/design.md, the spec)."""
    fitted_from: str
    """Where its value comes from."""
    section: str
    """Its heading in docs/design.md, "The step model's spec"."""
    value_text: Callable[[StepModel, Applied], str]
    """Its value as the spec prints it, for a fitted model and what a prediction applies."""
    aliases: tuple[str, ...] = ()
    """Other flags that switch it off."""

    def __post_init__(self) -> None:
        if self.field not in {f.name for f in fields(Applied)}:
            raise ValueError(
                f"correction {self.name!r}: field {self.field!r} is no field of "
                "step_model.Applied; declare its applied value there"
            )

    @property
    def switch(self) -> str:
        """How it is switched off on the command line."""
        alias = f" ({', '.join(self.aliases)})" if self.aliases else ""
        return f"--without {self.name}{alias}"


STALL_MIN_ITERS = 3
"""Iterations a microbenchmark row needs to show a stall: of one or two, the median is the
mean, whatever stalled."""


def link_stall_ns(rows: pd.DataFrame) -> float:
    """The stall's fit, the expected stall of one all-reduce: what the mean time adds to the
    median, per microbenchmark iteration of a cell (all sizes), and the median of that over the
    cells of ``rows`` (a ``cell_id`` column; without one, all rows are one cell).

    On a shared host a few all-reduces in ten stall for milliseconds whatever their size (the
    scheduler, not the bytes), so a step pays one expected stall per bucket: a cost per
    operation. A ring fit of mean times spread it over alpha and beta and, weighting each point
    by 1/t, leaned to the unstalled ones: small buckets came out short. Pooled over sizes, a
    cell's stall is estimated from all its iterations at once (one size's mean excess ranged
    from 0.1 to 1.6 ms on the 2-core benchmark host). Over cells, the median: a step model is
    judged on median steps of repeated cells, and one cell's minute of host load (one of 30
    cells at 7.6 times the median cell, seen in the step-model benchmark) would otherwise move
    every bucket's time. Rows of fewer than :data:`STALL_MIN_ITERS` iterations are left out (a
    matrix's ``microbench_iters: 1`` times each size once), and so is a cell whose rows all have
    fewer. 0 where no row is left (rows from before ``time_mean_ns``).
    """
    if "time_mean_ns" not in rows:
        return 0.0
    rows = rows[rows["time_mean_ns"].notna() & (rows["num_iters"] >= STALL_MIN_ITERS)]
    if rows.empty:
        return 0.0
    weight = rows["num_iters"]
    excess = (rows["time_mean_ns"] - rows["time_p50_ns"]).astype(float) * weight
    cell = rows["cell_id"] if "cell_id" in rows else pd.Series(0, index=rows.index)
    per_cell = excess.groupby(cell).sum() / weight.groupby(cell).sum()
    return max(0.0, float(per_cell.median()))


def exposed_residual_ns(
    model: StepModel, param_sizes: Sequence[ParamSize], predict: Predict
) -> float:
    """The exposed residual's fit: ``measured_exposed - model_exposed`` at the calibration cap
    and world size, on the calibrated link with the corrections before it on (the host residual
    does not move the exposed time).

    The simulator plays the slowest rank on the link's idle times plus its stall, slowed by the
    interference factors; the timing hook measures the exposed time on every rank, a rank that
    ends its compute first counting its wait for the slowest as exposed, and in training the
    all-reduces share the host with the other ranks' backward, the reducer and the allocator,
    which the idle link does not see. The calibration cells measure the sum; the residual is its
    gap to the model, signed, given back in sample only (:attr:`Scope.IN_SAMPLE`).
    """
    cal = model.calibration
    if not math.isfinite(cal.measured_exposed_ns):
        return 0.0
    base = predict(model, param_sizes, Corrections.without(["exposed_residual", "host_residual"]))
    return cal.measured_exposed_ns - base.exposed_ns


def host_residual_ns(model: StepModel, param_sizes: Sequence[ParamSize], predict: Predict) -> float:
    """The host residual's fit: ``measured_step - model_step`` at the calibration cap and world
    size, on the calibrated link with every other correction on (the model's own host residual
    is not used: the fit switches it off).

    The simulator's step is ``forward + backward + optimizer + other``, each a median of its own
    over rank-steps; the measured step is the median over the calibration cells of each cell's
    median step. Medians of parts do not add up to the median of their sum, and the slowest
    rank's timeline is not any one rank's step, so the sum misses the step it was calibrated on
    (19.5 against 21.0 ms for srn-1m in the committed dataset, before this correction). The
    residual is that gap, host time the parts do not explain, signed, given back in sample only
    (:attr:`Scope.IN_SAMPLE`).
    """
    cal = model.calibration
    if not math.isfinite(cal.measured_step_ns):
        return 0.0
    base = predict(model, param_sizes, Corrections.without(["host_residual"]))
    return cal.measured_step_ns - base.step_ns


def _ms(ns: float) -> str:
    return f"{ns / 1e6:+.3f} ms"


def _residual(name: str) -> Callable[[StepModel, Applied], str]:
    """An in-sample residual's value: as applied, or 0 and the fitted value out of sample."""

    def text(model: StepModel, used: Applied) -> str:
        used_ns, fitted_ns = getattr(used, name), getattr(model, name)
        if used_ns or not fitted_ns:
            return _ms(used_ns)
        return (
            f"0 here, out of sample ({_ms(fitted_ns)} at the calibration's buckets and world size)"
        )

    return text


def _interference_text(model: StepModel, used: Applied) -> str:
    f = model.interference
    return (
        f"comm x{min(f.comm_slowdown):.2f} to x{max(f.comm_slowdown):.2f}, compute "
        f"x{min(f.compute_slowdown):.2f} to x{max(f.compute_slowdown):.2f} over "
        f"{len(f.sizes_bytes)} size(s)"
    )


def _hook_split_text(model: StepModel, used: Applied) -> str:
    """The hook split's value: the split line, or why there is none."""
    sizes = len(model.calibration.hook_sizes_bytes)
    fixed = used.hook_fixed_ns / 1e3
    if sizes != 1:
        return f"a_host = {fixed:.1f} us, not used: the calibration saw {sizes} sizes"
    if used.hook_fixed_ns <= 0:
        return "not used: the host's cells saw one bucket size (no fixed part to take)"
    split = split_hook(model.calibration, used.hook_fixed_ns)
    return f"a = {split.hook_fixed_ns / 1e3:.1f} us, b = {split.hook_ns_per_byte:.3g} ns/B"


CORRECTIONS: Final[tuple[Correction, ...]] = (
    Correction(
        name="stall", field="stall_ns", neutral=0.0, scope=Scope.CALIBRATED_LINK,
        residual=False, fit=link_stall_ns, apply=predict_step,
        formula="t_k = alpha + beta * n_k + stall, for every all-reduce k",
        fitted_from="the host's microbenchmarks: mean minus median time of a cell's iterations "
        "(all sizes), median over cells",
        section="Stall",
        value_text=lambda model, used: f"{_ms(used.stall_ns)} an all-reduce",
    ),
    Correction(
        name="interference", field="interference", neutral=NO_INTERFERENCE, scope=Scope.EVERY,
        residual=False, fit=interference_from_rows, apply=simulate_step,
        formula="an all-reduce of n bytes runs comm_factor(n) times slower while compute runs; "
        "compute compute_factor(n) times slower while it runs",
        fitted_from="the interference arms of every cell of the host, median over cells",
        section="Interference", value_text=_interference_text,
        aliases=("--no-interference",),
    ),
    Correction(
        name="hook_split", field="hook_fixed_ns", neutral=0.0, scope=Scope.EVERY,
        residual=False, fit=host_hook_fixed_ns, apply=split_hook,
        formula="where the calibration saw one bucket size n0: L(n) = a_host + (L(n0) - a_host) "
        "/ n0 * n, a_host at most L(n0)",
        fitted_from="the intercept of the hook-cost line over every bucket size of the host's "
        "cells with the calibration's hook, unprofiled",
        section="Hook split", value_text=_hook_split_text,
    ),
    Correction(
        name="exposed_residual", field="exposed_residual_ns", neutral=0.0,
        scope=Scope.IN_SAMPLE, residual=True, fit=exposed_residual_ns,
        apply=with_exposed_residual,
        formula="exposed += measured exposed - model exposed at the calibration cap",
        fitted_from="the calibration cells", section="Exposed residual",
        value_text=_residual("exposed_residual_ns"),
    ),
    Correction(
        name="host_residual", field="host_residual_ns", neutral=0.0, scope=Scope.IN_SAMPLE,
        residual=True, fit=host_residual_ns, apply=predict_step,
        formula="step += measured step - model step at the calibration cap",
        fitted_from="the calibration cells", section="Host residual",
        value_text=_residual("host_residual_ns"),
    ),
)  # fmt: skip
"""The step model's corrections, in the order they are fitted (a residual is fitted with the
ones before it on)."""

CORRECTION_NAMES: Final[tuple[str, ...]] = tuple(c.name for c in CORRECTIONS)
"""What ``commprof estimate --without`` takes."""
BY_NAME: Final[dict[str, Correction]] = {c.name: c for c in CORRECTIONS}
""":data:`CORRECTIONS` by name."""
IN_SAMPLE_ONLY: Final[tuple[str, ...]] = tuple(
    c.name for c in CORRECTIONS if c.scope is Scope.IN_SAMPLE
)
"""The corrections that apply to the calibration's own configuration only."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Corrections:
    """Which corrections of :data:`CORRECTIONS` a prediction applies: all but ``off``."""

    off: frozenset[str] = frozenset()
    """The names switched off."""

    def __post_init__(self) -> None:
        bad = sorted(set(self.off) - set(CORRECTION_NAMES))
        if bad:
            raise ValueError(f"unknown corrections {bad}; choose from {list(CORRECTION_NAMES)}")

    @classmethod
    def without(cls, names: Sequence[str]) -> Corrections:
        """Every correction on but ``names`` (of :data:`CORRECTION_NAMES`)."""
        return cls(off=frozenset(names))

    def on(self, name: str) -> bool:
        """Whether the correction ``name`` is switched on."""
        return name not in self.off

    def as_dict(self) -> dict[str, bool]:
        """Name -> on, in :data:`CORRECTIONS` order."""
        return {name: self.on(name) for name in CORRECTION_NAMES}


ALL_CORRECTIONS: Final = Corrections()
"""The calibrated model: every correction on."""
IDLE: Final = Corrections.without(CORRECTION_NAMES)
"""The idle model: the link's idle times, overlap free, no residual: every correction off."""


def without_in_sample(corrections: Corrections) -> Corrections:
    """``corrections`` without :data:`IN_SAMPLE_ONLY`: the model at any configuration as at a new
    one, the basis on which the cap advice compares caps (``cap_advice.recommend_cap``)."""
    return Corrections(off=corrections.off | frozenset(IN_SAMPLE_ONLY))


def applied(
    model: StepModel,
    *,
    link: object | None,
    corrections: Corrections = ALL_CORRECTIONS,
    in_sample: bool = True,
) -> Applied:
    """What each correction adds to a prediction: its fitted value where it is switched on and
    its scope reaches the prediction (``link`` None: the calibrated link; ``in_sample``: the
    calibration's buckets and world size, ``step_advice.in_sample_layout``), else its neutral
    value."""
    here = {"calibrated_link": link is None, "in_sample": in_sample}
    return Applied(**{
        c.field: getattr(model, c.field) if corrections.on(c.name) and c.scope.reaches(**here)
        else c.neutral
        for c in CORRECTIONS
    })  # fmt: skip


def with_residuals(
    model: StepModel, param_sizes: Sequence[ParamSize], predict: Predict
) -> StepModel:
    """The model with its residuals (:attr:`Correction.residual`) fitted on its calibration
    cells in list order, each with the ones before it on."""
    for c in CORRECTIONS:
        if c.residual:
            model = replace(model, **{c.field: c.fit(model, param_sizes, predict)})
    return model


def recalibrated_without(
    model: StepModel, names: Sequence[str], param_sizes: Sequence[ParamSize], predict: Predict
) -> StepModel:
    """The model as calibrating it with the corrections ``names`` off would give: a correction
    fitted from the dataset set to its neutral value and the residuals fitted again without it
    (so the model still reproduces its calibration), a residual named set to neutral."""
    Corrections.without(names)  # validates the names
    out = model
    for c in CORRECTIONS:
        if c.name in names and not c.residual:
            out = replace(out, **{c.field: c.neutral})
    if out is not model:
        out = with_residuals(out, param_sizes, predict)
    for c in CORRECTIONS:
        if c.name in names and c.residual:
            out = replace(out, **{c.field: c.neutral})
    return out
