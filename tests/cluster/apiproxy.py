"""A fault-injecting proxy in front of the real kube-apiserver, for API server fault tests.

It listens on plain HTTP on loopback and forwards every request over TLS with the admin
client certificate, streaming answers (watches too). Rules, switched on and off while it
runs, answer matching requests themselves instead (a 409, a 429 with ``Retry-After``, a
500 or 503 as a Kubernetes ``Status``), or cut a watch stream mid-way (the connection is
closed without the end of the chunked body). A ``mute`` rule swallows a watch stream's
events until it is lifted, then cuts it: a watch gap whose events are lost. A ``gone``
rule answers a watch with the API server's ``410 Gone`` (resource version too old) as its
one event, which makes a client list again. Each rule fires a set number of times, then
lets requests through. Every request is logged with what happened to it.

Usage::

    with ApiProxy.start_for(cluster.kubeconfig, tmp_path) as proxy:
        proxy.kubeconfig            # points clients at the proxy (no credentials needed)
        rule = proxy.add(Rule("PATCH", r"/deployments/[^/]+/scale$", status=409, times=3))
        ...
        rule.fired                  # how many times it answered
        proxy.seen()                # every request: method, path, status, injected or not
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import aiohttp
import yaml
from aiohttp import web

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)
TLS_CLOSE_GRACE_SECONDS = 0.25
"""How long a stop lets closing TLS transports finish."""
POLL_SECONDS = 0.2
"""How often a relayed stream looks for a drop rule that should cut it."""
REASONS = {
    409: "Conflict",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass
class Rule:
    """Answer (or cut) the next ``times`` requests matching ``method`` and ``path``."""

    method: str | None
    """HTTP method, or ``None`` for any."""
    path: str
    """A regular expression searched in the request path (without the query)."""
    status: int = 0
    """The answer's HTTP status; 0 with ``action="drop"``."""
    times: int = 1
    """How many matching requests it takes; then they pass."""
    action: Literal["answer", "drop", "mute", "gone", "hang"] = "answer"
    """``answer``: reply ``status`` without forwarding; ``drop``: forward, relay the stream
    for ``drop_after`` seconds, then close the connection mid-stream; ``mute``: forward,
    relay nothing of the stream until :attr:`lifted`, then close it mid-stream; ``gone``:
    reply ``200`` to a watch with one ``ERROR`` event of code 410, then end it; ``hang``:
    accept the request and answer nothing until :attr:`lifted` (or the proxy stops), then
    close the connection (a dead peer that still holds the connection open)."""
    lifted: bool = False
    """``mute``: set to end the gap (the muted streams are then cut); ``hang``: set to
    close the connections it holds."""
    watch: bool | None = None
    """Match only watch requests (True), only others (False), or both (None)."""
    retry_after: int | None = None
    """``Retry-After`` seconds on the answer (and ``details.retryAfterSeconds``)."""
    drop_after: float = 1.0
    """``drop``: seconds of the stream relayed before the cut."""
    fired: int = 0
    """How many requests it took so far."""
    fired_at: list[float] = field(default_factory=list)
    """When (monotonic seconds) it took each."""

    def matches(self, method: str, path: str, watch: bool) -> bool:
        return (
            self.fired < self.times
            and (self.method is None or self.method == method)
            and (self.watch is None or self.watch == watch)
            and re.search(self.path, path) is not None
        )

    @property
    def exhausted(self) -> bool:
        return self.fired >= self.times


@dataclass(frozen=True)
class Seen:
    """One request through the proxy."""

    at: float
    """Monotonic seconds when it arrived."""
    method: str
    path: str
    query: str
    status: int
    """The status the client got (the injected one, or the API server's)."""
    injected: str | None
    """The action of the rule that took it (``answer``, ``drop``, ``mute``, ``gone``,
    ``hang``), else ``None``."""
    body: bytes = b""
    """The request body (writes)."""


class ApiProxy:
    """See the module docstring. Start with :meth:`start_for`; stop with :meth:`stop`."""

    def __init__(self, upstream: str, ssl_context: ssl.SSLContext, work_dir: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._ssl = ssl_context
        self._dir = work_dir
        self._rules: list[Rule] = []
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="apiproxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self.kubeconfig = work_dir / "proxy-kubeconfig"

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def start_for(cls, kubeconfig: Path, work_dir: Path) -> ApiProxy:
        """A running proxy for the API server and admin credentials of ``kubeconfig``."""
        doc = yaml.safe_load(kubeconfig.read_text())
        cluster = doc["clusters"][0]["cluster"]
        user = doc["users"][0]["user"]
        work_dir.mkdir(parents=True, exist_ok=True)
        files = {}
        for key, name in (
            ("certificate-authority-data", "ca.crt"),
            ("client-certificate-data", "client.crt"),
            ("client-key-data", "client.key"),
        ):
            source = cluster if key.startswith("certificate-authority") else user
            path = work_dir / name
            path.write_bytes(base64.b64decode(source[key]))
            path.chmod(0o600)
            files[name] = path
        context = ssl.create_default_context(cafile=str(files["ca.crt"]))
        context.load_cert_chain(str(files["client.crt"]), str(files["client.key"]))
        proxy = cls(cluster["server"], context, work_dir)
        proxy.start()
        return proxy

    def start(self) -> None:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        except BaseException:
            self.stop()
            raise
        self._write_kubeconfig()

    def stop(self) -> None:
        """Close every connection, the server and the client session; end the thread."""
        if not self._thread.is_alive():
            return
        with self._lock:
            for rule in self._rules:
                rule.lifted = True  # a hung request lets its connection go
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> ApiProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --------------------------------------------------------------------- rules
    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    # ------------------------------------------------------------------ internals
    def _write_kubeconfig(self) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }
        self.kubeconfig.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        # The upstream TLS transports of streams cut at the cleanup (a watch still open)
        # finish closing only in later turns of the loop (aiohttp's graceful shutdown).
        await asyncio.sleep(TLS_CLOSE_GRACE_SECONDS)

    def _take(self, method: str, path: str, watch: bool, action: str | None = None) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path, watch) and action in (None, rule.action):
                    rule.fired += 1
                    rule.fired_at.append(time.monotonic())
                    return rule
        return None

    def _log(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        body = await request.read()
        method, path = request.method, request.path
        watch = request.query.get("watch") in ("true", "1")
        rule = self._take(method, path, watch)

        def log(status: int, injected: str | None) -> None:
            self._log(Seen(arrived, method, path, request.query_string, status, injected, body))

        if rule is not None and rule.action == "answer":
            log(rule.status, "answer")
            return _status_answer(rule)
        if rule is not None and rule.action == "gone":
            log(200, "gone")
            return _gone_answer()
        if rule is not None and rule.action == "hang":
            log(0, "hang")
            while not rule.lifted:
                await asyncio.sleep(POLL_SECONDS)
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=504)  # never reaches the client: the connection is gone
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(
            method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body or None,
            # Forwarded as sent: no Content-Type of aiohttp's own where the client sent none.
            skip_auto_headers=("Content-Type",),
        ) as upstream:
            log(upstream.status, rule.action if rule is not None else None)
            answer = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await answer.prepare(request)
            # A drop or mute rule takes a stream when it starts or, for a long watch
            # already open when the rule was added, while it runs.
            muted = rule if rule is not None and rule.action == "mute" else None
            cut_at = arrived + rule.drop_after if rule is not None and muted is None else None
            while True:
                if cut_at is None and muted is None and watch:
                    late = self._take(method, path, watch, "drop")
                    if late is not None:
                        cut_at = time.monotonic() + late.drop_after
                    else:
                        muted = self._take(method, path, watch, "mute")
                if muted is not None and muted.lifted:
                    cut_at = time.monotonic()
                if cut_at is not None and time.monotonic() >= cut_at:
                    # Cut: close the connection before the chunked body's end.
                    if request.transport is not None:
                        request.transport.abort()
                    return answer
                try:
                    chunk = await asyncio.wait_for(upstream.content.readany(), POLL_SECONDS)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                if muted is None:
                    await answer.write(chunk)
            await answer.write_eof()
            return answer


def _gone_answer() -> web.Response:
    """A watch answered as the API server does when its resource version is too old."""
    event = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "injected by the test's API proxy: too old resource version",
            "reason": "Expired",
            "code": 410,
        },
    }
    return web.Response(
        status=200, body=json.dumps(event).encode() + b"\n", content_type="application/json"
    )


def _status_answer(rule: Rule) -> web.Response:
    reason = REASONS.get(rule.status, "InternalError")
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"injected by the test's API proxy: {rule.status} {reason}",
        "reason": reason,
        "code": rule.status,
    }
    headers = {}
    if rule.retry_after is not None:
        headers["Retry-After"] = str(rule.retry_after)
        status["details"] = {"retryAfterSeconds": rule.retry_after}
    return web.Response(
        status=rule.status,
        body=json.dumps(status).encode(),
        content_type="application/json",
        headers=headers,
    )
