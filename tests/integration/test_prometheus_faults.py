"""Prometheus faults, injected for real, and a failing forecast model on the cluster.

A fault proxy (``cluster.faultproxy``) sits between the operator and a real, backfilled
Prometheus. For every fault: ``MetricsAvailable=False`` with the reason, the plan held
(the target's replicas never go below the level before the fault, polled and recorded by
a watcher for the whole case), a dated window that opens during the fault still scales
up, and the operator recovers (``MetricsAvailable=True``) once Prometheus answers again.
Counter resets are in the backfilled data itself (pods restarting), not in the proxy:
Prometheus' ``rate()`` absorbs them, so metrics stay available and demand is read right.
A model that raises is swapped in for the pools that ask for ``recent_mean``: they are
reported ``ModelFailed`` and plan on the fallback; a pool beside them is unaffected.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest

from cluster.faultproxy import FaultProxy, Mode
from cluster.objects import gpu_deployment
from cluster.prometheus import Sample
from integration.history_world import (  # noqa: F401 (fixtures)
    LIVE_RECENT_MEAN,
    HistoryWorld,
    scrape_times,
    world_fixture,
)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    recorded,
    wait_for,
)
from prescaler.api import ForecastSpec
from prescaler_forecast import EventWindow, ForecastService, RecentMean

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

RATE = 12.0  # req/s: 3 replicas at 5 req/s each
BEFORE = 3
# 600 prompt + 150 output tokens per request (the harness' vLLM profile): 5 req/s a replica.
MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
TIMEOUT = 2.0  # the operator's Prometheus timeout in these tests

# (fault, what MetricsAvailable's message says)
FAULTS: list[tuple[Mode, str]] = [
    ("unreachable", "connection"),
    ("slow", "did not answer within"),
    ("http500", "500"),
    ("garbage", "malformed answer"),
    ("nan", "not a finite number"),
    ("gaps", "no data"),
    ("vanish", "no data"),
]


def backfill(world: HistoryWorld, resets: bool = False) -> None:
    """Two hours of a steady RATE, reaching 15 minutes ahead (so "now" is real data).

    With ``resets``, every counter drops to zero now and then (a pod restart), also
    twice in the minutes the test runs."""
    now = time.time()
    samples = world.samples(scrape_times(now - 7200, now + 900), lambda _: RATE, pods=("a", "b"))
    if resets:
        samples = with_resets(samples, [now - 3600, now - 1200, now + 15, now + 40])
    world.prometheus.backfill(samples)


def with_resets(samples: list[Sample], at: list[float]) -> list[Sample]:
    """Every counter restarted from zero at each time of ``at`` (a pod restart)."""
    series: dict[Any, list[Sample]] = {}
    for s in samples:
        series.setdefault((s.name, tuple(sorted(s.labels.items()))), []).append(s)
    out: list[Sample] = []
    for (name, _), points in series.items():
        if not name.endswith("_total"):
            out.extend(points)
            continue
        points.sort(key=lambda s: s.timestamp_s)
        base = 0.0
        pending = sorted(at)
        previous = 0.0
        for s in points:
            while pending and s.timestamp_s >= pending[0]:
                base, pending = previous, pending[1:]
            out.append(Sample(s.name, s.labels, s.timestamp_s, s.value - base))
            previous = s.value
    return out


def lowest_replicas(k: Kube, name: str) -> AbstractContextManager[list[int]]:
    """Polls the Deployment's ``spec.replicas`` until the block ends; yields the list of
    every value seen (its ``min`` is the lowest)."""
    return recorded(lambda: int(k.deployment(name).spec.replicas), 0.2)


def pool_spec(world: HistoryWorld, url: str, target: str = "llm") -> dict[str, Any]:
    return world.pool_spec(
        {
            "minReplicas": 1,
            "maxReplicas": 8,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 5, "marginSeconds": 0},
            "scaleDown": {"stabilizationSeconds": 2},
        },
        {**LIVE_RECENT_MEAN, "quantile": 0.9, "headroom": 1.0},
        target=target,
        url=url,
    )


def window_from_now(seconds: float, replicas: int) -> list[dict[str, Any]]:
    fmt = "%Y-%m-%dT%H:%M:%S"
    start, end = time.gmtime(time.time() + seconds), time.gmtime(time.time() + 3600)
    return [
        {
            "name": "launch",
            "start": time.strftime(fmt, start),
            "end": time.strftime(fmt, end),
            "minReplicas": replicas,
            "leadSeconds": 0,
        }
    ]


def metrics_available(k: Kube) -> dict[str, Any] | None:
    return k.condition("chat", "MetricsAvailable")


class State(dict[str, Any]):
    """What a wait looked at; true when ``ok`` (its repr names what was not)."""

    def __bool__(self) -> bool:
        return bool(self.get("ok"))


def steady(k: Kube) -> State:
    available = metrics_available(k)
    status = k.status("chat")
    healthy = k.condition("chat", "ForecastHealthy")
    state = State(
        metrics=available and (available["status"], available["message"][:200]),
        forecast_healthy=healthy and (healthy["reason"], healthy["message"][:300]),
        forecast=bool(status.get("forecast")),
        plan=status.get("plan"),
        replicas=k.deployment("llm").spec.replicas,
    )
    state["ok"] = bool(
        available
        and available["status"] == "True"
        and state["forecast"]
        and (state["plan"] or {}).get("action") == "steady"
        and state["replicas"] >= BEFORE
    )
    return state


@pytest.mark.parametrize(("fault", "says"), FAULTS)
def test_a_prometheus_fault_holds_the_plan_lets_windows_scale_up_and_recovers(
    world: HistoryWorld, fault: Mode, says: str
) -> None:
    k = world.kube
    backfill(world)
    k.create_deployment(gpu_deployment("llm", BEFORE, ready_delay="2s"))
    with (
        FaultProxy(world.prometheus.url, slow_seconds=4 * TIMEOUT) as proxy,
        world.operator(prometheus_timeout_seconds=TIMEOUT, forecast_wait_seconds=2 * TIMEOUT),
    ):
        k.create_pool("chat", pool_spec(world, proxy.url))
        before = wait_for(lambda: steady(k), 120, "a steady plan with metrics")["replicas"]
        with lowest_replicas(k, "llm") as seen:
            proxy.set(fault)
            down = wait_for(
                lambda: (c := metrics_available(k)) and c["status"] == "False" and c,
                90,
                f"MetricsAvailable=False under {fault}",
            )
            # Closing the port resets a connection in flight as well as refusing new ones.
            assert says in down["message"].lower(), down
            assert down["reason"] == "Unavailable"
            # A dated window that opens during the fault still scales up.
            k.patch_pool("chat", {"schedules": window_from_now(3, before + 2)})
            wait_for(
                lambda: k.deployment("llm").spec.replicas == before + 2,
                90,
                f"the window's scale-up to {before + 2} under {fault}",
            )
            still = metrics_available(k)
            assert still is not None
            assert still["status"] == "False", still
            if fault != "unreachable":  # a closed port answers nothing to count
                assert proxy.requests[fault] > 0
            # Prometheus returns; the window ends: the plan follows the data again.
            proxy.set("pass")
            wait_for(
                lambda: (c := metrics_available(k)) and c["status"] == "True",
                90,
                "MetricsAvailable=True after the fault",
            )
        assert seen, "the watcher saw the Deployment"
        assert min(seen) >= before, f"replicas fell to {min(seen)} from {before} during {fault}"


def test_counter_resets_in_the_history_are_absorbed(world: HistoryWorld) -> None:
    k = world.kube
    backfill(world, resets=True)
    k.create_deployment(gpu_deployment("llm", BEFORE, ready_delay="2s"))
    started = time.time()
    with (
        FaultProxy(world.prometheus.url) as proxy,
        world.operator(prometheus_timeout_seconds=TIMEOUT),
    ):
        k.create_pool("chat", pool_spec(world, proxy.url))
        before = wait_for(lambda: steady(k), 120, "a steady plan with metrics")["replicas"]
        rates: list[float] = []

        def past_the_resets() -> bool:
            status = k.status("chat")
            available = metrics_available(k)
            assert available is not None
            assert available["status"] == "True", available
            rps = (status.get("demand") or {}).get("requestsPerSecond")
            if rps is not None:
                rates.append(float(rps))
            return time.time() > started + 60

        with lowest_replicas(k, "llm") as seen:
            wait_for(past_the_resets, 180, "two counter resets to pass", interval=1.0)
    assert rates
    assert all(abs(r - RATE) <= 0.25 * RATE for r in rates), rates
    assert min(seen) >= before, f"replicas fell to {min(seen)} from {before} across resets"


class Exploding(RecentMean):
    """A forecast model that raises on every fit."""

    def _fit(self) -> None:
        raise RuntimeError("injected model failure")


def test_a_failing_forecast_model_is_reported_and_other_pools_are_unaffected(
    world: HistoryWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pools whose spec asks for ``recent_mean`` get a model that raises; a pool on
    ``persistence`` beside it is served as usual."""

    def service(spec: ForecastSpec, events: Sequence[EventWindow]) -> ForecastService:
        models = {"recent_mean": Exploding} if spec.model == "recent_mean" else {}
        return ForecastService(
            model=spec.model,
            horizon_seconds=spec.horizon_seconds,
            step_seconds=spec.step_seconds,
            quantile=spec.quantile,
            refit_seconds=spec.refit_seconds,
            lookback_seconds=spec.lookback_seconds,
            events=events,
            models=models,
        )

    monkeypatch.setattr("prescaler.controller.forecast.series_service", service)
    k = world.kube
    backfill(world)
    for name in ("bad", "good"):
        k.create_deployment(gpu_deployment(name, 1, ready_delay="2s"))
    with world.operator(prometheus_timeout_seconds=TIMEOUT):
        bad = pool_spec(world, world.prometheus.url, target="bad")
        good = pool_spec(world, world.prometheus.url, target="good")
        good["forecast"]["model"] = "persistence"
        k.create_pool("bad", bad)
        k.create_pool("good", good)
        failed = wait_for(
            lambda: (c := k.condition("bad", "ForecastHealthy")) and c["status"] == "False" and c,
            120,
            "ForecastHealthy=False on the pool with the failing model",
        )
        assert failed["reason"] == "ModelFailed", failed
        assert "injected model failure" in failed["message"], failed
        fine = wait_for(
            lambda: (c := k.condition("good", "ForecastHealthy")) and c["status"] == "True" and c,
            120,
            "ForecastHealthy=True on the other pool",
        )
        assert fine["reason"] == "Fresh", fine

        # Both keep going: the fallback (the last level) plans the bad pool up to the
        # demand like the good one, and a window still scales it.
        def scaled(name: str) -> bool:
            return bool(k.deployment(name).spec.replicas >= 3)

        wait_for(lambda: scaled("bad"), 120, "the pool with the failing model scaled to demand")
        wait_for(lambda: scaled("good"), 120, "the other pool scaled to demand")
        assert k.status("bad")["forecast"]["model"] == "fallback"
        k.patch_pool("bad", {"schedules": window_from_now(0, 6)})
        wait_for(lambda: k.deployment("bad").spec.replicas == 6, 120, "the window's scale-up")
