"""The operator's metrics: the per-pool series the dashboard reads, set by a reconcile."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from prescaler.controller.model import ForecastResult, PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.status import rfc3339
from prescaler.kube import StandbyObservation, Workload
from prescaler.metrics import CONSTRAINTS, SCALE_DIRECTIONS, Metrics
from prescaler_forecast import Forecast, ForecastPoint

NOW = 1_750_000_020.0
STEP = 60.0


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _forecast(start: float, means: Sequence[float], upper: float = 1.5) -> Forecast:
    points = tuple(
        ForecastPoint(t=start + (i + 1) * STEP, mean=m, lower=0.5 * m, upper=upper * m)
        for i, m in enumerate(means)
    )
    return Forecast("recent_trend", 5.0, STEP, start, 0.95, points)


def _constraints(metrics: Metrics, ns: str = "ns", pool: str = "pool") -> dict[str, float | None]:
    return {
        c: _value(metrics, "prescaler_driving_constraint", namespace=ns, pool=pool, constraint=c)
        for c in CONSTRAINTS
    }


# ------------------------------------------------------------------ the Metrics methods
def test_driving_constraint_is_one_hot_and_follows_the_plan() -> None:
    m = Metrics()
    m.set_driving_constraint("ns", "pool", "memory")
    assert _constraints(m) == {"memory": 1, "compute": 0, "schedule": 0, "floor": 0}
    m.set_driving_constraint("ns", "pool", "schedule")
    assert _constraints(m) == {"memory": 0, "compute": 0, "schedule": 1, "floor": 0}


def test_forecast_band_is_the_step_that_contains_now() -> None:
    m = Metrics()
    # Steps end at NOW-60, NOW, NOW+60: NOW itself ends the second step.
    m.set_forecast_band("ns", "pool", _forecast(NOW - 2 * STEP, [1, 2, 3]), NOW)
    assert (
        _value(m, "prescaler_forecast_mean_requests_per_second", namespace="ns", pool="pool") == 2
    )
    assert (
        _value(m, "prescaler_forecast_upper_requests_per_second", namespace="ns", pool="pool") == 3
    )
    # Half-way through the third step.
    m.set_forecast_band("ns", "pool", _forecast(NOW - 2 * STEP, [1, 2, 3]), NOW + 30)
    assert (
        _value(m, "prescaler_forecast_upper_requests_per_second", namespace="ns", pool="pool")
        == 4.5
    )


def test_forecast_band_is_dropped_when_no_step_covers_now() -> None:
    m = Metrics()
    m.set_forecast_band("ns", "pool", _forecast(NOW, [1, 2]), NOW + 1)
    m.set_forecast_band("ns", "pool", _forecast(NOW - 10 * STEP, [1, 2]), NOW)
    for name in ("mean", "upper"):
        metric = f"prescaler_forecast_{name}_requests_per_second"
        assert _value(m, metric, namespace="ns", pool="pool") is None
    m.set_forecast_band("ns", "pool", _forecast(NOW, [1, 2]), NOW)
    m.set_forecast_band("ns", "pool", None, NOW)
    metric = "prescaler_forecast_mean_requests_per_second"
    assert _value(m, metric, namespace="ns", pool="pool") is None


def test_declared_scale_events_start_at_zero() -> None:
    m = Metrics()
    m.declare_pool("ns", "pool")
    for direction in SCALE_DIRECTIONS:
        labels = {"namespace": "ns", "pool": "pool", "direction": direction}
        assert _value(m, "prescaler_scale_events_total", **labels) == 0


def test_forget_drops_every_series_of_the_pool_and_only_its_own() -> None:
    m = Metrics()
    for pool in ("gone", "kept"):
        m.declare_pool("ns", pool)
        m.set_driving_constraint("ns", pool, "compute")
        m.set_forecast_band("ns", pool, _forecast(NOW - STEP, [1, 2]), NOW)
        for gauge in (m.desired_replicas, m.forecast_error, m.cold_start_seconds):
            gauge.labels("ns", pool).set(1)
    m.forget("ns", "gone")
    pools = {
        sample.labels.get("pool")
        for family in m.registry.collect()
        for sample in family.samples
        if "pool" in sample.labels
    }
    assert pools == {"kept"}


def test_fit_timeouts_start_at_zero_count_per_series_and_go_with_their_series() -> None:
    m = Metrics()
    name = "prescaler_forecast_fit_timeouts_total"
    m.declare_fit("aaaa", "selection")
    m.declare_fit("bbbb", "prophet")
    assert _value(m, name, series="aaaa", model="selection") == 0
    m.fit_timed_out("aaaa", "prophet")
    m.fit_timed_out("aaaa", "prophet")
    assert _value(m, name, series="aaaa", model="prophet") == 2
    assert _value(m, name, series="bbbb", model="prophet") == 0
    m.forget_series("aaaa")
    assert _value(m, name, series="aaaa", model="selection") is None
    assert _value(m, name, series="aaaa", model="prophet") is None
    assert _value(m, name, series="bbbb", model="prophet") == 0  # only its own
    m.forget_series("aaaa")  # twice is harmless


def test_a_replica_that_loses_the_lead_reports_no_pool_series() -> None:
    m = Metrics()
    for pool in ("a", "b"):
        m.declare_pool("ns", pool)
        m.set_driving_constraint("ns", pool, "memory")
        m.desired_replicas.labels("ns", pool).set(3)
    m.forget_pools()
    pooled = [s for f in m.registry.collect() for s in f.samples if "pool" in s.labels]
    assert pooled == []
    assert _value(m, "prescaler_leader") == 1  # the process-wide series stay


# ------------------------------------------------------------------ set by a reconcile
@dataclass
class FakeKube:
    workload: Workload
    pools: dict[str, str] = field(default_factory=lambda: {"pool": "uid-1"})
    """The pools the API server has now: name -> uid."""
    events: list[tuple[str, str, str]] = field(default_factory=list)

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        return self.workload

    async def list_hpas(self, namespace: str) -> list[Any]:
        return []

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        w = self.workload
        self.workload = Workload(w.kind, w.name, replicas, w.ready_replicas, w.selector)

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        return self.pools.get(name)

    async def post_event(self, ref: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        return StandbyObservation(desired=0, ready=0)


@dataclass
class FixedForecasts:
    """Stands in for the ForecastHub: always the same forecast, never any I/O."""

    forecast: Forecast | None

    async def get(self, *args: Any, **kwargs: Any) -> ForecastResult:
        return ForecastResult(self.forecast, self.forecast is not None, "Fresh", "")

    def forget(self, uid: str) -> None:
        pass


def _reconcile(
    spec: dict[str, Any], forecast: Forecast | None = None
) -> tuple[Metrics, dict[str, Any]]:
    metrics = Metrics()
    kube = FakeKube(Workload("Deployment", "llm", 1, 1, ""))
    rec = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        metrics=metrics,
        forecasts=FixedForecasts(forecast),  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    status = asyncio.run(rec.reconcile(PoolObject("ns", "pool", "uid-1", 1, spec, {})))
    return metrics, status


def _spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "llm"},
        "minReplicas": 1,
        "maxReplicas": 40,
        "model": {"tokensPerSecond": 3000},
        "coldStart": {"mode": "fixed", "seconds": 60, "marginSeconds": 0},
    }
    spec.update(extra)
    return spec


def test_a_reconcile_exports_the_band_and_the_constraint_it_planned_on() -> None:
    # Nothing listens on port 1: the snapshot fails fast, the forecast still plans.
    forecast_spec = {"prometheus": {"url": "http://127.0.0.1:1"}, "model": "recent_trend"}
    forecast = _forecast(NOW - STEP, [20.0] * 10, upper=2.0)
    metrics, status = _reconcile(_spec(forecast=forecast_spec), forecast)

    pool = {"namespace": "ns", "pool": "pool"}
    assert _value(metrics, "prescaler_forecast_mean_requests_per_second", **pool) == 20
    assert _value(metrics, "prescaler_forecast_upper_requests_per_second", **pool) == 40
    assert _value(metrics, "prescaler_predicted_demand_requests_per_second", **pool) == 40
    driving = status["plan"]["constraint"]
    assert driving in ("memory", "compute")
    assert _constraints(metrics) == {c: float(c == driving) for c in CONSTRAINTS}
    desired = _value(metrics, "prescaler_desired_replicas", **pool)
    assert desired == status["desiredReplicas"] == 20
    assert _value(metrics, "prescaler_scale_events_total", direction="up", **pool) == 1
    assert _value(metrics, "prescaler_scale_events_total", direction="down", **pool) == 0


def test_a_window_drives_as_schedule_and_no_forecast_means_no_band() -> None:
    window = {
        "name": "launch",
        "start": rfc3339(NOW + 60),
        "end": rfc3339(NOW + 3600),
        "minReplicas": 5,
        "leadSeconds": 120,
    }
    metrics, _ = _reconcile(_spec(schedules=[window]))
    assert _constraints(metrics) == {"memory": 0, "compute": 0, "schedule": 1, "floor": 0}
    pool = {"namespace": "ns", "pool": "pool"}
    assert _value(metrics, "prescaler_forecast_mean_requests_per_second", **pool) is None
    assert _value(metrics, "prescaler_forecast_upper_requests_per_second", **pool) is None


def test_every_invalid_reason_has_an_error_series_from_the_start() -> None:
    """The dashboard's reconcile errors panel shows zeros, not nothing, before any error;
    every reason the controller raises is declared."""
    import re
    from pathlib import Path

    from prescaler.controller import reconcile
    from prescaler.controller.model import INVALID_REASONS

    source = Path(reconcile.__file__).read_text()
    raised = set(re.findall(r'InvalidPool\(\s*"(\w+)"', source))
    assert raised <= set(INVALID_REASONS)
    m = Metrics()
    reconcile.Reconciler(kube=cast(Any, None), metrics=m, forecasts=cast(Any, None))
    declared = {
        s.labels["reason"]
        for f in m.registry.collect()
        for s in f.samples
        if s.name == "prescaler_reconcile_errors_total"
    }
    assert declared == set(INVALID_REASONS)
