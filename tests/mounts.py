"""Filesystems a test needs and the machine must not give up: a small tmpfs to fill, a folder
made read-only, each in a private mount namespace (``unshare -m``; ``unshare -r -m`` for a user
that is not root), gone when the command ends. Root ignores permission bits, so a read-only
folder is a read-only bind mount, not a ``chmod``."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence

import pytest

from tests.prereqs import IN_CI

UNSHARE = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
"""A private mount namespace (a user namespace too where this is not root)."""


def tmpfs(folder: str, size: str) -> str:
    """Shell text that mounts a tmpfs of ``size`` (``32k``) on ``folder``."""
    q = shlex.quote(folder)
    return f"mkdir -p {q} && mount -t tmpfs -o size={size} tmpfs {q}"


def read_only(folder: str) -> str:
    """Shell text that makes ``folder`` read-only (a read-only bind mount onto itself)."""
    q = shlex.quote(folder)
    return f"mount --bind {q} {q} && mount -o remount,bind,ro {q}"


def run_mounted(setup: str, script: str, *, env: dict[str, str], timeout: float) -> str:
    """Run shell ``script`` after ``setup`` in a private mount namespace; its stdout and stderr.

    Skips where no mount namespace can be made here (fails under CI, as a missing prerequisite).
    """
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        why = f"no private mount namespace here ({probe.stderr.strip()[:200]})"
        if IN_CI:
            pytest.fail(f"{why}, and CI is set")
        pytest.skip(why)
    done = subprocess.run(
        [*UNSHARE, "sh", "-c", f"{setup} && {{ {script} ; }} 2>&1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"the mounted command failed: {done.stdout[-3000:]}"
    return done.stdout


def argv(*words: str | os.PathLike[str]) -> str:
    """A shell command line of ``words``, each quoted."""
    return " ".join(shlex.quote(str(w)) for w in words)


def lines_of(text: str, prefix: str) -> Sequence[str]:
    """The lines of ``text`` that start with ``prefix``."""
    return [line for line in text.splitlines() if line.startswith(prefix)]
