"""Analysis of ``bench_step_model.py``'s dataset: the fixed split, four models, their errors.

The split (benchmarks/README.md, "Step model"): calibrate per model on its 25 MiB cells at
p = 2, predict the other caps at p = 2 and the p = 4 cell. Two calibrations, both reported:
``pooled`` (the headline): the 25 MiB cells of every round pooled (``calibrate_step`` on
repeats; each runs the full microbenchmark, whose mean times are pooled for the link fit);
``round0``: round 0's 25 MiB cell alone. Both take the interference factors of the host
(``step_advice.host_interference``: every p = 2 cell that ran the arms, which in this benchmark
are the calibration cells of all three models). One cell is not enough: in one collection
round 0's calibration cells ran 0.83 to 0.90 times their configuration's median step, so every
cap was under-predicted by about as much. No validation cell enters either calibration. The
p = 4 cells run on the same 2-core host as the calibration, so the headline p = 4 prediction
uses ``same_host=True`` (compute slowed by the core share, known before running); the
prediction without it is reported too.
"""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from commprof import results
from commprof.catalog import parameter_sizes
from commprof.modeling.ring_fit import (
    CalibrationWarning,
    bucket_latency_points,
    fit_alpha_beta,
)
from commprof.modeling.step_advice import (
    IDLE,
    CapPrediction,
    StepModel,
    best_of,
    load_step_model,
    predict_cap,
)

CAPS_MB = (0.25, 1.0, 4.0, 25.0)
CALIBRATION_CAP_MB = 25.0
CALIBRATION_ROUND = 0
"""The round whose 25 MiB cells run the full microbenchmark (link fit, interference)."""
SPLITS = ("pooled", "round0")
BIG_WORLD = ("srn-10m", 4, 25.0)
REGRET_TOLERANCE = 0.03
"""A recommended cap is a hit when its measured step is within 3 % of the round's best."""
MODELS = ("simulator", "simulator_median", "idle_ring", "bucket_sum", "no_overlap")
"""``simulator_median``: the simulator with the interference factors of the median pair ratio
(``slowdown``) in place of the mean (``slowdown_mean``), an ablation of that choice."""
PAIRS_FILE = "pairs.json"
"""The step-interleaved pairs in a dataset (``bench_step_model._pairs_gang``)."""
ADVISED = ("simulator", "simulator_median", "idle_ring")
"""Models whose cap advice is scored."""


def _measured(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per cell: median step and median exposed (hook) over ranks and measured steps.

    A rank-step's exposed communication is the largest of its buckets' ``exposed_ns``: each is
    ``done - max(ready, compute end)``, so they all start at the compute end (or later, for the
    last bucket, at its own ready time, which is the compute end) and their union is the
    longest one; their sum would count twice what two gloo channels ran at once.
    """
    steps = tables["steps"]
    steps = steps[steps["measured"].astype(bool)]
    exposed = (
        tables["buckets"]
        .merge(
            steps[["cell_id", "attempt", "rank", "step"]], on=["cell_id", "attempt", "rank", "step"]
        )
        .groupby(["cell_id", "rank", "step"])["exposed_ns"]
        .max()
        .groupby("cell_id")
        .median()
    )
    step = steps.groupby("cell_id")["step_ns"].median()
    cells = tables["cells"].set_index("cell_id")[["model", "world_size", "bucket_cap_mb", "repeat"]]
    return cells.join(step.rename("step_ns")).join(exposed.rename("exposed_ns")).reset_index()


def _models(
    tables: dict[str, pd.DataFrame], name: str, sizes: list[tuple[str, int]], cal_id: list[str],
    link_cells: list[str],
) -> tuple[StepModel, StepModel]:  # fmt: skip
    """The step model calibrated on ``cal_id``, its link on ``link_cells`` (the calibration
    cells of every model: the host's, none held out): mean interference factors, then median."""
    return tuple(  # type: ignore[return-value]
        load_step_model(
            tables, name, world_size=2, param_sizes=sizes, cell_id=cal_id,
            interference_statistic=statistic, link_cells=link_cells,
        )
        for statistic in ("mean", "median")
    )  # fmt: skip


def _baselines(
    models: tuple[StepModel, StepModel], tables: dict[str, pd.DataFrame],
    sizes: list[tuple[str, int]], cap: float, world_size: int, same_host: bool,
) -> tuple[dict[str, tuple[float, float]], dict[str, CapPrediction]]:  # fmt: skip
    """(step, exposed) per model for one cap, and the advised models' predictions (what the
    advice picks from); ``models``: mean and median interference."""
    model = models[0]
    cal = model.calibration
    sim = predict_cap(model, sizes, bucket_cap_mb=cap, world_size=world_size, same_host=same_host)
    sim_median = predict_cap(
        models[1], sizes, bucket_cap_mb=cap, world_size=world_size, same_host=same_host
    )
    idle = predict_cap(
        model, sizes, bucket_cap_mb=cap, world_size=world_size, same_host=same_host,
        corrections=IDLE,
    )  # fmt: skip
    fixed = idle.step_ns - idle.prediction.backward_ns  # forward + optimizer + other, scaled
    compute = idle.prediction.compute_end_ns
    idle_sum = sum(b.service_ns for b in idle.prediction.buckets)
    # bucket_sum: the in-training bucket times of the calibration cell, fitted on size
    buckets = tables["buckets"].merge(
        tables["cells"][["cell_id", "attempt", "backend", "device", "world_size"]],
        on=["cell_id", "attempt"],
    )
    points = bucket_latency_points(
        buckets[buckets["cell_id"] == cal.cell_id], tables["steps"], time_column="transfer_ns"
    )
    nbytes = [b.num_bytes for b in idle.prediction.buckets]
    if points["num_bytes"].nunique() < 2:
        # one bucket size in the calibration cell (srn-1m at 25 MiB is one bucket): a ring fit
        # cannot separate alpha and beta, so the time is taken proportional to bytes
        per_byte = float((points["transfer_ns"] / points["num_bytes"]).median())
        in_training = per_byte * sum(nbytes)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            fit = fit_alpha_beta(points["num_bytes"], points["transfer_ns"], cal.world_size)
        in_training = float(fit.predict_ns(nbytes, world_size).sum())
    return {
        "simulator": (sim.step_ns, sim.exposed_ns),
        "simulator_median": (sim_median.step_ns, sim_median.exposed_ns),
        "idle_ring": (idle.step_ns, idle.exposed_ns),
        "bucket_sum": (fixed + compute + in_training, in_training),
        "no_overlap": (fixed + compute + idle_sum, idle_sum),
    }, {"simulator": sim, "simulator_median": sim_median, "idle_ring": idle}


def _errors(pred: tuple[float, float], step: float, exposed: float) -> dict[str, float]:
    return {
        "pred_step_ms": pred[0] / 1e6,
        "pred_exposed_ms": pred[1] / 1e6,
        "step_ape_pct": 100 * abs(pred[0] - step) / step,
        "exposed_err_pct_of_step": 100 * abs(pred[1] - exposed) / step,
    }


def _calibration_cells(measured: pd.DataFrame, name: str, cap: float, split: str) -> list[str]:
    """The calibration cells of ``name`` at p = 2 and ``cap``: round 0's first."""
    rows = measured[
        (measured["model"] == name) & (measured["world_size"] == 2)
        & (measured["bucket_cap_mb"] == cap)
    ].sort_values("repeat")  # fmt: skip
    if split == "round0":
        rows = rows[rows["repeat"] == CALIBRATION_ROUND]
    if rows.empty or int(rows["repeat"].iloc[0]) != CALIBRATION_ROUND:
        raise ValueError(f"no round-{CALIBRATION_ROUND} {cap} MiB cell of {name} to calibrate on")
    return [str(c) for c in rows["cell_id"]]


def _link_cells(measured: pd.DataFrame, split: str) -> list[str]:
    """The calibration cells of every model (the link's microbenchmarks: the host's, pooled; no
    held-out cell)."""
    names = sorted(set(measured["model"]))
    return [c for n in names for c in _calibration_cells(measured, n, CALIBRATION_CAP_MB, split)]


def _per_model(
    name: str, tables: dict[str, pd.DataFrame], measured: pd.DataFrame, split: str,
    pairs: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    sizes = parameter_sizes(name)
    mine = measured[(measured["model"] == name) & (measured["world_size"] == 2)]
    cal_id = _calibration_cells(measured, name, CALIBRATION_CAP_MB, split)
    models = _models(tables, name, sizes, cal_id, _link_cells(measured, split))
    out: dict[str, Any] = {
        "calibration_cells": cal_id, "link_scale": models[0].link_scale,
        "stall_ms": models[0].stall_ns / 1e6, "caps": {},
    }  # fmt: skip
    predicted: dict[str, list[CapPrediction]] = {m: [] for m in ADVISED}
    for cap in CAPS_MB:
        rows = mine[mine["bucket_cap_mb"] == cap]
        step, exposed = float(rows["step_ns"].median()), float(rows["exposed_ns"].median())
        preds, points = _baselines(models, tables, sizes, cap, 2, same_host=False)
        for m in ADVISED:
            predicted[m].append(points[m])
        out["caps"][str(cap)] = {
            "held_out": cap != CALIBRATION_CAP_MB,
            "measured_step_ms": step / 1e6,
            "measured_exposed_ms": exposed / 1e6,
            "rounds": len(rows),
            **{m: _errors(preds[m], step, exposed) for m in MODELS},
        }
    held = [v for v in out["caps"].values() if v["held_out"]]
    out["held_out"] = {
        m: {
            "step_mape_pct": statistics.mean(v[m]["step_ape_pct"] for v in held),
            "step_ape_median_pct": statistics.median(v[m]["step_ape_pct"] for v in held),
            "exposed_err_max_pct_of_step": max(v[m]["exposed_err_pct_of_step"] for v in held),
        }
        for m in MODELS
    }
    layouts = _layouts(tables, mine)
    out["advice"] = {m: _regret(mine, predicted[m], layouts) for m in ADVISED}
    if any(name in rank for entry in pairs for rank in entry["ranks"]):
        for m in ADVISED:
            rec = out["advice"][m]["recommended_cap_mb"]
            out["advice"][m]["interleaved"] = _regret_interleaved(pairs, name, rec, layouts)
    return out


def _layouts(tables: dict[str, pd.DataFrame], mine: pd.DataFrame) -> dict[float, tuple[int, ...]]:
    """Per cap, the bucket sizes (bytes, by index) DDP made in its first measured cell."""
    buckets = tables["buckets"]
    out = {}
    for cap, rows in mine.sort_values("repeat").groupby("bucket_cap_mb"):
        first = buckets[buckets["cell_id"] == rows["cell_id"].iloc[0]]
        out[float(cap)] = tuple(first.groupby("bucket_index")["num_bytes"].first().sort_index())
    return out


def _regret(
    mine: pd.DataFrame, predicted: list[CapPrediction], layouts: dict[float, tuple[int, ...]]
) -> dict[str, Any]:
    """Is the recommended cap's measured step within 3 % of the best measured cap's?

    The recommended cap is the one ``commprof estimate --recommend-bucket-cap`` names from the
    predicted curve (``step_advice.best_of``: near-ties to fewer buckets, and, as it names it to
    a user who runs the calibration cap, that cap kept where the model cannot tell it from the
    cap it would name).

    Three readings on the cells, beside the interleaved headline. ``pairs`` (the issue's: "the
    best measured cap" is the cap with the shortest median step over all rounds; each round is
    one interleaved pair of it and the recommended cap). ``round_best`` (stricter: against the
    shortest of the four caps in that round, a minimum of four noisy values). ``same_layout``:
    the pairs reading where two caps that DDP buckets identically (``layouts``, as recorded)
    count as one configuration, so a pair of them has no regret (srn-1m at 4 and 25 MiB: one
    4 MB bucket at both).
    """
    in_use = next(p for p in predicted if p.bucket_cap_mb == CALIBRATION_CAP_MB)
    rec = best_of(predicted, in_use=in_use).bucket_cap_mb
    medians = mine.groupby("bucket_cap_mb")["step_ns"].median()
    best = float(medians.idxmin())
    pair_ratios, round_ratios = [], []
    for _, rows in mine.groupby("repeat"):
        by_cap = dict(zip(rows["bucket_cap_mb"], rows["step_ns"], strict=True))
        if set(by_cap) != set(CAPS_MB):
            continue
        pair_ratios.append(by_cap[rec] / by_cap[best])
        round_ratios.append(by_cap[rec] / min(by_cap.values()))
    reading = _pairs_reading(pair_ratios, round_ratios)
    same = layouts[rec] == layouts[best]
    return {
        "recommended_cap_mb": rec,
        "best_measured_cap_mb": best,
        "same_layout": same,
        "hits_same_layout": len(pair_ratios) if same else reading["hits"],
        "median_step_ratio_to_best": float(medians[rec] / medians[best]),
        **reading,
    }


def _pairs_reading(pair_ratios: list[float], round_ratios: list[float]) -> dict[str, Any]:
    """Rounds, hits (a ratio within :data:`REGRET_TOLERANCE` of 1 or below) and the ratios of
    the recommended cap's step to the best measured cap's and to the round's shortest."""
    return {
        "rounds": len(pair_ratios),
        "hits": sum(r <= 1 + REGRET_TOLERANCE for r in pair_ratios),
        "hits_round_best": sum(r <= 1 + REGRET_TOLERANCE for r in round_ratios),
        "step_ratio_to_best": pair_ratios,
        "step_ratio_to_round_best": round_ratios,
    }


def _regret_interleaved(
    pairs: list[dict[str, Any]], name: str, rec: float, layouts: dict[float, tuple[int, ...]]
) -> dict[str, Any]:
    """The advice against the step-interleaved pairs (the headline reading).

    Per round, each cap's measured step is the median of its steps in that round's interleaved
    run (both ranks' steps); "the best measured cap" is the cap with the shortest median over all
    rounds' steps; each round is one pair of the recommended and that cap, a hit within 3 %.
    """
    per_round: list[dict[float, float]] = []
    pooled: dict[float, list[int]] = {}
    for entry in pairs:
        steps: dict[float, list[int]] = {}
        for rank in entry["ranks"]:
            for cap, ns in rank.get(name, {}).items():
                steps.setdefault(float(cap), []).extend(ns)
                pooled.setdefault(float(cap), []).extend(ns)
        if steps:
            per_round.append({cap: statistics.median(ns) for cap, ns in steps.items()})
    medians = {cap: statistics.median(ns) for cap, ns in pooled.items()}
    best = min(medians, key=medians.__getitem__)
    ratios = [r[rec] / r[best] for r in per_round]
    round_ratios = [r[rec] / min(r.values()) for r in per_round]
    return {
        "recommended_cap_mb": rec,
        "best_measured_cap_mb": best,
        "same_layout": layouts[rec] == layouts[best],
        "median_step_ms": {str(cap): m / 1e6 for cap, m in sorted(medians.items())},
        "median_step_ratio_to_best": medians[rec] / medians[best],
        **_pairs_reading(ratios, round_ratios),
    }


def _big_world(
    tables: dict[str, pd.DataFrame], measured: pd.DataFrame, split: str
) -> dict[str, Any]:
    name, world, cap = BIG_WORLD
    sizes = parameter_sizes(name)
    models = _models(
        tables, name, sizes, _calibration_cells(measured, name, cap, split),
        _link_cells(measured, split),
    )  # fmt: skip
    rows = measured[(measured["model"] == name) & (measured["world_size"] == world)]
    step, exposed = float(rows["step_ns"].median()), float(rows["exposed_ns"].median())
    out: dict[str, Any] = {
        "model": name, "world_size": world, "bucket_cap_mb": cap, "rounds": len(rows),
        "measured_step_ms": step / 1e6, "measured_exposed_ms": exposed / 1e6,
    }  # fmt: skip
    for same_host in (True, False):
        preds, _ = _baselines(models, tables, sizes, cap, world, same_host=same_host)
        out["same_host" if same_host else "own_devices"] = {
            m: _errors(preds[m], step, exposed) for m in MODELS
        }
    return out


def _split(
    tables: dict[str, pd.DataFrame], measured: pd.DataFrame, split: str,
    pairs: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    per_model = {
        name: _per_model(name, tables, measured, split, pairs)
        for name in sorted(set(measured["model"]))
        if (measured["model"] == name).any()
    }
    big = _big_world(tables, measured, split)
    summary: dict[str, Any] = {}
    for name, r in per_model.items():
        advice = r["advice"]["simulator"]
        summary[name] = {
            "held_out_step_mape_pct": {
                m: round(r["held_out"][m]["step_mape_pct"], 1) for m in MODELS
            },
            "held_out_exposed_err_max_pct_of_step": {
                m: round(r["held_out"][m]["exposed_err_max_pct_of_step"], 1) for m in MODELS
            },
            "advice_hits": f"{advice['hits']}/{advice['rounds']} "
            f"(recommended {advice['recommended_cap_mb']} MiB, "
            f"best measured {advice['best_measured_cap_mb']} MiB)",
            "advice_hits_round_best": f"{advice['hits_round_best']}/{advice['rounds']}",
            "advice_hits_same_layout": f"{advice['hits_same_layout']}/{advice['rounds']}",
        }
        if "interleaved" in advice:
            inter = advice["interleaved"]
            summary[name]["advice_hits_interleaved"] = (
                f"{inter['hits']}/{inter['rounds']} (best measured "
                f"{inter['best_measured_cap_mb']} MiB; round best {inter['hits_round_best']})"
            )
    summary["p2_to_p4"] = {
        k: round(big[k]["simulator"]["step_ape_pct"], 1) for k in ("same_host", "own_devices")
    }
    return {"summary": summary, "models": per_model, "p2_to_p4": big}


def analyze(data: Path) -> dict[str, Any]:
    """The report of one collected dataset: the headline split, then the other one."""
    tables = results.load(data)
    measured = _measured(tables)
    pairs_file = data / PAIRS_FILE
    pairs = json.loads(pairs_file.read_text()) if pairs_file.exists() else []
    out = _split(tables, measured, SPLITS[0], pairs)
    other = _split(tables, measured, SPLITS[1], pairs)
    return {**out, **{f"{k}_{SPLITS[1]}": v for k, v in other.items()}, "split": SPLITS[0]}
