"""Trace loaders: each format, time scaling, resampling, token mixes and clear errors."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from prescaler.backtest.traces import (
    SERVEGEN_EPOCH,
    TRACE_FORMATS,
    Trace,
    TraceError,
    load_token_mix,
    load_trace,
    with_token_mix,
)

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
AZURE_CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
SERVEGEN = TRACES / "servegen_m_small" / "language__m-small_aggregate_rate_10min.csv"
SERVEGEN_IN_PDF = TRACES / "servegen_m_small" / "language__m-small_input_tokens_pdf.csv.gz"
NAB = TRACES / "nab_nyc_taxi" / "nyc_taxi.csv"

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")


def _head(src: Path, dst: Path, lines: int) -> Path:
    """Cut the first ``lines`` lines (header included) of a real trace."""
    with src.open() as fh:
        dst.write_text("".join(itertools.islice(fh, lines)))
    return dst


# --------------------------------------------------------------------------- real pieces


@needs_traces
def test_azure_piece_bins_requests_per_minute(tmp_path: Path) -> None:
    piece = _head(AZURE_CODE, tmp_path / "azure.csv", 401)
    raw = pd.read_csv(piece)
    trace = load_trace(piece, "azure")
    assert trace.step_seconds == 60
    # Bins start on a whole minute and every request lands in exactly one bin.
    first = pd.Timestamp(raw.TIMESTAMP.iloc[0], tz="UTC")
    assert trace.start == first.floor("min").timestamp()
    assert np.nansum(trace.rps * 60) == pytest.approx(400)
    assert trace.prompt_tokens is not None
    assert trace.output_tokens is not None
    total_prompt = np.nansum(trace.prompt_tokens * trace.rps * 60)
    assert total_prompt == pytest.approx(raw.ContextTokens.sum())
    assert trace.context_p95 is not None
    assert trace.context_p95 == pytest.approx(
        np.quantile(raw.ContextTokens + raw.GeneratedTokens, 0.95), rel=0.05
    )


@needs_traces
def test_servegen_piece_anchors_epoch_and_masks_gaps(tmp_path: Path) -> None:
    raw = pd.read_csv(SERVEGEN)
    gap = int(np.flatnonzero(raw.rate_rps.to_numpy() == 0)[0])
    lo = gap - 3
    piece = tmp_path / "sg.csv"
    raw.iloc[lo : gap + 3].to_csv(piece, index=False)
    trace = load_trace(piece, "servegen")
    assert trace.step_seconds == 600
    assert trace.start == SERVEGEN_EPOCH + raw.t_sec.iloc[lo]
    assert np.isnan(trace.rps[3])
    assert np.isfinite(trace.rps[:3]).all()
    assert trace.rps[0] == pytest.approx(raw.rate_rps.iloc[lo])
    assert trace.prompt_tokens is None
    series = trace.rate_series()
    assert str(series.index.tz) == "UTC"
    assert series.index[0] == pd.Timestamp(SERVEGEN_EPOCH + raw.t_sec.iloc[lo], unit="s", tz="UTC")


@needs_traces
def test_servegen_full_has_the_documented_gaps() -> None:
    trace = load_trace(SERVEGEN, "servegen")
    assert len(trace) == 2016
    assert int(np.isnan(trace.rps).sum()) == 37
    assert pd.Timestamp(trace.start, unit="s").day_name() == "Monday"


@needs_traces
def test_nab_piece_is_count_per_interval_on_wall_clock(tmp_path: Path) -> None:
    piece = _head(NAB, tmp_path / "nab.csv", 49)
    trace = load_trace(piece, "nab")
    assert trace.step_seconds == 1800
    assert trace.start == pd.Timestamp("2014-07-01 00:00", tz="UTC").timestamp()
    assert trace.rps[0] == pytest.approx(10844 / 1800)
    # Midnight NYC wall clock stays at hour 0 of the series.
    assert trace.rate_series().index[2].hour == 1


# --------------------------------------------------------------------------- hand-made files


def test_requests_and_rate_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    t = np.sort(1_700_000_000 + rng.uniform(0, 600, size=300))
    p = rng.integers(1, 500, size=300)
    o = rng.integers(1, 100, size=300)
    pd.DataFrame({"timestamp": t, "prompt_tokens": p, "output_tokens": o}).to_csv(
        tmp_path / "req.csv", index=False
    )
    trace = load_trace(tmp_path / "req.csv", "requests", step_seconds=60)
    counts = np.bincount(((t - trace.start) // 60).astype(int))
    np.testing.assert_allclose(trace.rps, counts / 60)
    # Write the binned trace out as a `rate` file and read it back: identical.
    series = trace.rate_series()
    pd.DataFrame(
        {
            "timestamp": series.index.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "requests_per_second": series.to_numpy(),
        }
    ).to_csv(tmp_path / "rate.csv", index=False)
    back = load_trace(tmp_path / "rate.csv", "rate")
    assert back.start == trace.start
    assert back.step_seconds == 60
    np.testing.assert_allclose(back.rps, trace.rps)
    # And as unix seconds.
    pd.DataFrame({"timestamp": trace.times(), "requests_per_second": trace.rps}).to_csv(
        tmp_path / "rate2.csv", index=False
    )
    np.testing.assert_allclose(load_trace(tmp_path / "rate2.csv", "rate").rps, trace.rps)


def test_requests_iso_with_zone(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text(
        "timestamp,prompt_tokens,output_tokens\n"
        "2024-03-01T10:00:05+01:00,100,10\n"
        "2024-03-01T10:00:05+01:00,300,30\n"
        "2024-03-01T10:01:30+01:00,200,20\n"
    )
    trace = load_trace(tmp_path / "r.csv", "requests")
    assert trace.start == pd.Timestamp("2024-03-01T09:00:00Z").timestamp()
    np.testing.assert_allclose(trace.rps, [2 / 60, 1 / 60])
    assert trace.prompt_tokens is not None
    np.testing.assert_allclose(trace.prompt_tokens, [200, 200])


def test_rate_gaps_become_nan(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("timestamp,requests_per_second\n0,1\n60,2\n180,4\n")
    trace = load_trace(tmp_path / "r.csv", "rate")
    assert trace.step_seconds == 60
    np.testing.assert_allclose(trace.rps, [1, 2, np.nan, 4])


def test_time_scale_stretches_time_and_keeps_levels(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("timestamp,requests_per_second\n1000,1\n1060,2\n1120,4\n")
    trace = load_trace(tmp_path / "r.csv", "rate", time_scale=10)
    assert trace.start == 1000
    assert trace.step_seconds == 600
    np.testing.assert_allclose(trace.rps, [1, 2, 4])
    rows = "".join(f"{t},10,1\n" for t in np.arange(0, 60, 0.5))  # 2 req/s for a minute
    (tmp_path / "q.csv").write_text("timestamp,prompt_tokens,output_tokens\n" + rows)
    fast = load_trace(tmp_path / "q.csv", "requests", step_seconds=6, time_scale=0.1)
    assert len(fast) == 1
    np.testing.assert_allclose(fast.rps, [2.0])


def test_resample_finer_holds_and_coarser_averages() -> None:
    trace = Trace(start=0.0, step_seconds=600.0, rps=np.array([1.0, np.nan, 3.0]))
    fine = trace.resample(60)
    assert len(fine) == 30
    np.testing.assert_allclose(fine.rps[:10], 1.0)
    assert np.isnan(fine.rps[10:20]).all()
    coarse = trace.resample(1800)
    np.testing.assert_allclose(coarse.rps, [2.0])  # NaN part left out of the mean


def test_resample_token_means_are_request_weighted() -> None:
    trace = Trace(
        start=0.0,
        step_seconds=60.0,
        rps=np.array([1.0, 3.0]),
        prompt_tokens=np.array([100.0, 200.0]),
        output_tokens=np.array([10.0, np.nan]),
    )
    two = trace.resample(120)
    assert two.prompt_tokens is not None
    assert two.output_tokens is not None
    np.testing.assert_allclose(two.rps, [2.0])
    np.testing.assert_allclose(two.prompt_tokens, [(100 + 600) / 4])
    np.testing.assert_allclose(two.output_tokens, [10.0])


def test_tokens_per_request_defaults() -> None:
    trace = Trace(start=0.0, step_seconds=60.0, rps=np.array([1.0, 0.0]))
    with pytest.raises(TraceError, match="prompt-tokens"):
        trace.tokens_per_request()
    p, o = trace.tokens_per_request(100, 20)
    np.testing.assert_allclose(p, [100, 100])
    np.testing.assert_allclose(o, [20, 20])


def test_token_mix_from_requests_and_pdfs(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("timestamp,prompt_tokens,output_tokens\n0,100,10\n1,300,30\n")
    mix = load_token_mix(tmp_path / "r.csv")
    assert mix.paired
    assert mix.mean_prompt == 200
    assert mix.mean_output == 20
    for kind, rows in (("input", "10,0.5\n30,0.5\n"), ("output", "1,1\n")):
        with gzip.open(tmp_path / f"m_{kind}_tokens_pdf.csv.gz", "wt") as fh:
            fh.write("tokens,weight\n" + rows)
    pdf = load_token_mix(tmp_path / "m_input_tokens_pdf.csv.gz")
    assert not pdf.paired
    assert pdf.mean_prompt == 20
    assert pdf.mean_output == 1
    trace = Trace(start=0.0, step_seconds=60.0, rps=np.array([100.0, 0.0, np.nan]))
    mixed = with_token_mix(trace, pdf, seed=3)
    assert mixed.prompt_tokens is not None
    assert mixed.output_tokens is not None
    assert 10 <= mixed.prompt_tokens[0] <= 30
    assert mixed.prompt_tokens[0] == pytest.approx(20, abs=1.5)  # mean of 2000 draws
    np.testing.assert_allclose(mixed.output_tokens, 1.0)
    assert mixed.prompt_tokens[1] == 20  # empty bin: the mix's mean
    again = with_token_mix(trace, pdf, seed=3)
    assert again.prompt_tokens is not None
    np.testing.assert_array_equal(again.prompt_tokens, mixed.prompt_tokens)


@needs_traces
def test_servegen_pdf_token_mix_matches_readme() -> None:
    mix = load_token_mix(SERVEGEN_IN_PDF)
    assert mix.mean_prompt == pytest.approx(119.7, rel=0.01)
    assert 400 < mix.context_quantile(0.95) < 800


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("fmt", "content", "match"),
    [
        ("rate", "", "empty file"),
        ("rate", "timestamp,requests_per_second\n", "empty file"),
        ("requests", "timestamp,prompt_tokens,output_tokens\n", "empty file"),
        ("rate", "timestamp,rps\n0,1\n", "missing column.*requests_per_second"),
        ("azure", "timestamp,prompt_tokens,output_tokens\n0,1,1\n", "not a 'azure' trace"),
        ("rate", "timestamp,requests_per_second\n60,1\n0,2\n", "not sorted"),
        ("rate", "timestamp,requests_per_second\n0,1\n0,2\n60,3\n", "duplicate timestamp"),
        ("requests", "timestamp,prompt_tokens,output_tokens\n5,1,1\n2,1,1\n", "not sorted"),
        ("rate", "timestamp,requests_per_second\n0,1\n60,x\n", "not a number"),
        ("rate", "timestamp,requests_per_second\n0,1\n60,-1\n", "negative"),
        ("rate", "timestamp,requests_per_second\nyesterday,1\n", "cannot parse timestamp"),
        ("rate", "timestamp,requests_per_second\n0,1\n60,1\n100,1\n", "regular"),
        ("servegen", "t_sec,rate_rps\n0,1\n0,1\n", "duplicate"),
    ],
)
def test_clear_errors(tmp_path: Path, fmt: str, content: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=match) as info:
        load_trace(path, fmt)
    assert "\n" not in str(info.value)


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        load_trace(tmp_path / "x.csv", "parquet")
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "x.csv", "rate")
    with pytest.raises(TraceError, match="time scale"):
        load_trace(tmp_path / "x.csv", "rate", time_scale=0)


def test_requests_allow_simultaneous_arrivals(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("timestamp,prompt_tokens,output_tokens\n0,1,1\n0,1,1\n")
    assert load_trace(tmp_path / "r.csv", "requests").rps[0] == pytest.approx(2 / 60)


def test_formats_constant() -> None:
    assert TRACE_FORMATS == ("azure", "servegen", "nab", "requests", "rate")
