"""The simulated GPU fleet: replicas that become ready one cold start after they are asked for.

Time advances in fixed steps (15 s by default). A replica requested at step ``i`` is ready
from step ``i + ceil(cold_start / step)`` on. Scaling down removes the least advanced
replicas first: starting ones (newest first), then ready ones, as a ReplicaSet prefers
deleting pods that are not ready.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


def cold_start_steps(cold_start_seconds: float, step_seconds: float) -> int:
    """Steps from request to ready (a partial step rounds up: never earlier than the truth)."""
    if cold_start_seconds < 0:
        raise ValueError("cold start must be >= 0 seconds")
    return math.ceil(cold_start_seconds / step_seconds - 1e-9)


def short_of(
    ready: np.ndarray, tokens_per_s: np.ndarray, replica_tokens_per_second: float
) -> np.ndarray:
    """Where ``ready`` replicas serve less than the demand: ``ready × capacity < demand``.

    The one definition of a shortfall. The score counts it and :func:`replicas_needed`
    sizes against it, so a bound built on the latter is never short by the former.
    """
    ready_f = np.asarray(ready, dtype=float)
    return np.asarray(ready_f * replica_tokens_per_second < np.asarray(tokens_per_s, dtype=float))


def replicas_needed(tokens_per_s: np.ndarray, replica_tokens_per_second: float) -> np.ndarray:
    """The fewest replicas that are not :func:`short_of` the demand, element-wise.

    Exact against the shortfall test, not a tolerant ``ceil``: demand carries float noise
    from resampling and scaling (400000.000012 tokens/s at 20000 per replica), and
    ``ceil(x - 1e-9)`` would round that down to a count the score then counts as short.
    """
    tokens = np.maximum(np.asarray(tokens_per_s, dtype=float), 0.0)
    need = np.ceil(tokens / replica_tokens_per_second)
    # The division may round either way: settle the last replica on the comparison itself.
    fewer = np.maximum(need - 1.0, 0.0)
    need = np.where((need > 0) & ~short_of(fewer, tokens, replica_tokens_per_second), fewer, need)
    need = np.where(short_of(need, tokens, replica_tokens_per_second), need + 1.0, need)
    return np.asarray(need, dtype=np.int64)


class Fleet:
    """Replica bookkeeping for one policy. Deliberately dumb: it applies what it is told."""

    __slots__ = ("_lag", "_ready", "_starting", "scale_events")

    def __init__(self, initial_ready: int, lag_steps: int) -> None:
        if initial_ready < 0:
            raise ValueError("initial replicas must be >= 0")
        self._lag = lag_steps
        self._ready = initial_ready
        self._starting: deque[int] = deque()  # ready-at step of each starting replica, ascending
        self.scale_events = 0

    @property
    def ready(self) -> int:
        return self._ready

    @property
    def existing(self) -> int:
        """Every replica that holds GPUs: ready plus starting."""
        return self._ready + len(self._starting)

    def advance(self, step: int) -> None:
        """Promote replicas whose cold start is over by ``step``."""
        starting = self._starting
        while starting and starting[0] <= step:
            starting.popleft()
            self._ready += 1

    def scale_to(self, replicas: int, step: int) -> None:
        """Set the replica count at ``step``; a change counts as one scale event."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        current = self.existing
        if replicas == current:
            return
        self.scale_events += 1
        if replicas > current:
            ready_at = step + self._lag
            for _ in range(replicas - current):
                if self._lag == 0:
                    self._ready += 1
                else:
                    self._starting.append(ready_at)
            return
        remove = current - replicas
        while remove and self._starting:
            self._starting.pop()  # newest (least advanced) first
            remove -= 1
        self._ready -= remove
