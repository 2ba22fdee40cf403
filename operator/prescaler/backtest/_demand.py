"""Turn a trace into per-minute demand in tokens/s (the truth) and requests/s (what is observed)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from prescaler.backtest.traces import Trace
from prescaler.capacity import Role

FloatArray = np.ndarray

MINUTE = 60.0


@dataclass(frozen=True)
class Demand:
    """Per-minute demand. Minute ``m`` covers ``[start + 60 m, start + 60 (m + 1))``."""

    start: float
    """Unix seconds of minute 0."""
    tokens_per_s: FloatArray
    """Prompt + output tokens arriving per second, averaged over each minute (the truth)."""
    observed_requests_per_s: FloatArray
    """Load in *mean-sized* requests per second (``tokens_per_s / tokens_per_request``), as
    an operator's metrics show it: NaN in the trace's collection gaps."""
    prompt_tokens: float
    """Request-weighted mean prompt tokens per request over the trace."""
    output_tokens: float
    """Request-weighted mean output tokens per request over the trace."""
    context_p95: float | None = None
    """p95 of prompt + output tokens per request, when the trace or token mix knows it."""
    name: str = ""
    replay_from: int = 0
    """Minutes before this are warm-up: history the policies may observe, not replayed."""

    def __len__(self) -> int:
        return len(self.tokens_per_s)

    @property
    def tokens_per_request(self) -> float:
        return self.prompt_tokens + self.output_tokens

    @property
    def minutes(self) -> int:
        return len(self.tokens_per_s)

    @property
    def replay_start(self) -> float:
        """Unix seconds of the first replayed minute."""
        return self.start + MINUTE * self.replay_from

    @property
    def replay_tokens_per_s(self) -> FloatArray:
        """Demand of the replayed minutes."""
        return np.asarray(self.tokens_per_s[self.replay_from :], dtype=float)

    def with_replay_days(self, days: float | None) -> Demand:
        """Replay only the last ``days``; earlier minutes become observable warm-up."""
        if days is None:
            return replace(self, replay_from=0)
        keep = max(1, round(days * 1440))
        return replace(self, replay_from=max(0, len(self) - keep))

    def head(self, minutes: int) -> Demand:
        """The first ``minutes`` (warm-up included)."""
        return replace(
            self,
            tokens_per_s=self.tokens_per_s[:minutes],
            observed_requests_per_s=self.observed_requests_per_s[:minutes],
            replay_from=min(self.replay_from, max(0, minutes - 1)),
        )

    def times(self) -> FloatArray:
        """Start of each minute, unix seconds."""
        return self.start + MINUTE * np.arange(len(self), dtype=float)

    def scaled(self, factor: float) -> Demand:
        """Demand multiplied by ``factor`` (token lengths unchanged)."""
        if not factor > 0:
            raise ValueError(f"demand scale factor must be > 0, got {factor}")
        return replace(
            self,
            tokens_per_s=self.tokens_per_s * factor,
            observed_requests_per_s=self.observed_requests_per_s * factor,
        )

    def observed_series(self) -> pd.Series:
        """Observed requests/s per minute, tz-aware UTC index at minute starts."""
        index = pd.to_datetime(self.times(), unit="s", utc=True)
        return pd.Series(self.observed_requests_per_s, index=index, name="requests_per_second")


def _fill_gaps(values: FloatArray) -> FloatArray:
    """Linear interpolation over NaN (nearest value at the edges)."""
    ok = np.isfinite(values)
    if ok.all():
        return values
    if not ok.any():
        raise ValueError("the trace has no data at all (every bin is a gap)")
    idx = np.arange(len(values), dtype=float)
    return np.asarray(np.interp(idx, idx[ok], values[ok]), dtype=float)


@dataclass(frozen=True)
class _Minutes:
    """A trace per minute, as both demands are built from it."""

    start: float
    rps: FloatArray
    """Requests/s, NaN in the collection gaps."""
    gaps: FloatArray
    prompt: FloatArray
    """Mean prompt tokens per request in each minute."""
    output: FloatArray
    mean_prompt: float
    """Request-weighted over the trace."""
    mean_output: float
    context_p95: float | None


def _minutes(
    trace: Trace, prompt_tokens: float | None = None, output_tokens: float | None = None
) -> _Minutes:
    minute = trace.resample(MINUTE)
    rps = np.asarray(minute.rps, dtype=float)
    gaps = ~np.isfinite(rps)
    prompt, output = minute.tokens_per_request(prompt_tokens, output_tokens)
    weights = np.where(gaps, 0.0, rps)
    total = float(weights.sum())
    if not total > 0:
        raise ValueError("the trace has no requests")
    mean_prompt = float(np.sum(weights * prompt) / total)
    mean_output = float(np.sum(weights * output) / total)
    if mean_prompt + mean_output <= 0:
        raise ValueError("requests in the trace carry no tokens")
    return _Minutes(
        minute.start, rps, gaps, prompt, output, mean_prompt, mean_output, minute.context_p95
    )


def demand_from_trace(
    trace: Trace,
    *,
    prompt_tokens: float | None = None,
    output_tokens: float | None = None,
) -> Demand:
    """Per-minute demand from a trace.

    Token lengths come from the trace when it has them, else from ``prompt_tokens`` and
    ``output_tokens``. Collection gaps (NaN) are interpolated for the simulated truth, and
    stay NaN in what the policies observe.
    """
    m = _minutes(trace, prompt_tokens, output_tokens)
    tokens = _fill_gaps(np.where(m.gaps, np.nan, m.rps * (m.prompt + m.output)))
    observed = np.where(m.gaps, np.nan, tokens / (m.mean_prompt + m.mean_output))
    return Demand(
        start=m.start,
        tokens_per_s=tokens,
        observed_requests_per_s=observed,
        prompt_tokens=m.mean_prompt,
        output_tokens=m.mean_output,
        context_p95=m.context_p95,
        name=trace.name,
    )


def role_demand(trace: Trace, role: Role) -> Demand:
    """One role of a disaggregated fleet's per-minute demand: the prompt tokens/s arriving
    (prefill) or the output tokens/s (decode), from the same requests, minutes and gaps as
    :func:`demand_from_trace` (the two roles' demands add up to its demand).

    It counts as :func:`prescaler.capacity.role_capacity` does: one "request" is one token
    of the role's kind (``prompt_tokens`` 1 and ``output_tokens`` 0 for prefill, the other
    way round for decode), so what the policies observe is the role's token rate itself,
    as the role's engines count it. The trace needs per-request token lengths: a role's
    share of the tokens is what the replay is about, so no default stands in for it.
    """
    if not trace.has_tokens:
        raise ValueError("a role's demand needs a trace with per-request token lengths")
    m = _minutes(trace)
    per_request = m.prompt if role == "prefill" else m.output
    tokens = _fill_gaps(np.where(m.gaps, np.nan, m.rps * per_request))
    return Demand(
        start=m.start,
        tokens_per_s=tokens,
        observed_requests_per_s=np.where(m.gaps, np.nan, tokens),
        prompt_tokens=1.0 if role == "prefill" else 0.0,
        output_tokens=0.0 if role == "prefill" else 1.0,
        context_p95=m.context_p95,
        name=trace.name,
    )
