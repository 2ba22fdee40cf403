"""A fake inference engine that speaks the OpenAI-compatible API a warm-up uses.

``GET /v1/models`` and ``POST /v1/completions`` on one port, answered by a real HTTP
server (``http.server``, one thread per request). Every request is recorded with the local
address it reached, so one server stands in for many pods: on Linux every ``127.x.y.z``
address reaches a server bound to ``0.0.0.0``, and a fake node whose ``podCIDR`` is a
loopback range gives its kwok pods such addresses. Only loopback peers are answered.

How each address answers is a :class:`Behaviour`, chosen by the longest matching address
prefix (``"127.64.3."``), else the default one::

    with FakeEngine(behaviours={"127.64.3.": Behaviour(completion_status=500)}) as engine:
        ...  # engine.port; engine.completions("127.64.3.2")
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake-llm"


@dataclass
class Behaviour:
    """How the engine answers on one address."""

    models: tuple[str, ...] = (MODEL,)
    """Ids in ``GET /v1/models``."""
    models_status: int = 200
    models_body: bytes | None = None
    """A raw answer to ``GET /v1/models`` instead of the model list."""
    unavailable_first: int = 0
    """``GET /v1/models`` answers 503 this many times first (an engine still loading)."""
    hang_models: bool = False
    """``GET /v1/models`` never answers (until the engine stops)."""
    completion_status: int = 200
    completion_body: bytes | None = None
    """A raw answer to completions instead of a completion."""
    hang: bool = False
    """Completions never answer (until the engine stops)."""
    hold: threading.Event | None = None
    """Completions wait until this is set (a test looks at the pod meanwhile)."""


@dataclass(frozen=True)
class Received:
    """One request the engine received."""

    local: str
    """The address it reached (the pod IP of a pod on a loopback node)."""
    method: str
    path: str
    body: Any
    """The parsed JSON body (``None`` if none)."""
    at: float
    """When it arrived (Unix seconds)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Its headers, names in lower case."""


@dataclass
class _State:
    behaviours: dict[str, Behaviour]
    default: Behaviour
    received: list[Received] = field(default_factory=list)
    models_calls: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def behaviour(self, local: str) -> Behaviour:
        best = ""
        for prefix in self.behaviours:
            if local.startswith(prefix) and len(prefix) > len(best):
                best = prefix
        return self.behaviours[best] if best else self.default


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

        def _local(self) -> str:
            return str(self.connection.getsockname()[0])

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _wait(self, event: threading.Event | None) -> None:
            while not state.stopping.is_set() and not (event is not None and event.is_set()):
                state.stopping.wait(0.05)

        def _record(self, body: Any) -> str:
            local = self._local()
            with state.lock:
                headers = {k.lower(): v for k, v in self.headers.items()}
                received = Received(local, self.command, self.path, body, time.time(), headers)
                state.received.append(received)
            return local

        def _allowed(self) -> bool:
            if ipaddress.ip_address(self.client_address[0]).is_loopback:
                return True
            self._answer(403, b'{"error": "loopback only"}')
            return False

        def do_GET(self) -> None:
            if not self._allowed():
                return
            local = self._record(None)
            if self.path != "/v1/models":
                self._answer(404, b'{"error": "not found"}')
                return
            how = state.behaviour(local)
            with state.lock:
                calls = state.models_calls[local] = state.models_calls.get(local, 0) + 1
            if how.hang_models:
                self._wait(None)
                return
            if calls <= how.unavailable_first:
                self._answer(503, b'{"error": "loading"}')
                return
            body = how.models_body
            if body is None:
                data = [{"id": m, "object": "model", "owned_by": "fake"} for m in how.models]
                body = json.dumps({"object": "list", "data": data}).encode()
            self._answer(how.models_status, body)

        def do_POST(self) -> None:
            if not self._allowed():
                return
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                payload = json.loads(raw) if raw else None
            except ValueError:
                payload = None
            local = self._record(payload)
            if self.path != "/v1/completions":
                self._answer(404, b'{"error": "not found"}')
                return
            how = state.behaviour(local)
            if how.hang:
                self._wait(None)
                return
            if how.hold is not None:
                self._wait(how.hold)
            body = how.completion_body
            if body is None:
                model = payload.get("model") if isinstance(payload, dict) else None
                body = json.dumps(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": model,
                        "choices": [{"index": 0, "text": " ", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                    }
                ).encode()
            self._answer(how.completion_status, body)

    return Handler


class FakeEngine:
    """The server; see the module docstring. Stop it (or use ``with``) to end every
    request it still holds."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        default: Behaviour | None = None,
        behaviours: Mapping[str, Behaviour] | None = None,
    ) -> None:
        self._state = _State(dict(behaviours or {}), default or Behaviour())
        self._server = ThreadingHTTPServer((host, port), _handler(self._state))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> FakeEngine:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._state.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_behaviour(self, prefix: str, behaviour: Behaviour) -> None:
        with self._state.lock:
            self._state.behaviours[prefix] = behaviour

    def requests(self, local: str | None = None) -> list[Received]:
        """Requests received (on ``local`` only, if given), oldest first."""
        with self._state.lock:
            return [r for r in self._state.received if local is None or r.local == local]

    def completions(self, local: str | None = None) -> list[Received]:
        return [r for r in self.requests(local) if r.method == "POST"]
