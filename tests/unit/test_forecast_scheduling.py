"""ForecastService for an outside scheduler: seed, due_step, forecast_cached (no Prophet run:
an expensive model's fit is made by hand), and the selection's status round-trip."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prescaler.api import InferencePoolStatus
from prescaler.controller.status import selection_from_status, selection_status
from prescaler_forecast import (
    MODEL_NAMES,
    SELECTION,
    Band,
    FittedModel,
    ForecastService,
    Selection,
)

DAY = 86_400.0
T0 = 1_704_067_200.0
STEP = 60.0


def history(days: float = 2.0, end: float | None = None) -> pd.Series:
    n = round(days * DAY / STEP)
    stop = T0 + n * STEP if end is None else end
    t = stop - STEP * np.arange(n, 0, -1)
    rate = 10 + 5 * np.sin(2 * np.pi * t / DAY)
    return pd.Series(rate, index=pd.to_datetime(t, unit="s", utc=True))


def service(model: str = "auto", **kwargs: object) -> ForecastService:
    return ForecastService(
        model=model, horizon_seconds=1800, step_seconds=STEP, refit_seconds=3600, **kwargs
    )


def hand_fit(svc: ForecastService, now: float, level: float = 12.0) -> FittedModel:
    """A Prophet-shaped fit (nowcast, a curve past the horizon) without running Prophet."""
    spec = svc.runner("prophet").spec
    bins = math.ceil((spec.valid_seconds + spec.horizon_seconds) / STEP) + 10
    leads = spec.leads
    return FittedModel(
        name="prophet",
        step_seconds=STEP,
        quantile=spec.quantile,
        history_end=now,
        curve_start=now - 5 * STEP,
        curve=np.full(bins, level),
        band=Band.multiplicative(np.ones(leads), np.full(leads, 1.2)),
        nowcast=True,
        nowcast_bins=5,
        fit_seconds=0.0,
    )


def prophet_selection(at: float) -> Selection:
    scores = {"recent_trend": 9.0, "seasonal_naive": 5.0, "prophet": 4.0}
    return Selection(
        "prophet",
        4.0,
        scores,
        at=at,
        origins=100,
        candidates=("recent_trend", "seasonal_naive", "prophet"),
    )


def test_auto_without_a_selection_has_the_selection_due() -> None:
    h = history()
    now = h.index[-1].timestamp() + STEP
    assert service().due_step(h, now) == SELECTION
    assert service(model="seasonal_naive").due_step(h, now) is None


def test_a_seeded_selection_is_not_redone_before_it_is_due() -> None:
    h = history()
    now = h.index[-1].timestamp() + STEP
    svc = service(candidates=("recent_trend", "seasonal_naive", "prophet"))
    assert svc.seed(prophet_selection(at=now - 3600))
    assert svc.due_step(h, now) == "prophet"  # the model still needs a fit in this process
    svc.install(hand_fit(svc, now))
    assert svc.due_step(h, now) is None
    assert not svc.seed(prophet_selection(at=now))  # it has one already
    later = now + svc.selection_config.reselect_seconds
    assert svc.due_step(history(end=later), later) == SELECTION


def test_seed_refuses_foreign_models_and_fixed_services() -> None:
    assert not service(model="seasonal_naive").seed(prophet_selection(T0))
    svc = service(candidates=("recent_trend", "seasonal_naive"))
    assert not svc.seed(prophet_selection(T0))
    assert svc.selection is None


def test_forecast_cached_stands_in_with_the_best_cheap_model_until_the_fit() -> None:
    h = history()
    now = h.index[-1].timestamp() + STEP
    svc = service(candidates=("recent_trend", "seasonal_naive", "prophet"))
    svc.seed(prophet_selection(at=now - 60))
    interim = svc.forecast_cached(h, now)
    assert interim.model == "seasonal_naive"  # best cheap score (5.0 < 9.0)
    assert interim.score == 5.0
    assert interim.detail.startswith("interim: seasonal_naive until prophet is fitted")
    assert svc.runner("prophet").fit_count == 0  # nothing expensive ran
    svc.install(hand_fit(svc, now))
    fresh = svc.forecast_cached(h, now)
    assert fresh.model == "prophet"
    assert fresh.score == 4.0
    assert "nowcast" in fresh.detail
    # A refit that is due does not stop the cached fit from being used while it covers.
    later = now + 3600
    assert svc.due_step(history(end=later), later) == "prophet"
    assert svc.forecast_cached(history(end=later), later).model == "prophet"


def test_forecast_cached_before_any_selection_uses_the_cheapest_model() -> None:
    h = history()
    now = h.index[-1].timestamp() + STEP
    f = service().forecast_cached(h, now)
    assert f.model == MODEL_NAMES[0]
    assert f.status == "ok"


def test_selection_round_trips_through_the_status() -> None:
    sel = Selection(
        "prophet",
        4.12345,
        {"recent_trend": 9.0, "seasonal_naive": 5.5, "prophet": 4.12345},
        at=T0,
        origins=288,
        candidates=("recent_trend", "seasonal_naive", "prophet"),
    )
    kept = selection_status(sel, "abc123")
    assert kept is not None
    wire = InferencePoolStatus.model_validate(
        {
            "forecast": {
                "generatedAt": "x",
                "model": "m",
                "quantile": 0.9,
                "horizonSeconds": 60,
                "selection": kept.wire(),
            }
        }
    ).wire()
    assert wire["forecast"]["selection"] == {
        "model": "prophet",
        "score": 4.123,
        "selectedAt": "2024-01-01T00:00:00Z",
        "scores": {"recent_trend": 9.0, "seasonal_naive": 5.5, "prophet": 4.123},
        "origins": 288,
        "fingerprint": "abc123",
    }
    back = selection_from_status(kept, "abc123", MODEL_NAMES)
    assert back is not None
    assert (back.model, back.score, back.at, back.origins) == ("prophet", 4.123, T0, 288)
    assert back.candidates == ("recent_trend", "seasonal_naive", "prophet")
    assert selection_from_status(kept, "other", MODEL_NAMES) is None
    unscored = Selection("recent_trend", None, at=T0)
    assert selection_status(unscored, "abc123") is None
