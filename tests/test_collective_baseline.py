"""The benchmark's frozen copy of main's calibration (``benchmarks/collective_baseline.py``): the
model's later changes must not move it."""

from __future__ import annotations

import sys
from pathlib import Path

from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import BASE_LAT_US, HW_LAT_US, latency_parts
from commprof.modeling.collective.nccl_search import search

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import collective_baseline  # noqa: E402


def test_main_broadcast_pays_one_hop_whatever_the_search_says_of_same_channels() -> None:
    cluster = load_cluster("abci-a100")
    # 4 nodes of 8 GPUs with 4 NICs: the live search drops sameChannels, so the model's ring
    # broadcast pays a network hop a rank; main's table read one hop at every world size.
    assert not search(cluster, 4).ring.same_channels
    live = sum(latency_parts(cluster, 32, "broadcast", "ring", "Simple"))
    assert live == BASE_LAT_US["ring"][2] + 32 * HW_LAT_US["net"]["tree"][2]
    entries = collective_baseline.table(cluster, 32, "broadcast")
    for pi, proto in enumerate(("LL", "LL128", "Simple")):
        one_hop = BASE_LAT_US["ring"][pi] + HW_LAT_US["net"]["ring"][pi]
        assert entries[("ring", proto)][0] == one_hop


def test_main_all_reduce_latencies_are_nccl_tuning_terms() -> None:
    cluster = load_cluster("abci-a100")
    entries = collective_baseline.table(cluster, 32, "all_reduce")
    # ring: 2(p - 1) steps, 2N of them on the network, the others at least the net overhead
    # (3 us for Simple); tree: 2(g - 1) NVLink hops and 2 log2(N) network levels
    assert entries[("ring", "Simple")][0] == 8.4 + (62 - 8) * 3.4 + 8 * 14.0
    assert entries[("tree", "Simple")][0] == 0.0 + 2 * 7 * 28.0 + 2 * 2 * 28.0
