"""Prometheus adapter: current demand and demand history, or an explicit "unavailable".

Blocking (``requests`` underneath); the reconcile loop calls it from a worker thread.
Missing data, ``NaN``/``Inf``, negative rates and unreachable servers are reported as
``None`` with a reason, never as zero: a zero would read as "no demand" and shrink the fleet.
A query the server rejects as malformed raises :class:`PromQLError`, a spec problem.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from prescaler.sources._profiles import Queries, QueryName

# Prometheus caps a range query at 11,000 points per series.
MAX_POINTS_PER_QUERY = 10_000


class SourceError(Exception):
    """Base of the errors a metrics source raises."""


class PromQLError(SourceError):
    """Prometheus rejected a query as malformed (a spec error, not an outage)."""

    def __init__(self, name: str, query: str, detail: str) -> None:
        super().__init__(f"query {name} is not valid PromQL: {detail}")
        self.name = name
        self.query = query


class MetricsUnavailable(SourceError):
    """Prometheus could not be reached or answered with an error."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Demand now. Each value is ``None`` when it could not be measured."""

    at: float
    requests_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    output_tokens_per_second: float | None = None
    running: float | None = None
    waiting: float | None = None
    context_tokens: float | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)
    """Why values are missing, one line each."""

    @property
    def available(self) -> bool:
        """Demand (requests/s) is known."""
        return self.requests_per_second is not None

    @property
    def tokens_per_second(self) -> float | None:
        if self.prompt_tokens_per_second is None or self.output_tokens_per_second is None:
            return None
        return self.prompt_tokens_per_second + self.output_tokens_per_second

    def mean_tokens(self) -> tuple[float | None, float | None]:
        """Mean prompt and output tokens per request, when traffic allows measuring them."""
        rps = self.requests_per_second
        prompt, output = self.prompt_tokens_per_second, self.output_tokens_per_second
        if rps is None or rps <= 1e-9 or prompt is None or output is None:
            return None, None
        if prompt + output <= 0:
            return None, None
        return prompt / rps, output / rps


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number


def _instant_value(result: Sequence[Mapping[str, Any]]) -> float | None:
    """The sum of an instant vector (or the scalar), or ``None`` when empty or garbage."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return _finite(result[1])  # a scalar result: [ts, "value"]
    values = [_finite(series.get("value", [None, None])[1]) for series in result]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


_STATUS = re.compile(r"HTTP Status Code (\d+)")


def _classify(name: str, query: str, exc: Exception) -> SourceError:
    text = str(exc)
    match = _STATUS.search(text)
    if match and match.group(1) in ("400", "422") and "bad_data" in text:
        detail = text
        found = re.search(r'"error":"(.*?)"', text)
        if found:
            detail = found.group(1)
        return PromQLError(name, query, detail)
    return MetricsUnavailable(f"query {name}: {text[:300]}")


class PrometheusSource:
    """Reads one pool's queries from one Prometheus."""

    def __init__(
        self,
        url: str,
        queries: Queries,
        *,
        headers: Mapping[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        verify_tls: bool = True,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.queries = queries
        self._prom = PrometheusConnect(
            url=url.rstrip("/"),
            headers=dict(headers or {}),
            disable_ssl=not verify_tls,
            retry=Retry(total=1, backoff_factor=0.1, status_forcelist=(502, 503, 504)),
            auth=basic_auth,
            timeout=timeout_seconds,
        )

    def close(self) -> None:
        self._prom.close()

    def _instant(self, name: QueryName, query: str, at: float) -> float | None:
        try:
            result = self._prom.custom_query(query, params={"time": f"{at:.3f}"})
        except PrometheusApiClientException as exc:
            raise _classify(name, query, exc) from None
        except (requests.RequestException, ValueError) as exc:
            raise MetricsUnavailable(f"query {name}: {exc}") from None
        return _instant_value(result)

    def snapshot(self, at: float) -> Snapshot:
        """Every quantity at ``at``. Raises :class:`PromQLError` for a malformed query and
        :class:`MetricsUnavailable` when the server cannot be reached."""
        values: dict[str, float | None] = {}
        problems: list[str] = []
        for name, query in self.queries.items():
            value = self._instant(name, query, at)
            if value is None:
                problems.append(f"{name}: no data or not a finite number >= 0")
            values[name] = value
        return Snapshot(at=at, problems=tuple(problems), **values)

    def history(self, start: float, end: float, step_seconds: float) -> pd.Series:
        """Requests/s over ``[start, end]`` at ``step_seconds``, indexed by UTC time.

        Long ranges are split to stay under Prometheus' per-query point cap; gaps and
        garbage samples are dropped (the forecaster handles the missing steps).
        """
        name: QueryName = "requests_per_second"
        query = self.queries.requests_per_second
        chunk = MAX_POINTS_PER_QUERY * step_seconds
        stamps: list[float] = []
        values: list[float] = []
        lo = start
        while lo <= end:
            hi = min(end, lo + chunk)
            try:
                result = self._prom.custom_query_range(
                    query,
                    start_time=datetime.fromtimestamp(lo, UTC),
                    end_time=datetime.fromtimestamp(hi, UTC),
                    step=f"{step_seconds:g}",
                )
            except PrometheusApiClientException as exc:
                raise _classify(name, query, exc) from None
            except (requests.RequestException, ValueError) as exc:
                raise MetricsUnavailable(f"history: {exc}") from None
            sums: dict[float, float] = {}
            for series in result:
                for ts, raw in series.get("values", []):
                    value = _finite(raw)
                    if value is not None:
                        sums[float(ts)] = sums.get(float(ts), 0.0) + value
            for ts in sorted(sums):
                stamps.append(ts)
                values.append(sums[ts])
            lo = hi + step_seconds
        index = pd.to_datetime(pd.Series(stamps, dtype="float64"), unit="s", utc=True)
        return pd.Series(values, index=pd.DatetimeIndex(index), dtype="float64", name="rps")
