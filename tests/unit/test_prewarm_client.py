"""The warm-up client against a real local HTTP server that speaks the completion API
(``cluster.fake_engine``): answers, errors, garbage, hangs, the budget and model discovery.
Every case also checks that the client left no connection or session open."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.fake_engine import MODEL, Behaviour, FakeEngine
from prescaler.prewarm import FAILED, PREWARMED, TIMED_OUT, WarmupConfig, WarmupResult, warm_up

PROMPTS = ("You are a helpful assistant.", "You are a code reviewer.", "Summarize:")


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with FakeEngine() as server:
        yield server


def _warm(engine_port: int, **config: Any) -> WarmupResult:
    settings: dict[str, Any] = {"prompts": PROMPTS, "port": engine_port, "timeout_seconds": 30.0}
    settings.update(config)
    result = asyncio.run(warm_up("127.0.0.1", WarmupConfig(**settings), poll_seconds=0.05))
    _no_leaks()
    return result


def _no_leaks() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks


@pytest.mark.parametrize(("budget", "sent"), [(1, 1), (2, 2), (8, 3)])
def test_each_prompt_once_in_order_with_max_tokens_1_within_the_budget(
    engine: FakeEngine, budget: int, sent: int
) -> None:
    result = _warm(engine.port, max_requests=budget)
    assert result.reason == PREWARMED
    assert (result.sent, result.answered, result.model) == (sent, sent, MODEL)
    assert f"{sent} warm-up requests answered by model {MODEL}" in result.message
    requests = engine.requests()
    assert [(r.method, r.path) for r in requests] == [("GET", "/v1/models")] + [
        ("POST", "/v1/completions")
    ] * sent
    bodies = [r.body for r in engine.completions()]
    assert bodies == [
        {"model": MODEL, "prompt": p, "max_tokens": 1, "temperature": 0} for p in PROMPTS[:sent]
    ]


def test_the_model_is_the_first_listed_unless_the_spec_names_one(engine: FakeEngine) -> None:
    engine.set_behaviour("127.", Behaviour(models=("first", "second")))
    assert _warm(engine.port, max_requests=1).model == "first"
    named = _warm(engine.port, max_requests=1, model="served-name")
    assert named.reason == PREWARMED
    assert named.model == "served-name"
    assert engine.completions()[-1].body["model"] == "served-name"


def test_an_engine_without_a_model_list_needs_the_model_named(engine: FakeEngine) -> None:
    engine.set_behaviour("127.", Behaviour(models_status=404, models_body=b'{"detail":"no"}'))
    result = _warm(engine.port)
    assert result.reason == FAILED
    assert "GET /v1/models answered 404" in result.message
    assert "set spec.prewarm.model" in result.message
    assert engine.completions() == []
    named = _warm(engine.port, model="llama", max_requests=2)
    assert (named.reason, named.answered) == (PREWARMED, 2)


def test_an_engine_still_loading_is_polled_until_it_answers(engine: FakeEngine) -> None:
    engine.set_behaviour("127.", Behaviour(unavailable_first=3))
    result = _warm(engine.port, max_requests=1)
    assert result.reason == PREWARMED
    gets = [r for r in engine.requests() if r.method == "GET"]
    assert len(gets) == 4
    assert result.sent == 1, "polls are not counted against the budget"


def test_errors_fail_the_warm_up_and_every_prompt_is_still_tried(engine: FakeEngine) -> None:
    engine.set_behaviour("127.", Behaviour(completion_status=500, completion_body=b"CUDA OOM"))
    result = _warm(engine.port)
    assert result.reason == FAILED
    assert (result.sent, result.answered) == (3, 0)
    assert "3 of 3 warm-up requests failed (first: HTTP 500: CUDA OOM)" in result.message


@pytest.mark.parametrize(
    ("behaviour", "says"),
    [
        (Behaviour(completion_body=b"<html>hello</html>"), "not a completion: <html>hello</html>"),
        (Behaviour(completion_body=b'{"choices": []}'), "not a completion"),
        (Behaviour(completion_body=b""), "not a completion: an empty body"),
        (Behaviour(models_body=b"[1, 2]"), "answered no model id"),
        (Behaviour(models_body=b"\xff\xfe garbage"), "answered no model id"),
        (Behaviour(models_status=401, models_body=b"no key"), "answered 401 (no key)"),
    ],
    ids=["html", "no-choices", "empty", "model-list-not-an-object", "model-list-binary", "401"],
)
def test_garbage_answers_fail_the_warm_up_with_what_was_seen(
    engine: FakeEngine, behaviour: Behaviour, says: str
) -> None:
    engine.set_behaviour("127.", behaviour)
    result = _warm(engine.port)
    assert result.reason == FAILED
    assert says in result.message


def test_a_hanging_engine_times_out_with_where_it_hung(engine: FakeEngine) -> None:
    engine.set_behaviour("127.", Behaviour(hang=True))
    result = _warm(engine.port, timeout_seconds=1.0)
    assert result.reason == TIMED_OUT
    assert "not done within 1 s: waiting for warm-up request 1 to be answered" in result.message
    assert (result.sent, result.answered) == (1, 0)


def test_an_engine_that_never_answers_times_out_naming_the_last_problem() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _warm(port, timeout_seconds=1.0)
    assert result.reason == TIMED_OUT
    assert "waiting for the engine to answer; last: GET /v1/models" in result.message
    assert result.sent == 0


def test_a_cancelled_warm_up_closes_its_connection(engine: FakeEngine) -> None:
    engine.set_behaviour("127.", Behaviour(hang=True))

    async def cancel_while_hung() -> None:
        config = WarmupConfig(prompts=PROMPTS, port=engine.port, timeout_seconds=60.0)
        task = asyncio.create_task(warm_up("127.0.0.1", config, poll_seconds=0.05))
        while not engine.completions():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_hung())
    _no_leaks()
