"""Capacity model: KV-cache memory, token throughput and the replicas a demand needs (pure)."""

from prescaler.capacity._architecture import (
    DTYPE_BYTES,
    PRESETS,
    ModelArchitecture,
    get_preset,
)
from prescaler.capacity._counts import TOLERANCE, covers, replicas_for
from prescaler.capacity._model import (
    GIB,
    REQUESTS,
    CapacityModel,
    Constraint,
    DemandUnit,
    ModelDoesNotFit,
    ReplicaSpec,
    Requirement,
    TokenProfile,
)
from prescaler.capacity._roles import ROLES, Role, role_capacity, role_unit
from prescaler.capacity._sizing import WindowSizing, size_window

__all__ = [
    "DTYPE_BYTES",
    "GIB",
    "PRESETS",
    "REQUESTS",
    "ROLES",
    "TOLERANCE",
    "CapacityModel",
    "Constraint",
    "DemandUnit",
    "ModelArchitecture",
    "ModelDoesNotFit",
    "ReplicaSpec",
    "Requirement",
    "Role",
    "TokenProfile",
    "WindowSizing",
    "covers",
    "get_preset",
    "replicas_for",
    "role_capacity",
    "role_unit",
    "size_window",
]
