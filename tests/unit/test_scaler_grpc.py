"""The KEDA external scaler over real gRPC: the server started in-process on a free port,
called by a real client (plaintext and mutual TLS with generated certificates), with the
pools served by a fake API server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc import aio

from prescaler.controller.status import rfc3339
from prescaler.kube import KubeError, NotFound
from prescaler.metrics import Metrics
from prescaler.scaler import ExternalScaler, PoolReader, TlsFiles, start_server
from prescaler.scaler._proto import externalscaler_pb2 as pb
from prescaler.scaler._proto import externalscaler_pb2_grpc as pb_grpc

NOW = 1_750_000_000.0
STALE = 120.0


class FakeApi:
    """Pools by (namespace, name), as the API server has them; counts the reads.

    ``threads`` reads run at once at most, the others queue, as on the operator's client
    (a pool of threads). While ``missing_hang`` is set, a read of a pool that does not
    exist holds its thread until it is cleared (an API server slow to answer 404s)."""

    def __init__(self, threads: int | None = None) -> None:
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.failing = False
        self.threads = asyncio.Semaphore(threads) if threads else None
        self.missing_hang = False
        self.missing_released = asyncio.Event()

    def put(
        self, name: str, replicas: int, age: float = 5.0, namespace: str = "team-a", **spec: Any
    ) -> None:
        self.pools[(namespace, name)] = {
            "spec": {
                "target": {"kind": "ScaledObject", "name": name},
                "mode": "kedaTrigger",
                **spec,
            },
            "status": {"desiredReplicas": replicas, "plan": {"plannedAt": rfc3339(NOW - age)}},
        }

    async def get_custom_object(
        self, group: str, version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any]:
        assert (group, version, plural) == ("prescaler.io", "v1alpha1", "inferencepools")
        if self.threads is None:
            return await self._get(namespace, name)
        async with self.threads:
            return await self._get(namespace, name)

    async def _get(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.missing_hang and (namespace, name) not in self.pools:
            await self.missing_released.wait()
        if self.failing:
            raise KubeError("get_namespaced_custom_object: 503 Service Unavailable", 503)
        if (namespace, name) not in self.pools:
            raise NotFound("get_namespaced_custom_object: 404 Not Found", 404)
        return self.pools[(namespace, name)]


def ref(pool: str = "llama", **metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(
        name="llama-so",
        namespace="team-a",
        scalerMetadata={"scalerAddress": "prescaler:9090", "pool": pool, **metadata},
    )


Body = Callable[["pb_grpc.ExternalScalerAsyncStub", FakeApi, Metrics], Awaitable[None]]


def serve(
    body: Body,
    tls: tuple[TlsFiles, grpc.ChannelCredentials] | None = None,
    *,
    api_threads: int | None = None,
    reader: Mapping[str, Any] = {},
    scaler: Mapping[str, Any] = {},
    server: Mapping[str, Any] = {},
) -> Metrics:
    """Run ``body`` with a client of a server started on a free port; returns the
    server's metrics. ``reader``, ``scaler`` and ``server``: limits passed to the
    :class:`PoolReader`, the :class:`ExternalScaler` and :func:`start_server`."""
    api = FakeApi(api_threads)
    metrics = Metrics()

    async def main() -> None:
        servicer = ExternalScaler(
            PoolReader(api, cache_seconds=0, **reader),
            allowed_namespaces=("team-*",),
            stale_seconds=STALE,
            stream_seconds=0.01,
            counter=metrics,
            clock=lambda: NOW,
            **scaler,
        )
        host = "127.0.0.1" if tls is None else "localhost"
        grpc_server, port = await start_server(servicer, 0, host, tls[0] if tls else None, **server)
        try:
            if tls is None:
                channel = aio.insecure_channel(f"127.0.0.1:{port}")
            else:
                channel = aio.secure_channel(f"localhost:{port}", tls[1])
            async with channel:
                await body(pb_grpc.ExternalScalerStub(channel), api, metrics)
        finally:
            await grpc_server.stop(None)

    asyncio.run(main())
    return metrics


async def refused(call: Awaitable[Any]) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as caught:
        await call
    return caught.value


def calls(metrics: Metrics, method: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "prescaler_scaler_calls_total", {"method": method, "outcome": outcome}
    )
    assert value is not None
    return value


def test_keda_gets_the_plan_as_the_metric_against_a_target_of_one() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 4)
        spec = await stub.GetMetricSpec(ref())
        assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
            ("prescaler-llama", 1, 1.0)
        ]
        request = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="prescaler-llama")
        values = (await stub.GetMetrics(request)).metricValues
        assert [(m.metricName, m.metricValue, m.metricValueFloat) for m in values] == [
            ("prescaler-llama", 4, 4.0)
        ]
        assert (await stub.IsActive(ref())).result is True
        api.put("llama", 0)
        assert (await stub.IsActive(ref())).result is False

    metrics = serve(body)
    assert calls(metrics, "GetMetrics", "ok") == 1
    assert calls(metrics, "IsActive", "ok") == 2


def test_refusals_carry_their_code_and_message_and_the_server_keeps_serving() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 2)
        api.put("old", 2, age=STALE + 60)
        error = await refused(stub.IsActive(ref("unknown")))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "InferencePool team-a/unknown not found" in (error.details() or "")
        error = await refused(stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref("old"))))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "180 s old" in (error.details() or "")
        error = await refused(stub.GetMetricSpec(ref("llama", pol="typo")))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown trigger metadata pol" in (error.details() or "")
        error = await refused(stub.IsActive(ref("llama", namespace="kube-system")))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        wrong = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="prescaler-other")
        assert (await refused(stub.GetMetrics(wrong))).code() == grpc.StatusCode.INVALID_ARGUMENT
        api.failing = True
        error = await refused(stub.IsActive(ref()))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "503" in (error.details() or "")
        api.failing = False
        assert (await stub.IsActive(ref())).result is True  # still serving

    metrics = serve(body)
    assert calls(metrics, "IsActive", "not_found") == 1
    assert calls(metrics, "GetMetricSpec", "invalid_argument") == 1
    assert calls(metrics, "GetMetrics", "unavailable") == 1


async def checked_twice(api: FakeApi) -> None:
    """Until the stream has read the pool twice more (it reads it every 10 ms)."""
    reads = api.reads
    while api.reads < reads + 2:
        await asyncio.sleep(0.01)


def test_a_push_stream_sends_the_activity_then_each_time_the_plan_reaches_or_leaves_zero() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 0)
        stream = stub.StreamIsActive(ref())

        async def next_result() -> bool:
            message = await stream.read()
            assert isinstance(message, pb.IsActiveResponse)
            return message.result

        assert await next_result() is False
        await checked_twice(api)  # and sent nothing
        api.put("llama", 3)
        assert await next_result() is True
        api.put("llama", 5)  # still active: nothing to push
        await checked_twice(api)
        api.put("llama", 0)
        assert await next_result() is False
        del api.pools[("team-a", "llama")]
        with pytest.raises(aio.AioRpcError) as caught:
            await stream.read()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    metrics = serve(body)
    assert calls(metrics, "StreamIsActive", "ok") == 3


def test_stream_metric_spec_is_unimplemented_so_keda_pulls() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        stream = stub.StreamMetricSpec(ref())
        with pytest.raises(aio.AioRpcError) as caught:
            await stream.read()
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED

    serve(body)


def _tls(tmp_path: Path, client_cert: bool) -> tuple[TlsFiles, grpc.ChannelCredentials]:
    ca = trustme.CA()
    server = ca.issue_cert("localhost")
    files = {
        "cert": b"".join(blob.bytes() for blob in server.cert_chain_pems),
        "key": server.private_key_pem.bytes(),
        "ca": ca.cert_pem.bytes(),
    }
    for name, data in files.items():
        (tmp_path / f"{name}.pem").write_bytes(data)
    tls = TlsFiles(tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem")
    if not client_cert:
        return tls, grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    client = ca.issue_cert("keda-operator")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=client.private_key_pem.bytes(),
        certificate_chain=client.cert_chain_pems[0].bytes(),
    )
    return tls, credentials


def test_mutual_tls_answers_a_client_with_a_certificate_of_the_ca(tmp_path: Path) -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 2)
        assert (await stub.IsActive(ref())).result is True

    serve(body, _tls(tmp_path, client_cert=True))


def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 2)
        error = await refused(stub.IsActive(ref(), timeout=30))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert api.reads == 0

    serve(body, _tls(tmp_path, client_cert=False))


def test_pool_reads_are_shared_for_the_cache_period_and_errors_are_not_kept() -> None:
    api = FakeApi()
    api.put("llama", 2)
    clock = [0.0]
    reader = PoolReader(api, cache_seconds=2.0, clock=lambda: clock[0])

    async def main() -> None:
        first = await asyncio.gather(*(reader.get("team-a", "llama") for _ in range(5)))
        assert all(body is first[0] for body in first)
        assert api.reads == 1
        clock[0] = 1.5
        await reader.get("team-a", "llama")
        assert api.reads == 1
        clock[0] = 3.0
        api.failing = True
        with pytest.raises(Exception, match="503"):
            await reader.get("team-a", "llama")
        api.failing = False
        assert await reader.get("team-a", "llama") is not None
        assert api.reads == 3
        assert await reader.get("team-a", "nothing") is None

    asyncio.run(main())


def test_a_taken_port_is_an_os_error_that_names_the_address() -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            servicer = ExternalScaler(
                PoolReader(FakeApi(), cache_seconds=0), stale_seconds=STALE, stream_seconds=1
            )
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
                await start_server(servicer, port, "127.0.0.1")

    asyncio.run(main())


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition``; a generous deadline only turns a hang into a failure."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"still waiting for {what}")
        await asyncio.sleep(0.01)


async def once_admitted(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()``, made again while it is refused ``RESOURCE_EXHAUSTED``: a slot frees
    once the server has seen a client's cancel."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        try:
            return await call()
        except aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or loop.time() > deadline:
                raise
        await asyncio.sleep(0.01)


def test_a_trigger_cannot_read_a_pool_of_another_namespace() -> None:
    """Trigger metadata ``namespace`` does not override the ScaledObject's: a call for
    another namespace is refused before any read, in the same words whether the pool
    exists or not."""

    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 2, namespace="team-b")
        api.put("llama", 3)
        existing = await refused(stub.IsActive(ref("llama", namespace="team-b")))
        missing = await refused(stub.IsActive(ref("nothing", namespace="team-b")))
        assert existing.code() == missing.code() == grpc.StatusCode.PERMISSION_DENIED
        assert existing.details() == missing.details()
        request = pb.GetMetricsRequest(scaledObjectRef=ref("llama", namespace="team-b"))
        metric = await refused(stub.GetMetrics(request))
        assert metric.code() == grpc.StatusCode.PERMISSION_DENIED
        spec = await refused(stub.GetMetricSpec(ref("llama", namespace="team-b")))
        assert spec.code() == grpc.StatusCode.PERMISSION_DENIED
        assert api.reads == 0
        # Its own namespace, named or not, reads its own pool.
        assert (await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref()))).metricValues[
            0
        ].metricValue == 3
        own = pb.GetMetricsRequest(scaledObjectRef=ref("llama", namespace="team-a"))
        assert (await stub.GetMetrics(own)).metricValues[0].metricValue == 3

    metrics = serve(body)
    assert calls(metrics, "IsActive", "permission_denied") == 2


UNKNOWN_READS = 2
UNKNOWN_QUEUE = 8


def test_a_flood_of_unknown_pools_and_oversized_metadata_leaves_other_pools_answered() -> None:
    """Hundreds of calls for pools that do not exist, while the API server is slow to say
    so, and requests with oversized metadata: a known pool is still answered, the unknown
    names cost at most their lane of reads, and the rest are refused at once."""

    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, m: Metrics) -> None:
        api.put("llama", 4)
        assert (await stub.IsActive(ref())).result is True  # found once: a known pool
        api.missing_hang = True
        flood = [
            asyncio.ensure_future(stub.IsActive(ref(f"ghost-{i}"), timeout=120)) for i in range(300)
        ]
        lane = UNKNOWN_READS + UNKNOWN_QUEUE
        await until(lambda: sum(f.done() for f in flood) >= len(flood) - lane, "refusals")
        await until(lambda: api.reads >= 1 + UNKNOWN_READS, "the lane's reads")
        # Oversized: refused by gRPC before it is parsed.
        huge = await refused(stub.IsActive(ref(big="x" * 256 * 1024)))
        assert huge.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Large, under the size limit: refused, quoting it short.
        large = await refused(stub.GetMetricSpec(ref(**{"k" * 30_000: "v"})))
        assert large.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(large.details() or "") < 500
        # The known pool is answered while the flood's reads hang.
        for _ in range(3):
            assert (await stub.IsActive(ref(), timeout=60)).result is True
            request = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="prescaler-llama")
            assert (await stub.GetMetrics(request, timeout=60)).metricValues[0].metricValue == 4
        ghost_reads = api.reads - 1 - 6
        assert ghost_reads == UNKNOWN_READS  # the rest wait their turn or were refused
        api.missing_hang = False
        api.missing_released.set()
        codes = []
        for call in flood:
            try:
                await call
            except aio.AioRpcError as error:
                codes.append(error.code())
        exhausted = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert codes.count(grpc.StatusCode.NOT_FOUND) == len(flood) - exhausted <= lane
        assert calls(m, "IsActive", "resource_exhausted") == exhausted

    serve(
        body,
        api_threads=4 + UNKNOWN_READS,  # as the operator's scaler client has
        reader={"unknown_reads": UNKNOWN_READS, "unknown_queue": UNKNOWN_QUEUE},
        server={"max_concurrent_rpcs": 1024},  # every refusal is the reader's, counted
    )


def test_a_missing_pool_is_remembered_and_a_created_one_is_found_after() -> None:
    api = FakeApi()
    clock = [0.0]
    reader = PoolReader(api, cache_seconds=1.0, clock=lambda: clock[0], not_found_seconds=10)

    async def main() -> None:
        assert await reader.get("team-a", "llama") is None
        clock[0] = 5.0
        assert await reader.get("team-a", "llama") is None
        assert api.reads == 1  # remembered as missing
        api.put("llama", 2)
        clock[0] = 10.5
        assert await reader.get("team-a", "llama") is not None
        assert api.reads == 2

    asyncio.run(main())


def test_push_streams_are_bounded_and_a_closed_one_frees_its_slot() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, m: Metrics) -> None:
        api.put("llama", 2)
        streams = [stub.StreamIsActive(ref()) for _ in range(2)]
        for stream in streams:
            assert (await stream.read()).result is True
        third = stub.StreamIsActive(ref())
        with pytest.raises(aio.AioRpcError) as caught:
            await third.read()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        streams[0].cancel()
        opened: list[Any] = []

        async def open_one() -> Any:
            opened.append(stub.StreamIsActive(ref()))
            return await opened[-1].read()

        assert (await once_admitted(open_one)).result is True
        for stream in (streams[1], opened[-1]):
            stream.cancel()

    metrics = serve(body, scaler={"max_streams": 2})
    assert calls(metrics, "StreamIsActive", "resource_exhausted") >= 1


def test_a_push_stream_ends_cleanly_after_its_lifetime_so_keda_opens_it_again() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 2)
        stream = stub.StreamIsActive(ref(), timeout=60)  # a deadline turns a hang into a fail
        assert (await stream.read()).result is True
        assert await stream.read() is aio.EOF
        assert await stream.code() == grpc.StatusCode.OK

    serve(body, scaler={"stream_max_seconds": 0.05})


def test_calls_beyond_the_concurrency_bound_are_refused_and_the_server_recovers() -> None:
    async def body(stub: pb_grpc.ExternalScalerAsyncStub, api: FakeApi, _: Metrics) -> None:
        api.put("llama", 2)
        streams = [stub.StreamIsActive(ref()) for _ in range(2)]
        for stream in streams:
            assert (await stream.read()).result is True
        error = await refused(stub.IsActive(ref()))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for stream in streams:
            stream.cancel()
        assert (await once_admitted(lambda: stub.IsActive(ref()))).result is True

    serve(body, scaler={"max_streams": 4}, server={"max_concurrent_rpcs": 2})


def _install(directory: Path, files: dict[str, bytes], version: int) -> None:
    """Write ``files`` as a Secret volume does: into a new directory that the ``..data``
    link is swapped to at once, each file a link through it."""
    target = directory / f"..v{version}"
    target.mkdir()
    for name, data in files.items():
        (target / name).write_bytes(data)
    swap = directory / "..data_tmp"
    swap.symlink_to(target.name)
    swap.replace(directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)


def test_a_renewed_certificate_serves_new_connections(tmp_path: Path) -> None:
    """The certificate files change in place (cert-manager renews the Secret): a new
    connection gets the new certificate, and files that do not belong together (a key of
    another certificate) leave the last good one in service."""
    first_ca, renewed_ca, client_ca = trustme.CA(), trustme.CA(), trustme.CA()
    first, renewed = first_ca.issue_cert("localhost"), renewed_ca.issue_cert("localhost")
    client = client_ca.issue_cert("keda-operator")

    def pems(cert: trustme.LeafCert, key: trustme.LeafCert) -> dict[str, bytes]:
        return {
            "tls.crt": b"".join(blob.bytes() for blob in cert.cert_chain_pems),
            "tls.key": key.private_key_pem.bytes(),
            "ca.crt": client_ca.cert_pem.bytes(),
        }

    _install(tmp_path, pems(first, first), 1)
    tls = TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")
    api = FakeApi()
    api.put("llama", 2)

    async def answer_from(port: int, ca: trustme.CA) -> grpc.StatusCode:
        """A new connection that trusts only ``ca``: OK when the server's certificate is
        one of ``ca``'s."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem.bytes(),
            private_key=client.private_key_pem.bytes(),
            certificate_chain=client.cert_chain_pems[0].bytes(),
        )
        options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
        async with aio.secure_channel(f"localhost:{port}", credentials, options) as channel:
            try:
                await pb_grpc.ExternalScalerStub(channel).IsActive(ref(), timeout=30)
            except aio.AioRpcError as error:
                return error.code()
            return grpc.StatusCode.OK

    async def main() -> None:
        servicer = ExternalScaler(
            PoolReader(api, cache_seconds=0),
            stale_seconds=STALE,
            stream_seconds=1,
            clock=lambda: NOW,
        )
        server, port = await start_server(servicer, 0, "localhost", tls)
        try:
            assert await answer_from(port, first_ca) == grpc.StatusCode.OK
            assert await answer_from(port, renewed_ca) == grpc.StatusCode.UNAVAILABLE
            _install(tmp_path, pems(renewed, renewed), 2)
            assert await answer_from(port, renewed_ca) == grpc.StatusCode.OK
            assert await answer_from(port, first_ca) == grpc.StatusCode.UNAVAILABLE
            _install(tmp_path, pems(first, renewed), 3)  # mismatched: not taken
            assert await answer_from(port, renewed_ca) == grpc.StatusCode.OK
            _install(tmp_path, pems(first, first), 4)
            assert await answer_from(port, first_ca) == grpc.StatusCode.OK
        finally:
            await server.stop(None)

    asyncio.run(main())
