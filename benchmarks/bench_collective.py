"""Collective model against public nccl-tests results (issue #27), beside today's single-link ring.

For every system of ``benchmarks/collective_split.yaml`` (its development / held-out roles and
calibration world sizes were committed before any error was computed), the median absolute
relative error of the all-reduce time over sizes >= 1 MiB (out-of-place times):

- (a) the bundled cluster description alone, over every world size of the system;
- (b) calibrated on the system's ``calibrate`` world sizes, scored on its ``predict`` ones;
- baselines: today's ring on one published link (``commprof estimate --interconnect``: the
  NVLink / fabric rate inside one node, one NIC's rate across nodes, alpha 10 us), and that ring
  with alpha and beta fitted on the same calibration logs as (b).

Usage: python benchmarks/bench_collective.py [--only development|held_out] [--out FILE]
Torch-free; runs in about a second.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from commprof.modeling.clusters import load_cluster
from commprof.modeling.collectives import predict
from commprof.modeling.cost_model import LinkParams, ring_allreduce_ns
from commprof.modeling.estimate import DEFAULT_ALPHA_NS
from commprof.modeling.nccl_tests import FIT_MIN_BYTES, calibrate, read_log
from commprof.yamlio import load_yaml, read_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nccl_tests"
SPLIT = ROOT / "benchmarks" / "collective_split.yaml"


def _errors(pred_us: np.ndarray, meas_us: np.ndarray) -> np.ndarray:
    return np.abs(pred_us - meas_us) / meas_us


def _rows(log):
    kept = [r for r in log.rows if r.num_bytes >= FIT_MIN_BYTES]
    return np.array([r.num_bytes for r in kept]), np.array([r.time_us for r in kept])


def _baseline_link(cluster, p: int) -> LinkParams:
    """Today's single published link: the intra-node rate on one node, one NIC across nodes."""
    rate = cluster.intra_bytes_per_s if cluster.nodes_for(p) == 1 else cluster.nic_bytes_per_s
    return LinkParams.from_bandwidth(bandwidth_bytes_per_s=rate, alpha_ns=DEFAULT_ALPHA_NS)


def _ring_fit(points: list[tuple[int, np.ndarray, np.ndarray]]) -> LinkParams:
    """alpha, beta of the ring fitted by relative least squares (rows divided by the time)."""
    a = np.concatenate([np.stack([np.full(s.shape, 2.0 * (p - 1)), 2.0 * (p - 1) / p * s], axis=1) / t[:, None]  # noqa: E501
                        for p, s, t in points])  # fmt: skip
    b = np.concatenate([np.ones_like(t) for _, _, t in points])
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    alpha_us, beta_us = np.maximum(coef, 0.0)
    return LinkParams(alpha_ns=alpha_us * 1e3, beta_ns_per_byte=beta_us * 1e3)


def evaluate(system: dict) -> dict:
    """Every figure of one system."""
    cluster = load_cluster(system["cluster"])
    logs = {int(p): read_log(DATA / path) for p, path in system["logs"].items()}
    out: dict = {"system": system["name"], "role": system["role"], "cluster": cluster.name,
                 "world_sizes": sorted(logs), "per_world_size": {}}  # fmt: skip
    errs_a, errs_base = [], []
    for p, log in sorted(logs.items()):
        sizes, meas = _rows(log)
        pred = np.array([r.time_us for r in predict(cluster, p, sizes.tolist())])
        base = ring_allreduce_ns(sizes, p, _baseline_link(cluster, p)) / 1e3
        chosen = [(r.algorithm, r.protocol) for r in predict(cluster, p, sizes.tolist())]
        out["per_world_size"][p] = {
            "a_median_error": float(np.median(_errors(pred, meas))),
            "baseline_median_error": float(np.median(_errors(base, meas))),
            "rows": [
                {"bytes": int(s), "measured_us": float(m), "a_us": float(x), "baseline_us": float(y),  # noqa: E501
                 "algorithm": c[0], "protocol": c[1]}
                for s, m, x, y, c in zip(sizes, meas, pred, base, chosen, strict=True)
            ],
        }  # fmt: skip
        errs_a.append(_errors(pred, meas))
        errs_base.append(_errors(base, meas))
    out["a_median_error"] = float(np.median(np.concatenate(errs_a)))
    out["baseline_median_error"] = float(np.median(np.concatenate(errs_base)))
    cal_ps, pred_ps = system["calibrate"], system["predict"]
    if cal_ps:
        cal = calibrate(cluster, [logs[p] for p in cal_ps])  # the declared model: no NVLS scale
        cal_off = calibrate(cluster, [logs[p] for p in cal_ps], nvls_correction=True)
        ring = _ring_fit([(p, *_rows(logs[p])) for p in cal_ps])
        errs_b, errs_rb, errs_ap, errs_off = [], [], [], []
        for p in pred_ps:
            sizes, meas = _rows(logs[p])
            pred_b = np.array(
                [r.time_us for r in predict(cluster, p, sizes.tolist(), calibration=cal)]
            )
            pred_a = np.array([r.time_us for r in predict(cluster, p, sizes.tolist())])
            errs_b.append(_errors(pred_b, meas))
            pred_off = predict(cluster, p, sizes.tolist(), calibration=cal_off)
            errs_off.append(_errors(np.array([r.time_us for r in pred_off]), meas))
            errs_ap.append(_errors(pred_a, meas))
            errs_rb.append(_errors(ring_allreduce_ns(sizes, p, ring) / 1e3, meas))
        out["calibration"] = {"intra_scale": cal.intra_scale, "net_scale": cal.net_scale,
                              "latency_scale": cal.latency_scale, "nvls_scale": cal.nvls_scale}  # fmt: skip  # noqa: E501
        out["b_median_error"] = float(np.median(np.concatenate(errs_b)))
        out["b_with_nvls_correction_median_error"] = float(np.median(np.concatenate(errs_off)))
        out["a_on_predicted_median_error"] = float(np.median(np.concatenate(errs_ap)))
        out["baseline_fitted_ring_median_error"] = float(np.median(np.concatenate(errs_rb)))
        out["fitted_ring"] = {"alpha_us": ring.alpha_ns / 1e3,
                              "bandwidth_gbps": 1.0 / ring.beta_ns_per_byte if ring.beta_ns_per_byte else None}  # fmt: skip  # noqa: E501
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", choices=("development", "held_out"))
    parser.add_argument("--out", type=Path, help="write the JSON here")
    args = parser.parse_args(argv)
    split = load_yaml(read_text(SPLIT, "the split file"), str(SPLIT))
    systems = [s for s in split["systems"] if args.only in (None, s["role"])]
    results = [evaluate(s) for s in systems]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    doc = {"benchmark": "collective", "commit": commit, "python": platform.python_version(),
           "min_bytes": FIT_MIN_BYTES, "systems": results}  # fmt: skip
    print(
        f"{'system':<14} {'role':<11} {'p':<12} {'(a)':>7} {'(b)':>7} {'ring':>7} {'ring fit':>8} {'(b)+nvls':>9}"  # noqa: E501
    )
    for r in results:
        b = r.get("b_median_error")
        rb = r.get("baseline_fitted_ring_median_error")
        off = r.get("b_with_nvls_correction_median_error", 0.0)
        print(
            f"{r['system']:<14} {r['role']:<11} {','.join(map(str, r['world_sizes'])):<12} "
            f"{100 * r['a_median_error']:>6.1f}% "
            f"{'n/a' if b is None else f'{100 * b:.1f}%':>7} "
            f"{100 * r['baseline_median_error']:>6.1f}% {'n/a' if rb is None else f'{100 * rb:.1f}%':>8} "  # noqa: E501
            f"{'n/a' if b is None else f'{100 * off:.1f}%':>9}"
        )
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
