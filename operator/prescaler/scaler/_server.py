"""KEDA's ``externalscaler.ExternalScaler`` gRPC service, served by every operator replica.

The calls are thin: parse the trigger's metadata, read the pool (:class:`PoolReader`),
answer from its last plan (:mod:`prescaler.scaler._answers`), and turn a refusal into a
gRPC status with its message, which KEDA logs and answers with the ScaledObject's
``fallback``. A refused call never stops the server.

What one client can take is bounded: calls in progress (``max_concurrent_rpcs``, beyond
which gRPC answers ``RESOURCE_EXHAUSTED``), push streams open at once (``max_streams``,
within those), how long one stream lives (``stream_max_seconds``: it then ends with
``OK`` and KEDA opens it again), and the size of a request (``max_message_bytes``).
Refusals are logged at DEBUG only (they are counted in ``prescaler_scaler_calls_total``,
and KEDA logs each with its message). With TLS, the certificate, key and CA files are read
again whenever they change (cert-manager renews them in place): each new connection gets
the files' current certificate.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, cast

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
    shown,
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
        """Credentials that follow the files: read now (files that cannot be read, or do
        not load as a TLS server's, are an ``OSError`` here), then again before a new
        connection's handshake whenever one of them changed (:class:`_CertificateFiles`)."""
        files = _CertificateFiles(self)
        # The stubs leave out the None that gRPC's fetcher may return (no change).
        fetch = cast("Callable[[], grpc.ServerCertificateConfiguration]", files.fetch)
        return grpc.dynamic_ssl_server_credentials(
            files.initial(), fetch, require_client_authentication=self.ca is not None
        )


_Stamp = tuple[tuple[int, int, int], ...]


class _CertificateFiles:
    """The certificate configuration of :class:`TlsFiles`, read again when the files
    change.

    gRPC calls :meth:`fetch` before each new connection's TLS handshake (on a thread of
    its own): it costs a ``stat`` of each file, and a read only when one's inode, size or
    modification time changed (a Secret volume swaps its files at once; cert-manager
    renews the Secret in place). New files serve only once they load as a TLS server's
    (the key matches the certificate, the CA is PEM): files read while they were
    changing, half-written, or that cannot be read leave the current certificate in
    service until they change again; each such failure is logged once."""

    def __init__(self, tls: TlsFiles) -> None:
        self._tls = tls
        self._paths = (tls.cert, tls.key) + ((tls.ca,) if tls.ca is not None else ())
        self._lock = threading.Lock()
        self._stamp: _Stamp = ()
        self._contents: tuple[bytes, ...] = ()
        self._failed: str | None = None

    def _stamps(self) -> _Stamp:
        stamps = []
        for path in self._paths:
            stat = path.stat()
            stamps.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        return tuple(stamps)

    def _read(self) -> tuple[_Stamp, tuple[bytes, ...]] | None:
        """The files' stamps and contents, checked as a TLS server loads them, or ``None``
        while they change under the read. Files that do not load raise ``OSError``
        (``ssl.SSLError``)."""
        before = self._stamps()
        contents = tuple(path.read_bytes() for path in self._paths)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # An encrypted key fails here rather than prompting for a password (gRPC could not
        # use it either).
        context.load_cert_chain(self._tls.cert, self._tls.key, password=lambda: b"")
        if self._tls.ca is not None:
            context.load_verify_locations(cafile=self._tls.ca)
        return (before, contents) if self._stamps() == before else None

    def _configuration(self, contents: tuple[bytes, ...]) -> grpc.ServerCertificateConfiguration:
        cert, key, *ca = contents
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=ca[0] if ca else None
        )

    def initial(self) -> grpc.ServerCertificateConfiguration:
        read = self._read() or self._read()
        if read is None:
            raise OSError(f"the scaler's TLS files keep changing: {self._tls.cert}")
        self._stamp, self._contents = read
        return self._configuration(self._contents)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration when the files changed since the last one, else ``None``
        (gRPC keeps the current one). Never raises: gRPC would refuse the connection."""
        with self._lock:
            try:
                stamp = self._stamps()
            except OSError as exc:
                self._note_failure(f"cannot read the scaler's TLS files: {exc}")
                return None
            if stamp == self._stamp:
                return None
            try:
                read = self._read()
            except OSError as exc:  # ssl.SSLError among them: e.g. a key of another cert
                self._stamp = stamp  # tried again once they change
                self._note_failure(f"cannot load the scaler's TLS files: {exc}")
                return None
            if read is None:
                return None  # changing as we read: a later connection reads them whole
            stamp, contents = read
            self._stamp = stamp
            if contents == self._contents:
                return None
            configuration = self._configuration(contents)
            self._contents = contents
            self._failed = None
            log.info("KEDA scaler: TLS certificate reloaded from %s", self._tls.cert)
            return configuration

    def _note_failure(self, message: str) -> None:
        if message != self._failed:
            self._failed = message
            log.warning("%s; the current certificate stays in service", message)


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    """The servicer: the plan of a pool in the caller's own namespace.

    ``max_streams`` push streams run at once at most (another is refused with
    ``RESOURCE_EXHAUSTED``), and each ends cleanly after ``stream_max_seconds`` (less up
    to a tenth at random, so streams opened together do not all come back together):
    KEDA opens it again within seconds, so a stream's slot is never held for ever."""

    def __init__(
        self,
        reader: PoolReader,
        *,
        allowed_namespaces: Iterable[str] = (),
        stale_seconds: float,
        stream_seconds: float,
        max_streams: int = 128,
        stream_max_seconds: float = 600.0,
        counter: CallCounter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reader = reader
        self.allowed = tuple(allowed_namespaces)
        self.stale_seconds = stale_seconds
        self.stream_seconds = stream_seconds
        self.max_streams = max_streams
        self.stream_max_seconds = stream_max_seconds
        self.streams = 0
        """Push streams open now."""
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
        log.debug("%s refused (%s): %s", method, exc.code, exc.message)
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
        (checked every ``stream_seconds``), until the stream's lifetime ends it with
        ``OK``. A refusal ends the stream with its status; KEDA opens it again."""
        if self.streams >= self.max_streams:
            error = ScalerError(
                "RESOURCE_EXHAUSTED",
                f"{self.max_streams} push streams are open already; retry later",
            )
            await self._refuse("StreamIsActive", error, context)
        self.streams += 1
        try:
            lifetime = self.stream_max_seconds * (1 - 0.1 * random.random())
            ends = time.monotonic() + lifetime
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
                left = ends - time.monotonic()
                if left <= 0:
                    return  # OK: KEDA opens the stream again
                await asyncio.sleep(min(self.stream_seconds, left))
        finally:
            self.streams -= 1

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
                    f"metric {shown(request.metricName)} is not this trigger's "
                    f"({query.metric_name})",
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
    servicer: ExternalScaler,
    port: int,
    host: str = "0.0.0.0",
    tls: TlsFiles | None = None,
    *,
    max_concurrent_rpcs: int = 256,
    max_message_bytes: int = 64 * 1024,
) -> tuple[aio.Server, int]:
    """Start serving ``servicer`` on ``host:port`` (0: a free port); returns the server and
    the port it listens on. Plaintext unless ``tls`` is given. At most
    ``max_concurrent_rpcs`` calls run at once (gRPC refuses more with
    ``RESOURCE_EXHAUSTED``), and a request larger than ``max_message_bytes`` is refused
    before it is parsed."""
    size = ("grpc.max_receive_message_length", max_message_bytes)
    server = aio.server(maximum_concurrent_rpcs=max_concurrent_rpcs, options=[size])
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
    max_streams: int,
    stream_max_seconds: float,
    not_found_seconds: float,
    unknown_reads: int,
    unknown_queue: int,
    remembered_pools: int,
    counter: CallCounter | None = None,
) -> ExternalScaler:
    """The servicer over the API server's pools."""
    reader = PoolReader(
        kube,
        cache_seconds,
        not_found_seconds=not_found_seconds,
        unknown_reads=unknown_reads,
        unknown_queue=unknown_queue,
        remembered_pools=remembered_pools,
    )
    return ExternalScaler(
        reader,
        allowed_namespaces=allowed_namespaces,
        stale_seconds=stale_seconds,
        stream_seconds=stream_seconds,
        max_streams=max_streams,
        stream_max_seconds=stream_max_seconds,
        counter=counter,
    )
