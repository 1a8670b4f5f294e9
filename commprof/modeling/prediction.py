"""One result for every kind of prediction: :class:`Prediction`, its JSON schema and its text.

``commprof estimate`` answers three questions (docs/prediction.md): the idle model (DDP's
buckets on a link, played on a simple or measured backward), the step model calibrated on a
dataset, and a trace's replay with its what-ifs. Each returns one :class:`Prediction`: the parts
every answer has (its mode, the link, the world size, the interval of its headline figure, what
it assumed and where each assumption came from) and the mode's own figures (``body``). Its JSON
(:meth:`Prediction.to_dict`) is versioned (:data:`SCHEMA_VERSION`) and described by
:data:`PREDICTION_SCHEMA`; its text is :func:`render_text`, the one renderer.

A change to the JSON that removes or renames a key, or changes its meaning, raises
:data:`SCHEMA_VERSION`; a new key does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

SCHEMA_VERSION: Final = 1
"""Version of the JSON of :class:`Prediction` (``schema_version`` in every document)."""
MODES: Final = ("idle", "step", "trace")
"""The questions ``commprof estimate`` answers: ``idle`` (the idle model, no dataset),
``step`` (the step model calibrated on a dataset, ``--fit DIR``), ``trace`` (``--trace``)."""
ENVELOPE: Final = ("schema_version", "mode", "link", "world_size", "interval", "assumptions")
"""The keys every document has; the mode's body keys sit beside them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Assumption:
    """One thing a prediction assumed: what, its value and where the value came from."""

    name: str
    """What is assumed (``compute``, ``tokens``, ``link``, ``latency``, ...)."""
    value: Any
    """Its value: text, a number in :attr:`unit`, or None where it is measured, not assumed."""
    source: str
    """Where the value came from: a flag, a file or dataset, or the built-in default."""
    unit: str = ""
    """The unit of a numeric :attr:`value` (``ns``); empty for text."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Figures behind the value, for JSON (``backward_work_ns`` of the measured compute)."""

    def to_dict(self) -> dict[str, Any]:
        """``{name, value, source}``, ``unit`` where it has one, and its details."""
        out: dict[str, Any] = {"name": self.name, "value": self.value, "source": self.source}
        if self.unit:
            out["unit"] = self.unit
        return {**out, **self.details}

    def text(self) -> str:
        """``assumed <name>: <value> (<source>)``; a latency in ns is shown in us."""
        value = self.value
        if self.unit == "ns" and isinstance(value, int | float):
            value = f"{value / 1e3:.1f} us"
        shown = "" if value is None else f"{value} "
        return f"assumed {self.name}: {shown}({self.source})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Interval:
    """The range of a prediction's headline figure."""

    quantity: str
    """The body's figure it bounds (``step_ns``, ``total_comm_ns``)."""
    low_ns: float
    """Its low end (ns)."""
    high_ns: float
    """Its high end (ns)."""
    basis: str
    """What the range carries (the calibration's uncertainty, the collective model's 80 %)."""
    title: str
    """How the text names it (``step range``, ``total communication 80 % interval``)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the title is the text's)."""
        return {
            "quantity": self.quantity,
            "low_ns": round(self.low_ns),
            "high_ns": round(self.high_ns),
            "basis": self.basis,
        }

    def text(self) -> str:
        """One line: ``<title> <low> to <high> ms (<basis>)``."""
        return f"{self.title} {self.low_ns / 1e6:.3f} to {self.high_ns / 1e6:.3f} ms ({self.basis})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What one ``commprof estimate`` request predicted."""

    mode: str
    """Which question (:data:`MODES`)."""
    link: str | None
    """The link the prediction ran on, in words; None for a trace replayed without a what-if."""
    world_size: int | None
    """The ranks predicted for (None where a trace does not say and no what-if asks)."""
    interval: Interval | None
    """The range of the headline figure; None where the prediction has none."""
    assumptions: tuple[Assumption, ...]
    """What it assumed, each with its source."""
    body: Mapping[str, Any]
    """The mode's own figures (JSON-ready; docs/prediction.md lists each mode's keys)."""
    lines: tuple[str, ...]
    """The mode's report before the assumptions (its tables), as text."""
    notes: tuple[str, ...] = ()
    """The mode's text after the assumptions (in-sample error, extrapolation, the cap search)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        clash = sorted(set(ENVELOPE) & set(self.body))
        if clash:
            raise ValueError(f"body keys {clash} are the envelope's; rename them")

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: the envelope (:data:`ENVELOPE`) and the body's keys beside it."""
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": self.mode,
            "link": self.link,
            "world_size": self.world_size,
            "interval": None if self.interval is None else self.interval.to_dict(),
            "assumptions": [a.to_dict() for a in self.assumptions],
            **self.body,
        }


def assumptions_text(assumptions: Sequence[Assumption]) -> str:
    """The assumptions as lines, one each (:meth:`Assumption.text`)."""
    return "\n".join(a.text() for a in assumptions)


def render_text(prediction: Prediction) -> str:
    """The text of a prediction: the mode's report, its interval, what it assumed, its notes."""
    lines = list(prediction.lines)
    if prediction.interval is not None:
        lines.append(prediction.interval.text())
    lines.append(assumptions_text(prediction.assumptions))
    return "\n".join([*lines, *prediction.notes])


_NULLABLE_INT = {"type": ["integer", "null"]}
_BODY: dict[str, tuple[str, ...]] = {
    "idle": ("estimate", "in_sample"),
    "step": ("prediction", "idle_ring", "calibration", "in_sample", "extrapolation", "spec"),
    "trace": ("trace", "steps", "totals"),
}
"""Keys each mode's body always has (docs/prediction.md describes them and the optional ones)."""

PREDICTION_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "commprof estimate prediction",
    "type": "object",
    "required": list(ENVELOPE),
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "mode": {"enum": list(MODES)},
        "link": {"type": ["string", "null"]},
        "world_size": _NULLABLE_INT,
        "interval": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["quantity", "low_ns", "high_ns", "basis"],
                    "properties": {
                        "quantity": {"type": "string"},
                        "low_ns": {"type": "integer"},
                        "high_ns": {"type": "integer"},
                        "basis": {"type": "string"},
                    },
                    "additionalProperties": False,
                },
            ]
        },
        "assumptions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "value", "source"],
                "properties": {
                    "name": {"type": "string"},
                    "value": {"type": ["string", "number", "null"]},
                    "source": {"type": "string"},
                    "unit": {"type": "string"},
                },
            },
        },
    },
    "allOf": [
        {
            "if": {"properties": {"mode": {"const": mode}}},
            "then": {"required": list(keys)},
        }
        for mode, keys in _BODY.items()
    ],
}
"""JSON Schema (draft 2020-12) of :meth:`Prediction.to_dict`: the envelope's keys and types, and
the keys each mode's body always has."""
