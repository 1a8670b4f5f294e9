"""Byte counts as a person reads them: the one formatter (``commprof.units``) and the places a
person reads bytes (``commprof check --cells``, the memory guard's arithmetic, figure ticks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commprof.cli import main
from commprof.reporting import viz
from commprof.units import format_bytes
from tests.conftest import write_matrix


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (4 * 2**20, "4 MiB"),
        (25 * 2**20, "25 MiB"),
        (25_276_203_008, "23.5 GiB"),  # `check --cells` printed "25,276,203,008 B"
        (1023.99 * 1024, "1 MiB"),  # rounds up into the next unit, not "1024 KiB"
        (3 * 2**40, "3 TiB"),
        (-2048, "-2 KiB"),
    ],
)
def test_format_bytes(num_bytes: float, text: str) -> None:
    assert format_bytes(num_bytes) == text


def test_format_bytes_refuses_what_is_no_count() -> None:
    with pytest.raises(ValueError, match="finite"):
        format_bytes(float("nan"))
    with pytest.raises(ValueError, match="digits"):
        format_bytes(1, digits=0)
    assert format_bytes(123_456_789, digits=5) == "117.74 MiB"


def test_figure_ticks_use_the_same_formatter() -> None:
    assert viz.bytes_label(64 * 2**10) == format_bytes(64 * 2**10) == "64 KiB"


def test_check_cells_prints_budgets_in_binary_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = write_matrix(
        tmp_path / "tight.yaml",
        "name: tight\naxes:\n  model: [srn-1m]\n  world_size: [2]\n  bucket_cap_mb: [25]\n"
        "budget:\n  host_ram_bytes: 25276203\n",
    )
    assert main(["check", str(matrix), "--cells"]) == 0
    out = capsys.readouterr().out
    assert "REJECTED" in out and "budget 24.1 MiB: OVER BUDGET" in out
    assert not re.search(r"\d{1,3}(,\d{3})+ B\b", out)  # no byte count a person must count
