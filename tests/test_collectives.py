"""The collective model: NCCL's formulas in closed form, its algorithm and protocol choice."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import (
    BASE_LAT_US,
    CORRECTIONS,
    HW_LAT_US,
    NCCL_BUFFSIZE_BYTES,
    NET_OVERHEAD_US,
    NO_CORRECTIONS,
    RING_PLATEAU,
    bus_factor,
    predict,
    table,
)
from commprof.modeling.collective.nccl_search import Graph, search

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
    # NCCL's search: 8 ring channels, one an HDR NIC at its 24 GB/s step (nccl_search)
    assert algbw == pytest.approx(8 * 24.0 * p / (2 * (p - 1)))
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


GH200 = load_cluster("gh200-slingshot")
OCI = load_cluster("oci-bm-gpu4.8")
V100 = load_cluster("abci-v100")


def test_search_gives_one_ring_channel_a_nic_at_the_speed_step_under_its_rate() -> None:
    # 8 HDR NICs of 25 GB/s: speedArrayInter's 24 GB/s step, one channel a NIC (2 x 24 > 25);
    # not doubled (ncclTopoDupChannels needs bwIntra >= 25); the tree then raises bwIntra while
    # below 2 x 24 and 8 channels x bwIntra x 7/8 (each GPU forwards 7 of 8) fit 240 GB/s: 30
    graphs = search(A100, 2)
    ring = Graph(num_channels=8, bw_intra_gbps=24.0, bw_inter_gbps=24.0, same_channels=False)
    assert graphs.ring == ring
    assert graphs.tree == Graph(num_channels=8, bw_intra_gbps=30.0, bw_inter_gbps=24.0)
    assert 8 * 48.0 * 7 / 8 > 300 * 0.8 >= 8 * 30.0 * 7 / 8
    assert graphs.runtime_channels == 16  # ncclTopoPostset doubles them
    # 16 NICs of 12.5 GB/s: 16 channels of 12 (MAXCHANNELS / 2), tree bwIntra 15 (16 x 18 x 7/8
    # = 252 > 240)
    oci = search(OCI, 2)
    ring = Graph(num_channels=16, bw_intra_gbps=12.0, bw_inter_gbps=12.0, same_channels=False)
    assert oci.ring == ring
    assert oci.tree == Graph(num_channels=16, bw_intra_gbps=15.0, bw_inter_gbps=12.0)
    # one A100 node: 6 channels of 40 fill 240 GB/s, doubled to 12 of 20
    assert search(A100, 1).ring == Graph(num_channels=12, bw_intra_gbps=20.0, bw_inter_gbps=20.0)


def test_per_channel_caps_bind_on_eight_channels_not_on_sixteen() -> None:
    ring_ll128 = table(A100, 16)[("ring", "LL128")][1]
    assert ring_ll128 == pytest.approx(min(8 * 24 * 0.92, 8 * 20.0) * 16 / 30)  # cap: 160
    tree_simple = table(A100, 16)[("tree", "Simple")][1]
    assert tree_simple == pytest.approx(min(8 * 30 * 0.92, 8 * 23.6) * 0.5)  # cap: 188.8
    tree_ll128 = table(A100, 16)[("tree", "LL128")][1]
    assert tree_ll128 == pytest.approx(min(8 * 23.6 * 120 / 128, 8 * 20.0) * 0.5)
    # past two nodes a tree runs at bwInter, capped at 8 x 17.8
    assert table(A100, 32)[("tree", "Simple")][1] == pytest.approx(8 * 17.8 * 0.5)
    # OCI's 16 channels: no cap binds
    oci_tree = table(OCI, 16)[("tree", "LL128")][1]
    assert oci_tree == pytest.approx(16 * 15 * 0.92 * 120 / 128 * 0.5)


def test_two_node_choice_follows_the_channels() -> None:
    # DGX A100 pair: LL128 capped at 160 GB/s, ring Simple (192 GB/s) takes over by 128 MiB;
    # OCI's 16 channels keep tree LL128 (207 GB/s) to 512 MiB, tree Simple from 1 GiB
    a100 = predict(A100, 16, [1 << 27, 1 << 30])
    assert [(r.algorithm, r.protocol) for r in a100] == [("ring", "Simple")] * 2
    oci = predict(OCI, 16, [1 << 26, 1 << 29, 1 << 30])
    assert [(r.algorithm, r.protocol) for r in oci] == [
        ("tree", "LL128"),
        ("tree", "LL128"),
        ("tree", "Simple"),
    ]


def test_two_node_tree_stays_under_twice_the_network() -> None:
    # GH200: 4 NICs, 4 channels of 24; tree bwIntra raised to 48 = 2 x 24 (the search's
    # bwIntra < 2 bwInter), then tuning.cc's per-channel tree cap 4 x 41.4 binds
    graphs = search(GH200, 2)
    assert graphs.tree == Graph(num_channels=4, bw_intra_gbps=48.0, bw_inter_gbps=24.0)
    _, algbw = table(GH200, 8)[("tree", "Simple")]
    assert algbw == pytest.approx(min(4 * 48 * 0.92, 4 * 41.4) * 0.5)


def test_no_ll128_across_nodes_on_a_nic_path_through_the_cpu() -> None:
    # GH200: the NIC on the Grace CPU's PCIe (PHB), so NCCL (tuning.cc, v2.19 to v2.26) enables
    # LL128 on one node only; the other entries are those of a PXB description
    assert {p for _, p in table(GH200, 4)} == {"LL", "LL128", "Simple"}
    pxb = replace(GH200, nic_path="pxb")
    for ranks in (8, 32):
        entries = table(GH200, ranks)
        assert {p for _, p in entries} == {"LL", "Simple"}
        assert entries == {k: v for k, v in table(pxb, ranks).items() if k[1] != "LL128"}
    assert {r.protocol for r in predict(GH200, 32, [1 << k for k in range(10, 31)])} <= {
        "LL",
        "Simple",
    }


def test_nvls_heads_count_twice_on_their_links() -> None:
    # 8 heads of bwIntra s need (8 + 1) s <= 18 x 20.6 GB/s: s = 40 (sm90 steps 60, 50, 40)
    one = search(H100, 1).nvls
    assert one == Graph(num_channels=8, bw_intra_gbps=40.0, bw_inter_gbps=40.0)
    assert table(H100, 8)[("nvls", "Simple")][1] == pytest.approx(8 * 40 * 5 / 6)
    # two nodes: bwInter raised to the NIC's 48; NVLSTree busBw 8 x min(40, 48)
    two = search(H100, 2).nvls
    assert two == Graph(num_channels=8, bw_intra_gbps=40.0, bw_inter_gbps=48.0)
    algbw = table(H100, 16)[("nvls_tree", "Simple")][1]
    assert algbw == pytest.approx(8 * 40 * 5 / 6)
    assert algbw * bus_factor("all_reduce", 16) == pytest.approx(500.0)  # not 578
    # past two nodes the network's half: 8 x min(40, 48 / 2)
    assert table(H100, 32)[("nvls_tree", "Simple")][1] == pytest.approx(8 * 24 * 5 / 6)


def test_broadcast_pays_one_hop_with_same_channels_and_one_node_ll_a_third() -> None:
    # one DGX A100 node: every channel one GPU order (NVSwitch), one NVLink hop
    lat, _ = table(A100, 8, "broadcast")[("ring", "Simple")]
    assert lat == pytest.approx(BASE_LAT_US["ring"][2] + HW_LAT_US["nvlink"]["ring"][2])
    # one NIC a node: replayed channels reach it, one network hop
    one_nic = replace(A100, nics_per_node=1)
    assert search(one_nic, 2).ring.same_channels
    lat, _ = table(one_nic, 16, "broadcast")[("ring", "LL")]
    assert lat == pytest.approx(BASE_LAT_US["ring"][0] + HW_LAT_US["net"]["ring"][0])
    _, ag_ll = table(A100, 8, "all_gather")[("ring", "LL")]
    assert ag_ll == pytest.approx(min(87.7, 12 * 20 / 3.0) * 8 / 7)
    _, ar_ll = table(A100, 8)[("ring", "LL")]
    assert ar_ll == pytest.approx(min(87.7, 12 * 20 / 4.0) * 8 / 14)


def test_pinned_channels_override_the_search() -> None:
    pinned = replace(A100, num_channels=4)
    graphs = search(pinned, 2)
    assert graphs.ring.num_channels == graphs.tree.num_channels == 4
    assert table(pinned, 16)[("ring", "Simple")][1] == pytest.approx(4 * 24 * 16 / 30)


def test_two_node_all_reduce_pays_its_channels_buffer_fill() -> None:
    fill_bytes = search(A100, 2).runtime_channels * NCCL_BUFFSIZE_BYTES  # 16 x 4 MiB
    assert fill_bytes == 64 << 20
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
    assert no_fill == NO_CORRECTIONS


def test_same_channels_where_one_gpu_order_carries_every_channel() -> None:
    # search.cc: channels replaying channel 0's GPU order enter and leave a node at one GPU, so
    # through its own NICs; NCCL keeps free channels where they carry more
    assert search(A100, 1).ring.same_channels  # NVSwitch: any order has the whole link
    # 8 NICs at 8 GPUs: one GPU's NIC carries 1 channel of 24 GB/s, the ring has 8
    assert not search(A100, 2).ring.same_channels
    assert not search(A100, 4).ring.same_channels
    # ABCI V: 2 NICs of 12.5 GB/s for 4 GPUs: 2 channels of 12, one through a GPU's NIC
    assert not search(V100, 2).ring.same_channels
    # one V100 node (a mesh of 2 NVLinks a pair, 40 GB/s): pass 1 takes 3 channels of 40, one
    # GPU order carries 40 / 40 = 1
    assert not search(V100, 1).ring.same_channels
    # one NIC a node: every channel goes through it whatever the order
    assert search(replace(V100, nics_per_node=1), 2).ring.same_channels


def test_broadcast_without_same_channels_pays_p_hops() -> None:
    # tuning.cc lines 234 to 240: nsteps = p hops of hw[a] (the network past one node), Simple
    # at the tree's 28 us
    p = 16
    tab = table(A100, p, "broadcast")
    for proto, algo in (("LL", "ring"), ("LL128", "ring"), ("Simple", "tree")):
        i = ("LL", "LL128", "Simple").index(proto)
        expected = BASE_LAT_US["ring"][i] + p * HW_LAT_US["net"][algo][i]
        assert tab[("ring", proto)][0] == pytest.approx(expected)
    assert tab[("ring", "Simple")][0] == pytest.approx(8.4 + 16 * 28.0)
    # the bytes on the wire are unchanged: algbw = busBw x p / p (nccl-tests: busbw = algbw)
    assert tab[("ring", "Simple")][1] == pytest.approx(8 * 24.0)
    # one node of a mesh: p NVLink hops
    lat, _ = table(V100, 4, "broadcast")[("ring", "Simple")]
    assert lat == pytest.approx(8.4 + 4 * 28.0)
    lat, _ = table(V100, 4, "broadcast")[("ring", "LL")]
    assert lat == pytest.approx(6.6 + 4 * 0.6)


def test_broadcast_protocol_choice_moves_with_p() -> None:
    # ABCI V without LL128: LL (bw 24 / 4 = 6 GB/s) against Simple (24 GB/s) crosses where
    # 6.6 + 2.7 p + S / 6000 = 8.4 + 28 p + S / 24000 (us, bytes): S = (1.8 + 25.3 p) x 8000,
    # 1.63 MB at 8 ranks, 6.49 MB at 32
    v100 = replace(V100, ll128=False)
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    for p, first_simple in ((8, 2 << 20), (32, 8 << 20)):
        crossing = (1.8 + 25.3 * p) * 8000
        assert sizes[sizes.index(first_simple) - 1] < crossing < first_simple
        rows = predict(v100, p, sizes, "broadcast")
        assert [r.protocol for r in rows] == [
            "Simple" if s >= first_simple else "LL" for s in sizes
        ]
    (row,) = predict(v100, 32, [8 << 20], "broadcast")
    assert row.time_us == pytest.approx(8.4 + 32 * 28.0 + (8 << 20) / 24000.0)
    assert row.busbw_gbps == row.algbw_gbps
