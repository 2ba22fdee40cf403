"""Prewarmed replicas, the operator's side: pods watched, warm-ups run, conditions written.

Inputs, all in the operator's event loop:

- the pod watch (``handlers.py``): :meth:`Prewarmer.observe` keeps the pods that need a
  decision (gated pods until their condition is set; new pods of a workload whose pool has
  ``spec.prewarm``, or may have it once it reconciles), in memory, on every replica, so a
  new leader acts at once;
- each pool's reconcile (leader only): :meth:`Prewarmer.pool_condition` publishes what the
  pods of its workload get (a warm-up, or nothing) and returns the pool's ``Prewarm``
  condition (an Event when it turns ``False`` or changes while ``False``);
- the leader Lease: only the leader warms pods and writes their conditions.

One loop (:meth:`Prewarmer.run`) decides for each pod (``prescaler.prewarm.decide``, pure)
when anything changes, and at least every ``tick_seconds``. It runs at most one task per
pod UID and at most ``concurrency`` warm-ups at once. Each task ends by setting the pod's
condition, whatever the outcome; a condition that could not be written is retried without
warming again. :meth:`Prewarmer.close` cancels every task and waits for them, so no
connection outlives the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prescaler.api import (
    PREWARM_CONDITION,
    InferencePoolSpec,
    InferencePoolStatus,
    PrewarmSpec,
)
from prescaler.controller.model import PoolObject
from prescaler.controller.status import ConditionUpdate, merge_conditions, rfc3339
from prescaler.kube import ROLE_HOT, KubeApi, KubeError, NotFound, ObjectRef, Workload, object_name
from prescaler.metrics import Metrics
from prescaler.prewarm import (
    PREWARMED,
    Claim,
    PodGate,
    WarmupConfig,
    WarmupResult,
    condition_patch,
    decide,
    has_gate,
    parse_prompts,
    pod_gate,
    warm_up,
    warmup_config,
)

log = logging.getLogger("prescaler.prewarm")

WarmFn = Callable[[str, WarmupConfig], Awaitable[WarmupResult]]
DONE_MEMORY_SECONDS = 600.0
"""How long a pod whose condition was written is not decided again (until the watch
shows the condition, which ends it sooner)."""


@dataclass
class _Tracked:
    pod: PodGate
    waiting_since: float | None = None
    """When this replica, leading, first saw it ready and waiting for a decision."""
    unwritten: WarmupResult | None = None
    """A finished warm-up whose condition could not be written yet."""


@dataclass(frozen=True, slots=True)
class _Published:
    claim: Claim
    pool: ObjectRef


@dataclass(frozen=True, slots=True)
class _Prompts:
    source: tuple[str, str]
    at: float
    prompts: tuple[str, ...] | None
    problem: str | None


class Prewarmer:
    """See the module docstring."""

    def __init__(
        self,
        kube: KubeApi,
        metrics: Metrics,
        *,
        concurrency: int = 16,
        unclaimed_seconds: float = 120.0,
        config_map_seconds: float = 60.0,
        tick_seconds: float = 2.0,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        warm: WarmFn = warm_up,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.concurrency = concurrency
        self.unclaimed_seconds = unclaimed_seconds
        self.config_map_seconds = config_map_seconds
        self.tick_seconds = tick_seconds
        self.is_leader = is_leader
        self.owns_unclaimed: Callable[[tuple[str, str, str] | None, Mapping[str, str]], bool] = (
            lambda _key, _labels: True
        )
        """Whether this replica decides a gated pod of that workload that no pool of its
        own claims, given the pod's labels (with shards: the replica serving the pool that
        scales it, else the one serving the workload's shard; see ``ShardGate.owns_pod``),
        and so releases it after the grace."""
        self.clock = clock
        self._warm = warm
        self._pods: dict[str, _Tracked] = {}
        self._done: dict[str, float] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._claims: dict[tuple[str, str, str], _Published] = {}
        self._by_pool: dict[str, set[tuple[str, str, str]]] = {}
        self._prompts: dict[str, _Prompts] = {}
        self._semaphore = asyncio.Semaphore(concurrency)
        self._wake = asyncio.Event()
        self._leading = False
        self._loop: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ pods
    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A pod watch event (cheap: most pods are not ours and return at once)."""
        pod = pod_gate(body)
        if not pod.uid:
            return
        if event_type == "DELETED" or pod.terminating:
            self._drop(pod.uid, cancel=True)
            return
        if pod.done:
            self._drop(pod.uid, cancel=False)  # its task, if any, is writing that now
            return
        if not pod.gated:
            published = self._claims.get(pod.key) if pod.key is not None else None
            claim = published.claim if published is not None else None
            verdict = decide(
                pod,
                claim,
                self.clock(),
                waiting_since=None,
                unclaimed_grace_seconds=self.unclaimed_seconds,
            )
            if verdict.verb == "forget":  # not ours: most pods end here
                self._pods.pop(pod.uid, None)
                return
        tracked = self._pods.get(pod.uid)
        if tracked is None:
            self._pods[pod.uid] = _Tracked(pod)
        else:
            tracked.pod = pod
        self._kick()

    def _drop(self, uid: str, *, cancel: bool) -> None:
        self._pods.pop(uid, None)
        self._done.pop(uid, None)
        task = self._tasks.get(uid)
        if cancel and task is not None:
            task.cancel()

    @property
    def tracked(self) -> int:
        """Pods waiting for a decision or a warm-up."""
        return len(self._pods)

    # ------------------------------------------------------------------ pools
    async def pool_condition(
        self,
        pool: PoolObject,
        spec: InferencePoolSpec,
        workload: Workload,
        previous: InferencePoolStatus,
    ) -> ConditionUpdate | None:
        """Publish what the pool's pods get and return its ``Prewarm`` condition (``None``
        without ``spec.prewarm``). An Event says when it turns ``False``, changes while
        ``False`` or recovers; never once per reconcile."""
        ref = pool.ref
        keys = [(pool.namespace, workload.kind, workload.name)]
        prewarm = spec.prewarm
        if prewarm is None:
            self._publish(pool.uid, {keys[0]: _Published(Claim(pool.name, None), ref)})
            self._prompts.pop(pool.uid, None)
            return None
        prompts, problem = await self._resolve(pool, prewarm)
        config = warmup_config(prewarm, prompts or ())
        claim = Claim(pool.name, config, problem)
        if spec.standby.hot.replicas > 0:
            keys.append((pool.namespace, "Deployment", object_name(pool.name, ROLE_HOT)))
        self._publish(pool.uid, {key: _Published(claim, ref) for key in keys})
        update = _condition(prewarm, workload, problem)
        await self._condition_event(ref, previous, update)
        return update

    def forget_pool(self, uid: str) -> None:
        """A deleted pool: its pods are no longer claimed."""
        self._publish(uid, {})
        self._prompts.pop(uid, None)

    def _publish(self, uid: str, claims: dict[tuple[str, str, str], _Published]) -> None:
        for key in self._by_pool.pop(uid, set()) - set(claims):
            self._claims.pop(key, None)
        self._claims.update(claims)
        if claims:
            self._by_pool[uid] = set(claims)
        self._kick()

    async def _resolve(
        self, pool: PoolObject, prewarm: PrewarmSpec
    ) -> tuple[tuple[str, ...] | None, str | None]:
        """The prompts and, if there are none, why. A ConfigMap is read at most once per
        ``config_map_seconds``; when it cannot be read for a transient reason the last
        prompts read are kept."""
        if prewarm.prompts is not None:
            return tuple(prewarm.prompts), None
        ref = prewarm.config_map_ref
        assert ref is not None  # the CRD demands one of them
        source = (ref.name, ref.key)
        now = self.clock()
        cached = self._prompts.get(pool.uid)
        fresh = cached is not None and now - cached.at < self.config_map_seconds
        if cached is not None and cached.source == source and fresh:
            return cached.prompts, cached.problem
        where = f"ConfigMap {ref.name} (spec.prewarm.configMapRef)"
        prompts: tuple[str, ...] | None = None
        problem: str | None = None
        try:
            data = await self.kube.read_config_map(pool.namespace, ref.name)
        except NotFound:
            problem = f"{where} not found"
        except KubeError as exc:
            if cached is not None and cached.source == source:
                return cached.prompts, cached.problem
            return None, f"{where} could not be read: {exc}"
        else:
            if ref.key not in data:
                keys = ", ".join(sorted(data)) or "none"
                problem = f"{where} has no key {ref.key} (keys: {keys})"
            else:
                try:
                    prompts = parse_prompts(data[ref.key])
                except ValueError as exc:
                    problem = f"{where} key {ref.key}: {exc}"
        self._prompts[pool.uid] = _Prompts(source, now, prompts, problem)
        return prompts, problem

    async def _condition_event(
        self, ref: ObjectRef, previous: InferencePoolStatus, update: ConditionUpdate
    ) -> None:
        old = next((c for c in previous.conditions if c.type == "Prewarm"), None)
        if update.status == "False" and (
            old is None
            or old.status != "False"
            or old.reason != update.reason
            or old.message != update.message[:1024]
        ):
            await self.kube.post_event(ref, "Warning", update.reason, update.message)
        elif update.status == "True" and old is not None and old.status == "False":
            await self.kube.post_event(ref, "Normal", update.reason, update.message)

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        """Start the loop (in the running event loop)."""
        if self._loop is None:
            self._loop = asyncio.create_task(self.run(), name="prewarm")

    def kick(self) -> None:
        """Decide now (a leadership change, say)."""
        self._kick()

    def _kick(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Decide for every tracked pod whenever something changed, and every tick."""
        while True:
            self._wake.clear()
            try:
                self.evaluate()
            except Exception:  # a bug here must not end warm-ups for good
                log.exception("prewarm: deciding failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_seconds):
                    await self._wake.wait()

    def evaluate(self) -> None:
        """One round of decisions; starts the tasks they call for."""
        now = self.clock()
        for uid, at in list(self._done.items()):
            if now - at > DONE_MEMORY_SECONDS:
                del self._done[uid]
        if not self.is_leader():
            if self._leading:
                self._leading = False
                for task in self._tasks.values():
                    task.cancel()  # the new leader warms them again
                for tracked in self._pods.values():
                    tracked.waiting_since = None
            return
        self._leading = True
        for uid, tracked in list(self._pods.items()):
            if uid in self._tasks or uid in self._done:
                continue
            pod = tracked.pod
            published = self._claims.get(pod.key) if pod.key is not None else None
            claim = published.claim if published is not None else None
            if claim is None and not self.owns_unclaimed(pod.key, pod.labels):
                continue  # another replica's: its pool's, or the sweeper's
            if tracked.unwritten is not None:
                self._spawn(pod, published, None, tracked.unwritten)
                continue
            if tracked.waiting_since is None and pod.containers_ready_at is not None and pod.ip:
                tracked.waiting_since = now
            action = decide(
                pod,
                claim,
                now,
                waiting_since=tracked.waiting_since,
                unclaimed_grace_seconds=self.unclaimed_seconds,
            )
            if action.verb == "forget":
                del self._pods[uid]
            elif action.verb == "warm":
                config = claim.config if claim is not None else None
                assert config is not None
                self._spawn(pod, published, config, None)
            elif action.verb == "release":
                assert action.reason is not None
                self._spawn(pod, published, None, WarmupResult(action.reason, action.message))

    def _spawn(
        self,
        pod: PodGate,
        published: _Published | None,
        config: WarmupConfig | None,
        result: WarmupResult | None,
    ) -> None:
        task = asyncio.create_task(self._task(pod, published, config, result))
        self._tasks[pod.uid] = task
        task.add_done_callback(lambda _: self._finished(pod.uid, task))

    def _finished(self, uid: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(uid) is task:
            del self._tasks[uid]
        self._kick()

    async def _task(
        self,
        pod: PodGate,
        published: _Published | None,
        config: WarmupConfig | None,
        result: WarmupResult | None,
    ) -> None:
        try:
            if result is None:
                assert config is not None
                result = await self._warm_up(pod.ip or "", config)
            await self._write(pod, published, result)
        except asyncio.CancelledError:
            raise
        except Exception:  # tracked still: decided again at the next round
            log.exception("prewarm: pod %s/%s", pod.namespace, pod.name)

    async def _warm_up(self, address: str, config: WarmupConfig) -> WarmupResult:
        async with self._semaphore:
            self.metrics.prewarm_running.inc()
            try:
                result = await self._warm(address, config)
            finally:
                self.metrics.prewarm_running.dec()
        self.metrics.prewarm_duration.observe(result.seconds)
        return result

    async def _write(
        self, pod: PodGate, published: _Published | None, result: WarmupResult
    ) -> None:
        """Set the pod's condition (the gate opens); Events say how it went."""
        tracked = self._pods.get(pod.uid)
        patch = condition_patch(result.reason, result.message, rfc3339(self.clock()))
        try:
            await self.kube.patch_pod_status(pod.namespace, pod.name, patch)
        except NotFound:
            self._pods.pop(pod.uid, None)
            return
        except KubeError as exc:
            log.warning("prewarm: condition of %s/%s not written: %s", pod.namespace, pod.name, exc)
            if tracked is not None:
                tracked.unwritten = result
            return
        self._pods.pop(pod.uid, None)
        self._done[pod.uid] = self.clock()
        self.metrics.prewarm_pods.labels(result.reason).inc()
        gate = "" if pod.gated else " (not gated: it was serving already)"
        log.info(
            "prewarm: %s/%s %s: %s%s", pod.namespace, pod.name, result.reason, result.message, gate
        )
        subject = ObjectRef("v1", "Pod", pod.name, pod.namespace, pod.uid)
        if result.reason == PREWARMED:
            await self.kube.post_event(subject, "Normal", result.reason, result.message + gate)
            return
        await self.kube.post_event(subject, "Warning", result.reason, result.message)
        if published is not None:
            await self.kube.post_event(
                published.pool, "Warning", result.reason, f"pod {pod.name}: {result.message}"
            )

    async def settle(self) -> None:
        """Wait until no task runs (each task may start the next round's)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
            await asyncio.sleep(0)

    @property
    def running(self) -> int:
        """Pods with a task now (warming, or writing their condition)."""
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel the loop and every task, and wait for them (connections close)."""
        tasks = [t for t in (self._loop, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop = None


def _condition(prewarm: PrewarmSpec, workload: Workload, problem: str | None) -> ConditionUpdate:
    what = f"{workload.kind} {workload.name}"
    if problem is not None:
        return ConditionUpdate(
            "Prewarm",
            "False",
            "PromptsUnavailable",
            f"{problem}: new pods of {what} are released without warm-up",
        )
    if not has_gate(workload.template):
        return ConditionUpdate(
            "Prewarm",
            "False",
            "NotGated",
            f"the pod template of {what} lists no readinessGate {PREWARM_CONDITION}: new "
            "pods are warmed best effort and may take traffic before; add the gate to keep "
            "them out of the Service until warmed (docs/prewarm.md)",
        )
    source = (
        f"ConfigMap {prewarm.config_map_ref.name}"
        if prewarm.config_map_ref is not None
        else "spec.prewarm.prompts"
    )
    return ConditionUpdate(
        "Prewarm",
        "True",
        "Gated",
        f"new pods of {what} join the Service after at most {prewarm.max_requests} warm-up "
        f"requests (prompts from {source}, timeout {prewarm.timeout_seconds} s)",
    )


def with_prewarm_condition(
    status: InferencePoolStatus,
    update: ConditionUpdate | None,
    now: float,
    generation: int | None,
) -> InferencePoolStatus:
    """The status with the ``Prewarm`` condition set, or removed (``update`` is ``None``:
    no ``spec.prewarm``)."""
    if update is None:
        if not any(c.type == "Prewarm" for c in status.conditions):
            return status
        kept = [c for c in status.conditions if c.type != "Prewarm"]
        return status.model_copy(update={"conditions": kept})
    conditions = merge_conditions(status.conditions, [update], now, generation)
    return status.model_copy(update={"conditions": conditions})
