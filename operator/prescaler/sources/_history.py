"""A pool's demand history, read from Prometheus as the operator reads it, for a backtest.

Three series on one grid of ``step`` seconds, each read by
:meth:`PrometheusSource.history` (the operator's own reader: the rate window follows the
step, every sample re-stamped to the start of the step it describes):

* requests/s (the demand the operator forecasts);
* prompt tokens/s and output tokens/s (the token mix the capacity model plans on).

Missing data is never a zero. A step without a finite sample >= 0 of requests/s is a
**gap** (NaN), counted and listed in :attr:`DemandHistory.gaps`; the rates come from
``rate()``, which already reads through counter resets (a restarted engine), so a reset
is neither a gap nor a spike. A step with requests/s but without its token rates is a
**token gap** (counted in :attr:`DemandHistory.token_gap_steps`). Steps before the
first sample and after the last are not history at all: the series is cut to them. No
sample of requests/s anywhere is :class:`EmptyHistory`; an unreachable server or an
answer that is not Prometheus' JSON is :class:`MetricsUnavailable`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prescaler.sources._profiles import Queries, QueryName
from prescaler.sources._prometheus import MetricsUnavailable, PrometheusSource, SourceError

HISTORY_QUERIES: tuple[QueryName, ...] = (
    "requests_per_second",
    "prompt_tokens_per_second",
    "output_tokens_per_second",
)
"""The series a backtest replays, in the order they are read."""


class EmptyHistory(SourceError):
    """Prometheus answered, but without one usable sample of the demand in the span."""


@dataclass(frozen=True)
class DemandHistory:
    """Per-step demand; ``NaN`` where a step has no usable sample."""

    start: float
    """Unix seconds of the first step (the first with a sample of requests/s)."""
    step_seconds: float
    requests_per_second: np.ndarray
    prompt_tokens_per_second: np.ndarray
    output_tokens_per_second: np.ndarray
    context_tokens: float | None = None
    """The context length at the pool's quantile at the end of the span (the operator's
    instant read), ``None`` when not measured."""

    def __len__(self) -> int:
        return len(self.requests_per_second)

    @property
    def end(self) -> float:
        """Unix seconds of the end of the last step."""
        return self.start + len(self) * self.step_seconds

    def gaps(self) -> list[tuple[float, float]]:
        """``[start, end)`` (unix seconds) of each run of steps without requests/s."""
        missing = ~np.isfinite(self.requests_per_second)
        out: list[tuple[float, float]] = []
        i, n = 0, len(missing)
        while i < n:
            if not missing[i]:
                i += 1
                continue
            j = i
            while j < n and missing[j]:
                j += 1
            out.append((self.start + i * self.step_seconds, self.start + j * self.step_seconds))
            i = j
        return out

    @property
    def gap_steps(self) -> int:
        return int(np.sum(~np.isfinite(self.requests_per_second)))

    @property
    def token_gap_steps(self) -> int:
        """Steps with requests/s but without both token rates."""
        known = np.isfinite(self.requests_per_second)
        tokens = np.isfinite(self.prompt_tokens_per_second) & np.isfinite(
            self.output_tokens_per_second
        )
        return int(np.sum(known & ~tokens))

    def tokens_per_request(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean prompt and output tokens per request in each step; NaN where a step has no
        requests or no token rates."""
        rps = self.requests_per_second
        with np.errstate(divide="ignore", invalid="ignore"):
            busy = np.isfinite(rps) & (rps > 0)
            prompt = np.where(busy, self.prompt_tokens_per_second / rps, np.nan)
            output = np.where(busy, self.output_tokens_per_second / rps, np.nan)
        return prompt, output


def _on_grid(series: pd.Series, first: float, step: float, count: int) -> np.ndarray:
    out = np.full(count, np.nan)
    stamps = pd.DatetimeIndex(series.index)
    for stamp, value in zip(stamps, series.to_numpy(dtype=float), strict=True):
        k = round((stamp.timestamp() - first) / step)
        if 0 <= k < count:
            out[k] = float(value)
    return out


def read_demand_history(
    url: str,
    queries: Callable[[QueryName], Queries],
    *,
    start: float,
    end: float,
    step_seconds: float = 60.0,
    headers: Mapping[str, str] | None = None,
    basic_auth: tuple[str, str] | None = None,
    verify_tls: bool = True,
    timeout_seconds: float = 60.0,
) -> DemandHistory:
    """Requests/s and prompt and output tokens/s over ``[start, end)`` from the Prometheus
    at ``url``; ``queries(name)`` renders the pool's queries with ``name`` as the demand
    (:func:`prescaler.sources.render_queries`). Raises :class:`PromQLError`,
    :class:`MetricsUnavailable` or :class:`EmptyHistory`."""
    step = float(step_seconds)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"step_seconds must be a finite number > 0, got {step_seconds!r}")
    first = math.ceil(start / step - 1e-9) * step
    count = max(0, math.floor((end - first) / step + 1e-9))
    series: dict[QueryName, np.ndarray] = {}
    context: float | None = None
    for name in HISTORY_QUERIES:
        source = PrometheusSource(
            url,
            queries(name),
            headers=headers,
            basic_auth=basic_auth,
            verify_tls=verify_tls,
            timeout_seconds=timeout_seconds,
        )
        try:
            series[name] = _on_grid(source.history(first, end, step), first, step, count)
            if name == "requests_per_second":
                _require_demand(series[name], source.queries.demand_query, url, start, end)
                try:
                    context = source.snapshot(end).context_tokens
                except MetricsUnavailable:
                    context = None  # the capacity model plans on the spec's context
        finally:
            source.close()
    rps = series["requests_per_second"]
    known = np.flatnonzero(np.isfinite(rps))
    lo, hi = int(known[0]), int(known[-1]) + 1
    return DemandHistory(
        start=first + lo * step,
        step_seconds=step,
        requests_per_second=rps[lo:hi],
        prompt_tokens_per_second=series["prompt_tokens_per_second"][lo:hi],
        output_tokens_per_second=series["output_tokens_per_second"][lo:hi],
        context_tokens=context,
    )


def _require_demand(values: np.ndarray, query: str, url: str, start: float, end: float) -> None:
    if np.isfinite(values).any():
        return
    span = " to ".join(pd.Timestamp(t, unit="s", tz="UTC").isoformat() for t in (start, end))
    raise EmptyHistory(
        f"{url} has no sample of the pool's demand from {span} (no series, or only values "
        f"that are not finite numbers >= 0): {query}"
    )
