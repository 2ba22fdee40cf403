"""A Prometheus answer is bounded, and no credential reaches a status, an Event or a log.

A real HTTP server on a local port (``http.server`` in a thread) plays a Prometheus that
answers hugely, a byte at a time, with errors that echo the request's token, or with a
gateway's page; the sources read it through their real client (prometheus-api-client on
``requests``). Reads that must end are waited for with a generous deadline, never timed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from prescaler.controller.model import PoolObject
from prescaler.kube import SecretData
from prescaler.settings import ReconcileSettings, from_env
from prescaler.sources import (
    MAX_RESPONSE_BYTES,
    MetricsUnavailable,
    PrometheusSource,
    PromQLError,
    render_queries,
    secret_credentials,
)
from prescaler.sources._transport import scrub
from unit.test_status_pipeline import NOW, _condition, _kube, _reconciler, _spec

TOKEN = "s3cr3t-prometheus-token"
WAIT = 120.0
"""How long a read that must end is waited for (generous: it ends in about a second)."""

Handler = Callable[[BaseHTTPRequestHandler], None]


class Prometheus:
    """A local HTTP server; ``answer`` writes each response. Stops dripping when closed."""

    def __init__(self, answer: Handler) -> None:
        self.stop = threading.Event()
        self.authorizations: list[str] = []
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.authorizations.append(self.headers.get("Authorization", ""))
                with suppress(BrokenPipeError, ConnectionResetError):
                    answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=WAIT)


@contextmanager
def prometheus(answer: Handler) -> Iterator[Prometheus]:
    server = Prometheus(answer)
    try:
        yield server
    finally:
        server.close()


@contextmanager
def source(url: str, **kwargs: Any) -> Iterator[PrometheusSource]:
    src = PrometheusSource(url, render_queries("vllm"), **kwargs)
    try:
        yield src
    finally:
        src.close()


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(body)


def _vector(h: BaseHTTPRequestHandler) -> None:
    result = [{"metric": {}, "value": [NOW, "1"]}] if "/query_range" not in h.path else []
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    _send(h, 200, json.dumps(body).encode())


class _StillReading(Exception):
    """The read had not ended after :data:`WAIT`."""


def _ends(call: Callable[[], Any]) -> BaseException | None:
    """What ``call`` raised (``None``: it returned), waited for at most :data:`WAIT`;
    :class:`_StillReading` if it had not ended by then (its thread is left to the server's
    close)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    return outcome[0] if outcome else _StillReading()


# ---------------------------------------------------------------------- a byte cap
@pytest.mark.parametrize("length", [True, False], ids=["content-length", "streamed"])
def test_an_answer_past_the_byte_cap_is_unavailable_and_read_no_further(length: bool) -> None:
    sent = [0]

    def huge(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        if length:
            h.send_header("Content-Length", str(64 * 1024 * 1024))
        else:
            h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        chunk = b'{"metric":{},"value":[1,"1"]},' * 1024
        while not server.stop.is_set() and sent[0] < 64 * 1024 * 1024:
            h.wfile.write(chunk)
            sent[0] += len(chunk)

    with prometheus(huge) as server, source(server.url, max_response_bytes=64 * 1024) as src:
        error = _ends(lambda: src.snapshot(NOW))
    assert isinstance(error, MetricsUnavailable), error
    assert "more than 65536 bytes" in str(error)
    assert "PROMETHEUS_MAX_RESPONSE_BYTES" in str(error)
    assert sent[0] < 64 * 1024 * 1024, "the client stopped reading"


# ---------------------------------------------------------------------- a total deadline
@pytest.mark.parametrize("where", ["body", "headers"])
def test_an_answer_dripped_a_byte_at_a_time_ends_at_the_deadline(where: str) -> None:
    """Each byte comes well within the per-read timeout, so only a deadline on the
    whole answer ends the read; the next read of the same source works again."""
    drip = [True]

    def slow(h: BaseHTTPRequestHandler) -> None:
        if not drip[0]:
            _vector(h)
            return
        body = b" " * 100_000
        if where == "headers":
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            data = b"X-Slow: " + b"a" * 100_000 + b"\r\n\r\n"
        else:
            h.send_response(200)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            data = body
        for byte in data:
            if server.stop.is_set():
                h.close_connection = True  # the client reads an end, not silence
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.05)

    with prometheus(slow) as server, source(server.url, timeout_seconds=1.0) as src:
        error = _ends(lambda: src.snapshot(NOW))
        assert isinstance(error, MetricsUnavailable), error
        assert "did not answer within 1s" in str(error)
        drip[0] = False
        assert _ends(lambda: src.snapshot(NOW)) is None


def test_the_deadline_and_the_cap_are_settings() -> None:
    settings = from_env(
        {
            "PRESCALER_RECONCILE_PROMETHEUS_TIMEOUT_SECONDS": "3",
            "PRESCALER_RECONCILE_PROMETHEUS_MAX_RESPONSE_BYTES": "1048576",
        }
    ).reconcile
    assert (settings.prometheus_timeout_seconds, settings.prometheus_max_response_bytes) == (
        3.0,
        1048576,
    )
    assert ReconcileSettings().prometheus_max_response_bytes == MAX_RESPONSE_BYTES
    with pytest.raises(ValueError, match="max response bytes"):
        from_env({"PRESCALER_RECONCILE_PROMETHEUS_MAX_RESPONSE_BYTES": "10"})


# ---------------------------------------------------------------------- error bodies
def test_an_error_body_is_cut_and_sanitized_but_promqls_error_is_kept() -> None:
    def bad_data(h: BaseHTTPRequestHandler) -> None:
        error = {"status": "error", "errorType": "bad_data", "error": "1:5: parse error"}
        _send(h, 400, json.dumps(error).encode())

    with prometheus(bad_data) as server, source(server.url) as src:
        error = _ends(lambda: src.snapshot(NOW))
    assert isinstance(error, PromQLError), error
    assert str(error).endswith("is not valid PromQL: 1:5: parse error")

    def gateway(h: BaseHTTPRequestHandler) -> None:
        page = b"<html>\r\n\x1b[31m" + b"gateway says no " * 10_000 + b"</html>"
        _send(h, 500, page, **{"Content-Type": "text/html"})

    with prometheus(gateway) as server, source(server.url) as src:
        error = _ends(lambda: src.snapshot(NOW))
    assert isinstance(error, MetricsUnavailable), error
    text = str(error)
    assert text.startswith("query requests_per_second: HTTP 500: <html>")
    assert len(text) <= 300
    assert not any(ord(c) < 0x20 for c in text), text


# ---------------------------------------------------------------------- credentials
def _echo_token(h: BaseHTTPRequestHandler) -> None:
    """A server whose error text repeats the request's Authorization header."""
    said = h.headers.get("Authorization", "")
    error = {"status": "error", "errorType": "internal", "error": f"denied: {said}"}
    _send(h, 500, json.dumps(error).encode())


def test_an_error_that_echoes_the_token_reaches_no_status_nor_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real reconcile pipeline, its Prometheus a server that echoes the token."""
    kube = _kube()
    kube.secrets["prom"] = SecretData("Opaque", {"token": TOKEN})
    with prometheus(_echo_token) as server, caplog.at_level(logging.DEBUG):
        forecast = {
            "prometheus": {"url": server.url, "authSecretRef": {"name": "prom"}},
            "model": "seasonal_naive",
        }
        rec = _reconciler(kube)
        rec.forecasts.wait_seconds = 5
        status = asyncio.run(
            rec.reconcile(PoolObject("ns", "pool", "uid-1", 1, _spec(forecast=forecast), {}))
        )
        rec.forget(PoolObject("ns", "pool", "uid-1", 1, {}, {}))
    assert server.authorizations
    assert server.authorizations[0] == f"Bearer {TOKEN}"
    metrics = _condition(status, "MetricsAvailable")
    assert metrics["status"] == "False"
    assert "denied: Bearer [redacted]" in metrics["message"]
    everything = json.dumps(status) + repr(kube.events) + caplog.text
    assert TOKEN not in everything


def test_a_token_with_a_line_break_is_refused_without_showing_it() -> None:
    token = f"{TOKEN}\r\nX-Injected: yes"
    with pytest.raises(ValueError, match="control character") as refused:
        secret_credentials("prom", {"token": token})
    assert TOKEN not in str(refused.value)
    # Given to the source anyway, requests' refusal (its text holds the header) is scrubbed.
    bearer = {"Authorization": f"Bearer {token}"}
    with prometheus(_vector) as server, source(server.url, headers=bearer) as src:
        error = _ends(lambda: src.snapshot(NOW))
    assert isinstance(error, MetricsUnavailable), error
    assert TOKEN not in str(error)
    assert "[redacted]" in str(error)


def test_a_line_break_token_in_a_pools_secret_makes_it_invalid_without_the_token() -> None:
    kube = _kube()
    kube.secrets["prom"] = SecretData("Opaque", {"token": f"{TOKEN}\r\nX: y"})
    forecast = {"prometheus": {"url": "https://p.example", "authSecretRef": {"name": "prom"}}}
    status = asyncio.run(
        _reconciler(kube).reconcile(
            PoolObject("ns", "pool", "uid-1", 1, _spec(forecast=forecast), {})
        )
    )
    invalid = _condition(status, "Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "InvalidSecret")
    assert "control character" in invalid["message"]
    assert TOKEN not in json.dumps(status) + repr(kube.events)


def test_a_service_account_token_secret_is_never_sent() -> None:
    kube = _kube()
    kube.secrets["robot"] = SecretData("kubernetes.io/service-account-token", {"token": TOKEN})
    with prometheus(_vector) as server:
        forecast = {"prometheus": {"url": server.url, "authSecretRef": {"name": "robot"}}}
        status = asyncio.run(
            _reconciler(kube).reconcile(
                PoolObject("ns", "pool", "uid-1", 1, _spec(forecast=forecast), {})
            )
        )
    assert server.authorizations == [], "nothing was sent"
    invalid = _condition(status, "Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "InvalidSecret")
    assert "ServiceAccount token" in invalid["message"]


def test_a_token_over_plain_http_is_warned_of_in_the_condition() -> None:
    kube = _kube()
    kube.secrets["prom"] = SecretData("Opaque", {"token": TOKEN})
    with prometheus(_vector) as server:
        forecast = {
            "prometheus": {"url": server.url, "authSecretRef": {"name": "prom"}},
            "model": "seasonal_naive",
        }
        rec = _reconciler(kube)
        rec.forecasts.wait_seconds = 5
        pool = PoolObject("ns", "pool", "uid-1", 1, _spec(forecast=forecast), {})
        status = asyncio.run(rec.reconcile(pool))
        rec.forget(pool)
    metrics = _condition(status, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("True", "PlaintextCredentials")
    assert "plain http://" in metrics["message"]
    assert TOKEN not in metrics["message"]
    with source("https://p.example", headers={"Authorization": f"Bearer {TOKEN}"}) as src:
        assert src.warning is None
    with source("http://p.example") as src:
        assert src.warning is None
    with source("http://p.example", basic_auth=("u", "p")) as src:
        assert src.warning is not None


@pytest.mark.parametrize(
    "text",
    [
        f"headers {{'Authorization': 'Bearer {TOKEN}'}}",
        f"Invalid header value b'Bearer {TOKEN}\\r\\nX: 1'",
        f"https://user:{TOKEN}@prom.example/api/v1/query",
        f"GET /api/v1/query?query=up&access_token={TOKEN}",
    ],
)
def test_scrub_removes_credentials_in_the_forms_errors_show_them(text: str) -> None:
    assert TOKEN not in scrub(text)
    assert "[redacted]" in scrub(text)
