"""Typed operator settings, grouped by concern, read once at startup.

Every field has a default and an environment variable (``PRESCALER_<GROUP>_<FIELD>``);
``prescaler run`` flags override the environment. Nothing else reads the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """Which InferencePools the operator serves."""

    namespaces: tuple[str, ...] = ()
    """Namespaces (or glob patterns) to watch; empty means cluster-wide."""


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    """High availability: several replicas of the operator, exactly one acting.

    The replicas elect a leader on a ``coordination.k8s.io/v1`` Lease. Every replica
    watches the pools; only the leader reconciles (reads metrics, scales, writes status).
    If the leader dies, another takes the Lease once it has gone unrenewed for
    ``lease_duration_seconds``; a leader that stops cleanly releases it at once."""

    enabled: bool = False
    """Elect a leader (the Helm chart turns this on); off, the process acts alone."""
    lease_name: str = "prescaler"
    """Name of the Lease."""
    namespace: str | None = None
    """Namespace of the Lease (default: the pod's own namespace, else ``default``)."""
    identity: str | None = None
    """This replica's name in the Lease (default: host name plus a random suffix)."""
    lease_duration_seconds: float = 15.0
    """A Lease unrenewed this long may be taken by another replica."""
    renew_deadline_seconds: float = 10.0
    """The leader stops acting when it could not renew for this long (< lease duration)."""
    retry_period_seconds: float = 2.0
    """How often candidates try to acquire, and the leader renews."""
    shards: int = 0
    """0: one leader Lease, one acting replica. N >= 1: the pools are split into N shards
    by a hash of their demand series, one Lease each (``<lease_name>-shard-<i>``); every
    replica acts on the shards it holds, balanced by their pools as far as whole shards
    allow, and replicas count themselves on member Leases (``<lease_name>-member-<i>``;
    more replicas than shards stand by). See :mod:`prescaler.sharding`."""


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """The operator's own Prometheus ``/metrics`` endpoint."""

    port: int = 8080
    """Port of ``/metrics``; 0 disables the endpoint."""
    host: str = "0.0.0.0"
    """Address to bind."""


@dataclass(frozen=True, slots=True)
class ReconcileSettings:
    """The per-pool loop."""

    interval_seconds: float = 15.0
    """Timer period of each pool's reconcile: a plan's decision period. 15 s is the HPA
    controller's own sync period; deciding every 30 s instead left more demand waiting
    at more GPU-hours on five of the six first halves the defaults are chosen on (see
    benchmarks/README.md). Thousands of pools may set more (each reconcile costs API and
    Prometheus calls)."""
    kube_threads: int = 16
    """Threads for Kubernetes and Prometheus calls (both are blocking clients)."""
    kube_timeout_seconds: float = 30.0
    """Timeout of each attempt of a Kubernetes API call: to connect, and for each read of
    its answer. An attempt past it is retried with backoff like a dropped connection, so a
    connection that never answers holds a thread this long, not for ever. Half the API
    server's own 60 s request timeout: an answer that slow has failed already. (The
    Leases' calls have theirs from ``leader.renew_deadline_seconds``.)"""
    forecast_workers: int = 2
    """Processes for forecast fits and model selection (0: fit in a thread instead)."""
    forecast_wait_seconds: float = 2.0
    """How long a reconcile waits for its forecast's history refresh before using the
    previous forecast. It never waits for a model selection or an expensive fit: those go
    to the fit queue."""
    forecast_model_timeout_seconds: float = 10.0
    """How long a history refresh waits for the forecast it makes without an expensive step
    (cheap models, or a cached fit with its nowcast; run in a thread) before the last level
    stands in (condition ForecastHealthy reason ForecastTimeout). A model that hangs is not
    called again for its series until it returns."""
    forecast_fit_timeout_seconds: float = 300.0
    """How long one job of the fit queue (a model selection, or an expensive fit such as
    Prophet's) may run. Past it the job is abandoned: its pools keep their last good
    forecast (condition ForecastHealthy reason ForecastTimeout), its fit process is killed
    and replaced so the jobs queued behind it run on, and it is retried later. A fit in a
    thread (``forecast_workers`` 0) cannot be killed: its series is not fitted again until
    it returns."""
    calibration_timeout_seconds: float = 600.0
    """How long the replay of a new pool's history (which seeds its risk model, condition
    RiskCalibrated) may run in its fit process before it is abandoned, its process
    killed, and the pool calibrates on its own lookaheads (retried after as long)."""
    policy_check_seconds: float = 86_400.0
    """How often a ``spec.policy: auto`` pool replays its history again to re-check its
    policy. Each check replays the last day (at most half the history), so checked daily
    every day is weighed once, a whole cycle at a time; a switch needs two checks in a
    row. A shorter period re-weighs overlapping days, at a replay's CPU each time."""
    fit_queue_limit: int = 4096
    """Selection and fit jobs the fit queue holds at most (one per shared demand series)."""
    first_fit_spread_seconds: float = 60.0
    """After a start, each series' first job is due within this long, so a restart does
    not start every fit at once."""
    forecast_stale_seconds: float = 300.0
    """A due fit or history refresh overdue by more than this marks the forecast stale
    (condition ForecastHealthy reason Stale, metric ``prescaler_forecast_stale``)."""
    fit_worker_nice: int = 10
    """Niceness of the fit processes, so fits yield the CPU to reconciles (0: unchanged)."""
    fit_memory_mib: int = 1024
    """Address space each fit process (and the Stan optimizer it starts) may use, MiB
    (``RLIMIT_AS``; 0: unbounded). A fit or replay that needs more fails alone, with
    ``MemoryError``, instead of taking the operator's container: its pools keep their last
    good forecast (condition ForecastHealthy reason FitFailed) and it is retried. A Prophet
    fit on 90 days of minutes, and a replay of 14 days of history, address about 250 MiB;
    keep ``forecast_workers`` times this under the container's memory limit less the
    operator's own (about 0.5 GiB)."""
    prometheus_timeout_seconds: float = 10.0
    """Deadline of one Prometheus read (a pool's instant queries together, or one range
    query of its history): the whole answer, however slowly its bytes come, not each
    socket read. Past it the read is ``MetricsUnavailable`` and its connection is shut."""
    prometheus_max_response_bytes: int = 16 * 1024 * 1024
    """The largest Prometheus answer read: a longer one is ``MetricsUnavailable``, read no
    further. A range query's 10,000 points are about 250 KB per series, so 16 MiB holds
    some 60 series of it, or an instant query over some 100,000 pods."""
    placeholder_priority_classes: tuple[str, ...] = ("prescaler-placeholder",)
    """The PriorityClasses a pool's standby placeholders may have
    (``spec.standby.placeholders.priorityClassName``); a pool naming another gets no
    placeholders (condition StandbyAllowed). Empty: no pool gets placeholders. A class is
    refused also when its value is not below the priority of the target's own pods."""
    rate_window: str = "2m"
    """Range of ``rate()`` in the engine profiles' queries."""
    kubeconfig: str | None = None
    """Kubeconfig for the pipeline's client (default: in-cluster, then ``KUBECONFIG``)."""


@dataclass(frozen=True, slots=True)
class PrewarmSettings:
    """Warm-up of new pods (``spec.prewarm``, ``docs/prewarm.md``)."""

    enabled: bool = True
    """Watch the pods and warm them. Off: no pod watch, ``spec.prewarm`` is ignored, and a
    pod whose template lists the readiness gate ``prescaler.io/prewarmed`` is never Ready."""
    concurrency: int = 16
    """Pods warmed at once at most; the others wait their turn (their timeout starts when
    their warm-up does)."""
    unclaimed_seconds: float = 120.0
    """A pod with the readiness gate ``prescaler.io/prewarmed`` that no pool with
    ``spec.prewarm`` claims this long after its containers are ready (and this replica
    leads) is released without warm-up, so a gate left in a template never keeps a pod
    out of service. It covers a start: each pool claims its pods at its first reconcile."""
    config_map_seconds: float = 60.0
    """How long prompts read from a ConfigMap are reused before it is read again."""


@dataclass(frozen=True, slots=True)
class ScalerSettings:
    """The KEDA external scaler (``externalscaler.ExternalScaler`` over gRPC): every replica
    answers a ScaledObject's ``external`` trigger with a pool's last plan (README, "With
    KEDA")."""

    port: int = 0
    """Port of the gRPC service; 0 (the default) serves none. The Helm chart sets 9090
    when ``scaler.enabled``."""
    host: str = "0.0.0.0"
    """Address the service listens on."""
    tls_cert: str | None = None
    """PEM certificate the service presents (with ``tls_key``); plaintext when unset."""
    tls_key: str | None = None
    """PEM private key of ``tls_cert``."""
    tls_ca: str | None = None
    """PEM CA bundle that signs the clients' certificates: mutual TLS, as KEDA's trigger
    or TriggerAuthentication gives with ``tlsClientCert`` and ``tlsClientKey``; a client
    without a certificate it signs is refused. Needs ``tls_cert``."""
    cache_seconds: float = 2.0
    """How long a pool read from the API server answers later calls for it."""
    stale_periods: float = 8.0
    """A plan older than this many reconcile periods is stale: the call fails, and KEDA
    applies the ScaledObject's ``fallback``. A steady pool's status is written every few
    periods (its checkpoints), so this stays well above that."""
    stream_seconds: float = 5.0
    """How often an ``external-push`` stream checks whether the plan reached or left zero."""
    max_concurrent_rpcs: int = 512
    """Calls served at once, push streams included; gRPC refuses more with
    ``RESOURCE_EXHAUSTED`` (KEDA retries, then applies ``fallback``). KEDA makes about two
    calls per ScaledObject and polling interval, each answered in milliseconds."""
    max_streams: int = 256
    """``StreamIsActive`` streams open at once (fewer than ``max_concurrent_rpcs``, so
    streams never take every call's slot); another is refused with
    ``RESOURCE_EXHAUSTED``. KEDA keeps one per ScaledObject with an ``external-push``
    trigger, and still polls ``IsActive`` when its stream is refused."""
    stream_max_seconds: float = 600.0
    """A stream's lifetime (less up to a tenth at random): it then ends with ``OK`` and
    KEDA opens it again about 2 s later, so no stream holds its slot for ever."""
    max_message_bytes: int = 64 * 1024
    """The largest request read (``grpc.max_receive_message_length``; gRPC's default is
    4 MiB). A trigger's metadata is a few names, or with TLS settings in it a few PEM
    blocks: well under 64 KiB."""
    not_found_seconds: float = 10.0
    """How long a pool found missing is answered ``NOT_FOUND`` without another read."""
    unknown_reads: int = 2
    """API reads at once of pools this replica has not found before (the known pools'
    reads have threads of their own), so names that do not exist cannot take the reads
    of the pools that do."""
    unknown_queue: int = 64
    """Lookups of pools not found before that wait for one of those reads; more are
    refused at once with ``RESOURCE_EXHAUSTED`` and read nothing."""
    remembered_pools: int = 10_000
    """Pools kept as known, and names kept as missing, each (the least recently read
    forgotten first): bounds the memory a flood of names can take."""


@dataclass(frozen=True, slots=True)
class KedaSettings:
    """What the operator does about a pool whose plan KEDA leaves out (mode
    ``kedaTrigger``, README "With KEDA"). KEDA builds its HPA from the metric specs its
    scalers give when it reconciles a ScaledObject; a trigger whose scaler it could not
    reach then (prescaler starting or rolling out) is left out of the HPA, and KEDA reconciles
    again only when the ScaledObject's spec (its generation), one of its own annotations,
    or its HPA changes: not by itself."""

    missing_periods: float = 2.0
    """A pool whose trigger KEDA's HPA has lacked for more than this many reconcile periods
    gets condition ``KedaTrigger`` False, a Warning Event and
    ``prescaler_keda_trigger_missing`` 1. Shorter, and a ScaledObject KEDA is still
    rebuilding (a second or two after its spec changed) would be reported."""
    nudge: bool = False
    """Off (the default), the operator only tells. On, it nudges KEDA to rebuild its HPA:
    it writes the annotation ``prescaler.io/keda-reconcile`` (the time) on KEDA's HPA of the
    ScaledObject, whose change KEDA's controller watches (it owns the HPA), so KEDA
    reconciles the ScaledObject and asks every trigger's scaler for its metric spec again.
    The ScaledObject itself is never written (no generation change, nothing for GitOps to
    revert). Needs ``patch`` on HPAs, which the chart grants already (mode ``hpaFloor``)."""
    nudge_seconds: float = 60.0
    """At most one nudge per pool this often while its trigger stays missing (KEDA may not
    reach the scaler yet; each nudge costs KEDA one reconcile of the ScaledObject)."""


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """All settings of ``prescaler run``."""

    watch: WatchSettings = field(default_factory=WatchSettings)
    leader: LeaderSettings = field(default_factory=LeaderSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    prewarm: PrewarmSettings = field(default_factory=PrewarmSettings)
    scaler: ScalerSettings = field(default_factory=ScalerSettings)
    keda: KedaSettings = field(default_factory=KedaSettings)
    liveness_endpoint: str | None = None
    """kopf's liveness probe URL, e.g. ``http://0.0.0.0:8081/healthz``."""

    def __post_init__(self) -> None:
        if self.reconcile.interval_seconds <= 0:
            raise ValueError("reconcile interval must be > 0 seconds")
        if self.reconcile.kube_threads < 1:
            raise ValueError("kube threads must be >= 1")
        if not self.reconcile.kube_timeout_seconds > 0:
            raise ValueError("kube timeout must be > 0 seconds")
        if self.reconcile.forecast_workers < 0:
            raise ValueError("forecast workers must be >= 0")
        for label, timeout in (
            ("forecast model timeout", self.reconcile.forecast_model_timeout_seconds),
            ("forecast fit timeout", self.reconcile.forecast_fit_timeout_seconds),
            ("calibration timeout", self.reconcile.calibration_timeout_seconds),
        ):
            if not timeout > 0:
                raise ValueError(f"{label} must be > 0 seconds")
        if not self.reconcile.prometheus_timeout_seconds > 0:
            raise ValueError("prometheus timeout must be > 0 seconds")
        if self.reconcile.prometheus_max_response_bytes < 1024:
            raise ValueError("prometheus max response bytes must be >= 1024")
        if not self.reconcile.policy_check_seconds >= 60:
            raise ValueError("policy check period must be >= 60 seconds")
        if self.reconcile.fit_queue_limit < 1:
            raise ValueError("fit queue limit must be >= 1")
        if self.reconcile.fit_memory_mib < 0:
            raise ValueError("reconcile.fit_memory_mib must be >= 0 (0: unbounded)")
        if not 0 <= self.reconcile.fit_worker_nice <= 19:
            raise ValueError("fit worker nice must be in 0..19")
        leader = self.leader
        if leader.enabled and not leader.lease_name:
            raise ValueError("leader lease name must not be empty")
        if leader.retry_period_seconds <= 0:
            raise ValueError("leader retry period must be > 0 seconds")
        if leader.renew_deadline_seconds <= 1.2 * leader.retry_period_seconds:
            raise ValueError("leader renew deadline must exceed 1.2 x the retry period")
        if leader.lease_duration_seconds <= leader.renew_deadline_seconds:
            raise ValueError("leader lease duration must exceed the renew deadline")
        if not 0 <= leader.shards <= 1024:
            raise ValueError("shards must be in 0..1024")
        if leader.shards and not leader.enabled:
            raise ValueError("shards need leader election (their Leases decide who acts)")
        if self.prewarm.concurrency < 1:
            raise ValueError("prewarm concurrency must be >= 1")
        if self.prewarm.unclaimed_seconds < 0 or self.prewarm.config_map_seconds < 0:
            raise ValueError("prewarm durations must be >= 0 seconds")
        if not 0 <= self.metrics.port <= 65535:
            raise ValueError("metrics port must be in 0..65535")
        scaler = self.scaler
        if not 0 <= scaler.port <= 65535:
            raise ValueError("scaler port must be in 0..65535")
        if (scaler.tls_cert is None) != (scaler.tls_key is None):
            raise ValueError("scaler TLS needs both a certificate and its key")
        if scaler.tls_ca is not None and scaler.tls_cert is None:
            raise ValueError("scaler mutual TLS (a client CA) needs a certificate and key")
        if scaler.cache_seconds < 0 or scaler.stream_seconds <= 0 or scaler.stale_periods <= 0:
            raise ValueError("scaler cache must be >= 0, its stream and stale periods > 0")
        for label, count in (
            ("max streams", scaler.max_streams),
            ("max message bytes", scaler.max_message_bytes),
            ("unknown reads", scaler.unknown_reads),
            ("unknown queue", scaler.unknown_queue),
            ("remembered pools", scaler.remembered_pools),
        ):
            if count < 1:
                raise ValueError(f"scaler {label} must be >= 1")
        if scaler.max_concurrent_rpcs <= scaler.max_streams:
            raise ValueError("scaler max concurrent RPCs must exceed its max streams")
        if scaler.stream_max_seconds <= 0 or scaler.not_found_seconds < 0:
            raise ValueError("scaler stream lifetime must be > 0, its not-found period >= 0")
        if not self.keda.missing_periods > 0 or not self.keda.nudge_seconds > 0:
            raise ValueError("keda missing periods and nudge seconds must be > 0")

    @property
    def clusterwide(self) -> bool:
        return not self.watch.namespaces


def _convert(kind: Any, text: str) -> Any:
    name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    if name == "bool":
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(text)
    if "tuple" in name:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if name.startswith("int"):
        return int(text)
    if name.startswith("float"):
        return float(text)
    if name.startswith("str | None"):
        return text or None
    return text


def from_env(environ: Mapping[str, str] | None = None) -> OperatorSettings:
    """Settings from ``PRESCALER_<GROUP>_<FIELD>`` variables, defaults elsewhere."""
    env = os.environ if environ is None else environ
    base = OperatorSettings()
    groups: dict[str, Any] = {}
    for group_field in fields(base):
        group = getattr(base, group_field.name)
        if not hasattr(group, "__dataclass_fields__"):
            key = f"PRESCALER_{group_field.name.upper()}"
            if key in env:
                groups[group_field.name] = env[key] or None
            continue
        changes = {}
        for f in fields(group):
            key = f"PRESCALER_{group_field.name.upper()}_{f.name.upper()}"
            if key in env:
                try:
                    changes[f.name] = _convert(f.type, env[key])
                except ValueError:
                    raise ValueError(f"{key}: cannot read {env[key]!r} as {f.type}") from None
        groups[group_field.name] = replace(group, **changes)
    return OperatorSettings(**groups)
