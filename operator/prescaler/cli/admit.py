"""``prescaler admit``: the pools' degradation policies enforced at the gateway.

A gateway calls ``/check`` before it forwards a request (NGINX ``auth_request``, Caddy
``forward_auth``, Envoy ``ext_authz``, Istio ``CUSTOM``). The answer comes from memory:
the degradation ConfigMaps of the namespaces served, list-and-watched. 200 lets the
request through (with ``x-prescaler-route`` when it may go to the smaller model), 503 with
``Retry-After`` refuses a shed lane, 413 a context above the cap. Whatever is not the
policy's to refuse (no pool, an unknown pool, a ConfigMap of another contract, a
malformed header) is let through, counted and logged once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from prescaler.cli._common import CliError


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "admit",
        help="answer gateways' checks from the pools' degradation policies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="namespace whose degradation ConfigMaps are read (repeatable); default: all",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=_port, default=8081, help="port of /check (default 8081)")
    parser.add_argument(
        "--metrics-port", type=_port, default=8080, help="port of /metrics (0: none)"
    )
    parser.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="KEY=NS/POOL",
        help="the pool of a check without x-prescaler-pool: KEY is a host, or a path prefix "
        "starting with / (the longest matching prefix wins) (repeatable)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else ~/.kube)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from prescaler.admission import Routes
    from prescaler.admission.server import AdmitSettings, serve

    try:
        Routes.parse(args.route)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = AdmitSettings(
        namespaces=tuple(args.namespaces) if args.namespaces else None,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        routes=tuple(args.route),
        kubeconfig=args.kubeconfig,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
    return 0
