"""What ``prescaler admit`` answers a gateway, as plain values (pure: no HTTP, no Kubernetes).

A gateway asks before it forwards a request (NGINX ``auth_request``, Caddy
``forward_auth``, Envoy ``ext_authz``): a 2xx lets the request through, anything else is
returned to the client. :func:`read_policy` turns a degradation ConfigMap's ``data``
(contract ``prescaler.io/degradation/v1``) into a :class:`Policy`, :func:`read_check` turns
the check's headers into a :class:`Check`, and :func:`decide` turns both into an
:class:`Answer`:

- ``200`` at ``normal``, and for a lane that is not shed;
- ``503`` with ``Retry-After: <retryAfterSeconds>`` for a shed lane;
- ``413`` with a one-line reason for a context above ``maxContextTokens``;
- ``200`` with ``x-prescaler-route: <smallerModelRoute>`` for a short request at
  ``critical`` when the policy names a smaller model.

Anything that is not the policy's to refuse lets the request through (*fail open*): no
pool named, a pool without a ConfigMap, a ConfigMap of another contract or with a value
that does not parse, a lane or a context header that is missing or malformed. Each such
answer carries an ``open_*`` outcome, so it is counted, and a reason for the log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

CONTRACT: Final = "prescaler.io/degradation/v1"
"""The ConfigMap format's name and version (key ``contract``)."""
CONFIG_MAP_KEYS: Final = (
    "contract",
    "pool",
    "level",
    "since",
    "queueDepthLimit",
    "retryAfterSeconds",
    "maxContextTokens",
    "shedLanes",
    "smallerModelRoute",
    "smallerModelMaxPromptTokens",
    "reasons",
)
"""Every key of the ConfigMap, always present (``docs/degradation.md`` says what each
means to a client)."""
LEVELS: Final = ("normal", "warning", "critical")

POOL_HEADER: Final = "x-prescaler-pool"
"""The pool a request is for, ``<namespace>/<pool>`` or ``<pool>``: set by the gateway."""
LANE_HEADER: Final = "x-priority-lane"
"""The request's priority lane (one of the pool's ``degradation.lanes``)."""
CONTEXT_HEADER: Final = "x-context-tokens"
"""The request's context: its prompt tokens plus its ``max_tokens``."""
PROMPT_HEADER: Final = "x-prompt-tokens"
"""The request's prompt tokens (what decides whether the smaller model's route applies)."""
LENGTH_HEADER: Final = "x-original-content-length"
"""The body's length in bytes, as the gateway passes it on (the check itself has no body)."""
URI_HEADERS: Final = ("x-original-uri", "x-forwarded-uri")
"""The original request's path, as NGINX's and Caddy's configurations pass it on."""
HOST_HEADERS: Final = ("x-forwarded-host", "host")
ROUTE_HEADER: Final = "x-prescaler-route"
"""Set on a 200 when the request may go to the smaller model: its route."""
BYTES_PER_TOKEN: Final = 4
"""Without a context header, the body's bytes over this are its tokens (an approximation:
English text in a JSON body is about four bytes a token; ``max_tokens`` is not counted)."""

Outcome = Literal[
    "admitted",
    "routed",
    "shed",
    "too_long",
    "open_no_pool",
    "open_unknown_pool",
    "open_unreadable",
    "open_no_lane",
    "open_malformed",
]
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
"""Every outcome of a check: the policy's answers, then the fail-open ones."""
SHOWN_CHARS: Final = 64
_TOKENS = re.compile(r"^\s*[0-9]{1,12}\s*$")
_PLAIN = re.compile(r"^[A-Za-z0-9._/-]*$")


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """Client text as an answer or a log line quotes it: a plain short name as it is,
    anything else escaped and cut to ``limit`` characters."""
    if len(text) <= limit and _PLAIN.match(text):
        return text
    quoted = ascii(text[:limit])
    return quoted + ("..." if len(text) > limit else "")


class PolicyError(ValueError):
    """A ConfigMap that is not a policy this reader understands (another contract, a value
    that does not parse): its pool's requests pass."""


@dataclass(frozen=True, slots=True)
class Policy:
    """One pool's admission policy, as its ConfigMap publishes it."""

    level: str
    retry_after_seconds: int | None = None
    max_context_tokens: int | None = None
    shed_lanes: frozenset[str] = frozenset()
    smaller_model_route: str | None = None
    smaller_model_max_prompt_tokens: int | None = None


def _count(data: Mapping[str, str], key: str) -> int | None:
    text = (data.get(key) or "").strip()
    if not text:
        return None
    if not _TOKENS.match(text):
        raise PolicyError(f"{key} is not a count: {shown(text)}")
    return int(text)


def read_policy(data: Mapping[str, str] | None) -> Policy:
    """The policy in a degradation ConfigMap's ``data``; :class:`PolicyError` when it is
    not one of contract ``prescaler.io/degradation/v1`` that parses."""
    if data is None:
        raise PolicyError("the ConfigMap has no data")
    contract = data.get("contract")
    if contract != CONTRACT:
        raise PolicyError(f"contract {shown(str(contract))}, not {CONTRACT}")
    level = data.get("level", "")
    if level not in LEVELS:
        raise PolicyError(f"level {shown(level)} is not one of {', '.join(LEVELS)}")
    lanes = frozenset(x.strip() for x in (data.get("shedLanes") or "").split(",") if x.strip())
    route = (data.get("smallerModelRoute") or "").strip() or None
    return Policy(
        level=level,
        retry_after_seconds=_count(data, "retryAfterSeconds"),
        max_context_tokens=_count(data, "maxContextTokens"),
        shed_lanes=lanes,
        smaller_model_route=route,
        smaller_model_max_prompt_tokens=_count(data, "smallerModelMaxPromptTokens"),
    )


@dataclass(frozen=True, slots=True)
class Routes:
    """How a check finds its pool when the gateway sends no pool header: the original
    request's host, or the longest prefix of its path, mapped to ``<namespace>/<pool>``."""

    hosts: Mapping[str, str]
    prefixes: Mapping[str, str]

    @classmethod
    def parse(cls, entries: list[str] | tuple[str, ...]) -> Routes:
        """``HOST=NAMESPACE/POOL`` or ``/PATH-PREFIX=NAMESPACE/POOL`` entries; a
        ``ValueError`` naming the first one that is neither."""
        hosts: dict[str, str] = {}
        prefixes: dict[str, str] = {}
        for entry in entries:
            key, sep, pool = entry.partition("=")
            ns, slash, name = pool.partition("/")
            if not sep or not key or not slash or not ns or not name or "/" in name:
                raise ValueError(
                    f"--route {entry!r}: expected HOST=NAMESPACE/POOL or /PREFIX=NAMESPACE/POOL"
                )
            if key.startswith("/"):
                prefixes[key] = pool
            else:
                hosts[key.lower()] = pool
        return cls(hosts, prefixes)

    def find(self, host: str | None, uri: str | None) -> str | None:
        if uri and self.prefixes:
            path = uri.split("?", 1)[0]
            best = max((p for p in self.prefixes if path.startswith(p)), key=len, default=None)
            if best is not None:
                return self.prefixes[best]
        if host and self.hosts:
            return self.hosts.get(host.split(":", 1)[0].lower())
        return None


NO_ROUTES: Final = Routes({}, {})


@dataclass(frozen=True, slots=True)
class Check:
    """What one check says about its request."""

    pool: str | None
    """``<namespace>/<pool>`` or ``<pool>``, as named or mapped; ``None``: no pool."""
    lane: str | None
    context_tokens: int | None
    """Prompt plus ``max_tokens``, from the header or estimated from the body's length."""
    context_estimated: bool
    prompt_tokens: int | None
    malformed: str | None = None
    """The first header that was sent but does not parse (the check then fails open)."""


def _tokens(headers: Mapping[str, str], name: str) -> tuple[int | None, str | None]:
    value = headers.get(name)
    if value is None or value == "":
        return None, None
    if not _TOKENS.match(value):
        return None, f"{name}: {shown(value)} is not a count of tokens"
    return int(value), None


def read_check(headers: Mapping[str, str], routes: Routes = NO_ROUTES) -> Check:
    """The check's request from its headers (a case-insensitive mapping, or one with
    lower-case keys)."""
    pool = (headers.get(POOL_HEADER) or "").strip() or None
    if pool is None:
        uri = next((v for h in URI_HEADERS if (v := headers.get(h))), None)
        host = next((v for h in HOST_HEADERS if (v := headers.get(h))), None)
        pool = routes.find(host, uri)
    lane = (headers.get(LANE_HEADER) or "").strip() or None
    context, bad_context = _tokens(headers, CONTEXT_HEADER)
    prompt, bad_prompt = _tokens(headers, PROMPT_HEADER)
    estimated = False
    bad_length = None
    if context is None and bad_context is None:
        length, bad_length = _tokens(headers, LENGTH_HEADER)
        if length is not None:
            context, estimated = math.ceil(length / BYTES_PER_TOKEN), True
    return Check(
        pool=pool,
        lane=lane,
        context_tokens=context,
        context_estimated=estimated,
        prompt_tokens=prompt,
        malformed=bad_context or bad_prompt or bad_length,
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """The status, headers and one-line reason of a check's answer, and its outcome (the
    metric's label)."""

    status: int
    outcome: Outcome
    reason: str
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def fail_open(self) -> bool:
        return self.outcome.startswith("open_")


def _open(outcome: Outcome, reason: str) -> Answer:
    return Answer(200, outcome, f"let through: {reason}")


def decide(policy: Policy | PolicyError | None, check: Check) -> Answer:
    """The answer to ``check`` under its pool's ``policy`` (``None``: the pool has no
    ConfigMap; a :class:`PolicyError`: one that cannot be read)."""
    if check.pool is None:
        return _open("open_no_pool", f"no pool named ({POOL_HEADER} or a route)")
    if policy is None:
        return _open("open_unknown_pool", f"no degradation policy for pool {shown(check.pool)}")
    if isinstance(policy, PolicyError):
        return _open("open_unreadable", f"pool {shown(check.pool)}'s policy: {policy}")
    if policy.level == "normal":
        return Answer(200, "admitted", "normal")
    if check.lane is not None and check.lane in policy.shed_lanes:
        retry = policy.retry_after_seconds
        headers = (("Retry-After", str(retry)),) if retry is not None else ()
        return Answer(
            503,
            "shed",
            f"overloaded: lane {shown(check.lane)} is shed at {policy.level}, retry later",
            headers,
        )
    cap = policy.max_context_tokens
    if cap is not None and check.context_tokens is not None and check.context_tokens > cap:
        how = "about " if check.context_estimated else ""
        return Answer(
            413,
            "too_long",
            f"context of {how}{check.context_tokens} tokens above the cap of {cap} for now",
        )
    if check.malformed is not None:
        return _open("open_malformed", check.malformed)
    if check.lane is None and policy.shed_lanes:
        return _open(
            "open_no_lane", f"no {LANE_HEADER} while {', '.join(sorted(policy.shed_lanes))} is shed"
        )
    route, short = policy.smaller_model_route, policy.smaller_model_max_prompt_tokens
    if (
        route is not None
        and policy.level == "critical"
        and check.prompt_tokens is not None
        and (short is None or check.prompt_tokens <= short)
    ):
        return Answer(200, "routed", f"short request: route {route}", ((ROUTE_HEADER, route),))
    return Answer(200, "admitted", f"lane {shown(check.lane or '-')} not shed")
