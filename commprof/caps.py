"""DDP's bucket cap as one value type: a number of MiB, or DDP's own default.

A cap left unset (``null`` in a matrix, ``default`` on the command line, ``None`` in a ``Cell``)
is DDP's default: 25 MiB with a first bucket of 1 MiB (``DistributedDataParallel``'s
``bucket_cap_mb``). The dataset keeps it as a null, which pandas reads back as NaN. Every place
that reads a cap, compares two or prints one goes through this module, so NaN, None and the label
are decided once.
"""

from __future__ import annotations

import math
from typing import Any

DEFAULT_LABEL = "DDP default"
"""How a person reads the unset cap, everywhere (tables, figures, reports, the command line)."""
DEFAULT_WORD = "default"
"""The unset cap on the command line (``--bucket-cap-mb default``) and in narrow columns."""
MIN_CAP_MB = 2.0**-20
"""Smallest cap: one byte. DDP keeps ``int(bucket_cap_mb * 2**20)`` bytes; below one byte that
is 0 (and the guard's bucket count divides by it)."""
MAX_CAP_MB = 2.0**20
"""Largest cap: 1 TiB. Any cap past the model's size makes one bucket; past about 8.8e12 MiB
DDP's byte count leaves int64 and the ranks fail (1e300, and 1e308 whose bytes overflow to
infinity)."""


def check_cap_mb(value: float | None, key: str = "bucket_cap_mb") -> float | None:
    """A cap as DDP can take it: None (DDP's default), or MiB in [``MIN_CAP_MB``,
    ``MAX_CAP_MB``] as a float.

    Args:
        value: the cap.
        key: what to name in the error (a matrix key or a flag).

    Raises:
        ValueError: naming ``key``, the value and the range.
    """
    if value is None:
        return None
    try:
        number = float(value)
    except OverflowError:  # a whole number past the float range: too large as well
        number = math.inf
    if not (math.isfinite(number) and MIN_CAP_MB <= number <= MAX_CAP_MB):
        raise ValueError(
            f"{key} must be between 1 byte ({MIN_CAP_MB:.3g} MiB) and 1 TiB "
            f"({MAX_CAP_MB:.0f} MiB), or null for DDP's default ({DEFAULT_WORD!r} on the "
            f"command line); got {number:g}"
        )
    return number


def cap_mb(value: Any) -> float | None:
    """A stored cap as the cell's cap: None (DDP's default) for a null or NaN, else MiB."""
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def same_cap(a: Any, b: Any) -> bool:
    """Equal caps, two unset caps (None or NaN) counting equal."""
    return cap_mb(a) == cap_mb(b)


DDP_DEFAULT_CAP_MB = 25.0
"""DDP's default ``bucket_cap_mb`` (its first bucket is 1 MiB); ``modeling.buckets`` takes it
from here."""


def cap_label(value: Any, *, with_size: bool = False) -> str:
    """A cap as a person reads it: ``0.25 MiB``, or ``DDP default`` (``with_size``: ``DDP
    default (25 MiB)``, where the reader may not know DDP's number)."""
    mb = cap_mb(value)
    if mb is None:
        return f"{DEFAULT_LABEL} ({DDP_DEFAULT_CAP_MB:g} MiB)" if with_size else DEFAULT_LABEL
    return f"{mb:g} MiB"


def cap_number(value: Any) -> str:
    """A cap in a column already headed in MiB: ``0.25``, or ``default``."""
    mb = cap_mb(value)
    return DEFAULT_WORD if mb is None else f"{mb:g}"


def parse_cap(text: str) -> float | None:
    """A cap from the command line: a number of MiB, or ``default`` (DDP's own).

    Raises:
        ValueError: where ``text`` is neither.
    """
    if text.strip() == DEFAULT_WORD:
        return None
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number of MiB or {DEFAULT_WORD!r}") from None
    return check_cap_mb(number, "the cap")
