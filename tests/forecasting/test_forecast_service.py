"""ForecastService: fallback, leakage, refit cadence, nowcast, selection, process pool."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import (
    STATUS_INSUFFICIENT_HISTORY,
    STATUS_OK,
    FittedModel,
    ForecastService,
    ModelSpec,
    accuracy,
    fit_model,
)

DAY = 86_400.0
T0 = 1_704_067_200.0


def test_too_little_history_answers_insufficient_with_a_fallback() -> None:
    t = pd.to_datetime([T0, T0 + 60], unit="s", utc=True)
    svc = ForecastService(horizon_seconds=600, step_seconds=60)
    f = svc.forecast(pd.Series([10.0, 12.0], index=t), now=T0 + 120)
    assert f.status == STATUS_INSUFFICIENT_HISTORY
    assert f.model == "fallback"
    assert f.score is None
    assert "history" in f.detail
    assert len(f.points) == 10
    assert f.points[0].mean == pytest.approx(11.0)


def test_empty_and_all_gap_history_gives_zero_fallback() -> None:
    svc = ForecastService(horizon_seconds=300, step_seconds=60)
    empty = pd.Series([], index=pd.DatetimeIndex([], tz="UTC"), dtype=float)
    gaps = pd.Series(
        [np.nan] * 50, index=pd.to_datetime(T0 + 60 * np.arange(50), unit="s", utc=True)
    )
    for history in (empty, gaps):
        f = svc.forecast(history, now=T0 + 3600)
        assert f.status == STATUS_INSUFFICIENT_HISTORY
        assert f.peak_upper() == 0.0


def test_points_cover_now_to_now_plus_horizon(seasonal: Callable[..., pd.Series]) -> None:
    svc = ForecastService(model="recent_trend", horizon_seconds=600, step_seconds=60)
    now = T0 + 3600 + 30  # mid-step
    f = svc.forecast(seasonal(days=1), now)
    assert f.status == STATUS_OK
    assert f.generated_at == now
    assert f.points[0].t - 60 < now < f.points[0].t
    assert f.points[-1].t >= now + 600 > f.points[-2].t


def test_only_history_before_now_is_used(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=3)
    now = T0 + 2.5 * DAY
    poisoned = s.copy()
    poisoned[poisoned.index >= pd.Timestamp(now, unit="s", tz="UTC")] = 1e6
    a = ForecastService(model="seasonal_naive", horizon_seconds=600, step_seconds=60)
    b = ForecastService(model="seasonal_naive", horizon_seconds=600, step_seconds=60)
    assert a.forecast(s, now).points == b.forecast(poisoned, now).points


def test_gaps_in_history_do_not_break_forecasts(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=3)
    s.iloc[-600:-400] = np.nan  # a long outage a few hours ago
    s.iloc[-50:-45] = 0.0  # zeros at 100 rps: a collection gap
    s = s.drop(s.index[::7])  # and irregular timestamps
    svc = ForecastService(model="seasonal_naive", horizon_seconds=600, step_seconds=60)
    f = svc.forecast(s, now=T0 + 3 * DAY)
    assert f.status == STATUS_OK
    assert all(60 < p.mean < 160 for p in f.points)


@pytest.mark.slow
def test_nowcast_follows_a_level_shift_between_refits(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=3, noise="none")
    svc = ForecastService(model="prophet", horizon_seconds=600, step_seconds=60, refit_seconds=600)
    now = T0 + 2.5 * DAY
    before = svc.forecast(s, now)
    runner = svc.runner("prophet")
    assert runner.fit_count == 1
    shifted = s.copy()
    shifted[shifted.index >= pd.Timestamp(now, unit="s", tz="UTC")] *= 2.0
    after = svc.forecast(shifted, now + 300)  # five minutes later, no refit yet
    assert runner.fit_count == 1
    same_time = {p.t: p.mean for p in before.points}
    ratios = [p.mean / same_time[p.t] for p in after.points if p.t in same_time]
    assert ratios
    assert min(ratios) > 1.8
    later = svc.forecast(shifted, now + 600)
    assert runner.fit_count == 2
    assert later.status == STATUS_OK


@pytest.mark.slow
def test_auto_selection_reports_model_and_score(seasonal: Callable[..., pd.Series]) -> None:
    # A strong daily cycle with little noise: yesterday beats a straight line.
    s = seasonal(days=3, amplitude=0.8, level=1000.0, seed=1)
    svc = ForecastService(
        horizon_seconds=1800, step_seconds=60, candidates=("recent_trend", "seasonal_naive")
    )
    f = svc.forecast(s, now=T0 + 2.6 * DAY)
    assert svc.selection is not None
    assert f.model == "seasonal_naive" == svc.selection.model
    assert f.score == svc.selection.score == min(svc.selection.scores.values())
    assert set(svc.selection.scores) == {"recent_trend", "seasonal_naive"}
    assert "auto: seasonal_naive" in f.detail


def test_auto_with_short_history_uses_what_is_eligible(seasonal: Callable[..., pd.Series]) -> None:
    svc = ForecastService(
        horizon_seconds=600, step_seconds=60, candidates=("recent_trend", "seasonal_naive")
    )
    f = svc.forecast(seasonal(days=0.5), now=T0 + 0.5 * DAY)
    assert f.model == "recent_trend"
    assert f.status == STATUS_OK


@pytest.mark.slow
def test_fit_runs_in_a_process_pool_and_installs(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=2.5)
    spec = ModelSpec("prophet", 60, 600, valid_seconds=1200)
    with ProcessPoolExecutor(max_workers=1) as pool:
        fitted = pool.submit(fit_model, spec, s).result()
    assert isinstance(fitted, FittedModel)
    assert pickle.loads(pickle.dumps(fitted)).curve.tolist() == fitted.curve.tolist()
    svc = ForecastService(model="prophet", horizon_seconds=600, step_seconds=60)
    svc.install(fitted)
    f = svc.forecast(s, now=fitted.history_end + 60)
    assert svc.runner("prophet").fit_count == 1  # the installed fit was used, not refitted
    assert f.model == "prophet"
    assert len(f.points) == 10


@pytest.mark.slow
def test_forecast_async_fits_off_the_loop(seasonal: Callable[..., pd.Series]) -> None:
    s = seasonal(days=2.5)
    svc = ForecastService(model="prophet", horizon_seconds=600, step_seconds=60)
    with ProcessPoolExecutor(max_workers=1) as pool:
        f = asyncio.run(svc.forecast_async(s, T0 + 2.5 * DAY, pool))
    assert f.model == "prophet"
    assert f.status == STATUS_OK
    recent = s.iloc[-10:].to_numpy()  # the forecast continues the recent level
    assert accuracy(np.array([p.mean for p in f.points]), np.zeros(10), recent)[0] < 20


def test_unknown_model_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        ForecastService(model="arima", horizon_seconds=600, step_seconds=60)


@pytest.mark.parametrize("model", ["prophet", "seasonal_naive"])
def test_a_burst_that_has_ended_does_not_hold_the_forecast_up(
    model: str, seasonal: Callable[..., pd.Series], true_rate: Callable[..., np.ndarray]
) -> None:
    # A 10-minute burst at 4x the level that ended 3 minutes before the forecast's origin.
    s = seasonal(days=3, noise="poisson")
    s.iloc[-13:-3] *= 4.0
    now = s.index[-1].timestamp() + 60
    svc = ForecastService(model=model, horizon_seconds=1200, step_seconds=60)
    f = svc.forecast(s, now)
    means = np.array([p.mean for p in f.points])
    truth = true_rate(np.array([p.t - 60 for p in f.points]))
    # The level is back where the traffic is: within 15 %, not x2 as a mean nowcast gave.
    assert np.all(np.abs(means / truth - 1) < 0.15), means / truth


def test_the_nowcast_correction_fades_over_the_horizon(seasonal: Callable[..., pd.Series]) -> None:
    # Traffic runs 50 % above the fitted curve over the last minutes: the next minutes
    # follow that level, and the correction fades towards the model's curve further out.
    from prescaler_forecast import series_to_grid
    from prescaler_forecast._fitting import fit_grid_model, forecast_from_fit

    s = seasonal(days=3, noise="none")
    s.iloc[-5:] *= 1.5
    start, grid = series_to_grid(s, 60.0)
    now = start + len(grid) * 60.0
    horizon = 4 * 3600.0

    def forecast(decay: float) -> np.ndarray:
        spec = ModelSpec("prophet", 60.0, horizon, nowcast_decay_seconds=decay)
        fitted = fit_grid_model(spec, start, grid)
        points = forecast_from_fit(fitted, start, grid, now, horizon).points
        return np.array([p.mean for p in points])

    whole, fading = forecast(0.0), forecast(3600.0)
    ratio = fading / whole
    assert ratio[0] == pytest.approx(1.0)
    # In log space the correction at lead k is exp(-k / decay) of itself:
    # log(fading / whole) = (exp(-k / decay) - 1) * log(r), whatever r is.
    assert ratio[60] < 1.0
    k1, k2 = 60, len(ratio) - 1
    expected = (np.exp(-k1 / 60) - 1) / (np.exp(-k2 / 60) - 1)
    assert np.log(ratio[k1]) / np.log(ratio[k2]) == pytest.approx(expected, rel=1e-3)
