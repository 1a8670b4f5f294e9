"""The machine and versions a benchmark ran on, recorded in every result file."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import torch


def environment() -> dict[str, Any]:
    """Versions, core count and the 1-minute load average now, with the UTC date."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
