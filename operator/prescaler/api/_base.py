"""The base of every wire model: camelCase on the wire, docstrings as descriptions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

GROUP = "prescaler.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAMES = ("ppool",)
PREWARM_CONDITION = f"{GROUP}/prewarmed"
"""The pod condition (and readiness gate) of a warmed replica: a pod template that lists it
in ``readinessGates`` keeps its pods out of the Service until the operator sets it."""


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (a CEL rule the API server evaluates)."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` for a model that carries CEL rules."""
    return {"x-kubernetes-validations": list(rules)}


class WireModel(BaseModel):
    """camelCase aliases, attribute docstrings as field descriptions, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        frozen=True,
        extra="ignore",
    )

    @classmethod
    def default_of(cls, name: str) -> Any:
        """The default of field ``name`` (by its Python name): the one place a default
        lives, for whatever else needs it (the CLI's flags, a pool that omits a section)."""
        return cls.model_fields[name].get_default(call_default_factory=True)

    def wire(self) -> dict[str, Any]:
        """The object as it goes on the wire: camelCase, without unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
