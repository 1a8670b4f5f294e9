"""Value types of command-line flags shared by the commands (``commprof`` and the sweep driver).

Each turns one flag's text into a checked value or raises ``argparse.ArgumentTypeError`` with
what to give instead, so argparse names the flag.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from commprof.caps import parse_cap
from commprof.matrix import MAX_ATTEMPTS, MAX_TIMEOUT_S


def bounded_int(most: int, *, unit: str = "") -> Callable[[str], int]:
    """A count flag's type: a whole number in [1, ``most``].

    Args:
        most: the largest value taken.
        unit: what is counted (``ranks``), for the error; "" says nothing.
    """
    counted = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{text[:20]!r}: give at most {most:,}{counted}")
        return value

    return parse


def bounded_float(most: float, *, unit: str) -> Callable[[str], float]:
    """A quantity flag's type: a finite number in (0, ``most``]; NaN and infinities are refused
    (a NaN limit compares false, so it would disable the check it sets).

    Args:
        most: the largest value taken.
        unit: what the number is in (``seconds``, ``TFLOP/s``), for the error.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number of {unit}") from None
        if not (math.isfinite(value) and 0 < value <= most):
            raise argparse.ArgumentTypeError(f"{text[:20]!r}: give {unit} in (0, {most:g}]")
        return value

    return parse


seconds = bounded_float(MAX_TIMEOUT_S, unit="seconds")
"""A timeout flag: a finite number of seconds in (0, a week]."""


def wait_seconds(text: str) -> float:
    """A waiting flag: like :func:`seconds`, and 0 (do not wait) is allowed."""
    return 0.0 if text.strip() in ("0", "0.0") else seconds(text)


attempts = bounded_int(MAX_ATTEMPTS)
"""An attempts flag: a whole number in [1, ``MAX_ATTEMPTS``], as a matrix's limit."""


def positive_int(text: str) -> int:
    """A count flag: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value


def cap(text: str) -> float | None:
    """A bucket-cap flag: MiB, or ``default`` (DDP's own: :func:`commprof.caps.parse_cap`)."""
    try:
        return parse_cap(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
