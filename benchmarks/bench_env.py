"""The machine and versions a benchmark ran on, recorded in every result file."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import torch


def environment(when: str) -> dict[str, Any]:
    """Versions, core count and the UTC date, with the 1-minute load average now.

    Args:
        when: ``start`` or ``end`` of the benchmark: names the load key
            (``load_avg_1m_at_start`` or ``load_avg_1m_at_end``).
    """
    if when not in ("start", "end"):
        raise ValueError(f"when must be 'start' or 'end', got {when!r}")
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        f"load_avg_1m_at_{when}": os.getloadavg()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
