"""Hand-built Kineto events for trace tests (shared by the parser and metrics tests)."""

from __future__ import annotations

from typing import Any


def x(name: str, cat: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    """A complete event; ts and dur in microseconds as Kineto writes them."""
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }
