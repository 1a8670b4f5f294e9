"""Published interconnect bandwidths, each with its source and its conversion written out.

The table lives in ``interconnects.yaml`` (package data). Every entry keeps the
vendor figure as published, the source title, URL and access date, and the
inputs of its conversion to per-direction bytes/s; loading recomputes the
conversion and refuses an entry whose stated result disagrees. Users add their
own links with a YAML file of the same schema (``load_interconnects(path)``).

These are nominal peaks: measured collective bandwidth is lower (for example
H100 ring all-reduce reaches about 370 GB/s busbw on 8 GPUs against a 450 GB/s
per-direction NVLink 4 figure). Calibrate with measurements where you can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Any

from commprof.yamlio import load_yaml, read_text

UNIT_SCALE: dict[str, tuple[float, bool]] = {
    "GB/s": (1e9, False),
    "TB/s": (1e12, False),
    "Gb/s": (1e9, True),
    "Tb/s": (1e12, True),
    "GT/s": (1e9, True),
}
"""Unit -> (multiplier to base units, whether the base unit is bits)."""
BASES = ("per-direction", "bidirectional-total")
"""How a published figure counts directions."""
REL_TOLERANCE = 1e-6
"""Allowed relative gap between a stated and a recomputed conversion."""
_REQUIRED = ("name", "published_value", "published_unit", "basis")


@dataclass(frozen=True, kw_only=True, slots=True)
class Interconnect:
    """One link with its published figure and the conversion to bytes/s."""

    name: str
    """Short identifier used on the command line (e.g. ``nvlink4``)."""
    description: str
    """Human-readable name."""
    published: str
    """The vendor figure as published (text)."""
    published_value: float
    """Number of the published figure."""
    published_unit: str
    """Unit of the published figure, one of ``UNIT_SCALE``."""
    basis: str
    """``per-direction`` or ``bidirectional-total`` (a total is halved)."""
    lanes: int
    """Lanes multiplied in when the unit is per lane (GT/s), else 1."""
    encoding: tuple[int, int]
    """Payload fraction of the line rate as (numerator, denominator)."""
    per_direction_bytes_per_s: float
    """The converted per-direction bandwidth in bytes/s."""
    conversion: str
    """The conversion written out."""
    source_title: str
    """Title of the source document."""
    url: str
    """Where the source is."""
    accessed: str
    """Access date (ISO 8601)."""

    def __post_init__(self) -> None:
        if self.published_unit not in UNIT_SCALE:
            raise ValueError(
                f"link {self.name!r}: published_unit {self.published_unit!r} is not one of "
                f"{sorted(UNIT_SCALE)}"
            )
        if self.basis not in BASES:
            raise ValueError(f"link {self.name!r}: basis {self.basis!r} is not one of {BASES}")
        if self.lanes < 1 or not self.published_value > 0:
            raise ValueError(
                f"link {self.name!r}: lanes ({self.lanes}) must be >= 1 and published_value "
                f"({self.published_value}) > 0"
            )
        num, den = self.encoding
        if not 0 < num <= den:
            raise ValueError(f"link {self.name!r}: encoding {self.encoding} must be 0 < num <= den")
        expected = convert_to_per_direction_bytes_per_s(
            published_value=self.published_value,
            published_unit=self.published_unit,
            basis=self.basis,
            lanes=self.lanes,
            encoding=self.encoding,
        )
        if not math.isclose(self.per_direction_bytes_per_s, expected, rel_tol=REL_TOLERANCE):
            raise ValueError(
                f"link {self.name!r}: per_direction_bytes_per_s={self.per_direction_bytes_per_s!r}"
                f" disagrees with its inputs, which give {expected!r}"
            )


def convert_to_per_direction_bytes_per_s(
    *,
    published_value: float,
    published_unit: str,
    basis: str,
    lanes: int = 1,
    encoding: tuple[int, int] = (1, 1),
) -> float:
    """Convert a published figure to per-direction bytes/s.

    bytes/s = value * unit scale * lanes * (num / den) [/ 8 for bit units]
    [/ 2 for bidirectional totals].

    Args:
        published_value: The published number.
        published_unit: Its unit, one of ``UNIT_SCALE``.
        basis: ``per-direction`` or ``bidirectional-total``.
        lanes: Lanes when the unit is per lane.
        encoding: Payload fraction (num, den), e.g. (128, 130) for PCIe 3.0 to 5.0.

    Returns:
        Per-direction bandwidth in bytes/s.
    """
    if published_unit not in UNIT_SCALE or basis not in BASES:
        raise ValueError(
            f"published_unit {published_unit!r} must be one of {sorted(UNIT_SCALE)} and basis "
            f"{basis!r} one of {BASES}"
        )
    scale, is_bits = UNIT_SCALE[published_unit]
    value = published_value * scale * lanes * encoding[0] / encoding[1]
    if is_bits:
        value /= 8.0
    if basis == "bidirectional-total":
        value /= 2.0
    return value


_NUMBERS = {"published_value": (int, float), "per_direction_bytes_per_s": (int, float),
            "lanes": (int,)}  # fmt: skip
"""Number keys of a link entry and the types each may have."""


def _check_entry(entry: Any, origin: str) -> None:
    """Every key of a link entry of the type it must have, each number finite and positive:
    checked before any is converted, so a wrong one is named by its own key."""
    if not isinstance(entry, dict):
        raise ValueError(f"{origin}: a link entry must be a mapping, got {type(entry).__name__}")
    label = f"{origin}: link {entry.get('name')!r}"
    for key, value in entry.items():
        if key in _NUMBERS:
            ok = isinstance(value, _NUMBERS[key]) and not isinstance(value, bool)
            if not ok or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label}: {key} must be a finite number > 0, got {value!r}")
        elif key == "encoding":
            if not (
                isinstance(value, list | tuple)
                and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            ):
                raise ValueError(f"{label}: encoding must be [payload, line] bits, got {value!r}")
        elif not isinstance(value, str) and not (key == "accessed" and isinstance(value, date)):
            raise ValueError(f"{label}: {key} must be text, got {value!r}")


def _from_mapping(entry: dict[str, Any], origin: str) -> Interconnect:
    _check_entry(entry, origin)
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{origin}: link entry {entry!r} lacks {missing}")
    known = set(Interconnect.__dataclass_fields__)
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"{origin}: link {entry['name']!r} has unknown keys {unknown}")
    values = dict(entry)
    values["encoding"] = tuple(values.get("encoding", (1, 1)))
    values.setdefault("lanes", 1)
    values.setdefault("description", str(values["name"]))
    values.setdefault("published", f"{values['published_value']} {values['published_unit']}")
    values.setdefault("source_title", "user supplied")
    values.setdefault("url", "")
    values["accessed"] = str(values.get("accessed", ""))  # a date written unquoted too
    if "per_direction_bytes_per_s" not in values:
        values["per_direction_bytes_per_s"] = convert_to_per_direction_bytes_per_s(
            published_value=float(values["published_value"]),
            published_unit=str(values["published_unit"]),
            basis=str(values["basis"]),
            lanes=int(values["lanes"]),
            encoding=values["encoding"],
        )
    values.setdefault("conversion", "computed from the inputs by commprof")
    values["published_value"] = float(values["published_value"])
    values["per_direction_bytes_per_s"] = float(values["per_direction_bytes_per_s"])
    return Interconnect(**values)


def _parse(text: str, origin: str) -> list[Interconnect]:
    data = load_yaml(text, origin)
    if not isinstance(data, dict) or not isinstance(data.get("links"), list):
        raise ValueError(f"{origin}: expected a mapping with a 'links' list")
    return [_from_mapping(entry, origin) for entry in data["links"]]


def builtin_interconnects() -> dict[str, Interconnect]:
    """The published links shipped with commprof, by name."""
    text = (
        resources.files("commprof.modeling.collective")
        .joinpath("interconnects.yaml")
        .read_text("utf-8")
    )
    return {link.name: link for link in _parse(text, "interconnects.yaml")}


def load_interconnects(extra_path: str | Path | None = None) -> dict[str, Interconnect]:
    """Built-in links plus, optionally, a user's YAML file of the same schema.

    A user link may omit ``per_direction_bytes_per_s`` (it is computed) and the
    source fields. A user link with a built-in name replaces the built-in one.

    Args:
        extra_path: A YAML file with a top-level ``links:`` list, or None.

    Returns:
        Links by name.
    """
    links = builtin_interconnects()
    if extra_path is not None:
        path = Path(extra_path)
        if not path.is_file():
            raise ValueError(f"interconnect file {path} does not exist")
        for link in _parse(read_text(path, "the interconnect file"), str(path)):
            links[link.name] = link
    return links


def get_interconnect(name: str, links: dict[str, Interconnect] | None = None) -> Interconnect:
    """Look up one link by name, with an error that lists the valid names.

    Args:
        name: Link name, e.g. ``nvlink4``.
        links: Registry to look in (default: the built-in links).

    Returns:
        The link.
    """
    registry = builtin_interconnects() if links is None else links
    try:
        return registry[name]
    except KeyError:
        raise ValueError(
            f"unknown interconnect {name!r}; choose one of: {', '.join(sorted(registry))}"
        ) from None
