"""Shard assignment (``prescaler.sharding``): a stable hash of a pool's primary target,
the label that names it and the selectors that watch it, and rebalancing moves. Pure, no
I/O."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from prescaler.sharding import (
    PRIMARY,
    SECONDARY,
    Moves,
    balance,
    label_patch,
    labelled_shard,
    labelled_shards,
    lease_names,
    parse_shard_key,
    pool_shard,
    primary_target,
    relabel_selector,
    settle,
    shard_key,
    shard_labels,
    shard_of,
    shard_selector,
    touched_shards,
    valid_label_key,
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


def _roles(*targets: str) -> dict[str, Any]:
    return {"roles": {f"r{i}": {"target": {"name": t}} for i, t in enumerate(targets)}}


def _on(shard: int, shards: int, avoid: set[str] = set()) -> str:  # noqa: B006 (read only)
    return next(
        name
        for name in (f"t{i}" for i in itertools.count())
        if name not in avoid and workload_shard("ns", "Deployment", name, shards) == shard
    )


def test_a_pool_touches_its_targets_shards_and_is_served_on_its_first() -> None:
    assert touched_shards("ns", _spec(), 6) == {pool_shard("ns", _spec(), 6): PRIMARY}
    first, second = _on(1, 6), _on(4, 6)
    first, second = sorted([first, second])
    spec = _roles(second, first)
    home = pool_shard("ns", spec, 6)
    assert home == workload_shard("ns", "Deployment", first, 6)
    other = workload_shard("ns", "Deployment", second, 6)
    assert touched_shards("ns", spec, 6) == {home: PRIMARY, other: SECONDARY}
    # Role targets on one shard: that shard only, as primary.
    one = _on(1, 6)
    assert touched_shards("ns", _roles(one, _on(1, 6, {one})), 6) == {1: PRIMARY}


def test_the_labels_name_each_touched_shard_and_the_count() -> None:
    assert shard_key(3, 6) == "prescaler.io/shard-3-of-6"
    assert parse_shard_key("prescaler.io/shard-3-of-6") == (3, 6)
    plain = {"target": {"name": _on(3, 6)}}
    assert shard_labels("ns", plain, 6) == {"prescaler.io/shard-3-of-6": PRIMARY}
    spec = _roles(*sorted([_on(2, 6), _on(5, 6)]))
    home = pool_shard("ns", spec, 6)
    want = {
        shard_key(s, 6): PRIMARY if s == home else SECONDARY for s in touched_shards("ns", spec, 6)
    }
    assert shard_labels("ns", spec, 6) == want
    assert len(want) == 2
    assert labelled_shard(want, 6) == home
    assert labelled_shards(want, 6) == dict(touched_shards("ns", spec, 6).items())


@pytest.mark.parametrize("shards", [1, 6, 64, 1024])
def test_every_shard_key_is_a_valid_label_key(shards: int) -> None:
    for shard in {0, shards // 2, shards - 1}:
        key = shard_key(shard, shards)
        assert valid_label_key(key)
        assert len(key.partition("/")[2]) <= 63
    with pytest.raises(ValueError, match="no shard"):
        shard_key(shards, shards)


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("prescaler.io/shard-0-of-1", True),
        ("app", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("prescaler.io/" + "a" * 64, False),
        ("prescaler.io/-shard", False),
        ("prescaler.io/shard-", False),
        ("Prescaler.io/shard", False),
        ("prescaler.io/", False),
        ("prescaler.io/sh@rd", False),
    ],
)
def test_label_key_validity_is_the_api_servers(key: str, valid: bool) -> None:
    assert valid_label_key(key) is valid


@pytest.mark.parametrize(
    "labels",
    [
        None,
        {},
        {"app": "x"},
        {"prescaler.io/shard-3-of-5": PRIMARY},  # another shard count
        {"prescaler.io/shard-6-of-6": PRIMARY},  # no such shard
        {"prescaler.io/shard-03-of-6": PRIMARY},
        {"prescaler.io/shard-3-of-6": SECONDARY},  # no primary
        {"prescaler.io/shard-3-of-6": ""},
        {"prescaler.io/shard-3-of-6": PRIMARY, "prescaler.io/shard-4-of-6": PRIMARY},
    ],
)
def test_labels_of_no_single_primary_of_this_count_name_none(
    labels: dict[str, str] | None,
) -> None:
    assert labelled_shard(labels, 6) is None


def test_the_patch_sets_what_the_spec_says_and_removes_the_rest() -> None:
    spec = _roles(*sorted([_on(0, 4), _on(3, 4)]))
    want = shard_labels("ns", spec, 4)
    assert label_patch(want, "ns", spec, 4) is None
    assert label_patch({**want, "app": "x"}, "ns", spec, 4) is None
    assert label_patch(None, "ns", spec, 4) == {"metadata": {"labels": want}}
    stale = {
        "app": "x",
        "prescaler.io/shard-1-of-3": PRIMARY,  # another count
        "prescaler.io/shard-2-of-4": SECONDARY,  # a target it no longer has
        **dict.fromkeys(want, PRIMARY),  # one value wrong
    }
    patch = label_patch(stale, "ns", spec, 4)
    assert patch is not None
    changed = patch["metadata"]["labels"]
    assert changed == {
        **{k: v for k, v in want.items() if v != PRIMARY},
        "prescaler.io/shard-1-of-3": None,
        "prescaler.io/shard-2-of-4": None,
    }
    # Applied as a merge patch, the labels are what the spec says.
    after = {k: v for k, v in {**stale, **changed}.items() if v is not None}
    assert label_patch(after, "ns", spec, 4) is None


def _matches(selector: str, labels: dict[str, str]) -> bool:
    """The API server's reading of the selector forms used here: comma-separated
    requirements, each ``key`` (exists) or ``key notin (values)``."""
    for requirement in selector.split(","):
        key, _, rest = requirement.partition(" notin ")
        if rest:
            if labels.get(key) in rest.strip("()").split(" "):
                return False
        elif key not in labels:
            return False
    return True


@pytest.mark.parametrize("shards", [1, 2, 6, 16])
def test_each_pool_is_in_the_watch_of_every_shard_it_touches_or_the_relabel_one(
    shards: int,
) -> None:
    """A pool labelled for this count is in the watch of each shard it touches, and of no
    other; one that no label names a primary of (none, another count, a bad value) is in
    the relabel watch: none is lost."""
    specs = [{"target": {"name": f"p{i}"}} for i in range(8)]
    specs += [_roles(f"p{i}", f"q{i}", f"r{i}") for i in range(8)]
    selectors = [shard_selector(i, shards) for i in range(shards)]
    relabel = relabel_selector(shards)
    for spec in specs:
        labels = shard_labels("ns", spec, shards)
        hits = {i for i, sel in enumerate(selectors) if _matches(sel, labels)}
        assert hits == set(touched_shards("ns", spec, shards))
        assert not _matches(relabel, labels)
    for labels in (
        {},
        {"app": "x"},
        {shard_key(0, shards + 1): PRIMARY},
        {shard_key(0, shards): SECONDARY},
        {shard_key(0, shards): "x"},
    ):
        assert _matches(relabel, labels), labels


def test_the_selectors_are_what_the_api_server_reads() -> None:
    assert shard_selector(2, 6) == "prescaler.io/shard-2-of-6"
    assert relabel_selector(2) == (
        "prescaler.io/shard-0-of-2 notin (primary),prescaler.io/shard-1-of-2 notin (primary)"
    )


def _settle(
    weights: list[float],
    slots: list[int],
    start: dict[int, int | None] | None = None,
) -> dict[int, int | None]:
    return settle(weights, start or dict.fromkeys(range(len(weights))), slots)


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


def test_a_join_can_leave_the_one_it_took_from_least_loaded_and_take_a_second_move() -> None:
    """Seen with 300 pools on 6 shards: the joiner takes 53 from the most loaded (106),
    which is then the least loaded; the next most loaded (102) gives it 39, which lowers
    the larger of their two loads by 10, a quarter of 39 and more. The replicas move
    exactly what the rule says: the cluster test compares them with :func:`settle`."""
    weights = [53.0, 39.0, 48.0, 63.0, 53.0, 50.0]
    before: dict[int, int | None] = {0: 2, 4: 2, 2: 0, 5: 0, 1: 1, 3: 1}
    assert balance(weights, before, [0, 1, 2, 3], 2) == Moves(release=(4,))
    after = settle(weights, before, [0, 1, 2, 3])
    assert after == {0: 2, 1: 2, 2: 0, 3: 1, 4: 3, 5: 0}
    # A quarter is the bar: with shard 1 two pools heavier, the gain (10) falls below it.
    heavier = [53.0, 41.0, 48.0, 63.0, 53.0, 50.0]
    assert settle(heavier, before, [0, 1, 2, 3]) == {**before, 4: 3}


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
