"""One rule for a model that does not fit, the same in the capacity model, the CLI and a pool.

A replica must hold its weights, its overhead and the KV cache of one request at the
planning context in its usable memory. Otherwise every path refuses it with the same
:class:`ModelDoesNotFit` message, never a concurrency of 0 or a negative KV-cache size.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prescaler.api import SpecError, check_spec, parse_spec
from prescaler.capacity import (
    GIB,
    PRESETS,
    CapacityModel,
    ModelDoesNotFit,
    ReplicaSpec,
    TokenProfile,
    get_preset,
)
from prescaler.cli import main

# The case: Llama-3.1-70B (141.2 GB of bf16 weights) on one 80 GiB GPU.
TOO_SMALL = ["--model", "llama-3.1-70b", "--gpu-memory-gib", "80", "--gpus-per-replica", "1"]
DEMAND = ["--prompt-tokens", "1000", "--output-tokens", "500",
          "--replica-tokens-per-second", "3000", "--requests-per-second", "5"]  # fmt: skip


def _message() -> str:
    replica = ReplicaSpec(get_preset("llama-3.1-70b"), gpu_memory_gib=80, gpus_per_replica=1)
    with pytest.raises(ModelDoesNotFit) as info:
        replica.check_fits(4096)
    return str(info.value)


def test_the_message_says_what_does_not_fit_by_how_much_and_what_to_change() -> None:
    message = _message()
    assert message.startswith("model llama-3.1-70b does not fit on 1 x 80 GiB")
    assert "weights 131.5 GiB" in message  # 141.2e9 bytes
    assert "one 4096-token request" in message
    assert "72.0 GiB is usable" in message  # 80 GiB x 0.9
    assert "GiB short" in message
    assert "at least 2 GPUs per replica" in message


def test_exactly_one_request_fits_and_one_byte_less_does_not() -> None:
    arch = get_preset("llama-3.1-8b")
    context = 4096
    needed = arch.weight_bytes + 1 * GIB + arch.kv_bytes_per_token * context
    fits = ReplicaSpec(arch, gpu_memory_gib=needed / GIB, gpus_per_replica=1, memory_utilization=1)
    assert fits.usable_bytes == needed
    assert fits.max_concurrent_requests(context) == 1
    short = ReplicaSpec(
        arch, gpu_memory_gib=(needed - 1) / GIB, gpus_per_replica=1, memory_utilization=1
    )
    with pytest.raises(ModelDoesNotFit) as info:
        short.max_concurrent_requests(context)
    assert info.value.shortfall_bytes == needed - short.usable_bytes >= 1


@settings(max_examples=200, deadline=None)
# The per-GPU overhead leaves a hair of memory: no GPU count is advice worth giving.
@example(name="deepseek-v3", gpu_gib=1.0000000000000002, gpus=1, utilization=1.0, context=1)
@given(
    name=st.sampled_from(sorted(PRESETS)),
    gpu_gib=st.floats(min_value=1, max_value=192),
    gpus=st.integers(min_value=1, max_value=16),
    utilization=st.floats(min_value=0.05, max_value=1.0),
    context=st.integers(min_value=1, max_value=131_072),
)
def test_a_replica_serves_at_least_one_request_or_is_refused(
    name: str, gpu_gib: float, gpus: int, utilization: float, context: int
) -> None:
    arch = get_preset(name)
    context = min(context, arch.max_context_tokens)
    replica = ReplicaSpec(arch, gpu_gib, gpus, memory_utilization=utilization)
    try:
        concurrency = replica.max_concurrent_requests(context)
    except ModelDoesNotFit as exc:
        refused: ModelDoesNotFit | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.shortfall_bytes > 0
        if refused.min_gpus_per_replica is not None:
            # The advice is right: that many GPUs hold the model (more than given).
            enough = ReplicaSpec(
                arch, gpu_gib, refused.min_gpus_per_replica, memory_utilization=utilization
            )
            assert enough.max_concurrent_requests(context) >= 1
            assert refused.min_gpus_per_replica > gpus
        return
    assert concurrency >= 1
    assert replica.kv_cache_bytes > 0
    capacity = CapacityModel(TokenProfile(context, 0), replica=replica, tokens_per_second=1000)
    assert capacity.memory_requests_per_second > 0


@pytest.mark.parametrize(
    "argv",
    [
        [*TOO_SMALL, "--context-tokens", "4096"],
        [*TOO_SMALL, "--context-tokens", "4096", "--json"],
        [*TOO_SMALL, "--context-tokens", "4096", *DEMAND],
    ],
    ids=["memory", "memory-json", "with-demand"],
)
def test_prescaler_plan_refuses_it_in_both_forms(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"prescaler plan: error: {_message()}\n"


def test_a_pool_with_that_model_is_a_spec_error_with_the_same_message() -> None:
    raw: dict[str, Any] = {
        "target": {"name": "llm"},
        "model": {
            "preset": "llama-3.1-70b",
            "gpuMemoryGiB": 80,
            "gpusPerReplica": 1,
            "tokensPerSecond": 3000,
            "contextTokens": 4096,
        },
    }
    with pytest.raises(SpecError) as info:
        check_spec(parse_spec(raw))
    assert str(info.value) == f"spec.model: {_message()}"
    raw["model"]["gpusPerReplica"] = 2  # the advice in the message works
    check_spec(parse_spec(raw))
