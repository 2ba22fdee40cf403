"""Metric sources: Prometheus, read through per-engine PromQL profiles.

Errors::

    SourceError
    ├── PromQLError          a query is malformed: a spec problem (condition Invalid)
    └── MetricsUnavailable   the server cannot answer: hold, never scale down
"""

from prescaler.sources._profiles import (
    PROFILES,
    ROLE_DEMAND,
    Queries,
    QueryName,
    render_queries,
)
from prescaler.sources._prometheus import (
    MAX_POINTS_PER_QUERY,
    MetricsUnavailable,
    PrometheusSource,
    PromQLError,
    Snapshot,
    SourceError,
)

__all__ = [
    "MAX_POINTS_PER_QUERY",
    "PROFILES",
    "ROLE_DEMAND",
    "MetricsUnavailable",
    "PromQLError",
    "PrometheusSource",
    "Queries",
    "QueryName",
    "Snapshot",
    "SourceError",
    "render_queries",
]
