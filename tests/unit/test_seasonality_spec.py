"""spec.forecast.seasonalityPeriods: the default lives in the spec model, the operator's and
the backtest's forecaster both get it through ``forecast_service``, and the API server
refuses a period shorter than two steps."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from prescaler.api import ForecastSpec, InferencePoolSpec, forecast_service
from prescaler.api.crd import crd

DAY = 86_400


def _forecast(**fields: Any) -> ForecastSpec:
    return ForecastSpec.model_validate({"prometheus": {"url": "http://p:9090"}, **fields})


def test_default_is_a_day_and_a_week() -> None:
    spec = _forecast()
    assert spec.seasonality_periods == [DAY, 7 * DAY]
    assert forecast_service(spec).spec.seasonality_periods == (DAY, 7 * DAY)


def test_the_periods_reach_the_forecaster() -> None:
    spec = _forecast(seasonalityPeriods=[14_400])
    service = forecast_service(spec)
    assert service.spec.seasonality_periods == (14_400.0,)
    assert service.runner("seasonal_naive").spec.seasonality_periods == (14_400.0,)
    # One period: the long-period model would repeat the short one.
    assert "seasonal_naive_weekly" not in service.candidates
    # The backtest's override of horizon and step keeps them.
    other = forecast_service(spec, horizon_seconds=600, step_seconds=30)
    assert other.spec.seasonality_periods == (14_400.0,)


def test_a_pool_round_trips_the_field_in_camel_case() -> None:
    raw = {
        "target": {"name": "x"},
        "model": {"tokensPerSecond": 1000},
        "forecast": {"prometheus": {"url": "http://p:9090"}, "seasonalityPeriods": [8640, 60480]},
    }
    pool = InferencePoolSpec.model_validate(raw)
    assert pool.forecast is not None
    assert pool.forecast.seasonality_periods == [8640, 60480]
    wire = pool.model_dump(by_alias=True, exclude_none=True)
    assert wire["forecast"]["seasonalityPeriods"] == [8640, 60480]


@pytest.mark.parametrize("periods", [[], [30], [DAY] * 5, [400 * DAY]])
def test_out_of_range_periods_are_refused(periods: list[int]) -> None:
    with pytest.raises(ValidationError):
        _forecast(seasonalityPeriods=periods)


def test_the_crd_carries_the_field_and_its_rule() -> None:
    version = crd()["spec"]["versions"][0]
    forecast = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["forecast"]
    field = forecast["properties"]["seasonalityPeriods"]
    assert field["type"] == "array"
    assert field["minItems"] == 1
    rules = [v["rule"] for v in forecast["x-kubernetes-validations"]]
    assert any("seasonalityPeriods.all" in r and "2 * self.stepSeconds" in r for r in rules)
