"""Capacity math against hand-checked numbers."""

from __future__ import annotations

import pytest

from prescaler.capacity import (
    GIB,
    PRESETS,
    CapacityModel,
    ModelDoesNotFit,
    ReplicaSpec,
    TokenProfile,
    get_preset,
    size_window,
)

# name -> (layers, kv heads, head dim) from each model's config.json, and the KV bytes per
# token in bf16 worked out by hand: 2 * layers * kv_heads * head_dim * 2.
GQA_PRESETS = {
    "llama-3.1-8b": (32, 8, 128, 131_072),
    "llama-3.1-70b": (80, 8, 128, 327_680),
    "llama-3.1-405b": (126, 8, 128, 516_096),
    "mistral-7b": (32, 8, 128, 131_072),
    "mixtral-8x7b": (32, 8, 128, 131_072),
    "qwen2.5-7b": (28, 4, 128, 57_344),
    "qwen2.5-72b": (80, 8, 128, 327_680),
}


@pytest.mark.parametrize(("name", "expected"), GQA_PRESETS.items())
def test_gqa_presets_have_real_shapes_and_kv_bytes(
    name: str, expected: tuple[int, int, int, int]
) -> None:
    arch = get_preset(name)
    layers, kv_heads, head_dim, kv_bytes = expected
    assert (arch.layers, arch.kv_heads, arch.head_dim) == (layers, kv_heads, head_dim)
    assert arch.kv_bytes_per_token == kv_bytes


def test_the_brief_example_llama_70b_bf16() -> None:
    assert get_preset("llama-3.1-70b").kv_bytes_per_token == 327_680


def test_mla_caches_latent_plus_rope_key_per_layer() -> None:
    # DeepSeek-V3: 61 layers x (512 latent + 64 rope) x 2 bytes = 70,272.
    assert get_preset("deepseek-v3").kv_bytes_per_token == 61 * 576 * 2
    assert get_preset("deepseek-v2-lite").kv_bytes_per_token == 27 * 576 * 2


def test_fp8_kv_cache_halves_the_bytes() -> None:
    arch = get_preset("llama-3.1-8b").with_overrides(kv_cache_dtype="fp8")
    assert arch.kv_bytes_per_token == 65_536


def test_every_preset_carries_parameters_and_weight_bytes() -> None:
    for arch in PRESETS.values():
        assert arch.parameters > 1e9
        assert arch.weight_bytes > 0
    assert get_preset("llama-3.1-70b").weight_bytes == 141_200_000_000
    assert get_preset("deepseek-v3").weight_bytes == 671_000_000_000  # fp8 weights


def test_overrides_replace_any_field_and_ignore_none() -> None:
    arch = get_preset("mistral-7b").with_overrides(layers=40, kv_heads=None)
    assert arch.layers == 40
    assert arch.kv_heads == 8


def test_unknown_preset_lists_known_names() -> None:
    with pytest.raises(ValueError, match=r"llama-3\.1-70b"):
        get_preset("llama-9")


def test_max_concurrency_follows_the_formula() -> None:
    replica = ReplicaSpec(get_preset("llama-3.1-70b"), gpu_memory_gib=80, gpus_per_replica=4)
    usable = int(80 * GIB * 4 * 0.9)
    free = usable - 141_200_000_000 - 4 * GIB
    assert replica.max_concurrent_requests(4096) == free // (327_680 * 4096) == 121


def test_weights_that_do_not_fit_are_refused_not_zero() -> None:
    replica = ReplicaSpec(get_preset("llama-3.1-405b"), gpu_memory_gib=80, gpus_per_replica=4)
    with pytest.raises(ModelDoesNotFit, match="does not fit on 4 x 80 GiB"):
        replica.max_concurrent_requests(4096)
    with pytest.raises(ModelDoesNotFit, match="does not fit on 4 x 80 GiB"):
        CapacityModel(TokenProfile(1000, 500), replica=replica, tokens_per_second=1000)


def test_context_beyond_the_model_maximum_is_rejected() -> None:
    replica = ReplicaSpec(get_preset("mistral-7b"), gpu_memory_gib=80, gpus_per_replica=1)
    with pytest.raises(ValueError, match="exceed the maximum context 32768"):
        replica.max_concurrent_requests(40_000)


def test_compute_bound_requirement() -> None:
    # 1500 tokens per request at 3000 tokens/s per replica = 2 req/s per replica.
    capacity = CapacityModel(TokenProfile(1000, 500), tokens_per_second=3000)
    need = capacity.required(9.0)
    assert need.constraint == "compute"
    assert need.exact == pytest.approx(4.5)
    assert need.replicas == 5
    assert capacity.replica_tokens_per_second == pytest.approx(3000)


def test_memory_bound_requirement_uses_littles_law() -> None:
    # llama-3.1-8b on one 24 GiB GPU at 8k context: the KV cache holds few requests.
    replica = ReplicaSpec(
        get_preset("llama-3.1-8b"),
        gpu_memory_gib=24,
        gpus_per_replica=1,
        decode_tokens_per_second_per_request=25,
    )
    capacity = CapacityModel(
        TokenProfile(2000, 500, 8192), replica=replica, tokens_per_second=20_000
    )
    concurrency = capacity.max_concurrent_requests_per_replica
    assert concurrency == (int(24 * GIB * 0.9) - 16_060_000_000 - GIB) // (131_072 * 8192)
    latency = 2000 / 20_000 + 500 / 25
    assert capacity.request_latency_seconds == pytest.approx(latency)
    assert capacity.replica_requests_per_second == pytest.approx(concurrency / latency)
    need = capacity.required(1.0)
    assert need.constraint == "memory"
    assert need.replicas == -(-latency // concurrency)  # ceil(1 req/s * latency / concurrency)


def test_headroom_multiplies_and_exact_multiples_do_not_round_up() -> None:
    capacity = CapacityModel(TokenProfile(100, 50), tokens_per_second=150, headroom=1.5)
    assert capacity.required(2.0).replicas == 3
    assert capacity.required(0.0).replicas == 0


def test_garbage_demand_is_refused() -> None:
    capacity = CapacityModel(TokenProfile(100, 50), tokens_per_second=150)
    with pytest.raises(ValueError, match="demand"):
        capacity.required(float("nan"))
    with pytest.raises(ValueError, match="demand"):
        capacity.required(-1.0)


def test_worked_example_window_sizing() -> None:
    sizing = size_window(
        concurrent_users=500,
        prompt_tokens=1000,
        output_tokens=500,
        window_seconds=15 * 60,
        fleet_tokens_per_second=20_000,
    )
    assert sizing.total_tokens == 750_000
    assert sizing.generation_seconds == 37.5
    assert (sizing.fleet_tokens_per_second_min, sizing.fleet_tokens_per_second_max) == (
        60_000,
        90_000,
    )
