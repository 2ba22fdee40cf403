"""Metric sources: Prometheus, read through per-engine PromQL profiles.

Errors::

    SourceError
    ├── PromQLError          a query is malformed: a spec problem (condition Invalid)
    ├── MetricsUnavailable   the server cannot answer: hold, never scale down
    └── EmptyHistory         a backtest's span holds no sample of the demand
"""

from prescaler.sources._history import (
    HISTORY_QUERIES,
    DemandHistory,
    EmptyHistory,
    read_demand_history,
)
from prescaler.sources._profiles import (
    PROFILES,
    ROLE_DEMAND,
    Queries,
    QueryName,
    render_queries,
)
from prescaler.sources._prometheus import (
    MAX_POINTS_PER_QUERY,
    MAX_RESPONSE_BYTES,
    MetricsUnavailable,
    PrometheusSource,
    PromQLError,
    Snapshot,
    SourceError,
    bearer_header,
    secret_credentials,
)

__all__ = [
    "HISTORY_QUERIES",
    "MAX_POINTS_PER_QUERY",
    "MAX_RESPONSE_BYTES",
    "PROFILES",
    "ROLE_DEMAND",
    "DemandHistory",
    "EmptyHistory",
    "MetricsUnavailable",
    "PromQLError",
    "PrometheusSource",
    "Queries",
    "QueryName",
    "Snapshot",
    "SourceError",
    "bearer_header",
    "read_demand_history",
    "render_queries",
    "secret_credentials",
]
