"""Capacity flags shared by ``plan`` and ``backtest``: one definition, one parser."""

from __future__ import annotations

import argparse

from prescaler.capacity import (
    DTYPE_BYTES,
    PRESETS,
    CapacityModel,
    ModelArchitecture,
    ReplicaSpec,
    TokenProfile,
    get_preset,
)
from prescaler.cli._common import (
    CliError,
    fraction,
    multiplier,
    non_negative_float,
    positive_float,
    positive_int,
)


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the model, GPU and token-mix flags."""
    group = parser.add_argument_group("model and GPUs (KV-cache memory limit)")
    group.add_argument("--model", metavar="PRESET", help=f"one of: {', '.join(sorted(PRESETS))}")
    group.add_argument("--gpu-memory-gib", type=positive_float, help="memory of one GPU")
    group.add_argument("--gpus-per-replica", type=positive_int, default=1)
    group.add_argument(
        "--context-tokens",
        type=positive_int,
        help="context length (prompt + output) at the planning quantile, p95 by default",
    )
    group.add_argument("--memory-utilization", type=fraction, default=0.9)
    group.add_argument("--overhead-gib-per-gpu", type=non_negative_float, default=1.0)
    group.add_argument("--weight-dtype", choices=sorted(DTYPE_BYTES))
    group.add_argument("--kv-cache-dtype", choices=sorted(DTYPE_BYTES))
    group.add_argument("--layers", type=positive_int, help="override the preset's layer count")
    group.add_argument("--kv-heads", type=positive_int, help="override the preset's KV heads")
    group.add_argument("--head-dim", type=positive_int, help="override the preset's head dim")
    group.add_argument("--parameters", type=positive_float, help="override the parameter count")
    group.add_argument(
        "--decode-tokens-per-second",
        type=positive_float,
        default=30.0,
        help="per-request decode speed promised to users (1 / inter-token latency target)",
    )
    tput = parser.add_argument_group("throughput (compute limit, measured on the engine)")
    tput.add_argument(
        "--replica-tokens-per-second",
        type=positive_float,
        help="measured prompt+output tokens/s of one replica",
    )
    tput.add_argument(
        "--headroom", type=multiplier, help="multiplier for uneven arrivals and long contexts"
    )


def architecture_from_args(args: argparse.Namespace) -> ModelArchitecture | None:
    if args.model is None:
        for flag in ("layers", "kv_heads", "head_dim", "parameters"):
            if getattr(args, flag) is not None:
                raise CliError(f"--{flag.replace('_', '-')} overrides a preset: give --model")
        return None
    try:
        return get_preset(args.model).with_overrides(
            layers=args.layers,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            parameters=args.parameters,
            weight_dtype=args.weight_dtype,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    except ValueError as exc:
        raise CliError(f"--model: {exc}") from None


def replica_from_args(args: argparse.Namespace) -> ReplicaSpec | None:
    """The replica spec when ``--model`` is given (then ``--gpu-memory-gib`` is required)."""
    arch = architecture_from_args(args)
    if arch is None:
        return None
    if args.gpu_memory_gib is None:
        raise CliError("--gpu-memory-gib is required with --model")
    return ReplicaSpec(
        model=arch,
        gpu_memory_gib=args.gpu_memory_gib,
        gpus_per_replica=args.gpus_per_replica,
        tokens_per_second=args.replica_tokens_per_second,
        memory_utilization=args.memory_utilization,
        overhead_gib_per_gpu=args.overhead_gib_per_gpu,
        decode_tokens_per_second_per_request=args.decode_tokens_per_second,
    )


def check_context(args: argparse.Namespace, replica: ReplicaSpec, context_tokens: int) -> None:
    limit = replica.model.max_context_tokens
    if context_tokens > limit:
        raise CliError(
            f"--context-tokens: {context_tokens} exceeds the maximum context {limit} "
            f"of {replica.model.name}"
        )


def capacity_from_args(
    args: argparse.Namespace,
    *,
    prompt_tokens: float | None = None,
    output_tokens: float | None = None,
    context_tokens: int | None = None,
    default_headroom: float = 1.0,
    tokens_per_second: float | None = None,
) -> CapacityModel:
    """A capacity model from the flags; explicit token values (e.g. from a trace) win, and
    so does an explicit ``tokens_per_second`` (a replica derived from other measurements)."""
    prompt = prompt_tokens if prompt_tokens is not None else getattr(args, "prompt_tokens", None)
    output = output_tokens if output_tokens is not None else getattr(args, "output_tokens", None)
    if prompt is None or output is None:
        raise CliError("--prompt-tokens and --output-tokens are required for this input")
    context = args.context_tokens if args.context_tokens is not None else context_tokens
    if tokens_per_second is None:
        tokens_per_second = args.replica_tokens_per_second
    if tokens_per_second is None:
        raise CliError("--replica-tokens-per-second is required (measure it on the engine)")
    replica = replica_from_args(args)
    try:
        tokens = TokenProfile(prompt, output, context)
        if replica is not None:
            check_context(args, replica, tokens.planning_context_tokens)
        headroom = args.headroom if args.headroom is not None else default_headroom
        return CapacityModel(
            tokens=tokens,
            replica=replica,
            tokens_per_second=tokens_per_second,
            headroom=headroom,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
