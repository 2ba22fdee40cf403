"""Replica capacity: how many requests one replica holds and how fast it finishes them.

Three limits decide how many replicas a demand needs:

* **KV-cache memory** bounds concurrency. One replica holds at most
  ``floor((gpu_memory * gpus * memory_utilization - weights - overhead)
  / (kv_bytes_per_token * context_tokens))`` requests, with ``context_tokens`` taken at a
  quantile of the context-length distribution (p95 by default), not the mean.
* **Token throughput** (compute) bounds tokens per second. It is measured on the real
  engine and given as an input, never derived from FLOPs.
* **Cold start** bounds how soon new capacity arrives; the planner handles it.

By Little's law a replica's memory limit in requests/s is ``concurrency / latency``, where
one request's latency is its prefill at the replica's throughput plus its output at the
per-request decode speed (the inter-token latency target). The compute limit is
``tokens_per_second / (prompt + output tokens)``. The smaller one binds.

**A model that does not fit is refused, by one rule.** A replica must hold its weights, its
overhead and the KV cache of at least one request at the planning context within its
usable memory; otherwise :meth:`ReplicaSpec.check_fits` raises :class:`ModelDoesNotFit`,
which says what does not fit, by how much and what to change. Every path that asks for a
replica's concurrency goes through it, so the CLI, the backtest and the operator refuse
the same models with the same message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from prescaler.capacity._architecture import ModelArchitecture
from prescaler.capacity._counts import replicas_for

GIB = 1024**3
Constraint = Literal["memory", "compute", "schedule", "floor"]

MAX_ADVISED_GPUS = 1024
"""More GPUs per replica than this is not advice: the model does not fit these GPUs."""

# Replica counts are int32 in Kubernetes: a requirement beyond that saturates.
MAX_REPLICAS = 2**31 - 1


def _gib(value: float) -> str:
    return f"{value / GIB:,.1f} GiB"


class ModelDoesNotFit(ValueError):
    """A replica's usable GPU memory cannot hold the weights, the overhead and the KV cache
    of one request at the planning context."""

    def __init__(
        self,
        replica: ReplicaSpec,
        context_tokens: int,
        needed_bytes: int,
        min_gpus: int | None,
    ) -> None:
        self.context_tokens = context_tokens
        self.needed_bytes = needed_bytes
        self.usable_bytes = replica.usable_bytes
        self.shortfall_bytes = needed_bytes - replica.usable_bytes
        self.min_gpus_per_replica = min_gpus
        model = replica.model
        one_request = model.kv_bytes_per_token * context_tokens
        fixes = []
        if min_gpus is not None:
            fixes.append(f"at least {min_gpus} GPUs per replica")
        fixes += [
            "GPUs with more memory",
            "a smaller weight dtype",
            "a shorter context",
        ]
        super().__init__(
            f"model {model.name} does not fit on {replica.gpus_per_replica} x "
            f"{replica.gpu_memory_gib:g} GiB: weights {_gib(model.weight_bytes)} + overhead "
            f"{_gib(replica.overhead_bytes)} + the KV cache of one {context_tokens}-token "
            f"request {_gib(one_request)} need {_gib(needed_bytes)}, but only "
            f"{_gib(replica.usable_bytes)} is usable at memory utilization "
            f"{replica.memory_utilization:g} ({_gib(self.shortfall_bytes)} short); "
            f"use {', '.join(fixes[:-1])} or {fixes[-1]}"
        )


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One serving replica: the model, the GPUs it runs on and what it measured."""

    model: ModelArchitecture
    gpu_memory_gib: float
    """Memory of one GPU."""
    gpus_per_replica: int
    tokens_per_second: float | None = None
    """Measured compute-bound throughput of one replica, prompt plus output tokens/s."""
    memory_utilization: float = 0.9
    """Share of GPU memory the engine may use (vLLM's ``gpu_memory_utilization``)."""
    overhead_gib_per_gpu: float = 1.0
    """Fixed per-GPU overhead outside weights and KV cache (CUDA context, graphs, activations)."""
    decode_tokens_per_second_per_request: float = 30.0
    """Per-request decode speed the service promises (1 / inter-token latency target)."""

    def __post_init__(self) -> None:
        if not self.gpu_memory_gib > 0:
            raise ValueError("gpu memory must be > 0 GiB")
        if self.gpus_per_replica < 1:
            raise ValueError("gpus per replica must be >= 1")
        if self.tokens_per_second is not None and not self.tokens_per_second > 0:
            raise ValueError("replica tokens per second must be > 0")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError("memory utilization must be in (0, 1]")
        if self.overhead_gib_per_gpu < 0:
            raise ValueError("overhead must be >= 0 GiB")
        if not self.decode_tokens_per_second_per_request > 0:
            raise ValueError("decode tokens per second per request must be > 0")

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_memory_gib * GIB * self.gpus_per_replica * self.memory_utilization)

    @property
    def overhead_bytes(self) -> int:
        return int(self.overhead_gib_per_gpu * GIB * self.gpus_per_replica)

    @property
    def kv_cache_bytes(self) -> int:
        """Memory left for the KV cache once weights and overhead are loaded (may be < 0)."""
        return self.usable_bytes - self.model.weight_bytes - self.overhead_bytes

    def check_fits(self, context_tokens: int) -> None:
        """Refuse a replica that cannot serve even one request of ``context_tokens``.

        The one rule for a model that does not fit: weights + overhead + the KV cache of one
        request at the context must fit in the usable memory, else :class:`ModelDoesNotFit`.
        """
        if context_tokens <= 0:
            raise ValueError("context tokens must be > 0")
        if context_tokens > self.model.max_context_tokens:
            raise ValueError(
                f"context tokens {context_tokens} exceed the maximum context "
                f"{self.model.max_context_tokens} of {self.model.name}"
            )
        one_request = self.model.kv_bytes_per_token * context_tokens
        needed = self.model.weight_bytes + self.overhead_bytes + one_request
        if needed <= self.usable_bytes:
            return
        # GPUs per replica that would fit (the weights shard, the overhead is per GPU).
        per_gpu = self.gpu_memory_gib * GIB * self.memory_utilization
        per_gpu -= self.overhead_gib_per_gpu * GIB
        min_gpus = (
            replicas_for(self.model.weight_bytes + one_request, per_gpu) if per_gpu > 0 else None
        )
        # The estimate is in floats; the check is in whole bytes: step up until it holds.
        while min_gpus is not None and min_gpus <= MAX_ADVISED_GPUS:
            if self._fits_on(min_gpus, needed):
                break
            min_gpus += 1
        else:
            min_gpus = None  # no number of these GPUs is advice worth giving
        raise ModelDoesNotFit(self, context_tokens, needed, min_gpus)

    def _fits_on(self, gpus: int, needed_on_these: int) -> bool:
        """Whether one request fits on ``gpus`` GPUs, by :meth:`check_fits`'s own bytes."""
        other = replace(self, gpus_per_replica=gpus)
        extra = other.overhead_bytes - self.overhead_bytes
        return needed_on_these + extra <= other.usable_bytes

    def max_concurrent_requests(self, context_tokens: int) -> int:
        """Requests of ``context_tokens`` tokens whose KV cache fits at once (>= 1).

        Raises :class:`ModelDoesNotFit` when not even one fits (see :meth:`check_fits`).
        """
        self.check_fits(context_tokens)
        return self.kv_cache_bytes // (self.model.kv_bytes_per_token * context_tokens)


@dataclass(frozen=True, slots=True)
class TokenProfile:
    """The token mix of the traffic: means for throughput, a quantile for memory."""

    prompt_tokens: float
    """Mean prompt tokens per request."""
    output_tokens: float
    """Mean generated tokens per request."""
    context_tokens: int | None = None
    """Context length (prompt + output) at the planning quantile, p95 by default.
    ``None`` means the mean prompt plus output, rounded up."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.prompt_tokens) and math.isfinite(self.output_tokens)):
            raise ValueError("token counts must be finite numbers")
        if self.prompt_tokens < 0 or self.output_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if self.prompt_tokens + self.output_tokens <= 0:
            raise ValueError("a request must carry at least one token")
        if not math.isfinite(self.prompt_tokens + self.output_tokens):
            raise ValueError("token counts must add up to a finite number")
        if self.context_tokens is not None and self.context_tokens <= 0:
            raise ValueError("context tokens must be > 0")

    @property
    def tokens_per_request(self) -> float:
        return self.prompt_tokens + self.output_tokens

    @property
    def planning_context_tokens(self) -> int:
        if self.context_tokens is not None:
            return self.context_tokens
        # Whole tokens, rounded up as replicas are: a measured 1000.0000000000001 is 1000.
        return max(1, replicas_for(self.tokens_per_request))


@dataclass(frozen=True, slots=True)
class DemandUnit:
    """What a plan's demand counts: requests/s for a unified pool, a role's tokens/s."""

    name: str
    """How the unit is written in a plan's reasons, e.g. ``req/s``."""
    per_request: float = 1.0
    """Units one request brings: 1 for requests, the mean tokens of the role's kind."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_request) and self.per_request >= 0):
            raise ValueError("units per request must be a finite number >= 0")


REQUESTS = DemandUnit("req/s")


@dataclass(frozen=True, slots=True)
class Requirement:
    """Replicas a demand needs, and which limit decided it."""

    replicas: int
    exact: float
    """The unrounded requirement, headroom included."""
    constraint: Constraint
    memory_replicas: float
    compute_replicas: float


@dataclass(frozen=True, slots=True)
class CapacityModel:
    """What one replica can serve for a given token mix, and what a demand needs.

    ``replica`` may be ``None`` when only throughput is known (then ``tokens_per_second``
    must be set); the memory limit is then not modelled.
    """

    tokens: TokenProfile
    replica: ReplicaSpec | None = None
    tokens_per_second: float | None = None
    """Replica throughput when no ``ReplicaSpec`` is given (or to override its value)."""
    headroom: float = 1.0
    """Multiplier on the requirement for uneven arrivals and long-tail contexts."""
    unit: DemandUnit = REQUESTS
    """What a demand counts: requests/s, or a disaggregated role's tokens/s (then one
    "request" of the token profile is one token, see :func:`prescaler.capacity.role_capacity`)."""

    def __post_init__(self) -> None:
        if self.headroom < 1:
            raise ValueError("headroom must be >= 1")
        if self.throughput is None:
            raise ValueError("replica tokens per second is required (measure it on the engine)")
        if self.replica is not None:
            self.replica.check_fits(self.tokens.planning_context_tokens)

    @property
    def throughput(self) -> float | None:
        if self.tokens_per_second is not None:
            return self.tokens_per_second
        return self.replica.tokens_per_second if self.replica is not None else None

    @property
    def max_concurrent_requests_per_replica(self) -> int | None:
        if self.replica is None:
            return None
        return self.replica.max_concurrent_requests(self.tokens.planning_context_tokens)

    @property
    def request_latency_seconds(self) -> float:
        """One request's service time: prefill at replica throughput, then decode."""
        throughput = self._throughput()
        if self.replica is None:
            return self.tokens.tokens_per_request / throughput
        decode_speed = self.replica.decode_tokens_per_second_per_request
        return self.tokens.prompt_tokens / throughput + self.tokens.output_tokens / decode_speed

    @property
    def compute_requests_per_second(self) -> float:
        return self._throughput() / self.tokens.tokens_per_request

    @property
    def memory_requests_per_second(self) -> float:
        concurrency = self.max_concurrent_requests_per_replica
        if concurrency is None:
            return math.inf
        return concurrency / self.request_latency_seconds

    @property
    def replica_requests_per_second(self) -> float:
        """Requests/s one replica sustains: the binding one of memory and compute."""
        return min(self.memory_requests_per_second, self.compute_requests_per_second)

    @property
    def replica_tokens_per_second(self) -> float:
        """Effective prompt+output tokens/s of one replica (the binding limit)."""
        return self.replica_requests_per_second * self.tokens.tokens_per_request

    @property
    def binding_constraint(self) -> Constraint:
        if self.memory_requests_per_second < self.compute_requests_per_second:
            return "memory"
        return "compute"

    def required(self, requests_per_second: float) -> Requirement:
        """Replicas that serve ``requests_per_second`` with headroom, rounded up."""
        if math.isnan(requests_per_second) or requests_per_second < 0:
            raise ValueError(f"demand must be a number >= 0, got {requests_per_second}")
        memory = _replicas_for(requests_per_second, self.memory_requests_per_second)
        compute = _replicas_for(requests_per_second, self.compute_requests_per_second)
        exact = max(memory, compute) * self.headroom
        constraint: Constraint = "memory" if memory > compute else "compute"
        if not exact > 0:
            replicas = 0
        elif exact >= MAX_REPLICAS:
            replicas = MAX_REPLICAS  # an absurd demand or throughput: saturate, don't overflow
        else:
            replicas = replicas_for(exact)  # float noise must not turn 3.0000000001 into 4
        return Requirement(replicas, exact, constraint, memory, compute)

    def _throughput(self) -> float:
        throughput = self.throughput
        assert throughput is not None  # checked in __post_init__
        return throughput


def _replicas_for(requests_per_second: float, per_replica: float) -> float:
    """Demand over one replica's rate; no demand needs none, a rate of 0 needs infinitely many."""
    if requests_per_second == 0:
        return 0.0
    if not per_replica > 0:
        return math.inf
    return requests_per_second / per_replica
