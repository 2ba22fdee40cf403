"""The simulated GPU fleet: replicas that become ready one cold start after they are asked for.

Time advances in fixed steps (15 s by default). A replica requested at step ``i`` is ready
from step ``i + ceil(cold_start / step)`` on. Scaling down removes the least advanced
replicas first: starting ones (latest ready time first), then ready ones, as a ReplicaSet
prefers deleting pods that are not ready.

**Warm standby** (optional: a fleet built with ``warm_lag_steps``). Placeholder pods hold
GPU nodes with the serving image pre-pulled, so a replica that lands on one skips the node
provisioning and the image pull and is ready after the *warm* start (weight load and runtime
init) instead of the cold start. The bookkeeping:

* :meth:`Fleet.set_standby` sets how many standby slots are wanted (the planner's standby
  size). A new slot is a placeholder that needs its own node, provisioned and pre-pulled:
  it is *warm* only one cold start later. Until then it is *pending*. Fewer slots drop the
  pending ones first (newest first), then warm ones.
* A replica started while a warm slot is free takes it (the placeholder is preempted) and is
  ready after the warm start; the slot is gone until the next :meth:`Fleet.set_standby`
  replaces it, and the replacement is again pending for one cold start.
* A ready replica removed while a slot is pending hands that slot its node: the node is up
  and has the image, so the slot is warm at once.
* Every slot held, pending or warm, holds a GPU node: :attr:`Fleet.standby` counts them for
  the cost.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

from prescaler.capacity import covers


def cold_start_steps(cold_start_seconds: float, step_seconds: float) -> int:
    """Steps from request to ready (a partial step rounds up: never earlier than the truth)."""
    if cold_start_seconds < 0:
        raise ValueError("cold start must be >= 0 seconds")
    return math.ceil(cold_start_seconds / step_seconds - 1e-9)


def short_of(
    ready: np.ndarray, tokens_per_s: np.ndarray, replica_tokens_per_second: float
) -> np.ndarray:
    """Where ``ready`` replicas serve less than the demand: ``ready × capacity < demand``
    beyond float noise (:func:`prescaler.capacity.covers`), element-wise.

    The one definition of a shortfall. The score counts it and :func:`replicas_needed`
    sizes against it, so a bound built on the latter is never short by the former.
    """
    needed = np.asarray(tokens_per_s, dtype=float) / replica_tokens_per_second
    return ~covers(ready, needed)


def replicas_needed(tokens_per_s: np.ndarray, replica_tokens_per_second: float) -> np.ndarray:
    """The fewest replicas that are not :func:`short_of` the demand, element-wise: what
    :func:`prescaler.capacity.replicas_for` gives for each.

    Demand carries float noise from measuring, resampling and scaling (400000.000012
    tokens/s at 20000 per replica): a demand within the tolerance above a whole number of
    replicas needs that number, and the score does not count it short.
    """
    needed = np.maximum(np.asarray(tokens_per_s, dtype=float), 0.0) / replica_tokens_per_second
    need = np.ceil(needed)
    fewer = np.maximum(need - 1.0, 0.0)
    need = np.where((need > 0) & covers(fewer, needed), fewer, need)
    return np.asarray(need, dtype=np.int64)


class Fleet:
    """Replica bookkeeping for one policy. Deliberately dumb: it applies what it is told.

    ``lag_steps`` is the cold start in steps; ``warm_lag_steps`` (``None``: no standby) the
    start of a replica that takes a warm standby slot (see the module docstring).
    """

    __slots__ = (
        "_lag",
        "_ready",
        "_standby_pending",
        "_standby_warm",
        "_starting",
        "_warm_lag",
        "scale_events",
        "warm_starts",
    )

    def __init__(
        self, initial_ready: int, lag_steps: int, warm_lag_steps: int | None = None
    ) -> None:
        if initial_ready < 0:
            raise ValueError("initial replicas must be >= 0")
        if warm_lag_steps is not None and not 0 <= warm_lag_steps <= lag_steps:
            raise ValueError("the warm start must be >= 0 and no longer than the cold start")
        self._lag = lag_steps
        self._warm_lag = warm_lag_steps
        self._ready = initial_ready
        self._starting: list[int] = []  # ready-at step of each starting replica, ascending
        self._standby_warm = 0
        self._standby_pending: deque[int] = deque()  # ready-at step of each pending slot
        self.scale_events = 0
        self.warm_starts = 0
        """Replicas that started on a warm standby slot."""

    @property
    def ready(self) -> int:
        return self._ready

    @property
    def existing(self) -> int:
        """Every replica that holds GPUs: ready plus starting."""
        return self._ready + len(self._starting)

    @property
    def starting_ready_steps(self) -> tuple[int, ...]:
        """The step at which each starting replica will be ready (its start plus the cold
        start, or the warm start on a standby slot), earliest first."""
        return tuple(self._starting)

    @property
    def standby(self) -> int:
        """Standby slots held (pending or warm): each holds a GPU node."""
        return self._standby_warm + len(self._standby_pending)

    @property
    def standby_warm(self) -> int:
        """Standby slots a new replica can take now."""
        return self._standby_warm

    def advance(self, step: int) -> None:
        """Promote replicas whose start is over by ``step``, and slots whose node is up."""
        promoted = bisect.bisect_right(self._starting, step)
        if promoted:
            del self._starting[:promoted]
            self._ready += promoted
        pending = self._standby_pending
        while pending and pending[0] <= step:
            pending.popleft()
            self._standby_warm += 1

    def scale_to(self, replicas: int, step: int) -> None:
        """Set the replica count at ``step``; a change counts as one scale event."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        current = self.existing
        if replicas == current:
            return
        self.scale_events += 1
        if replicas > current:
            for _ in range(replicas - current):
                lag = self._lag
                if self._warm_lag is not None and self._standby_warm > 0:
                    self._standby_warm -= 1  # the placeholder is preempted
                    self.warm_starts += 1
                    lag = self._warm_lag
                if lag == 0:
                    self._ready += 1
                else:
                    bisect.insort(self._starting, step + lag)
            return
        remove = current - replicas
        while remove and self._starting:
            self._starting.pop()  # the least advanced (latest ready time) first
            remove -= 1
        self._ready -= remove
        # A removed ready replica frees a provisioned, pre-pulled node for a pending slot.
        handed = min(remove, len(self._standby_pending))
        for _ in range(handed):
            self._standby_pending.pop()
        self._standby_warm += handed

    def set_standby(self, slots: int, step: int) -> None:
        """Hold ``slots`` standby slots from ``step`` on; new ones are warm one cold start later."""
        if slots < 0:
            raise ValueError("standby slots must be >= 0")
        held = self.standby
        if slots > held:
            if self._lag == 0:
                self._standby_warm += slots - held
            else:
                self._standby_pending.extend([step + self._lag] * (slots - held))
            return
        drop = held - slots
        while drop and self._standby_pending:
            self._standby_pending.pop()  # newest first
            drop -= 1
        self._standby_warm -= drop
