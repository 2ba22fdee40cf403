"""KEDA's ``externalscaler.ExternalScaler`` gRPC service, served by every operator replica.

The calls are thin: parse the trigger's metadata, read the pool (:class:`PoolReader`),
answer from its last plan (:mod:`prescaler.scaler._answers`), and turn a refusal into a
gRPC status with its message, which KEDA logs and answers with the ScaledObject's
``fallback``. A refused call never stops the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc
from grpc import aio

from prescaler.scaler._answers import (
    TARGET_SIZE,
    Plan,
    Query,
    ScalerError,
    answer,
    check_namespace,
    parse_query,
)
from prescaler.scaler._plans import CustomObjectReader, PoolReader
from prescaler.scaler._proto import externalscaler_pb2 as pb
from prescaler.scaler._proto import externalscaler_pb2_grpc as pb_grpc

log = logging.getLogger("prescaler.scaler")

Context = aio.ServicerContext[Any, Any]
METHODS = ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics")
"""The calls served (``StreamMetricSpec`` is optional in KEDA's API: ``UNIMPLEMENTED``)."""


class CallCounter(Protocol):
    """Where the servicer counts its calls (:class:`prescaler.metrics.Metrics`:
    ``prescaler_scaler_calls_total``)."""

    def scaler_call(self, method: str, outcome: str) -> None:
        """One call of ``method`` that ended in ``outcome`` (``ok`` or a gRPC code)."""


class _Uncounted:
    def scaler_call(self, method: str, outcome: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of the server's certificate and key, and of the CA that signs its
    clients' certificates (mutual TLS: a client without one is refused)."""

    cert: Path
    key: Path
    ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        pair = (self.key.read_bytes(), self.cert.read_bytes())
        ca = self.ca.read_bytes() if self.ca is not None else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    """The servicer: any pool's plan, for any caller that names it."""

    def __init__(
        self,
        reader: PoolReader,
        *,
        allowed_namespaces: Iterable[str] = (),
        stale_seconds: float,
        stream_seconds: float,
        counter: CallCounter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reader = reader
        self.allowed = tuple(allowed_namespaces)
        self.stale_seconds = stale_seconds
        self.stream_seconds = stream_seconds
        self.counter: CallCounter = counter or _Uncounted()
        self.clock = clock

    async def plan(self, ref: pb.ScaledObjectRef) -> tuple[Query, Plan]:
        """The query a trigger makes and the pool's plan, or a :class:`ScalerError`."""
        query = parse_query(ref.name, ref.namespace, dict(ref.scalerMetadata))
        check_namespace(query, self.allowed)
        pool = await self.reader.get(query.namespace, query.pool)
        return query, answer(query, pool, self.clock(), self.stale_seconds)

    async def _refuse(self, method: str, exc: ScalerError, context: Context) -> NoReturn:
        self.counter.scaler_call(method, exc.code.lower())
        log.info("%s refused (%s): %s", method, exc.code, exc.message)
        await context.abort(grpc.StatusCode[exc.code], exc.message)
        raise AssertionError("abort returns only by raising")

    async def IsActive(self, request: pb.ScaledObjectRef, context: Context) -> pb.IsActiveResponse:
        try:
            _, plan = await self.plan(request)
        except ScalerError as exc:
            await self._refuse("IsActive", exc, context)
        self.counter.scaler_call("IsActive", "ok")
        return pb.IsActiveResponse(result=plan.active)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: Context
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """The activity now, then again each time the plan reaches or leaves zero
        (checked every ``stream_seconds``). A refusal ends the stream with its status;
        KEDA opens it again."""
        sent: bool | None = None
        while True:
            try:
                _, plan = await self.plan(request)
            except ScalerError as exc:
                await self._refuse("StreamIsActive", exc, context)
            if plan.active != sent:
                sent = plan.active
                self.counter.scaler_call("StreamIsActive", "ok")
                yield pb.IsActiveResponse(result=sent)
            await asyncio.sleep(self.stream_seconds)

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: Context
    ) -> pb.GetMetricSpecResponse:
        """The metric's name and its target of one per replica. Only the metadata is
        checked here: KEDA asks for the spec when it builds the HPA, which should not
        fail because a new pool has no plan yet (the metric's reads fall back instead)."""
        try:
            query = parse_query(request.name, request.namespace, dict(request.scalerMetadata))
            check_namespace(query, self.allowed)
        except ScalerError as exc:
            await self._refuse("GetMetricSpec", exc, context)
        self.counter.scaler_call("GetMetricSpec", "ok")
        spec = pb.MetricSpec(
            metricName=query.metric_name, targetSize=TARGET_SIZE, targetSizeFloat=TARGET_SIZE
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: Context
    ) -> pb.GetMetricsResponse:
        try:
            query, plan = await self.plan(request.scaledObjectRef)
            if request.metricName and request.metricName != query.metric_name:
                raise ScalerError(
                    "INVALID_ARGUMENT",
                    f"metric {request.metricName!r} is not this trigger's ({query.metric_name!r})",
                )
        except ScalerError as exc:
            await self._refuse("GetMetrics", exc, context)
        self.counter.scaler_call("GetMetrics", "ok")
        value = pb.MetricValue(
            metricName=query.metric_name,
            metricValue=plan.replicas,
            metricValueFloat=float(plan.replicas),
        )
        return pb.GetMetricsResponse(metricValues=[value])

    async def StreamMetricSpec(
        self, request: pb.ScaledObjectRef, context: Context
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """Not served: the target is always 1 per replica, so KEDA's pull suffices."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "StreamMetricSpec is not served")
        yield pb.GetMetricSpecResponse()  # pragma: no cover (makes this a generator)


async def start_server(
    servicer: ExternalScaler, port: int, host: str = "0.0.0.0", tls: TlsFiles | None = None
) -> tuple[aio.Server, int]:
    """Start serving ``servicer`` on ``host:port`` (0: a free port); returns the server and
    the port it listens on. Plaintext unless ``tls`` is given."""
    server = aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)
    address = f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, tls.credentials())
    except RuntimeError as exc:  # grpc's "Failed to bind", e.g. the port is taken
        raise OSError(f"the KEDA scaler cannot listen on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"the KEDA scaler cannot listen on {address}")
    await server.start()
    log.info("KEDA external scaler listening on %s:%d%s", host, bound, " (TLS)" if tls else "")
    return server, bound


def external_scaler(
    kube: CustomObjectReader,
    *,
    allowed_namespaces: Iterable[str],
    stale_seconds: float,
    stream_seconds: float,
    cache_seconds: float,
    counter: CallCounter | None = None,
) -> ExternalScaler:
    """The servicer over the API server's pools."""
    return ExternalScaler(
        PoolReader(kube, cache_seconds),
        allowed_namespaces=allowed_namespaces,
        stale_seconds=stale_seconds,
        stream_seconds=stream_seconds,
        counter=counter,
    )
