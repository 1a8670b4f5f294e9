"""Which cells of a matrix a driver run selects (``--only``, ``--exclude``).

A term is ``key=value`` or a cell-id prefix. The value is read as the key's type, the way the
matrix file reads it (YAML 1.2 numbers, YAML booleans), and compared as a value, not as text:
``bucket_cap_mb=1`` matches a cap of ``1.0``, ``bucket_cap_mb=null`` (or ``default``, as on the
command line) DDP's default cap, ``profile=yes`` a profiled cell. ``regime=cpu-gloo`` matches
backend and device together, as the matrix key does. A term that names no key, a value that is
not of the key's type, an empty term and a selection of no cell are errors, raised before
anything runs (a sweep that selects nothing would otherwise end with exit 0 and no word).

What runs next of the selected cells is :mod:`commprof.attempts`'s decision.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from commprof.caps import DEFAULT_WORD, check_cap_mb
from commprof.matrix import CELL_FIELDS, ID_FIELDS, REGIMES, Cell, field_types
from commprof.yamlio import MAX_INT_DIGITS, load_yaml, short

_CELL_ID_PREFIX = re.compile(r"[0-9a-f]{1,12}")
KEYS = (*(name for name in ID_FIELDS if CELL_FIELDS[name].setting or name == "repeat"), "regime")
"""The keys a term may name: the cell's identity fields a matrix sets, ``repeat`` and
``regime``."""

Test = Callable[[Cell], bool]


def parse_term(term: str, flag: str = "--only") -> Test:
    """A selector term as a test of a cell.

    Args:
        term: ``key=value`` or a cell-id prefix (1 to 12 hex digits).
        flag: the flag it came from, for messages.

    Raises:
        ValueError: naming the flag, the term and what to give instead.
    """
    said = f"{flag} {short(term)}"
    if not term.strip():
        raise ValueError(f"{said}: an empty term; give key=value or a cell-id prefix")
    if "=" not in term:
        if not _CELL_ID_PREFIX.fullmatch(term):
            raise ValueError(
                f"{said}: neither key=value nor a cell-id prefix (1 to 12 hex digits); keys: "
                f"{', '.join(KEYS)}"
            )
        return lambda cell: cell.cell_id.startswith(term)
    key, _, text = term.partition("=")
    key, text = key.strip(), text.strip()
    if key not in KEYS:
        raise ValueError(f"{said}: no cell key {short(key)}; keys: {', '.join(KEYS)}")
    if not text:
        raise ValueError(
            f"{said}: no value after '='; give one (null for an unset value such as DDP's "
            "default cap)"
        )
    if key == "regime":
        if text not in REGIMES:
            raise ValueError(f"{said}: regime is one of {', '.join(REGIMES)}")
        return lambda cell: cell.regime == text
    wanted = _typed(key, text, said)
    return lambda cell: _equal(getattr(cell, key), wanted)


def _typed(key: str, text: str, said: str) -> Any:
    """The value of ``text`` as field ``key`` holds it."""
    types = field_types(key)
    if str in types:
        return text  # names compare as written (a model named "1e3" stays a name)
    if key == "bucket_cap_mb" and text == DEFAULT_WORD:
        return None
    if text.lstrip("+-").isdigit() and len(text.lstrip("+-")) > MAX_INT_DIGITS:
        raise ValueError(f"{said}: {key} takes a whole number of at most {MAX_INT_DIGITS} digits")
    try:
        value = load_yaml(text, said)
    except ValueError:
        value = text
    if isinstance(value, bool) and bool not in types:
        value = text  # `true` is no count
    expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
    if not isinstance(value, types) or isinstance(value, bool) != (bool in types):
        raise ValueError(f"{said}: {key} takes {expected}, and {short(text)} is not one")
    if key == "bucket_cap_mb":
        assert value is None or isinstance(value, int | float)  # its types, checked above
        try:
            return check_cap_mb(value, key)
        except ValueError as err:
            raise ValueError(f"{said}: {err}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{said}: {key} takes a finite number")
    return value


def _equal(held: Any, wanted: Any) -> bool:
    """Typed equality: numbers by value (1 == 1.0), None only to None."""
    if held is None or wanted is None:
        return held is None and wanted is None
    return bool(held == wanted)


def select(cells: tuple[Cell, ...], only: tuple[str, ...], exclude: tuple[str, ...]) -> list[Cell]:
    """Apply the --only / --exclude filters.

    Args:
        cells: the matrix's cells.
        only: keep the cells any of these terms match (all where empty).
        exclude: then drop the cells any of these terms match.

    Raises:
        ValueError: a term is not valid, or the terms select no cell (naming them).
    """
    keep = [parse_term(t, "--only") for t in only]
    drop = [parse_term(t, "--exclude") for t in exclude]
    chosen = [c for c in cells if not keep or any(test(c) for test in keep)]
    chosen = [c for c in chosen if not any(test(c) for test in drop)]
    if cells and not chosen:
        terms = " ".join([*(f"--only {t}" for t in only), *(f"--exclude {t}" for t in exclude)])
        raise ValueError(
            f"{terms[:200]} selects none of the matrix's {len(cells)} cells; "
            "`commprof check MATRIX --cells` lists them with their values"
        )
    return chosen
