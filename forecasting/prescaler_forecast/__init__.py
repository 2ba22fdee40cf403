"""prescaler_forecast: demand forecasting for prescaler (pure: no Kubernetes or Prometheus).

A demand series goes in (a ``pandas.Series`` of requests/s on a tz-aware UTC index,
irregular or with gaps), a :class:`Forecast` for the next horizon comes out: one
:class:`ForecastPoint` per step with a mean and a lower/upper bound.

Public surface::

    Forecaster              fit(series) -> predict(horizon, step, quantile)   (one interface)
    ├── ProphetForecaster       seasonality (daily/weekly or any periods), events, nowcast
    ├── Persistence             the last value, flat (what every model must beat)
    ├── RecentMean              the mean of the last 10 minutes, flat
    ├── SeasonalNaive           same time one period ago (yesterday), scaled by the level
    ├── SeasonalNaiveWeekly     same time one long period ago (last week), likewise
    ├── SeasonalProfile         median of the same time over the last days (or of the same
    │                           weekday over the last weeks), scaled by the level; its band
    │                           is the spread across those days
    └── RecentTrend             robust (Theil–Sen) recent trend, for short histories
    ForecastService         what the operator and the backtest use: auto-selection,
                            refit cadence, nowcast correction, insufficient-history fallback,
                            and the upper band calibrated on its own served errors
    OnlineCalibrator        that calibration (per-lead quantiles of recent errors)
    fit_model(spec, series) picklable fit for a ProcessPoolExecutor -> FittedModel
    select_model(...)       rolling-origin auto-selection -> Selection (model, score)
    rolling_origin, accuracy  evaluation (apart from the models)
    clean_series, counter_to_rate, mask_collection_gaps   data hygiene

Seasonal periods: ``seasonality_periods`` (seconds; default :data:`SEASONALITY_PERIODS`,
one day and one week) on :class:`ForecastService` and :class:`ModelSpec`. ``seasonal_naive``
uses the shortest, ``seasonal_naive_weekly`` the longest (left out of auto-selection when
there is only one), ``seasonal_profile`` the longest once its history covers three of it
and the shortest before (it needs two of those), Prophet each that its history covers
twice.

Selection metric: sMAPE in percent over every (origin, step) pair of a rolling-origin
backtest whose horizon equals the requested one (:attr:`Forecast.score`).

Errors::

    ValueError                   bad arguments (unknown model, quantile outside [0.5, 1))
    └── InsufficientHistoryError raised by Forecaster.fit; ForecastService turns it into
                                 status="insufficient_history" plus a fallback forecast
"""

from prescaler_forecast._base import Band, Forecaster
from prescaler_forecast._baselines import (
    Persistence,
    RecentMean,
    RecentTrend,
    SeasonalNaive,
    SeasonalNaiveWeekly,
)
from prescaler_forecast._conformal import OnlineCalibrator
from prescaler_forecast._evaluation import (
    EvaluationResult,
    accuracy,
    origins_between,
    rolling_origin,
)
from prescaler_forecast._fitting import (
    FALLBACK_MODEL,
    MODEL_NAMES,
    FittedModel,
    ModelRunner,
    ModelSpec,
    fit_grid_model,
    fit_model,
    forecast_from_fit,
)
from prescaler_forecast._hygiene import (
    clean_series,
    counter_to_rate,
    mask_collection_gaps,
    series_to_grid,
)
from prescaler_forecast._profile import SeasonalProfile
from prescaler_forecast._prophet import ProphetForecaster
from prescaler_forecast._selection import Evidence, Selection, SelectionConfig, select_model
from prescaler_forecast._service import AUTO, SELECTION, ForecastService
from prescaler_forecast._types import (
    SEASONALITY_PERIODS,
    STATUS_INSUFFICIENT_HISTORY,
    STATUS_MODEL_FAILED,
    STATUS_OK,
    EventSource,
    EventWindow,
    Forecast,
    ForecastPoint,
    InsufficientHistoryError,
)

__all__ = [
    "AUTO",
    "FALLBACK_MODEL",
    "MODEL_NAMES",
    "SEASONALITY_PERIODS",
    "SELECTION",
    "STATUS_INSUFFICIENT_HISTORY",
    "STATUS_MODEL_FAILED",
    "STATUS_OK",
    "Band",
    "EvaluationResult",
    "EventSource",
    "EventWindow",
    "Evidence",
    "FittedModel",
    "Forecast",
    "ForecastPoint",
    "ForecastService",
    "Forecaster",
    "InsufficientHistoryError",
    "ModelRunner",
    "ModelSpec",
    "OnlineCalibrator",
    "Persistence",
    "ProphetForecaster",
    "RecentMean",
    "RecentTrend",
    "SeasonalNaive",
    "SeasonalNaiveWeekly",
    "SeasonalProfile",
    "Selection",
    "SelectionConfig",
    "accuracy",
    "clean_series",
    "counter_to_rate",
    "fit_grid_model",
    "fit_model",
    "forecast_from_fit",
    "mask_collection_gaps",
    "origins_between",
    "rolling_origin",
    "select_model",
    "series_to_grid",
]
