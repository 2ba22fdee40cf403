"""Fuzz: every trace format, fed malformed files, loads clean data or raises TraceError.

Files are generated per format: the right header or a broken one, then rows whose cells
are numbers, NaN, Inf, negatives, huge values, ISO-8601 and unix timestamps, garbage and
empty strings, in order or not, with ragged rows. ``load_trace`` (and ``load_token_mix`` on
the per-request formats) must either return a trace whose rates are finite and >= 0 where
known (NaN marks a gap: missing, never zero and never Inf) or raise :class:`TraceError`
with a one-line message. Nothing else may escape, and a file's size bounds the memory.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prescaler.backtest.traces import TRACE_FORMATS, TraceError, load_token_mix, load_trace

EXAMPLES = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "requests": "timestamp,prompt_tokens,output_tokens",
    "servegen": "t_sec,rate_rps,cv",
    "nab": "timestamp,value",
    "rate": "timestamp,requests_per_second",
}
numbers = st.one_of(
    st.integers(min_value=-5, max_value=10_000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "+Inf", "1e400", "-0", "-1", "1e308", "0"]),
)
garbage = st.one_of(
    st.sampled_from(["", " ", "abc", "1,5", '"', "\ufeff", "None", "null", "0x10", "1_000"]),
    st.text(max_size=5),
)
times = st.one_of(
    st.integers(min_value=0, max_value=4_000_000_000).map(str),
    st.sampled_from(["0", "-1", "1e12", "1e300", "inf", "nan", "1750000000.5"]),
    st.datetimes().map(lambda d: d.isoformat()),
    st.sampled_from(["2023-11-16 18:15:46.6805900", "2026-02-30T00:00:00", "9999-12-31T23:59:59"]),
)
cells = st.one_of(numbers, garbage)


@st.composite
def trace_files(draw: st.DrawFn) -> tuple[str, str]:
    fmt = draw(st.sampled_from(TRACE_FORMATS))
    header = draw(
        st.one_of(st.just(HEADERS[fmt]), st.sampled_from(list(HEADERS.values())), garbage)
    )
    width = len(HEADERS[fmt].split(","))
    regular = draw(st.booleans())
    rows = []
    n = draw(st.integers(min_value=0, max_value=8))
    start = draw(st.integers(min_value=0, max_value=2_000_000_000))
    step = draw(st.sampled_from([1, 60, 600, 1800, 7]))
    for i in range(n):
        if regular:  # mostly valid rows, on a grid: the search reaches the arithmetic
            t = str(start + i * step) if fmt != "servegen" else str(i * 600)
            row = [t, *[draw(numbers) for _ in range(width - 1)]]
        else:
            row = [draw(st.one_of(times, cells)), *[draw(cells) for _ in range(width - 1)]]
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            row = row[: draw(st.integers(min_value=0, max_value=width + 1))]  # ragged
        rows.append(",".join(row))
    return fmt, "\n".join([header, *rows]) + draw(st.sampled_from(["\n", "", "\n\n"]))


def _clean(values: np.ndarray | float | None) -> bool:
    """Known values are finite and >= 0 (NaN marks a gap: missing, neither zero nor Inf)."""
    if values is None:
        return True
    arr = np.asarray(values, dtype=float)
    known = arr[~np.isnan(arr)]
    return bool(np.isfinite(known).all() and (known >= 0).all())


def _one_line(exc: TraceError) -> str:
    message = str(exc)
    return message if message and "\n" not in message else f"not one line: {message!r}"


@EXAMPLES
@example(("rate", "timestamp,requests_per_second\n0,1\n60,inf\n"), None, 1.0)
@example(("rate", "timestamp,requests_per_second\n0,1\n1e12,1\n"), None, 1.0)
@example(("requests", "timestamp,prompt_tokens,output_tokens\n0,1,inf\n"), None, 1.0)
@example(("requests", "timestamp,prompt_tokens,output_tokens\n0,1,1\n1e15,1,1\n"), None, 1.0)
@example(("requests", "timestamp,prompt_tokens,output_tokens\ninf,1,1\n"), None, 1.0)
@example(("nab", "timestamp,value\n2014-07-01 00:00:00,5\n2014-07-01 00:30:00,-inf\n"), None, 1.0)
@example(("servegen", "t_sec,rate_rps,cv\n0,1e308\n600,1e308\n"), None, 1.0)
@example(("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,0,1e308\n"), None, 1.0)
@example(("nab", "timestamp,value\n0,1e308\n"), 60.0, 10.0)
@example(("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n1e308,0,0\n"), 1.0, 10.0)
@given(trace_files(), st.sampled_from([None, 60.0, 1.0]), st.sampled_from([1.0, 0.1, 10.0]))
def test_any_trace_file_loads_clean_or_raises_trace_error(
    file: tuple[str, str], step: float | None, time_scale: float
) -> None:
    fmt, text = file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"trace.{fmt}.csv"
        path.write_text(text, encoding="utf-8")
        try:
            trace = load_trace(path, fmt, step_seconds=step, time_scale=time_scale)
        except TraceError as exc:
            errors = [_one_line(exc)]
            trace = None
        else:
            errors = []
        if fmt in ("azure", "requests"):
            try:
                mix = load_token_mix(path)
            except TraceError as exc:
                errors.append(_one_line(exc))
            else:
                assert _clean(mix.mean_prompt)
                assert _clean(mix.mean_output)
    assert not [e for e in errors if e.startswith("not one line")], errors
    if trace is not None:
        assert _clean(trace.start)
        assert trace.step_seconds > 0
        assert math.isfinite(trace.step_seconds)
        assert len(trace) >= 1
        assert _clean(trace.rps), trace.rps
        assert _clean(trace.prompt_tokens)
        assert _clean(trace.output_tokens)
        assert _clean(trace.context_p95)


@pytest.mark.parametrize(
    "text",
    [
        "TIMESTAMP,ContextTokens,GeneratedTokens\n1969-01-01T00:00:00,0,0\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n-60,1,1\n0,1,1\n",
    ],
)
def test_a_timestamp_before_1970_is_a_trace_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(TraceError, match="before 1970"):
            load_trace(path, "azure")
