"""A curve that misses the observed level: what Prophet serves and what the selection scores.

A Prophet fit can extrapolate its trend to zero under a busy pool (a weekend drop fitted
without a weekly seasonality). The nowcast scales the curve by at most 3x, so before the
level guard the forecast stayed near zero; these tests use a stand-in whose curve falls to
zero at the end of every history (no Prophet fit, fast).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import (
    Forecaster,
    ForecastService,
    ModelSpec,
    ProphetForecaster,
    SelectionConfig,
    _fitting,
    _selection,
    select_model,
)
from prescaler_forecast._calibration import off_curve_level
from prescaler_forecast._evaluation import origins_between

DAY = 86_400.0
T0 = 1_704_067_200.0
STEP = 60.0
HORIZON = 720.0


class FallingProphet(ProphetForecaster):
    """Prophet's interface with a curve that falls linearly from the history's mean at its
    start to zero at its end, and stays at zero (a trend fitted into a drop)."""

    def _fit_prophet(self) -> None:
        self._model = None
        self._regressors = ()
        self._top = float(np.nanmean(self._y))
        self._n = len(self._y)

    def _raw(self, bins: np.ndarray) -> np.ndarray:
        bins = np.asarray(bins, dtype=float)
        return np.maximum(self._top * (1.0 - (bins + 1) / self._n), 0.0)


def _series(days: float = 1.0, seed: int = 3) -> tuple[float, np.ndarray]:
    n = round(days * DAY / STEP)
    rng = np.random.default_rng(seed)
    return T0, 100.0 * np.exp(rng.normal(0.0, 0.05, n))


def _history(values: np.ndarray) -> pd.Series:
    index = pd.to_datetime(T0 + np.arange(len(values)) * STEP, unit="s", utc=True)
    return pd.Series(values, index=index, name="rps")


def test_off_curve_level_only_where_the_nowcast_clip_cannot_reach() -> None:
    observed = np.array([100.0, 104.0, 98.0, 101.0, 99.0])
    assert off_curve_level(observed, observed / 2.0) is None  # x2: the nowcast scales it
    assert off_curve_level(observed, observed / 4.0) == pytest.approx(100.0)
    assert off_curve_level(observed, observed * 4.0) == pytest.approx(100.0)
    assert off_curve_level(observed, np.zeros(5)) == pytest.approx(100.0)  # curve at zero
    assert off_curve_level(np.zeros(5), np.full(5, 50.0)) is None  # an idle pool: keep it
    assert off_curve_level(np.full(5, np.nan), np.full(5, 50.0)) is None


def test_a_curve_at_zero_under_a_busy_pool_holds_the_observed_level() -> None:
    start, y = _series()
    spec = ModelSpec("prophet", STEP, HORIZON, valid_seconds=3600.0)
    fitted = _fitting.fit_grid_model(spec, start, y, forecaster=FallingProphet())
    now = start + len(y) * STEP
    forecast = _fitting.forecast_from_fit(fitted, start, y, now, HORIZON)
    level = float(np.median(y[-5:]))
    assert [p.mean for p in forecast.points] == pytest.approx([level] * 12)
    assert "misses the observed level" in forecast.detail
    # A cached fit an hour on, its curve still at zero: the same.
    later = np.concatenate([y, y[-60:]])
    forecast = _fitting.forecast_from_fit(fitted, start, later, now + 3000.0, HORIZON)
    assert min(p.mean for p in forecast.points) > 50.0


def test_the_direct_predict_path_holds_the_level_too() -> None:
    start, y = _series()
    model = FallingProphet().fit_grid(start, y, STEP)
    means = [p.mean for p in model.predict(HORIZON)]
    assert means == pytest.approx([float(np.median(y[-5:]))] * 12)


def test_the_service_serves_the_level_not_zeros() -> None:
    _, y = _series()
    service = ForecastService(
        model="prophet",
        horizon_seconds=HORIZON,
        step_seconds=STEP,
        models={"prophet": FallingProphet},
    )
    history = _history(y)
    forecast = service.forecast(history, T0 + len(y) * STEP)
    assert forecast.model == "prophet"
    assert min(p.mean for p in forecast.points) > 50.0


def test_the_selection_scores_prophet_as_the_service_serves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prophet's term sums in the selection's evidence equal the sMAPE terms of the
    service's own Prophet forecasts at the same origins (same fits, same nowcast)."""

    def make(spec: ModelSpec) -> Forecaster:
        return FallingProphet() if spec.name == "prophet" else real(spec)

    real = _fitting.make_forecaster
    monkeypatch.setattr(_fitting, "make_forecaster", make)
    monkeypatch.setattr(_selection, "make_forecaster", make)
    start, y = _series(days=1.0)
    config = SelectionConfig(window_seconds=3000.0, origins=12, memory_seconds=3000.0)
    now = start + len(y) * STEP
    selection = select_model(
        start,
        y,
        now,
        candidates=("persistence", "prophet"),
        spec=ModelSpec("persistence", STEP, HORIZON),
        refit_seconds=3600.0,
        config=config,
    )
    assert selection.evidence
    service = ForecastService(
        model="prophet",
        horizon_seconds=HORIZON,
        step_seconds=STEP,
        refit_seconds=3600.0,
        calibrate=False,
        models={"prophet": FallingProphet},
    )
    history = _history(y)
    for chunk in selection.evidence:
        terms: list[float] = []
        for origin in origins_between(chunk.first, chunk.last, STEP, config.origins):
            forecast = service.forecast(history, origin)
            for p in forecast.points:
                i = round((p.t - STEP - start) / STEP)
                if i < len(y):
                    terms.append(abs(p.mean - y[i]) / (abs(p.mean) + abs(y[i])))
        assert len(terms) == chunk.pairs
        assert chunk.sums["prophet"] == pytest.approx(math.fsum(terms), rel=1e-9)
    # Holding the level, the stand-in is no worse than persistence by much.
    assert selection.scores["prophet"] < 2.0 * selection.scores["persistence"]
