"""Capacity model: KV-cache memory, token throughput and the replicas a demand needs (pure)."""

from prescaler.capacity._architecture import (
    DTYPE_BYTES,
    PRESETS,
    ModelArchitecture,
    get_preset,
)
from prescaler.capacity._model import (
    GIB,
    CapacityModel,
    Constraint,
    ModelDoesNotFit,
    ReplicaSpec,
    Requirement,
    TokenProfile,
)
from prescaler.capacity._sizing import WindowSizing, size_window

__all__ = [
    "DTYPE_BYTES",
    "GIB",
    "PRESETS",
    "CapacityModel",
    "Constraint",
    "ModelArchitecture",
    "ModelDoesNotFit",
    "ReplicaSpec",
    "Requirement",
    "TokenProfile",
    "WindowSizing",
    "get_preset",
    "size_window",
]
