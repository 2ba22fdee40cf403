"""The operator on the real local cluster: schedules, hpaFloor, cold start, dry-run, invalid.

Times are compressed (cold starts of seconds, a 1 s timer, stabilization of seconds). The
only timing assertions are orderings on the schedule's own timeline.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from cluster.objects import gpu_deployment
from cluster.prometheus import Prometheus
from integration.operator_fixtures import (  # noqa: F401 (fixtures)
    RECONCILE_SECONDS,
    Kube,
    crd_fixture,
    operator_fixture,
    wait_for,
)
from prescaler.metrics import Metrics

pytestmark = [pytest.mark.cluster]

MODEL = {"tokensPerSecond": 3750, "promptTokens": 600, "outputTokens": 150}


def iso(ts: float, zone: str = "UTC") -> str:
    """A naive local time in ``zone`` (the window's timeZone says how to read it)."""
    return (
        datetime.fromtimestamp(ts, ZoneInfo(zone))
        .replace(tzinfo=None)
        .isoformat(timespec="seconds")
    )


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _kube(kube: Any, namespace: str) -> Kube:
    return Kube(kube, namespace)


def _record_replicas(
    k: Kube, name: str, until: Callable[[list[tuple[float, int, int]]], bool], timeout: float
) -> list[tuple[float, int, int]]:
    """Sample (time, spec.replicas, readyReplicas) until ``until(samples)`` or timeout."""
    samples: list[tuple[float, int, int]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = k.deployment(name)
        samples.append((time.time(), d.spec.replicas, d.status.ready_replicas or 0))
        if until(samples):
            return samples
        time.sleep(0.2)
    pytest.fail(f"timed out; replicas seen: {sorted({s[1] for s in samples})}")


def test_dated_window_prewarms_by_start_minus_lead_and_scales_down_after(
    kube: Any, namespace: str, operator: Metrics
) -> None:
    k = _kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="2s"))
    zone = "Europe/Berlin"
    # The lead leaves the fake pods (Ready 2 s after start) ample time on a busy machine.
    lead, stabilization = 30, 6
    start = round(time.time()) + 50
    end = start + 15
    k.create_pool(
        "launch",
        {
            "target": {"name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 6,
            "model": MODEL,
            "coldStart": {"mode": "fixed", "seconds": 3, "marginSeconds": 0},
            "scaleDown": {"mode": "paced", "stabilizationSeconds": stabilization, "maxPercent": 50},
            "schedules": [
                {
                    "name": "launch",
                    "start": iso(start, zone),
                    "end": iso(end, zone),
                    "timeZone": zone,
                    "minReplicas": 3,
                    "leadSeconds": lead,
                }
            ],
        },
    )
    wait_for(lambda: k.status("launch").get("nextWindow"), 60, "status.nextWindow")
    window = k.status("launch")["nextWindow"]
    assert ts(window["start"]) == start, "the naive time was read in the window's zone"
    assert ts(window["prewarmAt"]) == start - lead

    samples = _record_replicas(k, "llm", lambda s: s[-1][1] == 1 and s[-1][0] > end, timeout=240)
    t_up = next(t for t, r, _ in samples if r >= 3)
    t_ready = next(t for t, _, ready in samples if ready >= 3)
    t_down = next(t for t, r, _ in samples if t > t_up and r < 3)
    # Ordering on the window's timeline: not before the pre-warm, capacity ready before
    # the start, and released only after the end and after stabilization.
    assert t_up >= start - lead - 1
    assert t_ready < start
    assert t_down >= end
    assert t_down - t_up >= stabilization
    assert max(r for _, r, _ in samples) == 3

    # The Event follows the scale it reports: wait for both, then read the steps from them.
    def scale_events() -> list[Any] | None:
        events = [e for e in k.events("launch") if e.reason in ("ScaledUp", "ScaledDown")]
        return events if sum(e.reason == "ScaledDown" for e in events) >= 2 else None

    events = wait_for(scale_events, 120, "two ScaledDown Events")
    steps = [(e.reason, e.message.split(": ")[1].split(" (")[0]) for e in events]
    assert steps == [
        ("ScaledUp", "1 -> 3"),
        ("ScaledDown", "3 -> 2"),
        ("ScaledDown", "2 -> 1"),
    ], "one scale-up by the pre-warm, then a paced scale-down (3 -> 2 -> 1)"


def test_hpa_floor_moves_min_replicas_and_never_writes_the_deployment(
    kube: Any, namespace: str, operator: Metrics
) -> None:
    k = _kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="1s"))
    k.autoscaling.create_namespaced_horizontal_pod_autoscaler(
        namespace,
        {
            "metadata": {"name": "llm"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                "minReplicas": 1,
                "maxReplicas": 6,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 70},
                        },
                    }
                ],
            },
        },
    )
    now = time.time()
    window = {
        "name": "busy",
        "start": iso(now - 60),
        "end": iso(now + 3600),
        "minReplicas": 3,
        "leadSeconds": 0,
    }
    spec = {
        "target": {"kind": "HorizontalPodAutoscaler", "name": "llm"},
        "mode": "hpaFloor",
        "minReplicas": 1,
        "maxReplicas": 6,
        "model": MODEL,
        "coldStart": {"mode": "fixed", "seconds": 1, "marginSeconds": 0},
        "scaleDown": {"stabilizationSeconds": 2},
        "schedules": [window],
    }
    k.create_pool("floor", spec)

    def hpa_min() -> int:
        return int(
            k.autoscaling.read_namespaced_horizontal_pod_autoscaler(
                "llm", namespace
            ).spec.min_replicas
        )

    wait_for(lambda: hpa_min() == 3, 30, "HPA minReplicas raised to 3")
    # The HPA controller, not prescaler, moves the Deployment to the floor.
    wait_for(lambda: k.deployment("llm").spec.replicas == 3, 60, "the HPA to scale to its floor")
    k.patch_pool("floor", {"schedules": None})
    wait_for(lambda: hpa_min() == 1, 30, "HPA minReplicas lowered to 1")
    managers = {(f.manager, f.subresource) for f in k.deployment("llm").metadata.managed_fields}
    assert not any(manager == "prescaler-operator" for manager, _ in managers), managers
    status = k.status("floor")
    assert status["currentReplicas"] in (1, 2, 3)
    assert all(e.reason in ("ScaledUp", "ScaledDown") for e in k.events("floor"))


def test_cold_start_auto_learns_the_pod_delay(kube: Any, namespace: str, operator: Metrics) -> None:
    delay = 6.0
    k = _kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay=f"{delay:g}s"))
    now = time.time()
    k.create_pool(
        "learn",
        {
            "target": {"name": "llm"},
            "maxReplicas": 6,
            "model": MODEL,
            "coldStart": {"mode": "auto", "seconds": 300, "samples": 10},
            "schedules": [
                {"name": "w", "start": iso(now - 5), "end": iso(now + 3600), "minReplicas": 4}
            ],
        },
    )
    first = wait_for(lambda: k.status("learn").get("coldStart"), 20, "status.coldStart")
    assert first["source"] in ("assumed", "measured")
    cold = wait_for(
        lambda: (c := k.status("learn").get("coldStart")) and len(c.get("samples", [])) >= 4 and c,
        300,
        "four observed starts",
    )
    assert cold["source"] == "measured"

    # Each sample is one pod's created -> Ready, as the API server recorded it (second
    # resolution): at least the kwok delay, and exactly what the pods say, however busy.
    def start(pod: Any) -> float | None:
        when = {c.type: c.last_transition_time for c in pod.status.conditions or []}
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
        if not ready:
            return None
        return float((when["Ready"] - pod.metadata.creation_timestamp).total_seconds())

    pods = k.core.list_namespaced_pod(namespace, label_selector="app=llm").items
    starts = [t for t in map(start, pods) if t is not None]
    assert all(s >= delay - 1 for s in cold["samples"]), cold
    assert all(any(abs(s - t) <= 1 for t in starts) for s in cold["samples"]), (cold, starts)
    # The lookahead: the measured cold start, the margin and the reconcile period.
    assert k.status("learn")["plan"]["lookaheadSeconds"] == pytest.approx(
        cold["seconds"] + 60 + RECONCILE_SECONDS, abs=0.2
    )


def test_dry_run_changes_nothing_but_status(kube: Any, namespace: str, operator: Metrics) -> None:
    k = _kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="1s"))
    wait_for(lambda: (k.deployment("llm").status.ready_replicas or 0) == 1, 30, "the Deployment")
    before = k.deployment("llm").metadata.resource_version
    now = time.time()
    k.create_pool(
        "dry",
        {
            "target": {"name": "llm"},
            "maxReplicas": 6,
            "model": MODEL,
            "dryRun": True,
            "coldStart": {"mode": "fixed", "seconds": 1},
            "standby": {"imagePrePull": {"enabled": True}, "placeholders": {"enabled": True}},
            "schedules": [
                {"name": "w", "start": iso(now - 5), "end": iso(now + 3600), "minReplicas": 4}
            ],
        },
    )
    wait_for(lambda: k.status("dry").get("desiredReplicas") == 4, 20, "a dry-run plan of 4")
    observed = k.status("dry")["observedGeneration"]
    time.sleep(3)  # several more reconciles
    status = k.status("dry")
    assert status["observedGeneration"] == observed
    dry = next(c for c in status["conditions"] if c["type"] == "DryRun")
    assert dry["status"] == "True"
    assert k.deployment("llm").metadata.resource_version == before
    assert k.deployment("llm").spec.replicas == 1
    assert "lastScaleTime" not in status
    assert k.events("dry") == []
    assert k.apps.list_namespaced_daemon_set(namespace).items == []
    assert [d.metadata.name for d in k.apps.list_namespaced_deployment(namespace).items] == ["llm"]


def _window(**fields: Any) -> dict[str, Any]:
    return {"schedules": [{"name": "w", "minReplicas": 1, **fields}]}


def _dated(start: str, end: str, **fields: Any) -> dict[str, Any]:
    return _window(start=start, end=end, **fields)


def _cron(cron: str, **fields: Any) -> dict[str, Any]:
    return _window(cron=cron, durationSeconds=60, **fields)


_PROM = {"prometheus": {"url": "http://prometheus:9090"}}

# (id, pool name or None, spec change, fragment of the API server's 422 answer). Each case is
# one create call that the CRD's schema or CEL rules must refuse.
BAD_SPECS: list[tuple[str, str | None, dict[str, Any], str]] = [
    ("negative-min", None, {"minReplicas": -1}, "spec.minReplicas"),
    ("negative-max", None, {"maxReplicas": -3}, "spec.maxReplicas"),
    ("huge-max", None, {"maxReplicas": 10**9}, "spec.maxReplicas"),
    ("huge-window-min", None, _window(minReplicas=10**9), "minReplicas"),
    ("min-above-max", None, {"minReplicas": 5, "maxReplicas": 2},
     "minReplicas must not exceed maxReplicas"),
    ("hpa-floor-on-deployment", None, {"mode": "hpaFloor"},
     "mode hpaFloor goes with a HorizontalPodAutoscaler"),
    ("keda-trigger-on-deployment", None, {"mode": "kedaTrigger"},
     "mode kedaTrigger goes with a ScaledObject"),
    ("scaled-object-in-replicas-mode", None, {"target": {"kind": "ScaledObject", "name": "so"}},
     "mode kedaTrigger goes with a ScaledObject"),
    ("zero-throughput", None, {"model": {"tokensPerSecond": 0}}, "tokensPerSecond"),
    ("enum-mode", None, {"mode": "sideways"}, "spec.mode"),
    ("enum-target-kind", None, {"target": {"kind": "Pod", "name": "x"}}, "target.kind"),
    ("enum-preset", None, {"model": {"tokensPerSecond": 10, "preset": "gpt-5"}}, "preset"),
    ("enum-engine", None, {"forecast": {**_PROM, "engine": "triton"}}, "engine"),
    ("enum-forecast-model", None, {"forecast": {**_PROM, "model": "lstm"}}, "forecast.model"),
    ("enum-scale-down", None, {"scaleDown": {"mode": "never"}}, "scaleDown.mode"),
    ("preset-without-memory", None, {"model": {"tokensPerSecond": 10, "preset": "llama-3.1-8b"}},
     "gpuMemoryGiB is required"),
    ("start-and-cron", None, _window(start="2030-01-01T00:00:00", cron="0 * * * *"),
     "exactly one of start and cron"),
    ("window-without-demand", None,
     {"schedules": [{"name": "w", "cron": "0 * * * *", "durationSeconds": 60}]},
     "minReplicas or"),
    ("end-before-start", None, _dated("2030-01-02T10:00:00", "2030-01-02T09:00:00"),
     "end must be after start"),
    ("end-equals-start", None, _dated("2030-01-02T10:00:00", "2030-01-02T10:00:00"),
     "end must be after start"),
    ("end-before-start-offsets", None,
     _dated("2030-01-02T10:00:00+02:00", "2030-01-02T07:30:00Z"), "end must be after start"),
    ("bad-zone-path", None, _cron("0 9 * * *", timeZone="../../etc/passwd"), "timeZone must"),
    ("bad-zone-spaces", None, _cron("0 9 * * *", timeZone="Central European"), "timeZone must"),
    ("cron-out-of-range", None, _cron("61 * * * *"), "cron must be five fields"),
    ("cron-four-fields", None, _cron("* * * *"), "cron must be five fields"),
    ("cron-six-fields", None, _cron("0 9 * * 1 2030"), "cron must be five fields"),
    ("cron-garbage", None, _cron("every monday"), "cron must be five fields"),
    ("cron-every-minute", None, _cron("* * * * *"), "cron must name one minute"),
    ("cron-every-quarter", None, _cron("*/15 8-18 * * *"), "cron must name one minute"),
    ("long-pool-name", "p" * 64, {}, "metadata.name must be at most 63"),
    ("long-target-name", None, {"target": {"name": "t" * 254}}, "spec.target.name"),
    ("long-window-name", None, _window(name="w" * 64, cron="0 * * * *", durationSeconds=60),
     "name"),
    ("url-scheme", None, {"forecast": {"prometheus": {"url": "ftp://x"}}}, "url"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "change", "fragment"),
    [case[1:] for case in BAD_SPECS],
    ids=[case[0] for case in BAD_SPECS],
)
def test_api_server_rejects_invalid_specs(
    kube: Any, namespace: str, crd: None, name: str | None, change: dict[str, Any], fragment: str
) -> None:
    k = _kube(kube, namespace)
    base: dict[str, Any] = {"target": {"name": "llm"}, "model": dict(MODEL)}
    with pytest.raises(ApiException) as info:
        k.create_pool(name or "bad", {**base, **change})
    assert info.value.status == 422, change
    assert info.value.body is not None, change
    assert fragment in info.value.body, (change, info.value.body)


def _roles(**prefill: Any) -> dict[str, Any]:
    return {
        "prefill": {"target": {"name": "llm-prefill"}, "tokensPerSecond": 8000, **prefill},
        "decode": {"target": {"name": "llm-decode"}, "tokensPerSecond": 1500},
    }


_PD_MODEL = {"promptTokens": 1000, "outputTokens": 200}

# The same, for a disaggregated pool (spec.roles): the whole spec of each case.
BAD_ROLE_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("target-and-roles", {"target": {"name": "llm"}, "roles": _roles(), "model": _PD_MODEL},
     "exactly one of target and roles"),
    ("neither", {"model": dict(MODEL)}, "exactly one of target and roles"),
    ("model-throughput-with-roles", {"roles": _roles(), "model": dict(MODEL)},
     "tokensPerSecond per role"),
    ("unified-without-throughput", {"target": {"name": "llm"}, "model": _PD_MODEL},
     "give model.tokensPerSecond"),
    ("role-hpa", {"roles": _roles(target={"kind": "HorizontalPodAutoscaler", "name": "h"}),
                  "model": _PD_MODEL}, "a role's target is a Deployment or a StatefulSet"),
    ("role-scaled-object", {"roles": _roles(target={"kind": "ScaledObject", "name": "s"}),
                            "model": _PD_MODEL}, "a role's target is a Deployment"),
    ("same-targets", {"roles": _roles(target={"name": "llm-decode"}), "model": _PD_MODEL},
     "prefill and decode need targets of their own"),
    ("role-min-above-max", {"roles": _roles(minReplicas=4, maxReplicas=2), "model": _PD_MODEL},
     "minReplicas must not exceed maxReplicas"),
    ("roles-hot-standby", {"roles": _roles(), "model": _PD_MODEL,
                           "standby": {"hot": {"replicas": 1}}}, "warm standby"),
    ("roles-placeholders", {"roles": _roles(), "model": _PD_MODEL,
                            "standby": {"placeholders": {"enabled": True}}}, "warm standby"),
    ("roles-prewarm", {"roles": _roles(), "model": _PD_MODEL, "prewarm": {"prompts": ["hi"]}},
     "prewarm is for unified pools"),
    ("roles-window-replicas", {"roles": _roles(), "model": _PD_MODEL, **_cron("0 9 * * *")},
     "not minReplicas"),
    ("roles-zero-throughput", {"roles": _roles(tokensPerSecond=0), "model": _PD_MODEL},
     "tokensPerSecond"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [case[1:] for case in BAD_ROLE_SPECS],
    ids=[case[0] for case in BAD_ROLE_SPECS],
)
def test_api_server_rejects_invalid_disaggregated_specs(
    kube: Any, namespace: str, crd: None, spec: dict[str, Any], fragment: str
) -> None:
    k = _kube(kube, namespace)
    with pytest.raises(ApiException) as info:
        k.create_pool("bad", spec)
    assert info.value.status == 422, spec
    assert info.value.body is not None, spec
    assert fragment in info.value.body, (spec, info.value.body)


def test_api_server_accepts_a_disaggregated_pool(kube: Any, namespace: str, crd: None) -> None:
    k = _kube(kube, namespace)
    spec = {
        "roles": _roles(minReplicas=0, maxReplicas=8, gpusPerReplica=2, selector='role="p"'),
        "model": _PD_MODEL,
        "schedules": [{"name": "w", "cron": "0 9 * * *", "durationSeconds": 60,
                       "expectedRequestsPerSecond": 20}],
        "standby": {"hot": {"replicas": 0}},
    }  # fmt: skip
    created = k.create_pool("pd", spec)
    assert created["spec"]["roles"]["prefill"]["maxReplicas"] == 8
    assert "target" not in created["spec"]


def test_api_server_accepts_the_edges_of_what_it_rejects(
    kube: Any, namespace: str, crd: None
) -> None:
    """The rules are not too strict: the same fields at their valid edges are created."""
    k = _kube(kube, namespace)
    spec: dict[str, Any] = {
        "target": {"name": "t" * 253},
        "model": dict(MODEL),
        "minReplicas": 0,
        "maxReplicas": 100_000,
        "schedules": [
            {"name": "a", "start": "2030-01-02T10:00:00", "end": "2030-01-02T10:00:01",
             "timeZone": "America/Argentina/Buenos_Aires", "minReplicas": 1},
            {"name": "b", "start": "2030-01-02T10:00:00+02:00", "end": "2030-01-02T08:00:01Z",
             "minReplicas": 1},
            {"name": "c", "cron": "15 8-18 L,1 JAN-MAR mon-fri", "durationSeconds": 60,
             "timeZone": "Etc/GMT+5", "minReplicas": 1},
            {"name": "d", "cron": "@hourly", "durationSeconds": 60, "minReplicas": 1},
            # Written in different forms: left to the operator (which reports Invalid).
            {"name": "e", "start": "2030-01-02", "end": "2030-01-01T00:00:00Z", "minReplicas": 1},
        ],
    }  # fmt: skip
    created = k.create_pool("p" * 63, spec)
    assert [w["name"] for w in created["spec"]["schedules"]] == ["a", "b", "c", "d", "e"]


def test_semantically_invalid_pools_are_flagged_while_others_are_served(
    kube: Any, namespace: str, operator: Metrics, prometheus: Prometheus
) -> None:
    k = _kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="1s"))
    now = time.time()
    base: dict[str, Any] = {"target": {"name": "llm"}, "maxReplicas": 6, "model": MODEL}
    active = {"name": "w", "start": iso(now - 5), "end": iso(now + 3600), "minReplicas": 2}
    k.create_pool("ghost", {**base, "target": {"name": "no-such-deployment"}})
    # Written in two forms, so the CRD's own end > start rule cannot compare them.
    backwards = {"name": "w", "start": iso(now + 600), "end": f"{iso(now + 60)}Z", "minReplicas": 3}
    k.create_pool("backwards", {**base, "schedules": [backwards]})
    too_big = {"preset": "llama-3.1-70b", "gpuMemoryGiB": 80, "gpusPerReplica": 1,
               "contextTokens": 4096, "tokensPerSecond": 3000}  # fmt: skip
    k.create_pool("toobig", {**base, "model": too_big})
    k.create_pool(
        "badql",
        {
            **base,
            "forecast": {
                "prometheus": {"url": prometheus.url},
                "queries": {"requestsPerSecond": "sum(rate(vllm:request_success_total[5m]"},
            },
        },
    )
    k.create_pool("good", {**base, "schedules": [active]})

    expected = {
        "ghost": ("TargetNotFound", "no-such-deployment"),
        "backwards": ("InvalidSpec", "ends before it starts"),
        "badql": ("InvalidPromQL", "requests_per_second"),
        "toobig": ("InvalidSpec", "model llama-3.1-70b does not fit on 1 x 80 GiB"),
    }
    for name, (reason, fragment) in expected.items():
        cond = wait_for(
            functools.partial(k.condition_is, name, "Invalid", "True"),
            30,
            f"{name} to be Invalid",
        )
        assert cond["reason"] == reason
        assert fragment in cond["message"]
        events = wait_for(functools.partial(k.events, name), 10, f"a Warning event on {name}")
        assert [(e.type, e.reason) for e in events][:1] == [("Warning", reason)]
        assert "desiredReplicas" not in k.status(name)
    wait_for(lambda: k.deployment("llm").spec.replicas == 2, 30, "the good pool to scale")
    # The status is written after the scale it records: wait for it, too. Until the older
    # pools on the same target are seen Invalid, the good one may be flagged TargetConflict
    # (the oldest pool that is not broken keeps a target): wait for the status after that.
    good = wait_for(
        lambda: (c := k.condition("good", "Invalid")) and c["status"] == "False" and c,
        60,
        "the good pool's status, valid",
    )
    assert good["reason"] == "Valid"
    # Fixing a pool clears Invalid.
    k.create_deployment(gpu_deployment("other", 1, ready_delay="1s"))
    k.patch_pool("ghost", {"target": {"name": "other"}})
    wait_for(
        lambda: (c := k.condition("ghost", "Invalid")) and c["status"] == "False",
        30,
        "ghost to become valid",
    )
    assert k.deployment("llm").spec.replicas == 2


def test_the_api_server_accepts_the_readme_examples(kube: Any, namespace: str, crd: None) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL)
    documents = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict)]
    pools = [d for d in documents if d.get("kind") == "InferencePool"]
    assert len(pools) >= 2  # the annotated example and the one beside KEDA
    k = _kube(kube, namespace)
    created = [
        k.create_pool(f"{pool['metadata']['name']}-{i}", pool["spec"])
        for i, pool in enumerate(pools)
    ]
    (annotated,) = [c for c in created if c["spec"].get("schedules")]
    # Defaults from the CRD schema are filled in by the API server itself.
    assert annotated["spec"]["forecast"]["stepSeconds"] == 60
    assert annotated["spec"]["schedules"][0]["name"] == "black-friday"
    (beside_keda,) = [c for c in created if c["spec"]["target"].get("kind") == "ScaledObject"]
    assert beside_keda["spec"]["mode"] == "kedaTrigger"


def test_two_pools_on_one_target_the_older_keeps_it(
    kube: Any, namespace: str, operator: Metrics
) -> None:
    k = _kube(kube, namespace)
    k.create_deployment(gpu_deployment("llm", 1, ready_delay="1s"))
    now = time.time()
    window = {"name": "w", "start": iso(now - 5), "end": iso(now + 3600)}
    base: dict[str, Any] = {"target": {"name": "llm"}, "maxReplicas": 6, "model": MODEL}
    k.create_pool("first", {**base, "schedules": [{**window, "minReplicas": 2}]})
    wait_for(lambda: k.deployment("llm").spec.replicas == 2, 30, "the first pool to scale")
    k.create_pool("second", {**base, "schedules": [{**window, "minReplicas": 4}]})

    cond = wait_for(
        lambda: (c := k.condition("second", "Invalid")) and c["status"] == "True" and c,
        30,
        "the second pool to be flagged",
    )
    assert cond["reason"] == "TargetConflict"
    assert "InferencePool first" in cond["message"]
    assert k.deployment("llm").spec.replicas == 2  # the younger pool changed nothing

    # Once the owner is gone, the other pool takes the target over.
    k.delete_pool("first")
    wait_for(lambda: k.deployment("llm").spec.replicas == 4, 60, "the second pool to take over")
    wait_for(
        lambda: (c := k.condition("second", "Invalid")) and c["status"] == "False",
        30,
        "the conflict to clear",
    )
