"""Shard assignment (``prescaler.sharding``): a stable hash of a pool's primary target,
the label that names it and the selectors that watch it, and rebalancing moves. Pure, no
I/O."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from prescaler.sharding import (
    SHARD_LABEL,
    Moves,
    balance,
    label_patch,
    labelled_shard,
    lease_names,
    pool_shard,
    primary_target,
    relabel_selector,
    shard_label,
    shard_of,
    shard_selector,
    workload_key,
    workload_shard,
)


def _spec(target: str = "llm", selector: str = 'model="a"', **extra: Any) -> Any:
    return {
        "target": {"name": target},
        "forecast": {"prometheus": {"url": "http://prom:9090"}, "selector": selector},
        **extra,
    }


def test_pools_on_one_target_share_a_shard_whatever_else_differs() -> None:
    a = {**_spec(), "minReplicas": 1, "model": {"preset": "llama-3.1-8b"}}
    b = {**_spec(selector='model="other"'), "maxReplicas": 40}
    for shards in (1, 2, 3, 7, 64):
        assert pool_shard("ns", a, shards) == pool_shard("ns", b, shards)
        # ... and the workload's own shard is theirs: its gated pods go to that replica.
        assert pool_shard("ns", a, shards) == workload_shard("ns", "Deployment", "llm", shards)


def test_another_target_or_namespace_is_another_key() -> None:
    base = primary_target("ns", _spec())
    assert base == ("ns", "Deployment", "llm")
    assert primary_target("ns", _spec(target="other")) != base
    assert primary_target("other", _spec()) != base
    sts = {"target": {"kind": "StatefulSet", "name": "llm"}}
    assert primary_target("ns", sts) == ("ns", "StatefulSet", "llm")


def test_a_pool_with_roles_is_on_the_shard_of_its_first_role_target() -> None:
    spec = {
        "roles": {
            "prefill": {"target": {"name": "llm-prefill"}},
            "decode": {"target": {"name": "llm-decode"}},
        }
    }
    assert primary_target("ns", spec) == ("ns", "Deployment", "llm-decode")
    assert pool_shard("ns", spec, 16) == workload_shard("ns", "Deployment", "llm-decode", 16)


def test_the_shard_is_the_same_in_another_process() -> None:
    """Not Python's salted ``hash``: every replica must compute the same shard."""
    keys = [workload_key("ns", "Deployment", f"p{i}") for i in range(20)]
    here = [shard_of(k, 7) for k in keys]
    code = (
        "import json,sys; from prescaler.sharding import shard_of; "
        "print(json.dumps([shard_of(k, 7) for k in json.load(sys.stdin)]))"
    )
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
    counts = Counter(pool_shard("ns", {"target": {"name": f"p{i}"}}, 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 1.1 * 1000


def test_the_label_names_the_shard_and_the_count() -> None:
    assert shard_label(3, 6) == "3-of-6"
    assert label_patch(3, 6) == {"metadata": {"labels": {SHARD_LABEL: "3-of-6"}}}
    assert labelled_shard({SHARD_LABEL: "3-of-6"}, 6) == 3
    assert labelled_shard({SHARD_LABEL: "0-of-6"}, 6) == 0


@pytest.mark.parametrize(
    "labels",
    [
        None,
        {},
        {"app": "x"},
        {SHARD_LABEL: "3-of-5"},  # another shard count
        {SHARD_LABEL: "6-of-6"},  # no such shard
        {SHARD_LABEL: "03-of-6"},
        {SHARD_LABEL: "-1-of-6"},
        {SHARD_LABEL: "3"},
        {SHARD_LABEL: ""},
    ],
)
def test_a_label_of_no_shard_of_this_count_names_none(labels: dict[str, str] | None) -> None:
    assert labelled_shard(labels, 6) is None


def _matches(selector: str, labels: dict[str, str]) -> bool:
    """The API server's reading of the two selector forms used here."""
    key, _, rest = selector.partition(" notin ")
    if rest:
        values = rest.strip("()").split(",")
        return labels.get(key) not in values
    key, _, value = selector.partition("=")
    return labels.get(key) == value


@pytest.mark.parametrize("shards", [1, 2, 6, 16])
def test_every_pool_is_selected_by_exactly_one_watch(shards: int) -> None:
    """A pool labelled for this count is in its shard's watch only; any other (none, another
    count, a bad value) is in the relabel watch only: none is lost, none is seen twice."""
    cases: list[dict[str, str]] = [{}, {SHARD_LABEL: "x"}, {SHARD_LABEL: f"0-of-{shards + 1}"}]
    cases += [{SHARD_LABEL: shard_label(i, shards)} for i in range(shards)]
    selectors = [shard_selector(i, shards) for i in range(shards)] + [relabel_selector(shards)]
    for labels in cases:
        hits = [i for i, sel in enumerate(selectors) if _matches(sel, labels)]
        named = labelled_shard(labels, shards)
        assert hits == [named if named is not None else shards], labels


def test_the_selectors_are_what_the_api_server_reads() -> None:
    assert shard_selector(2, 6) == "prescaler.io/shard=2-of-6"
    assert relabel_selector(3) == "prescaler.io/shard notin (0-of-3,1-of-3,2-of-3)"


def _settle(
    weights: list[float],
    slots: list[int],
    start: dict[int, int | None] | None = None,
    rounds: int = 50,
) -> dict[int, int | None]:
    """Every replica's rounds, one after another, from ``start`` (all free by default),
    with a shard given up becoming free at once and taken when a replica's round says so,
    until nothing moves."""
    holders = dict(start) if start else dict.fromkeys(range(len(weights)))
    for _ in range(rounds):
        moved = False
        for slot in slots:
            moves = balance(weights, holders, slots, slot)
            for shard in moves.release:
                holders[shard] = None
                moved = True
            for shard in moves.acquire:
                assert holders[shard] is None
                holders[shard] = slot
                moved = True
        if not moved:
            return holders
    raise AssertionError(f"still moving after {rounds} rounds: {holders}")


def _loads(weights: list[float], holders: dict[int, int | None]) -> dict[int | None, float]:
    loads: dict[int | None, float] = {}
    for shard, slot in holders.items():
        loads[slot] = loads.get(slot, 0.0) + weights[shard]
    return loads


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8, 12])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
def test_equal_shards_spread_as_evenly_as_their_count_allows(shards: int, replicas: int) -> None:
    slots = list(range(0, 2 * replicas, 2))  # slots need not be contiguous
    holders = _settle([1.0] * shards, slots)
    assert None not in holders.values()
    counts = Counter(holders.values())
    per = [counts.get(s, 0) for s in slots]
    assert max(per) - min(per) <= 1


def test_shards_of_unequal_weight_spread_the_pools() -> None:
    """10 series of 200 pools hashed to 12 shards (as in the benchmark): by count the
    replicas held 200, 600 and 1,200 pools; by weight as evenly as whole series allow."""
    weights = [1.0] * 12
    for shard in [0, 0, 3, 3, 3, 5, 7, 7, 9, 11]:
        weights[shard] += 200
    holders = _settle(weights, [0, 1, 2])
    loads = sorted(_loads(weights, holders).values())
    assert loads[-1] - loads[0] <= 200 + 3, loads  # at most one series apart
    assert max(loads) <= 801 + 4


def test_a_replica_that_joins_takes_from_the_loaded_ones_only() -> None:
    weights = [51.0, 47.0, 55.0, 49.0, 50.0, 53.0]
    before = _settle(weights, [0, 1, 2])
    after = _settle(weights, [0, 1, 2, 3], before)
    moved = {shard for shard in before if before[shard] != after[shard]}
    assert moved
    assert all(after[shard] == 3 for shard in moved)
    assert Counter(after.values())[3] >= 1


def test_free_shards_go_heaviest_first_to_the_least_loaded() -> None:
    weights = [10.0, 30.0, 20.0]
    holders: dict[int, int | None] = {0: 0, 1: None, 2: None}
    assert balance(weights, holders, [0, 1], 0) == Moves(acquire=(2,))
    assert balance(weights, holders, [0, 1], 1) == Moves(acquire=(1,))


def test_over_the_mean_the_largest_shard_lighter_than_the_gap_is_given_up() -> None:
    weights = [40.0, 10.0, 25.0, 5.0]
    holders: dict[int, int | None] = {0: 0, 1: 0, 2: 0, 3: 1}
    # Loads 75 and 5, the gap 70: 40 goes (the largest lighter than the gap).
    assert balance(weights, holders, [0, 1], 0) == Moves(release=(0,))
    assert balance(weights, holders, [0, 1], 1) == Moves()
    # A shard it is giving up already is not counted, nor given up twice.
    assert balance(weights, holders, [0, 1], 0, draining={0}) == Moves()
    # Without a slot, a replica takes nothing.
    assert balance(weights, {0: None, 1: None, 2: None, 3: None}, [0], None) == Moves()


def test_lease_names_cover_shards_and_member_slots() -> None:
    assert lease_names("prescaler", 2) == [
        "prescaler-shard-0",
        "prescaler-shard-1",
        "prescaler-member-0",
        "prescaler-member-1",
    ]


def test_pools_spread_within_a_few_percent_do_not_move() -> None:
    weights = [55.0, 50.0, 49.0, 51.0, 47.0, 53.0]
    holders: dict[int, int | None] = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 3}
    # Loads 105, 100, 47, 53: moving 50 to the least loaded would leave 97 for 105.
    for slot in range(4):
        assert balance(weights, holders, [0, 1, 2, 3], slot) == Moves()
