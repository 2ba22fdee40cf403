"""A pool over backfilled vLLM history, with the operator on it: the setup the Prometheus
cluster tests share, so that how such a pool is started is written once.

Import the fixtures into a test module, beside the CRD's::

    from integration.history_world import RECENT_HOUR, HistoryWorld, world_fixture
    from integration.operator_fixtures import crd_fixture

``world`` (function): the test's namespace and its own Prometheus, as a
:class:`HistoryWorld`. A test keeps what is its own (the rate, the window of history, the
pool's spec, the assertions) and leaves the mechanics to it:

    - ``world.backfill(rate, start, end)``: ``rate(t)`` req/s of vLLM history, labelled
      with the namespace and model ``llm``, scraped every 15 s from ``start`` to ``end``
      (unix seconds; past ``now`` is history the operator reads live);
      ``world.samples(times, rate)`` builds the same samples for a test that adds to them.
    - ``world.pool_over_history(name, rate, start, end, pool=..., forecast=...)``: that
      history, Deployment ``llm`` and a pool on it whose forecast reads the history.
    - ``world.pool_spec(pool, forecast)`` / ``world.forecast(fields)``: the spec fragments
      completed with the target, the Prometheus' URL (or another, a proxy's) and the
      namespace's selector; ``world.create_pool`` creates one.
    - ``world.operator(**reconcile)``: the operator on the namespace as the admin (kopf's
      own login included), yielding its metrics; ``world.chart_operator(**reconcile)``:
      as the Helm chart runs it.
    - ``world.kube`` (a :class:`Kube`), ``world.prometheus``, ``world.namespace``,
      ``world.selector``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster.launcher import LocalCluster
from cluster.objects import gpu_deployment
from cluster.prometheus import Prometheus, Sample, vllm_samples
from integration.operator_fixtures import Kube, chart_operator, running_operator
from prescaler.metrics import Metrics

TARGET = "llm"
"""The Deployment a pool over history scales, and the ``model_name`` its history carries."""

SCRAPE_SECONDS = 15.0
"""The backfilled history's scrape interval."""

RECENT_HOUR: Mapping[str, Any] = {
    "model": "recent_mean",
    "lookbackSeconds": 3600,
    "stepSeconds": 60,
    "horizonSeconds": 600,
}
"""A forecast fragment: the recent mean of the last hour, by the minute, ten minutes out."""

LIVE_RECENT_MEAN: Mapping[str, Any] = {
    "engine": "vllm",
    "model": "recent_mean",
    "lookbackSeconds": 3600,
    "stepSeconds": 15,
    "horizonSeconds": 300,
    "refitSeconds": 60,
    "observedHeadroom": 1.0,
}
"""A forecast fragment for a pool that follows phases played in the live minutes: the
recent mean of the last hour by 15 s, five minutes out, refitted every minute, the observed
demand planned for as it is."""

Rate = Callable[[float], float]
"""Requests per second at a unix time."""


def scrape_times(start: float, end: float, *, offset: float = 0.0) -> list[float]:
    """Every :data:`SCRAPE_SECONDS` from ``start`` (plus ``offset``, to sample off the
    minute) while before ``end``."""
    return [
        start + offset + SCRAPE_SECONDS * i for i in range(int((end - start) // SCRAPE_SECONDS))
    ]


@dataclass
class HistoryWorld:
    """The test's namespace, its Prometheus and the operator's mechanics over them."""

    cluster: LocalCluster
    kube: Kube
    prometheus: Prometheus
    monkeypatch: pytest.MonkeyPatch
    tmp_path: Path

    @property
    def namespace(self) -> str:
        return self.kube.ns

    @property
    def selector(self) -> str:
        """The PromQL label matcher of the namespace's series (its history's)."""
        return f'namespace="{self.namespace}"'

    # ------------------------------------------------------------------ history
    def samples(
        self, times: Sequence[float], rate: Rate, *, pods: Sequence[str] = ("vllm-0",)
    ) -> list[Sample]:
        """vLLM series of the namespace's model serving ``rate(t)`` at each of ``times``
        (split evenly over ``pods``)."""
        return vllm_samples(
            times, [rate(t) for t in times], namespace=self.namespace, model_name=TARGET, pods=pods
        )

    def backfill(
        self,
        rate: Rate,
        start: float,
        end: float,
        *,
        offset: float = 0.0,
        pods: Sequence[str] = ("vllm-0",),
    ) -> None:
        """``rate`` from ``start`` to ``end`` (see :func:`scrape_times`) into the Prometheus."""
        times = scrape_times(start, end, offset=offset)
        self.prometheus.backfill(self.samples(times, rate, pods=pods))

    # ------------------------------------------------------------------ the pool
    def forecast(self, fields: Mapping[str, Any], *, url: str | None = None) -> dict[str, Any]:
        """A pool's ``forecast``: ``fields`` reading the namespace's series from the
        Prometheus (or from ``url``, e.g. a fault proxy in front of it)."""
        return {
            "prometheus": {"url": url or self.prometheus.url},
            "selector": self.selector,
            **fields,
        }

    def pool_spec(
        self,
        pool: Mapping[str, Any],
        forecast: Mapping[str, Any],
        *,
        target: str = TARGET,
        url: str | None = None,
    ) -> dict[str, Any]:
        """A pool's spec: ``pool``'s fields, scaling Deployment ``target``, with the
        :meth:`forecast` of ``forecast``'s fields."""
        return {"target": {"name": target}, **pool, "forecast": self.forecast(forecast, url=url)}

    def create_pool(
        self,
        name: str,
        pool: Mapping[str, Any],
        forecast: Mapping[str, Any],
        *,
        target: str = TARGET,
        url: str | None = None,
    ) -> None:
        self.kube.create_pool(name, self.pool_spec(pool, forecast, target=target, url=url))

    def pool_over_history(
        self,
        name: str,
        rate: Rate,
        start: float,
        end: float,
        *,
        pool: Mapping[str, Any],
        forecast: Mapping[str, Any],
        ready_delay: str | None = None,
    ) -> None:
        """The history of ``rate`` from ``start`` to ``end``, Deployment ``llm`` (one
        replica, Ready ``ready_delay`` after it starts) and pool ``name`` on it."""
        self.backfill(rate, start, end)
        self.kube.create_deployment(gpu_deployment(TARGET, 1, ready_delay=ready_delay))
        self.create_pool(name, pool, forecast)

    # ------------------------------------------------------------------ the operator
    def operator(self, **reconcile: Any) -> AbstractContextManager[Metrics]:
        """:func:`running_operator` on the namespace, as the admin (also for kopf's own
        login), with reconcile settings of the test's."""
        self.monkeypatch.setenv("KUBECONFIG", str(self.cluster.kubeconfig))
        return running_operator(self.cluster, self.namespace, **reconcile)

    def chart_operator(self, **reconcile: Any) -> AbstractContextManager[Metrics]:
        """:func:`chart_operator` on the namespace: the Helm chart's identity and RBAC."""
        return chart_operator(
            self.cluster, self.namespace, self.tmp_path, self.monkeypatch, **reconcile
        )


@pytest.fixture(name="world")
def world_fixture(
    cluster: LocalCluster,
    crd: None,
    kube: Any,
    namespace: str,
    prometheus: Prometheus,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> HistoryWorld:
    """The test's namespace, with the CRD installed and its own empty Prometheus."""
    return HistoryWorld(cluster, Kube(kube, namespace), prometheus, monkeypatch, tmp_path)
