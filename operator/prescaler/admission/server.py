"""The HTTP server of ``prescaler admit``: a gateway's check, answered from memory.

The degradation ConfigMaps (label ``prescaler.io/role=degradation``) of the namespaces
served are list-and-watched (:class:`ConfigMapStream`: a watch that expires resumes, one
that is ``410 Gone`` lists again, one that breaks retries with a backoff) into
:class:`Policies`; a check reads them there and never waits on the API server.

Endpoints (one port): ``/check`` and ``/check/<original path>`` (any method: Envoy's
``ext_authz`` sends the original method and appends the original path) answer checks;
``/healthz`` answers while the process runs, ``/readyz`` once every namespace has been
listed. Metrics (``prescaler_admission_checks_total`` by pool, lane and outcome, and
``prescaler_admission_check_seconds``) are served on a port of their own.

Every answer carries ``x-prescaler-outcome`` and ``x-prescaler-reason`` (one line), which
a gateway may copy into its own refusal (NGINX turns the check's 503 and 413 into its
own, see ``docs/degradation.md``). A fail-open answer is logged once per pool and reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from prescaler.admission._decide import (
    OUTCOMES,
    Answer,
    Policy,
    PolicyError,
    Routes,
    decide,
    read_check,
    read_policy,
    shown,
)
from prescaler.kube import (
    POOL_LABEL,
    ROLE_DEGRADATION,
    ROLE_LABEL,
    Event,
    Listed,
    ObjectStream,
    load_api_client,
)

log = logging.getLogger("prescaler.admission")

SELECTOR = f"{ROLE_LABEL}={ROLE_DEGRADATION}"
"""The degradation ConfigMaps' label selector."""
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25)
LOGGED_ONCE_LIMIT = 10_000
"""The most distinct fail-open reasons remembered (each is logged once)."""
MAX_LANES = 16
"""The most lane names a process counts by name (pools declare a few)."""
_LANE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
NO_POOL = "-"
"""The ``pool`` label of a check that named no pool (and of one for a pool unknown here,
so client text never mints label values)."""


class ConfigMapStream(ObjectStream):
    """:class:`~prescaler.kube.ObjectStream`'s list-and-watch, of ConfigMaps (core/v1)."""

    def _get(self, read_timeout: float, **query: Any) -> Any:
        api = client.CoreV1Api(self.api_client)
        args: dict[str, Any] = {
            "label_selector": self.selector,
            "_preload_content": False,
            "_request_timeout": (10.0, read_timeout),
            **query,
        }
        if self.namespace is None:
            return api.list_config_map_for_all_namespaces(**args)
        return api.list_namespaced_config_map(self.namespace, **args)


def _key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``(namespace, pool)`` a degradation ConfigMap is for (its pool label, else its
    ``pool`` key)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    pool = (meta.get("labels") or {}).get(POOL_LABEL) or (obj.get("data") or {}).get("pool")
    if not namespace or not pool:
        return None
    return str(namespace), str(pool)


@dataclass
class Policies:
    """Every pool's policy (or why it cannot be read), by ``namespace/pool``, as the
    streams deliver them."""

    namespaces: tuple[str, ...] | None
    """The namespaces served; ``None``: every namespace."""
    by_pool: dict[str, Policy | PolicyError] = field(default_factory=dict)
    _by_name: dict[str, list[str]] = field(default_factory=dict)
    _listed: set[str | None] = field(default_factory=set)
    _sources: dict[str, tuple[str, str]] = field(default_factory=dict)
    """ConfigMap ``namespace/name`` -> the pool key it gave (a relabelled one moves)."""

    @property
    def ready(self) -> bool:
        wanted: Iterable[str | None] = self.namespaces if self.namespaces else (None,)
        return all(ns in self._listed for ns in wanted)

    def deliver(self, namespace: str | None, item: Listed | Event) -> None:
        if isinstance(item, Listed):
            self._listed.add(namespace)
            gone = {
                src for src in self._sources if namespace is None or src.startswith(f"{namespace}/")
            }
            for obj in item.items:
                gone.discard(self._put(obj))
            for src in gone:
                self._drop(src)
        elif item.type == "DELETED":
            self._drop(_source(item.object))
        else:
            self._put(item.object)
        self._reindex()

    def _put(self, obj: Mapping[str, Any]) -> str:
        src = _source(obj)
        self._drop(src)
        key = _key(obj)
        if key is not None:
            try:
                policy: Policy | PolicyError = read_policy(obj.get("data"))
            except PolicyError as exc:
                policy = exc
            self._sources[src] = key
            self.by_pool["/".join(key)] = policy
        return src

    def _drop(self, src: str) -> None:
        key = self._sources.pop(src, None)
        if key is not None:
            self.by_pool.pop("/".join(key), None)

    def _reindex(self) -> None:
        names: dict[str, list[str]] = {}
        for full in self.by_pool:
            names.setdefault(full.split("/", 1)[1], []).append(full)
        self._by_name = names

    def find(self, pool: str) -> tuple[str | None, Policy | PolicyError | None]:
        """The full name and policy of ``pool`` (``namespace/pool``, or a bare name known
        in one namespace only, or in the one namespace served)."""
        if "/" in pool:
            return (pool, self.by_pool.get(pool)) if pool in self.by_pool else (None, None)
        if self.namespaces is not None and len(self.namespaces) == 1:
            full = f"{self.namespaces[0]}/{pool}"
            return (full, self.by_pool.get(full)) if full in self.by_pool else (None, None)
        named = self._by_name.get(pool, [])
        if len(named) == 1:
            return named[0], self.by_pool[named[0]]
        return None, None


def _source(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


@dataclass
class AdmissionMetrics:
    """``prescaler admit``'s metrics, on their own registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.checks = Counter(
            "prescaler_admission_checks_total",
            "Gateway checks answered, by pool (namespace/pool, '-' when none is known), "
            "lane and outcome (admitted, routed, shed, too_long, or open_*: let through "
            "for a reason that is not the policy's)",
            ("pool", "lane", "outcome"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "prescaler_admission_check_seconds",
            "Time to answer a check, from the request read to the answer written",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )


@dataclass
class Admission:
    """The check handler over :class:`Policies`."""

    policies: Policies
    routes: Routes
    metrics: AdmissionMetrics
    _logged: set[tuple[str, str]] = field(default_factory=set)
    _lanes: set[str] = field(default_factory=set)

    def answer(self, headers: Mapping[str, str], path_tail: str | None = None) -> Answer:
        check = read_check(headers, self.routes)
        if check.pool is None and path_tail:
            check = read_check({**headers, "x-original-uri": "/" + path_tail}, self.routes)
        full, policy = (None, None)
        if check.pool is not None:
            full, policy = self.policies.find(check.pool)
        answer = decide(policy, check)
        lane = self._lane_label(check.lane) if full is not None else "-"
        self.metrics.checks.labels(full or NO_POOL, lane, answer.outcome).inc()
        if answer.fail_open:
            self._log_once(full or shown(check.pool or NO_POOL), answer)
        return answer

    def _lane_label(self, lane: str | None) -> str:
        """The ``lane`` label: ``-`` for none, the lane while at most :data:`MAX_LANES`
        plain names have been seen, else ``other`` (client text never mints unbounded
        label values)."""
        if lane is None:
            return "-"
        if lane in self._lanes:
            return lane
        if len(self._lanes) < MAX_LANES and _LANE.match(lane):
            self._lanes.add(lane)
            return lane
        return "other"

    def _log_once(self, pool: str, answer: Answer) -> None:
        key = (pool, answer.reason)
        if key in self._logged or len(self._logged) >= LOGGED_ONCE_LIMIT:
            return
        self._logged.add(key)
        log.warning("pool %s: %s (logged once; counted as %s)", pool, answer.reason, answer.outcome)

    async def handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        answer = self.answer(request.headers, request.match_info.get("tail"))
        headers = {
            "x-prescaler-outcome": answer.outcome,
            "x-prescaler-reason": answer.reason,
            **dict(answer.headers),
        }
        body = "" if answer.status == 200 else answer.reason + "\n"
        response = web.Response(status=answer.status, text=body, headers=headers)
        self.metrics.latency.observe(time.perf_counter() - started)
        return response

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        if self.policies.ready:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="the degradation ConfigMaps are not listed yet\n")


def application(admission: Admission) -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/check", admission.handle)
    app.router.add_route("*", "/check/{tail:.*}", admission.handle)
    app.router.add_get("/healthz", admission.healthz)
    app.router.add_get("/readyz", admission.readyz)
    return app


@dataclass(frozen=True, slots=True)
class AdmitSettings:
    """``prescaler admit``'s settings (its command line)."""

    namespaces: tuple[str, ...] | None = None
    """The namespaces whose degradation ConfigMaps are read; ``None``: every namespace."""
    host: str = "0.0.0.0"
    port: int = 8081
    """Port of the checks (and of ``/healthz`` and ``/readyz``)."""
    metrics_port: int = 8080
    """Port of ``/metrics``; 0 serves none."""
    routes: tuple[str, ...] = ()
    """``HOST=NAMESPACE/POOL`` or ``/PREFIX=NAMESPACE/POOL``: the pool of a check that
    names none."""
    kubeconfig: str | None = None
    """A kubeconfig file, used outside a cluster (in one: the pod's ServiceAccount);
    unset: ``KUBECONFIG`` or ``~/.kube/config``."""


async def serve(
    settings: AdmitSettings,
    stop: asyncio.Event,
    *,
    metrics: AdmissionMetrics | None = None,
    bound: asyncio.Future[int] | None = None,
) -> None:
    """Serve checks until ``stop`` is set; ``bound`` gets the check port (useful with
    port 0)."""
    routes = Routes.parse(settings.routes)
    metrics = metrics or AdmissionMetrics()
    policies = Policies(settings.namespaces)
    admission = Admission(policies, routes, metrics)
    for outcome in OUTCOMES:  # every outcome shows, at zero, from the start
        metrics.checks.labels(NO_POOL, "-", outcome)
    exporter = None
    if settings.metrics_port:
        exporter = start_http_server(settings.metrics_port, registry=metrics.registry)
    api = load_api_client(settings.kubeconfig, pool_size=4)
    streams = [
        ConfigMapStream(
            api,
            "",
            "v1",
            "configmaps",
            ns,
            SELECTOR,
            lambda item, ns=ns: policies.deliver(ns, item),  # type: ignore[misc]
        )
        for ns in (settings.namespaces or (None,))
    ]
    runner = web.AppRunner(application(admission), access_log=None)
    await runner.setup()
    try:
        for stream in streams:
            stream.start()
        site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
        await site.start()
        port = settings.port
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            port = int(sockets[0].getsockname()[1])
        log.info(
            "prescaler admit: checks on %s:%d/check, namespaces %s",
            settings.host,
            port,
            ", ".join(settings.namespaces) if settings.namespaces else "all",
        )
        if bound is not None:
            bound.set_result(port)
        await stop.wait()
    finally:
        for stream in streams:
            stream.stop()
        await runner.cleanup()
        for stream in streams:
            await stream.wait_stopped()
        api.close()  # type: ignore[no-untyped-call]
        if exporter is not None:
            exporter[0].shutdown()
            exporter[0].server_close()
