"""``prescaler run``: the operator (kopf), configured from typed settings.

Settings come from ``PRESCALER_*`` environment variables (see ``prescaler.settings``);
these flags override them.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from prescaler.cli._common import CliError, positive_float
from prescaler.settings import ReconcileSettings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the operator: reconcile InferencePools in the cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="namespace to watch (repeatable; glob patterns allowed); default: all",
    )
    parser.add_argument(
        "--leader-election",
        action="store_true",
        default=None,
        help="run as one of several replicas: only the holder of a Lease reconciles",
    )
    parser.add_argument("--leader-lease", metavar="NAME", help="name of the leader Lease")
    parser.add_argument(
        "--leader-namespace", metavar="NS", help="namespace of the Lease (default: the pod's)"
    )
    parser.add_argument("--leader-identity", metavar="ID", help="this replica's name in the Lease")
    parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="split the pools into N shards, one Lease each, served by the replicas that "
        "hold them (implies --leader-election; 0: one leader acts)",
    )
    parser.add_argument(
        "--lease-duration", type=positive_float, metavar="SECONDS", help="Lease duration"
    )
    parser.add_argument(
        "--renew-deadline",
        type=positive_float,
        metavar="SECONDS",
        help="a holder stops acting when it could not renew for this long",
    )
    parser.add_argument(
        "--retry-period",
        type=positive_float,
        metavar="SECONDS",
        help="how often Leases are renewed and tried",
    )
    parser.add_argument("--metrics-port", type=int, help="port of /metrics (0 disables)")
    parser.add_argument(
        "--scaler-port",
        type=int,
        metavar="PORT",
        help="serve KEDA's external-scaler gRPC API on this port (default 0: off; the Helm "
        "chart uses 9090)",
    )
    parser.add_argument(
        "--scaler-host", metavar="ADDR", help="address the scaler listens on (default 0.0.0.0)"
    )
    parser.add_argument(
        "--scaler-tls-cert", metavar="FILE", help="PEM certificate of the scaler (TLS)"
    )
    parser.add_argument("--scaler-tls-key", metavar="FILE", help="PEM key of --scaler-tls-cert")
    parser.add_argument(
        "--scaler-tls-ca",
        metavar="FILE",
        help="PEM CA of the clients' certificates: mutual TLS (KEDA's tlsClientCert/Key)",
    )
    parser.add_argument(
        "--interval", type=positive_float, help="reconcile period per pool, seconds"
    )
    parser.add_argument("--forecast-workers", type=int, help="processes for forecast fits")
    defaults = ReconcileSettings()
    parser.add_argument(
        "--forecast-model-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="how long a history refresh waits for its forecast before the last level stands "
        f"in (default {defaults.forecast_model_timeout_seconds:g})",
    )
    parser.add_argument(
        "--forecast-fit-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="how long a model selection or an expensive fit may run before it is abandoned "
        f"and its process replaced (default {defaults.forecast_fit_timeout_seconds:g})",
    )
    parser.add_argument(
        "--calibration-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="how long the replay of a new pool's history, which seeds its risk model, may "
        f"run before it is abandoned (default {defaults.calibration_timeout_seconds:g})",
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    parser.add_argument("--verbose", action="store_true", help="kopf verbose logging")
    parser.add_argument("--debug", action="store_true", help="kopf debug logging")
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> Any:
    from prescaler.settings import from_env

    try:
        settings = from_env()
        if args.namespaces:
            settings = replace(
                settings, watch=replace(settings.watch, namespaces=tuple(args.namespaces))
            )
        leader = settings.leader
        for flag, name in (
            ("leader_election", "enabled"),
            ("leader_lease", "lease_name"),
            ("leader_namespace", "namespace"),
            ("leader_identity", "identity"),
            ("shards", "shards"),
            ("lease_duration", "lease_duration_seconds"),
            ("renew_deadline", "renew_deadline_seconds"),
            ("retry_period", "retry_period_seconds"),
        ):
            value = getattr(args, flag)
            if value is not None:
                leader = replace(leader, **{name: value})
        if args.shards:
            leader = replace(leader, enabled=True)
        settings = replace(settings, leader=leader)
        if args.metrics_port is not None:
            settings = replace(settings, metrics=replace(settings.metrics, port=args.metrics_port))
        scaler = settings.scaler
        for flag, name in (
            ("scaler_port", "port"),
            ("scaler_host", "host"),
            ("scaler_tls_cert", "tls_cert"),
            ("scaler_tls_key", "tls_key"),
            ("scaler_tls_ca", "tls_ca"),
        ):
            value = getattr(args, flag)
            if value is not None:
                scaler = replace(scaler, **{name: value})
        settings = replace(settings, scaler=scaler)
        reconcile = settings.reconcile
        if args.interval is not None:
            reconcile = replace(reconcile, interval_seconds=args.interval)
        if args.forecast_workers is not None:
            reconcile = replace(reconcile, forecast_workers=args.forecast_workers)
        if args.forecast_model_timeout is not None:
            reconcile = replace(
                reconcile, forecast_model_timeout_seconds=args.forecast_model_timeout
            )
        if args.forecast_fit_timeout is not None:
            reconcile = replace(reconcile, forecast_fit_timeout_seconds=args.forecast_fit_timeout)
        if args.calibration_timeout is not None:
            reconcile = replace(reconcile, calibration_timeout_seconds=args.calibration_timeout)
        settings = replace(settings, reconcile=reconcile)
        if args.liveness is not None:
            settings = replace(settings, liveness_endpoint=args.liveness)
        return settings
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    import kopf

    from prescaler.controller.runtime import run_operator

    settings = settings_from_args(args)
    kopf.configure(verbose=args.verbose, debug=args.debug)
    run_operator(settings)
    return 0
