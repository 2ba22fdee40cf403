"""Fixtures for the integration tests; the cluster fixtures live in ``tests/conftest.py``.

``prometheus`` (function): its own empty Prometheus on a free loopback port.

    - ``prometheus.url``
    - ``prometheus.backfill(samples_or_openmetrics_text)``: adds history and restarts
      the server (about a second). Build samples with ``cluster.prometheus``:
      ``vllm_samples(times_s, rate_rps, namespace=..., model_name=..., pods=...)``
      turns a request-rate series into vLLM counters and gauges;
      ``servegen_rate(days=2, end_at_s=now)`` reads a real trace.
    - ``prometheus.query(promql, at_s)`` / ``prometheus.query_range(promql, start_s,
      end_s, step_s)``.

Tests using these are marked ``@pytest.mark.cluster`` / ``@pytest.mark.prometheus``.
Missing binaries are an error, not a skip: ``make test`` builds them first
(``make cluster-bin prometheus-bin``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.prometheus import Prometheus


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path / "prometheus")
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()
