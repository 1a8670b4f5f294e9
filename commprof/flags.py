"""Value types of command-line flags shared by the commands (``commprof`` and the sweep driver).

Each turns one flag's text into a checked value or raises ``argparse.ArgumentTypeError`` with
what to give instead, so argparse names the flag.
"""

from __future__ import annotations

import argparse
import math

from commprof.caps import parse_cap
from commprof.matrix import MAX_ATTEMPTS, MAX_TIMEOUT_S


def seconds(text: str) -> float:
    """A timeout flag: a finite number of seconds in (0, a week]; NaN would disable the limit."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds in (0, {MAX_TIMEOUT_S:g}]")
    return value


def wait_seconds(text: str) -> float:
    """A waiting flag: like :func:`seconds`, and 0 (do not wait) is allowed."""
    return 0.0 if text.strip() in ("0", "0.0") else seconds(text)


def attempts(text: str) -> int:
    """An attempts flag: a whole number in [1, ``MAX_ATTEMPTS``], as a matrix's limit."""
    value = positive_int(text)
    if value > MAX_ATTEMPTS:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number <= {MAX_ATTEMPTS}")
    return value


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
