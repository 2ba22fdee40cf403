"""``prescaler backtest --disaggregated``: the trace's prompt and output tokens replayed as a
prefill fleet and a decode fleet, next to the unified pool.

Each role runs what a disaggregated ``InferencePool`` (``spec.roles``) would run: the
predictive policy is built from that pool's role view (:func:`prescaler.api.role_view`,
every knob at the spec's default unless a flag sets it), and plans on its own forecast of
its own token rate with the role's capacity (:func:`prescaler.capacity.role_capacity`, on
the model and GPUs of the flags). The reactive baseline and the references run per role on
the role's tokens, each fleet with the same cold start, bounds and GPUs per replica.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from prescaler.api import InferencePoolSpec
from prescaler.capacity import ROLES, CapacityModel, Role
from prescaler.cli._backtest_spec import Prepared, parsed_spec, pool_raw
from prescaler.cli._common import CliError

FORMATS = ("azure", "requests")
"""Formats with per-request token columns: the only ones whose roles' demands are known."""


def check_args(args: argparse.Namespace, windows: list[Any]) -> None:
    """Refuse what a disaggregated replay cannot do, before the trace is read."""
    if args.trace_format not in FORMATS:
        raise CliError(
            "--disaggregated replays each request's prompt and output tokens apart: it needs "
            "per-request token columns (--format azure or requests), not "
            f"{args.trace_format!r}"
        )
    if args.standby_max_replicas:
        raise CliError(
            "--disaggregated: warm standby (--standby-max-replicas) is for unified pools; "
            "a disaggregated pool has none"
        )
    if any(w.min_replicas is not None for w in windows):
        raise CliError(
            "--disaggregated: a window gives rps= (each role sizes it on its own tokens), "
            "not replicas=, as in a disaggregated pool's spec"
        )
    role_tokens_per_second(args)


def role_tokens_per_second(args: argparse.Namespace) -> dict[Role, float]:
    """One replica's throughput per role, in its own tokens: the role's flag, else
    ``--replica-tokens-per-second`` (the capacity model costs a prompt token and an output
    token alike, so a replica doing only one of them serves that many of its tokens)."""
    given = {
        "prefill": args.prefill_replica_tokens_per_second,
        "decode": args.decode_replica_tokens_per_second,
    }
    out: dict[Role, float] = {}
    for role in ROLES:
        value = given[role] if given[role] is not None else args.replica_tokens_per_second
        if value is None:
            raise CliError(
                "--disaggregated: give --prefill-replica-tokens-per-second and "
                "--decode-replica-tokens-per-second, or --replica-tokens-per-second for both"
            )
        out[role] = value
    return out


def unified_tokens_per_second(args: argparse.Namespace, demand: Any) -> float:
    """The compute limit of the unified replica compared with the roles: one that does both
    roles' work in turn, on the trace's mean mix."""
    from prescaler.backtest import time_shared_tokens_per_second
    from prescaler.capacity import TokenProfile

    per_role = role_tokens_per_second(args)
    return time_shared_tokens_per_second(
        TokenProfile(demand.prompt_tokens, demand.output_tokens),
        prefill=per_role["prefill"],
        decode=per_role["decode"],
    )


def role_capacity_model(args: argparse.Namespace, prep: Prepared, role: Role) -> CapacityModel:
    """The role's capacity on the unified pool's token mix, model, GPUs and headroom: the
    KV-cache limit only for decode (a prefill replica holds a request's cache only while it
    computes it)."""
    from prescaler.capacity import role_capacity

    unified = prep.capacity
    try:
        return role_capacity(
            role,
            unified.tokens,
            tokens_per_second=role_tokens_per_second(args)[role],
            replica=unified.replica if role == "decode" else None,
            headroom=unified.headroom,
        )
    except ValueError as exc:
        raise CliError(f"--disaggregated: {role}: {exc}") from None


def role_prepared(args: argparse.Namespace, prep: Prepared, role: Role) -> Prepared:
    """The role's demand, capacity and fleet, cut, warmed up and scaled as the unified one."""
    import numpy as np

    from prescaler.backtest import replicas_needed, role_demand

    demand = role_demand(prep.trace, role)
    if args.max_minutes is not None:
        demand = demand.head(min(args.max_minutes, len(demand)))
    demand = demand.with_replay_days(args.replay_days).scaled(prep.demand_scale)
    capacity = role_capacity_model(args, prep, role)
    replica_tps = capacity.replica_tokens_per_second
    peak = float(demand.replay_tokens_per_s.max())
    peak_need = max(1, int(replicas_needed(np.array([peak]), replica_tps)[0]))
    top = args.max_replicas
    if top is None:
        # A small role (decode of short outputs) may need fewer than the shared minimum.
        top = max(2 * peak_need, prep.config.min_replicas)
    config = replace(prep.config, replica_tokens_per_second=replica_tps, max_replicas=top)
    return replace(prep, demand=demand, capacity=capacity, config=config, spans=[])


def roles_spec(args: argparse.Namespace, fleets: dict[Role, Prepared]) -> InferencePoolSpec:
    """The disaggregated InferencePool a user would apply for these fleets: the unified
    pool's spec with ``roles`` instead of ``target`` (each role's throughput and bounds),
    every other knob as the flags set it or the spec model's default."""
    from prescaler.api import SpecError, check_spec

    raw = pool_raw(args, fleets["prefill"].config)
    del raw["target"]
    raw["model"] = {}
    raw["maxReplicas"] = max(f.config.max_replicas for f in fleets.values())
    raw["roles"] = {
        role: {
            "target": {"kind": "Deployment", "name": f"backtest-{role}"},
            "tokensPerSecond": fleet.capacity.throughput,
            "minReplicas": fleet.config.min_replicas,
            "maxReplicas": fleet.config.max_replicas,
        }
        for role, fleet in fleets.items()
    }
    spec = parsed_spec(raw)
    try:
        check_spec(spec)
    except SpecError as exc:
        raise CliError(str(exc)) from None
    return spec


def role_fleets(args: argparse.Namespace, prep: Prepared) -> tuple[InferencePoolSpec, Any]:
    """The disaggregated pool's spec and each role's
    :class:`prescaler.backtest.Replay`, for :func:`prescaler.backtest.backtest`'s ``roles``."""
    from prescaler.backtest import Replay

    fleets = {role: role_prepared(args, prep, role) for role in ROLES}
    spec = roles_spec(args, fleets)
    return spec, {
        role: Replay(fleet.demand, fleet.capacity, fleet.config) for role, fleet in fleets.items()
    }
