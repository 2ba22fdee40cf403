"""Shards of the pools across operator replicas: which shard serves a pool, and which
shards a replica should take or give up. Pure: no I/O, no clock.

The Leases that carry the assignment (one per shard, one per member slot) are
:class:`prescaler.kube.ShardLeases`; this module only decides.

- A pool's shard is a stable hash (SHA-256, not Python's salted ``hash``) of its primary
  target: its namespace and its target's kind and name (a pool with roles: the first of
  its role targets). Pools reading one series but scaling different targets may land on
  different replicas, which then each read and fit that series: a cost, where the
  alternative (a shard per series) let two replicas scale one target without either
  seeing the other's pool.
- A pool touches the shards its targets hash to (:func:`touched_shards`): its primary
  shard, and (a pool with roles on several shards) secondary ones. It carries one label
  per touched shard (:func:`shard_labels`: ``prescaler.io/shard-<i>-of-<n>`` valued
  ``primary`` or ``secondary``), so a replica watches only the pools that touch the
  shards it serves (:func:`shard_selector`): it serves those it is primary for, and sees
  the rest, which is what needs every pool of a target: which of two pools on one target
  keeps it (the older), and who decides a gated pod of that workload (the replica of the
  pool that keeps it, else the replica serving the workload's shard). A replica that
  serves a pool with a secondary shard it does not serve watches that shard's pools too
  (not to serve them: to see every other claim on that pool's targets there). The pools no
  label names a primary of (:func:`relabel_selector`: new, or labelled under another
  shard count) are watched too, until they are labelled. A pool whose labels are not
  what its spec says (:func:`label_patch`) is relabelled by the replica serving its
  primary shard, or the one serving the shard its labels name as primary.
- Replicas count themselves on member slot Leases (one slot each, ``shards`` slots): the
  live slots are the replicas.
- :func:`balance` spreads the pools, not just the shards: a shard weighs the pools it
  holds (plus one, so empty shards spread too), as its holder counts them and writes on
  the shard's Lease (:data:`WEIGHT_ANNOTATION`; no replica watches all the pools). Free
  or expired shards go, heaviest first, each to the replica least loaded at that point.
  The most loaded replica gives up (after it stops acting on it) the shard whose move to
  the least loaded one leaves the larger of their two loads lowest, one per round and
  only if that lowers it by a quarter of the shard (:data:`MOVE_GAIN`): each such move
  lowers the sum of squared loads, so the moves end (:func:`settle` finds where). A
  replica that joins takes from the loaded ones; a move among them follows only where the
  one it took from is left the least loaded and that same bar is met. Every replica
  computes the same from the same Leases; while their views differ, the Leases still
  keep a shard on one replica at a time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MOVE_GAIN = 0.25
"""A shard moves only if that lowers the larger load of the two replicas by at least this
share of the shard's weight: pools spread within a few percent do not move back and forth
(a move costs their history reads and fits on the new replica)."""

WEIGHT_ANNOTATION = "prescaler.io/pools"
"""Annotation on a shard's Lease: how many pools its holder sees in it (what the shard
weighs for the other replicas, which do not watch its pools)."""

SHARD_LEASE_LABEL = "prescaler.io/lease-set"
"""Label on every Lease of one set (its value: the set's base name), so one list reads them."""


def pool_targets(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(kind, name)`` of every workload a pool scales, sorted: its target, or (a pool
    with roles) each role's."""
    roles = spec.get("roles")
    targets = [spec.get("target") or {}]
    if isinstance(roles, Mapping):
        targets = [(r or {}).get("target") or {} for r in roles.values() if isinstance(r, Mapping)]
    return sorted(
        {
            (str(t.get("kind", "Deployment")), str(t.get("name")))
            for t in targets
            if isinstance(t, Mapping)
        }
    )


def primary_target(namespace: str, spec: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(namespace, kind, name)`` of the workload a pool's shard is hashed from: its
    target, or (a pool with roles) the first of its role targets in that order."""
    keys = pool_targets(spec)
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


def touched_shards(namespace: str, spec: Mapping[str, Any], shards: int) -> dict[int, str]:
    """Every shard a pool touches, with its part in it: :data:`PRIMARY` for the shard that
    serves it (:func:`pool_shard`), :data:`SECONDARY` for the other shards its targets
    hash to (a pool with roles whose role targets are on several shards)."""
    touched = {
        workload_shard(namespace, kind, name, shards): SECONDARY
        for kind, name in pool_targets(spec)
    }
    touched[pool_shard(namespace, spec, shards)] = PRIMARY
    return touched


# ---------------------------------------------------------------------- pool labels
SHARD_KEY_PREFIX = "prescaler.io/shard-"
"""The labels the operator keeps on every pool: one per shard it touches,
``prescaler.io/shard-<i>-of-<n>`` (:func:`shard_key`), valued :data:`PRIMARY` or
:data:`SECONDARY` (:func:`shard_labels`). Each replica watches, per shard it serves, the
pools that have that shard's key (:func:`shard_selector`): it serves those whose key says
primary, and sees the others, which claim a target of that shard (which of two pools on
one target keeps it, and who decides its gated pods)."""
PRIMARY = "primary"
SECONDARY = "secondary"
_SHARD_KEY = re.compile(r"prescaler\.io/shard-(0|[1-9][0-9]*)-of-([1-9][0-9]*)")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def valid_label_key(key: str) -> bool:
    """Whether the API server takes ``key`` as a label key: an optional DNS subdomain
    prefix (at most 253 characters) and a ``/``, then a name of at most 63 characters,
    alphanumeric at both ends, ``-``, ``_`` and ``.`` inside."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_LABEL_NAME.fullmatch(name))


def shard_key(shard: int, shards: int) -> str:
    """The label key of ``shard`` out of ``shards`` on a pool that touches it: the count
    is part of it, so a pool labelled under another count is found (and relabelled) like
    an unlabelled one."""
    if not 0 <= shard < shards:
        raise ValueError(f"no shard {shard} of {shards}")
    key = f"{SHARD_KEY_PREFIX}{shard}-of-{shards}"
    if not valid_label_key(key):  # pragma: no cover - at most 1024 shards: 18 characters
        raise ValueError(f"{key!r} is not a valid label key")
    return key


def parse_shard_key(key: str) -> tuple[int, int] | None:
    """``(shard, shards)`` of a key :func:`shard_key` makes, else ``None``."""
    match = _SHARD_KEY.fullmatch(key)
    if match is None:
        return None
    shard, shards = int(match[1]), int(match[2])
    return (shard, shards) if shard < shards else None


def shard_labels(namespace: str, spec: Mapping[str, Any], shards: int) -> dict[str, str]:
    """The shard labels a pool should carry under ``shards``: one per shard it touches."""
    return {
        shard_key(shard, shards): part
        for shard, part in sorted(touched_shards(namespace, spec, shards).items())
    }


def shard_labels_of(labels: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shard labels among a pool's labels (under any count, and any value)."""
    return {k: v for k, v in (labels or {}).items() if k.startswith(SHARD_KEY_PREFIX)}


def labelled_shards(labels: Mapping[str, Any] | None, shards: int) -> dict[int, Any]:
    """The shards a pool's labels name under ``shards``, with each label's value."""
    named = {}
    for key, value in shard_labels_of(labels).items():
        parsed = parse_shard_key(key)
        if parsed is not None and parsed[1] == shards:
            named[parsed[0]] = value
    return named


def labelled_shard(labels: Mapping[str, Any] | None, shards: int) -> int | None:
    """The shard a pool's labels name as its primary under ``shards`` (``None``: none
    does, e.g. unlabelled or labelled under another count, or several do)."""
    primary = [i for i, v in labelled_shards(labels, shards).items() if v == PRIMARY]
    return primary[0] if len(primary) == 1 else None


def label_patch(
    labels: Mapping[str, Any] | None, namespace: str, spec: Mapping[str, Any], shards: int
) -> dict[str, Any] | None:
    """The merge patch that makes a pool's shard labels what its spec says under
    ``shards`` (``None`` labels of other shards or counts; other labels untouched), or
    ``None`` if they already are."""
    want: dict[str, Any] = shard_labels(namespace, spec, shards)
    have = shard_labels_of(labels)
    if have == want:
        return None
    patch: dict[str, Any] = {k: v for k, v in want.items() if have.get(k) != v}
    patch.update({k: None for k in have if k not in want})
    return {"metadata": {"labels": patch}}


def shard_selector(shard: int, shards: int) -> str:
    """The label selector of every pool that touches one shard (the watch of the replica
    serving it, or of one serving a pool that touches it)."""
    return shard_key(shard, shards)


def relabel_selector(shards: int) -> str:
    """The label selector of every pool that no label names the primary of under
    ``shards``: unlabelled, labelled under another shard count, or with values of no
    shard (``notin`` also matches a pool without the key)."""
    return ",".join(f"{shard_key(i, shards)} notin ({PRIMARY})" for i in range(shards))


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


def settle(
    weights: Sequence[float],
    holders: Mapping[int, int | None],
    live_slots: Sequence[int],
    rounds: int = 100,
) -> dict[int, int | None]:
    """Where :func:`balance` leaves the shards from ``holders`` (shard -> slot, ``None``:
    free) if the replicas on ``live_slots`` take their rounds in turn and nothing else
    changes: a shard given up is free at once and taken when a round says so. The
    replicas reach the same from the same Leases (only the most loaded gives a shard up,
    and a free shard goes to the replica every round names). Raises ``RuntimeError`` if
    shards still move after ``rounds`` rounds (each move lowers the sum of squared loads,
    so they end)."""
    now: dict[int, int | None] = dict(holders)
    for _ in range(rounds):
        moved = False
        for slot in live_slots:
            moves = balance(weights, now, live_slots, slot)
            for shard in moves.release:
                now[shard] = None
            for shard in moves.acquire:
                now[shard] = slot
            moved = moved or bool(moves.release or moves.acquire)
        if not moved:
            return now
    raise RuntimeError(f"shards still move after {rounds} rounds: {now}")


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
