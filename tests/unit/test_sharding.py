"""Shard assignment (``prescaler.sharding``): a stable hash of the demand series, fair
quotas that sum to the shard count, and rebalancing moves. Pure, no I/O."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from prescaler.sharding import (
    lease_names,
    pool_shard,
    quota,
    rebalance,
    series_key,
    shard_of,
)


def _spec(url: str = "http://prom:9090", selector: str = 'model="a"', **forecast: Any) -> Any:
    return {
        "target": {"name": "llm"},
        "forecast": {"prometheus": {"url": url}, "selector": selector, **forecast},
    }


def test_pools_reading_one_series_share_a_shard_whatever_else_differs() -> None:
    a = {**_spec(), "minReplicas": 1, "model": {"preset": "llama-3.1-8b"}}
    b = {**_spec(url="http://prom:9090/"), "maxReplicas": 40}
    assert series_key("ns1", "a", a) == series_key("ns2", "b", b)
    for shards in (1, 2, 3, 7, 64):
        assert pool_shard("ns1", "a", a, shards) == pool_shard("ns2", "b", b, shards)


def test_another_series_is_another_key() -> None:
    base = series_key("ns", "a", _spec())
    assert series_key("ns", "a", _spec(selector='model="b"')) != base
    assert series_key("ns", "a", _spec(url="http://other:9090")) != base
    assert series_key("ns", "a", _spec(engine="sglang")) != base
    overridden = _spec(queries={"requestsPerSecond": "sum(rate(x[1m]))"})
    assert series_key("ns", "a", overridden) != base
    # Without a forecast, a pool is its own series.
    assert series_key("ns", "a", {"target": {"name": "x"}}) != series_key(
        "ns", "b", {"target": {"name": "x"}}
    )


def test_the_shard_is_the_same_in_another_process() -> None:
    """Not Python's salted ``hash``: every replica must compute the same shard."""
    keys = [series_key("ns", f"p{i}", {}) for i in range(20)]
    here = [shard_of(k, 7) for k in keys]
    code = (
        "import json,sys; from prescaler.sharding import shard_of; "
        "print(json.dumps([shard_of(k, 7) for k in json.load(sys.stdin)]))"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(keys),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert json.loads(out.stdout) == here


def test_shards_spread_pools_evenly() -> None:
    counts = Counter(pool_shard("ns", f"p{i}", {}, 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 1.1 * 1000


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8, 12])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
def test_quotas_sum_to_the_shards(shards: int, replicas: int) -> None:
    slots = list(range(0, 2 * replicas, 2))  # slots need not be contiguous
    quotas = [quota(shards, slots, s) for s in slots]
    assert sum(quotas) == shards
    assert max(quotas) - min(quotas) <= 1


def test_no_slot_no_quota() -> None:
    assert quota(4, [0, 1], None) == 0
    assert quota(4, [], 0) == 4  # alone (its own slot counts even if not listed)


def test_over_the_quota_the_highest_shards_are_given_up() -> None:
    moves = rebalance(held={0, 1, 2, 3}, draining=set(), available=set(), quota=2)
    assert moves.release == (3, 2)
    assert moves.acquire == ()
    # Already draining: not given up twice, and not counted as acting.
    moves = rebalance(held={0, 1, 2, 3}, draining={3}, available=set(), quota=2)
    assert moves.release == (2,)


def test_under_the_quota_drains_are_undone_then_free_shards_taken() -> None:
    moves = rebalance(held={0, 5}, draining={5}, available={1, 2, 3, 5}, quota=3)
    assert moves.keep == (5,)
    assert moves.acquire == (1,)
    assert moves.release == ()


def test_at_the_quota_nothing_moves() -> None:
    assert rebalance(held={0, 1}, draining=set(), available={2}, quota=2) == rebalance(
        held={1, 0}, draining=(), available=(), quota=2
    )
    assert rebalance(held={0, 1}, draining=set(), available={2}, quota=2).acquire == ()


def test_lease_names_cover_shards_and_member_slots() -> None:
    assert lease_names("prescaler", 2) == [
        "prescaler-shard-0",
        "prescaler-shard-1",
        "prescaler-member-0",
        "prescaler-member-1",
    ]
