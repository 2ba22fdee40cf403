"""A list-and-watch of custom objects with a server-side label selector, in a thread.

kopf filters a handler's ``labels=`` on the client: every event of every object is read
and decoded first. :class:`ObjectStream` asks the API server for the selected objects
only (``labelSelector``), so a replica that serves a few shards decodes the events of
their pools alone. One stream is one connection, read by a thread of its own (the
blocking client reads no faster than the server sends), which hands each decoded batch
to the event loop.

The protocol is the API server's:

- a paged list (``limit``/``continue``), delivered as one ``listed`` batch with its
  ``resourceVersion``;
- a watch from that version with bookmarks (``allowWatchBookmarks``), which only move the
  version on; a watch that ends (the server's ``timeoutSeconds``) or breaks resumes from
  the last version seen, after a backoff if it broke;
- ``410 Gone`` (the version is older than the server keeps, as an HTTP answer or as an
  ``ERROR`` event) starts over with a fresh list: the consumer compares that list with
  what it had, since objects deleted in the gap send no ``DELETED`` event.

An object that stops matching the selector (its label changed) arrives as ``DELETED``
with its new labels, as one that was deleted arrives with its last ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("prescaler.watch")

WATCH_TIMEOUT_SECONDS = 300
"""The server ends each watch request after this long; the stream resumes at once."""
BACKOFF_SECONDS = (0.5, 30.0)
"""The first and the longest wait before a broken list or watch is tried again."""
PAGE = 500


@dataclass(frozen=True, slots=True)
class Listed:
    """A complete list of the selected objects (the first, or one after ``410 Gone``)."""

    items: tuple[dict[str, Any], ...]
    relist: bool
    """Not the stream's first list: objects the consumer had may be gone without an event."""


@dataclass(frozen=True, slots=True)
class Event:
    """One watch event: ``ADDED``, ``MODIFIED`` or ``DELETED`` and the object."""

    type: str
    object: dict[str, Any]


@dataclass
class ObjectStream:
    """List, then watch, the objects of ``plural`` that ``selector`` selects in
    ``namespace`` (``None``: all namespaces) until :meth:`stop`; ``deliver`` gets every
    :class:`Listed` and :class:`Event` on the event loop that called :meth:`start`."""

    api_client: client.ApiClient
    group: str
    version: str
    plural: str
    namespace: str | None
    selector: str
    deliver: Callable[[Listed | Event], None]
    timeout_seconds: int = WATCH_TIMEOUT_SECONDS
    backoff: tuple[float, float] = BACKOFF_SECONDS
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _response: Any = None
    _loop: asyncio.AbstractEventLoop | None = None
    lists: int = 0
    """Lists made (the first, and one per ``410 Gone``)."""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"watch {self.plural} {self.selector}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """End the stream (no delivery after this returns) and close its connection; the
        thread ends once its read returns."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # interrupts the blocked read (urllib3 2.3+)
            with contextlib.suppress(Exception):
                response.release_conn()

    async def wait_stopped(self, timeout: float = 10.0) -> None:
        """Wait (without blocking the loop) for the thread to end."""
        thread = self._thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, timeout)

    # ------------------------------------------------------------------ thread
    def _emit(self, item: Listed | Event) -> None:
        loop = self._loop
        if loop is None or self._stop.is_set():
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(self._deliver, item)

    def _deliver(self, item: Listed | Event) -> None:
        if not self._stop.is_set():
            self.deliver(item)

    def _get(self, read_timeout: float, **query: Any) -> Any:
        """The raw response of a list (or, with ``watch=True``, a watch) request."""
        api = client.CustomObjectsApi(self.api_client)
        args: dict[str, Any] = {
            "label_selector": self.selector,
            "_preload_content": False,
            "_request_timeout": (10.0, read_timeout),
            **query,
        }
        if self.namespace is None:
            return api.list_cluster_custom_object(self.group, self.version, self.plural, **args)
        return api.list_namespaced_custom_object(
            self.group, self.version, self.namespace, self.plural, **args
        )

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query: dict[str, Any] = {"limit": PAGE}
            if token:
                query["_continue"] = token
            response = self._get(60.0, **query)
            try:
                page = json.loads(response.data)
            finally:
                response.release_conn()
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                self.lists += 1
                return items, str(meta.get("resourceVersion") or "")

    def _watch(self, since: str) -> str | None:
        """Watch from ``since`` until the request ends; the last version seen, or ``None``
        after ``410 Gone``."""
        response = self._get(
            self.timeout_seconds + 30.0,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=since,
            timeout_seconds=self.timeout_seconds,
        )
        self._response = response
        try:
            if self._stop.is_set():
                return since
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    since = str(version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._emit(Event(str(kind), obj))
            return since
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()

    def _run(self) -> None:
        since: str | None = None
        first = True
        wait = self.backoff[0]
        while not self._stop.is_set():
            try:
                if since is None:
                    items, since = self._list()
                    self._emit(Listed(tuple(items), relist=not first))
                    first = False
                since = self._watch(since)
                wait = self.backoff[0]
            except ApiException as exc:
                if exc.status == 410:
                    since = None
                    continue
                log.warning("watch of %s (%s) failed: %s", self.plural, self.selector, exc)
                wait = self._pause(wait)
            except Exception as exc:  # a broken connection, a timeout: resume
                if self._stop.is_set():
                    break
                log.warning("watch of %s (%s) broke: %s", self.plural, self.selector, exc)
                wait = self._pause(wait)

    def _pause(self, wait: float) -> float:
        self._stop.wait(wait * random.uniform(0.8, 1.2))
        return min(self.backoff[1], wait * 2)


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}
