"""``prescaler plan``: size a fleet from the capacity model, as a table or one JSON object.

Three independent parts, each printed when its flags are given:

* the window sizing of the worked example (``--concurrent-users`` ...
  ``--fleet-tokens-per-second``);
* the per-replica memory limit (``--model --gpu-memory-gib --gpus-per-replica --context-tokens``);
* the replicas a steady demand needs (``--requests-per-second`` with throughput and token mix).
"""

from __future__ import annotations

import argparse
from typing import Any

from prescaler.capacity import CapacityModel, ReplicaSpec, TokenProfile, size_window
from prescaler.cli._capacity_args import (
    add_capacity_arguments,
    capacity_from_args,
    check_context,
    replica_from_args,
)
from prescaler.cli._common import (
    CliError,
    multiplier,
    non_negative_float,
    positive_float,
    positive_int,
    print_json,
)

_WINDOW_FLAGS = (
    "concurrent_users",
    "prompt_tokens",
    "output_tokens",
    "window_minutes",
    "fleet_tokens_per_second",
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="size a fleet: KV-cache memory, token throughput and a burst window",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    window = parser.add_argument_group("a burst window (the brief's worked example)")
    window.add_argument("--concurrent-users", type=positive_int)
    window.add_argument("--prompt-tokens", type=non_negative_float, help="mean per request")
    window.add_argument("--output-tokens", type=non_negative_float, help="mean per request")
    window.add_argument("--window-minutes", type=positive_float)
    window.add_argument("--fleet-tokens-per-second", type=positive_float, help="measured")
    window.add_argument("--queueing-factor-min", type=multiplier, default=2.0)
    window.add_argument("--queueing-factor-max", type=multiplier, default=3.0)
    window.add_argument(
        "--window-headroom", type=multiplier, default=1.5, help="burst headroom (default 1.5)"
    )
    parser.add_argument(
        "--requests-per-second",
        type=non_negative_float,
        help="a steady demand to size (needs the token mix and --replica-tokens-per-second)",
    )
    add_capacity_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _number(value: float) -> int | float:
    """JSON-friendly: 60000.0 -> 60000, 37.5 stays."""
    return int(value) if float(value).is_integer() else round(value, 6)


def _window_section(args: argparse.Namespace, capacity: CapacityModel | None) -> dict[str, Any]:
    if args.queueing_factor_min > args.queueing_factor_max:
        raise CliError("--queueing-factor-min must not exceed --queueing-factor-max")
    sizing = size_window(
        concurrent_users=args.concurrent_users,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        window_seconds=args.window_minutes * 60,
        fleet_tokens_per_second=args.fleet_tokens_per_second,
        queueing_factor=(args.queueing_factor_min, args.queueing_factor_max),
        headroom=args.window_headroom,
        capacity=capacity,
    )
    out: dict[str, Any] = {
        "total_tokens": _number(sizing.total_tokens),
        "generation_seconds": _number(sizing.generation_seconds),
        "fleet_tokens_per_second": {
            "min": _number(sizing.fleet_tokens_per_second_min),
            "max": _number(sizing.fleet_tokens_per_second_max),
        },
        "window": {
            "concurrent_users": args.concurrent_users,
            "prompt_tokens": _number(args.prompt_tokens),
            "output_tokens": _number(args.output_tokens),
            "window_minutes": _number(args.window_minutes),
            "average_tokens_per_second": _number(sizing.average_tokens_per_second),
            "queueing_factor": [args.queueing_factor_min, args.queueing_factor_max],
            "headroom": args.window_headroom,
        },
    }
    if sizing.replicas_min is not None:
        out["window"]["replicas"] = {"min": sizing.replicas_min, "max": sizing.replicas_max}
    if sizing.memory_replicas is not None:
        out["window"]["memory_replicas"] = sizing.memory_replicas
    return out


def _memory_section(replica: ReplicaSpec, context_tokens: int) -> dict[str, Any]:
    arch = replica.model
    return {
        "model": arch.name,
        "kv_bytes_per_token": arch.kv_bytes_per_token,
        "max_concurrent_requests_per_replica": replica.max_concurrent_requests(context_tokens),
        "assumptions": {
            "attention": arch.attention,
            "layers": arch.layers,
            "kv_heads": arch.kv_heads,
            "head_dim": arch.head_dim,
            "parameters": _number(arch.parameters),
            "weight_dtype": arch.weight_dtype,
            "kv_cache_dtype": arch.kv_cache_dtype,
            "weight_bytes": arch.weight_bytes,
            "gpu_memory_gib": _number(replica.gpu_memory_gib),
            "gpus_per_replica": replica.gpus_per_replica,
            "memory_utilization": replica.memory_utilization,
            "overhead_bytes": replica.overhead_bytes,
            "kv_cache_bytes": replica.kv_cache_bytes,
            "context_tokens": context_tokens,
            "max_context_tokens": arch.max_context_tokens,
        },
    }


def _demand_section(capacity: CapacityModel, requests_per_second: float) -> dict[str, Any]:
    need = capacity.required(requests_per_second)
    return {
        "requests_per_second": _number(requests_per_second),
        "replicas": need.replicas,
        "constraint": need.constraint,
        "memory_replicas": round(need.memory_replicas, 3),
        "compute_replicas": round(need.compute_replicas, 3),
        "headroom": capacity.headroom,
        "replica_requests_per_second": round(capacity.replica_requests_per_second, 4),
        "replica_tokens_per_second": round(capacity.replica_tokens_per_second, 2),
        "request_latency_seconds": round(capacity.request_latency_seconds, 3),
    }


def run(args: argparse.Namespace) -> int:
    given = [flag for flag in _WINDOW_FLAGS if getattr(args, flag) is not None]
    window_wanted = "concurrent_users" in given or "fleet_tokens_per_second" in given
    if window_wanted and len(given) < len(_WINDOW_FLAGS):
        missing = [f"--{f.replace('_', '-')}" for f in _WINDOW_FLAGS if f not in given]
        raise CliError(f"a window plan also needs {', '.join(missing)}")

    replica = replica_from_args(args)
    capacity = None
    if args.replica_tokens_per_second is not None and args.prompt_tokens is not None:
        capacity = capacity_from_args(args, output_tokens=args.output_tokens or 0.0)
    result: dict[str, Any] = {}
    if window_wanted:
        result.update(_window_section(args, capacity))
    if replica is not None:
        context = args.context_tokens
        if context is None:
            if args.prompt_tokens is None or args.output_tokens is None:
                raise CliError("--context-tokens is required with --model")
            context = TokenProfile(args.prompt_tokens, args.output_tokens).planning_context_tokens
        check_context(args, replica, context)
        result.update(_memory_section(replica, context))
    if args.requests_per_second is not None:
        if capacity is None:
            raise CliError(
                "--requests-per-second needs --prompt-tokens, --output-tokens "
                "and --replica-tokens-per-second"
            )
        result["demand"] = _demand_section(capacity, args.requests_per_second)
    if not result:
        raise CliError("nothing to plan: give a window (--concurrent-users ...) or --model")
    if args.json:
        print_json(result)
    else:
        _print_table(result)
    return 0


def _print_table(result: dict[str, Any]) -> None:
    def rows(prefix: str, obj: dict[str, Any]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for key, value in obj.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                out.extend(rows(f"{name}.", value))
            else:
                out.append((name, f"{value:,}" if isinstance(value, int) else str(value)))
        return out

    table = rows("", result)
    width = max(len(name) for name, _ in table)
    for name, value in table:
        print(f"{name:<{width}}  {value}")
