"""Shards of the pools across operator replicas: which shard serves a pool, how many
shards a replica should hold, and which to take or give up. Pure: no I/O, no clock.

The Leases that carry the assignment (one per shard, one per member slot) are
:class:`prescaler.kube.ShardLeases`; this module only decides.

- A pool's shard is a stable hash (SHA-256, not Python's salted ``hash``) of its demand
  series as the spec names it: the Prometheus URL, the engine, the selector and the query
  overrides (and each role's selector). Pools that read one series land on one shard, so
  the replica serving them shares one history and one forecast fit between them, as a
  single operator does. A pool without ``spec.forecast`` hashes by its namespace and name.
- Replicas count themselves on member slot Leases (one slot each, ``shards`` slots): the
  live slots are the replicas. Each one's quota is ``shards // replicas``, one more for the
  first ``shards % replicas`` of them by slot, so the quotas sum to ``shards``.
- A replica over its quota gives up its highest shards (after it stops acting on them);
  one under its quota takes free or expired ones, lowest first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def quota(shards: int, live_slots: Collection[int], my_slot: int | None) -> int:
    """How many shards the replica on ``my_slot`` should hold while ``live_slots`` (its
    own included) are the live replicas: ``shards // n``, plus one for the first
    ``shards % n`` slots in order. 0 without a slot (a replica beyond ``shards`` waits)."""
    if my_slot is None:
        return 0
    live = sorted(set(live_slots) | {my_slot})
    base, extra = divmod(shards, len(live))
    return base + (1 if live.index(my_slot) < extra else 0)


@dataclass(frozen=True, slots=True)
class Moves:
    """One round's decision: shards to try to take, to stop acting on and give up (they
    are released once nothing runs on them), and to keep after all (a drain undone)."""

    acquire: tuple[int, ...] = ()
    release: tuple[int, ...] = ()
    keep: tuple[int, ...] = ()


def rebalance(
    held: Collection[int], draining: Collection[int], available: Collection[int], quota: int
) -> Moves:
    """What a replica holding ``held`` (of which ``draining`` are being given up) does
    with ``quota``: over it, drain the highest shards it still acts on; under it, first
    keep shards it was draining, then try ``available`` ones (free or expired), lowest
    first. Taking may fail (another replica wins the Lease): the next round tries again."""
    acting = sorted(set(held) - set(draining))
    if len(acting) > quota:
        return Moves(release=tuple(sorted(acting[quota:], reverse=True)))
    missing = quota - len(acting)
    keep = tuple(sorted(set(draining) & set(held))[:missing])
    missing -= len(keep)
    candidates = sorted(set(available) - set(held))
    return Moves(acquire=tuple(candidates[:missing]), keep=keep)


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
