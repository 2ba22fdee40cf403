"""OnlineCalibrator: the served forecasts' own errors set the upper band, per lead."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prescaler_forecast import Forecast, ForecastPoint
from prescaler_forecast._conformal import OnlineCalibrator

STEP = 60.0
T0 = 1_704_067_200.0


def _flat(now: float, level: float, leads: int = 5, upper: float = 1.05) -> Forecast:
    origin = math.floor(now / STEP) * STEP
    points = tuple(
        ForecastPoint(origin + (k + 1) * STEP, level, 0.9 * level, upper * level)
        for k in range(leads)
    )
    return Forecast("persistence", None, STEP, now, 0.9, points)


def _replay(cal: OnlineCalibrator, y: np.ndarray, level: float) -> Forecast:
    """Serve a flat forecast at every minute of ``y`` and let the calibrator score it."""
    last = _flat(T0, level)
    for i in range(1, len(y) + 1):
        now = T0 + i * STEP
        cal.observe(T0, y[:i], STEP)
        last = cal.calibrate(_flat(now, level))
    return last


def test_the_upper_band_is_the_quantile_of_the_served_errors() -> None:
    rng = np.random.default_rng(0)
    sigma = 0.1
    y = 100.0 * np.exp(rng.normal(0.0, sigma, 3000))
    f = _replay(OnlineCalibrator(0.9, min_pairs=100), y, level=100.0)
    z90 = 1.2816
    for point in f.points:
        assert point.upper / point.mean == pytest.approx(math.exp(z90 * sigma), rel=0.03)
    assert "calibrated" in f.detail


def test_the_models_band_stands_until_enough_errors_are_in() -> None:
    y = np.full(50, 100.0)
    f = _replay(OnlineCalibrator(0.9, min_pairs=100), y, level=100.0)
    assert all(p.upper == pytest.approx(105.0) for p in f.points)


def test_the_band_never_falls_below_the_mean_and_adapts_to_calm() -> None:
    # A forecast that always over-shoots: the errors are all negative, upper = mean.
    y = np.full(400, 80.0)
    f = _replay(OnlineCalibrator(0.9, min_pairs=100), y, level=100.0)
    assert all(p.upper == pytest.approx(p.mean) for p in f.points)


def test_a_volatile_spell_widens_the_band_and_it_narrows_again() -> None:
    rng = np.random.default_rng(1)
    calm = 100.0 * np.exp(rng.normal(0.0, 0.02, 600))
    wild = 100.0 * np.exp(rng.normal(0.0, 0.3, 600))
    window = 600 * STEP
    wide = _replay(OnlineCalibrator(0.95, window_seconds=window), np.concatenate([calm, wild]), 100)
    narrow = _replay(
        OnlineCalibrator(0.95, window_seconds=window), np.concatenate([wild, calm]), 100
    )
    assert wide.points[0].upper > 1.3 * 100
    assert narrow.points[0].upper < 1.06 * 100


def test_gaps_are_skipped() -> None:
    y = 100.0 * np.ones(400)
    y[::3] = np.nan
    cal = OnlineCalibrator(0.9, min_pairs=100)
    _replay(cal, y, level=100.0)
    assert 100 <= cal.pairs(1) < 300
