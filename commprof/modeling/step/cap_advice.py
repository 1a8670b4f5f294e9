"""Bucket-cap advice: one rule over a predicted curve, with or without a dataset (public API).

A cap search predicts the step at each cap of a grid (and the cap in use) and names one:
:func:`best_of`, the step model's spec entries ``advice_tolerance`` and ``in_use_rule``
(docs/design.md). ``commprof estimate --fit DIR --recommend-bucket-cap`` searches the
calibrated step model (:func:`recommend_cap`, :func:`advise_cap`); without a dataset the same
rule searches the idle model's backward and exposed communication (``estimate``). Both end
with :func:`verdict`. A report calls::

    advice = advise_cap(tables, "srn-10m", world_size=2)      # load_step_model + recommend_cap
    advice.best_cap_mb, [(c.bucket_cap_mb, c.step_ns, c.exposed_ns) for c in advice.curve]

This module imports no torch and no ray.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeVar

import pandas as pd

from commprof.caps import DDP_DEFAULT_CAP_MB, cap_label
from commprof.modeling.buckets import DEFAULT_FIRST_BUCKET_BYTES, MIB, ParamSize
from commprof.modeling.step.calibration import same_setting
from commprof.modeling.step.model import (
    ALL_CORRECTIONS,
    CapPrediction,
    Corrections,
    StepModel,
    load_step_model,
    param_sizes_for,
    predict_cap,
    without_in_sample,
)

CAP_GRID_MB = tuple(2.0**k for k in range(-3, 10))
"""Caps searched by default: 0.125 MiB to 512 MiB."""
TIE_TOLERANCE = 0.01
"""Caps predicted within this fraction of the shortest step count as tied."""


class CapPoint(Protocol):
    """A predicted point of a cap search."""

    @property
    def bucket_cap_mb(self) -> float | None:
        """The cap (MiB); None is DDP's default."""

    @property
    def num_buckets(self) -> int:
        """Buckets DDP makes at this cap."""

    @property
    def step_ns(self) -> float:
        """What the advice minimises: the predicted step."""


P = TypeVar("P", bound=CapPoint)


class _Unset(enum.Enum):
    NONE_IN_USE = "none in use"


NONE_IN_USE: Final = _Unset.NONE_IN_USE
"""``recommend_cap(in_use_mb=...)`` when no cap is in use (None is DDP's default cap)."""
InUse = float | Literal[_Unset.NONE_IN_USE] | None
"""A cap in use (MiB; None: DDP's default) or :data:`NONE_IN_USE`."""


def tied(curve: Sequence[P]) -> list[P]:
    """The points of ``curve`` predicted within :data:`TIE_TOLERANCE` of its shortest step."""
    if not curve:
        raise ValueError("a cap search needs at least one predicted cap")
    shortest = min(c.step_ns for c in curve)
    return [c for c in curve if c.step_ns <= shortest * (1.0 + TIE_TOLERANCE)]


def _rule_pick(curve: Sequence[P]) -> P:
    """Of the tied points, the fewest buckets, then the shorter step."""
    return min(tied(curve), key=lambda c: (c.num_buckets, c.step_ns))


def best_of(curve: Sequence[P], *, in_use: P | None = None) -> P:
    """The point to recommend: among the caps predicted within :data:`TIE_TOLERANCE` of the
    shortest step, the one with the fewest buckets (then the shorter step); but ``in_use`` (a
    point of ``curve``: the cap the user runs) where it is predicted within the tolerance of
    that one.

    A gain of a percent is below what repeats of one cell resolve (the step-model benchmark's
    pairs of one configuration moved by up to 24 % round to round), so the model gives no
    reason to change a cap it cannot tell from the one it would name; two caps can even make
    the same buckets (srn-1m at 4 and 25 MiB: one bucket). Among caps that are all new, fewer
    buckets mean fewer collectives to launch and to vary.
    """
    pick = _rule_pick(curve)
    if in_use is not None and in_use.step_ns <= pick.step_ns * (1.0 + TIE_TOLERANCE):
        return in_use
    return pick


def search(
    caps_mb: Sequence[float | None], predict: Callable[[float | None], P], in_use_mb: InUse
) -> tuple[tuple[P, ...], P, P | None]:
    """(curve, best, in use): ``predict`` at every cap of ``caps_mb`` and at the cap in use
    (added last where ``caps_mb`` lacks it), :func:`best_of` of them."""
    if not caps_mb:
        raise ValueError("caps_mb must name at least one cap")
    caps = list(caps_mb)
    if in_use_mb is not NONE_IN_USE and not any(same_setting(c, in_use_mb) for c in caps):
        caps.append(in_use_mb)
    curve = tuple(predict(cap) for cap in caps)
    in_use = None
    if in_use_mb is not NONE_IN_USE:
        in_use = next(c for c in curve if same_setting(c.bucket_cap_mb, in_use_mb))
    return curve, best_of(curve, in_use=in_use), in_use


def baseline_label(cap_mb: float | None, *, dataset: bool = False) -> str:
    """The layout a verdict compares against, named so that DDP's default and an explicit cap
    of the same size are not taken for one another: DDP's default makes its first bucket
    ``buckets.DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), an explicit cap makes every bucket, the
    first too, that cap (two layouts: srn-1m makes 2 buckets at the default, 1 at 25 MiB).

    Args:
        cap_mb: the cap (MiB; None: DDP's default).
        dataset: it is the cap the dataset's calibration cells ran (the cap in use).
    """
    if cap_mb is None:
        text = (
            f"DDP's default layout ({DDP_DEFAULT_CAP_MB:g} MiB buckets, the first "
            f"{DEFAULT_FIRST_BUCKET_BYTES / MIB:g} MiB)"
        )
    else:
        text = f"an explicit {cap_mb:g} MiB cap (the first bucket {cap_mb:g} MiB too)"
    return f"the dataset's cap in use, {text}" if dataset else text


def step_range(point: CapPoint) -> tuple[float, float] | None:
    """A point's predicted step range (ns), where its search has one (the calibrated model's)."""
    ends = getattr(point, "step_ns_range", None)
    return None if ends is None else (float(min(ends)), float(max(ends)))


def measurable(best: CapPoint, in_use: CapPoint) -> bool:
    """Whether ``best``'s predicted step range and ``in_use``'s are apart (True without
    ranges): a recommendation inside the baseline's range is no measurable difference."""
    a, b = step_range(best), step_range(in_use)
    return a is None or b is None or a[1] < b[0] or b[1] < a[0]


def verdict(
    curve: Sequence[P],
    best: P,
    in_use: P | None,
    *,
    quantity: str = "step",
    baseline: str | None = None,
) -> str:
    """One line: keep the cap in use, or change to ``best`` and what it is predicted to save
    of ``quantity`` (without a cap in use: the cap to use), naming what it compares against
    (``baseline``, default :func:`baseline_label` of the cap in use). Where ``best``'s
    predicted range overlaps the cap in use's, the line says "no measurable difference"."""
    if in_use is None:
        return f"verdict: use {cap_label(best.bucket_cap_mb, with_size=True)}"
    label = baseline or baseline_label(in_use.bucket_cap_mb)
    if best is in_use:
        # the rule of best_of: the cap it would name otherwise, and the fastest of all
        pick = _rule_pick(curve)
        gain = max(0.0, in_use.step_ns - min(c.step_ns for c in curve))
        why = (
            "it is the cap the rule names"
            if pick is in_use
            else f"it is predicted within {TIE_TOLERANCE:.0%} of the cap the rule would "
            f"name, {cap_label(pick.bucket_cap_mb, with_size=True)}"
        )
        return (
            f"verdict: keep {label}: {why} (the fewest buckets among the caps within "
            f"{TIE_TOLERANCE:.0%} of the fastest); the fastest cap is predicted to save "
            f"{gain / 1e6:.2f} ms ({gain / in_use.step_ns:.1%})"
        )
    gain = in_use.step_ns - best.step_ns
    saving = f"predicted {quantity} -{gain / 1e6:.2f} ms (-{gain / in_use.step_ns:.1%})"
    best_label = cap_label(best.bucket_cap_mb, with_size=True)
    a, b = step_range(best), step_range(in_use)
    if a is not None and b is not None and not measurable(best, in_use):
        return (
            f"verdict: no measurable difference: keep {label}; {best_label} is {saving}, "
            f"inside both ranges ({a[0] / 1e6:.2f}-{a[1] / 1e6:.2f} ms against "
            f"{b[0] / 1e6:.2f}-{b[1] / 1e6:.2f} ms)"
        )
    return f"verdict: change to {best_label}: {saving} against {label}"


VerdictKind = Literal["keep", "no measurable difference", "change"]


def verdict_kind(best: CapPoint, in_use: CapPoint) -> VerdictKind:
    """What :func:`verdict` says, in one word: the report and ``estimate`` both use it."""
    if best is in_use:
        return "keep"
    return "change" if measurable(best, in_use) else "no measurable difference"


@dataclass(frozen=True, kw_only=True, slots=True)
class CapAdvice:
    """The cap search of the calibrated step model."""

    best_cap_mb: float | None
    """The cap to use (:func:`best_of`): of the caps predicted within :data:`TIE_TOLERANCE` of
    the shortest step the one with the fewest buckets, or the cap in use where it is predicted
    within the tolerance of that one."""
    curve: tuple[CapPrediction, ...]
    """Every cap tried, in the order given (the cap in use last, where it was not given)."""
    best: CapPrediction
    """The point of ``curve`` recommended (its ``bucket_cap_mb`` is ``best_cap_mb``)."""
    in_use: CapPrediction | None = None
    """The point of ``curve`` at the cap in use (None: none was given)."""

    def verdict(self, *, baseline: str | None = None) -> str:
        """One line (:func:`verdict`), naming ``baseline`` as what it compares against."""
        return verdict(self.curve, self.best, self.in_use, baseline=baseline)


def recommend_cap(
    model: StepModel,
    param_sizes: Sequence[ParamSize],
    *,
    world_size: int | None = None,
    caps_mb: Sequence[float | None] = CAP_GRID_MB,
    in_use_mb: InUse = NONE_IN_USE,
    **what_if: object,
) -> CapAdvice:
    """The cap to use among ``caps_mb``: the shortest predicted step, near-ties to fewer
    buckets, the cap in use kept where the model cannot tell it from that (:func:`best_of`).

    Every cap is predicted out of sample (``step_advice.without_in_sample``): the residuals that
    give the calibration's own configuration its measurement back would favour or penalise that
    cap alone, so the caps are compared on the model.

    Args:
        model: from :func:`step_advice.load_step_model`.
        param_sizes: the model's parameter sizes.
        world_size: ranks (default: the calibration's).
        caps_mb: caps to try (MiB; None is DDP's default).
        in_use_mb: the cap the user runs (None: DDP's default), tried too where ``caps_mb``
            lacks it; :data:`NONE_IN_USE` (the default): none.
        **what_if: ``link``, ``same_host``, ``corrections`` as
            :func:`step_advice.predict_cap` takes them (the in-sample ones left out).

    Returns:
        The advice and the predicted curve.
    """

    asked = what_if.pop("corrections", ALL_CORRECTIONS)
    if not isinstance(asked, Corrections):
        raise TypeError(f"corrections must be a step.model.Corrections, got {type(asked).__name__}")
    corrections = without_in_sample(asked)

    def predict(cap: float | None) -> CapPrediction:
        return predict_cap(
            model, param_sizes, bucket_cap_mb=cap, world_size=world_size,
            corrections=corrections, **what_if,  # type: ignore[arg-type]
        )  # fmt: skip

    curve, best, in_use = search(caps_mb, predict, in_use_mb)
    return CapAdvice(best_cap_mb=best.bucket_cap_mb, curve=curve, best=best, in_use=in_use)


def advise_cap(
    tables: dict[str, pd.DataFrame],
    model: str,
    world_size: int,
    *,
    caps_mb: Sequence[float | None] = CAP_GRID_MB,
    backend: str = "gloo",
    in_use_mb: InUse = NONE_IN_USE,
) -> CapAdvice:
    """Bucket-cap advice for a catalog model from a dataset in one call.

    Args:
        tables: the dataset (``commprof.results.load``).
        model: a ``commprof.catalog`` model name that has a completed cell in the dataset.
        world_size: ranks to advise for (a calibration cell of this size is preferred; another
            size is predicted with the ring model's p dependence, ranks on their own devices).
        caps_mb: caps to compare (MiB; None is DDP's default).
        backend: the backend of the calibration cell.
        in_use_mb: the cap the user runs, kept where it ties (:func:`recommend_cap`).

    Returns:
        The advice: the cap with the shortest predicted step, and the curve, each point with
        step time, exposed communication, overlap efficiency and their ranges.
    """
    sizes = param_sizes_for(tables, model)
    fitted = load_step_model(
        tables, model, world_size=world_size, param_sizes=sizes, backend=backend
    )
    return recommend_cap(fitted, sizes, world_size=world_size, caps_mb=caps_mb, in_use_mb=in_use_mb)
