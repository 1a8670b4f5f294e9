"""Collective model against public nccl-tests results (issue #27), beside today's single-link ring.

For every system of ``benchmarks/collective_split.yaml`` (its development / held-out roles and
calibration world sizes were committed before any error on it was computed), the median absolute
relative error of the all-reduce time over sizes >= 1 MiB (out-of-place times):

- (a) the bundled cluster description alone, over every world size of the system;
- (b) calibrated on the system's ``calibrate`` world sizes, scored on its ``predict`` ones;
- baselines: today's ring on one published link (``commprof estimate --interconnect``: the
  NVLink / fabric rate inside one node, one NIC's rate across nodes, alpha 10 us), and that ring
  with alpha and beta fitted on the same calibration logs as (b);
- ablations: (a) and (b) with each correction of ``collectives.Corrections`` off, and with all
  off (NCCL's tuning model alone), and (b) with main's calibration before issue #41
  (``collective_baseline.calibrate``).

Logs published under a licence are kept in ``tests/data/nccl_tests``; logs published without one
(the split's ``licence: none`` systems) are not redistributed with the project: their sources are
named in that folder's SOURCES.md, and the benchmark reads a local copy from ``--external-logs
DIR`` (the same relative paths), leaving them out, with a note, where none is given.

Usage: python benchmarks/bench_collective.py [--only development|held_out] [--external-logs DIR]
[--out FILE] [--change TEXT]. Torch-free; runs in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import collective_baseline
import ledger
import numpy as np

from commprof.modeling.collective import fitted_model
from commprof.modeling.collective.calibration import FIT_MIN_BYTES, calibrate
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import (
    CORRECTIONS,
    NO_CORRECTIONS,
    Corrections,
    predict,
)
from commprof.modeling.collective.cost_model import LinkParams, ring_allreduce_ns
from commprof.modeling.collective.nccl_log import read_log
from commprof.modeling.collective.nccl_log_collective import skipped_summary
from commprof.modeling.collective.nccl_log_runs import NcclTestsLog
from commprof.modeling.step.idle import DEFAULT_ALPHA_NS
from commprof.yamlio import load_yaml, read_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nccl_tests"
SPLIT = ROOT / "benchmarks" / "collective_split.yaml"
ABLATIONS: dict[str, Corrections] = {
    "no_corrections": NO_CORRECTIONS,
}
"""The model with corrections taken off, each scored as (a) and (b) are."""


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


def _times(cluster, p: int, sizes: np.ndarray, **kwargs) -> np.ndarray:
    return np.array([r.time_us for r in predict(cluster, p, sizes.tolist(), **kwargs)])


def _fitted(cluster, p: int, sizes: np.ndarray, fit, **kwargs) -> np.ndarray:
    rows = fitted_model.predict(cluster, p, sizes.tolist(), fit=fit, **kwargs)
    return np.array([r.time_us for r in rows])


def _median(parts: list[np.ndarray]) -> float:
    return float(np.median(np.concatenate(parts)))


def log_folder(system: dict, external: Path | None) -> Path | None:
    """Where a system's logs are: the project's test data, or (no licence) the local copy."""
    return DATA if system.get("licence", "none") != "none" else external


def read(path: Path) -> NcclTestsLog:
    """One log of one run (:func:`commprof.modeling.collective.nccl_log.read_log`; a file of
    several runs is refused, listing them); what the reader skipped (0-byte rows, rows with a
    non-zero ``#wrong``, rows an interleaved library line broke) is printed."""
    log = read_log(path)
    log.run  # noqa: B018 -- raises, listing the runs, where the file holds several
    if said := skipped_summary(log):
        print(said)
    return log


def evaluate(system: dict, folder: Path) -> dict:
    """Every figure of one system, its logs read from ``folder``."""
    cluster = load_cluster(system["cluster"])
    logs = {int(p): read(folder / path) for p, path in system["logs"].items()}
    out: dict = {"system": system["name"], "role": system["role"], "cluster": cluster.name,
                 "licence": system.get("licence", "unstated"), "world_sizes": sorted(logs),
                 "per_world_size": {}}  # fmt: skip
    errs_a: list[np.ndarray] = []
    errs_base: list[np.ndarray] = []
    errs_abl: dict[str, list[np.ndarray]] = {k: [] for k in ABLATIONS}
    for p, log in sorted(logs.items()):
        sizes, meas = _rows(log)
        rows = predict(cluster, p, sizes.tolist())
        pred = np.array([r.time_us for r in rows])
        base = ring_allreduce_ns(sizes, p, _baseline_link(cluster, p)) / 1e3
        for name, corr in ABLATIONS.items():
            errs_abl[name].append(_errors(_times(cluster, p, sizes, corrections=corr), meas))
        out["per_world_size"][p] = {
            "a_median_error": float(np.median(_errors(pred, meas))),
            "baseline_median_error": float(np.median(_errors(base, meas))),
            "rows": [
                {"bytes": int(s), "measured_us": float(m), "a_us": float(x), "baseline_us": float(y),  # noqa: E501
                 "algorithm": r.algorithm, "protocol": r.protocol}
                for s, m, x, y, r in zip(sizes, meas, pred, base, rows, strict=True)
            ],
        }  # fmt: skip
        errs_a.append(_errors(pred, meas))
        errs_base.append(_errors(base, meas))
    out["a_median_error"] = _median(errs_a)
    out["a_ablation_median_error"] = {k: _median(v) for k, v in errs_abl.items()}
    out["baseline_median_error"] = _median(errs_base)
    cal_ps, pred_ps = system["calibrate"], system["predict"]
    if cal_ps:
        cal_logs = [logs[p] for p in cal_ps]
        cal = calibrate(cluster, cal_logs)
        cal_main = collective_baseline.calibrate(cluster, cal_logs)
        cal_abl = {k: calibrate(cluster, cal_logs, corrections=c) for k, c in ABLATIONS.items()}
        ring = _ring_fit([(p, *_rows(logs[p])) for p in cal_ps])
        errs_b, errs_rb, errs_ap, errs_nvls = [], [], [], []
        errs_b_abl: dict[str, list[np.ndarray]] = {k: [] for k in ABLATIONS}
        for p in pred_ps:
            sizes, meas = _rows(logs[p])
            errs_b.append(_errors(_fitted(cluster, p, sizes, cal), meas))
            main_t = [
                r.time_us
                for r in collective_baseline.predict(
                    cluster, p, sizes.tolist(), calibration=cal_main
                )
            ]
            errs_nvls.append(_errors(np.array(main_t), meas))
            errs_ap.append(_errors(_times(cluster, p, sizes), meas))
            errs_rb.append(_errors(ring_allreduce_ns(sizes, p, ring) / 1e3, meas))
            for name, corr in ABLATIONS.items():
                t = _fitted(cluster, p, sizes, cal_abl[name], corrections=corr)
                errs_b_abl[name].append(_errors(t, meas))
        out["calibration"] = asdict(cal)
        out["main_calibration"] = asdict(cal_main)
        out["b_median_error"] = _median(errs_b)
        out["b_ablation_median_error"] = {k: _median(v) for k, v in errs_b_abl.items()}
        out["b_main_calibration_median_error"] = _median(errs_nvls)
        out["a_on_predicted_median_error"] = _median(errs_ap)
        out["baseline_fitted_ring_median_error"] = _median(errs_rb)
        out["fitted_ring"] = {"alpha_us": ring.alpha_ns / 1e3,
                              "bandwidth_gbps": 1.0 / ring.beta_ns_per_byte if ring.beta_ns_per_byte else None}  # fmt: skip  # noqa: E501
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _figures(results: list[dict], load: str) -> str:
    """The ledger's headline: per system (role, world sizes) (a), (b) and the one-link ring."""
    parts = []
    for r in results:
        ps = ",".join(map(str, r["world_sizes"]))
        role = "dev" if r["role"] == "development" else "held out"
        parts.append(
            f"{r['system']} ({role}, {ps}): (a) {_pct(r['a_median_error'])}, (b) "
            f"{_pct(r.get('b_median_error'))}, one-link ring {_pct(r['baseline_median_error'])}"
        )
    return "; ".join(parts) + f"; load {load}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--only", choices=("development", "held_out"))
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument(
        "--external-logs",
        type=Path,
        help="a local copy of the logs published without a licence (SOURCES.md names them)",
    )
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    split = load_yaml(read_text(SPLIT, "the split file"), str(SPLIT))
    systems = [s for s in split["systems"] if args.only in (None, s["role"])]
    results = []
    for system in systems:
        folder = log_folder(system, args.external_logs)
        if folder is None:
            print(f"{system['name']}: left out (no licence: give --external-logs DIR)")
            continue
        if not all((folder / path).is_file() for path in system["logs"].values()):
            print(f"{system['name']}: left out (no local copy of its logs under {folder})")
            continue
        results.append(evaluate(system, folder))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    doc = {"benchmark": "collective", "commit": commit, "python": platform.python_version(),
           "load_avg": load, "external_logs": args.external_logs is not None,
           "min_bytes": FIT_MIN_BYTES, "corrections": asdict(CORRECTIONS),
           "systems": results}  # fmt: skip
    print(
        f"{'system':<14} {'role':<11} {'p':<10} {'(a)':>7} {'(b)':>7} {'ring':>8} {'ring fit':>8}"
        f" | ablation (a)/(b): no corrections (no fill); (b) main's calibration"
    )
    for r in results:
        abl_a = r["a_ablation_median_error"]
        abl_b = r.get("b_ablation_median_error", {})
        ablation = ", ".join(f"{_pct(abl_a[k])}/{_pct(abl_b.get(k))}" for k in ABLATIONS)
        print(
            f"{r['system']:<14} {r['role']:<11} {','.join(map(str, r['world_sizes'])):<10} "
            f"{_pct(r['a_median_error']):>7} {_pct(r.get('b_median_error')):>7} "
            f"{_pct(r['baseline_median_error']):>8} "
            f"{_pct(r.get('baseline_fitted_ring_median_error')):>8} | {ablation}; "
            f"{_pct(r.get('b_main_calibration_median_error'))}"
        )
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        ledger.print_row("collective", change=args.change, figures=_figures(results, load),
                         files=[args.out])  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
