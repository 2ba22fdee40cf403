"""Every pod the operator creates is locked down; the hot standby never loosens the user's pod.

Our own idling pods (pre-pull, placeholders) meet the ``restricted`` Pod Security Standard
whatever image they run. The hot standby copies the user's engine pod: it gains the
hardening the user left unset, but no forced non-root user and nothing the user set is
weakened. Every manifest is also checked against the Kubernetes schema (strict).
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from prescaler.kube import (
    ObjectRef,
    hot_standby_deployment,
    placeholder_deployment,
    pre_pull_daemonset,
)

KUBE_VERSION = "1.37.0"
OWNER = ObjectRef("prescaler.io/v1alpha1", "InferencePool", "llm", "serving", "uid-1")
ENGINE = {
    "metadata": {"labels": {"app": "llm"}},
    "spec": {
        "containers": [
            {"name": "vllm", "image": "vllm/vllm-openai:v0.9", "resources": {}},
        ]
    },
}


def _pre_pull(template: dict[str, Any] = ENGINE) -> dict[str, Any]:
    return pre_pull_daemonset(OWNER, template, "vllm/vllm-openai:v0.9", ["sleep", "infinity"])


def _placeholder(template: dict[str, Any] = ENGINE) -> dict[str, Any]:
    return placeholder_deployment(
        OWNER, template, replicas=2, gpus=4, image="registry.k8s.io/pause:3.10",
        priority_class="prescaler-placeholder",
    )  # fmt: skip


def _hot(template: dict[str, Any] = ENGINE) -> dict[str, Any]:
    return hot_standby_deployment(OWNER, template, replicas=1)


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    return pod


def _restricted(pod: dict[str, Any]) -> None:
    """The ``restricted`` Pod Security Standard, as the API server's admission checks it."""
    psc = pod["securityContext"]
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = c["securityContext"]
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        user = sc.get("runAsUser", psc.get("runAsUser"))
        assert non_root is True, c["name"]
        assert user not in (None, 0), c["name"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc.get("privileged", False) is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc.get("seccompProfile", psc["seccompProfile"]) == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("build", [_pre_pull, _placeholder], ids=["pre-pull", "placeholder"])
def test_our_idle_pods_are_restricted_whatever_the_target_sets(build: Any) -> None:
    _restricted(_pod(build()))
    # A permissive target does not leak into our pods: only its placement is copied.
    loose = copy.deepcopy(ENGINE)
    loose["spec"]["securityContext"] = {"runAsUser": 0}
    loose["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    pod = _pod(build(loose))
    _restricted(pod)
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False


def test_hot_standby_gains_hardening_but_no_forced_user() -> None:
    pod = _pod(_hot())
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (engine,) = pod["containers"]
    assert engine["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "runAsNonRoot" not in str(pod), "the engine's image decides its user"


def test_hot_standby_keeps_what_the_user_set_and_loosens_nothing() -> None:
    template = copy.deepcopy(ENGINE)
    template["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000}
    template["spec"]["initContainers"] = [
        {"name": "fetch", "image": "busybox", "securityContext": {"readOnlyRootFilesystem": True}}
    ]
    template["spec"]["containers"][0]["securityContext"] = {
        "capabilities": {"add": ["IPC_LOCK"], "drop": ["NET_RAW"]},
        "seccompProfile": {"type": "Localhost", "localhostProfile": "vllm.json"},
    }
    before = copy.deepcopy(template)
    pod = _pod(_hot(template))
    assert template == before, "the target's template is not modified"
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000}
    init, engine = pod["initContainers"][0], pod["containers"][0]
    assert init["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert engine["securityContext"] == {
        "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL", "NET_RAW"]},
        "seccompProfile": {"type": "Localhost", "localhostProfile": "vllm.json"},
        "allowPrivilegeEscalation": False,
    }


@pytest.mark.parametrize(
    ("container_sc", "expected"),
    [
        ({"privileged": True}, {"privileged": True}),
        (
            {"capabilities": {"add": ["CAP_SYS_ADMIN"]}},
            {"capabilities": {"add": ["CAP_SYS_ADMIN"], "drop": ["ALL"]}},
        ),
        (
            {"allowPrivilegeEscalation": True},
            {"allowPrivilegeEscalation": True, "capabilities": {"drop": ["ALL"]}},
        ),
    ],
    ids=["privileged", "sys-admin", "escalation-opt-in"],
)
def test_hot_standby_respects_an_explicit_opt_out(
    container_sc: dict[str, Any], expected: dict[str, Any]
) -> None:
    template = copy.deepcopy(ENGINE)
    template["spec"]["containers"][0]["securityContext"] = container_sc
    pod = _pod(_hot(template))
    assert pod["containers"][0]["securityContext"] == expected
    _valid(_hot(template))


def _valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(
    "build", [_pre_pull, _placeholder, _hot], ids=["pre-pull", "placeholder", "hot"]
)
def test_every_manifest_is_a_valid_object(build: Any) -> None:
    _valid(build())
