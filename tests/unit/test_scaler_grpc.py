"""The KEDA external scaler over real gRPC: the server started in-process on a free port,
called by a real client (plaintext and mutual TLS with generated certificates), with the
pools served by a fake API server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
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
    """Pools by (namespace, name), as the API server has them; counts the reads."""

    def __init__(self) -> None:
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.failing = False

    def put(self, name: str, replicas: int, age: float = 5.0, **spec: Any) -> None:
        self.pools[("team-a", name)] = {
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
        self.reads += 1
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


def serve(body: Body, tls: tuple[TlsFiles, grpc.ChannelCredentials] | None = None) -> Metrics:
    """Run ``body`` with a client of a server started on a free port; returns the
    server's metrics."""
    api = FakeApi()
    metrics = Metrics()

    async def main() -> None:
        servicer = ExternalScaler(
            PoolReader(api, cache_seconds=0),
            allowed_namespaces=("team-*",),
            stale_seconds=STALE,
            stream_seconds=0.01,
            counter=metrics,
            clock=lambda: NOW,
        )
        server, port = await start_server(
            servicer, 0, "127.0.0.1" if tls is None else "localhost", tls[0] if tls else None
        )
        try:
            if tls is None:
                channel = aio.insecure_channel(f"127.0.0.1:{port}")
            else:
                channel = aio.secure_channel(f"localhost:{port}", tls[1])
            async with channel:
                await body(pb_grpc.ExternalScalerStub(channel), api, metrics)
        finally:
            await server.stop(None)

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
