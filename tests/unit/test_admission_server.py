"""``prescaler admit``'s server without a cluster: the policies kept from the ConfigMap
stream's lists and events, and the HTTP answers, headers and metrics of a check."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from prescaler.admission import CONFIG_MAP_KEYS, Policy, PolicyError, Routes
from prescaler.admission.server import Admission, AdmissionMetrics, Policies, application
from prescaler.kube import Event, Listed


def config_map(namespace: str, pool: str, **values: str) -> dict[str, Any]:
    data = dict.fromkeys(CONFIG_MAP_KEYS, "")
    data.update({"contract": "prescaler.io/degradation/v1", "pool": pool, "level": "normal"})
    data.update(values)
    return {
        "metadata": {
            "namespace": namespace,
            "name": f"{pool}-degradation",
            "labels": {"prescaler.io/pool": pool, "prescaler.io/role": "degradation"},
        },
        "data": data,
    }


CRITICAL = {
    "level": "critical",
    "retryAfterSeconds": "12",
    "shedLanes": "batch",
    "maxContextTokens": "100",
}


def test_lists_and_events_keep_every_pools_policy() -> None:
    policies = Policies(("a", "b"))
    assert not policies.ready
    policies.deliver("a", Listed((config_map("a", "chat"), config_map("a", "code")), False))
    assert not policies.ready  # b not listed yet
    policies.deliver("b", Listed((config_map("b", "chat", **CRITICAL),), False))
    assert policies.ready
    assert policies.find("a/chat") == ("a/chat", Policy("normal"))
    assert policies.find("b/chat")[1] == Policy(
        "critical", retry_after_seconds=12, max_context_tokens=100, shed_lanes=frozenset({"batch"})
    )
    # A bare name is found when one namespace has it, not when two do.
    assert policies.find("code") == ("a/code", Policy("normal"))
    assert policies.find("chat") == (None, None)
    policies.deliver("a", Event("MODIFIED", config_map("a", "code", contract="v2")))
    assert isinstance(policies.find("a/code")[1], PolicyError)
    policies.deliver("a", Event("DELETED", config_map("a", "code")))
    assert policies.find("a/code") == (None, None)
    # A relist drops what the list no longer has (deleted while the watch was away).
    policies.deliver("b", Listed((), True))
    assert policies.find("b/chat") == (None, None)
    assert policies.find("a/chat")[1] == Policy("normal")


def test_one_namespace_served_finds_bare_names_there() -> None:
    policies = Policies(("a",))
    policies.deliver("a", Listed((config_map("a", "chat", **CRITICAL),), False))
    assert policies.find("chat")[0] == "a/chat"


async def _answers(policies: Policies, metrics: AdmissionMetrics) -> list[Any]:
    admission = Admission(policies, Routes.parse(["/v1/batch=a/chat"]), metrics)
    async with TestClient(TestServer(application(admission))) as http:
        out = []
        for path, headers in [
            ("/check", {"x-prescaler-pool": "a/chat", "x-priority-lane": "batch"}),
            ("/check", {"x-prescaler-pool": "a/chat", "x-priority-lane": "interactive"}),
            (
                "/check",
                {
                    "x-prescaler-pool": "chat",
                    "x-priority-lane": "interactive",
                    "x-context-tokens": "101",
                },
            ),
            ("/check/v1/batch/jobs", {"x-priority-lane": "batch"}),  # Envoy's appended path
            ("/check", {"x-prescaler-pool": "a/nope", "x-priority-lane": "batch"}),
            ("/check", {"x-priority-lane": "batch"}),
        ]:
            r = await http.post(path, headers=headers)
            out.append(
                (
                    r.status,
                    r.headers.get("Retry-After"),
                    r.headers["x-prescaler-outcome"],
                    await r.text(),
                )
            )
        ready = await http.get("/readyz")
        out.append(ready.status)
    return out


def test_the_http_answers_and_their_metrics() -> None:
    policies = Policies(("a",))
    policies.deliver("a", Listed((config_map("a", "chat", **CRITICAL),), False))
    metrics = AdmissionMetrics()
    answers = asyncio.run(_answers(policies, metrics))
    assert answers[0] == (
        503,
        "12",
        "shed",
        "overloaded: lane batch is shed at critical, retry later\n",
    )
    assert answers[1] == (200, None, "admitted", "")
    assert answers[2][:3] == (413, None, "too_long")
    assert answers[2][3] == "context of 101 tokens above the cap of 100 for now\n"
    assert answers[3][:3] == (503, "12", "shed")
    assert answers[4] == (200, None, "open_unknown_pool", "")
    assert answers[5] == (200, None, "open_no_pool", "")
    assert answers[6] == 200
    value = metrics.registry.get_sample_value
    labels = {"pool": "a/chat", "lane": "batch", "outcome": "shed"}
    assert value("prescaler_admission_checks_total", labels) == 2
    unknown = {"pool": "-", "lane": "-", "outcome": "open_unknown_pool"}
    assert value("prescaler_admission_checks_total", unknown) == 1
    assert value("prescaler_admission_check_seconds_count") == 6


def test_client_text_never_mints_unbounded_lane_labels() -> None:
    policies = Policies(("a",))
    policies.deliver("a", Listed((config_map("a", "chat", **CRITICAL),), False))
    metrics = AdmissionMetrics()
    admission = Admission(policies, Routes.parse([]), metrics)
    for i in range(100):
        admission.answer({"x-prescaler-pool": "a/chat", "x-priority-lane": f"lane-{i}"})
    admission.answer({"x-prescaler-pool": "a/chat", "x-priority-lane": "Not A Lane\r\n"})
    lanes = {
        s.labels["lane"]
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "prescaler_admission_checks_total" and s.labels.get("pool") == "a/chat"
    }
    assert len(lanes) == 17
    assert "other" in lanes
