"""The calibration of the collective model: it reproduces its logs, moves what the logs see,
extrapolates by each algorithm's scaling, and gives every time an interval."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from commprof.cli import main
from commprof.modeling.collective import collectives
from commprof.modeling.collective.calibration import FIT_MIN_BYTES, FITTED, calibrate
from commprof.modeling.collective.calibration_fit import DESCRIPTION, Fit
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.fitted_model import predict
from commprof.modeling.collective.nccl_log_collective import log_world_size
from commprof.modeling.collective.nccl_tests import NcclTestsLog, Row, Run, read_log
from commprof.modeling.collective.scale_rule import RULE, halfwidth_log, interval_basis

DATA = Path(__file__).parent / "data" / "nccl_tests"
H100 = load_cluster("dgx-h100")
ABCI_A100 = load_cluster("abci-a100")


def _median_error(cluster, log: NcclTestsLog, fit: Fit, collective: str = "all_reduce") -> float:
    rows = [r for r in log.rows if r.num_bytes >= FIT_MIN_BYTES]
    sizes = [r.num_bytes for r in rows]
    pred = predict(cluster, log_world_size(log), sizes, collective, fit)
    return float(
        np.median([abs(p.time_us / r.time_us - 1) for p, r in zip(pred, rows, strict=True)])
    )


def _log_of(cluster, world_size: int, fit: Fit, collective: str = "all_reduce") -> NcclTestsLog:
    """A log the model itself prints for ``fit`` (sizes 1 MiB to 1 GiB)."""
    sizes = [1 << k for k in range(20, 31)]
    rows = tuple(
        Row(num_bytes=p.num_bytes, dtype="float", redop="sum", time_us=p.time_us,
            algbw_gbps=p.algbw_gbps, busbw_gbps=p.busbw_gbps, inplace_time_us=None, line=i + 1)
        for i, p in enumerate(predict(cluster, world_size, sizes, collective, fit))
    )  # fmt: skip
    run = Run(
        index=1,
        header_line=1,
        collective=collective,
        world_size=world_size,
        num_hosts=cluster.nodes_for(world_size),
        rows=rows,
        skipped=(),
        complete=True,
    )
    return NcclTestsLog(source=f"model-p{world_size}", runs=(run,))  # fmt: skip


# Every committed log the calibration reproduces within 5 % (issue #41's goal): (cluster, path,
# run, world size where the log lists no rank lines). Misses, quoted per log with each log's own
# roughness in benchmarks/README.md: gh200-alps p8 (5.7 % without LL128 across nodes, 6.6 with
# it), gh200-olivia's int8 run (14.5 %; 7.5 with LL128 across nodes, which its NCCL 2.30 runs),
# aws-p5's MPI-job excerpt (7.1 %), the CXI-hook-disabled run (35 %), abci-v100 p4 (5.6 %),
# broadcast past one node on ABCI (5.5 to 49 %; abci-a100 p32 5.5 % since run 4's sameChannels
# latency, 4.99 % before, its own roughness 7.1 %), h100-cluster01's all_reduce at 80 (8.6 %).
REPRODUCED = [
    ("oci-bm-gpu4.8", "oci-bm-gpu4.8/all_reduce_p16_oke.txt", 1),
    # the source cut these logs' rank lines: busbw / algbw implies the world size (16, 16, 8)
    ("aws-p5", "aws-p5/all_reduce_p16.txt", 1),
    ("aws-p5", "aws-p5/all_reduce_p16_srun.txt", 1),
    ("aws-p5", "aws-p5/all_reduce_p8_batch.txt", 1),
    ("dgx-h100", "dgx-h100/all_reduce_p8_dgxc.txt", 1),
    ("gh200-slingshot", "gh200-olivia/all_reduce_p16_int8_wrong.txt", 1),  # two rows kept
    *[("abci-a100", f"abci-a100/all_reduce_p{p}.txt", 1) for p in (4, 8, 16, 32, 64, 128)],
    *[("abci-a100", f"abci-a100/broadcast_p{p}.txt", 1) for p in (4, 8, 16)],
    *[("abci-v100", f"abci-v100/all_reduce_p{p}.txt", 1) for p in (8, 16, 32, 64, 128)],
    ("abci-v100", "abci-v100/broadcast_p4.txt", 1),
    *[("dgx-h100", "h100-cluster01/five_collectives_p8_n1.txt", k) for k in (1, 2, 3)],
    *[("dgx-h100", "h100-cluster01/five_collectives_p80_n10.txt", k) for k in (2, 3)],
]


@pytest.mark.parametrize(("cluster", "path", "run"), REPRODUCED)
def test_calibration_reproduces_its_log_within_5_percent(cluster: str, path: str, run: int) -> None:
    c = load_cluster(cluster)
    log = read_log(DATA / path).select(run)
    collective = log.collective or ("broadcast" if "broadcast" in path else "all_reduce")
    before = _median_error(c, log, DESCRIPTION, collective)
    fit = calibrate(c, [log], collective)
    after = _median_error(c, log, replace(fit, anchors=()), collective)  # the factors alone
    assert after <= 0.05, f"{path}: {after:.1%} in sample (description {before:.1%})"
    assert fit.residual_log_q80 > 0 and fit.calibrated_nodes == c.nodes_for(log_world_size(log))


def test_a_fitted_world_size_follows_its_log_and_no_other() -> None:
    # At the world size and collective a fitted log measured, the answer is that log: its own
    # times at its sizes, and between two sizes the model times the residual interpolated in log
    # size, with the interval of leaving each size out. Another world size or collective gets
    # the factors alone: the residual of one world size does not carry.
    log = read_log(DATA / "abci-a100/all_reduce_p64.txt")
    fit = calibrate(ABCI_A100, [log])
    anchor = fit.anchor(64, "all_reduce")
    assert anchor is not None and fit.anchor(64, "broadcast") is fit.anchor(128, "all_reduce")
    rows = [r for r in log.rows if r.num_bytes > 0]
    sizes = [r.num_bytes for r in rows]
    at = predict(ABCI_A100, 64, sizes, "all_reduce", fit)
    assert [p.time_us for p in at] == pytest.approx([r.time_us for r in rows], rel=1e-9)
    model = replace(fit, anchors=())
    lo, hi = sizes[-3], sizes[-2]
    mid = int((lo * hi) ** 0.5)
    (between,) = predict(ABCI_A100, 64, [mid], "all_reduce", fit)
    (bare,) = predict(ABCI_A100, 64, [mid], "all_reduce", model)
    halfway = (anchor.log_residual[-3] + anchor.log_residual[-2]) / 2
    assert between.time_us == pytest.approx(bare.time_us * np.exp(halfway), rel=1e-3)
    half = np.exp(max(anchor.loo_log_q80, RULE.calibrated_floor_log))
    assert between.time_us_high / between.time_us == pytest.approx(half)
    assert anchor.loo_log_q80 > 0
    for p, collective in ((128, "all_reduce"), (64, "all_gather")):
        anchored = predict(ABCI_A100, p, sizes[-5:], collective, fit)
        assert anchored == predict(ABCI_A100, p, sizes[-5:], collective, model)


def test_the_network_term_moves_where_the_network_binds() -> None:
    # Two nodes of ABCI's A100 (4 HDR NICs a node): the network bounds every algorithm, and the
    # ring's intra-node side the search reports equals its network side (both 4 x 24 GB/s); a
    # log 40 % slower on the network must move the network's factor, not stay at 1.0 (main's
    # calibration left net_scale at exactly 1.0 where min() gave the tie to the other side).
    truth = Fit(net_bw=0.6, base_lat=1.5, calibrated_nodes=2)
    log = _log_of(ABCI_A100, 16, truth)
    fit = calibrate(ABCI_A100, [log])
    assert "net_bw" in fit.seen
    assert fit.net_lat == 1.0 and "net_lat" not in fit.seen  # held at the description
    assert fit.net_bw == pytest.approx(0.6, rel=0.05)
    assert fit.intra_bw == pytest.approx(1.0, rel=0.05)  # the NVLink side does not bind here
    assert _median_error(ABCI_A100, log, replace(fit, anchors=())) < 0.01


def test_a_fit_extrapolates_by_each_algorithms_scaling() -> None:
    # Fitted on one and two nodes, predicting 16 nodes: the fitted factors carry to the larger
    # world size through the algorithms' own formulas (ring 2(p-1) steps, tree 2 log2 N network
    # hops), so a model that generated the small logs predicts its own 16-node times. (One
    # two-node H100 log alone cannot tell NVLink SHARP's rate from the network's: NVLSTree takes
    # the least of both; docs/collective_model.md, limits.)
    # The declared calibration holds the network hop latency at the description; asked for, it
    # is fitted and carries the same way.
    truth = Fit(net_bw=0.8, net_lat=2.0, base_lat=1.5, calibrated_nodes=2)
    for cluster, world_sizes in ((H100, (8, 16)), (ABCI_A100, (16,))):
        logs = [_log_of(cluster, p, truth) for p in world_sizes]
        fit = calibrate(cluster, logs, parameters=(*FITTED, "net_lat"))
        far = _log_of(cluster, 128, truth)
        assert _median_error(cluster, far, fit) < 0.01, cluster.name


def test_unseen_terms_stay_at_the_description() -> None:
    # One node sees no network: its factors stay 1.0 and the description's network model
    # (its two-node buffer fill included) is kept whole.
    log = read_log(DATA / "abci-a100/all_reduce_p8.txt")
    fit = calibrate(ABCI_A100, [log])
    assert "net_bw" not in fit.seen and fit.net_bw == 1.0 and fit.net_lat == 1.0
    assert fit.two_node_fill and fit.calibrated_nodes == 1


def test_the_description_alone_is_the_collective_models_time_then_loses_past_two_nodes() -> None:
    sizes = [1 << k for k in range(0, 33, 4)]
    for p in (8, 16):  # one and two nodes: NCCL's tuning model as it is
        ours = [r.time_us for r in predict(H100, p, sizes)]
        assert ours == pytest.approx([r.time_us for r in collectives.predict(H100, p, sizes)])
    # Past two nodes the network side loses c a doubling (ScaleRule, fitted on development
    # systems); with c = 0 the description is NCCL's model again at any size.
    published = [r.time_us for r in collectives.predict(H100, 64, sizes)]
    ring, tree = "description_ring_loss_per_doubling", "description_tree_loss_per_doubling"
    no_loss = replace(RULE, **{ring: 0.0, tree: 0.0})
    assert [r.time_us for r in predict(H100, 64, sizes, rule=no_loss)] == pytest.approx(published)
    c = 0.2
    lossy = predict(H100, 64, sizes, rule=replace(no_loss, **{ring: c, tree: c}))
    assert all(r.time_us >= q * (1 - 1e-9) for r, q in zip(lossy, published, strict=True))
    # the largest size is bandwidth-bound on the network: about (1 + c log2(8 / 2)) slower
    assert lossy[-1].time_us / published[-1] == pytest.approx(1 + c * 2, rel=0.1)
    # each algorithm takes its own loss: a tree-only loss leaves a size the ring carries alone
    rings = [r.time_us for r in collectives.predict(H100, 64, sizes, algorithms=["ring"])]
    tree_only = predict(H100, 64, sizes, rule=replace(no_loss, **{tree: c}), algorithms=["ring"])
    assert [r.time_us for r in tree_only] == pytest.approx(rings)
    ring_only = predict(H100, 64, sizes, rule=replace(no_loss, **{ring: c}), algorithms=["ring"])
    assert ring_only[-1].time_us / rings[-1] == pytest.approx(1 + c * 2, rel=0.1)
    assert RULE.description_tree_loss_per_doubling > 0  # the committed rule uses it


def test_every_time_has_an_interval_that_widens_with_extrapolation() -> None:
    fit = replace(Fit(net_bw=0.9), residual_log_q80=0.02, calibrated_nodes=2)
    near = predict(H100, 16, [1 << 24], fit=fit)[0]
    far = predict(H100, 128, [1 << 24], fit=fit)[0]
    assert near.time_us_low < near.time_us < near.time_us_high
    assert far.time_us_high / far.time_us > near.time_us_high / near.time_us
    assert halfwidth_log(fit, 32) == pytest.approx(
        max(0.02, RULE.calibrated_floor_log) + RULE.per_doubling_log * 4.0
    )
    assert halfwidth_log(DESCRIPTION, 256) == RULE.description_log
    with pytest.raises(ValueError, match="net_bw must be finite and > 0"):
        Fit(net_bw=0.0)


def test_a_one_node_fit_is_no_surer_than_the_description_where_the_network_is_crossed() -> None:
    one_node = replace(Fit(intra_bw=0.9), residual_log_q80=0.02, calibrated_nodes=1)
    # within its node: its own spread; on two nodes and more: at least the description's
    assert halfwidth_log(one_node, 1) == pytest.approx(max(0.02, RULE.calibrated_floor_log))
    for nodes in (2, 8, 512):
        widened = max(0.02, RULE.calibrated_floor_log) + RULE.per_doubling_log * math.log2(nodes)
        assert halfwidth_log(one_node, nodes) == pytest.approx(max(widened, RULE.description_log))
    assert halfwidth_log(one_node, 2) == RULE.description_log  # the committed rule's case
    assert "saw no network, which 2 nodes cross" in interval_basis(one_node, 16, "all_reduce", 2)
    assert "saw no network" not in interval_basis(one_node, 8, "all_reduce", 1)
    # a two-node fit saw the network: its own spread, widened by doublings only
    two_nodes = replace(one_node, calibrated_nodes=2)
    assert halfwidth_log(two_nodes, 4) < RULE.description_log


def test_collective_command_json_carries_the_interval(capsys: pytest.CaptureFixture[str]) -> None:
    a = str(DATA / "abci-a100/all_reduce_p8.txt")
    b = str(DATA / "abci-a100/all_reduce_p16.txt")
    argv = ["collective", "--cluster", "abci-a100", "--world-size", "64", "--max-bytes", "64M"]
    assert main([*argv, "--fit", a, "--fit", b, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["time_us_low"] < r["time_us"] < r["time_us_high"] for r in rows)
    # --fit A --fit B keeps both logs, as --fit A B does
    assert main([*argv, "--fit", a, "--fit", b]) == 0
    both = capsys.readouterr().out
    assert main([*argv, "--fit", a, b]) == 0
    assert capsys.readouterr().out == both
    assert "calibrated on 2 log(s)" in both and "80 % interval" in both and "high" in both


def test_estimate_on_a_cluster_gives_the_communication_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["estimate", "--model", "srn-1m", "--world-size", "32", "--cluster", "abci-a100"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    interval, total = doc["communication_interval"], doc["estimate"]["total_comm_ns"]
    assert interval["total_comm_ns_low"] < total < interval["total_comm_ns_high"]
    assert "description" in interval["basis"]
    assert main(argv) == 0
    assert "80 % interval" in capsys.readouterr().out


def test_estimate_picks_the_run_of_a_multi_run_log(capsys: pytest.CaptureFixture[str]) -> None:
    # five runs in one file (all_reduce first): without --run, estimate calibrates on its one
    # all_reduce run (the other collectives set aside), as --run 1 does; another collective's
    # run is refused, naming --run
    log = str(DATA / "h100-cluster01/five_collectives_p8_n1.txt")
    argv = ["estimate", "--model", "srn-1m", "--world-size", "16", "--cluster", "dgx-h100"]
    assert main([*argv, "--nccl-tests", log, "--json"]) == 0
    out, err = capsys.readouterr()
    chosen = json.loads(out)
    assert "run(s) 2 (all_gather)" in err and "set aside: another collective" in err, err
    assert main([*argv, "--nccl-tests", log, "--run", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    basis = doc["communication_interval"]["basis"]
    assert "the logs fitted are of one node and saw no network, which 2 nodes cross" in basis, basis
    assert chosen == doc
    assert main([*argv, "--nccl-tests", log, "--run", "2"]) == 2
    assert "not all_reduce; pick the all_reduce run with --run K" in capsys.readouterr().err
    assert main([*argv, "--run", "1"]) == 2
    assert "--run 1: give the logs it picks from with --nccl-tests" in capsys.readouterr().err
