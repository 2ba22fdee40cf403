"""The forecast timeouts: chart values that reach the operator's settings when set, and set
nothing when unset, so the operator's own defaults (``ReconcileSettings``) hold."""

from __future__ import annotations

from typing import Any

import pytest
from chart_tools import Helm, HelmError, env_of, operator_container

from prescaler.settings import OperatorSettings, ReconcileSettings, from_env

MODEL = "PRESCALER_RECONCILE_FORECAST_MODEL_TIMEOUT_SECONDS"
FIT = "PRESCALER_RECONCILE_FORECAST_FIT_TIMEOUT_SECONDS"


def _rendered(helm: Helm, values: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    env = env_of(operator_container(helm.template(values)))
    settings: OperatorSettings = from_env({k: v for k, v in env.items() if isinstance(v, str)})
    return env, settings


def test_set_timeouts_reach_the_operator_settings(helm: Helm) -> None:
    values = {"operator": {"forecastModelTimeoutSeconds": 4.5, "forecastFitTimeoutSeconds": 90}}
    env, settings = _rendered(helm, values)
    assert (env[MODEL], env[FIT]) == ("4.5", "90")
    assert settings.reconcile.forecast_model_timeout_seconds == 4.5
    assert settings.reconcile.forecast_fit_timeout_seconds == 90


def test_unset_timeouts_leave_the_operators_defaults(helm: Helm) -> None:
    env, settings = _rendered(helm)
    assert MODEL not in env
    assert FIT not in env
    defaults = ReconcileSettings()
    assert settings.reconcile.forecast_model_timeout_seconds == (
        defaults.forecast_model_timeout_seconds
    )
    assert settings.reconcile.forecast_fit_timeout_seconds == defaults.forecast_fit_timeout_seconds


@pytest.mark.parametrize("field", ["forecastModelTimeoutSeconds", "forecastFitTimeoutSeconds"])
def test_the_schema_refuses_a_timeout_that_is_not_positive(helm: Helm, field: str) -> None:
    with pytest.raises(HelmError) as caught:
        helm.template({"operator": {field: 0}})
    assert f"/operator/{field}" in caught.value.stderr
