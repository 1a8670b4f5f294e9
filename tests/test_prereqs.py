"""The rule for tests that need what a plain clone lacks: skipped there, failed under CI."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

INNER = """
import pytest
from tests.prereqs import needs

@needs({path!r})
def test_reads_the_folder():
    pass

@needs(tool="no-such-program-commprof")
def test_runs_the_program():
    pass
"""


@pytest.mark.parametrize("ci", ["", "1"])
def test_missing_prerequisites_skip_or_fail(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    repo = Path(__file__).resolve().parent.parent
    missing = pytester.path / "no-such-folder"
    pytester.makepyfile(test_inner=INNER.format(path=str(missing)))
    pytester.makeconftest("from tests.conftest import pytest_configure, pytest_runtest_setup\n")
    monkeypatch.setenv("PYTHONPATH", str(repo))  # the subprocess imports tests.prereqs
    monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    if ci:
        result.assert_outcomes(errors=2)  # failed in setup: the run fails
        result.stdout.fnmatch_lines(["*is missing, and CI is set*"])
    else:
        result.assert_outcomes(skipped=2)
        result.stdout.fnmatch_lines([f"*needs the folder {missing}*", "*no-such-program*"])


def test_a_present_folder_runs(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Path(__file__).resolve().parent.parent
    pytester.makepyfile(test_inner=INNER.format(path=str(repo)).split("@needs(tool")[0])
    pytester.makeconftest("from tests.conftest import pytest_configure, pytest_runtest_setup\n")
    monkeypatch.setenv("PYTHONPATH", str(repo))  # the subprocess imports tests.prereqs
    monkeypatch.setenv("CI", "1")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
