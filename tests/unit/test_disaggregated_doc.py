"""The disaggregated pool in docs/disaggregated.md is a real, valid pool."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from prescaler.api import capacity_model, check_spec, fleets, parse_spec, scaling_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "disaggregated.md"


def test_the_documented_pool_parses_and_means_what_its_comments_say() -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    pool = yaml.safe_load(block)
    spec = parse_spec(pool["spec"])
    check_spec(spec)
    views = dict(fleets(spec))
    prefill, decode = views["prefill"], views["decode"]
    assert (scaling_policy(prefill).max_replicas, scaling_policy(decode).max_replicas) == (8, 16)
    assert decode.model.gpus_per_replica == 2
    assert prefill.model.gpus_per_replica == 4
    assert decode.forecast is not None
    assert decode.forecast.selector == 'namespace="serving",model_name="llama",role="decode"'
    assert capacity_model(prefill, role="prefill").unit.name == "prompt tok/s"
    decoding = capacity_model(decode, role="decode")
    assert decoding.unit.name == "output tok/s"
    assert decoding.max_concurrent_requests_per_replica is not None
