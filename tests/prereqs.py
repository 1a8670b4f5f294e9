"""The one rule for tests that need something outside the repository: skipped, with a reason
naming it, on a plain clone; failed under CI, so CI never skips them silently."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

IN_CI = bool(os.environ.get("CI"))
"""CI sets ``CI`` (and ``.ci/run`` does): there a missing prerequisite fails instead of skipping."""
REALTRACES = Path(__file__).resolve().parents[2] / "shared" / "realtraces"
"""Third-party Kineto traces beside the clone (``../shared/realtraces``): read in place, never
copied into the project. A plain clone has no such folder, CI does."""


def needs(path: Path | None = None, *, tool: str | None = None) -> pytest.MarkDecorator:
    """Mark a test (or a module, as ``pytestmark``) that needs a folder outside the repository or
    a program on PATH: skipped, with a reason naming it, where it is missing; failed under CI.

    Args:
        path: a folder the test reads (e.g. :data:`REALTRACES`).
        tool: a program the test runs (e.g. ``latexmk``).
    """
    return pytest.mark.needs(path=path, tool=tool)


def check_needs(item: pytest.Item) -> None:
    """Skip or fail ``item`` (``pytest_runtest_setup``) where what its ``needs`` marks name is
    missing."""
    for mark in item.iter_markers("needs"):
        path, tool = mark.kwargs.get("path"), mark.kwargs.get("tool")
        missing = []
        if path is not None and not Path(path).is_dir():
            missing.append(f"the folder {path}")
        if tool is not None and shutil.which(tool) is None:
            missing.append(f"the program {tool!r} on PATH")
        if not missing:
            continue
        what = " and ".join(missing)
        if IN_CI:
            pytest.fail(f"{what} is missing, and CI is set: CI must not skip this test")
        pytest.skip(f"needs {what} (CI has it; skipped here)")
