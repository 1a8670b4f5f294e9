"""README.md as a newcomer reads it: short, every command in it run by a test, every link
landing. The commands: the demo's sweep and report (``test_demo_report``, taken from the README's
first block), the cluster block (``test_ray_start``), and the commands table (here: each
command's ``--help``, which the table sends the reader to)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commprof import cli

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
MAX_WORDS = 1500
"""Read in about ten minutes."""


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_short() -> None:
    assert len(README.split()) < MAX_WORDS


def test_every_table_command_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    table = README[README.index("## Commands") :]
    commands = re.findall(r"^\| `commprof (\w+)` \|", table, re.M)
    assert len(commands) >= 8, commands
    for command in commands:
        with pytest.raises(SystemExit) as done:
            cli.main([command, "--help"])
        assert done.value.code == 0, command
        assert f"commprof {command}" in capsys.readouterr().out


def test_every_link_lands() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]+))?\)", README)
    assert links
    for path, anchor in links:
        target = REPO / path
        assert target.exists(), path
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, (path, anchor)


def test_the_cluster_block_is_the_tests() -> None:
    from tests.test_ray_start import readme_cluster_block

    lines = readme_cluster_block()
    assert any(line.startswith("ray start --head") for line in lines)
    assert any(line.startswith("RAY_ADDRESS=") for line in lines)
    assert any("--address" in line and "run_matrix.py" in line for line in lines)
