"""The chart's Grafana dashboard as data: its panels and the PromQL of every panel,
variable and annotation, and that PromQL as Grafana sends it (variables substituted)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/prescaler/dashboards/prescaler.json"

LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<expr>.+),)?\s*(?P<label>\w+)\s*\)\s*$", re.S)
QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.+)\)\s*$", re.S)
MACROS = re.compile(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}")
"""Grafana's interval macros: they stand where PromQL wants a duration."""
_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")
"""A dashboard variable: ``$1`` is not one but ``label_replace``'s first group, which
Grafana sends as written (it substitutes only the variables it has)."""


@dataclass(frozen=True)
class Query:
    where: str
    """Panel, variable or annotation, for a failure message."""
    expr: str


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """Every PromQL in panels, variables and annotations (variable functions unwrapped)."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield Query(f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        where = f"variable {variable.get('name')!r}"
        if m := LABEL_VALUES.match(text):
            if m.group("expr"):
                yield Query(where, m.group("expr"))
        elif m := QUERY_RESULT.match(text):
            yield Query(where, m.group("expr"))
        else:
            yield Query(where, text)
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            yield Query(f"annotation {annotation.get('name')!r}", annotation["expr"])


def substitute(expr: str, variables: Mapping[str, str], intervals: Mapping[str, str]) -> str:
    """The query as Grafana sends it: ``$__rate_interval`` and friends from ``intervals``
    (by name without ``$__``), every other ``$name`` or ``${name}`` from ``variables``. An
    unknown variable is an error, not an empty string."""

    def interval(m: re.Match[str]) -> str:
        return intervals[m.group(1) or m.group(2)]

    def variable(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise KeyError(f"no value for ${name} in {expr}")
        return variables[name]

    return _VARIABLE.sub(variable, MACROS.sub(interval, expr))
