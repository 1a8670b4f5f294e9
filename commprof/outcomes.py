"""What the ranks of a cell hand back, as plain data: their errors classified, their records merged
(and the test-only faults a rank can be told to show).

Imports neither torch nor Ray, so the sweep driver (which only routes the ranks' results into the
dataset) and ``commprof run`` share it without loading the training stack.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class RankFailure(RuntimeError):
    """One or more ranks of a cell failed; the message groups their errors by text.

    Args:
        errors: each failed rank's error text.
    """

    def __init__(self, errors: dict[int, str]) -> None:
        super().__init__(group_errors(errors))
        self.errors = errors
        self.kind = classify_error_texts(errors.values())


DETERMINISTIC_ERRORS = (
    "ValueError",
    "TypeError",
    "KeyError",
    "IndexError",
    "OverflowError",
    "ZeroDivisionError",
    "NotImplementedError",
    "ConfigError",
    "MatrixError",
    "OutOfMemoryError",
)
"""Exception types raised in a rank that mean the configuration itself is at fault: running it
again gives the same error, so it is not retried."""
OOM_MARKERS = ("out of memory", "CUDA out of memory", "DefaultCPUAllocator: can't allocate")
"""Texts of an out-of-memory, which repeats at the same step when the cell runs again."""
CONFIG_MARKERS = ("Unable to find address for",)
"""Texts of a setting the ranks cannot use, which fails the same way every time: gloo's for a
``GLOO_SOCKET_IFNAME`` naming no interface of the host."""


def classify_error_texts(texts: Iterable[str]) -> str:
    """``deterministic`` (running again gives the same error) or ``transient``.

    Args:
        texts: the ranks' errors, each starting ``TypeName: message``.
    """
    for text in texts:
        type_name = text.strip().partition(":")[0].rpartition(".")[2]
        if type_name in DETERMINISTIC_ERRORS or any(
            m in text for m in (*OOM_MARKERS, *CONFIG_MARKERS)
        ):
            return "deterministic"
    return "transient"


def group_errors(errors: dict[int, str]) -> str:
    """``{rank: text}`` -> one message, ranks with the same first line grouped together."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(errors.items()):
        by_text.setdefault(text.strip().splitlines()[0] if text.strip() else "?", []).append(rank)
    parts = [f"ranks {ranks}: {text}" for text, ranks in by_text.items()]
    return f"{len(errors)} rank(s) failed; " + "; ".join(parts)


def merge_rank_records(per_rank: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Concatenate the ranks' records table by table."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for result in per_rank:
        for table, rows in result["records"].items():
            merged.setdefault(table, []).extend(rows)
    return merged


def merge_rank_traces(per_rank: list[dict[str, Any]]) -> dict[str, bytes]:
    """The ranks' compressed traces by file name (names carry the rank)."""
    return {name: data for result in per_rank for name, data in result.get("traces", {}).items()}


def inject_fault(fault: dict[str, Any]) -> None:
    """Test-only faults: what a crashing or a stuck rank looks like to the driver.

    Args:
        fault: ``{"kind": "raise" | "hang"}``; a raise is a RuntimeError, or the ValueError
            ``fault["error"]`` names (a deterministic failure).
    """
    if fault["kind"] == "hang":
        while True:
            time.sleep(3600)
    if fault["kind"] == "raise":
        error = {"RuntimeError": RuntimeError, "ValueError": ValueError}[
            fault.get("error", "RuntimeError")
        ]
        raise error(f"injected fault: {fault}")
    raise ValueError(f"unknown fault kind {fault['kind']!r}; use raise or hang")
