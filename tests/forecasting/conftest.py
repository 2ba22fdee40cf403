"""Synthetic demand series with known structure, for the forecasting tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

DAY = 86_400.0
T0 = 1_704_067_200.0  # 2024-01-01T00:00Z, a Monday

SeriesFactory = Callable[..., pd.Series]


def _make(
    *,
    days: float = 3.0,
    step: float = 60.0,
    level: float = 100.0,
    amplitude: float = 0.3,
    period: float = DAY,
    noise: str = "poisson",
    seed: int = 0,
    start: float = T0,
) -> pd.Series:
    """Demand ``level * (1 + amplitude * sin(2π t / period))`` in requests/s.

    ``noise="poisson"`` draws request counts per step (the realistic case), ``"none"``
    returns the exact curve.
    """
    n = round(days * DAY / step)
    t = start + np.arange(n) * step
    rate = level * (1 + amplitude * np.sin(2 * np.pi * (t - start) / period))
    if noise == "poisson":
        rate = np.random.default_rng(seed).poisson(rate * step) / step
    index = pd.to_datetime(t, unit="s", utc=True)
    return pd.Series(rate.astype(float), index=index, name="rps")


@pytest.fixture
def seasonal() -> SeriesFactory:
    """Factory of daily-seasonal demand series (see ``_make``)."""
    return _make


def truth(t: np.ndarray, level: float = 100.0, amplitude: float = 0.3) -> np.ndarray:
    return level * (1 + amplitude * np.sin(2 * np.pi * (t - T0) / DAY))


@pytest.fixture
def true_rate() -> Callable[..., np.ndarray]:
    """The noise-free curve of ``seasonal`` at unix times ``t`` (bin starts)."""
    return truth
