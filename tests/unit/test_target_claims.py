"""Two pools on one target: the oldest working pool keeps it, younger ones are flagged."""

from __future__ import annotations

from typing import Any

from prescaler.controller.model import TARGET_CONFLICT, TargetClaim, target_claims, target_owner


def body(name: str, created: str, target: str = "llm", reason: str | None = None) -> dict[str, Any]:
    status = {}
    if reason is not None:
        status = {"conditions": [{"type": "Invalid", "status": "True", "reason": reason}]}
    return {
        "metadata": {"name": name, "namespace": "serving", "creationTimestamp": created},
        "spec": {"target": {"name": target}},
        "status": status,
    }


def test_claims_are_keyed_by_namespace_kind_and_name() -> None:
    keys, claim = target_claims(body("a", "2026-01-01T00:00:00Z"))
    assert keys == (("serving", "Deployment", "llm"),)
    assert claim == TargetClaim("2026-01-01T00:00:00Z", "a", blocked=False)


def test_the_oldest_pool_owns_the_target() -> None:
    old = target_claims(body("old", "2026-01-01T00:00:00Z"))[1]
    new = target_claims(body("new", "2026-01-02T00:00:00Z"))[1]
    assert target_owner(old, [old, new]) is None
    assert target_owner(new, [old, new]) == "old"


def test_same_second_ties_break_by_name() -> None:
    a = target_claims(body("a", "2026-01-01T00:00:00Z"))[1]
    b = target_claims(body("b", "2026-01-01T00:00:00Z"))[1]
    assert target_owner(b, [a, b]) == "a"
    assert target_owner(a, [a, b]) is None


def test_a_broken_older_pool_claims_nothing_but_a_conflicted_one_still_does() -> None:
    broken = target_claims(body("broken", "2026-01-01T00:00:00Z", reason="InvalidSpec"))[1]
    new = target_claims(body("new", "2026-01-03T00:00:00Z"))[1]
    assert target_owner(new, [broken, new]) is None
    # A pool flagged only for the conflict is still in line: ownership is by age alone.
    mid = target_claims(body("mid", "2026-01-02T00:00:00Z", reason=TARGET_CONFLICT))[1]
    assert target_owner(new, [mid, new]) == "mid"


def test_a_disaggregated_pool_claims_each_role_target() -> None:
    pool = body("pd", "2026-01-01T00:00:00Z")
    pool["spec"] = {
        "roles": {
            "prefill": {"target": {"name": "llm-prefill"}},
            "decode": {"target": {"kind": "StatefulSet", "name": "llm-decode"}},
        }
    }
    keys, _ = target_claims(pool)
    assert keys == (
        ("serving", "Deployment", "llm-prefill"),
        ("serving", "StatefulSet", "llm-decode"),
    )
