"""Shards of the pools across operator replicas: which shard serves a pool, and which
shards a replica should take or give up. Pure: no I/O, no clock.

The Leases that carry the assignment (one per shard, one per member slot) are
:class:`prescaler.kube.ShardLeases`; this module only decides.

- A pool's shard is a stable hash (SHA-256, not Python's salted ``hash``) of its primary
  target: its namespace and its target's kind and name (a pool with roles: the first of
  its role targets). Every pool on one target lands on one shard, so what needs all the
  pools of a target is local to one replica: which of two pools on one target keeps it
  (the older), and who decides a gated pod of that workload (the replica serving the
  workload's shard, whether a pool claims it or not). Pools reading one series but
  scaling different targets may land on different replicas, which then each read and
  fit that series: a cost, where the alternative (a shard per series) let two replicas
  scale one target without either seeing the other's pool.
- Each pool carries its shard as a label (:data:`SHARD_LABEL`, :func:`shard_label`), so
  a replica watches only the pools of the shards it serves (:func:`shard_selector`), and
  the pools no such selector matches (:func:`relabel_selector`: new, or labelled under
  another shard count) until they are labelled. A pool whose spec moves it to another
  shard is relabelled by the replica serving the shard its label names, and leaves that
  replica's watch for the other's.
- Replicas count themselves on member slot Leases (one slot each, ``shards`` slots): the
  live slots are the replicas.
- :func:`balance` spreads the pools, not just the shards: a shard weighs the pools it
  holds (plus one, so empty shards spread too), as its holder counts them and writes on
  the shard's Lease (:data:`WEIGHT_ANNOTATION`; no replica watches all the pools). Free
  or expired shards go, heaviest first, each to the replica least loaded at that point.
  The most loaded replica gives up (after it stops acting on it) the shard whose move to
  the least loaded one leaves the larger of their two loads lowest, one per round and
  only if that lowers it by a quarter of the shard (:data:`MOVE_GAIN`): each such move
  lowers the sum of squared loads, so the moves end, and a replica that joins takes from
  the loaded ones rather than setting off moves among them. Every replica computes the
  same from the same Leases; while their views differ, the Leases still keep a shard on
  one replica at a time.
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

SHARD_LABEL = "prescaler.io/shard"
"""Label on every pool with its shard (:func:`shard_label`), written by the operator: each
replica watches only the pools labelled with the shards it serves."""

WEIGHT_ANNOTATION = "prescaler.io/pools"
"""Annotation on a shard's Lease: how many pools its holder sees in it (what the shard
weighs for the other replicas, which do not watch its pools)."""

SHARD_LEASE_LABEL = "prescaler.io/lease-set"
"""Label on every Lease of one set (its value: the set's base name), so one list reads them."""


def primary_target(namespace: str, spec: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(namespace, kind, name)`` of the workload a pool's shard is hashed from: its
    target, or (a pool with roles) the first of its role targets in that order."""
    roles = spec.get("roles")
    targets = [spec.get("target") or {}]
    if isinstance(roles, Mapping):
        targets = [(r or {}).get("target") or {} for r in roles.values() if isinstance(r, Mapping)]
    keys = sorted(
        (str(t.get("kind", "Deployment")), str(t.get("name")))
        for t in targets
        if isinstance(t, Mapping)
    )
    kind, name = keys[0] if keys else ("Deployment", "None")
    return namespace, kind, name


def workload_key(namespace: str, kind: str, name: str) -> str:
    """What the shard of a workload (and of the pools whose primary target it is) is
    hashed from."""
    return json.dumps(["target", namespace, kind, name])


def shard_of(key: str, shards: int) -> int:
    """The shard in ``[0, shards)`` of a key; the same in every process."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def workload_shard(namespace: str, kind: str, name: str, shards: int) -> int:
    """The shard of a workload: the one whose replica decides its gated pods that no pool
    claims, and serves every pool whose primary target it is."""
    return shard_of(workload_key(namespace, kind, name), shards)


def pool_shard(namespace: str, spec: Mapping[str, Any], shards: int) -> int:
    """The shard that serves a pool: its primary target's (:func:`primary_target`)."""
    return workload_shard(*primary_target(namespace, spec), shards)


# ---------------------------------------------------------------------- pool labels
def shard_label(shard: int, shards: int) -> str:
    """The value of :data:`SHARD_LABEL` on a pool of ``shard`` out of ``shards``: the
    count is part of it, so a pool labelled under another count is found (and relabelled)
    like an unlabelled one."""
    return f"{shard}-of-{shards}"


def labelled_shard(labels: Mapping[str, Any] | None, shards: int) -> int | None:
    """The shard a pool's labels name under ``shards`` (``None``: unlabelled, labelled
    under another count, or a value that is not one of :func:`shard_label`'s)."""
    value = (labels or {}).get(SHARD_LABEL)
    if not isinstance(value, str):
        return None
    head, sep, count = value.partition("-of-")
    if not sep or count != str(shards) or not head.isdigit():
        return None
    shard = int(head)
    return shard if 0 <= shard < shards and value == shard_label(shard, shards) else None


def shard_selector(shard: int, shards: int) -> str:
    """The label selector of one shard's pools (the watch of the replica serving it)."""
    return f"{SHARD_LABEL}={shard_label(shard, shards)}"


def relabel_selector(shards: int) -> str:
    """The label selector of every pool that no shard's selector matches: unlabelled, or
    labelled under another shard count or with a value of no shard (``notin`` also matches
    a pool without the label)."""
    values = ",".join(shard_label(i, shards) for i in range(shards))
    return f"{SHARD_LABEL} notin ({values})"


def label_patch(shard: int, shards: int) -> dict[str, Any]:
    """The merge patch that labels a pool with its shard."""
    return {"metadata": {"labels": {SHARD_LABEL: shard_label(shard, shards)}}}


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
