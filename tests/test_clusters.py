"""Cluster descriptions: bundled entries, a user's file validated with file, key and value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from commprof.modeling.collective.clusters import (
    builtin_clusters,
    default_net_efficiency,
    load_cluster,
)


def test_bundled_clusters_carry_their_sources() -> None:
    clusters = builtin_clusters()
    assert {"dgx-a100", "dgx-h100", "pcie-a100x8", "a100-ethernet"} <= set(clusters)
    for cluster in clusters.values():
        figures = {s["figure"] for s in cluster.sources}
        assert {"intra_bytes_per_s"} <= figures, cluster.name
        for src in cluster.sources:
            assert src["url"].startswith("https://") and src["accessed"] and src["conversion"]
    a100 = clusters["dgx-a100"]
    assert a100.intra_bytes_per_s == 600e9 / 2  # 600 GB/s total NVLink 3, halved
    assert a100.nic_bytes_per_s == 200e9 / 8  # HDR 200 Gb/s
    assert a100.net_efficiency == pytest.approx(24.0 / 25.0)  # NCCL's search step under 25 GB/s


def test_net_efficiency_is_ncclss_search_step() -> None:
    assert default_net_efficiency(50e9) == pytest.approx(48.0 / 50.0)
    assert default_net_efficiency(12.5e9) == pytest.approx(12.0 / 12.5)
    assert default_net_efficiency(0.0) == 1.0


def test_world_sizes_fill_whole_nodes() -> None:
    a100 = load_cluster("dgx-a100")
    assert a100.nodes_for(4) == 1 and a100.nodes_for(8) == 1 and a100.nodes_for(128) == 16
    with pytest.raises(ValueError, match="multiple of its 8 GPUs per node"):
        a100.nodes_for(12)
    with pytest.raises(ValueError, match="has 128 GPUs"):
        a100.nodes_for(256)


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(body)
    return path


GOOD = """clusters:
  - name: mine
    gpus_per_node: 4
    num_nodes: 2
    intra_fabric: nvswitch
    intra_bytes_per_s: 300.0e9
    intra_efficiency: 0.8
    nics_per_node: 4
    nic_bytes_per_s: 25.0e9
"""


def test_a_users_file_loads(tmp_path: Path) -> None:
    cluster = load_cluster(_write(tmp_path, GOOD))
    assert cluster.name == "mine" and cluster.max_world_size == 8
    assert cluster.net_efficiency == pytest.approx(0.96)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("    colour: blue\n", "unknown keys \\['colour'\\]"),
        ("    gpus_per_node: 4\n", "given twice"),
        ("    nvls: 1\n", "nvls must be bool, got 1"),
    ],
)
def test_a_bad_users_file_names_file_key_and_value(
    tmp_path: Path, change: str, message: str
) -> None:
    path = _write(tmp_path, GOOD + change)
    with pytest.raises(ValueError, match=message) as err:
        load_cluster(path)
    assert str(path) in str(err.value)


def test_bad_values_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("intra_fabric: nvswitch", "intra_fabric: copper"))
    with pytest.raises(ValueError, match="intra_fabric 'copper'"):
        load_cluster(path)
    path = _write(tmp_path, GOOD.replace("intra_efficiency: 0.8", "intra_efficiency: 1.5"))
    with pytest.raises(ValueError, match=r"intra_efficiency must be in \(0, 1\], got 1.5"):
        load_cluster(path)
    with pytest.raises(ValueError, match="neither a bundled cluster"):
        load_cluster(tmp_path / "absent.yaml")


def test_nic_path_through_the_cpu_turns_ll128_off_across_nodes_only(tmp_path: Path) -> None:
    mine = load_cluster(_write(tmp_path, GOOD))
    assert mine.nic_path == "pxb" and mine.ll128_on(1) and mine.ll128_on(2)
    gh200 = load_cluster("gh200-slingshot")  # NICs on the Grace CPU's PCIe: PHB
    assert gh200.nic_path == "phb" and gh200.ll128_on(1) and not gh200.ll128_on(2)
    path = _write(tmp_path, GOOD + "    nic_path: sys\n")
    with pytest.raises(ValueError, match=r"nic_path 'sys' is not one of \['pxb', 'phb'\]"):
        load_cluster(path)
