"""The KEDA external scaler's answers (pure): the trigger's metadata, the namespaces
served, and the plan from a pool object, with every refusal and its gRPC code."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from prescaler.controller.reconcile import CHECKPOINT_PERIODS
from prescaler.controller.status import rfc3339
from prescaler.metrics import SCALER_METHODS, SCALER_OUTCOMES
from prescaler.scaler import (
    METHODS,
    ErrorCode,
    Query,
    ScalerError,
    answer,
    check_namespace,
    parse_query,
)
from prescaler.scaler._answers import SHOWN_CHARS, shown
from prescaler.settings import ScalerSettings

NOW = 1_750_000_000.0
STALE = 120.0


def pool(
    replicas: int | None = 3, planned_at: float | None = NOW - 10, **spec: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if replicas is not None:
        status["desiredReplicas"] = replicas
    if planned_at is not None:
        status["plan"] = {"plannedAt": rfc3339(planned_at)}
    return {
        "spec": {"target": {"kind": "ScaledObject", "name": "so"}, "mode": "kedaTrigger", **spec},
        "status": status,
    }


def refused(code: ErrorCode, fn: Any, *args: Any) -> str:
    with pytest.raises(ScalerError) as caught:
        fn(*args)
    assert caught.value.code == code
    return caught.value.message


def test_the_trigger_names_the_pool_in_the_scaled_objects_own_namespace() -> None:
    query = parse_query("so", "team-a", {"scalerAddress": "x:9090", "pool": "llama"})
    assert query == Query("team-a", "llama")
    assert query.metric_name == "prescaler-llama"
    same = parse_query("so", "team-a", {"pool": "llama", "namespace": "team-a"})
    assert same == Query("team-a", "llama")


def test_a_trigger_cannot_name_another_namespace() -> None:
    """Trigger metadata ``namespace`` does not override the ScaledObject's: another one is
    refused, in the same words whatever the pool, so nothing says whether it exists."""
    messages = {
        refused(
            "PERMISSION_DENIED", parse_query, "so", "team-a", {"pool": pool, "namespace": other}
        )
        for pool in ("llama", "no-such-pool")
        for other in ("team-b", "kube-system", "Team B")
    }
    assert len(messages) == 1
    (message,) = messages
    assert "ScaledObject team-a/so" in message
    assert "its ScaledObject's namespace" in message
    assert "team-b" not in message


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({}, "needs 'pool'"),
        ({"pool": "  "}, "needs 'pool'"),
        ({"pool": "Llama_Chat"}, "not a Kubernetes object name"),
        ({"pool": "llama", "pol": "x"}, "unknown trigger metadata pol"),
    ],
)
def test_malformed_metadata_is_an_invalid_argument_that_names_the_problem(
    metadata: dict[str, str], words: str
) -> None:
    message = refused("INVALID_ARGUMENT", parse_query, "so", "team-a", metadata)
    assert words in message
    assert "ScaledObject team-a/so" in message


def test_the_call_must_name_a_well_formed_namespace() -> None:
    assert "no namespace" in refused("INVALID_ARGUMENT", parse_query, "so", "", {"pool": "p"})
    message = refused("INVALID_ARGUMENT", parse_query, "so", "Team A", {"pool": "p"})
    assert "'Team A' is not a namespace name" in message


def test_refusals_quote_client_text_short_and_escaped() -> None:
    """Names and keys from the call reach the reply and the log only cut short and with
    control characters escaped, however long they are."""
    long = "x" * 100_000
    control = "evil\n\x1b[31mred\r"
    keys = {f"{long}{i}": "v" for i in range(50)} | {control: "v"}
    message = refused("INVALID_ARGUMENT", parse_query, long, control, {"pool": "p", **keys})
    assert len(message) < 10 * SHOWN_CHARS
    assert message.isprintable()
    assert "'evil\\n\\x1b[31mred\\r'" in message
    assert "and 47 more" in message
    for pool in (long, control):
        message = refused("INVALID_ARGUMENT", parse_query, "so", "ns", {"pool": pool})
        assert len(message) < 4 * SHOWN_CHARS
        assert message.isprintable()
    assert shown("llama-chat") == "llama-chat"
    assert shown("x" * 65) == f"'{'x' * 64}'..."


def test_keda_s_own_metadata_passes() -> None:
    metadata = dict.fromkeys(("scalerAddress", "enableTLS", "unsafeSsl", "caCert"), "x")
    assert parse_query("so", "ns", {**metadata, "pool": "p"}) == Query("ns", "p")


def test_only_the_namespaces_the_operator_serves_are_answered() -> None:
    check_namespace(Query("team-a", "p"), ())  # cluster-wide
    check_namespace(Query("team-a", "p"), ("team-*",))
    message = refused("PERMISSION_DENIED", check_namespace, Query("other", "p"), ("team-*",))
    assert "other" in message
    assert "team-*" in message


def test_the_plan_is_the_metric() -> None:
    plan = answer(Query("ns", "p"), pool(4), NOW, STALE)
    assert (plan.replicas, plan.active) == (4, True)
    assert not answer(Query("ns", "p"), pool(0), NOW, STALE).active


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (None, "NOT_FOUND", "InferencePool ns/p not found"),
        (pool(mode="replicas"), "FAILED_PRECONDITION", "scales its target itself"),
        (pool(dryRun=True), "FAILED_PRECONDITION", "dry run"),
        (pool(roles={"prefill": {}}), "FAILED_PRECONDITION", "disaggregated"),
        (pool(replicas=None), "UNAVAILABLE", "no plan yet"),
        (pool(planned_at=None), "UNAVAILABLE", "no plan yet"),
        (pool(planned_at=NOW - STALE - 1), "UNAVAILABLE", "121 s old"),
    ],
)
def test_a_pool_without_a_usable_plan_is_refused(
    body: dict[str, Any] | None, code: ErrorCode, words: str
) -> None:
    assert words in refused(code, answer, Query("ns", "p"), body, NOW, STALE)


def test_an_invalid_pool_is_refused_with_its_reason() -> None:
    body = pool()
    body["status"]["conditions"] = [
        {"type": "Invalid", "status": "True", "reason": "TargetNotFound", "message": "gone"}
    ]
    message = refused("FAILED_PRECONDITION", answer, Query("ns", "p"), body, NOW, STALE)
    assert "TargetNotFound" in message
    assert "gone" in message


def test_a_plan_exactly_at_the_limit_still_counts() -> None:
    assert answer(Query("ns", "p"), pool(planned_at=NOW - STALE), NOW, STALE).replicas == 3


def test_staleness_outlasts_the_status_checkpoints() -> None:
    """A steady pool's plan time is written only with the status checkpoints: a plan is
    not stale just because nothing else changed."""
    assert ScalerSettings().stale_periods >= CHECKPOINT_PERIODS + 2


def test_the_metric_labels_cover_every_method_and_refusal() -> None:
    assert SCALER_METHODS == METHODS
    assert set(SCALER_OUTCOMES) == {"ok"} | {c.lower() for c in get_args(ErrorCode)}
