"""Which pods are warmed, released or left alone (pure): pods as the watch sends them, the
prompts in a ConfigMap, the readiness gate in a template, the pod condition, and the cold
start a gated pod measures."""

from __future__ import annotations

import re
from typing import Any

import pytest

from prescaler.api import ColdStartSpec, PrewarmSpec
from prescaler.controller.status import learn_cold_start, rfc3339
from prescaler.kube import pod_start
from prescaler.prewarm import (
    FAILED,
    FORGET,
    NOT_CONFIGURED,
    WAIT,
    Claim,
    WarmupConfig,
    condition_patch,
    decide,
    has_gate,
    parse_prompts,
    pod_gate,
    pod_workload,
    warmup_config,
    with_gate,
)

NOW = 1_750_000_000.0
GATE = {"conditionType": "prescaler.io/prewarmed"}
CONFIG = WarmupConfig(prompts=("a",), timeout_seconds=60.0)


def pod(
    *,
    gated: bool = True,
    ready_at: float | None = NOW - 5,
    ip: str | None = "10.64.0.7",
    condition: str | None = None,
    owner: tuple[str, str] | None = ("ReplicaSet", "llm-5d8f9"),
    template_hash: str = "5d8f9",
    deleting: bool = False,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(NOW - 60)}
    ]
    if ready_at is not None:
        conditions.append(
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": rfc3339(ready_at)}
        )
    if condition is not None:
        conditions.append({"type": "prescaler.io/prewarmed", "status": condition})
    meta: dict[str, Any] = {
        "uid": "uid-1",
        "name": "llm-5d8f9-abcde",
        "namespace": "serving",
        "labels": {"app": "llm", "pod-template-hash": template_hash},
    }
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = rfc3339(NOW)
    return {
        "metadata": meta,
        "spec": {"readinessGates": [GATE] if gated else [], "containers": [{"name": "vllm"}]},
        "status": {"podIP": ip, "conditions": conditions},
    }


def test_a_pod_body_is_read_into_what_warm_up_needs() -> None:
    gate = pod_gate(pod())
    assert (gate.uid, gate.namespace, gate.name, gate.ip) == (
        "uid-1",
        "serving",
        "llm-5d8f9-abcde",
        "10.64.0.7",
    )
    assert gate.gated
    assert gate.condition is None
    assert gate.containers_ready_at == NOW - 5
    assert gate.key == ("serving", "Deployment", "llm")
    assert not pod_gate(pod(gated=False)).gated
    assert pod_gate(pod(condition="True")).done
    assert not pod_gate(pod(condition="False")).done
    assert pod_gate(pod(ready_at=None)).containers_ready_at is None
    assert pod_gate(pod(deleting=True)).terminating
    assert pod_gate({}).uid == ""  # garbage is no pod, never an exception


@pytest.mark.parametrize(
    ("owner", "template_hash", "workload"),
    [
        (("ReplicaSet", "llm-5d8f9"), "5d8f9", ("Deployment", "llm")),
        (("ReplicaSet", "my-llm-hot-77c"), "77c", ("Deployment", "my-llm-hot")),
        (("StatefulSet", "db"), "", ("StatefulSet", "db")),
        (("ReplicaSet", "bare-rs"), "5d8f9", None),  # a ReplicaSet of no Deployment
        (("ReplicaSet", "-5d8f9"), "5d8f9", None),
        (("Job", "batch"), "", None),
        (None, "", None),
    ],
)
def test_the_workload_comes_from_the_owner_reference_without_an_api_call(
    owner: tuple[str, str] | None, template_hash: str, workload: tuple[str, str] | None
) -> None:
    meta = pod(owner=owner, template_hash=template_hash)["metadata"]
    assert pod_workload(meta) == workload


def _decide(body: dict[str, Any], claim: Claim | None, waiting_since: float | None = NOW) -> Any:
    return decide(
        pod_gate(body), claim, NOW, waiting_since=waiting_since, unclaimed_grace_seconds=120
    )


def test_a_gated_pod_is_warmed_once_ready_and_claimed() -> None:
    claim = Claim("chat", CONFIG)
    assert _decide(pod(ready_at=None), claim) == WAIT
    assert _decide(pod(ip=None), claim) == WAIT
    assert _decide(pod(), claim).verb == "warm"
    assert _decide(pod(condition="True"), claim) == FORGET
    assert _decide(pod(deleting=True), claim) == FORGET


def test_a_gated_pod_nobody_claims_is_released_after_the_grace() -> None:
    assert _decide(pod(), None, waiting_since=NOW - 119) == WAIT
    assert _decide(pod(), None, waiting_since=None) == WAIT
    released = _decide(pod(), None, waiting_since=NOW - 120)
    assert (released.verb, released.reason) == ("release", NOT_CONFIGURED)
    assert "no InferencePool with spec.prewarm scales Deployment llm" in released.message


def test_a_gated_pod_of_a_pool_without_prewarm_or_prompts_is_released_at_once() -> None:
    plain = _decide(pod(), Claim("chat", None))
    assert (plain.verb, plain.reason) == ("release", NOT_CONFIGURED)
    assert "InferencePool chat has no spec.prewarm" in plain.message
    broken = _decide(pod(), Claim("chat", CONFIG, problem="ConfigMap p not found"))
    assert (broken.verb, broken.reason) == ("release", FAILED)
    assert broken.message == "released without warm-up: ConfigMap p not found"


def test_a_pod_without_the_gate_is_warmed_only_if_it_turned_ready_recently() -> None:
    claim = Claim("chat", CONFIG)
    assert _decide(pod(gated=False), claim).verb == "warm"
    assert _decide(pod(gated=False, ready_at=NOW - 61), claim) == FORGET  # serving already
    assert _decide(pod(gated=False), None) == FORGET  # not ours
    assert _decide(pod(gated=False), Claim("chat", None)) == FORGET
    young = pod(gated=False)
    young["metadata"]["creationTimestamp"] = rfc3339(NOW - 119)
    assert _decide(young, None) == WAIT, "its pool may not have reconciled yet"
    young["metadata"]["creationTimestamp"] = rfc3339(NOW - 120)
    assert _decide(young, None) == FORGET
    job = pod(gated=False, owner=("Job", "batch"))
    job["metadata"]["creationTimestamp"] = rfc3339(NOW - 1)
    assert _decide(job, None) == FORGET, "no pool scales a Job's pods"


@pytest.mark.parametrize(
    ("text", "prompts"),
    [
        ('["You are helpful.", "You review code."]', ("You are helpful.", "You review code.")),
        (
            '- |\n  You are helpful.\n  Be brief.\n- "Summarize:"\n',
            ("You are helpful.\nBe brief.\n", "Summarize:"),
        ),
    ],
    ids=["json", "yaml-block"],
)
def test_prompts_are_a_yaml_or_json_list_of_strings(text: str, prompts: tuple[str, ...]) -> None:
    assert parse_prompts(text) == prompts


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not a list of prompts but NoneType"),
        ("just one prompt", "not a list of prompts but str"),
        ("[]", "empty"),
        ('["ok", 3]', "item 1 is not a non-empty string"),
        ('["ok", ""]', "item 1 is not a non-empty string"),
        ("[unclosed", "not YAML or JSON (line 1)"),
        ("a: 1", "not a list of prompts but dict"),
        ("- Summarize:\n", "item 0 is a mapping, not a string: quote a prompt"),
    ],
)
def test_a_bad_prompt_list_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_prompts(text)


def test_the_gate_is_added_to_a_template_copy_once() -> None:
    template = {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": []}}
    gated = with_gate(template)
    assert has_gate(gated)
    assert not has_gate(template), "the original is not modified"
    assert with_gate(gated)["spec"]["readinessGates"] == [GATE]
    other = {"spec": {"readinessGates": [{"conditionType": "example.com/x"}]}}
    assert with_gate(other)["spec"]["readinessGates"] == [{"conditionType": "example.com/x"}, GATE]


def test_the_condition_is_always_true_with_the_reason() -> None:
    patch = condition_patch(FAILED, "x" * 2000, "2025-06-15T15:06:40Z")
    (condition,) = patch["status"]["conditions"]
    assert condition["type"] == "prescaler.io/prewarmed"
    assert (condition["status"], condition["reason"]) == ("True", FAILED)
    assert len(condition["message"]) == 1024


def test_the_spec_becomes_the_config_and_the_budget_caps_the_prompts() -> None:
    spec = PrewarmSpec.model_validate({"prompts": ["a", "b", "c"], "maxRequests": 2})
    config = warmup_config(spec, spec.prompts or [])
    assert config.requests == ("a", "b")
    assert (config.port, config.path, config.models_path, config.model) == (
        8000,
        "/v1/completions",
        "/v1/models",
        None,
    )
    assert config.timeout_seconds == 120.0


def test_the_measured_cold_start_of_a_gated_pod_includes_its_warm_up() -> None:
    """Ready comes after the gate's condition: created -> Ready spans the warm-up."""
    scheduled, containers_ready, warmed = NOW - 300, NOW - 60, NOW - 45
    body = pod(ready_at=containers_ready)
    body["metadata"]["creationTimestamp"] = rfc3339(scheduled - 2)
    body["status"]["conditions"] = [
        {"type": kind, "status": "True", "lastTransitionTime": rfc3339(at)}
        for kind, at in [
            ("PodScheduled", scheduled),
            ("ContainersReady", containers_ready),
            ("prescaler.io/prewarmed", warmed),
            ("Ready", warmed),
        ]
    ]
    cold = learn_cold_start(None, ColdStartSpec(), [pod_start(body)], NOW)
    assert cold.samples == [warmed - (scheduled - 2)]
    assert cold.scheduling_samples == [2]
    assert cold.samples[0] > containers_ready - scheduled
