"""A disaggregated fleet in the backtest: prefill and decode replayed as two fleets, and
scored as one against a unified pool on the same trace.

Each role is an ordinary replay (:func:`prescaler.backtest.run_backtest`) of its own
demand (:func:`prescaler.backtest.role_demand`: prompt tokens/s for prefill, output
tokens/s for decode) on its own capacity (:func:`prescaler.capacity.role_capacity`) and
fleet. This module adds what only the pair has:

* **The unified replica it is compared with** (:func:`time_shared_tokens_per_second`): one
  replica that does both roles' work in turn. A request costs it ``prompt / P + output / D``
  seconds, ``P`` and ``D`` being one prefill and one decode replica's throughputs, so its
  compute limit is ``(prompt + output) / (prompt / P + output / D)`` prompt+output tokens/s
  on the trace's mean mix. Its KV-cache limit is the capacity model's, on the same model and
  GPUs. With ``P = D`` it is that throughput itself: the unified capacity model already
  costs a prompt token as much as an output token.
* **The pair's scores** (:meth:`DisaggregatedResult.scores`), per policy, both roles run by it:

  - ``shortfall_minutes``: minutes in which either role is short (its ready replicas x its
    replica capacity < its demand);
  - ``unserved_token_fraction``: prefill's unserved prompt tokens plus decode's unserved
    output tokens, over all prompt and output tokens (each role's own fluid queue);
  - ``gpu_hours``: each role's replicas that exist x its GPUs per replica x time, summed;
  - ``scale_events``: both roles' changes of their replica counts.

  A role's tokens queue and are served in its own fleet only: a request delayed in prefill
  does not arrive later at decode (the fluid model has no per-request path), and the KV
  cache handed from prefill to decode costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from prescaler.backtest._demand import MINUTE
from prescaler.backtest._fleet import short_of
from prescaler.backtest._report import BacktestResult
from prescaler.capacity import ROLES, CapacityModel, Role, TokenProfile


def time_shared_tokens_per_second(tokens: TokenProfile, *, prefill: float, decode: float) -> float:
    """The compute limit of one unified replica that does the work of both roles in turn,
    in prompt+output tokens/s on the mix ``tokens``: ``prefill`` prompt tokens/s while it
    prefills, ``decode`` output tokens/s while it decodes."""
    if not (prefill > 0 and decode > 0):
        raise ValueError("each role's replica tokens per second must be > 0")
    seconds = tokens.prompt_tokens / prefill + tokens.output_tokens / decode
    return tokens.tokens_per_request / seconds


@dataclass(frozen=True)
class DisaggregatedScore:
    """One policy's scores over both roles (see the module docstring)."""

    shortfall_minutes: int
    unserved_token_fraction: float
    gpu_hours: float
    scale_events: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "shortfall_minutes": self.shortfall_minutes,
            "unserved_token_fraction": self.unserved_token_fraction,
            "gpu_hours": self.gpu_hours,
            "scale_events": self.scale_events,
        }


def _replayed_minutes(result: BacktestResult) -> int:
    return min(len(r.ready_per_step) for r in result.runs) // result.config.steps_per_minute


@dataclass(frozen=True)
class DisaggregatedResult:
    """Both roles' replays under the same policies, each with the capacity it ran on."""

    roles: Mapping[Role, BacktestResult]
    capacities: Mapping[Role, CapacityModel]

    def __post_init__(self) -> None:
        results = [self.roles[role] for role in ROLES]
        if len({_replayed_minutes(r) for r in results}) != 1:
            raise ValueError("the roles replayed different minutes")
        if len({tuple(r.scores) for r in results}) != 1:
            raise ValueError("the roles replayed different policies")

    def scores(self) -> dict[str, DisaggregatedScore]:
        """Each policy's scores over both roles and the whole replay (see the module
        docstring); each role's part is its own :class:`prescaler.backtest.Score`."""
        n = _replayed_minutes(self.roles["prefill"])
        return self._combined(0, n, lambda role, name: self.roles[role].scores[name].as_dict())

    def span_scores(self, start: float, end: float) -> dict[str, DisaggregatedScore]:
        """Each policy's scores over both roles in ``[start, end)`` (unix seconds), from
        each role's :meth:`prescaler.backtest.BacktestResult.span_scores`."""
        first = self.roles["prefill"]
        origin = first.demand.replay_start
        a = max(0, math.floor((start - origin) / MINUTE))
        b = min(_replayed_minutes(first), math.ceil((end - origin) / MINUTE))
        if a >= b:
            raise ValueError("the span has no replayed minute")
        spans = {role: self.roles[role].span_scores(start, end) for role in ROLES}
        return self._combined(a, b, lambda role, name: spans[role][name])

    def _combined(
        self, a: int, b: int, part: Callable[[Role, str], Mapping[str, float | int]]
    ) -> dict[str, DisaggregatedScore]:
        """Both roles' scores ``part(role, policy)`` of minutes ``[a, b)`` per policy: a
        minute is short when either role is, unserved tokens count in each role's tokens."""
        out: dict[str, DisaggregatedScore] = {}
        for name in self.roles["prefill"].scores:
            short = np.zeros(b - a, dtype=bool)
            unserved = tokens = gpu_hours = 0.0
            events = 0
            for role in ROLES:
                result = self.roles[role]
                run = next(r for r in result.runs if r.name == name)
                demand = result.demand.replay_tokens_per_s[a:b]
                ready = run.ready_per_minute(result.config.steps_per_minute)[a:b]
                short |= short_of(ready, demand, result.config.replica_tokens_per_second)
                role_tokens = float(demand.sum()) * MINUTE
                own = part(role, name)
                unserved += float(own["unserved_token_fraction"]) * role_tokens
                tokens += role_tokens
                gpu_hours += float(own["gpu_hours"])
                events += int(own["scale_events"])
            out[name] = DisaggregatedScore(
                shortfall_minutes=int(np.count_nonzero(short)),
                unserved_token_fraction=unserved / tokens if tokens > 0 else 0.0,
                gpu_hours=gpu_hours,
                scale_events=events,
            )
        return out

    def timeline(self) -> pd.DataFrame:
        """Each role's timeline columns, prefixed with the role and without ``minute``:
        ``<role>_demand_tokens_per_s``, ``<role>_replica_tokens_per_s`` (in the role's
        tokens), then ``<role>_<policy>_ready`` and ``<role>_<policy>_desired`` per policy."""
        parts = []
        for role in ROLES:
            own = self.roles[role].timeline().drop(columns="minute")
            parts.append(own.add_prefix(f"{role}_"))
        return pd.concat(parts, axis=1)

    def to_json(self, unified: BacktestResult) -> dict[str, Any]:
        """The JSON's ``disaggregated`` section: both roles' scores per policy with their
        GPU-hours over the unified pool's, and each role's fleet and scores."""
        policies: dict[str, Any] = {}
        for name, sc in self.scores().items():
            entry: dict[str, Any] = dict(sc.as_dict())
            own = unified.scores.get(name)
            if own is not None and own.gpu_hours > 0:
                entry["gpu_hours_over_unified"] = sc.gpu_hours / own.gpu_hours
            policies[name] = entry
        roles: dict[str, Any] = {}
        for role in ROLES:
            result, capacity, cfg = self.roles[role], self.capacities[role], self.roles[role].config
            roles[role] = {
                "unit": capacity.unit.name,
                "tokens_per_second": capacity.throughput,
                "replica_tokens_per_s": cfg.replica_tokens_per_second,
                "capacity_constraint": capacity.binding_constraint,
                "mean_tokens_per_request": capacity.unit.per_request,
                "gpus_per_replica": cfg.gpus_per_replica,
                "min_replicas": cfg.min_replicas,
                "max_replicas": cfg.max_replicas,
                "peak_demand_tokens_per_s": float(np.max(result.demand.replay_tokens_per_s)),
                "policies": {name: sc.as_dict() for name, sc in result.scores.items()},
                "runtime_seconds": {r.name: round(r.seconds, 3) for r in result.runs},
            }
        return {"policies": policies, "roles": roles}
