"""The controller's Prewarmer against a fake Kubernetes and a fake warm-up: one task per pod
UID, bounded concurrency, the leader only, every gated pod brought to an end (warmed or
released with a reason), conditions retried, clean cancellation; and the reconcile's side:
the pool's Prewarm condition, its Events, a bad ConfigMap, hot standby pods gated."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prescaler.controller.forecast import ForecastHub
from prescaler.controller.model import PoolObject
from prescaler.controller.prewarm import Prewarmer
from prescaler.controller.reconcile import Reconciler
from prescaler.controller.status import rfc3339
from prescaler.kube import KubeError, NotFound, ObjectRef, PodStart, StandbyObservation, Workload
from prescaler.metrics import Metrics
from prescaler.prewarm import (
    FAILED,
    NOT_CONFIGURED,
    PREWARMED,
    TIMED_OUT,
    WarmupConfig,
    WarmupResult,
)

NOW = 1_750_000_000.0
GATE = {"conditionType": "prescaler.io/prewarmed"}
GATED = {
    "metadata": {"labels": {"app": "llm"}},
    "spec": {"readinessGates": [GATE], "containers": [{"name": "vllm", "image": "vllm:1"}]},
}
UNGATED = {
    "metadata": {"labels": {"app": "llm"}},
    "spec": {"containers": [{"name": "vllm", "image": "vllm:1"}]},
}


@dataclass
class FakeKube:
    pools: dict[str, str] = field(default_factory=lambda: {"chat": "pool-uid"})
    """The pools the API server has now: name -> uid."""
    template: dict[str, Any] = field(default_factory=lambda: GATED)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    conditions: list[tuple[str, str, str]] = field(default_factory=list)
    events: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    failing_writes: int = 0
    config_map_reads: int = 0

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        if self.failing_writes:
            self.failing_writes -= 1
            raise KubeError("patch_namespaced_pod_status: 503 Service Unavailable", 503)
        (condition,) = patch["status"]["conditions"]
        assert condition["type"] == "prescaler.io/prewarmed"
        assert condition["status"] == "True"
        self.conditions.append((name, condition["reason"], condition["message"]))

    async def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        self.config_map_reads += 1
        try:
            return self.config_maps[name]
        except KeyError:
            raise NotFound(f"configmaps {name}", 404) from None

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        return self.pools.get(name)

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((ref.kind, ref.name, type_, reason, message))

    # What a reconcile needs besides.
    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        return Workload(kind, name, 2, 2, "app=llm", self.template)

    async def list_hpas(self, namespace: str) -> list[Any]:
        return []

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        return []

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        pass

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        self.objects[obj["metadata"]["name"]] = obj
        return StandbyObservation(desired=(obj.get("spec") or {}).get("replicas", 1), ready=0)

    async def delete(self, namespace: str, kind: str, name: str) -> None:
        self.objects.pop(name, None)


@dataclass
class FakeWarm:
    """The warm-up client's stand-in: records calls, can hold them, answers ``result``."""

    result: WarmupResult = field(
        default_factory=lambda: WarmupResult(PREWARMED, "3 warm-up requests answered")
    )
    hold: asyncio.Event | None = None
    calls: list[tuple[str, WarmupConfig]] = field(default_factory=list)
    running: int = 0
    most: int = 0
    cancelled: int = 0

    async def __call__(self, address: str, config: WarmupConfig) -> WarmupResult:
        self.calls.append((address, config))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if self.hold is not None:
                await self.hold.wait()
            return self.result
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


def pod(
    n: int = 1,
    *,
    gated: bool = True,
    condition: str | None = None,
    deployment: str = "llm",
    ready_at: float = NOW - 5,
) -> dict[str, Any]:
    conditions = [
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": rfc3339(ready_at)}
    ]
    if condition is not None:
        conditions.append({"type": "prescaler.io/prewarmed", "status": condition})
    return {
        "metadata": {
            "uid": f"uid-{n}",
            "name": f"{deployment}-5d8f9-{n}",
            "namespace": "ns",
            "labels": {"app": "llm", "pod-template-hash": "5d8f9"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"{deployment}-5d8f9", "controller": True}
            ],
        },
        "spec": {"readinessGates": [GATE] if gated else []},
        "status": {"podIP": f"10.64.0.{n}", "conditions": conditions},
    }


def spec(**extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "llm"},
        "minReplicas": 2,
        "maxReplicas": 8,
        "model": {"tokensPerSecond": 3000},
        "coldStart": {"mode": "fixed", "seconds": 60, "marginSeconds": 0},
        "prewarm": {"prompts": ["You are helpful.", "Summarize"], "maxRequests": 4},
    }
    out.update(extra)
    return out


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


@dataclass
class Setup:
    kube: FakeKube
    warm: FakeWarm
    prewarmer: Prewarmer
    reconciler: Reconciler
    clock: list[float]

    async def reconcile(
        self, pool_spec: dict[str, Any], status: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        pool = PoolObject("ns", "chat", "pool-uid", 1, pool_spec, status or {})
        patch = await self.reconciler.reconcile(pool)
        return {k: v for k, v in patch.items() if v is not None}

    async def round(self) -> None:
        self.prewarmer.evaluate()
        await self.prewarmer.settle()


def setup(kube: FakeKube | None = None, warm: FakeWarm | None = None, **options: Any) -> Setup:
    kube = kube or FakeKube()
    warm = warm or FakeWarm()
    clock = [NOW]
    metrics = Metrics()
    prewarmer = Prewarmer(kube, metrics, clock=lambda: clock[0], warm=warm, **options)  # type: ignore[arg-type]
    reconciler = Reconciler(
        kube=kube,  # type: ignore[arg-type]
        metrics=metrics,
        forecasts=ForecastHub(metrics=metrics, executor=None),
        clock=lambda: clock[0],
        prewarm=prewarmer,
    )
    return Setup(kube, warm, prewarmer, reconciler, clock)


def _condition(status: dict[str, Any], kind: str = "Prewarm") -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


# ---------------------------------------------------------------------- pods
def test_one_warm_up_per_pod_however_many_events_arrive() -> None:
    async def scenario() -> None:
        s = setup()
        await s.reconcile(spec())
        for _ in range(5):
            s.prewarmer.observe("MODIFIED", pod(1))
            s.prewarmer.evaluate()
        await s.prewarmer.settle()
        s.prewarmer.observe("MODIFIED", pod(1))  # the watch has not shown the condition yet
        await s.round()
        assert len(s.warm.calls) == 1
        address, config = s.warm.calls[0]
        assert address == "10.64.0.1"
        assert config.requests == ("You are helpful.", "Summarize")
        assert s.kube.conditions == [("llm-5d8f9-1", PREWARMED, "3 warm-up requests answered")]
        assert [e[:4] for e in s.kube.events if e[0] == "Pod"] == [
            ("Pod", "llm-5d8f9-1", "Normal", PREWARMED)
        ]
        s.prewarmer.observe("MODIFIED", pod(1, condition="True"))
        assert s.prewarmer.tracked == 0

    run(scenario)


def test_warm_ups_run_at_most_concurrency_at_once() -> None:
    async def scenario() -> None:
        hold = asyncio.Event()
        s = setup(warm=FakeWarm(hold=hold), concurrency=2)
        await s.reconcile(spec())
        for n in range(1, 6):
            s.prewarmer.observe(None, pod(n))
        s.prewarmer.evaluate()
        for _ in range(20):
            await asyncio.sleep(0)
        assert (s.warm.running, s.prewarmer.running) == (2, 5)
        hold.set()
        await s.prewarmer.settle()
        assert s.warm.most == 2
        assert sorted(c[0] for c in s.kube.conditions) == [f"llm-5d8f9-{n}" for n in range(1, 6)]

    run(scenario)


def test_only_the_leader_warms_and_a_new_leader_warms_what_was_cut_short() -> None:
    async def scenario() -> None:
        leading = [False]
        hold = asyncio.Event()
        s = setup(warm=FakeWarm(hold=hold), is_leader=lambda: leading[0])
        await s.reconcile(spec())
        s.prewarmer.observe(None, pod(1))
        await s.round()
        assert s.warm.calls == []
        leading[0] = True
        s.prewarmer.evaluate()
        await asyncio.sleep(0)
        assert len(s.warm.calls) == 1
        leading[0] = False  # the Lease is lost mid warm-up
        await s.round()
        assert s.warm.cancelled == 1
        assert s.kube.conditions == []
        leading[0] = True
        hold.set()
        await s.round()
        assert len(s.warm.calls) == 2
        assert [c[1] for c in s.kube.conditions] == [PREWARMED]

    run(scenario)


def test_failures_set_the_condition_with_a_warning_on_the_pod_and_the_pool() -> None:
    async def scenario() -> None:
        for reason in (FAILED, TIMED_OUT):
            warm = FakeWarm(result=WarmupResult(reason, "1 of 2 warm-up requests failed"))
            s = setup(warm=warm)
            await s.reconcile(spec())
            s.prewarmer.observe(None, pod(1))
            await s.round()
            assert s.kube.conditions == [("llm-5d8f9-1", reason, warm.result.message)]
            assert [e[:4] for e in s.kube.events if e[3] == reason] == [
                ("Pod", "llm-5d8f9-1", "Warning", reason),
                ("InferencePool", "chat", "Warning", reason),
            ]
            assert "pod llm-5d8f9-1: 1 of 2" in s.kube.events[-1][4]

    run(scenario)


def test_a_gated_pod_nobody_claims_is_released_after_the_grace() -> None:
    async def scenario() -> None:
        s = setup(unclaimed_seconds=120)
        s.prewarmer.observe(None, pod(1, deployment="orphan"))
        await s.round()
        s.clock[0] += 119
        await s.round()
        assert s.kube.conditions == []
        s.clock[0] += 1
        await s.round()
        assert [c[:2] for c in s.kube.conditions] == [("orphan-5d8f9-1", NOT_CONFIGURED)]
        assert [e[:4] for e in s.kube.events] == [
            ("Pod", "orphan-5d8f9-1", "Warning", NOT_CONFIGURED)
        ]
        assert s.warm.calls == []

    run(scenario)


def test_a_gated_pod_nobody_claims_is_released_only_by_its_owner() -> None:
    """With shards, a replica releases an unclaimed gated pod only if it owns it (the
    sweeper, or its pool's replica); another replica leaves it alone."""

    async def scenario() -> None:
        mine, other = setup(unclaimed_seconds=0), setup(unclaimed_seconds=0)
        mine.prewarmer.owns_unclaimed = lambda key, _: key == ("ns", "Deployment", "orphan")
        other.prewarmer.owns_unclaimed = lambda key, _: False
        for s in (mine, other):
            s.prewarmer.observe(None, pod(1, deployment="orphan"))
            await s.round()
            s.clock[0] += 1
            await s.round()
        assert [c[:2] for c in mine.kube.conditions] == [("orphan-5d8f9-1", NOT_CONFIGURED)]
        assert other.kube.conditions == []

    run(scenario)


def test_a_gated_pod_of_a_pool_without_prewarm_is_released_at_once() -> None:
    async def scenario() -> None:
        s = setup()
        status = await s.reconcile(spec(prewarm=None))
        assert _condition(status) is None
        s.prewarmer.observe(None, pod(1))
        await s.round()
        assert [c[:2] for c in s.kube.conditions] == [("llm-5d8f9-1", NOT_CONFIGURED)]
        assert "InferencePool chat has no spec.prewarm" in s.kube.conditions[0][2]

    run(scenario)


def test_pods_without_the_gate_are_warmed_only_when_new() -> None:
    async def scenario() -> None:
        s = setup(FakeKube(template=UNGATED))
        await s.reconcile(spec())
        s.prewarmer.observe(None, pod(1, gated=False))
        s.prewarmer.observe(None, pod(2, gated=False, ready_at=NOW - 600))  # serving already
        s.prewarmer.observe(None, pod(3, gated=False, deployment="other"))  # not ours
        await s.round()
        assert [c[0] for c in s.warm.calls] == ["10.64.0.1"]
        assert s.prewarmer.tracked == 0

    run(scenario)


def test_a_new_pod_without_the_gate_seen_before_its_pool_reconciled_is_warmed_after() -> None:
    async def scenario() -> None:
        s = setup(FakeKube(template=UNGATED))
        young = pod(1, gated=False)
        young["metadata"]["creationTimestamp"] = rfc3339(NOW - 10)
        s.prewarmer.observe(None, young)
        await s.round()
        assert s.warm.calls == []
        await s.reconcile(spec())
        await s.round()
        assert [c[0] for c in s.warm.calls] == ["10.64.0.1"]

    run(scenario)


def test_a_condition_that_cannot_be_written_is_retried_without_warming_again() -> None:
    async def scenario() -> None:
        s = setup(FakeKube(failing_writes=2))
        await s.reconcile(spec())
        s.prewarmer.observe(None, pod(1))
        for _ in range(3):
            await s.round()
        assert len(s.warm.calls) == 1
        assert [c[1] for c in s.kube.conditions] == [PREWARMED]

    run(scenario)


def test_a_deleted_pod_cancels_its_warm_up_and_close_cancels_the_rest() -> None:
    async def scenario() -> None:
        s = setup(warm=FakeWarm(hold=asyncio.Event()))
        await s.reconcile(spec())
        s.prewarmer.start()
        s.prewarmer.observe(None, pod(1))
        s.prewarmer.observe(None, pod(2))
        for _ in range(20):
            await asyncio.sleep(0)
        assert s.warm.running == 2
        s.prewarmer.observe("DELETED", pod(1))
        for _ in range(5):
            await asyncio.sleep(0)
        assert (s.warm.cancelled, s.warm.running) == (1, 1)
        await s.prewarmer.close()
        assert (s.warm.cancelled, s.warm.running, s.prewarmer.running) == (2, 0, 0)
        assert s.kube.conditions == []

    run(scenario)


# ---------------------------------------------------------------------- pools
def test_the_pool_says_whether_its_pods_wait_with_one_event_per_change() -> None:
    async def scenario() -> None:
        kube = FakeKube(template=UNGATED)
        s = setup(kube)
        status = await s.reconcile(spec())
        for _ in range(3):
            status = await s.reconcile(spec(), status)
        cond = _condition(status)
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("False", "NotGated")
        assert "lists no readinessGate prescaler.io/prewarmed" in cond["message"]
        assert [e[2:4] for e in kube.events] == [("Warning", "NotGated")]
        kube.template = GATED
        status = await s.reconcile(spec(), status)
        cond = _condition(status)
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("True", "Gated")
        assert "at most 4 warm-up requests (prompts from spec.prewarm.prompts" in cond["message"]
        assert [e[2:4] for e in kube.events] == [("Warning", "NotGated"), ("Normal", "Gated")]
        status = await s.reconcile(spec(prewarm=None), status)
        assert _condition(status) is None

    run(scenario)


def test_a_bad_config_map_is_a_condition_and_its_pods_are_released_as_failed() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        s = setup(kube, config_map_seconds=60)
        ref = {"configMapRef": {"name": "prompts", "key": "system"}}
        status = await s.reconcile(spec(prewarm=ref))
        cond = _condition(status)
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("False", "PromptsUnavailable")
        assert cond["message"].startswith(
            "ConfigMap prompts (spec.prewarm.configMapRef) not found: new pods of Deployment "
            "llm are released without warm-up"
        )
        s.prewarmer.observe(None, pod(1))
        await s.round()
        assert s.warm.calls == []
        assert [c[1] for c in kube.conditions] == [FAILED]
        assert "ConfigMap prompts (spec.prewarm.configMapRef) not found" in kube.conditions[0][2]

        kube.config_maps["prompts"] = {"other": "[]"}
        status = await s.reconcile(spec(prewarm=ref), status)  # read again after 60 s only
        assert kube.config_map_reads == 1
        s.clock[0] += 60
        status = await s.reconcile(spec(prewarm=ref), status)
        cond = _condition(status)
        assert cond is not None
        assert "has no key system (keys: other)" in cond["message"]

        kube.config_maps["prompts"] = {"system": "- |\n  You are helpful.\n"}
        s.clock[0] += 60
        status = await s.reconcile(spec(prewarm=ref), status)
        cond = _condition(status)
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("True", "Gated")
        warnings = [e[3] for e in kube.events if e[0] == "InferencePool" and e[2] == "Warning"]
        assert warnings == ["PromptsUnavailable", FAILED, "PromptsUnavailable"]
        s.prewarmer.observe(None, pod(2))
        await s.round()
        assert s.warm.calls[0][1].prompts == ("You are helpful.\n",)

    run(scenario)


def test_hot_standby_pods_carry_the_gate_and_are_warmed_too() -> None:
    async def scenario() -> None:
        kube = FakeKube(template=UNGATED)
        s = setup(kube)
        await s.reconcile(spec(standby={"hot": {"replicas": 1}}))
        hot = kube.objects["chat-hot"]["spec"]["template"]
        assert hot["spec"]["readinessGates"] == [GATE]
        assert "readinessGates" not in UNGATED["spec"], "the target's template is untouched"
        s.prewarmer.observe(None, pod(1, deployment="chat-hot"))
        await s.round()
        assert [c[0] for c in s.warm.calls] == ["10.64.0.1"]
        await s.reconcile(spec(standby={"hot": {"replicas": 1}}, prewarm=None))
        assert "readinessGates" not in kube.objects["chat-hot"]["spec"]["template"]["spec"]

    run(scenario)


def test_a_deleted_pool_no_longer_claims_its_pods() -> None:
    async def scenario() -> None:
        s = setup(unclaimed_seconds=0)
        await s.reconcile(spec())
        s.reconciler.forget(PoolObject("ns", "chat", "pool-uid", 1, {}, {}))
        s.prewarmer.observe(None, pod(1))
        await s.round()
        await s.round()
        assert s.warm.calls == []
        assert [c[1] for c in s.kube.conditions] == [NOT_CONFIGURED]

    run(scenario)
