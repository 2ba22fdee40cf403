"""The Kubernetes adapter: the only code that calls the Kubernetes API for the pipeline.

It wraps the blocking ``kubernetes`` client in a bounded thread pool and reads raw JSON
(``_preload_content=False``), which is several times cheaper than the client's model
objects when hundreds of pools reconcile every cycle.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import math
import random
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes import config as _config
from kubernetes import utils as k8s_utils
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from prescaler.kube._manifests import HASH_ANNOTATION, ROLE_LABEL
from prescaler.kube._types import (
    EXTERNAL_TRIGGERS,
    KEDA_GROUP,
    FieldWriter,
    Hpa,
    KubeError,
    NotFound,
    ObjectRef,
    PodStart,
    ScaledObject,
    SecretData,
    StandbyObservation,
    Workload,
)

log = logging.getLogger("prescaler.kube")
config: Any = _config  # untyped module
USER_AGENT = "prescaler-operator"
FIELD_MANAGER = USER_AGENT
"""The field manager of every write (``managedFields``): how the operator tells its own
writes of a target's replicas from someone else's."""
TRANSIENT = frozenset({429, 500, 502, 503, 504})
"""Answers worth the same request again: throttled, or the server failed (not the request)."""
RETRY_AFTER_LIMIT = 30.0
"""The longest ``Retry-After`` obeyed; a longer one is cut to this."""
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""The ReplicaSet controller removes pods with the lowest cost first on a scale-down."""


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def label_selector(selector: Mapping[str, Any]) -> str:
    """A ``LabelSelector`` object as the string form list calls take."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def field_writer(obj: Mapping[str, Any], path: tuple[str, ...]) -> FieldWriter | None:
    """Who last wrote the field at ``path`` (e.g. ``("spec", "replicas")``), from the
    object's ``managedFields``: the newest entry that owns it (``None`` if none does)."""
    best: FieldWriter | None = None
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        owned: Any = entry.get("fieldsV1") or {}
        for part in path:
            owned = owned.get(f"f:{part}") if isinstance(owned, dict) else None
        if owned is None:
            continue
        writer = FieldWriter(
            manager=str(entry.get("manager") or "unknown"),
            time=parse_time(entry.get("time")),
            subresource=str(entry.get("subresource") or ""),
        )
        if best is None or (writer.time or 0.0) >= (best.time or 0.0):
            best = writer
    return best


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    try:
        return min(RETRY_AFTER_LIMIT, max(0.0, float(str(headers.get("Retry-After")))))
    except (TypeError, ValueError):
        return None


def pod_start(pod: Mapping[str, Any]) -> PodStart:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready_at = scheduled_at = None
    unschedulable: str | None = None
    for cond in status.get("conditions") or []:
        kind, state = cond.get("type"), cond.get("status")
        if kind == "Ready" and state == "True":
            ready_at = parse_time(cond.get("lastTransitionTime"))
        elif kind == "PodScheduled" and state == "True":
            scheduled_at = parse_time(cond.get("lastTransitionTime"))
        elif kind == "PodScheduled" and cond.get("reason") == "Unschedulable":
            unschedulable = str(cond.get("message") or "no node can take it")
    created = parse_time(meta.get("creationTimestamp")) or 0.0
    cost: int | None = None
    raw_cost = (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION)
    with contextlib.suppress(TypeError, ValueError):
        cost = int(raw_cost) if raw_cost is not None else None
    return PodStart(
        name=meta.get("name", ""),
        created=created,
        ready_at=ready_at,
        scheduled_at=scheduled_at,
        unschedulable=unschedulable,
        terminating=meta.get("deletionTimestamp") is not None,
        deletion_cost=cost,
        role=(meta.get("labels") or {}).get(ROLE_LABEL),
    )


def hpa_from(obj: dict[str, Any]) -> Hpa:
    """An HPA object as scaling sees it: bounds, scale target and utilization target."""
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    ref = spec.get("scaleTargetRef", {})
    return Hpa(
        name=meta.get("name", ""),
        min_replicas=int(spec.get("minReplicas", 1)),
        max_replicas=int(spec.get("maxReplicas", 1)),
        current_replicas=int(status.get("currentReplicas") or 0),
        target_kind=ref.get("kind", ""),
        target_name=ref.get("name", ""),
        min_replicas_writer=field_writer(obj, ("spec", "minReplicas")),
        target_utilization=hpa_target_share(spec.get("metrics"))[0],
        external_metrics=tuple(
            str(name)
            for metric in spec.get("metrics") or ()
            if isinstance(metric, Mapping)
            and metric.get("type") == "External"
            and (name := ((metric.get("external") or {}).get("metric") or {}).get("name"))
        ),
        scaled_object=next(
            (
                ref.get("name") or ""
                for ref in meta.get("ownerReferences") or ()
                if ref.get("kind") == "ScaledObject"
                and str(ref.get("apiVersion", "")).startswith(f"{KEDA_GROUP}/")
            ),
            None,
        ),
    )


def scaled_object_from(obj: dict[str, Any]) -> ScaledObject:
    """A KEDA ScaledObject: what it scales, its HPA, and the pools its triggers name."""
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    ref = spec.get("scaleTargetRef") or {}
    pools: list[tuple[str | None, str]] = []
    for trigger in spec.get("triggers") or ():
        metadata = trigger.get("metadata") or {}
        if trigger.get("type") in EXTERNAL_TRIGGERS and metadata.get("pool"):
            pools.append((metadata.get("namespace") or None, str(metadata["pool"])))
    return ScaledObject(
        name=meta.get("name", ""),
        target_kind=ref.get("kind") or "Deployment",
        target_name=ref.get("name", ""),
        hpa_name=(status or {}).get("hpaName") or None,
        pools=tuple(pools),
        active=_condition((status or {}).get("conditions"), "Active"),
        fallback=_condition((status or {}).get("conditions"), "Fallback"),
    )


def _condition(conditions: Any, type_: str) -> bool | None:
    """A condition's status as a bool (``None``: not there, or ``Unknown``)."""
    for condition in conditions or ():
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            return {"True": True, "False": False}.get(str(condition.get("status")))
    return None


def hpa_target_share(metrics: Any) -> tuple[float | None, str]:
    """An HPA's target as a share of a replica's capacity, and how it was read (one reader
    for the live shadow HPA and ``prescaler backtest --prometheus``).

    A ``Resource`` or ``ContainerResource`` metric's ``averageUtilization`` (percent) is
    that share; a ``Pods``, ``Object`` or ``External`` target of at most 1 (a KV-cache
    usage, a load ratio; any Kubernetes quantity, ``500m`` is 0.5) is read as one. A
    target in other units (requests per pod) says nothing about a replica's capacity:
    ``None``. With several metrics the HPA follows the one asking for most replicas, so
    the lowest share is taken.
    """
    shares: list[float] = []
    skipped: list[str] = []
    for metric in metrics or []:
        kind = str((metric or {}).get("type", ""))
        body = (metric or {}).get(kind[:1].lower() + kind[1:]) or {}
        target = body.get("target") or {}
        if target.get("averageUtilization") is not None:
            percent = _quantity(target["averageUtilization"])
            if percent is not None and percent > 0:
                shares.append(percent / 100.0)
                continue
        value = target.get("averageValue", target.get("value"))
        share = _quantity(value) if value is not None else None
        if share is not None and 0 < share <= 1:
            shares.append(share)
        else:
            name = (body.get("metric") or {}).get("name") or body.get("name") or kind
            skipped.append(f"{name} target {value}")
    if shares:
        return min(shares), "the lowest target utilization of its metrics"
    if skipped:
        return None, f"its targets are not a share of a replica's capacity ({', '.join(skipped)})"
    return None, "it has no metrics"


def _quantity(value: Any) -> float | None:
    parse: Any = k8s_utils.parse_quantity
    try:
        number = float(parse(value))
    except (ValueError, TypeError, ArithmeticError):
        return None
    return number if math.isfinite(number) else None


class KubeApi(Protocol):
    """What the reconcile pipeline needs from Kubernetes (a fake implements it in tests)."""

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload: ...
    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None: ...
    async def get_hpa(self, namespace: str, name: str) -> Hpa: ...
    async def patch_hpa_min(self, namespace: str, name: str, min_replicas: int) -> None: ...
    async def annotate_hpa(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> None: ...
    async def list_hpas(self, namespace: str) -> list[Hpa]: ...
    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]: ...
    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...
    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...
    async def patch_status(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
    ) -> None: ...
    async def patch_custom_object(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
    ) -> None: ...
    async def patch_status_ops(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        resource_version: str,
        ops: list[dict[str, Any]],
    ) -> None: ...
    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None: ...
    async def get_custom_object(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any]: ...
    async def delete_pod(self, namespace: str, name: str) -> None: ...
    async def read_secret(self, namespace: str, name: str) -> SecretData: ...
    async def read_config_map(self, namespace: str, name: str) -> dict[str, str]: ...
    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation: ...
    async def delete(self, namespace: str, kind: str, name: str) -> None: ...
    async def ensure_priority_class(self, obj: dict[str, Any]) -> None: ...
    async def priority_value(self, name: str | None) -> int: ...
    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...


def load_api_client(kubeconfig: str | None = None, pool_size: int = 16) -> client.ApiClient:
    """An API client from a kubeconfig (``KUBECONFIG`` by default) or in-cluster config."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    # No retries inside urllib3: each caller retries a failed attempt itself (KubeClient with
    # backoff, a Lease at its next retry period), so a request's timeout bounds the attempt
    # instead of being multiplied by urllib3's three silent retries.
    configuration.retries = 0
    api = client.ApiClient(configuration)
    api.user_agent = USER_AGENT  # the field manager named in managedFields
    return api


class KubeClient:
    """:class:`KubeApi` over the ``kubernetes`` client, calls run in a thread pool.

    Every call is retried with exponential backoff and jitter (``backoffs`` seconds) when
    the API server answers 429 or 5xx or the connection fails, obeying ``Retry-After``
    (up to :data:`RETRY_AFTER_LIMIT`). Each attempt has ``timeout_seconds`` to connect
    and as long for each read of its answer: a connection that accepts and never answers
    fails the attempt (and is retried) instead of holding a thread for ever. Writes that
    set absolute values (scale, HPA floor, pod annotations, status) are also retried on
    409; a create that meets 409 on a retry finds what its first attempt made. What still
    fails raises :class:`KubeError`.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        threads: int = 16,
        backoffs: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0),
        timeout_seconds: float = 30.0,
    ) -> None:
        if not timeout_seconds > 0:
            raise ValueError("the API calls' timeout must be > 0 seconds")
        self._api = api_client
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self._backoffs = backoffs
        self._timeout = (timeout_seconds, timeout_seconds)
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.autoscaling = client.AutoscalingV2Api(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @property
    def api_client(self) -> client.ApiClient:
        return self._api

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    async def _call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        conflicts: bool = False,
        created: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run one API call in the pool; JSON in, parsed JSON out; errors typed.

        Retried as the class says; ``conflicts``: a 409 is retried too (absolute writes);
        ``created``: a 409 after a failed first attempt means that attempt created it.
        """

        def run() -> Any:
            response = fn(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
            data = response.data
            return json.loads(data) if data else None

        name = getattr(fn, "__name__", "call")
        loop = asyncio.get_running_loop()
        for attempt in range(len(self._backoffs) + 1):
            last = attempt == len(self._backoffs)
            try:
                return await loop.run_in_executor(self._pool, functools.partial(run))
            except ApiException as exc:
                message = f"{name}: {exc.status} {exc.reason}"
                with contextlib.suppress(TypeError, ValueError, AttributeError):
                    message += f": {json.loads(exc.body or '').get('message', '')}"
                if exc.status == 404:
                    raise NotFound(message, 404) from None
                if exc.status == 409 and created and attempt > 0:
                    return None
                retry = exc.status in TRANSIENT or (exc.status == 409 and conflicts)
                if last or not retry:
                    raise KubeError(message, exc.status) from None
                delay = _retry_after(exc) if exc.status == 429 else None
            except TransportError as exc:
                message = f"{name}: {type(exc).__name__}: {exc}"
                if last:
                    raise KubeError(message) from None
                delay = None
            if delay is None:
                base = self._backoffs[attempt]
                delay = base * random.uniform(0.75, 1.25)
            log.info("%s; retrying in %.1f s", message, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- targets
    def _reader(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if kind == "Deployment":
            return self.apps.read_namespaced_deployment, self.apps.patch_namespaced_deployment_scale
        if kind == "StatefulSet":
            return (
                self.apps.read_namespaced_stateful_set,
                self.apps.patch_namespaced_stateful_set_scale,
            )
        raise KubeError(f"cannot scale a {kind}")

    async def get_workload(self, namespace: str, kind: str, name: str) -> Workload:
        read, _ = self._reader(kind)
        obj = await self._call(read, name, namespace)
        spec, status = obj.get("spec", {}), obj.get("status", {})
        return Workload(
            kind=kind,
            name=name,
            replicas=int(spec.get("replicas", 1)),
            ready_replicas=int(status.get("readyReplicas") or 0),
            selector=label_selector(spec.get("selector") or {}),
            template=spec.get("template") or {},
            replicas_writer=field_writer(obj, ("spec", "replicas")),
            resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
        )

    async def patch_scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        _, patch = self._reader(kind)
        await self._call(
            patch,
            name,
            namespace,
            {"spec": {"replicas": replicas}},
            field_manager=FIELD_MANAGER,
            conflicts=True,
        )

    async def get_hpa(self, namespace: str, name: str) -> Hpa:
        obj = await self._call(
            self.autoscaling.read_namespaced_horizontal_pod_autoscaler, name, namespace
        )
        return hpa_from(obj)

    async def list_hpas(self, namespace: str) -> list[Hpa]:
        listing = await self._call(
            self.autoscaling.list_namespaced_horizontal_pod_autoscaler, namespace
        )
        return [hpa_from(obj) for obj in listing.get("items") or []]

    async def patch_hpa_min(self, namespace: str, name: str, min_replicas: int) -> None:
        await self._call(
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler,
            name,
            namespace,
            {"spec": {"minReplicas": min_replicas}},
            _content_type=MERGE_PATCH,
            field_manager=FIELD_MANAGER,
            conflicts=True,
        )

    async def annotate_hpa(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Set annotations on an HPA (a merge patch of its metadata only): the nudge that
        makes KEDA reconcile the ScaledObject owning it (controller/keda.py)."""
        await self._call(
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler,
            name,
            namespace,
            {"metadata": {"annotations": annotations}},
            _content_type=MERGE_PATCH,
            field_manager=FIELD_MANAGER,
        )

    async def list_pod_starts(self, namespace: str, selector: str) -> list[PodStart]:
        listing = await self._call(
            self.core.list_namespaced_pod, namespace, label_selector=selector
        )
        return [pod_start(p) for p in listing.get("items", [])]

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of one pod's metadata (deletion cost, hot standby promotion)."""
        await self._call(
            self.core.patch_namespaced_pod,
            name,
            namespace,
            patch,
            _content_type=MERGE_PATCH,
            conflicts=True,
        )

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A strategic merge patch of one pod's status (its ``prescaler.io/prewarmed``
        condition): conditions merge by type, so the kubelet's own are kept."""
        await self._call(
            self.core.patch_namespaced_pod_status,
            name,
            namespace,
            patch,
            _content_type=STRATEGIC_MERGE_PATCH,
            field_manager=FIELD_MANAGER,
            conflicts=True,
        )

    async def patch_status(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
    ) -> None:
        """A merge patch of a custom object's status subresource (absolute values, so a
        conflict is retried)."""
        await self._call(
            self.custom.patch_namespaced_custom_object_status,
            group,
            version,
            namespace,
            plural,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
            field_manager=FIELD_MANAGER,
            conflicts=True,
        )

    async def patch_custom_object(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
    ) -> None:
        """A merge patch of a custom object (e.g. its labels; absolute values, so a
        conflict is retried)."""
        await self._call(
            self.custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            patch,
            _content_type=MERGE_PATCH,
            field_manager=FIELD_MANAGER,
            conflicts=True,
        )

    async def patch_status_ops(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        resource_version: str,
        ops: list[dict[str, Any]],
    ) -> None:
        """A JSON patch (RFC 6902) of a custom object's status subresource, applied only
        to the object at ``resource_version``: otherwise the API server refuses it (422,
        :class:`KubeError`) and nothing is written."""
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
        await self._call(
            self.custom.patch_namespaced_custom_object_status,
            group,
            version,
            namespace,
            plural,
            name,
            [test, *ops],
            _content_type=JSON_PATCH,
            field_manager=FIELD_MANAGER,
        )

    async def custom_object_uid(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> str | None:
        """The uid of a custom object as the API server has it now (a quorum read), or
        ``None`` if there is none by that name."""
        try:
            obj = await self._call(
                self.custom.get_namespaced_custom_object, group, version, namespace, plural, name
            )
        except NotFound:
            return None
        return str((obj.get("metadata") or {}).get("uid") or "") or None

    async def get_custom_object(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any]:
        """A custom object as the API server has it (:class:`NotFound` if it does not
        exist): a pool read by the KEDA scaler, a ScaledObject read by a reconcile."""
        obj = await self._call(
            self.custom.get_namespaced_custom_object, group, version, namespace, plural, name
        )
        return dict(obj or {})

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete one pod gracefully (its own terminationGracePeriodSeconds and preStop)."""
        with contextlib.suppress(NotFound):
            await self._call(self.core.delete_namespaced_pod, name, namespace)

    async def read_secret(self, namespace: str, name: str) -> SecretData:
        """A Secret's type (``Opaque`` when unset) and its data, decoded."""
        obj = await self._call(self.core.read_namespaced_secret, name, namespace)
        data = obj.get("data") or {}
        decoded = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return SecretData(type=str(obj.get("type") or "Opaque"), data=decoded)

    async def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        """A ConfigMap's ``data`` (``spec.prewarm.configMapRef``; get by name only)."""
        obj = await self._call(self.core.read_namespaced_config_map, name, namespace)
        data = obj.get("data") or {}
        return {str(k): str(v) for k, v in data.items()}

    # ---------------------------------------------------------------- standby
    def _crud(self, kind: str) -> tuple[Callable[..., Any], ...]:
        if kind == "Deployment":
            a = self.apps
            return (
                a.read_namespaced_deployment,
                a.create_namespaced_deployment,
                a.replace_namespaced_deployment,
                a.delete_namespaced_deployment,
            )
        if kind == "DaemonSet":
            a = self.apps
            return (
                a.read_namespaced_daemon_set,
                a.create_namespaced_daemon_set,
                a.replace_namespaced_daemon_set,
                a.delete_namespaced_daemon_set,
            )
        if kind == "ConfigMap":
            c = self.core
            return (
                c.read_namespaced_config_map,
                c.create_namespaced_config_map,
                c.replace_namespaced_config_map,
                c.delete_namespaced_config_map,
            )
        raise KubeError(f"no standby objects of kind {kind}")

    async def ensure(self, obj: dict[str, Any]) -> StandbyObservation:
        """Create ``obj`` or replace it when its content hash changed; report its pods
        (a ConfigMap has none)."""
        meta = obj["metadata"]
        read, create, replace, _ = self._crud(obj["kind"])
        try:
            current = await self._call(read, meta["name"], meta["namespace"])
        except NotFound:
            await self._call(create, meta["namespace"], obj, created=True)
            return StandbyObservation(desired=_desired(obj, None), ready=0)
        current_hash = (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION)
        if current_hash != meta["annotations"][HASH_ANNOTATION]:
            body = {
                **obj,
                "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]},
            }
            await self._call(replace, meta["name"], meta["namespace"], body)
        status = current.get("status") or {}
        ready = (
            status.get("numberReady") if obj["kind"] == "DaemonSet" else status.get("readyReplicas")
        )
        return StandbyObservation(desired=_desired(obj, current), ready=int(ready or 0))

    async def delete(self, namespace: str, kind: str, name: str) -> None:
        *_, delete = self._crud(kind)
        with contextlib.suppress(NotFound):
            await self._call(delete, name, namespace, propagation_policy="Background")

    async def ensure_priority_class(self, obj: dict[str, Any]) -> None:
        try:
            await self._call(self.scheduling.read_priority_class, obj["metadata"]["name"])
        except NotFound:
            try:
                await self._call(self.scheduling.create_priority_class, obj, created=True)
            except KubeError as exc:
                if exc.status != 409:
                    raise

    async def priority_value(self, name: str | None) -> int:
        """The priority a pod of PriorityClass ``name`` gets: the class's value
        (:class:`NotFound` without the class); without a name, the global default
        class's value, else 0, as the API server's Priority admission gives it."""
        if name:
            obj = await self._call(self.scheduling.read_priority_class, name)
            return int((obj or {}).get("value") or 0)
        listed = await self._call(self.scheduling.list_priority_class)
        defaults = [
            int(c.get("value") or 0)
            for c in (listed or {}).get("items") or ()
            if c.get("globalDefault")
        ]
        return min(defaults, default=0)  # the admission's pick among several defaults

    # ---------------------------------------------------------------- events
    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Post an Event (retried like every call). One that still cannot be posted is
        logged and dropped: the status, written next, is the record, and a lost Event must
        not undo a reconcile whose scale already happened."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{ref.name}.{uuid.uuid4().hex[:16]}",
                "namespace": ref.namespace,
            },
            "involvedObject": {
                "apiVersion": ref.api_version,
                "kind": ref.kind,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "prescaler"},
            "reportingComponent": "prescaler.io/operator",
            "reportingInstance": "prescaler",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
            "action": reason,
            "count": 1,
        }
        try:
            await self._call(self.core.create_namespaced_event, ref.namespace, event, created=True)
        except KubeError as exc:
            log.warning("Event %s on %s/%s not posted: %s", reason, ref.namespace, ref.name, exc)


def _desired(obj: dict[str, Any], current: dict[str, Any] | None) -> int:
    if obj["kind"] == "ConfigMap":
        return 0
    if obj["kind"] == "DaemonSet":
        status = (current or {}).get("status") or {}
        return int(status.get("desiredNumberScheduled") or 0)
    return int(obj["spec"].get("replicas", 1))
