"""The collective model: NCCL's formulas in closed form, its algorithm and protocol choice."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from commprof.modeling.clusters import load_cluster
from commprof.modeling.collectives import (
    BASE_LAT_US,
    CORRECTIONS,
    HW_LAT_US,
    NCCL_BUFFSIZE_BYTES,
    NET_OVERHEAD_US,
    NO_CORRECTIONS,
    RING_PLATEAU,
    Calibration,
    bus_factor,
    predict,
    table,
)

A100 = load_cluster("dgx-a100")
H100 = load_cluster("dgx-h100")


def test_one_node_ring_simple_in_closed_form() -> None:
    p = 8
    lat, algbw = table(A100, p)[("ring", "Simple")]
    # base 8.4 us + 2(p-1) NVLink ring steps of 3.4 us
    assert lat == pytest.approx(
        BASE_LAT_US["ring"][2] + 2 * (p - 1) * HW_LAT_US["nvlink"]["ring"][2]
    )
    # busBw = 300 GB/s x 0.8; algbw = busBw x p / (2 (p - 1))
    assert algbw == pytest.approx(300.0 * 0.8 * p / (2 * (p - 1)))
    n = 1 << 30
    (row,) = predict(A100, p, [n])
    assert (row.algorithm, row.protocol) == ("ring", "Simple")
    assert row.time_us == pytest.approx(lat + n / (1000.0 * algbw))
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 2 * (p - 1) / p)


def test_multi_node_ring_is_bounded_by_the_nodes_nics() -> None:
    p, nodes = 32, 4
    lat, algbw = table(A100, p)[("ring", "Simple")]
    b_net = 8 * 25.0 * 0.96  # 8 HDR NICs of a node, NCCL's 24 GB/s step each
    assert algbw == pytest.approx(min(240.0, b_net) * p / (2 * (p - 1)))
    nsteps, ninter = 2 * (p - 1), 2 * nodes
    intra = max(HW_LAT_US["nvlink"]["ring"][2], 3 * NET_OVERHEAD_US)
    expected = (
        BASE_LAT_US["ring"][2] + (nsteps - ninter) * intra + ninter * HW_LAT_US["net"]["ring"][2]
    )
    assert lat == pytest.approx(expected)
    n = 1 << 30  # the plateau applies to large multi-node Simple rings
    time = predict(A100, p, [n], algorithms=["ring"])[0]
    assert time.protocol in ("Simple", "LL128")
    simple = lat * RING_PLATEAU + n / (1000.0 * algbw)
    assert time.time_us <= simple + 1e-9


def test_tree_latency_grows_with_log_of_nodes() -> None:
    lats = {}
    for p in (16, 32, 64, 128):
        lat, _ = table(A100, p)[("tree", "LL")]
        lats[p] = lat
    nodes = {16: 2, 32: 4, 64: 8, 128: 16}
    step = 2 * HW_LAT_US["net"]["tree"][0]
    for p in (32, 64, 128):
        assert lats[p] - lats[16] == pytest.approx(step * (math.log2(nodes[p]) - 1))


def test_small_messages_take_low_latency_protocols_large_ones_simple() -> None:
    rows = predict(A100, 64, [1 << 10, 1 << 30])
    assert rows[0].protocol in ("LL", "LL128")
    assert rows[1].protocol in ("Simple", "LL128")
    assert rows[0].time_us < rows[1].time_us


def test_nvls_only_where_the_switch_has_it() -> None:
    assert ("nvls", "Simple") in table(H100, 8)
    assert ("nvls_tree", "Simple") in table(H100, 16)
    assert not any(a.startswith("nvls") for a, _ in table(A100, 8))
    assert set(table(H100, 16, "all_gather")) <= {("ring", p) for p in ("LL", "LL128", "Simple")}


def test_more_nics_make_multi_node_faster() -> None:
    one_nic = load_cluster("a100-ethernet")
    n = 1 << 28
    assert predict(one_nic, 32, [n])[0].time_us > 5 * predict(A100, 32, [n])[0].time_us


def test_collectives_bus_factors_and_sizes() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0
    ag = predict(A100, 8, [1 << 30], "all_gather")[0]
    ar = predict(A100, 8, [1 << 30], "all_reduce")[0]
    assert ag.time_us < ar.time_us  # half the traffic of an all-reduce
    with pytest.raises(ValueError, match="choose one of"):
        predict(A100, 8, [1], "all_to_all")


def test_calibration_scales_bandwidth_and_latency() -> None:
    n = 1 << 30
    base = predict(A100, 8, [n])[0]
    slower = predict(A100, 8, [n], calibration=Calibration(intra_scale=0.5))[0]
    assert slower.time_us == pytest.approx(2 * base.time_us, rel=0.01)
    with pytest.raises(ValueError, match="intra_scale must be finite and > 0"):
        Calibration(intra_scale=0.0)


GH200 = load_cluster("gh200-slingshot")


def test_two_node_tree_is_capped_at_twice_the_network() -> None:
    # search.cc raises a tree's bwIntra only while it is below 2 bwInter: on two GH200 nodes the
    # mesh (450 GB/s x 0.824) is faster than twice the 4 NICs (4 x 25 x 0.96), so the cap binds
    b_intra, b_net = 450.0 * 0.824, 4 * 25.0 * 0.96
    _, algbw = table(GH200, 8)[("tree", "Simple")]
    assert algbw == pytest.approx(min(b_intra, 2 * b_net) * 0.92 * 0.5)
    _, uncapped = table(GH200, 8, corrections=NO_CORRECTIONS)[("tree", "Simple")]
    assert uncapped == pytest.approx(b_intra * 0.92 * 0.5)
    # on one node and past two nodes the cap is not NCCL's and does not apply
    for p in (4, 16):
        assert (
            table(GH200, p)[("tree", "Simple")]
            == table(GH200, p, corrections=NO_CORRECTIONS)[("tree", "Simple")]
        )


def test_two_node_all_reduce_pays_its_channels_buffer_fill() -> None:
    fill_bytes = A100.num_channels * NCCL_BUFFSIZE_BYTES  # 16 x 4 MiB
    no_fill = replace(CORRECTIONS, two_node_fill=False)
    for n in (1 << 20, 1 << 30):
        with_fill = predict(A100, 16, [n])[0]
        without = predict(A100, 16, [n], corrections=no_fill)[0]
        assert (with_fill.algorithm, with_fill.protocol) == (without.algorithm, without.protocol)
        _, algbw = table(A100, 16)[(with_fill.algorithm, with_fill.protocol)]
        assert with_fill.time_us - without.time_us == pytest.approx(
            min(n, fill_bytes) / (1000.0 * algbw)
        )
    for p in (8, 32):  # one node, four nodes: no fill
        assert predict(A100, p, [1 << 30])[0] == predict(A100, p, [1 << 30], corrections=no_fill)[0]
    assert (
        predict(A100, 16, [1 << 30], "all_gather")[0]
        == predict(A100, 16, [1 << 30], "all_gather", corrections=no_fill)[0]
    )  # all-reduce only: the logs that chose it are all-reduce logs
