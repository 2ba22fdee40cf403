"""Shards of the pools across operator replicas: which shard serves a pool, and which
shards a replica should take or give up. Pure: no I/O, no clock.

The Leases that carry the assignment (one per shard, one per member slot) are
:class:`prescaler.kube.ShardLeases`; this module only decides.

- A pool's shard is a stable hash (SHA-256, not Python's salted ``hash``) of its demand
  series as the spec names it: the Prometheus URL, the engine, the selector and the query
  overrides (and each role's selector). Pools that read one series land on one shard, so
  the replica serving them shares one history and one forecast fit between them, as a
  single operator does. A pool without ``spec.forecast`` hashes by its namespace and name.
- Replicas count themselves on member slot Leases (one slot each, ``shards`` slots): the
  live slots are the replicas.
- :func:`balance` spreads the pools, not just the shards: a shard weighs the pools it
  holds (plus one, so empty shards spread too). Free or expired shards go, heaviest
  first, each to the replica least loaded at that point. The most loaded replica gives
  up (after it stops acting on it) the shard whose move to the least loaded one leaves
  the larger of their two loads lowest, one per round and only if that lowers it by a
  quarter of the shard (:data:`MOVE_GAIN`): each such move lowers the sum of squared
  loads, so the moves end, and a
  replica that joins takes from the loaded ones rather than setting off moves among
  them. Every replica computes the same from the same
  Leases and pools; while their views differ, the Leases still keep a shard on one
  replica at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MOVE_GAIN = 0.25
"""A shard moves only if that lowers the larger load of the two replicas by at least this
share of the shard's weight: pools spread within a few percent do not move back and forth
(a move costs their history reads and fits on the new replica)."""

SHARD_LEASE_LABEL = "prescaler.io/lease-set"
"""Label on every Lease of one set (its value: the set's base name), so one list reads them."""


def series_key(namespace: str, name: str, spec: Mapping[str, Any]) -> str:
    """What a pool's shard is hashed from: its demand series as the spec names it."""
    forecast = spec.get("forecast")
    if not isinstance(forecast, Mapping):
        return json.dumps(["pool", namespace, name])
    prometheus = forecast.get("prometheus") or {}
    url = str(prometheus.get("url", "")).rstrip("/") if isinstance(prometheus, Mapping) else ""
    roles = spec.get("roles") or {}
    role_selectors = (
        sorted(
            (str(role), str((view or {}).get("selector", "")))
            for role, view in roles.items()
            if isinstance(view, Mapping)
        )
        if isinstance(roles, Mapping)
        else []
    )
    return json.dumps(
        [
            "series",
            url,
            str(forecast.get("engine", "vllm")),
            str(forecast.get("selector", "")),
            forecast.get("queries") or {},
            role_selectors,
        ],
        sort_keys=True,
    )


def shard_of(key: str, shards: int) -> int:
    """The shard in ``[0, shards)`` of a series key; the same in every process."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def pool_shard(namespace: str, name: str, spec: Mapping[str, Any], shards: int) -> int:
    """The shard that serves a pool."""
    return shard_of(series_key(namespace, name, spec), shards)


@dataclass(frozen=True, slots=True)
class Moves:
    """One round's decision: shards to try to take, and to stop acting on and give up
    (they are released once nothing runs on them)."""

    acquire: tuple[int, ...] = ()
    release: tuple[int, ...] = ()


def balance(
    weights: Sequence[float],
    holders: Mapping[int, int | None],
    live_slots: Collection[int],
    my_slot: int | None,
    draining: Collection[int] = (),
) -> Moves:
    """One round of a replica on ``my_slot``: ``weights`` per shard, ``holders`` the live
    slot holding each shard (``None``: free or expired), ``draining`` the shards it is
    giving up. Without a slot it takes nothing (and should give up what it holds)."""
    if my_slot is None:
        return Moves()  # the caller gives up what it holds: it is not counted
    mine = sorted(i for i, h in holders.items() if h == my_slot and i not in draining)
    live = sorted(set(live_slots) | {my_slot})
    load = dict.fromkeys(live, 0.0)
    count = dict.fromkeys(live, 0)
    for shard, holder in holders.items():
        if holder in load and shard not in (draining if holder == my_slot else ()):
            load[holder] += weights[shard]
            count[holder] += 1
    # The shards it is giving up go to the least loaded of the others, as they will.
    for shard in sorted(i for i, h in holders.items() if h == my_slot and i in draining):
        others = [s for s in live if s != my_slot]
        if others:
            taker = min(others, key=lambda s: (load[s], count[s], s))
            load[taker] += weights[shard]
            count[taker] += 1
    # Free shards, heaviest first, each to the least loaded replica as they are handed out.
    acquire = []
    for shard in sorted(
        (i for i, h in holders.items() if h is None), key=lambda i: (-weights[i], i)
    ):
        taker = min(live, key=lambda s: (load[s], count[s], s))
        load[taker] += weights[shard]
        count[taker] += 1
        if taker == my_slot:
            acquire.append(shard)
    if acquire:
        return Moves(acquire=tuple(sorted(acquire)))
    # Only the most loaded replica gives a shard up, the one that leaves the pair (it and
    # the least loaded) with the lowest maximum, and only if that is below its load now.
    least = min(live, key=lambda s: (load[s], count[s], s))
    most = max(live, key=lambda s: (load[s], count[s], -s))
    if most != my_slot or not mine:
        return Moves()

    def worse(shard: int) -> tuple[float, float, int]:
        after = max(load[my_slot] - weights[shard], load[least] + weights[shard])
        return after, weights[shard], -shard

    best = min(mine, key=worse)
    if load[my_slot] - worse(best)[0] < MOVE_GAIN * weights[best]:
        return Moves()  # too little to gain for what the move costs
    return Moves(release=(best,))


def shard_lease_name(base: str, shard: int) -> str:
    """The Lease of one shard."""
    return f"{base}-shard-{shard}"


def slot_lease_name(base: str, slot: int) -> str:
    """The Lease of one member slot (a replica holds one to be counted)."""
    return f"{base}-member-{slot}"


def lease_names(base: str, shards: int) -> Sequence[str]:
    """Every Lease of a set of ``shards`` shards (for RBAC's resourceNames)."""
    return [
        *(shard_lease_name(base, i) for i in range(shards)),
        *(slot_lease_name(base, i) for i in range(shards)),
    ]
