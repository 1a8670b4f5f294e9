"""Fits recover known parameters; degenerate data is refused or flagged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commprof import results
from commprof.modeling.collective.dataset_fits import (
    bucket_latency_points,
    fit_table,
    fits_from_dataset,
    load_fits,
    save_fits,
)
from commprof.modeling.collective.fit_scores import holdout_split, leave_one_out_errors, mape
from commprof.modeling.collective.ring_fit import (
    CalibrationWarning,
    RingFit,
    fit_alpha_beta,
    fit_alpha_only,
    fit_piecewise,
)
from commprof.results import load

SIZES = 2.0 ** np.arange(10, 27)  # 1 KiB .. 64 MiB
ALPHA_NS, BETA = 50_000.0, 1.0  # 50 us, 1 GB/s


def ring(n: np.ndarray, p: int, alpha: float = ALPHA_NS, beta: float = BETA) -> np.ndarray:
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def test_alpha_beta_exact_on_noise_free_data() -> None:
    fit = fit_alpha_beta(SIZES, ring(SIZES, 4), 4)
    assert fit.alpha_ns == pytest.approx(ALPHA_NS, rel=1e-9)
    assert fit.beta_ns_per_byte == pytest.approx(BETA, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert max(abs(r) for r in fit.residuals_rel) < 1e-9


def test_confidence_intervals_cover_truth_with_noise() -> None:
    # Multiplicative 2 % noise is exactly the model the weighted fit assumes, so the
    # 95 % intervals should cover the truth in about 95 % of 400 draws (binomial
    # standard deviation about 1.1 %: the band below is about 4 sigma wide).
    rng = np.random.default_rng(0)
    hits_alpha = hits_beta = 0
    for _ in range(400):
        t = ring(SIZES, 2) * (1 + 0.02 * rng.standard_normal(SIZES.size))
        fit = fit_alpha_beta(SIZES, t, 2)
        hits_alpha += fit.alpha_ci_ns[0] < ALPHA_NS < fit.alpha_ci_ns[1]
        hits_beta += fit.beta_ci_ns_per_byte[0] < BETA < fit.beta_ci_ns_per_byte[1]
    assert 0.90 < hits_alpha / 400 < 0.99
    assert 0.90 < hits_beta / 400 < 0.99
    assert fit.num_points == SIZES.size and len(fit.residuals_rel) == SIZES.size


def test_relative_weighting_keeps_small_messages_accurate() -> None:
    rng = np.random.default_rng(1)
    t = ring(SIZES, 2) * (1 + 0.05 * rng.standard_normal(SIZES.size))
    fit = fit_alpha_beta(SIZES, t, 2)
    small = SIZES <= 16384
    assert mape(fit.predict_ns(SIZES[small], 2), ring(SIZES[small], 2)) < 10


def test_alpha_only_recovers_alpha_given_true_beta() -> None:
    fit = fit_alpha_only(SIZES, ring(SIZES, 2), 2, beta_ns_per_byte=BETA)
    assert fit.alpha_ns == pytest.approx(ALPHA_NS, rel=1e-9)
    assert fit.method == "alpha-only"
    with pytest.warns(CalibrationWarning, match="alpha"):
        fit_alpha_only(SIZES, ring(SIZES, 2), 2, beta_ns_per_byte=10 * BETA)


def test_degenerate_data() -> None:
    with pytest.raises(ValueError, match="one size"):
        fit_alpha_beta([4096] * 5, [1.0, 2.0, 3.0, 4.0, 5.0], 2)
    with pytest.raises(ValueError, match="at least 3"):
        fit_alpha_beta([1024, 2048], [1.0, 2.0], 2)
    with pytest.raises(ValueError, match="world_size"):
        fit_alpha_beta(SIZES, ring(SIZES, 2), 1)
    with pytest.raises(ValueError, match="> 0"):
        fit_alpha_beta(SIZES, -ring(SIZES, 2), 2)
    # Pure bandwidth data with a constant subtracted: unconstrained alpha < 0.
    t = ring(SIZES, 2, alpha=0.0) - 1000.0
    t = t[SIZES >= 65536]
    with pytest.warns(CalibrationWarning, match="clamped alpha"):
        fit = fit_alpha_beta(SIZES[SIZES >= 65536], t, 2)
    assert fit.alpha_ns == 0.0 and fit.beta_ns_per_byte > 0


def test_piecewise_finds_regime_change() -> None:
    # Two regimes switching between 64 KiB and 128 KiB.
    t = np.where(SIZES <= 65536, ring(SIZES, 2), ring(SIZES, 2, alpha=200_000.0, beta=0.5))
    fit = fit_piecewise(SIZES, t, 2, num_segments=2)
    assert fit.upper_bytes[0] == pytest.approx(np.sqrt(65536 * 131072))
    assert mape(fit.predict_ns(SIZES, 2), t) < 1e-6
    single = fit_alpha_beta(SIZES, t, 2)
    assert mape(single.predict_ns(SIZES, 2), t) > 1.0
    with pytest.raises(ValueError, match="segments"):
        fit_piecewise(SIZES[:5], t[:5], 2, num_segments=2)


def test_mape_and_holdout() -> None:
    assert mape([110, 90], [100, 100]) == pytest.approx(10.0)
    fit_mask, held = holdout_split(np.array([4, 1, 2, 8, 2]))
    assert fit_mask.tolist() == [True, True, False, False, False]
    assert held.tolist() == [False, False, True, True, True]


def test_leave_one_out_predicts_each_size_from_the_others() -> None:
    t = ring(SIZES, 4)
    assert np.abs(leave_one_out_errors(SIZES, t, 4, fit_alpha_beta)).max() < 1e-9
    # One size measured 1.5x slow: the fit on the other (exact) sizes predicts the true time,
    # so that size's error is 1 / 1.5 - 1 exactly; the others see it in their fits.
    slow = t.copy()
    slow[7] *= 1.5
    errors = leave_one_out_errors(SIZES, slow, 4, fit_alpha_beta)
    assert errors[7] == pytest.approx(1 / 1.5 - 1, rel=1e-9)
    assert np.abs(np.delete(errors, 7)).max() < 1 / 3
    with pytest.raises(ValueError, match="one measured time"):
        leave_one_out_errors(SIZES, t[:-1], 4, fit_alpha_beta)


def test_fit_table_groups_by_backend_regime_world_size(tmp_path: Path) -> None:
    rows = []
    for ws in (2, 4):
        for n, t in zip(SIZES, ring(SIZES, ws), strict=True):
            rows.append(
                {
                    "cell_id": f"c{ws}",
                    "attempt": 0,
                    "backend": "gloo",
                    "device": "cpu",
                    "world_size": ws,
                    "num_bytes": int(n),
                    "time_p50_ns": int(t),
                    "num_wrong": 0,
                }
            )
    fits = fit_table(pd.DataFrame(rows))
    assert set(fits) == {("gloo", "cpu-gloo", 2), ("gloo", "cpu-gloo", 4)}
    for fit in fits.values():
        assert isinstance(fit, RingFit)
        assert fit.alpha_ns == pytest.approx(ALPHA_NS, rel=1e-3)
    path = tmp_path / "fits.json"
    save_fits(fits, path)
    assert load_fits(path) == fits
    with pytest.raises(ValueError, match="beta_ns_per_byte"):
        fit_table(pd.DataFrame(rows), method="alpha-only")


def test_bucket_latency_points_keep_measured_steps_and_take_max_over_ranks() -> None:
    # Steps 0 and 1 are warm-up (measured False); step 1 already has the rebuilt buckets, so
    # a filter on step >= 1 alone would keep it.
    df = pd.DataFrame(
        {
            "cell_id": "c",
            "attempt": 0,
            "backend": "gloo",
            "device": "cpu",
            "world_size": 2,
            "rank": [0, 1, 0, 1, 0, 1, 0, 1],
            "step": [0, 0, 1, 1, 2, 2, 2, 2],
            "bucket_index": [0, 0, 0, 0, 0, 0, 1, 1],
            "num_bytes": [300, 300, 100, 100, 100, 100, 200, 200],
            "latency_ns": [9, 9, 99, 99, 5, 7, 11, 3],
        }
    )
    steps = pd.DataFrame(
        {
            "cell_id": "c",
            "attempt": 0,
            "rank": [0, 1, 0, 1, 0, 1],
            "step": [0, 0, 1, 1, 2, 2],
            "measured": [False, False, False, False, True, True],
        }
    )
    pts = bucket_latency_points(df, steps).sort_values("bucket_index")
    assert pts["step"].tolist() == [2, 2]
    assert pts["latency_ns"].tolist() == [max(5, 7), max(11, 3)]
    assert pts["num_bytes"].tolist() == [100, 200]


@pytest.mark.filterwarnings("ignore::commprof.modeling.collective.ring_fit.CalibrationWarning")
def test_fits_from_dataset_buckets_fit_measured_steps_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The smoke dataset has warmup_steps = 2: step 1 is recorded but not measured. The test
    # replaces transfer_ns by latency times a rank- and step-dependent factor, so that warm-up
    # rows would move the fit.
    root = Path(__file__).parent / "data" / "results_smoke"
    tables = load(root)
    b = tables["buckets"]
    tables["buckets"] = b.assign(transfer_ns=b["latency_ns"] * (1 + b["step"] % 2 + b["rank"]))
    monkeypatch.setattr(results, "load", lambda _root: tables)
    assert not tables["steps"].loc[tables["steps"]["step"] == 1, "measured"].any()
    cells = tables["cells"][["cell_id", "attempt", "backend", "device", "world_size"]]
    joined = tables["buckets"].merge(cells, on=["cell_id", "attempt"])
    steps = tables["steps"]
    measured = steps.loc[steps["measured"], ["cell_id", "attempt", "rank", "step"]]
    by_hand = joined.merge(measured, on=["cell_id", "attempt", "rank", "step"])
    keys = ["backend", "device", "world_size", "cell_id", "attempt", "step", "bucket_index"]
    points = by_hand.groupby(keys, as_index=False).agg(
        num_bytes=("num_bytes", "first"), transfer_ns=("transfer_ns", "max")
    )
    expected = fit_table(points, time_column="transfer_ns")
    assert fits_from_dataset(root, source="buckets") == expected
    after_step0 = steps.assign(measured=steps["step"] >= 1)  # the old filter
    warm_too = bucket_latency_points(joined, after_step0, time_column="transfer_ns")
    assert fit_table(warm_too, time_column="transfer_ns") != expected
