"""Every published link's conversion recomputed from its stated inputs."""

from __future__ import annotations

import datetime
from importlib import resources
from pathlib import Path

import pytest

from commprof.modeling.collective.interconnects import (
    builtin_interconnects,
    get_interconnect,
    load_interconnects,
)

# The conversion written out independently of the module: scale to base units,
# bits to bytes, lanes, payload fraction, halve bidirectional totals.
SCALE = {"GB/s": 1e9, "TB/s": 1e12, "Gb/s": 1e9 / 8, "Tb/s": 1e12 / 8, "GT/s": 1e9 / 8}


def test_at_least_eight_links_with_sources() -> None:
    links = builtin_interconnects()
    assert len(links) >= 8
    for name in (
        "nvlink3",
        "nvlink4",
        "nvlink5",
        "pcie4-x16",
        "pcie5-x16",
        "ib-hdr",
        "ib-ndr",
        "100gbe",
        "400gbe",
    ):
        assert name in links
    for link in links.values():
        assert link.url.startswith("https://"), link.name
        assert link.source_title and link.published and link.conversion
        datetime.date.fromisoformat(link.accessed)


@pytest.mark.parametrize("name", sorted(builtin_interconnects()))
def test_conversion_recomputed_from_inputs(name: str) -> None:
    link = builtin_interconnects()[name]
    num, den = link.encoding
    value = link.published_value * SCALE[link.published_unit] * link.lanes * num / den
    if link.basis == "bidirectional-total":
        value /= 2
    assert link.per_direction_bytes_per_s == pytest.approx(value, rel=1e-9)


def test_known_values() -> None:
    links = builtin_interconnects()
    assert links["nvlink4"].per_direction_bytes_per_s == 450e9
    assert links["pcie4-x16"].per_direction_bytes_per_s == pytest.approx(16e9 * 16 * 128 / 130 / 8)
    assert links["ib-ndr"].per_direction_bytes_per_s == 50e9


def test_data_file_is_ascii() -> None:
    data = (
        resources.files("commprof.modeling.collective").joinpath("interconnects.yaml").read_bytes()
    )
    data.decode("ascii")


def test_user_links_added_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "links.yaml"
    path.write_text(
        "links:\n"
        "  - name: my-eth\n    published_value: 25\n    published_unit: Gb/s\n"
        "    basis: per-direction\n"
    )
    links = load_interconnects(path)
    assert links["my-eth"].per_direction_bytes_per_s == pytest.approx(25e9 / 8)
    assert "nvlink4" in links
    path.write_text(
        "links:\n"
        "  - name: bad\n    published_value: 25\n    published_unit: Gb/s\n"
        "    basis: per-direction\n    per_direction_bytes_per_s: 25.0e9\n"
    )
    with pytest.raises(ValueError, match="disagrees"):
        load_interconnects(path)
    path.write_text(
        "links:\n  - name: x\n    published_value: 1\n    published_unit: furlong\n"
        "    basis: per-direction\n"
    )
    with pytest.raises(ValueError, match="published_unit"):
        load_interconnects(path)


def test_unknown_link_lists_choices() -> None:
    with pytest.raises(ValueError, match="nvlink4"):
        get_interconnect("carrier-pigeon")
