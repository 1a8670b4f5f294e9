"""Collective model across world sizes (issue #41): calibrate on 1-2 nodes, predict the rest.

For every system of ``benchmarks/collective_scale_split.yaml`` and of the later held-out sets
(``collective_scale_split_2.yaml``, ``_3.yaml``; each declared before any score), the median
absolute relative error of the out-of-place time over sizes >= 1 MiB:

- in sample: the calibration fitted on each log alone, predicting that log (goal <= 5 %): its
  factors alone, and the answer between the log's sizes (each size left out and its residual
  interpolated from the others, ``calibration_fit.leave_one_out``; at a measured size the answer
  is the log's own time);
- scale: calibrated on the system's ``calibrate`` world sizes, scored on each ``predict`` one,
  side by side: the published description alone, main's calibration before issue #41
  (``collective_baseline.calibrate``, frozen) and this calibration
  (``commprof.modeling.collective.calibration``);
- the 80 % interval's coverage on every scored point; the interval rule
  (``commprof/modeling/collective/collective_scale.yaml``) is fitted on the development systems
  only (``--write-rule`` writes it), on each one's residuals under the losses of the other
  clusters (:func:`unseen_residuals`), and its coverage is quoted on the held-out ones;
- ablations: the calibration with one part taken off, scored the same way;
- the third split's systems measured at one world size (``in_sample_only``): in sample, and the
  description alone at that world size with its interval's coverage.

Usage: python benchmarks/bench_collective_scale.py [--external-logs DIR] [--out FILE]
[--write-rule] [--change TEXT]. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import collective_baseline
import ledger
import numpy as np

from commprof.modeling.collective import calibration as cal
from commprof.modeling.collective import calibration_fit, fitted_model, scale_rule
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import CORRECTIONS, predict
from commprof.modeling.collective.nccl_log import read_log
from commprof.modeling.collective.nccl_log_collective import implied_world_size, skipped_summary
from commprof.modeling.collective.nccl_log_runs import NcclTestsLog
from commprof.yamlio import load_yaml, read_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nccl_tests"
SPLIT = ROOT / "benchmarks" / "collective_scale_split.yaml"
LATER_SPLITS = {
    "held_out_2": ROOT / "benchmarks" / "collective_scale_split_2.yaml",
    "held_out_3": ROOT / "benchmarks" / "collective_scale_split_3.yaml",
}
"""The later held-out sets (every system ``held_out``), each scored under its own role."""
ROLES = ("development", "held_out", *LATER_SPLITS)
RULE = ROOT / "commprof" / "modeling" / "collective" / "collective_scale.yaml"
TARGET_COVERAGE = 0.8
LOSS_GRID = tuple(0.025 * i for i in range(21))
"""Values of the network's loss per doubling tried on development systems (0 to 0.5)."""
COORDINATE_ROUNDS = 5
"""At most this many rounds of the ring's then the tree's loss, each over the grid."""
ABLATIONS: dict[str, dict] = {
    "with_two_node_fill": {"corrections": CORRECTIONS},
    "no_latency_factors": {"parameters": ("intra_bw", "net_bw", "nvls_bw", "fill")},
    "fit_net_latency": {"parameters": (*cal.FITTED, "net_lat")},
    "no_prior": {"prior_weight": 1e-9},
    "no_efficiency": {"parameters": tuple(p for p in cal.FITTED if p != "knee_bytes")},
    "no_protocol_factor": {"parameters": tuple(p for p in cal.FITTED if p != "ll128_bw")},
}
"""The calibration with one part changed (the ``calibrate`` keyword it takes); "fit net latency"
is run 1's calibration, before run 2's declared change held the network hop latency."""


def read(path: Path, collective: str, world_size: int) -> NcclTestsLog:
    """A log as its cluster printed it (:func:`commprof.modeling.collective.nccl_log.read_log`:
    ``srun -l`` labels, interleaved library lines, 0-byte rows and rows with a non-zero
    ``#wrong`` are read and skipped, each counted); a file of several runs is narrowed to its one
    run of ``collective``. What was skipped is printed. A run without rank lines takes the
    split's ``world_size`` where its busbw / algbw ratio does not say another
    (:func:`commprof.modeling.collective.nccl_log_collective.implied_world_size`)."""
    log = read_log(path)
    runs = [r for r in log.runs if r.collective == collective]
    if len(log.runs) == 1 and log.runs[0].collective is None:
        runs = list(log.runs)
    if len(runs) != 1:
        listed = "; ".join(r.describe() for r in log.runs)
        raise ValueError(f"{path}: holds no single run of {collective} ({listed})")
    log = log.select(runs[0].index)
    if log.run.world_size is None:
        implied = implied_world_size(log.run)
        if implied not in (None, world_size):
            raise ValueError(f"{path}: busbw / algbw says {implied} ranks, the split {world_size}")
        log = replace(log, runs=(replace(log.run, world_size=world_size),))
    if said := skipped_summary(log):
        print(said)
    return log


def _rows(log) -> tuple[list[int], np.ndarray]:
    kept = [r for r in log.rows if r.num_bytes >= cal.FIT_MIN_BYTES]
    return [r.num_bytes for r in kept], np.array([r.time_us for r in kept])


def _err(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred / meas - 1.0)


def _ours(cluster, p, sizes, collective, fit, rule=scale_rule.RULE, **kw):
    rows = fitted_model.predict(cluster, p, sizes, collective, fit, rule=rule, **kw)
    return (np.array([r.time_us for r in rows]), np.array([r.time_us_low for r in rows]),
            np.array([r.time_us_high for r in rows]))  # fmt: skip


def fit_system(system: dict, folder: Path) -> dict:
    """Every fit of one system (in sample, its calibration, main's, the ablations), its logs."""
    cluster = load_cluster(system["cluster"])
    col = system["collective"]
    logs = {int(p): read(folder / path, col, int(p)) for p, path in system["logs"].items()}
    cal_logs = [logs[p] for p in system["calibrate"]]
    return {
        "system": system, "cluster": cluster, "logs": logs,
        "in_sample": {p: cal.calibrate(cluster, [log], col) for p, log in logs.items()},
        "fit": cal.calibrate(cluster, cal_logs, col),
        "main": collective_baseline.calibrate(cluster, cal_logs, col),
        "ablation": {k: cal.calibrate(cluster, cal_logs, col, **o) for k, o in ABLATIONS.items()},
    }  # fmt: skip


def in_sample(cluster, p: int, log, col: str, one, rule: scale_rule.ScaleRule) -> dict:
    """A log fitted alone (``one``) predicting itself: its factors alone, and the answer between
    its sizes (each left out, its residual interpolated from the others)."""
    sizes, meas = _rows(log)
    pred, _, _ = _ours(cluster, p, sizes, col, replace(one, anchors=()), rule)
    anchor = one.anchor(p, col)
    assert anchor is not None
    loo = calibration_fit.leave_one_out(anchor.num_bytes, anchor.log_residual, cal.FIT_MIN_BYTES)
    return {"median_error": float(np.median(_err(pred, meas))),
            "leave_one_out": float(np.median(np.expm1(loo))),
            "fit": one.factors(), "seen": list(one.seen)}  # fmt: skip


def in_sample_only(entry: dict, folder: Path, rule: scale_rule.ScaleRule) -> dict:
    """A system measured at one world size (``in_sample_only`` of the third split): its log in
    sample (:func:`in_sample`) and its description alone at that world size, with the share of
    its sizes inside the description's 80 % interval."""
    cluster, col, p = load_cluster(entry["cluster"]), entry["collective"], int(entry["world_size"])
    log = read(folder / entry["log"], col, p)
    sizes, meas = _rows(log)
    desc, low, high = _ours(cluster, p, sizes, col, calibration_fit.DESCRIPTION, rule)
    return {"system": entry["name"], "cluster": cluster.name, "collective": col,
            "licence": entry["licence"], "world_size": p, "nodes": cluster.nodes_for(p),
            "sizes": len(sizes),
            "in_sample": in_sample(cluster, p, log, col, cal.calibrate(cluster, [log], col), rule),
            "description": float(np.median(_err(desc, meas))),
            "description_covered": float(np.mean((low <= meas) & (meas <= high)))}  # fmt: skip


def score(
    fitted: dict, rule: scale_rule.ScaleRule, one_loss: scale_rule.ScaleRule | None = None
) -> dict:
    """In-sample, scale and ablation figures of one system under ``rule``; ``one_loss``: the
    same rule with one loss for rings and trees (run 5's), scored as an ablation."""
    system, cluster, logs = fitted["system"], fitted["cluster"], fitted["logs"]
    col, fit = system["collective"], fitted["fit"]
    out: dict = {"system": system["name"], "role": system["role"], "cluster": cluster.name,
                 "collective": col, "licence": system["licence"], "in_sample": {},
                 "scale": {}, "ablation": {}}  # fmt: skip
    for p, log in sorted(logs.items()):
        out["in_sample"][p] = in_sample(cluster, p, log, col, fitted["in_sample"][p], rule)
    out["fit"] = {**fit.factors(), "seen": list(fit.seen),
                  "residual_log_q80": fit.residual_log_q80,
                  "calibrated_nodes": fit.calibrated_nodes}  # fmt: skip
    out["main_calibration"] = asdict(fitted["main"])
    no_loss = replace(rule, ring_loss_per_doubling=0.0, tree_loss_per_doubling=0.0)
    for p in system["predict"]:
        sizes, meas = _rows(logs[p])
        published = np.array([r.time_us for r in predict(cluster, p, sizes, col)])
        desc, _, _ = _ours(cluster, p, sizes, col, calibration_fit.DESCRIPTION, rule)
        main_rows = collective_baseline.predict(cluster, p, sizes, col, fitted["main"])
        main = np.array([r.time_us for r in main_rows])
        ours, low, high = _ours(cluster, p, sizes, col, fit, rule)
        n = cluster.nodes_for(p)
        out["scale"][p] = {
            "nodes": n,
            "doublings": math.log2(n / fit.calibrated_nodes),
            "description": float(np.median(_err(desc, meas))),
            "main": float(np.median(_err(main, meas))),
            "ours": float(np.median(_err(ours, meas))),
            "covered": float(np.mean((low <= meas) & (meas <= high))),
            "log_error_ours": np.log(ours / meas).tolist(),
            "log_error_description": np.log(desc / meas).tolist(),
            "in_sample_q80": fit.residual_log_q80,
            "calibrated_nodes": fit.calibrated_nodes,
        }
        t, _, _ = _ours(cluster, p, sizes, col, fit, no_loss)
        out["ablation"].setdefault("no_scale_loss", {})[p] = float(np.median(_err(t, meas)))
        out["ablation"].setdefault("description_no_scale_loss", {})[p] = float(
            np.median(_err(published, meas))
        )
        if one_loss is not None:
            t, _, _ = _ours(cluster, p, sizes, col, fit, one_loss)
            out["ablation"].setdefault("one_loss", {})[p] = float(np.median(_err(t, meas)))
            t, _, _ = _ours(cluster, p, sizes, col, calibration_fit.DESCRIPTION, one_loss)
            out["ablation"].setdefault("description_one_loss", {})[p] = float(
                np.median(_err(t, meas))
            )
        for name, other in fitted["ablation"].items():
            t, _, _ = _ours(cluster, p, sizes, col, other, rule)
            out["ablation"].setdefault(name, {})[p] = float(np.median(_err(t, meas)))
    return out


LOSSES = {
    "calibrated": ("ring_loss_per_doubling", "tree_loss_per_doubling"),
    "description": ("description_ring_loss_per_doubling", "description_tree_loss_per_doubling"),
}
"""The scale rule's losses per doubling of nodes (ring, tree) that development systems fit."""


def _dev_error(dev: list[dict], rule: scale_rule.ScaleRule, model: str) -> float:
    """Median error of ``model`` (``calibrated`` or ``description``) over the development
    systems' scored points under ``rule``."""
    errs = []
    for f in dev:
        fit = f["fit"] if model == "calibrated" else calibration_fit.DESCRIPTION
        for p in f["system"]["predict"]:
            sizes, meas = _rows(f["logs"][p])
            t, _, _ = _ours(f["cluster"], p, sizes, f["system"]["collective"], fit, rule)
            errs.append(_err(t, meas))
    return float(np.median(np.concatenate(errs)))


def fit_losses(fitted: list[dict], rule: scale_rule.ScaleRule, model: str) -> dict[str, float]:
    """``model``'s (ring, tree) losses per doubling from development systems: the one grid value
    for both with the least median error over their scored points (run 5's single loss, kept
    as ``shared``), then each in turn over the grid with the other held, until neither moves
    (at most :data:`COORDINATE_ROUNDS`)."""
    dev = [f for f in fitted if f["system"]["role"] == "development"]
    ring, tree = LOSSES[model]

    def error(r: float, t: float) -> float:
        return _dev_error(dev, replace(rule, **{ring: r, tree: t}), model)

    shared = min(LOSS_GRID, key=lambda c: (error(c, c), c))
    r, t = shared, shared
    for _ in range(COORDINATE_ROUNDS):
        r2 = min(LOSS_GRID, key=lambda c: (error(c, t), c))
        t2 = min(LOSS_GRID, key=lambda c: (error(r2, c), c))
        if (r2, t2) == (r, t):
            break
        r, t = r2, t2
    return {ring: r, tree: t, "shared": shared}


def all_losses(fitted: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Both models' (ring, tree) losses from the development systems of ``fitted``
    (:func:`fit_losses`), and run 5's single loss of each model as the same fields."""
    losses, shared = {}, {}
    for model, fields in LOSSES.items():
        found = fit_losses(fitted, scale_rule.RULE, model)
        shared |= dict.fromkeys(fields, found.pop("shared"))
        losses |= found
    return losses, shared


def unseen_residuals(fitted: list[dict]) -> list[dict]:
    """Each development system scored under the losses the development systems of the other
    clusters fit (one cluster left out at a time): the residuals of a system whose own points
    chose nothing, as a held-out system's are, for :func:`fit_rule`."""
    dev = [f for f in fitted if f["system"]["role"] == "development"]
    out = []
    for cluster in sorted({f["system"]["cluster"] for f in dev}):
        others, _ = all_losses([f for f in dev if f["system"]["cluster"] != cluster])
        print(f"losses without {cluster}: {others}")
        rule = replace(scale_rule.RULE, **others)
        out += [score(f, rule) for f in dev if f["system"]["cluster"] == cluster]
    return out


def fit_rule(
    results: list[dict], losses: dict[str, float], one_node_as_two: bool = False
) -> scale_rule.ScaleRule:
    """The interval rule from development systems' ``results``: the description's 80th
    percentile of ``|log error|``; the calibrated one's widening per doubling of nodes, the least
    that covers 80 % of the development points on top of each fit's own in-sample spread (and,
    unless ``one_node_as_two``, of the description's width for a one-node fit's points)."""
    dev = [r for r in results if r["role"] == "development"]
    desc = np.abs(np.concatenate([s["log_error_description"] for r in dev
                                  for s in r["scale"].values()]))  # fmt: skip
    description_log = float(np.quantile(desc, TARGET_COVERAGE))
    floor = scale_rule.RULE.calibrated_floor_log
    need = []
    for r in dev:
        for s in r["scale"].values():
            base = max(s["in_sample_q80"], floor)
            for e in np.abs(s["log_error_ours"]):
                one_node = s["calibrated_nodes"] == 1 and s["nodes"] > 1 and not one_node_as_two
                if one_node and e <= description_log:
                    need.append(0.0)  # inside the description's width, a one-node fit's least
                else:
                    need.append(max(0.0, e - base) / max(s["doublings"], 1.0))
    per = float(np.quantile(need, TARGET_COVERAGE)) if need else 0.0
    return scale_rule.ScaleRule(description_log=description_log, calibrated_floor_log=floor,
                                per_doubling_log=per, **losses)  # fmt: skip


KEEP = {"all": lambda r: True, "no_broadcast": lambda r: r["collective"] != "broadcast"}


def coverage(
    results: list[dict],
    rule: scale_rule.ScaleRule,
    role: str,
    keep=KEEP["all"],
    one_node_as_two: bool = False,
) -> dict:
    """Share of scored points inside the 80 % interval (``rule``), calibrated and description;
    ``one_node_as_two``: without run 9's least width of a one-node fit (the ablation)."""
    inside_c, inside_d, total = 0, 0, 0
    for r in (x for x in results if x["role"] == role and keep(x)):
        for s in r["scale"].values():
            half = scale_rule.calibrated_halfwidth_log(
                s["in_sample_q80"], s["calibrated_nodes"], s["nodes"], rule
            )
            if one_node_as_two:  # run 7's: a one-node fit widens by its doublings only
                base = max(s["in_sample_q80"], rule.calibrated_floor_log)
                half = base + rule.per_doubling_log * max(0.0, s["doublings"])
            inside_c += int(np.sum(np.abs(s["log_error_ours"]) <= half))
            inside_d += int(np.sum(np.abs(s["log_error_description"]) <= rule.description_log))
            total += len(s["log_error_ours"])
    return {"points": total, "calibrated": inside_c / total if total else None,
            "description": inside_d / total if total else None}  # fmt: skip


def summary(results: list[dict]) -> dict:
    """Per role, the median over (system, world size) of each model's median error: every
    system, and without broadcast (which no variant reproduces: benchmarks/README.md)."""
    out: dict = {}
    for role in ROLES:
        for label, keep in KEEP.items():
            rows = [(r, p) for r in results if r["role"] == role and keep(r) for p in r["scale"]]
            if not rows:
                continue
            names = ["description", "main", "ours"]
            doc = {n: float(np.median([r["scale"][p][n] for r, p in rows])) for n in names}
            for name in rows[0][0]["ablation"]:
                doc[name] = float(np.median([r["ablation"][name][p] for r, p in rows]))
            out[f"{role}/{label}"] = doc
    return out


SHORT = {role: role.replace("_", " ") for role in ROLES} | {"development": "dev"}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--external-logs", type=Path, help="local copy of unlicensed logs")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument("--only", choices=ROLES,
                        help="score the development systems (they fit the losses and the "
                             "interval rule) and this role's only")  # fmt: skip
    parser.add_argument("--write-rule", action="store_true",
                        help="write the interval rule fitted on development systems")  # fmt: skip
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    split = load_yaml(read_text(SPLIT, "the split file"), str(SPLIT))["systems"]
    later = {role: load_yaml(read_text(path, "the split file"), str(path))
             for role, path in LATER_SPLITS.items()}  # fmt: skip
    for role, path in LATER_SPLITS.items():
        for system in later[role]["systems"]:
            if system["role"] != "held_out":
                raise ValueError(f"{path}: {system['name']}: role must be held_out")
            split.append({**system, "role": role})
    fitted, left_out, one_size = [], [], []
    for system in split:
        if args.only not in (None, system["role"]) and system["role"] != "development":
            continue
        folder = DATA if system["licence"] != "none" else args.external_logs
        if folder is None or not all((folder / p).is_file() for p in system["logs"].values()):
            left_out.append(system["name"])
            print(f"{system['name']}: left out (no local copy of its logs)")
            continue
        fitted.append(fit_system(system, folder))
    losses, shared = all_losses(fitted)
    dev = [f for f in fitted if f["system"]["role"] == "development"]
    first = [score(f, replace(scale_rule.RULE, **losses)) for f in dev]  # fit_rule reads these
    unseen = unseen_residuals(fitted)
    rule = fit_rule(unseen, losses)
    rule_off = fit_rule(unseen, losses, one_node_as_two=True)  # run 7's pipeline
    results = [score(f, rule, one_loss=replace(rule, **shared)) for f in fitted]
    cov = {f"{role}/{k}": coverage(results, rule, role, keep)
           for role in ROLES for k, keep in KEEP.items()}  # fmt: skip
    cov_off = {f"{role}/{k}": coverage(results, rule_off, role, keep, one_node_as_two=True)
               for role in ROLES for k, keep in KEEP.items()}  # fmt: skip
    seen_rule = fit_rule(first, losses)  # run 6's: residuals under the losses they chose
    cov_seen = {f"{role}/{k}": coverage(results, seen_rule, role, keep)
                for role in ROLES for k, keep in KEEP.items()}  # fmt: skip
    print(f"{'system':<22} {'role':<11} {'p':>5} {'desc':>7} {'main':>7} {'ours':>7}  ablations")
    for r in results:
        for p, s in r["scale"].items():
            abl = " ".join(f"{k}={_pct(v[p])}" for k, v in r["ablation"].items())
            print(f"{r['system']:<22} {r['role']:<11} {p:>5} {_pct(s['description']):>7} "
                  f"{_pct(s['main']):>7} {_pct(s['ours']):>7}  {abl}")  # fmt: skip
        ins = ", ".join(f"{p}: {_pct(v['median_error'])} ({_pct(v['leave_one_out'])})"
                        for p, v in r["in_sample"].items())  # fmt: skip
        print(f"{'':<22} in sample {ins}")
    pooled = summary(results)
    print(f"interval rule (development): {rule}; coverage {cov}")
    print(f"run 6's rule (residuals under their own losses): {seen_rule}; coverage {cov_seen}")
    print(f"run 7's rule (a one-node fit as any other): {rule_off}; coverage {cov_off}")
    for key, doc in pooled.items():
        print(f"{key}: " + ", ".join(f"{k} {_pct(v)}" for k, v in doc.items()))
    one_size_entries = later["held_out_3"].get("in_sample_only", [])
    for entry in one_size_entries if args.only in (None, "held_out_3") else []:
        folder = DATA if entry["licence"] != "none" else args.external_logs
        if folder is None or not (folder / entry["log"]).is_file():
            left_out.append(entry["name"])
            print(f"{entry['name']}: left out (no local copy of its log)")
            continue
        one_size.append(in_sample_only(entry, folder, rule))
        r = one_size[-1]
        print(f"{r['system']:<22} held_out_3  {r['world_size']:>5} {r['collective']}: in sample "
              f"{_pct(r['in_sample']['median_error'])} ({_pct(r['in_sample']['leave_one_out'])}), "
              f"description {_pct(r['description'])}, "
              f"inside its interval {_pct(r['description_covered'])}")  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    doc = {"benchmark": "collective_scale", "commit": commit, "load_avg": load,
           "left_out": left_out, "interval_rule": asdict(rule), "coverage": cov,
           "interval_rule_seen": asdict(seen_rule), "coverage_seen": cov_seen,
           "interval_rule_one_node_as_two": asdict(rule_off),
           "coverage_one_node_as_two": cov_off,
           "summary": pooled,
           "systems": results, "in_sample_only": one_size}  # fmt: skip
    if args.write_rule:
        text = RULE.read_text().split("description_log")[0]
        body = "".join(f"{k}: {v:.4f}\n" for k, v in asdict(rule).items())
        RULE.write_text(text + body)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        figures = "; ".join(
            f"{r['system']} ({SHORT[r['role']]}): "
            + ", ".join(
                f"{p}: {_pct(s['description'])}/{_pct(s['main'])}/{_pct(s['ours'])}"
                for p, s in r["scale"].items()
            )
            for r in results
        )
        figures += (
            f"; coverage held out {_pct(cov['held_out/all']['calibrated'])}, second held-out set "
            f"{_pct(cov['held_out_2/all']['calibrated'])}, third "
            f"{_pct(cov['held_out_3/all']['calibrated'])}; "
            + "".join(
                f"{r['system']} (held out 3, one size) {r['world_size']}: in sample "
                f"{_pct(r['in_sample']['median_error'])}, description {_pct(r['description'])}; "
                for r in one_size
            )
            + f"load {load}"
        )
        ledger.print_row("collective_scale", change=args.change, figures=figures,
                         files=[args.out])  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
