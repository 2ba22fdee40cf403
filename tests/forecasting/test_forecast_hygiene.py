"""Data hygiene: irregular samples, gaps, collection-gap zeros, counter resets, leakage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import clean_series, counter_to_rate, mask_collection_gaps

T0 = 1_704_067_200.0


def _series(seconds: list[float], values: list[float]) -> pd.Series:
    return pd.Series(values, index=pd.to_datetime(seconds, unit="s", utc=True), dtype=float)


def test_irregular_and_duplicate_timestamps_are_binned_by_mean() -> None:
    s = _series([T0 + 70, T0 + 10, T0 + 10, T0 + 130, T0 + 65], [4.0, 1.0, 3.0, 8.0, 6.0])
    out = clean_series(s, 60)
    assert list(out.index) == list(pd.to_datetime([T0, T0 + 60, T0 + 120], unit="s", utc=True))
    assert out.to_numpy() == pytest.approx([2.0, 5.0, 8.0])


def test_naive_index_is_rejected() -> None:
    s = pd.Series([1.0, 2.0], index=pd.to_datetime([T0, T0 + 60], unit="s"))
    with pytest.raises(ValueError, match="tz-aware"):
        clean_series(s, 60)


def test_negative_and_infinite_values_become_missing() -> None:
    s = _series([T0 + 60 * i for i in range(10)], [5, 5, -3, np.inf, 5, 5, 5, 5, 5, 5])
    out = clean_series(s, 60, max_fill_seconds=0)
    assert np.isnan(out.iloc[2])
    assert np.isnan(out.iloc[3])
    assert out.iloc[4] == 5


def test_short_gaps_are_interpolated_and_long_gaps_stay_missing() -> None:
    values = [float(v) for v in range(30)]
    values[5] = np.nan  # 1 bin: filled
    for i in range(12, 25):  # 13 bins: too long
        values[i] = np.nan
    s = _series([T0 + 60 * i for i in range(30)], values)
    out = clean_series(s, 60, max_fill_seconds=300).to_numpy()
    assert out[5] == pytest.approx(5.0)
    assert np.isnan(out[12:25]).all()
    assert out[25] == 25


def test_zeros_amid_heavy_traffic_are_collection_gaps() -> None:
    # 1000 rps: a 10-minute window with zero requests is impossible as real traffic.
    rate = np.full(50, 1000.0)
    rate[20:24] = 0.0
    masked = mask_collection_gaps(rate, 600)
    assert np.isnan(masked[20:24]).all()
    assert (masked[:20] == 1000).all()


def test_zeros_in_a_quiet_series_are_real() -> None:
    # 0.02 rps at 60 s: about one request a minute, so empty minutes are expected.
    rate = np.where(np.arange(60) % 3 == 0, 0.0, 0.02)
    masked = mask_collection_gaps(rate, 60)
    assert (masked == rate).all()


def test_zeros_between_bursts_are_the_quiet_between_them() -> None:
    # Bulk orders: a heavy minute now and then, empty minutes between (a wholesale shop).
    rate = np.zeros(300)
    rate[::7] = 50.0
    masked = mask_collection_gaps(rate, 60)
    assert (masked == rate).all()
    # The same level, steady: an empty minute in it is a gap, beside the bursty part or not.
    steady = np.concatenate([rate, np.full(100, 50.0)])
    steady[350] = 0.0
    masked = mask_collection_gaps(steady, 60)
    assert np.isnan(masked[350])
    assert (masked[:300] == rate).all()


def test_zero_gap_run_longer_than_the_window_is_still_masked() -> None:
    rate = np.full(200, 500.0)
    rate[50:120] = 0.0
    assert np.isnan(mask_collection_gaps(rate, 60)[50:120]).all()


def test_counter_reset_counts_post_reset_value() -> None:
    s = _series([T0, T0 + 10, T0 + 20, T0 + 30], [100.0, 150.0, 20.0, 70.0])
    rate = counter_to_rate(s)
    assert rate.to_numpy() == pytest.approx([5.0, 2.0, 5.0])
    assert (rate >= 0).all()


def test_before_excludes_later_samples_and_the_partial_bin() -> None:
    s = _series([T0 + 60 * i for i in range(10)], [1.0] * 5 + [1000.0] * 5)
    out = clean_series(s, 60, before=T0 + 5 * 60 + 30)
    assert len(out) == 5  # bins 0..4 have ended; bin 5 is only half observed
    assert (out == 1.0).all()


def test_coarse_samples_hold_over_their_interval_and_never_leak() -> None:
    # 10-minute samples labelled by interval start; the one starting at +600 ends at +1200.
    s = _series([T0, T0 + 600, T0 + 1200], [10.0, 20.0, 30.0])
    out = clean_series(s, 60, before=T0 + 900)
    assert len(out) == 10
    assert (out == 10.0).all()
    assert (clean_series(s, 60).to_numpy() == np.repeat([10.0, 20.0, 30.0], 10)).all()
