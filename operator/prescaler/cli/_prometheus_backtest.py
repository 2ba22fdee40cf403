"""``prescaler backtest --prometheus``: replay a pool's own demand history.

The pool comes from the cluster (``--pool NAMESPACE/NAME``) or from a file
(``--pool-file``, which may also hold the pool's HorizontalPodAutoscaler). Its history is
read as the operator reads it (:func:`prescaler.sources.read_demand_history`: the engine
profile, selector and custom queries of ``spec.forecast``, the operator's rate window),
with the credentials the operator would use (the ``authSecretRef`` Secret, read from the
cluster) unless ``--token``, ``--token-file`` or ``--basic-auth`` give others. The replay
then runs the library (:func:`prescaler.backtest.backtest`) on the pool's spec, its
measured cold start (``status.coldStart``) and the target utilization of its HPA.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prescaler.cli._backtest_spec import (
    Prepared,
    _parse_span,
    _with_standby,
    parsed_spec,
    with_policy_flags,
)
from prescaler.cli._common import CliError, non_negative_float, positive_float

DEFAULT_DAYS = 7.0
STEP_SECONDS = 60.0
"""The replay's resolution: one minute, as a trace replay's."""

TRACE_ONLY = (
    "trace_format",
    "token_mix",
    "prompt_tokens",
    "output_tokens",
    "scale_to_peak_replicas",
    "trace_step_seconds",
    "max_minutes",
    "replay_days",
    "model",
    "gpu_memory_gib",
    "context_tokens",
)
"""Flags of a trace replay that a pool's spec and history answer in a Prometheus replay."""


def add_prometheus_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Prometheus history (--prometheus)",
        "Replay a pool's own demand history: its spec is the predictive policy's (each "
        "policy flag overrides its field), its bounds and throughput size the fleet, its "
        "measured cold start (status.coldStart) is the fleet's, and the reactive baseline "
        "runs at the target utilization of the pool's HPA (one whose scaleTargetRef is "
        "the pool's target, or the pool's target itself in mode hpaFloor) when one is found.",
    )
    pool = group.add_mutually_exclusive_group()
    pool.add_argument(
        "--pool", metavar="NAMESPACE/NAME", help="read the InferencePool from the cluster"
    )
    pool.add_argument(
        "--pool-file",
        type=Path,
        metavar="FILE",
        help="an InferencePool manifest (YAML; may also hold its HorizontalPodAutoscaler)",
    )
    group.add_argument(
        "--days",
        type=positive_float,
        default=None,
        help=f"days of history to replay (default {DEFAULT_DAYS:g}); the forecaster is warmed "
        "up on spec.forecast.lookbackSeconds (or --history-days) before them",
    )
    group.add_argument(
        "--end",
        metavar="ISO",
        help="end of the replayed span (default: now; naive times are UTC)",
    )
    group.add_argument("--token", help="bearer token for Prometheus")
    group.add_argument("--token-file", type=Path, metavar="FILE", help="bearer token, from a file")
    group.add_argument("--basic-auth", metavar="USER:PASSWORD", help="basic auth for Prometheus")
    group.add_argument(
        "--insecure-skip-verify",
        action="store_true",
        help="skip TLS verification (also when the pool's spec says so)",
    )
    group.add_argument(
        "--prometheus-timeout-seconds",
        type=non_negative_float,
        default=60.0,
        help="how long one Prometheus request may take (default 60)",
    )
    group.add_argument("--kubeconfig", metavar="FILE", help="for --pool (default: KUBECONFIG)")


@dataclass(frozen=True)
class History:
    """A pool's history turned into the replay's inputs."""

    prepared: Prepared
    spec: Any
    source: dict[str, str]
    """The JSON's ``trace`` (the Prometheus URL) and ``format`` (``prometheus``)."""
    json: dict[str, Any]
    """What the JSON records of the pool, its history, cold start and HPA."""
    forecast_step: float
    title: str


# --------------------------------------------------------------------------- the pool


@dataclass
class _Pool:
    name: str
    """``namespace/name`` or the file."""
    obj: dict[str, Any]
    hpas: list[dict[str, Any]]
    secrets: Any = None
    """Reads a Secret of the pool's namespace, its data and type (``None``: no cluster)."""
    notes: list[str] | None = None


def _pool_from_file(path: Path) -> _Pool:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"--pool-file: {exc}") from None
    pools = [d for d in docs if d.get("kind") == "InferencePool"]
    if len(pools) != 1:
        raise CliError(f"--pool-file: expected one InferencePool in {path}, found {len(pools)}")
    hpas = [d for d in docs if d.get("kind") == "HorizontalPodAutoscaler"]
    return _Pool(str(path), pools[0], hpas)


class _Cluster:
    """The few reads of the cluster a backtest makes, through the Kubernetes client."""

    def __init__(self, kubeconfig: str | None) -> None:
        from kubernetes import client, config

        from prescaler.kube import load_api_client

        try:
            self.api: Any = load_api_client(kubeconfig)
        except (config.ConfigException, OSError) as exc:
            raise CliError(f"--pool: no cluster to read it from: {exc}") from None
        self.client = client

    def close(self) -> None:
        self.api.close()

    def _call(self, what: str, call: Any, *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return self.api.sanitize_for_serialization(call(*args, _request_timeout=30))
        except ApiException as exc:
            reason = {404: "not found", 403: "forbidden"}.get(exc.status, exc.reason)
            raise CliError(f"--pool: {what}: {reason} (HTTP {exc.status})") from None
        except HTTPError as exc:
            raise CliError(f"--pool: {what}: {exc}") from None

    def pool(self, namespace: str, name: str) -> dict[str, Any]:
        from prescaler.api import GROUP, PLURAL, VERSION

        api = self.client.CustomObjectsApi(self.api)
        obj: dict[str, Any] = self._call(
            f"InferencePool {namespace}/{name}",
            api.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
        )
        return obj

    def hpas(self, namespace: str) -> list[dict[str, Any]]:
        api = self.client.AutoscalingV2Api(self.api)
        found = self._call(
            f"HorizontalPodAutoscalers in {namespace}",
            api.list_namespaced_horizontal_pod_autoscaler,
            namespace,
        )
        return list(found.get("items") or [])

    def secret(self, namespace: str, name: str) -> tuple[dict[str, str], str]:
        """A Secret's decoded data and its type."""
        import base64

        api = self.client.CoreV1Api(self.api)
        obj = self._call(f"Secret {namespace}/{name}", api.read_namespaced_secret, name, namespace)
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return data, str(obj.get("type") or "Opaque")


def _pool_from_cluster(ref: str, cluster: _Cluster) -> _Pool:
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "/" in name:
        raise CliError(f"--pool: expected NAMESPACE/NAME, got {ref!r}")
    obj = cluster.pool(namespace, name)
    notes: list[str] = []
    try:
        hpas = cluster.hpas(namespace)
    except CliError as exc:
        hpas = []
        notes.append(f"no HPA read ({exc}); the reactive baseline runs at --hpa-target")
    return _Pool(
        ref, obj, hpas, secrets=lambda secret: cluster.secret(namespace, secret), notes=notes
    )


# --------------------------------------------------------------------------- the HPA


def hpa_of(spec: Any, hpas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The HPA that scales the pool's target, or the pool's target itself when it is an
    HPA (mode ``hpaFloor``)."""
    target = spec.target
    for hpa in hpas:
        name = (hpa.get("metadata") or {}).get("name")
        if target.kind == "HorizontalPodAutoscaler":
            if name == target.name:
                return hpa
            continue
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind") == target.kind and ref.get("name") == target.name:
            return hpa
    return None


def hpa_utilization(hpa: dict[str, Any]) -> tuple[float | None, str]:
    """The HPA's target as a share of a replica's capacity, and how it was read (the
    operator's own reader, :func:`prescaler.kube.hpa_target_share`)."""
    from prescaler.kube import hpa_target_share

    return hpa_target_share((hpa.get("spec") or {}).get("metrics"))


def _reactive_target(args: argparse.Namespace, spec: Any, pool: _Pool) -> dict[str, Any]:
    from prescaler.backtest import HPA_TARGET

    if args.hpa_target is not None:
        return {"target": args.hpa_target, "source": "--hpa-target"}
    hpa = hpa_of(spec, pool.hpas)
    if hpa is None:
        return {"target": HPA_TARGET, "source": "default (the pool has no HPA)"}
    name = (hpa.get("metadata") or {}).get("name")
    share, how = hpa_utilization(hpa)
    if share is None:
        return {"target": HPA_TARGET, "source": f"default (HPA {name}: {how})"}
    return {"target": share, "source": f"HPA {name}: {how}"}


# --------------------------------------------------------------------------- credentials


def _credentials(
    args: argparse.Namespace, spec: Any, pool: _Pool
) -> tuple[dict[str, str], tuple[str, str] | None, str]:
    """Headers and basic auth for Prometheus: the flags', else the pool's Secret's."""
    from prescaler.sources import bearer_header, secret_credentials

    given = [f for f in ("token", "token_file", "basic_auth") if getattr(args, f) is not None]
    if len(given) > 1:
        raise CliError("give one of --token, --token-file and --basic-auth")
    try:
        if args.token is not None:
            return bearer_header(args.token, "--token"), None, "--token"
        if args.token_file is not None:
            try:
                token = args.token_file.read_text()
            except OSError as exc:
                raise CliError(f"--token-file: {exc}") from None
            return bearer_header(token, "--token-file"), None, "--token-file"
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.basic_auth is not None:
        user, sep, password = args.basic_auth.partition(":")
        if not sep or not user:
            raise CliError("--basic-auth: expected USER:PASSWORD")
        return {}, (user, password), "--basic-auth"
    ref = spec.forecast.prometheus.auth_secret_ref
    if ref is None:
        return {}, None, "none"
    if pool.secrets is None:
        pool.notes = [
            *(pool.notes or []),
            f"the pool reads Prometheus with Secret {ref.name}; without --pool (the cluster) "
            "it is not read: give --token or --basic-auth if Prometheus needs them",
        ]
        return {}, None, "none"
    try:
        headers, basic = secret_credentials(ref.name, *pool.secrets(ref.name))
    except ValueError as exc:
        raise CliError(f"--pool: {exc}") from None
    return headers, basic, f"Secret {ref.name}"


# --------------------------------------------------------------------------- the replay


def _check_flags(args: argparse.Namespace) -> None:
    if args.pool is None and args.pool_file is None:
        raise CliError("--prometheus: give the pool, --pool NAMESPACE/NAME or --pool-file FILE")
    given = [f for f in TRACE_ONLY if getattr(args, f, None) is not None]
    given += [f for f in ("disaggregated", "window") if getattr(args, f)]
    if given:
        flags = ", ".join(
            "--" + f.replace("_", "-").replace("trace-format", "format") for f in given
        )
        raise CliError(
            f"--prometheus: {flags} describe a trace; a pool's history and spec give them"
        )


def _spec(args: argparse.Namespace, pool: _Pool) -> Any:
    from prescaler.api import SpecError, check_spec

    raw = copy.deepcopy(pool.obj.get("spec") or {})
    if not raw.get("forecast"):
        raise CliError(
            f"{pool.name}: the pool has no spec.forecast (where its demand is read): "
            "nothing to replay"
        )
    raw = with_policy_flags(raw, args)
    for flag, wire in (("min_replicas", "minReplicas"), ("max_replicas", "maxReplicas")):
        if getattr(args, flag) is not None:
            raw[wire] = getattr(args, flag)
    if args.replica_tokens_per_second is not None:
        raw.setdefault("model", {})["tokensPerSecond"] = args.replica_tokens_per_second
    spec = parsed_spec(raw)
    try:
        check_spec(spec)
    except SpecError as exc:
        raise CliError(f"{pool.name}: {exc}") from None
    if spec.roles is not None:
        raise CliError(
            f"{pool.name}: a disaggregated pool (spec.roles); the Prometheus replay is for "
            "unified pools (replay a trace of its requests with --disaggregated)"
        )
    return spec


def _cold_start(args: argparse.Namespace, spec: Any, pool: _Pool) -> dict[str, Any]:
    if args.cold_start_seconds is not None:
        return {"seconds": args.cold_start_seconds, "source": "--cold-start-seconds"}
    status = (pool.obj.get("status") or {}).get("coldStart") or {}
    if status.get("source") == "measured" and status.get("seconds") is not None:
        from prescaler.api import ColdStartStatus

        measured = ColdStartStatus.model_validate(status)
        return {"seconds": measured.seconds, "source": "status.coldStart (measured p90)"}
    return {"seconds": float(spec.cold_start.seconds), "source": "spec.coldStart.seconds"}


def _end(args: argparse.Namespace, step: float) -> float:
    import pandas as pd

    if args.end is None:
        end = time.time()
    else:
        try:
            stamp = pd.Timestamp(args.end)
        except ValueError as exc:
            raise CliError(f"--end: {exc}") from None
        end = (stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp).timestamp()
    return math.floor(end / step) * step


def _iso(t: float) -> str:
    import pandas as pd

    return pd.Timestamp(t, unit="s", tz="UTC").isoformat()


def prepare_history(args: argparse.Namespace) -> History:
    """Read the pool and its history and build the replay's inputs."""
    _check_flags(args)
    if args.pool_file is not None:
        return _prepare(args, _pool_from_file(args.pool_file))
    cluster = _Cluster(args.kubeconfig)
    try:
        return _prepare(args, _pool_from_cluster(args.pool, cluster))
    finally:
        cluster.close()


def _prepare(args: argparse.Namespace, pool: _Pool) -> History:
    from prescaler.api import SpecError
    from prescaler.backtest import (
        demand_from_trace,
        pool_capacity,
        pool_fleet,
        standby_max_replicas,
    )
    from prescaler.backtest.traces import Trace
    from prescaler.settings import ReconcileSettings
    from prescaler.sources import (
        HISTORY_QUERIES,
        SourceError,
        read_demand_history,
        render_queries,
    )

    spec = _spec(args, pool)
    fc = spec.forecast
    url = args.prometheus or fc.prometheus.url
    headers, basic, auth = _credentials(args, spec, pool)
    overrides = fc.queries.model_dump(exclude_none=True) if fc.queries is not None else {}
    window = ReconcileSettings().rate_window

    def queries(name: Any) -> Any:
        return render_queries(
            fc.engine,
            selector=fc.selector,
            quantile=spec.model.context_quantile,
            window=window,
            overrides=overrides,
            demand=name,
        )

    try:
        queries("requests_per_second")
    except ValueError as exc:
        raise CliError(f"{pool.name}: spec.forecast: {exc}") from None
    days = args.days if args.days is not None else DEFAULT_DAYS
    warmup = fc.lookback_seconds if args.history_days is None else args.history_days * 86400.0
    end = _end(args, STEP_SECONDS)
    start = end - days * 86400.0 - warmup
    try:
        history = read_demand_history(
            url,
            queries,
            start=start,
            end=end,
            step_seconds=STEP_SECONDS,
            headers=headers,
            basic_auth=basic,
            verify_tls=not (args.insecure_skip_verify or fc.prometheus.insecure_skip_verify),
            timeout_seconds=args.prometheus_timeout_seconds,
        )
    except SourceError as exc:
        raise CliError(f"--prometheus {url}: {exc}") from None
    prompt, output = history.tokens_per_request()
    trace = Trace(
        start=history.start,
        step_seconds=history.step_seconds,
        rps=history.requests_per_second,
        prompt_tokens=prompt,
        output_tokens=output,
        name=pool.name,
    )
    try:
        # Minutes without token rates plan on the spec's means, as the operator does.
        demand = demand_from_trace(
            trace, prompt_tokens=spec.model.prompt_tokens, output_tokens=spec.model.output_tokens
        ).with_replay_days(days)
    except ValueError as exc:
        raise CliError(f"--prometheus {url}: {pool.name}: {exc}") from None
    held = len(demand) * STEP_SECONDS / 86400.0
    if held < days + warmup / 86400.0 - 1e-9:
        replayed = (len(demand) - demand.replay_from) * STEP_SECONDS / 86400.0
        pool.notes = [
            *(pool.notes or []),
            f"Prometheus holds {held:.2f} of the {days + warmup / 86400.0:g} days asked for: "
            f"{replayed:.2f} days replayed after {demand.replay_from} minutes of warm-up",
        ]
    if not (demand.replay_tokens_per_s.max() > 0):
        raise CliError(f"--prometheus {url}: {pool.name}: no demand in the replayed days")
    cold = _cold_start(args, spec, pool)
    try:
        capacity = pool_capacity(spec, demand, context_tokens=history.context_tokens)
    except SpecError:
        # The measured mix is unusable (a context beyond the model): as the operator, the spec's.
        capacity = pool_capacity(spec, demand, context_tokens=None)
    try:
        config = pool_fleet(spec, capacity, cold_start_seconds=cold["seconds"], policies=())
    except ValueError as exc:
        raise CliError(f"{pool.name}: {exc}") from None
    standby = standby_max_replicas(spec, args.policies)
    if standby > 0:
        config = _with_standby(args, config)
    if "schedule-only" in args.policies and not spec.schedules:
        raise CliError("--policies: schedule-only needs the pool's spec.schedules")
    reactive = _reactive_target(args, spec, pool)
    args.hpa_target = reactive["target"]
    spans = [_parse_span(s) for s in args.score_span]
    prepared = Prepared(trace, demand, capacity, config, [], spans, standby)
    gaps = history.gaps()
    record = {
        "pool": pool.name,
        "days": days,
        "history": {
            "start": _iso(history.start),
            "end": _iso(history.end),
            "step_seconds": history.step_seconds,
            "queries": {name: queries(name).demand_query for name in HISTORY_QUERIES},
            "credentials": auth,
            "gap_minutes": history.gap_steps,
            "gaps": [[_iso(a), _iso(b)] for a, b in gaps],
            "token_gap_minutes": history.token_gap_steps,
            "context_tokens": history.context_tokens,
        },
        "cold_start": cold,
        "hpa": reactive,
    }
    if not args.quiet:
        _report(pool, history, gaps, reactive, cold)
    return History(
        prepared=prepared,
        spec=spec,
        source={"trace": url, "fmt": "prometheus"},
        json=record,
        forecast_step=args.forecast_step_seconds or max(STEP_SECONDS, float(fc.step_seconds)),
        title=pool.name,
    )


def _report(
    pool: _Pool,
    history: Any,
    gaps: list[tuple[float, float]],
    reactive: dict[str, Any],
    cold: dict[str, Any],
) -> None:
    """What the replay stands on, on stderr: the span, its gaps, the cold start, the HPA."""
    lines = [
        f"{pool.name}: history {_iso(history.start)} to {_iso(history.end)}, "
        f"cold start {cold['seconds']:g} s ({cold['source']}), "
        f"HPA target {reactive['target']:g} ({reactive['source']})"
    ]
    if gaps:
        lines.append(
            f"{pool.name}: {history.gap_steps} minutes without demand data in {len(gaps)} gaps "
            f"(first {_iso(gaps[0][0])}); interpolated for the replay, missing to the policies"
        )
    if history.token_gap_steps:
        lines.append(
            f"{pool.name}: {history.token_gap_steps} minutes without token rates: the "
            "spec's model.promptTokens and model.outputTokens stand in"
        )
    lines += pool.notes or []
    for line in lines:
        sys.stderr.write(line + "\n")
