"""Sizing a fleet for a burst: a known number of users inside a time window.

The brief's worked example: 500 concurrent users in a 15-minute window, each sending 1000
prompt tokens and receiving 500 output tokens, is 750,000 tokens. At a fleet throughput of
20,000 tokens/s that is 37.5 s of generation if batching were perfect. Queueing and memory
pressure make real batching 2-3x worse, and uneven arrivals and long-tail contexts need a
further 1.5x headroom, so the fleet is sized to 20,000 x [2, 3] x 1.5 = 60,000-90,000
tokens/s for the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from prescaler.capacity._counts import replicas_for
from prescaler.capacity._model import CapacityModel


@dataclass(frozen=True, slots=True)
class WindowSizing:
    total_tokens: float
    generation_seconds: float
    """Seconds of generation at the given fleet throughput if batching were perfect."""
    fleet_tokens_per_second_min: float
    fleet_tokens_per_second_max: float
    average_tokens_per_second: float
    """The window's tokens spread evenly over the window."""
    replicas_min: int | None = None
    """Replicas for the low end of the range (needs a capacity model)."""
    replicas_max: int | None = None
    memory_replicas: int | None = None
    """Replicas whose KV cache holds every user's context at once (needs a replica spec)."""


def size_window(
    *,
    concurrent_users: int,
    prompt_tokens: float,
    output_tokens: float,
    window_seconds: float,
    fleet_tokens_per_second: float,
    queueing_factor: tuple[float, float] = (2.0, 3.0),
    headroom: float = 1.5,
    capacity: CapacityModel | None = None,
) -> WindowSizing:
    """Size the fleet for ``concurrent_users`` requests landing inside one window."""
    if concurrent_users <= 0:
        raise ValueError("concurrent users must be > 0")
    if window_seconds <= 0 or fleet_tokens_per_second <= 0:
        raise ValueError("window and fleet throughput must be > 0")
    low, high = queueing_factor
    if not 1 <= low <= high:
        raise ValueError("queueing factor must satisfy 1 <= min <= max")
    if headroom < 1:
        raise ValueError("headroom must be >= 1")
    total = concurrent_users * (prompt_tokens + output_tokens)
    fleet_min = fleet_tokens_per_second * low * headroom
    fleet_max = fleet_tokens_per_second * high * headroom
    replicas_min = replicas_max = memory_replicas = None
    if capacity is not None:
        per_replica = capacity.compute_requests_per_second * capacity.tokens.tokens_per_request
        replicas_min = replicas_for(fleet_min, per_replica)
        replicas_max = replicas_for(fleet_max, per_replica)
        concurrency = capacity.max_concurrent_requests_per_replica
        if concurrency:
            memory_replicas = replicas_for(concurrent_users * headroom, concurrency)
    return WindowSizing(
        total_tokens=total,
        generation_seconds=total / fleet_tokens_per_second,
        fleet_tokens_per_second_min=fleet_min,
        fleet_tokens_per_second_max=fleet_max,
        average_tokens_per_second=total / window_seconds,
        replicas_min=replicas_min,
        replicas_max=replicas_max,
        memory_replicas=memory_replicas,
    )
