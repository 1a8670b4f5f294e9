"""Byte counts as a person reads them: one formatter for every message, table, figure and report.

Binary units (KiB = 2**10 bytes, MiB = 2**20, GiB = 2**30, TiB = 2**40), as DDP's
``bucket_cap_mb`` and the memory pools count them: ``512 B``, ``4 KiB``, ``1.5 MiB``,
``23.5 GiB``. A count below 1 KiB is printed whole; above it three significant digits at most,
trailing zeros dropped, so ``25,276,203,008`` bytes read ``23.5 GiB``. Datasets keep bytes as
integers; only what a person reads goes through here. This module imports nothing beyond the
standard library.
"""

from __future__ import annotations

import math

BINARY_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
"""The units past bytes, largest first, with their size in bytes."""


def format_bytes(num_bytes: float, *, digits: int = 3) -> str:
    """A byte count in the largest binary unit that keeps it at 1 or more.

    Args:
        num_bytes: bytes (an int, or a float such as a mean); negative counts keep their sign.
        digits: significant digits past 1 KiB (at least 1); whole bytes below it.

    Returns:
        The text, e.g. ``512 B``, ``4 KiB``, ``1.5 MiB``, ``23.5 GiB``.

    Raises:
        ValueError: a count that is not finite, or ``digits`` below 1.
    """
    if not math.isfinite(num_bytes):
        raise ValueError(f"num_bytes must be finite, got {num_bytes!r}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits!r}")
    sign = "-" if num_bytes < 0 else ""
    size = abs(float(num_bytes))
    if round(size) < BINARY_UNITS[-1][1]:
        return f"{sign}{round(size):d} B"
    unit, scale = next((u, s) for u, s in BINARY_UNITS if size >= s * (1 - 0.5 * 10.0**-digits))
    value = size / scale
    # significant digits, never fewer than the integer part needs (1000 KiB stays whole)
    decimals = max(0, digits - 1 - math.floor(math.log10(value))) if value >= 1 else digits - 1
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{sign}{text} {unit}"


def finite_or_none(value: float) -> float | None:
    """``value``, or None (JSON null) where it is infinite or NaN."""
    return value if math.isfinite(value) else None
