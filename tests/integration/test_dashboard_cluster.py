"""Every query of the chart's Grafana dashboard returns data from a real Prometheus.

The operator runs as a process on backfilled vLLM history, scraped by a real Prometheus as
the chart's ServiceMonitor has it scraped: a second one, since a Prometheus whose backfilled
blocks reach past now (the vLLM series the live operator reads) drops scraped samples
older than its newest block. Each panel's PromQL, and each variable's, is sent
as Grafana sends it (``$namespace``, ``$pool`` and the interval macros substituted) and must
return at least one series: parsing is not enough, a panel can parse and stay empty.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from cluster.grafana import DASHBOARD, queries, substitute
from cluster.prometheus import Prometheus
from integration.history_world import (  # noqa: F401 (fixtures)
    RECENT_HOUR,
    HistoryWorld,
    world_fixture,
)
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    crd_fixture,
    operator_process,
    wait_for,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a scraped minute of every series, on a busy machine
]

SCRAPE_SECONDS = 2.0
INTERVALS = {"rate_interval": "1m", "interval": "15s", "range": "1h"}
"""Grafana's macros as a dashboard over the last hour sets them (the rate interval at least
four scrapes)."""


def _empty(prometheus: Prometheus, namespace: str) -> list[str]:
    """The dashboard's panel and variable queries that return no series now."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    variables = {"namespace": namespace, "pool": "chat", "datasource": "prometheus"}
    empty = []
    for query in queries(dashboard):
        if query.where.startswith("annotation"):
            continue  # an annotation marks events (a scale), and is empty without one
        promql = substitute(query.expr, variables, INTERVALS)
        result = prometheus.query(promql)["result"]
        if query.where.startswith("variable"):
            result = [r for r in result if r["metric"].get("namespace") == namespace]
        if not result:
            empty.append(f"{query.where}: {promql}")
    return empty


def test_every_dashboard_query_returns_data(world: HistoryWorld) -> None:
    k, namespace, tmp_path = world.kube, world.namespace, world.tmp_path
    now = time.time()
    world.pool_over_history(
        "chat",
        lambda t: 6 + 4 * math.sin(2 * math.pi * t / 1800),
        now - 3 * 3600,
        now + 3600,
        pool={
            "minReplicas": 1,
            "maxReplicas": 6,
            "model": {"tokensPerSecond": 3750},
            "coldStart": {"mode": "fixed", "seconds": 30},
        },
        forecast=RECENT_HOUR,
    )
    scraper = Prometheus(tmp_path / "scraper", scrape_interval_s=SCRAPE_SECONDS)
    with operator_process(world.cluster, namespace, tmp_path / "operator.log") as (_, port):
        scraper.scrape_targets = (f"127.0.0.1:{port}",)
        scraper.start()
        try:
            wait_for(
                lambda: (k.status("chat").get("againstHpa") or {}).get("last24Hours"),
                300,
                "the pool's comparison with a shadow HPA",
                interval=1.0,
            )
            empty = _empty(scraper, namespace)
            deadline = time.monotonic() + 600
            while empty and time.monotonic() < deadline:
                time.sleep(5)
                empty = _empty(scraper, namespace)
        finally:
            scraper.stop()
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
