"""Prometheus credentials from a Secret never leave the operator: not in status, Events,
logs or metric labels.

Three pools read their credentials from Secrets: one bearer token against the real
Prometheus (which accepts any token), the same kind of token against an address where
nothing listens, and basic auth against that address too, so the error paths that
quote a failed request are exercised as well as the happy one. Once each pool has
reconciled, reported its metrics condition and (for the reachable one) scaled, every
status, every Event in the namespace, every log record the operator wrote and the whole
metrics exposition are searched for the secret values, raw and base64-encoded.
"""

from __future__ import annotations

import base64
import functools
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import generate_latest

from cluster.objects import gpu_deployment
from cluster.prometheus import Prometheus
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    Kube,
    crd_fixture,
    operator_fixture,
    wait_for,
)
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers


class Records(logging.Handler):
    """Every log record, formatted with its arguments and any traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def logs() -> Iterator[Records]:
    """All log records at DEBUG, installed before the operator starts (list it first)."""
    root = logging.getLogger()
    handler, level = Records(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_prometheus_credentials_never_leak(
    logs: Records,
    kube: Any,
    namespace: str,
    prometheus: Prometheus,
    operator: Metrics,
) -> None:
    k = Kube(kube, namespace)
    token = f"tok-{uuid.uuid4().hex}"
    password = f"pw-{uuid.uuid4().hex}"
    k.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "prom-token"}, "stringData": {"token": token}}
    )
    k.core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "prom-basic"},
            "stringData": {"username": "reader", "password": password},
        },
    )
    now = time.time()
    window = {"name": "w", "start": _iso(now - 5), "end": _iso(now + 3600), "minReplicas": 2}
    pools = {
        "reachable": (prometheus.url, "prom-token"),
        "unreachable": (UNREACHABLE, "prom-token"),
        "basic": (UNREACHABLE, "prom-basic"),
    }
    for name, (url, secret) in pools.items():
        k.create_deployment(gpu_deployment(name, 1, ready_delay="1s"))
        k.create_pool(
            name,
            {
                "target": {"name": name},
                "maxReplicas": 4,
                "model": MODEL,
                "forecast": {"prometheus": {"url": url, "authSecretRef": {"name": secret}}},
                "schedules": [window],
            },
        )

    for name in pools:
        wait_for(
            functools.partial(k.condition_is, name, "MetricsAvailable", "False"),
            60,
            f"{name} to report its metrics condition",
        )
    wait_for(lambda: k.deployment("reachable").spec.replicas == 2, 60, "the window's scale-up")
    wait_for(lambda: k.events("reachable"), 30, "an Event on the reachable pool")
    for name in ("unreachable", "basic"):
        cond = k.condition(name, "MetricsAvailable")
        assert cond is not None, name
        message = cond["message"]
        assert "127.0.0.1" in message or "onnection" in message, message  # the error path ran

    searched = {
        "status": "\n".join(repr(k.pool(name)) for name in pools),
        "events": repr(k.core.list_namespaced_event(namespace).items),
        "logs": "\n".join(logs.lines),
        "metrics": generate_latest(operator.registry).decode(),
    }
    assert all(searched.values()), [part for part, text in searched.items() if not text]
    assert any("reachable" in line for line in logs.lines), "the operator's logs were captured"
    assert "prom-token" in searched["status"], "the search finds what is there (the Secret's name)"
    secrets = {
        "token": token,
        "password": password,
        "token (base64)": base64.b64encode(token.encode()).decode(),
        "password (base64)": base64.b64encode(password.encode()).decode(),
        "basic credentials (base64)": base64.b64encode(f"reader:{password}".encode()).decode(),
    }
    leaks = [
        f"{what} in {part}"
        for what, value in secrets.items()
        for part, text in searched.items()
        if value in text
    ]
    assert leaks == []
