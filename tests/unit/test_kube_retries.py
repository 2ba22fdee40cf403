"""The Kubernetes adapter retries what is worth retrying: 429 (obeying Retry-After), 5xx and
dropped connections always, 409 only on absolute writes, and a create whose first attempt
may have landed. Others fail at once, typed. No network: the API calls are stand-ins."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from prescaler.kube import KubeClient, KubeError, NotFound, ObjectRef

BACKOFFS = (0.2, 0.5, 1.0)


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


def _error(status: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="Injected")
    exc.headers = {"Retry-After": retry_after} if retry_after else {}
    exc.body = json.dumps({"message": f"injected {status}"})
    return exc


def _api(answers: list[BaseException | dict[str, Any]]) -> Callable[..., Any]:
    """An API call that raises or answers each of ``answers`` in turn."""

    def call(*args: Any, **kwargs: Any) -> Response:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return Response(answer)

    return call


def _run(
    answers: list[BaseException | dict[str, Any]], monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> tuple[Any, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("prescaler.kube._client.asyncio.sleep", sleep)
    kube = KubeClient(client.ApiClient(), threads=1, backoffs=BACKOFFS)
    try:
        return asyncio.run(kube._call(_api(answers), **kw)), slept
    finally:
        kube.close()


CASES = {
    "429 with Retry-After": ([_error(429, "3"), {"ok": 1}], {}, [3.0]),
    "429 with a huge Retry-After": ([_error(429, "86400"), {"ok": 1}], {}, [30.0]),
    "500 then 503": ([_error(500), _error(503), {"ok": 1}], {}, [0.2, 0.5]),
    "a dropped connection": ([ProtocolError("reset"), {"ok": 1}], {}, [0.2]),
    "409 on an absolute write": ([_error(409), {"ok": 1}], {"conflicts": True}, [0.2]),
    "409 on a retried create": ([_error(503), _error(409)], {"created": True}, [0.2]),
}


@pytest.mark.parametrize(("answers", "kw", "waits"), CASES.values(), ids=list(CASES))
def test_transient_failures_are_retried(
    answers: list[Any], kw: dict[str, Any], waits: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    result, slept = _run(list(answers), monkeypatch, **kw)
    assert result in ({"ok": 1}, None)
    assert len(slept) == len(waits)
    for got, base in zip(slept, waits, strict=True):
        if base in (3.0, 30.0):
            assert got == base, "Retry-After is obeyed as given (capped)"
        else:
            assert 0.75 * base <= got <= 1.25 * base, "backoff with jitter"


FAILURES = {
    "409 on a create or replace": ([_error(409)], {}, KubeError),
    "409 on a first create": ([_error(409)], {"created": True}, KubeError),
    "403": ([_error(403)], {"conflicts": True}, KubeError),
    "404": ([_error(404)], {}, NotFound),
    "500 beyond the retries": ([_error(500)] * (len(BACKOFFS) + 1), {}, KubeError),
}


@pytest.mark.parametrize(("answers", "kw", "error"), FAILURES.values(), ids=list(FAILURES))
def test_other_failures_are_typed_and_not_retried_beyond_the_budget(
    answers: list[Any], kw: dict[str, Any], error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = list(answers)
    with pytest.raises(error) as caught:
        _run(answers, monkeypatch, **kw)
    assert "injected" in str(caught.value)
    assert not answers, "one attempt, or exactly the retries: every answer was used"


def test_an_event_that_cannot_be_posted_does_not_fail_the_reconcile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def sleep(seconds: float) -> None:
        pass

    monkeypatch.setattr("prescaler.kube._client.asyncio.sleep", sleep)
    kube = KubeClient(client.ApiClient(), threads=1, backoffs=BACKOFFS)
    calls: list[Any] = []

    def create(*args: Any, **kwargs: Any) -> Response:
        calls.append(args)
        raise _error(503)

    monkeypatch.setattr(kube.core, "create_namespaced_event", create)
    try:
        ref = ObjectRef("prescaler.io/v1alpha1", "InferencePool", "p", "ns", "uid")
        asyncio.run(kube.post_event(ref, "Normal", "ScaledUp", "1 -> 3"))
    finally:
        kube.close()
    assert len(calls) == len(BACKOFFS) + 1
