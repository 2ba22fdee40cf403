"""A fault-injecting HTTP proxy in front of a real Prometheus, switchable at runtime.

``FaultProxy(upstream_url)`` listens on a free loopback port (``proxy.url``) and forwards
every request to the upstream Prometheus, unless a fault is set with ``proxy.set(mode)``:

* ``pass``: pass-through.
* ``unreachable``: the port is closed (connection refused) until another mode is set.
* ``slow``: every answer waits ``slow_seconds`` first (longer than a client's timeout).
* ``http500``: ``500 Internal Server Error`` with Prometheus' error envelope.
* ``garbage``: ``200`` with a body that is not JSON.
* ``nan``: the upstream answer, every sample value replaced by ``NaN`` or ``+Inf``
  (alternating): valid JSON, garbage numbers.
* ``gaps``: the upstream answer with samples dropped: every other sample of a range
  answer, and every sample of an instant answer (a scrape gap at "now").
* ``vanish``: every series gone: a successful answer with an empty result.

``proxy.set(mode, only="/api/v1/query_range")`` applies the fault to the requests whose
path starts with ``only`` (there, range queries: history) and passes the others.
``requests`` counts the requests answered per mode. Use it as a context manager, or call
``close()``: the listening socket and the serving thread are always released.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

from . import procs

Mode = Literal["pass", "unreachable", "slow", "http500", "garbage", "nan", "gaps", "vanish"]
MODES: tuple[Mode, ...] = (
    "pass",
    "unreachable",
    "slow",
    "http500",
    "garbage",
    "nan",
    "gaps",
    "vanish",
)


def _rewrite(body: bytes, mode: Mode) -> bytes:
    """The upstream JSON answer with its samples made NaN/Inf, thinned or removed."""
    try:
        answer = json.loads(body)
        data = answer["data"]
        result = data["result"]
    except (ValueError, KeyError, TypeError):
        return body
    if mode == "vanish":
        data["result"] = []
    elif isinstance(result, list):
        for series in result:
            if not isinstance(series, dict):
                continue
            if "values" in series:
                values = series["values"]
                if mode == "nan":
                    series["values"] = [
                        [ts, "NaN" if i % 2 == 0 else "+Inf"] for i, (ts, _) in enumerate(values)
                    ]
                elif mode == "gaps":
                    series["values"] = values[::2]
            elif "value" in series and mode == "nan":
                series["value"] = [series["value"][0], "NaN"]
        if mode == "gaps":
            data["result"] = [s for s in result if isinstance(s, dict) and "values" in s]
    return json.dumps(answer).encode()


class FaultProxy:
    """See the module docstring."""

    def __init__(self, upstream: str, *, slow_seconds: float = 30.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.slow_seconds = slow_seconds
        self.port = procs.free_port()
        self.mode: Mode = "pass"
        self.only: str | None = None
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ control
    def set(self, mode: Mode, only: str | None = None) -> None:
        """Switch the fault (on the paths starting with ``only``, if given); ``unreachable``
        closes the port, any other mode reopens it."""
        if mode == "unreachable" and only is not None:
            raise ValueError("a closed port closes every path")
        with self._lock:
            self.mode, self.only = mode, only
            if mode == "unreachable":
                self._shutdown()
            elif self._server is None:
                self._listen()

    def close(self) -> None:
        self._closing.set()  # releases requests held by ``slow``
        with self._lock:
            self._shutdown()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ server
    def _listen(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy._handle(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                proxy._handle(self, self.rfile.read(length))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
        thread.start()
        self._server, self._thread = server, thread

    def _shutdown(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(10)

    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        mode = self.mode
        if self.only is not None and not handler.path.startswith(self.only):
            mode = "pass"
        self.requests[mode] += 1
        if mode == "slow":
            self._closing.wait(self.slow_seconds)
        if mode == "http500":
            error = {"status": "error", "errorType": "internal", "error": "injected fault"}
            self._reply(handler, 500, json.dumps(error).encode())
            return
        if mode == "garbage":
            self._reply(handler, 200, b"<html>\x00 this is not prometheus {{{", "text/html")
            return
        status, payload = self._forward(handler, body)
        if status == 200 and mode in ("nan", "gaps", "vanish"):
            payload = _rewrite(payload, mode)
        self._reply(handler, status, payload)

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.upstream + handler.path, data=body, method=handler.command
        )
        content_type = handler.headers.get("Content-Type")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return int(answer.status), bytes(answer.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())
        except OSError as exc:
            return 502, str(exc).encode()

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: bytes,
        content_type: str = "application/json",
    ) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client gave up (timed out): nothing to answer
