"""The reconcile pipeline against a fake Kubernetes: decisions, apply, status, Invalid."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import PoolGone, PoolObject
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.status import rfc3339
from prescaler.kube import (
    Hpa,
    NotFound,
    ObjectRef,
    PodStart,
    SecretData,
    StandbyObservation,
    Workload,
)
from prescaler.metrics import Metrics

NOW = 1_750_000_000.0


@dataclass
class FakeKube:
    pools: dict[str, str] = field(default_factory=lambda: {"pool": "uid-1"})
    """The pools the API server has now: name -> uid."""
    workloads: dict[tuple[str, str], Workload] = field(default_factory=dict)
    hpas: dict[str, Hpa] = field(default_factory=dict)
    pods: list[PodStart] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    priority_classes: dict[str, int] = field(default_factory=lambda: {"prescaler-placeholder": -10})
    secrets: dict[str, SecretData] = field(default_factory=dict)

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        try:
            return self.workloads[(kind, name)]
        except KeyError:
            raise NotFound(f"{kind} {name}", 404) from None

    async def list_hpas(self, namespace: str) -> list[Hpa]:
        return list(self.hpas.values())

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        self.calls.append(("scale", kind, name, replicas))
        w = self.workloads[(kind, name)]
        self.workloads[(kind, name)] = Workload(
            w.kind, w.name, replicas, w.ready_replicas, w.selector, w.template
        )

    async def get_hpa(self, namespace: str, name: str) -> Hpa:
        try:
            return self.hpas[name]
        except KeyError:
            raise NotFound(f"HPA {name}", 404) from None

    async def patch_hpa_min(self, namespace: str, name: str, min_replicas: int) -> None:
        self.calls.append(("hpa", name, min_replicas))

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        return list(self.pods)

    async def read_secret(self, namespace: str, name: str) -> SecretData:
        try:
            return self.secrets[name]
        except KeyError:
            raise NotFound(name, 404) from None

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        self.objects[obj["metadata"]["name"]] = obj
        return StandbyObservation(desired=(obj.get("spec") or {}).get("replicas", 3), ready=0)

    async def delete(self, namespace: str, kind: str, name: str) -> None:
        self.calls.append(("delete", kind, name))
        self.objects.pop(name, None)

    async def ensure_priority_class(self, obj: dict[str, Any]) -> None:
        self.calls.append(("priorityclass", obj["metadata"]["name"]))

    async def priority_value(self, name: str | None) -> int:
        if name is None:
            return 0
        try:
            return self.priority_classes[name]
        except KeyError:
            raise NotFound(name, 404) from None

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        return self.pools.get(name)

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


TEMPLATE = {
    "metadata": {"labels": {"app": "llm"}},
    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.9"}]},
}


def _kube(replicas: int = 1, ready: int = 1) -> FakeKube:
    kube = FakeKube()
    kube.workloads[("Deployment", "llm")] = Workload(
        "Deployment", "llm", replicas, ready, "app=llm", TEMPLATE
    )
    return kube


def _spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "llm"},
        "minReplicas": 1,
        "maxReplicas": 8,
        "model": {"tokensPerSecond": 3000},
        "coldStart": {"mode": "fixed", "seconds": 60, "marginSeconds": 0},
    }
    spec.update(extra)
    return spec


def _window(start_in: float, end_in: float, replicas: int, lead: int = 120) -> dict[str, Any]:
    return {
        "name": "launch",
        "start": rfc3339(NOW + start_in),
        "end": rfc3339(NOW + end_in),
        "minReplicas": replicas,
        "leadSeconds": lead,
    }


def _reconciler(kube: FakeKube, now: float = NOW) -> Reconciler:
    metrics = Metrics()
    return Reconciler(
        kube=kube,
        metrics=metrics,
        forecasts=ForecastHub(metrics=metrics, executor=None),
        clock=lambda: now,
    )


def _run(
    rec: Reconciler, spec: dict[str, Any], status: dict[str, Any] | None = None
) -> dict[str, Any]:
    pool = PoolObject("ns", "pool", "uid-1", 1, spec, status or {})
    return asyncio.run(rec.reconcile(pool))


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_window_within_lead_scales_up_and_emits_an_event() -> None:
    kube = _kube()
    status = _run(_reconciler(kube), _spec(schedules=[_window(100, 400, 4)]))
    assert kube.calls == [("scale", "Deployment", "llm", 4)]
    assert [e[1] for e in kube.events] == ["ScaledUp"]
    assert status["desiredReplicas"] == 4
    assert status["plan"]["constraint"] == "schedule"
    assert status["lastScaleUpTime"] == rfc3339(NOW)
    assert _condition(status, "ScheduleActive")["status"] == "True"
    assert status["nextWindow"]["name"] == "launch"


@pytest.mark.parametrize("now_there", [None, "uid-2"], ids=["deleted", "replaced"])
def test_a_pool_that_is_gone_scales_nothing(now_there: str | None) -> None:
    """Its loop may tick once more (its deletion came while the watch was down): the
    quorum read before the scale finds no pool of its uid, and nothing is written."""
    kube = _kube()
    kube.pools = {} if now_there is None else {"pool": now_there}
    with pytest.raises(PoolGone):
        _run(_reconciler(kube), _spec(schedules=[_window(100, 400, 4)]))
    assert kube.calls == []
    assert kube.events == []


def test_window_beyond_lead_leaves_the_target_alone() -> None:
    kube = _kube()
    status = _run(_reconciler(kube), _spec(schedules=[_window(1000, 1400, 4)]))
    assert kube.calls == []
    assert kube.events == []
    assert status["desiredReplicas"] == 1
    assert status["nextWindow"]["prewarmAt"] == rfc3339(NOW + 1000 - 120)


def test_scale_down_waits_for_stabilization() -> None:
    kube = _kube(replicas=4, ready=4)
    recent = {"lastScaleUpTime": rfc3339(NOW - 30)}
    spec = _spec(scaleDown={"mode": "paced", "stabilizationSeconds": 300})
    status = _run(_reconciler(kube), spec, recent)
    assert kube.calls == []
    assert status["plan"]["action"] == "hold"
    status = _run(_reconciler(kube), spec, {"lastScaleUpTime": rfc3339(NOW - 3000)})
    assert status["plan"]["action"] == "scale_down"
    assert kube.calls == [("scale", "Deployment", "llm", 2)], "at most half per step"


def test_dry_run_changes_nothing_but_status() -> None:
    kube = _kube()
    spec = _spec(
        schedules=[_window(100, 400, 4)], dryRun=True, standby={"placeholders": {"enabled": True}}
    )
    status = _run(_reconciler(kube), spec)
    assert kube.calls == []
    assert kube.objects == {}
    assert kube.events == []
    assert status["desiredReplicas"] == 4
    assert _condition(status, "DryRun")["status"] == "True"
    assert "lastScaleTime" not in status


def test_hpa_floor_patches_min_replicas_only() -> None:
    kube = _kube()
    kube.hpas["llm-hpa"] = Hpa("llm-hpa", 1, 10, 1, "Deployment", "llm")
    spec = _spec(
        target={"kind": "HorizontalPodAutoscaler", "name": "llm-hpa"},
        mode="hpaFloor",
        schedules=[_window(100, 400, 5)],
    )
    status = _run(_reconciler(kube), spec)
    assert kube.calls == [("hpa", "llm-hpa", 5)]
    assert status["currentReplicas"] == 1
    assert "minReplicas of HPA" in kube.events[0][2]


def test_unknown_target_is_invalid_with_one_event() -> None:
    kube = FakeKube()
    rec = _reconciler(kube)
    status = _run(rec, _spec())
    invalid = _condition(status, "Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "TargetNotFound")
    assert _condition(status, "Ready")["status"] == "False"
    assert [e[:2] for e in kube.events] == [("Warning", "TargetNotFound")]
    _run(rec, _spec(), status)
    assert len(kube.events) == 1, "the same problem is not announced every cycle"


def test_window_end_before_start_is_invalid() -> None:
    kube = _kube()
    status = _run(_reconciler(kube), _spec(schedules=[_window(400, 100, 3)]))
    invalid = _condition(status, "Invalid")
    assert invalid["status"] == "True"
    assert "ends before it starts" in invalid["message"]
    assert kube.calls == []


def test_cold_start_is_learned_from_pods() -> None:
    kube = _kube()
    kube.pods = [PodStart(f"p{i}", NOW - 1000 + i, NOW - 1000 + i + 40 + i) for i in range(10)]
    status = _run(_reconciler(kube), _spec(coldStart={"mode": "auto", "seconds": 300}))
    cold = status["coldStart"]
    assert cold["source"] == "measured"
    assert cold["seconds"] == pytest.approx(48.0)
    assert len(cold["samples"]) == 10
    # The cold start, the margin, and the reconcile period the plan stands for.
    assert status["plan"]["lookaheadSeconds"] == pytest.approx(48.0 + 60 + 30)


def test_standby_objects_are_owned_and_sized_then_removed() -> None:
    kube = _kube()
    spec = _spec(standby={"imagePrePull": {"enabled": True}, "placeholders": {"enabled": True}})
    status = _run(_reconciler(kube), spec)
    daemonset = kube.objects["pool-prepull"]
    assert daemonset["kind"] == "DaemonSet"
    assert daemonset["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert (
        daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.9"
    )
    holder = kube.objects["pool-placeholder"]
    assert holder["spec"]["template"]["spec"]["priorityClassName"] == "prescaler-placeholder"
    assert ("priorityclass", "prescaler-placeholder") in kube.calls
    assert status["standby"]["imagePrePull"] is not None
    _run(_reconciler(kube), _spec(), status)
    assert set(kube.objects) == {"pool-degradation"}, "standby gone, the degradation policy kept"


def test_schedule_only_pool_scales_back_down_after_the_window() -> None:
    kube = _kube(replicas=4, ready=4)
    paced = {"mode": "paced", "stabilizationSeconds": 60}
    spec = _spec(schedules=[_window(-400, -100, 4)], scaleDown=paced)
    status = _run(_reconciler(kube), spec, {"lastScaleUpTime": rfc3339(NOW - 500)})
    assert kube.calls == [("scale", "Deployment", "llm", 2)]
    assert status["plan"]["action"] == "scale_down"
    assert [e[1] for e in kube.events] == ["ScaledDown"]
    # By default what the window no longer needs goes at once.
    kube = _kube(replicas=4, ready=4)
    spec = _spec(schedules=[_window(-400, -100, 4)])
    _run(_reconciler(kube), spec, {"lastScaleUpTime": rfc3339(NOW - 500)})
    assert kube.calls == [("scale", "Deployment", "llm", 1)]


def test_a_pool_with_a_forecast_but_no_data_never_shrinks() -> None:
    kube = _kube(replicas=4, ready=4)
    forecast = {"prometheus": {"url": "http://127.0.0.1:1"}, "model": "seasonal_naive"}
    spec = _spec(forecast=forecast, scaleDown={"stabilizationSeconds": 60})
    rec = _reconciler(kube)
    rec.forecasts.wait_seconds = 5
    status = _run(rec, spec, {"lastScaleUpTime": rfc3339(NOW - 5000)})
    assert kube.calls == []
    assert status["plan"]["action"] == "hold"
    assert _condition(status, "MetricsAvailable")["status"] == "False"
    assert _condition(status, "ForecastHealthy")["status"] == "False"


def test_a_model_that_does_not_fit_is_invalid_with_the_capacity_message() -> None:
    kube = _kube()
    model = {"preset": "llama-3.1-70b", "gpuMemoryGiB": 80, "gpusPerReplica": 1,
             "tokensPerSecond": 3000, "contextTokens": 4096}  # fmt: skip
    status = _run(_reconciler(kube), _spec(model=model))
    invalid = _condition(status, "Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "InvalidSpec")
    assert invalid["message"].startswith("spec.model: model llama-3.1-70b does not fit on 1 x")
    assert [e[:2] for e in kube.events] == [("Warning", "InvalidSpec")]
    assert kube.events[0][2] == invalid["message"]
    assert kube.calls == []


def _queue_warning(waiting: int, level: str = "warning") -> Any:
    from prescaler.planning import AdmissionPolicy, Assessment, DegradationState

    return Assessment(
        level=level,  # type: ignore[arg-type]
        raw_level=level,  # type: ignore[arg-type]
        state=DegradationState(level, NOW - 100),  # type: ignore[arg-type]
        reasons=(f"queue {waiting} waiting on 2 serving replicas",),
        signal_levels={"queue": level},  # type: ignore[dict-item]
        shortfall=None,
        admission=AdmissionPolicy(queue_depth_limit=40, retry_after_seconds=5),
        changed=False,
    )


def test_the_degradation_config_map_is_not_rewritten_for_the_live_numbers_of_its_reasons() -> None:
    # A queue held at warning changes its length at every reconcile: what gateways act
    # on (level, admission, the signals raising it) does not, so nothing is written again
    # until that changes, or until the ConfigMap is read back (then with fresh reasons).
    from prescaler.api import InferencePoolStatus, parse_spec

    kube = _kube()
    clock = [NOW]
    rec = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        metrics=Metrics(),
        forecasts=ForecastHub(metrics=Metrics(), executor=None),
        clock=lambda: clock[0],
        interval_seconds=15.0,
    )
    writes: list[str] = []
    ensure = kube.ensure

    async def counting(obj: dict[str, Any]) -> StandbyObservation:
        writes.append(obj["data"]["reasons"])
        return await ensure(obj)

    kube.ensure = counting  # type: ignore[method-assign]
    pool = PoolObject("ns", "pool", "uid-1", 1, _spec(), {})
    spec = parse_spec(_spec())
    previous = InferencePoolStatus()

    def publish(assessment: Any) -> None:
        asyncio.run(rec._publish_degradation(pool, spec, assessment, previous))
        clock[0] += 15.0

    for waiting in range(30, 38):  # 8 reconciles, 2 minutes: under the read-back period
        publish(_queue_warning(waiting))
    assert writes == ["queue 30 waiting on 2 serving replicas"]
    publish(_queue_warning(60, "critical"))  # the level changes: written at once
    assert len(writes) == 2
    assert kube.objects["pool-degradation"]["data"]["level"] == "critical"
    clock[0] += 10 * 15.0  # the read-back period: the live numbers are refreshed
    publish(_queue_warning(61, "critical"))
    assert writes[-1] == "queue 61 waiting on 2 serving replicas"
    assert len(writes) == 3


def test_a_read_without_a_token_mix_sizes_on_the_last_measured_one_not_the_specs() -> None:
    # A Prometheus restart left one reconcile without token rates: sized on the spec's mix,
    # the same demand asked for twice the replicas (seen live: 12.4 req/s needs 4, then 8).
    from prescaler.api import parse_spec
    from prescaler.sources import Snapshot

    rec = _reconciler(_kube())
    spec = parse_spec(_spec())
    measured = Snapshot(
        at=NOW,
        requests_per_second=10.0,
        prompt_tokens_per_second=1000.0,
        output_tokens_per_second=500.0,
        context_tokens=300.0,
    )
    before = rec._capacity("uid-1", spec, None, measured)
    gap = Snapshot(at=NOW + 15, requests_per_second=10.0)
    during = rec._capacity("uid-1", spec, None, gap)
    assert during == before
    assert during.tokens.prompt_tokens == pytest.approx(100.0)
    # Another pool never measured plans on its spec.
    assert rec._capacity("uid-2", spec, None, gap) != before
