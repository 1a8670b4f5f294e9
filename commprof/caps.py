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


def cap_mb(value: Any) -> float | None:
    """A stored cap as the cell's cap: None (DDP's default) for a null or NaN, else MiB."""
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def same_cap(a: Any, b: Any) -> bool:
    """Equal caps, two unset caps (None or NaN) counting equal."""
    return cap_mb(a) == cap_mb(b)


def cap_label(value: Any) -> str:
    """A cap as a person reads it: ``0.25 MiB``, or ``DDP default``."""
    mb = cap_mb(value)
    return DEFAULT_LABEL if mb is None else f"{mb:g} MiB"


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
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of MiB or {DEFAULT_WORD!r}") from None
