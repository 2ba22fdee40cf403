"""``prescaler admit``'s answers (pure): the ConfigMap's policy, the check's headers, and
every answer, the fail-open ones included."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prescaler.admission import (
    CONFIG_MAP_KEYS,
    OUTCOMES,
    Check,
    Outcome,
    Policy,
    PolicyError,
    Routes,
    decide,
    read_check,
    read_policy,
)
from prescaler.api import AdmissionStatus, DegradationStatus
from prescaler.controller import degradation


def data(**values: str) -> dict[str, str]:
    """A ConfigMap's data as the operator writes it: every key, ``normal`` by default."""
    base = dict.fromkeys(CONFIG_MAP_KEYS, "")
    base.update({"contract": "prescaler.io/degradation/v1", "pool": "chat", "level": "normal"})
    base.update(values)
    return base


CRITICAL = data(
    level="critical",
    retryAfterSeconds="37",
    maxContextTokens="4096",
    shedLanes="batch",
    smallerModelRoute="llama-8b",
    smallerModelMaxPromptTokens="1024",
)


def check(**headers: str) -> Check:
    return read_check({"x-prescaler-pool": "ns/chat", **headers})


def test_the_operators_own_config_map_reads_as_its_policy() -> None:
    """What the controller writes is what the reader reads (one contract, one place)."""
    status = DegradationStatus(
        level="critical",
        since="2026-01-01T00:00:00Z",
        reasons=["queue 300 waiting"],
        admission=AdmissionStatus(
            queue_depth_limit=20,
            retry_after_seconds=42,
            max_context_tokens=2048,
            shed_lanes=["batch", "standard"],
            smaller_model_route="small",
            smaller_model_max_prompt_tokens=512,
        ),
    )
    policy = read_policy(degradation.config_map_data("chat", status))
    assert policy == Policy(
        level="critical",
        retry_after_seconds=42,
        max_context_tokens=2048,
        shed_lanes=frozenset({"batch", "standard"}),
        smaller_model_route="small",
        smaller_model_max_prompt_tokens=512,
    )
    normal = DegradationStatus(level="normal", since="2026-01-01T00:00:00Z", reasons=[])
    assert read_policy(degradation.config_map_data("chat", normal)) == Policy(level="normal")


def test_normal_admits_every_lane_and_context() -> None:
    policy = read_policy(data())
    for lane in ("batch", "interactive", None):
        headers = {"x-context-tokens": "999999"} | ({"x-priority-lane": lane} if lane else {})
        answer = decide(policy, check(**headers))
        assert (answer.status, answer.outcome, answer.headers) == (200, "admitted", ())


def test_a_shed_lane_gets_503_with_the_exact_retry_after() -> None:
    answer = decide(read_policy(CRITICAL), check(**{"x-priority-lane": "batch"}))
    assert answer.status == 503
    assert answer.outcome == "shed"
    assert answer.headers == (("Retry-After", "37"),)
    assert "batch" in answer.reason
    assert "\n" not in answer.reason


def test_a_lane_not_shed_passes() -> None:
    answer = decide(read_policy(CRITICAL), check(**{"x-priority-lane": "interactive"}))
    assert (answer.status, answer.outcome) == (200, "admitted")


def test_a_context_above_the_cap_gets_413_with_one_line() -> None:
    policy = read_policy(CRITICAL)
    lane = {"x-priority-lane": "interactive"}
    over = decide(policy, check(**lane, **{"x-context-tokens": "4097"}))
    assert over.status == 413
    assert over.outcome == "too_long"
    assert over.reason == "context of 4097 tokens above the cap of 4096 for now"
    at = decide(policy, check(**lane, **{"x-context-tokens": "4096"}))
    assert at.status == 200


def test_without_a_context_header_the_body_length_stands_in_and_says_so() -> None:
    policy = read_policy(CRITICAL)
    lane = {"x-priority-lane": "interactive"}
    # 4 bytes a token: 16,389 bytes are about 4,098 tokens.
    over = decide(policy, check(**lane, **{"x-original-content-length": "16389"}))
    assert over.status == 413
    assert "about 4098 tokens" in over.reason
    assert decide(policy, check(**lane, **{"x-original-content-length": "16384"})).status == 200
    # A context header, when sent, is what counts.
    sent = {"x-original-content-length": "99999", "x-context-tokens": "100"}
    assert decide(policy, check(**lane, **sent)).status == 200


def test_a_short_request_at_critical_is_told_the_smaller_models_route() -> None:
    policy = read_policy(CRITICAL)
    lane = {"x-priority-lane": "interactive"}
    short = decide(policy, check(**lane, **{"x-prompt-tokens": "1024"}))
    assert (short.status, short.outcome) == (200, "routed")
    assert short.headers == (("x-prescaler-route", "llama-8b"),)
    long = decide(policy, check(**lane, **{"x-prompt-tokens": "1025"}))
    assert (long.status, long.outcome, long.headers) == (200, "admitted", ())
    # Not at warning (the operator names the route at critical only; the reader agrees).
    warning = read_policy({**CRITICAL, "level": "warning"})
    assert decide(warning, check(**lane, **{"x-prompt-tokens": "10"})).outcome == "admitted"


@pytest.mark.parametrize(
    ("policy", "headers", "outcome"),
    [
        (Policy("critical", shed_lanes=frozenset({"batch"})), {}, "open_no_lane"),
        (None, {"x-priority-lane": "batch"}, "open_unknown_pool"),
        (PolicyError("contract v2"), {"x-priority-lane": "batch"}, "open_unreadable"),
        (
            Policy("critical", max_context_tokens=10),
            {"x-priority-lane": "interactive", "x-context-tokens": "lots"},
            "open_malformed",
        ),
        (
            Policy("critical", max_context_tokens=10),
            {"x-priority-lane": "interactive", "x-context-tokens": "-5"},
            "open_malformed",
        ),
        (
            Policy("critical", max_context_tokens=10),
            {"x-priority-lane": "interactive", "x-original-content-length": "1e9"},
            "open_malformed",
        ),
    ],
)
def test_what_is_not_the_policys_to_refuse_passes_and_is_counted(
    policy: Policy | PolicyError | None, headers: dict[str, str], outcome: Outcome
) -> None:
    answer = decide(policy, check(**headers))
    assert answer.status == 200
    assert answer.outcome == outcome
    assert answer.fail_open
    assert answer.reason.startswith("let through: ")


def test_no_pool_passes() -> None:
    answer = decide(read_policy(CRITICAL), read_check({"x-priority-lane": "batch"}))
    assert (answer.status, answer.outcome) == (200, "open_no_pool")


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"contract": "prescaler.io/degradation/v2"}, "contract"),
        ({"contract": ""}, "contract"),
        ({"level": "panic"}, "level"),
        ({"level": "critical", "retryAfterSeconds": "soon"}, "retryAfterSeconds"),
        ({"level": "critical", "maxContextTokens": "-1"}, "maxContextTokens"),
    ],
)
def test_a_config_map_of_another_contract_or_that_does_not_parse_is_refused(
    values: dict[str, str], why: str
) -> None:
    with pytest.raises(PolicyError, match=why):
        read_policy(data(**values))


def test_a_config_map_without_data_is_refused() -> None:
    with pytest.raises(PolicyError):
        read_policy(None)


def test_routes_map_hosts_and_the_longest_path_prefix() -> None:
    routes = Routes.parse(["chat.example.com=ns/chat", "/v1=ns/general", "/v1/batch=ns/batch-pool"])
    assert read_check({"x-original-uri": "/v1/batch/jobs?x=1"}, routes).pool == "ns/batch-pool"
    assert read_check({"x-forwarded-uri": "/v1/chat"}, routes).pool == "ns/general"
    assert read_check({"host": "Chat.Example.com:8443"}, routes).pool == "ns/chat"
    assert read_check({"host": "other"}, routes).pool is None
    # The header the gateway sets wins over any mapping.
    assert read_check({"x-prescaler-pool": "ns/x", "x-original-uri": "/v1"}, routes).pool == "ns/x"


@pytest.mark.parametrize("entry", ["nopool", "host=pool", "/p=/pool", "=ns/p", "h=ns/p/q"])
def test_a_malformed_route_is_refused_at_start(entry: str) -> None:
    with pytest.raises(ValueError, match="--route"):
        Routes.parse([entry])


def test_the_outcomes_are_listed_once() -> None:
    assert get_args(Outcome) == OUTCOMES


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "x-prescaler-pool",
                "x-priority-lane",
                "x-context-tokens",
                "x-prompt-tokens",
                "x-original-content-length",
                "x-original-uri",
                "host",
            ]
        ),
        st.text(max_size=40),
    ),
    st.sampled_from([None, PolicyError("bad"), Policy("normal"), read_policy(CRITICAL)]),
)
def test_any_headers_get_an_answer_and_only_the_policy_refuses(
    headers: dict[str, str], policy: Policy | PolicyError | None
) -> None:
    answer = decide(policy, read_check(headers))
    assert answer.status in (200, 413, 503)
    assert "\n" not in answer.reason
    if answer.status != 200:
        assert isinstance(policy, Policy)
        assert policy.level != "normal"
        if answer.status == 503:
            assert headers.get("x-priority-lane", "").strip() in policy.shed_lanes
