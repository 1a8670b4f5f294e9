"""Whether a gang can ever be placed: arithmetic on node resources (no Ray)."""

from __future__ import annotations

import pytest

from commprof.sweeps.placement import bundles_on, describe, fits

CPU = {"CPU": 1.0}
GPU = {"CPU": 1.0, "GPU": 1.0}
TWO_NODES = [{"CPU": 4.0}, {"CPU": 1.0}]


def test_bundles_on_a_node_take_the_scarcest_resource() -> None:
    assert bundles_on({"CPU": 16.0, "GPU": 4.0}, GPU) == 4
    assert bundles_on({"CPU": 3.0, "GPU": 4.0}, GPU) == 3
    assert bundles_on({"CPU": 16.0}, GPU) == 0  # no GPU at all
    assert bundles_on({"CPU": 2.9999999999}, CPU) == 3  # a float sum a hair short of 3 is 3
    assert bundles_on({"CPU": 2.5}, CPU) == 2


@pytest.mark.parametrize(
    ("strategy", "world_size", "expected"),
    [
        ("STRICT_PACK", 4, True),  # the 4-CPU node alone
        ("STRICT_PACK", 5, False),
        ("STRICT_SPREAD", 2, True),  # one rank on each node
        ("STRICT_SPREAD", 3, False),  # only two nodes
        ("PACK", 5, True),  # 4 + 1
        ("SPREAD", 5, True),
        ("PACK", 6, False),
    ],
)
def test_fits_by_strategy(strategy: str, world_size: int, expected: bool) -> None:
    assert fits(TWO_NODES, CPU, world_size, strategy) is expected


def test_gpu_gangs_need_gpu_nodes() -> None:
    nodes = [{"CPU": 8.0}, {"CPU": 8.0, "GPU": 2.0}]
    assert fits(nodes, GPU, 2, "PACK") and not fits(nodes, GPU, 3, "PACK")
    assert not fits(nodes, GPU, 2, "STRICT_SPREAD")  # one node has no GPU


def test_no_nodes_and_unknown_strategies() -> None:
    assert not fits([], CPU, 1, "PACK")
    assert describe([], CPU) == "no alive node"
    assert describe(TWO_NODES, CPU) == "2 nodes that hold 4 + 1"
    with pytest.raises(ValueError, match="'RING'"):
        fits(TWO_NODES, CPU, 1, "RING")
