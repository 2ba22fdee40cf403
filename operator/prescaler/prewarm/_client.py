"""The warm-up client: OpenAI-compatible completions sent to one pod's engine (aiohttp).

One call of :func:`warm_up` is one pod's warm-up, bounded by its timeout as a whole:

1. wait for the engine to answer: ``GET modelsPath`` until it does (refused connections and
   5xx answers mean it is still starting; they are polled, not counted);
2. the served model: ``config.model``, else the first id of that answer;
3. each prompt once, in order, at most ``maxRequests``: ``POST path`` with
   ``{"model", "prompt", "max_tokens": 1, "temperature": 0}``.

It never raises for the engine's sake: every outcome is a :class:`WarmupResult` whose
reason is the pod condition's (``Prewarmed``, ``PrewarmFailed``, ``PrewarmTimedOut``).
Every connection it opens is closed before it returns, also when it is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from prescaler.prewarm._model import FAILED, PREWARMED, TIMED_OUT, WarmupConfig, WarmupResult

POLL_SECONDS = 1.0
"""Pause between two attempts to reach an engine that does not answer yet."""
SNIPPET = 160
"""Characters of an unexpected answer quoted in the message."""


class _Failed(Exception):
    """The warm-up cannot go on (the message says why)."""


@dataclass
class _Progress:
    model: str | None = None
    sent: int = 0
    answered: int = 0
    waiting_for: str = "the engine to answer"
    last_problem: str | None = None


def base_url(address: str, port: int) -> str:
    """``http://<pod IP>:<port>`` (an IPv6 address in brackets)."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def _snippet(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:SNIPPET] + ("..." if len(text) > SNIPPET else "") if text else "an empty body"


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _first_model(body: bytes) -> str | None:
    data = _json(body)
    models = data.get("data") if isinstance(data, dict) else None
    if isinstance(models, list) and models and isinstance(models[0], dict):
        model = models[0].get("id")
        if isinstance(model, str) and model:
            return model
    return None


def _is_completion(body: bytes) -> bool:
    data = _json(body)
    choices = data.get("choices") if isinstance(data, dict) else None
    return isinstance(choices, list) and len(choices) > 0


async def _engine_model(
    session: aiohttp.ClientSession,
    base: str,
    config: WarmupConfig,
    progress: _Progress,
    poll_seconds: float,
) -> str:
    """Wait until the engine answers its model list; the model name to send."""
    url = base + config.models_path
    while True:
        try:
            async with session.get(url) as resp:
                status, body = resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            progress.last_problem = f"GET {config.models_path}: {type(exc).__name__}: {exc}"
        else:
            if status == 200:
                model = config.model or _first_model(body)
                if model is None:
                    raise _Failed(
                        f"GET {config.models_path} answered no model id ({_snippet(body)}); "
                        "set spec.prewarm.model"
                    )
                return model
            if status in (404, 405) and config.model is not None:
                return config.model  # no model list, but the engine answers
            if status < 500:
                hint = "; set spec.prewarm.model" if status in (404, 405) else ""
                raise _Failed(
                    f"GET {config.models_path} answered {status} ({_snippet(body)}){hint}"
                )
            progress.last_problem = f"GET {config.models_path} answered {status}"
        await asyncio.sleep(poll_seconds)


async def _send(
    session: aiohttp.ClientSession,
    base: str,
    config: WarmupConfig,
    model: str,
    progress: _Progress,
) -> list[str]:
    """Send the warm-up requests; the problems of those not answered with a completion."""
    problems: list[str] = []
    url = base + config.path
    for prompt in config.requests:
        payload = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        progress.sent += 1
        progress.waiting_for = f"warm-up request {progress.sent} to be answered"
        try:
            async with session.post(url, json=payload) as resp:
                status, body = resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            # The engine went away: the next requests would fail the same way.
            problems.append(f"{type(exc).__name__}: {exc}")
            break
        if not 200 <= status < 300:
            problems.append(f"HTTP {status}: {_snippet(body)}")
        elif not _is_completion(body):
            problems.append(f"not a completion: {_snippet(body)}")
        else:
            progress.answered += 1
    return problems


async def warm_up(
    address: str, config: WarmupConfig, *, poll_seconds: float = POLL_SECONDS
) -> WarmupResult:
    """Warm the engine at ``address`` (the pod IP) as ``config`` says."""
    started = time.monotonic()
    progress = _Progress()
    base = base_url(address, config.port)

    def result(reason: Any, message: str) -> WarmupResult:
        return WarmupResult(
            reason=reason,
            message=message,
            sent=progress.sent,
            answered=progress.answered,
            model=progress.model,
            seconds=round(time.monotonic() - started, 3),
        )

    try:
        async with asyncio.timeout(config.timeout_seconds):
            # One connection at a time, closed after each answer: nothing lingers on the pod.
            connector = aiohttp.TCPConnector(limit=1, force_close=True)
            async with aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            ) as session:
                progress.model = await _engine_model(session, base, config, progress, poll_seconds)
                problems = await _send(session, base, config, progress.model, progress)
    except _Failed as exc:
        return result(FAILED, str(exc))
    except TimeoutError:
        message = (
            f"not done within {config.timeout_seconds:g} s: waiting for {progress.waiting_for}"
        )
        if progress.sent:
            message += f" ({progress.answered} of {progress.sent} sent answered)"
        if progress.last_problem is not None and not progress.sent:
            message += f"; last: {progress.last_problem}"
        return result(TIMED_OUT, message)
    took = time.monotonic() - started
    if problems:
        failed = progress.sent - progress.answered
        return result(
            FAILED,
            f"{failed} of {progress.sent} warm-up requests failed (first: {problems[0]}); "
            f"{progress.answered} answered by model {progress.model} in {took:.1f} s",
        )
    return result(
        PREWARMED,
        f"{progress.answered} warm-up requests answered by model {progress.model} in {took:.1f} s",
    )
