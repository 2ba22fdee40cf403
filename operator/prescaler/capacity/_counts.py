"""Whole replicas for a demand, robust to float noise: the one rule every count follows.

Demand and capacity are floats that carry the noise of how they were measured. Tokens per
request is a rate of tokens over a rate of requests, and the sum of thirty pods' 0.1
requests/s is 3.0000000000000013, so 1,000 tokens per request comes out
999.9999999999995; resampling and rescaling a trace leave 400000.000012 tokens/s where
400,000 is exact. A demand exactly at a replica boundary then lands a hair above it, and a
plain ``ceil(demand / capacity)`` buys one more replica for the hair (41 where 40 is
exact), while ``ready × capacity < demand`` counts the minute short by 1e-12.

So a requirement of ``needed`` replicas (demand over one replica's capacity, a float) is
met by ``replicas`` when it falls short of it by no more than :data:`TOLERANCE` of the
requirement, or of one replica when less than one is needed: ``math.isclose`` with both
tolerances at 1e-9, on the side that matters. :func:`covers` is that test and
:func:`replicas_for` the fewest replicas that pass it; the planner, the capacity sizing and
the backtest (its policies, its oracle and its shortfall count) all go through them.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

TOLERANCE = 1e-9
"""Float noise a requirement may carry, relative to it (absolute below one replica)."""


def covers(replicas: ArrayLike, needed: ArrayLike) -> NDArray[np.bool_]:
    """Whether ``replicas`` meet a requirement of ``needed`` replicas, element-wise.

    ``replicas >= needed`` up to :data:`TOLERANCE` × ``max(needed, 1)``: what
    ``math.isclose(replicas, needed, rel_tol=TOLERANCE, abs_tol=TOLERANCE)`` allows below
    the requirement, written once for a number and an array alike (``numpy.isclose`` weighs
    its tolerances differently). A NaN requirement is never met.
    """
    have = np.asarray(replicas, dtype=float)
    need = np.asarray(needed, dtype=float)
    return np.asarray(have >= need - TOLERANCE * np.maximum(need, 1.0))


def replicas_for(demand: float, capacity: float = 1.0) -> int:
    """The fewest whole replicas of ``capacity`` that :func:`covers` ``demand``.

    ``ceil(demand / capacity)`` (none for a demand <= 0), except that a ratio within the
    tolerance above a whole number is that number. Without ``capacity``, ``demand`` is the
    requirement itself in replicas. An infinite or NaN ratio raises, as ``math.ceil`` does.
    """
    needed = demand / capacity
    replicas = max(0, math.ceil(needed))
    if replicas > 0 and covers(replicas - 1, needed):
        return replicas - 1
    return replicas
