"""The HTTP transport under the Prometheus client: every answer bounded, every error clean.

The URL of a pool's Prometheus is the pool author's choice, so its answers are untrusted:

* **A byte cap.** The body is streamed and dropped past ``max_bytes`` (a ``Content-Length``
  above it is refused before the body is read): a huge answer costs the operator at most
  that much memory, never the container.
* **A total deadline.** ``requests``' ``timeout`` bounds each socket read, so an answer
  dripped a byte at a time would hold a shared thread for ever. Here the ``timeout`` a
  call passes is the deadline of the whole answer (connect, headers and body): at the
  deadline the connection's socket is shut down from a watchdog thread, which ends any
  read blocked on it.
* **Error bodies cut down.** A non-2xx answer raises :class:`AnswerError` with the HTTP
  status and a short, sanitized detail: Prometheus' own ``errorType`` and ``error``
  (cut to :data:`ERROR_DETAIL_CHARS`) when the body is its JSON envelope, else the
  body's first characters without control characters. A proxy's page or a body that
  echoes the request never reaches a status whole.

:func:`scrub` removes credentials from any text before it reaches a status, an Event or a
log: the request's own secrets, ``Authorization`` values, bearer and basic credentials,
passwords in URLs and token-like query parameters.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

ERROR_DETAIL_CHARS = 256
"""An error answer's detail is cut to this many characters."""
CHUNK_BYTES = 64 * 1024

REDACTED = "[redacted]"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_PATTERNS = (
    # An Authorization header, as a header dict, JSON or a "Name: value" line shows it.
    re.compile(r"(?i)(\bauthorization['\"]?\s*[:=]\s*['\"]?)[^'\",}\r\n]*"),
    # Bearer and basic credentials wherever they appear (also repr-escaped: \r\n stays \S).
    re.compile(r"(?i)(\bbearer\s+)\S+"),
    re.compile(r"(?i)(\bbasic\s+)[A-Za-z0-9+/=]{8,}"),
    # user:password@ in a URL.
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s@]+@"),
    # Token-like query parameters.
    re.compile(
        r"(?i)([?&](?:access_token|token|api_key|apikey|password|passwd|secret)=)[^&\s'\"]*"
    ),
)


def scrub(text: str, secrets: Iterable[str] = (), *, limit: int = 1000) -> str:
    """``text`` fit for a status, an Event or a log: credentials replaced by
    ``[redacted]`` (each of ``secrets``, also as ``repr`` escapes it, and the patterns
    above), control characters by a space, cut to ``limit`` characters."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        for form in {secret, repr(secret)[1:-1], *_CONTROL.split(secret)}:
            if len(form) >= 4:  # a shorter piece would redact ordinary words
                text = text.replace(form, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class AnswerTooLarge(requests.RequestException):
    """The answer is larger than the byte cap."""


class AnswerDeadline(requests.Timeout):
    """The whole answer did not arrive by its deadline."""


class AnswerError(requests.HTTPError):
    """A non-2xx answer: its status and a short, sanitized detail."""

    def __init__(self, status: int, error_type: str | None, detail: str) -> None:
        kind = f"{error_type}: " if error_type else ""
        super().__init__(f"HTTP {status}: {kind}{detail}" if detail or kind else f"HTTP {status}")
        self.status = status
        self.error_type = error_type
        self.detail = detail


def error_detail(body: bytes) -> tuple[str | None, str]:
    """Prometheus' ``errorType`` and ``error`` from an error body (its JSON envelope),
    or no type and the body's first characters; either cut and without control chars."""
    text = body[: 4 * ERROR_DETAIL_CHARS].decode("utf-8", errors="replace")
    try:
        envelope = json.loads(body) if len(body) <= 64 * 1024 else None
    except ValueError:
        envelope = None
    if isinstance(envelope, dict) and isinstance(envelope.get("error"), str):
        kind = envelope.get("errorType")
        error_type = scrub(kind, limit=32) if isinstance(kind, str) and kind else None
        return error_type, scrub(envelope["error"], limit=ERROR_DETAIL_CHARS)
    return None, scrub(text, limit=ERROR_DETAIL_CHARS)


# ---------------------------------------------------------------------- the deadline
class _Watch:
    """One answer's deadline: the connection it uses, shut down when it passes."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.connection: HTTPConnection | None = None
        self.expired = False
        self.finished = False
        self._lock = threading.Lock()

    def expire(self) -> None:
        with self._lock:  # not while the connection goes back to the pool (finish first)
            if self.finished:
                return
            self.expired = True
            sock = getattr(self.connection, "sock", None)
            if sock is not None:
                # shutdown, not close: it wakes a read blocked on it in another thread
                with contextlib.suppress(OSError, TypeError, ValueError):
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def finish(self) -> None:
        with self._lock:
            self.finished = True


class _Watchdog:
    """One daemon thread that expires watches at their deadlines (a heap, not a timer
    thread per request)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, watch: _Watch) -> None:
        with self._wake:
            heapq.heappush(self._heap, (watch.deadline, next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="prometheus-deadlines", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    if self._heap:
                        self._wake.wait(self._heap[0][0] - time.monotonic())
                    else:
                        self._wake.wait()
                _, _, watch = heapq.heappop(self._heap)
            watch.expire()


_WATCHDOG = _Watchdog()
_CURRENT = threading.local()
"""The watch of the answer this thread is waiting for."""


class _WatchedHTTPConnection(HTTPConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        watch: _Watch | None = getattr(_CURRENT, "watch", None)
        if watch is not None:
            watch.connection = self
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        watch: _Watch | None = getattr(_CURRENT, "watch", None)
        if watch is not None:
            watch.connection = self
        super().request(*args, **kwargs)


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedTLSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class BoundedAdapter(HTTPAdapter):
    """``requests``' adapter on connections a deadline can shut down."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedPool, "https": _WatchedTLSPool}


# ---------------------------------------------------------------------- the session
class BoundedSession(requests.Session):
    """A session whose every answer is capped at ``max_bytes``, arrives whole within the
    ``timeout`` its call passes (a total deadline, not a per-read timeout), and raises
    :class:`AnswerError` when its status is not 2xx. Mount :class:`BoundedAdapter` on
    its URL."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = int(max_bytes)
        self.mount("http://", BoundedAdapter())
        self.mount("https://", BoundedAdapter())

    def request(
        self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any
    ) -> requests.Response:
        timeout = kwargs.pop("timeout", None)
        kwargs["stream"] = True
        if timeout is None:
            return self._read(super().request(method, url, *args, **kwargs), None)
        total = float(timeout)
        watch = _Watch(time.monotonic() + total)
        _WATCHDOG.add(watch)
        _CURRENT.watch = watch
        try:
            kwargs["timeout"] = total  # also each read's and the connect's
            response = super().request(method, url, *args, **kwargs)
            response = self._read(response, watch)
            if watch.expired:  # a connection-delimited body ends at the shutdown
                raise AnswerDeadline(f"no whole answer within {total:g}s")
            return response
        except (requests.RequestException, OSError):
            if watch.expired:
                raise AnswerDeadline(f"no whole answer within {total:g}s") from None
            raise
        finally:
            watch.finish()
            _CURRENT.watch = None

    def _read(self, response: requests.Response, watch: _Watch | None) -> requests.Response:
        """The body read into ``response`` (at most ``max_bytes``); a non-2xx answer
        raised as :class:`AnswerError`. The watch ends before the connection goes back
        to the pool, so a late deadline never shuts down a connection another call took."""
        try:
            if response.raw is not None:  # else an adapter that answered whole
                length = response.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > self.max_bytes:
                    raise AnswerTooLarge(self._too_large())
                body = bytearray()
                for chunk in response.iter_content(CHUNK_BYTES):
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise AnswerTooLarge(self._too_large())
                response._content = bytes(body)
        finally:
            if watch is not None:
                watch.finish()
            if response.raw is not None:
                response.close()
        if not 200 <= response.status_code < 300:
            error_type, detail = error_detail(response.content or b"")
            raise AnswerError(response.status_code, error_type, detail)
        return response

    def _too_large(self) -> str:
        return f"the answer is larger than {self.max_bytes} bytes"
