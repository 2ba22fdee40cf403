"""Turn a trace into per-minute demand in tokens/s (the truth) and requests/s (what is observed)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from prescaler.backtest.traces import Trace

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
    tokens = _fill_gaps(np.where(gaps, np.nan, rps * (prompt + output)))
    observed = np.where(gaps, np.nan, tokens / (mean_prompt + mean_output))
    return Demand(
        start=minute.start,
        tokens_per_s=tokens,
        observed_requests_per_s=observed,
        prompt_tokens=mean_prompt,
        output_tokens=mean_output,
        context_p95=minute.context_p95,
        name=trace.name,
    )
