"""A fake list-and-watch stream for the pool watches' tests: it records its scope,
selector and life, and a test calls its ``deliver`` with what the API server would send."""

from __future__ import annotations

from collections.abc import Callable


class FakeStream:
    def __init__(self, scope: str | None, selector: str, deliver: Callable[..., None]) -> None:
        self.scope, self.selector, self.deliver = scope, selector, deliver
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    async def wait_stopped(self, timeout: float = 10.0) -> None:
        return None
