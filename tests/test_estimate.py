"""Timeline simulation in closed form, recommendation, and the CLI entry."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from commprof.catalog import parameter_sizes
from commprof.commands.estimate import add_arguments, load_param_sizes_file, run
from commprof.modeling.buckets import assign_buckets
from commprof.modeling.collective.cost_model import LinkParams
from commprof.modeling.collective.dataset_fits import save_fits
from commprof.modeling.collective.ring_fit import fit_alpha_beta
from commprof.modeling.step import cap_advice
from commprof.modeling.step.cap_advice import CAP_GRID_MB, NONE_IN_USE, TIE_TOLERANCE, search
from commprof.modeling.step.idle import Estimate, backward_ready_ns, estimate, simulate

# Four 1 MiB layers (262144 float32 each): with a 1 MiB cap, one layer per bucket.
PARAMS = [(f"l{i}.weight", 262144) for i in range(4)]
LINK = LinkParams(alpha_ns=0.0, beta_ns_per_byte=1.0)  # 1 GB/s, no latency
DATA = Path(__file__).parent / "data" / "results_smoke"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_ready_times_reverse_registration_order() -> None:
    # 4 * numel * tokens / flops: 4 * 262144 * 1000 / 1e12 s = 1048576 ns per layer
    ready = backward_ready_ns(PARAMS, batch_tokens=1000, device_flops_per_s=1e12)
    assert np.allclose(ready, [4 * 1048576, 3 * 1048576, 2 * 1048576, 1048576])


def test_simulate_serialises_buckets() -> None:
    buckets = assign_buckets(PARAMS, bucket_cap_mb=1)
    ready = [40.0, 30.0, 20.0, 10.0]  # last layer ready first
    timeline, exposed = simulate(buckets, [15.0] * 4, ready, backward_ns=40.0)
    # launches: 10, max(20, 25)=25, max(30, 40)=40, max(40, 55)=55 -> done 70
    assert [b.launch_ns for b in timeline] == [10, 25, 40, 55]
    assert timeline[-1].done_ns == 70 and exposed == 30


def test_estimate_totals_in_closed_form() -> None:
    est = estimate(
        PARAMS,
        world_size=2,
        bucket_cap_mb=1,
        link=LINK,
        link_label="test",
        batch_tokens=1,
        device_flops_per_s=1e30,
    )
    # p=2: T = 2 (1/2) n beta = n ns per bucket; compute is ~0 so all of it is exposed.
    assert [b.allreduce_ns for b in est.buckets] == [1048576] * 4
    assert est.total_comm_ns == 4 * 1048576
    assert est.exposed_ns == pytest.approx(4 * 1048576, abs=1)
    fit = fit_alpha_beta([1e3, 1e5, 1e7], [1e3, 1e5, 1e7], 2)
    by_fit = estimate(PARAMS, world_size=2, bucket_cap_mb=1, link=fit, link_label="fit")
    assert by_fit.total_comm_ns == pytest.approx(4 * 1048576, rel=1e-6)
    with pytest.raises(ValueError, match=">= 2"):
        estimate(PARAMS, world_size=1, bucket_cap_mb=1, link=LINK, link_label="x")


def test_run_json_and_recommend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("".join(f"- {{name: l{i}, numel: 262144}}\n" for i in range(4)))
    sizes = load_param_sizes_file(params)
    assert sizes[0] == ("l0", 262144, 4)
    args = parser().parse_args(
        [
            "--params-file",
            str(params),
            "--world-size",
            "4",
            "--interconnect",
            "100gbe",
            "--json",
            "--recommend-bucket-cap",
        ]
    )
    assert run(args, sizes) == 0
    doc = json.loads(capsys.readouterr().out)
    rec = doc["recommendation"]
    curve = rec["curve"]
    # the step model's rule on backward + exposed: of the caps within TIE_TOLERANCE of the
    # shortest the fewest buckets, but DDP's default (in use here, last) where it ties that one
    est = doc["estimate"]
    assert curve[-1]["bucket_cap_mb"] is None
    assert curve[-1]["step_ns"] == est["backward_ns"] + est["exposed_ns"]
    shortest = min(c["step_ns"] for c in curve)
    near = [c for c in curve if c["step_ns"] <= shortest * (1 + TIE_TOLERANCE)]
    pick = min(near, key=lambda c: (c["num_buckets"], c["step_ns"]))
    keeps = curve[-1]["step_ns"] <= pick["step_ns"] * (1 + TIE_TOLERANCE)
    assert rec["best_bucket_cap_mb"] == (None if keeps else pick["bucket_cap_mb"])
    assert rec["kept_cap_in_use"] is keeps and rec["in_use_bucket_cap_mb"] is None
    assert rec["in_use"]["exposed_ns"] == doc["estimate"]["exposed_ns"]
    assert doc["estimate"]["world_size"] == 4
    args = parser().parse_args(
        [
            "--params-file",
            str(params),
            "--world-size",
            "2",
            "--interconnect",
            "nvlink4",
            "--recommend-bucket-cap",
        ]
    )
    assert run(args, sizes) == 0
    assert "<- best" in capsys.readouterr().out


def test_serial_advice_is_the_step_models_rule() -> None:
    # beta = 0: every bucket takes 2 (p - 1) alpha = 2000 ns whatever its size. Layers become
    # ready 1 ms apart, so only the bucket holding the last-ready layer (l0) is exposed, by
    # 2000 ns at every cap: the model cannot tell caps apart.
    link = LinkParams(alpha_ns=1000.0, beta_ns_per_byte=0.0)
    ready = [4e6, 3e6, 2e6, 1e6]

    def run_one(cap: float | None) -> Estimate:
        return estimate(
            PARAMS, world_size=2, bucket_cap_mb=cap, link=link, link_label="x", ready_ns=ready
        )

    curve, best, in_use = search(CAP_GRID_MB, run_one, None)
    assert {e.exposed_ns for e in curve} == {2000} and {e.step_ns for e in curve} == {4_002_000}
    assert best is in_use and best.bucket_cap_mb is None  # keep DDP's default
    _, best, _ = search(CAP_GRID_MB, run_one, 8.0)
    assert best.bucket_cap_mb == 8.0  # an explicit cap in use is kept as it is
    # without a cap in use to keep, the tie goes to the fewest buckets: one, at any cap >= 4 MiB
    _, best, _ = search(CAP_GRID_MB, run_one, NONE_IN_USE)
    assert best.bucket_cap_mb == 4.0
    # beta > 0 and nothing to hide behind (all layers ready at once): fewer, larger buckets
    # cost no more bytes but fewer alphas
    slow = LinkParams(alpha_ns=5000.0, beta_ns_per_byte=1.0)
    at_once = [0.0] * 4

    def run_slow(cap: float | None) -> Estimate:
        return estimate(
            PARAMS, world_size=2, bucket_cap_mb=cap, link=slow, link_label="x", ready_ns=at_once
        )

    # DDP's default: a 1 MiB first bucket and one of 3 MiB, 2 alphas of 2 (p - 1) 5000 ns;
    # 4 MiB and up: one bucket, one alpha, 10 us less of 4.2 ms: under the 1 % that ties caps,
    # so DDP's default is kept; with no cap in use the fewest buckets, 4 MiB, are named
    assert run_slow(None).exposed_ns - run_slow(4.0).exposed_ns == 2 * (2 - 1) * 5000
    _, best, in_use = search(CAP_GRID_MB, run_slow, None)
    assert best is in_use
    _, best, _ = search(CAP_GRID_MB, run_slow, NONE_IN_USE)
    assert best.bucket_cap_mb == 4.0


def test_errors_list_valid_choices(tmp_path: Path) -> None:
    args = parser().parse_args(["--model", "m", "--world-size", "2", "--interconnect", "x"])
    with pytest.raises(ValueError, match="nvlink4"):
        run(args, PARAMS)
    with pytest.raises(ValueError, match="resnet18"):
        parameter_sizes("vgg")  # the catalog's one rule names what it knows
    fits = {("gloo", "cpu-gloo", 2): fit_alpha_beta([1e3, 1e5, 1e7], [1e3, 1e5, 1e7], 2)}
    save_fits(fits, tmp_path / "fits.json")
    args = parser().parse_args(
        ["--model", "m", "--world-size", "8", "--fit", str(tmp_path / "fits.json")]
    )
    with pytest.raises(ValueError, match=r"fitted world sizes: \[2\]"):
        run(args, PARAMS)


def test_serial_estimate_says_what_it_assumed_and_refuses_what_it_ignores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--model", "srn-1m", "--world-size", "2", "--interconnect", "nvlink4"]
    assert run(parser().parse_args([*common, "--json"]), PARAMS) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema_version"], doc["mode"], doc["world_size"]) == (1, "idle", 2)
    assumed = {a["name"]: a for a in doc["assumptions"]}  # a list of {name, value, source}
    assert list(assumed) == ["compute", "tokens", "link", "latency"]
    assert assumed["compute"] == {
        "name": "compute",
        "value": "100 TFLOP/s",
        "source": "built-in default; --device-tflops sets it",
    }
    assert assumed["tokens"]["value"] == "8192 per rank"
    assert assumed["tokens"]["source"].startswith("built-in default")
    assert assumed["latency"] == {
        "name": "latency",
        "value": 10_000,
        "unit": "ns",
        "source": "built-in default; --alpha-us sets it",
    }
    assert assumed["link"]["source"] == "--interconnect nvlink4"
    assert assumed["link"]["value"] == doc["link"]
    given = ["--device-tflops", "50", "--batch-tokens", "1024", "--alpha-us", "3"]
    assert run(parser().parse_args([*common, *given, "--json"]), PARAMS) == 0
    assumed = {a["name"]: a for a in json.loads(capsys.readouterr().out)["assumptions"]}
    assert (assumed["compute"]["value"], assumed["compute"]["source"]) == (
        "50 TFLOP/s",
        "--device-tflops",
    )
    assert (assumed["tokens"]["source"], assumed["latency"]["value"]) == ("--batch-tokens", 3000)
    assert assumed["latency"]["source"] == "--alpha-us"
    # the text says it too, and DDP's default cap with its size
    assert run(parser().parse_args(common), PARAMS) == 0
    text = capsys.readouterr().out
    assert "assumed compute: 100 TFLOP/s (built-in default; --device-tflops sets it)" in text
    assert "cap: DDP default (25 MiB)" in text and "None MiB" not in text
    # flags of the step simulator, or of a link it does not have, are errors naming the flag
    for extra, flag in (
        (["--no-interference"], "--no-interference"),
        (["--without", "stall"], "--without"),
        (["--same-host"], "--same-host"),
    ):
        with pytest.raises(ValueError, match=f"^{flag} do"):
            run(parser().parse_args([*common, *extra]), PARAMS)
    step = ["--model", "srn-1m", "--world-size", "2", "--fit", str(DATA)]
    for extra, flag in (
        (["--batch-tokens", "5"], "--batch-tokens"),
        (["--device-tflops", "5"], "--device-tflops"),
        (["--algorithm", "ring"], "--algorithm"),
        (["--alpha-us", "5"], "--alpha-us"),
    ):
        with pytest.raises(ValueError, match=f"^{flag} do"):
            run(parser().parse_args([*step, *extra]), PARAMS)
    # a fitted link is the link: a published one beside it is refused, and the fit's choosers
    # without a fit; the step simulator's flags name where they apply
    buckets = [*step, "--fit-source", "buckets"]
    for args, flag in (
        ([*buckets, "--interconnect", "nvlink4"], "--interconnect"),
        ([*buckets, "--interconnect-file", "x.yaml"], "--interconnect-file"),
        ([*common, "--fit-source", "buckets"], "--fit-source"),
        ([*common, "--fit-backend", "nccl"], "--fit-backend"),
    ):
        with pytest.raises(ValueError, match=f"^{flag} do"):
            run(parser().parse_args(args), PARAMS)
    with pytest.raises(ValueError, match="only --fit DIR with the microbenchmark fit"):
        run(parser().parse_args([*buckets, "--without", "stall"]), PARAMS)


def test_serial_advice_marks_the_cap_it_picks(capsys: pytest.CaptureFixture[str]) -> None:
    # Four 1 MiB layers whose compute takes no time (10^9 TFLOP/s): every bucket is exposed.
    # Without latency every cap sends the same bytes, so no cap saves anything and DDP's
    # default is kept; with 5 ms of latency fewer buckets save alphas, so the advice changes.
    common = ["--model", "m", "--world-size", "2", "--interconnect", "100gbe"]
    common += ["--device-tflops", "1e9", "--recommend-bucket-cap"]
    for alpha_us, keep in (("0", True), ("5000", False)):
        assert run(parser().parse_args([*common, "--alpha-us", alpha_us]), PARAMS) == 0
        lines = capsys.readouterr().out.splitlines()
        marked = [line for line in lines if "<- best" in line]
        assert len(marked) == 1  # one point: the one the verdict names
        verdict = lines[-1]
        if keep:
            assert marked[0].split()[0] == "default" and marked[0].endswith("(in use)")
            assert verdict.startswith(f"verdict: keep {cap_advice.baseline_label(None)}: ")
        else:
            cap = float(marked[0].split()[0])
            assert verdict.startswith(
                f"verdict: change to {cap:g} MiB: predicted backward + exposed -"
            )


def test_serial_advice_keeps_a_cap_in_use_that_is_on_the_grid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 4 MiB is both the cap in use and a point of the grid: where no cap saves anything it is
    # kept, the "in use" row is the one marked, and the verdict says keep (not "change to 4")
    common = ["--model", "m", "--world-size", "2", "--interconnect", "100gbe", "--alpha-us", "0"]
    common += ["--device-tflops", "1e9", "--bucket-cap-mb", "4", "--recommend-bucket-cap"]
    assert run(parser().parse_args(common), PARAMS) == 0
    lines = capsys.readouterr().out.splitlines()
    marked = [line for line in lines if "<- best" in line]
    assert len(marked) == 1 and marked[0].split()[0] == "4" and marked[0].endswith("(in use)")
    assert sum("(in use)" in line for line in lines) == 1  # the grid's 4 MiB is the cap in use
    assert lines[-1].startswith(f"verdict: keep {cap_advice.baseline_label(4.0)}: ")
    assert run(parser().parse_args([*common, "--json"]), PARAMS) == 0
    rec = json.loads(capsys.readouterr().out)["recommendation"]
    assert rec["kept_cap_in_use"] is True and rec["best_bucket_cap_mb"] == 4
