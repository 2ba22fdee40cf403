"""The bands' vectorised calibration: every lead's log-ratio band in one call is the band
each lead would get alone."""

from __future__ import annotations

import numpy as np
import pytest

from prescaler_forecast._calibration import log_ratio_band, log_ratio_bands, row_quantile


@pytest.mark.parametrize("seed", range(5))
def test_every_row_is_the_band_it_would_get_alone(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, width = 12, 300
    actual = 50.0 * np.exp(rng.normal(0.0, 0.3, (rows, width)))
    predicted = 50.0 * np.exp(rng.normal(0.0, 0.1, (rows, width)))
    actual[rng.random((rows, width)) < 0.1] = np.nan  # gaps
    actual[rng.random((rows, width)) < 0.05] = 0.0  # idle minutes
    predicted[rng.random((rows, width)) < 0.05] = -1.0  # garbage
    for r in range(rows):  # shorter rows, as a later lead has fewer pairs
        actual[r, width - 20 * r :] = np.nan
    actual[-1, 15:] = np.nan  # too few pairs: the default spread
    lo, hi = log_ratio_bands(actual, predicted, 0.9)
    for r in range(rows):
        alone = log_ratio_band(actual[r], predicted[r], 0.9)
        assert (lo[r], hi[r]) == pytest.approx(alone, rel=1e-12)


def test_row_quantile_is_numpys_on_each_rows_finite_values() -> None:
    rng = np.random.default_rng(7)
    values = rng.normal(size=(6, 40))
    values[2, 10:] = np.nan
    values[4, :] = np.nan
    out = row_quantile(values, 0.85)
    for r in (0, 1, 2, 3, 5):
        finite = values[r][np.isfinite(values[r])]
        assert out[r] == pytest.approx(float(np.quantile(finite, 0.85)), rel=1e-12)
    assert np.isnan(out[4])
