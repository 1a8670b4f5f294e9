"""The collective model as a link: its call shape, `estimate --cluster` on both paths, the flags
that do not apply to a cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from commprof.cli import main
from commprof.commands.estimate import add_arguments, run
from commprof.modeling.collective.calibration_fit import DESCRIPTION, Fit
from commprof.modeling.collective.cluster_link import ClusterLink, allreduce_time_ns, cluster_link
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import predict
from commprof.modeling.collective.dataset_fits import save_fits
from commprof.modeling.collective.fitted_model import predict as fitted_predict
from commprof.modeling.collective.ring_fit import fit_alpha_beta

DATA = Path(__file__).parent / "data"
LOG = DATA / "nccl_tests" / "oci-bm-gpu4.8" / "all_reduce_p16_oke.txt"  # 2 nodes of 8 A100
H100 = load_cluster("dgx-h100")
PARAMS = [(f"l{i}.weight", 262144) for i in range(4)]  # four 1 MiB float32 layers


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_predict_ns_is_the_collective_models_time() -> None:
    link = ClusterLink(cluster=H100)
    sizes = np.array([1 << 20, 3 << 20, 1 << 30])
    for p in (8, 16):  # up to two nodes; past them the description's scale loss (calibration)
        expected = [1e3 * r.time_us for r in predict(H100, p, sizes.tolist())]
        assert link.predict_ns(sizes, p).tolist() == pytest.approx(expected, rel=1e-12)
    expected = [1e3 * r.time_us for r in fitted_predict(H100, 64, sizes.tolist())]
    assert link.predict_ns(sizes, 64).tolist() == pytest.approx(expected, rel=1e-12)
    # world sizes broadcast against sizes, as the ring fits' do; one rank or 0 bytes cost nothing
    grid = link.predict_ns(sizes[:, None], np.array([[1, 8, 16]]))
    assert grid.shape == (3, 3) and (grid[:, 0] == 0).all()
    assert grid[:, 2].tolist() == pytest.approx(link.predict_ns(sizes, 16).tolist())
    assert link.predict_ns([0, 1 << 20], 16)[0] == 0.0
    scaled = Fit(intra_bw=0.5, net_bw=0.5, base_lat=2.0, intra_lat=2.0, net_lat=2.0,
                 calibrated_nodes=2)  # fmt: skip
    assert allreduce_time_ns(H100, 16, sizes, scaled).tolist() == pytest.approx(
        [1e3 * r.time_us for r in fitted_predict(H100, 16, sizes.tolist(), fit=scaled)]
    )
    # every time has its 80 % interval around it
    time, low, high = ClusterLink(cluster=H100, calibration=scaled).interval_ns(sizes, 16)
    assert (low < time).all() and (time < high).all()
    with pytest.raises(ValueError, match="whole numbers"):
        link.predict_ns([1.5], 16)
    with pytest.raises(ValueError, match="multiple of its 8 GPUs"):
        link.predict_ns([1 << 20], 12)
    assert "2 node(s) of 8" in link.describe(16) and "description alone" in link.describe(16)


def test_estimate_with_a_cluster_predicts_each_bucket_with_the_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--model", "m", "--world-size", "16", "--cluster", "dgx-h100", "--json"]
    assert run(_parser().parse_args([*common, "--bucket-cap-mb", "1"]), PARAMS) == 0
    doc = json.loads(capsys.readouterr().out)["estimate"]
    assert "cluster dgx-h100" in doc["link"] and len(doc["buckets"]) == 4
    for b in doc["buckets"]:
        (row,) = predict(H100, 16, [b["num_bytes"]])
        assert b["allreduce_ns"] == round(1e3 * row.time_us)
    # calibrated on the cluster's own nccl-tests log: the fitted scales move every bucket
    oci = [*common[:4], "--cluster", "oci-bm-gpu4.8", "--json"]
    args = _parser().parse_args([*oci, "--bucket-cap-mb", "1", "--nccl-tests", str(LOG)])
    assert run(args, PARAMS) == 0
    fitted = json.loads(capsys.readouterr().out)["estimate"]
    assert "calibrated on 1 nccl-tests log(s)" in fitted["link"]
    link = cluster_link("oci-bm-gpu4.8", 16, [str(LOG)])
    assert link.calibration != DESCRIPTION
    assert [b["allreduce_ns"] for b in fitted["buckets"]] == [
        round(float(t)) for t in link.predict_ns([b["num_bytes"] for b in fitted["buckets"]], 16)
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--alpha-us", "5"], "--alpha-us"),
        (["--algorithm", "ring"], "--algorithm"),
        (["--interconnect-file", "x.yaml"], "--interconnect-file"),
        (["--world-size", "12"], "multiple of its 8 GPUs"),
        (["--world-size", "1"], "needs >= 2 ranks"),
    ],
)
def test_flags_that_do_not_apply_to_a_cluster_are_errors(extra: list[str], message: str) -> None:
    args = _parser().parse_args(
        ["--model", "m", "--world-size", "16", "--cluster", "dgx-a100", *extra]
    )
    with pytest.raises(ValueError, match=message):
        run(args, PARAMS)


def test_cluster_flag_errors_elsewhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse: --cluster and --interconnect are exclusive
        _parser().parse_args(
            ["--model", "m", "--world-size", "16", "--cluster", "dgx-a100", "--interconnect", "x"]
        )
    assert "not allowed with" in capsys.readouterr().err
    args = _parser().parse_args(
        ["--model", "m", "--world-size", "2", "--interconnect", "nvlink4", "--nccl-tests", "x"]
    )
    with pytest.raises(ValueError, match="--nccl-tests LOG calibrates a cluster"):
        run(args, PARAMS)
    fits = {("gloo", "cpu-gloo", 16): fit_alpha_beta([1e3, 1e5, 1e7], [1e3, 1e5, 1e7], 16)}
    save_fits(fits, tmp_path / "fits.json")
    args = _parser().parse_args(
        ["--model", "m", "--world-size", "16", "--cluster", "dgx-a100", "--fit",
         str(tmp_path / "fits.json")]
    )  # fmt: skip
    with pytest.raises(ValueError, match="--fit FITS_JSON"):
        run(args, PARAMS)
    args = _parser().parse_args(["--model", "m", "--world-size", "16", "--cluster", "nowhere.yaml"])
    with pytest.raises(ValueError, match="neither a bundled cluster"):
        run(args, PARAMS)
    assert main(["estimate", "--model", "srn-100k", "--world-size", "16", "--cluster",
                 "dgx-a100", "--alpha-us", "3"]) == 2  # fmt: skip
    assert "--alpha-us" in capsys.readouterr().err


def test_step_model_what_if_on_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    # The committed smoke dataset calibrates the step simulator; the cluster replaces the link
    # (the measured compute timeline kept): each bucket's idle time is the collective model's.
    fit = str(DATA / "results_smoke")
    common = ["estimate", "--model", "srn-100k", "--fit", fit, "--json", "--no-interference"]
    assert main([*common, "--world-size", "16", "--cluster", "dgx-h100"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["world_size"] == 16 and "cluster dgx-h100" in doc["calibration"]["link"]
    buckets = doc["prediction"]["buckets"]
    assert buckets and len(buckets) == doc["prediction"]["num_buckets"]
    link = ClusterLink(cluster=H100)
    for b in buckets:
        assert b["service_ns"] == round(float(link.predict_ns(b["num_bytes"], 16)))
    # each bucket's all-reduce has its 80 % interval, the description's here
    interval = doc["communication_interval"]
    _, low, high = link.interval_ns([b["num_bytes"] for b in buckets], 16)
    assert interval["allreduce_ns_low"] == [round(float(x)) for x in low]
    assert all(lo < b["service_ns"] < hi for lo, hi, b in zip(low, high, buckets, strict=True))
    assert "description" in interval["basis"]
    assert main([*common, "--world-size", "16", "--cluster", "dgx-h100", "--same-host"]) == 2
    assert "--same-host" in capsys.readouterr().err
    args = ["--world-size", "16", "--cluster", "dgx-h100", "--fit-source", "buckets"]
    assert main([*common, *args]) == 2
    assert "--fit-source buckets" in capsys.readouterr().err
