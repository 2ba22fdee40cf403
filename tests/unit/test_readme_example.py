"""The README's annotated InferencePool is a real, valid pool: docs cannot drift from the API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from prescaler.api import capacity_model, check_spec, parse_spec, scaling_policy, scheduled_windows

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_pool() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.DOTALL)
    # The KEDA example (two objects, a file of its own) is checked by test_keda_example.py.
    single = [docs[0] for docs in (list(yaml.safe_load_all(x)) for x in blocks) if len(docs) == 1]
    pools = [b for b in single if b.get("kind") == "InferencePool"]
    assert len(pools) == 1, "the README shows exactly one annotated InferencePool"
    pool: dict[str, Any] = pools[0]
    return pool


def test_readme_pool_parses_and_means_what_its_comments_say() -> None:
    pool = readme_pool()
    assert pool["apiVersion"] == "prescaler.io/v1alpha1"
    spec = parse_spec(pool["spec"])
    check_spec(spec)
    policy = scaling_policy(spec)
    assert (policy.min_replicas, policy.max_replicas, policy.mode) == (2, 40, "replicas")
    assert policy.scale_down_stabilization_seconds == 900
    assert policy.scale_down_max_percent == 25
    capacity = capacity_model(spec)
    assert capacity.replica is not None
    assert capacity.replica.model.kv_bytes_per_token == 327_680
    windows = scheduled_windows(spec)
    assert [w.name for w in windows] == ["black-friday", "weekday-morning"]
    assert windows[0].lead_seconds == 1800
