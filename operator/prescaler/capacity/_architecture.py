"""Model architectures and the KV-cache bytes each token costs.

Standard attention (MHA/GQA) caches one K and one V vector per KV head per layer:

    kv_bytes_per_token = 2 * layers * kv_heads * head_dim * bytes_per_element

Multi-head latent attention (MLA, DeepSeek-V2/V3) caches one compressed latent of
``kv_lora_rank`` elements plus one decoupled RoPE key of ``rope_head_dim`` elements per
layer, shared by all heads; there is no separate V:

    kv_bytes_per_token = layers * (kv_lora_rank + rope_head_dim) * bytes_per_element

That is what MLA-aware engines (vLLM, SGLang) allocate, so the MLA presets are exact for
them. An engine that expands MLA back to full K/V heads uses far more; model it as a custom
architecture with ``attention="gqa"`` and the expanded head counts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Attention = Literal["gqa", "mla"]
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class ModelArchitecture:
    """The facts about a model that decide its memory footprint."""

    name: str
    layers: int
    """Transformer layers (each holds its own KV cache)."""
    kv_heads: int
    """KV heads per layer (GQA groups). Ignored for MLA."""
    head_dim: int
    """Dimension of one attention head. Ignored for MLA."""
    parameters: float
    """Total parameter count (all experts for MoE: every expert sits in GPU memory)."""
    max_context_tokens: int
    """Longest context the model supports."""
    weight_dtype: str = "bf16"
    kv_cache_dtype: str = "bf16"
    attention: Attention = "gqa"
    kv_lora_rank: int = 0
    """MLA only: width of the compressed KV latent."""
    rope_head_dim: int = 0
    """MLA only: width of the decoupled RoPE key."""
    weight_bytes_override: int | None = None
    """Exact weight bytes, when known better than ``parameters * dtype bytes``."""

    def __post_init__(self) -> None:
        for field_name in ("layers", "parameters", "max_context_tokens"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{field_name} must be > 0 for model {self.name!r}")
        for field_name in ("weight_dtype", "kv_cache_dtype"):
            if getattr(self, field_name) not in DTYPE_BYTES:
                allowed = ", ".join(DTYPE_BYTES)
                raise ValueError(f"{field_name} must be one of {allowed}")
        if self.attention == "gqa" and (self.kv_heads <= 0 or self.head_dim <= 0):
            raise ValueError(f"kv_heads and head_dim must be > 0 for model {self.name!r}")
        if self.attention == "mla" and self.kv_lora_rank <= 0:
            raise ValueError(f"kv_lora_rank must be > 0 for MLA model {self.name!r}")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token of context holds, over all layers."""
        element = DTYPE_BYTES[self.kv_cache_dtype]
        if self.attention == "mla":
            per_layer = (self.kv_lora_rank + self.rope_head_dim) * element
        else:
            per_layer = 2 * self.kv_heads * self.head_dim * element
        return int(self.layers * per_layer)

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights occupy in GPU memory (summed over all GPUs of a replica)."""
        if self.weight_bytes_override is not None:
            return self.weight_bytes_override
        return int(self.parameters * DTYPE_BYTES[self.weight_dtype])

    def with_overrides(self, **changes: object) -> ModelArchitecture:
        """A copy with some fields replaced; ``None`` values are ignored."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]


# Real architectures, from each model's published config.json.
PRESETS: dict[str, ModelArchitecture] = {
    arch.name: arch
    for arch in (
        ModelArchitecture(
            "llama-3.1-8b",
            layers=32,
            kv_heads=8,
            head_dim=128,
            parameters=8.03e9,
            max_context_tokens=131_072,
        ),
        ModelArchitecture(
            "llama-3.1-70b",
            layers=80,
            kv_heads=8,
            head_dim=128,
            parameters=70.6e9,
            max_context_tokens=131_072,
        ),
        ModelArchitecture(
            "llama-3.1-405b",
            layers=126,
            kv_heads=8,
            head_dim=128,
            parameters=405.9e9,
            max_context_tokens=131_072,
        ),
        ModelArchitecture(
            "mistral-7b",
            layers=32,
            kv_heads=8,
            head_dim=128,
            parameters=7.25e9,
            max_context_tokens=32_768,
        ),
        ModelArchitecture(
            "mixtral-8x7b",
            layers=32,
            kv_heads=8,
            head_dim=128,
            parameters=46.7e9,
            max_context_tokens=32_768,
        ),
        ModelArchitecture(
            "qwen2.5-7b",
            layers=28,
            kv_heads=4,
            head_dim=128,
            parameters=7.62e9,
            max_context_tokens=131_072,
        ),
        ModelArchitecture(
            "qwen2.5-72b",
            layers=80,
            kv_heads=8,
            head_dim=128,
            parameters=72.7e9,
            max_context_tokens=131_072,
        ),
        ModelArchitecture(
            "deepseek-v2-lite",
            layers=27,
            kv_heads=0,
            head_dim=0,
            parameters=15.7e9,
            max_context_tokens=163_840,
            attention="mla",
            kv_lora_rank=512,
            rope_head_dim=64,
        ),
        ModelArchitecture(
            "deepseek-v3",
            layers=61,
            kv_heads=0,
            head_dim=0,
            parameters=671e9,
            max_context_tokens=163_840,
            weight_dtype="fp8",
            attention="mla",
            kv_lora_rank=512,
            rope_head_dim=64,
        ),
    )
}


def get_preset(name: str) -> ModelArchitecture:
    """The preset called ``name``; a ``ValueError`` lists the known names otherwise."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown model preset {name!r}; known presets: {known}") from None
