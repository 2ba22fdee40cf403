"""Load real traffic traces into one regular request-rate series.

Pure code (numpy and pandas only): the backtest, the ``forecast`` command and tests share it.

Formats (``TRACE_FORMATS``):

``azure``
    Azure LLM inference trace 2023, one row per request: ``TIMESTAMP,ContextTokens,
    GeneratedTokens``. ``TIMESTAMP`` is a datetime string with sub-second precision and no
    zone; it is read as UTC. Requests are counted into bins (default 60 s).
``requests``
    One row per request: ``timestamp,prompt_tokens,output_tokens``. Timestamps are unix
    seconds or ISO-8601 (naive ones are read as UTC). Binned like ``azure``.
``servegen``
    ServeGen aggregate rate: ``t_sec,rate_rps,...`` in 10-minute windows. ``t_sec`` counts
    seconds from a local midnight of unknown weekday; it is anchored at ``SERVEGEN_EPOCH``
    (Monday 2024-01-01 00:00 UTC), so the daily cycle lines up with UTC days. Windows where
    the rate is 0 (every client 0, a collection gap) become NaN: missing, not zero traffic.
``nab``
    Numenta Anomaly Benchmark ``timestamp,value`` (NYC taxi: passengers per 30 minutes).
    The timestamps are naive New York wall-clock times on a regular 30-minute grid. They
    are kept as wall-clock times and labelled UTC: daily and weekly cycles stay on local
    hours and the grid stays regular (DST shifts are ignored, as the file itself does).
    ``value`` is a count per row interval, so the rate is ``value / interval``.
``rate``
    ``timestamp,requests_per_second`` on a regular grid (unix seconds or ISO-8601).

``time_scale`` stretches the time axis by that factor around the first timestamp (``10``
plays a 1-hour trace over 10 hours, ``0.1`` over 6 minutes). Request *rates* keep their
values: the curve is stretched horizontally, so levels (and the fleet they need) are
unchanged while ramps become slower or faster.

Per-request formats are read in chunks, so memory grows with the number of bins, not rows.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

__all__ = [
    "SERVEGEN_EPOCH",
    "TRACE_FORMATS",
    "TokenMix",
    "Trace",
    "TraceError",
    "load_token_mix",
    "load_trace",
    "with_token_mix",
]

TRACE_FORMATS = ("azure", "servegen", "nab", "requests", "rate")

#: Unix time given to ServeGen's t=0 (a local midnight of unknown weekday): 2024-01-01T00:00Z.
SERVEGEN_EPOCH = 1_704_067_200.0

#: Default bin width for per-request formats (seconds).
DEFAULT_REQUEST_STEP_SECONDS = 60.0

_CHUNK_ROWS = 500_000

#: Most bins a loaded trace may have (a year at 3-second bins): a file whose timestamps span
#: more is refused, so a typo such as a millisecond timestamp cannot exhaust memory.
MAX_BINS = 10_000_000

FloatArray = np.ndarray


class TraceError(ValueError):
    """A trace file that cannot be read; the message is one line, meant for the user."""


@dataclass(frozen=True)
class Trace:
    """A regular request-rate series, bins ``[start + i*step, start + (i+1)*step)``."""

    start: float
    """Unix seconds of the first bin's start."""
    step_seconds: float
    """Bin width in (scaled) seconds."""
    rps: FloatArray
    """Requests per second in each bin; NaN marks a collection gap or missing bin."""
    prompt_tokens: FloatArray | None = None
    """Mean prompt tokens per request in each bin (NaN where a bin has no requests);
    ``None`` when the format has no token columns."""
    output_tokens: FloatArray | None = None
    """Mean output tokens per request in each bin, like ``prompt_tokens``."""
    context_p95: float | None = None
    """p95 of prompt+output tokens per request over the whole trace, when known."""
    name: str = field(default="", compare=False)
    """Where the trace came from (file name), for reports."""

    def __post_init__(self) -> None:
        if not self.step_seconds > 0:
            raise TraceError(f"step must be > 0 seconds, got {self.step_seconds}")
        n = len(self.rps)
        for label, arr in (
            ("prompt_tokens", self.prompt_tokens),
            ("output_tokens", self.output_tokens),
        ):
            if arr is not None and len(arr) != n:
                raise TraceError(f"{label} has {len(arr)} bins, rps has {n}")

    def __len__(self) -> int:
        return len(self.rps)

    @property
    def end(self) -> float:
        """Unix seconds of the end of the last bin."""
        return self.start + len(self.rps) * self.step_seconds

    @property
    def has_tokens(self) -> bool:
        return self.prompt_tokens is not None and self.output_tokens is not None

    def times(self) -> FloatArray:
        """Bin starts, unix seconds."""
        return self.start + np.arange(len(self.rps), dtype=float) * self.step_seconds

    def rate_series(self) -> pd.Series:
        """Requests/s indexed by bin start (tz-aware UTC), NaN for gaps."""
        index = pd.to_datetime(self.times(), unit="s", utc=True)
        return pd.Series(np.asarray(self.rps, dtype=float), index=index, name="requests_per_second")

    def tokens_per_request(
        self, prompt_tokens: float | None = None, output_tokens: float | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """Per-bin mean prompt and output tokens per request.

        Bins without token data (no requests in the bin, or a format without token columns)
        take the given defaults, else the trace's request-weighted mean.
        """
        n = len(self.rps)
        result: list[FloatArray] = []
        for arr, default, label in (
            (self.prompt_tokens, prompt_tokens, "prompt"),
            (self.output_tokens, output_tokens, "output"),
        ):
            if arr is None:
                if default is None:
                    raise TraceError(
                        f"the trace has no {label} token lengths: give --{label}-tokens "
                        "or a token mix"
                    )
                result.append(np.full(n, float(default)))
                continue
            values = np.asarray(arr, dtype=float).copy()
            missing = ~np.isfinite(values)
            if missing.any():
                fill = default if default is not None else self._weighted_mean(arr)
                values[missing] = fill
            result.append(values)
        return result[0], result[1]

    def _weighted_mean(self, arr: FloatArray) -> float:
        weights = np.nan_to_num(np.asarray(self.rps, dtype=float))
        ok = np.isfinite(arr) & (weights > 0)
        if not ok.any():
            return 0.0
        return float(np.average(arr[ok], weights=weights[ok]))

    def resample(self, step_seconds: float) -> Trace:
        """The same trace on another bin width (time-weighted means; NaN parts ignored)."""
        if math.isclose(step_seconds, self.step_seconds):
            return self
        if not len(self.rps) * self.step_seconds / step_seconds < MAX_BINS:
            raise TraceError(
                f"resampling to {step_seconds:g} s would make more than {MAX_BINS:,} bins"
            )
        edges = self.start + np.arange(0.0, len(self.rps) * self.step_seconds + 1e-9, step_seconds)
        if edges[-1] < self.end - 1e-9:
            edges = np.append(edges, edges[-1] + step_seconds)
        rps, valid = _resample_rate(self.rps, self.start, self.step_seconds, edges)
        weights = np.nan_to_num(np.asarray(self.rps, dtype=float))

        def tokens(arr: FloatArray | None) -> FloatArray | None:
            if arr is None:
                return None
            # Request-weighted mean per new bin: resample (rate × length) / rate.
            product = np.where(np.isfinite(arr), arr, 0.0) * weights
            num, _ = _resample_rate(product, self.start, self.step_seconds, edges)
            den, _ = _resample_rate(
                np.where(np.isfinite(arr), weights, 0.0), self.start, self.step_seconds, edges
            )
            with np.errstate(invalid="ignore", divide="ignore"):
                out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
            return np.asarray(out, dtype=float)

        rps = np.where(valid, rps, np.nan)
        return replace(
            self,
            step_seconds=float(step_seconds),
            rps=rps,
            prompt_tokens=tokens(self.prompt_tokens),
            output_tokens=tokens(self.output_tokens),
        )

    def window(self, start: float, end: float) -> Trace:
        """The bins whose start lies in ``[start, end)`` (unix seconds)."""
        times = self.times()
        mask = (times >= start) & (times < end)
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            raise TraceError("the requested window holds no bins of the trace")
        sl = slice(int(idx[0]), int(idx[-1]) + 1)
        return replace(
            self,
            start=float(times[sl.start]),
            rps=self.rps[sl],
            prompt_tokens=None if self.prompt_tokens is None else self.prompt_tokens[sl],
            output_tokens=None if self.output_tokens is None else self.output_tokens[sl],
        )


def _resample_rate(
    values: FloatArray, start: float, step: float, edges: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Time-weighted mean of a piecewise-constant series over new bins ``edges[i]..[i+1]``.

    NaN parts are left out of the mean; a new bin that is entirely NaN is flagged invalid.
    """
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values)
    old_edges = start + np.arange(len(values) + 1, dtype=float) * step
    cum_value = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0) * step)])
    cum_valid = np.concatenate([[0.0], np.cumsum(finite * step)])
    v = np.interp(edges, old_edges, cum_value)
    w = np.interp(edges, old_edges, cum_valid)
    dv = np.diff(v)
    dw = np.diff(w)
    valid = dw > 1e-9 * step
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(valid, dv / np.where(valid, dw, 1.0), np.nan)
    return np.asarray(out, dtype=float), valid


# --------------------------------------------------------------------------- reading


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _check_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    if p.is_dir():
        raise TraceError(f"{p}: is a directory, expected a CSV file")
    return p


def _header(path: Path) -> list[str]:
    with _open_text(path) as fh:
        line = fh.readline()
    if not line.strip():
        raise TraceError(f"{path}: empty file")
    return [c.strip().lstrip("\ufeff") for c in line.strip().split(",")]


def _require(path: Path, header: list[str], columns: tuple[str, ...], fmt: str) -> None:
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(
            f"{path}: not a {fmt!r} trace: missing column(s) {', '.join(missing)} "
            f"(found {', '.join(header) or 'none'})"
        )


def _chunks(path: Path, columns: tuple[str, ...]) -> Iterator[pd.DataFrame]:
    try:
        reader = pd.read_csv(
            path,
            usecols=list(columns),
            chunksize=_CHUNK_ROWS,
            dtype=str,
            skipinitialspace=True,
        )
        yield from reader
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty file") from None
    except pd.errors.ParserError as exc:
        raise TraceError(f"{path}: cannot parse CSV: {str(exc).splitlines()[0]}") from None


LATEST_UNIX_SECONDS = 253_402_300_799.0
"""9999-12-31T23:59:59Z: a later timestamp is garbage (and would overflow the bins)."""


def _parse_times(values: pd.Series, path: Path, column: str) -> FloatArray:
    """Unix seconds from unix-second numbers or datetime strings (naive = UTC); a time
    before 1970 or after 9999 is an error."""
    seconds = _unix_seconds(values, path, column)
    if (seconds < 0).any():
        bad = values.astype(str).str.strip()[seconds < 0].iloc[0]
        raise TraceError(f"{path}: column {column}: a timestamp before 1970: {bad!r}")
    if (seconds > LATEST_UNIX_SECONDS).any():
        bad = values.astype(str).str.strip()[seconds > LATEST_UNIX_SECONDS].iloc[0]
        raise TraceError(f"{path}: column {column}: a timestamp after 9999: {bad!r}")
    return seconds


def _unix_seconds(values: pd.Series, path: Path, column: str) -> FloatArray:
    text = values.astype(str).str.strip()
    numeric = pd.to_numeric(text, errors="coerce")
    if numeric.notna().all():
        seconds = numeric.to_numpy(dtype=float)
        if not np.isfinite(seconds).all():
            bad = text[~np.isfinite(seconds)].iloc[0]
            raise TraceError(f"{path}: column {column}: not a finite timestamp: {bad!r}")
        return seconds
    try:
        parsed = pd.to_datetime(text, format="ISO8601", utc=True)
    except (ValueError, TypeError):
        try:
            parsed = pd.to_datetime(text, format="mixed", utc=True)
        except (ValueError, TypeError):
            bad = text[numeric.isna()].iloc[0]
            raise TraceError(
                f"{path}: column {column}: cannot parse timestamp {bad!r} "
                "(expected unix seconds or ISO-8601)"
            ) from None
    if parsed.isna().any():
        raise TraceError(f"{path}: column {column}: empty timestamp")
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype("int64")
    return ns.astype(float) / 1e9


def _parse_numbers(
    values: pd.Series, path: Path, column: str, *, allow_nan: bool = False
) -> FloatArray:
    numbers = pd.to_numeric(values.astype(str).str.strip(), errors="coerce")
    bad = numbers.isna() & ~(allow_nan & values.isna())
    if bad.any():
        raise TraceError(f"{path}: column {column}: not a number: {values[bad].iloc[0]!r}")
    arr = numbers.to_numpy(dtype=float)
    if np.isinf(arr).any():
        bad = values[np.isinf(arr)].iloc[0]
        raise TraceError(f"{path}: column {column}: not a finite number: {bad!r}")
    if (arr[np.isfinite(arr)] < 0).any():
        raise TraceError(f"{path}: column {column}: negative value")
    return arr


#: Longest plausible request, in tokens: a bigger count is a broken file, not a request.
MAX_TOKENS = 2**31
#: Highest plausible rate, requests/s: a bigger one is a broken file (and would overflow).
MAX_RATE = 1e12


def _parse_tokens(values: pd.Series, path: Path, column: str) -> FloatArray:
    arr = _parse_numbers(values, path, column)
    if (arr > MAX_TOKENS).any():
        raise TraceError(f"{path}: column {column}: more than {MAX_TOKENS:,} tokens in a request")
    return arr


def _check_span(path: Path, first: float, last: float, step: float) -> None:
    """Refuse a trace whose timestamps span more than :data:`MAX_BINS` bins of ``step``."""
    bins = (last - first) / step
    if not bins < MAX_BINS:
        raise TraceError(
            f"{path}: timestamps span {last - first:.6g} s, more than {MAX_BINS:,} bins of "
            f"{step:g} s (a timestamp in the wrong unit?)"
        )


def _check_order(times: FloatArray, path: Path, *, allow_duplicates: bool, last: float) -> None:
    if times.size == 0:
        return
    diffs = np.diff(np.concatenate([[last], times]))
    if (diffs < 0).any():
        i = int(np.flatnonzero(diffs < 0)[0])
        raise TraceError(
            f"{path}: timestamps are not sorted (row with t={times[i]:.3f} goes back in time)"
        )
    if not allow_duplicates and (diffs == 0).any():
        i = int(np.flatnonzero(diffs == 0)[0])
        raise TraceError(f"{path}: duplicate timestamp t={times[i]:.3f}")


# --------------------------------------------------------------------------- formats


def _load_requests(
    path: Path, columns: tuple[str, str, str], fmt: str, step: float, time_scale: float
) -> Trace:
    """Count one-row-per-request files into bins of ``step`` scaled seconds."""
    header = _header(path)
    _require(path, header, columns, fmt)
    t_col, p_col, o_col = columns
    origin: float | None = None
    last = -math.inf
    raw_step = step / time_scale  # bin width in the file's own time
    counts = np.zeros(0)
    prompt_sum = np.zeros(0)
    output_sum = np.zeros(0)
    context_hist: dict[int, int] = {}
    total = 0
    for chunk in _chunks(path, columns):
        if chunk.empty:
            continue
        t = _parse_times(chunk[t_col], path, t_col)
        p = _parse_tokens(chunk[p_col], path, p_col)
        o = _parse_tokens(chunk[o_col], path, o_col)
        _check_order(t, path, allow_duplicates=True, last=last)
        last = float(t[-1])
        if origin is None:
            # Bins start on whole multiples of the bin width (18:17:03.9 -> 18:17:00).
            origin = math.floor(float(t[0]) / raw_step) * raw_step
        _check_span(path, origin, float(t[-1]), raw_step)
        idx = np.floor((t - origin) / raw_step).astype(np.int64)
        size = int(idx[-1]) + 1
        if size > counts.size:
            grow = size - counts.size
            counts = np.concatenate([counts, np.zeros(grow)])
            prompt_sum = np.concatenate([prompt_sum, np.zeros(grow)])
            output_sum = np.concatenate([output_sum, np.zeros(grow)])
        counts += np.bincount(idx, minlength=counts.size)
        prompt_sum += np.bincount(idx, weights=p, minlength=counts.size)
        output_sum += np.bincount(idx, weights=o, minlength=counts.size)
        # Context lengths are kept as a histogram (rounded tokens) for the p95.
        ctx, n = np.unique(np.rint(p + o).astype(np.int64), return_counts=True)
        for c, k in zip(ctx.tolist(), n.tolist(), strict=True):
            context_hist[c] = context_hist.get(c, 0) + k
        total += len(t)
    if origin is None or total == 0:
        raise TraceError(f"{path}: empty file (no requests)")
    with np.errstate(invalid="ignore", divide="ignore"):
        prompt_mean = np.where(counts > 0, prompt_sum / np.maximum(counts, 1), np.nan)
        output_mean = np.where(counts > 0, output_sum / np.maximum(counts, 1), np.nan)
    keys = np.array(sorted(context_hist))
    cum = np.cumsum([context_hist[k] for k in keys.tolist()])
    p95 = float(keys[int(np.searchsorted(cum, 0.95 * cum[-1]))])
    return Trace(
        start=origin,
        step_seconds=step,
        rps=counts / raw_step,
        prompt_tokens=prompt_mean,
        output_tokens=output_mean,
        context_p95=p95,
        name=path.name,
    )


def _grid(
    times: FloatArray, values: FloatArray, path: Path, step: float | None
) -> tuple[float, FloatArray]:
    """Place a regular (possibly gappy) series on its grid; missing rows become NaN."""
    if times.size == 1:
        if step is None:
            raise TraceError(f"{path}: a single row: cannot infer the step")
        return step, values
    diffs = np.diff(times)
    # The smallest spacing is the step; larger ones are missing rows (gaps).
    native = float(diffs.min()) if step is None else step
    if native <= 0:
        raise TraceError(f"{path}: duplicate timestamp")
    _check_span(path, float(times[0]), float(times[-1]), native)
    pos = (times - times[0]) / native
    idx = np.rint(pos).astype(np.int64)
    if np.abs(pos - idx).max() > 0.01:
        raise TraceError(f"{path}: timestamps are not on a regular {native:g}-second grid")
    grid = np.full(int(idx[-1]) + 1, np.nan)
    grid[idx] = values
    return native, grid


def _load_rate(
    path: Path,
    t_col: str,
    v_col: str,
    fmt: str,
    *,
    epoch: float = 0.0,
    count_per_row: bool = False,
    zero_is_gap: bool = False,
    unix_only: bool = False,
    native_step: float | None = None,
) -> Trace:
    header = _header(path)
    _require(path, header, (t_col, v_col), fmt)
    frames = list(_chunks(path, (t_col, v_col)))
    data = pd.concat(frames) if frames else pd.DataFrame(columns=[t_col, v_col])
    if data.empty:
        raise TraceError(f"{path}: empty file (no rows)")
    if unix_only:
        times = _parse_numbers(data[t_col], path, t_col) + epoch
    else:
        times = _parse_times(data[t_col], path, t_col)
    values = _parse_numbers(data[v_col], path, v_col, allow_nan=True)
    _check_order(times, path, allow_duplicates=False, last=-math.inf)
    step, grid = _grid(times, values, path, native_step if times.size == 1 else None)
    if count_per_row:
        grid = grid / step
    if (grid[np.isfinite(grid)] > MAX_RATE).any():
        raise TraceError(f"{path}: column {v_col}: a rate above {MAX_RATE:g} requests/s")
    if zero_is_gap:
        grid = np.where(grid == 0, np.nan, grid)
    return Trace(start=float(times[0]), step_seconds=step, rps=grid, name=path.name)


def load_trace(
    path: str | Path,
    fmt: str,
    *,
    step_seconds: float | None = None,
    time_scale: float = 1.0,
) -> Trace:
    """Read ``path`` in format ``fmt`` (one of :data:`TRACE_FORMATS`).

    ``step_seconds`` is the bin width of the result in scaled time (default: the file's own
    resolution; 60 s for per-request formats). ``time_scale`` stretches time (see module doc).
    Raises :class:`TraceError` with a one-line message on any problem.
    """
    if fmt not in TRACE_FORMATS:
        raise TraceError(
            f"unknown trace format {fmt!r}; expected one of {', '.join(TRACE_FORMATS)}"
        )
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise TraceError(f"time scale must be > 0, got {time_scale}")
    if step_seconds is not None and not (step_seconds > 0 and math.isfinite(step_seconds)):
        raise TraceError(f"step must be > 0 seconds, got {step_seconds}")
    p = _check_file(path)
    if fmt in ("azure", "requests"):
        cols = (
            ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
            if fmt == "azure"
            else ("timestamp", "prompt_tokens", "output_tokens")
        )
        step = step_seconds if step_seconds is not None else DEFAULT_REQUEST_STEP_SECONDS
        return _load_requests(p, cols, fmt, step, time_scale)
    if fmt == "servegen":
        trace = _load_rate(
            p,
            "t_sec",
            "rate_rps",
            fmt,
            epoch=SERVEGEN_EPOCH,
            zero_is_gap=True,
            unix_only=True,
            native_step=600.0,
        )
    elif fmt == "nab":
        trace = _load_rate(p, "timestamp", "value", fmt, count_per_row=True, native_step=1800.0)
    else:
        trace = _load_rate(p, "timestamp", "requests_per_second", fmt)
    if time_scale != 1.0:
        trace = replace(trace, step_seconds=trace.step_seconds * time_scale)
    if step_seconds is not None:
        trace = trace.resample(step_seconds)
    return trace


# --------------------------------------------------------------------------- token mix


@dataclass(frozen=True)
class TokenMix:
    """A distribution of per-request (prompt, output) token lengths to sample from.

    Either paired samples (from a per-request trace) or two independent weighted pdfs
    (ServeGen releases input and output pdfs separately).
    """

    prompt_values: FloatArray
    prompt_weights: FloatArray
    output_values: FloatArray
    output_weights: FloatArray
    paired: bool
    """True when ``prompt_values[i]`` and ``output_values[i]`` belong to the same request."""

    @property
    def mean_prompt(self) -> float:
        return float(np.average(self.prompt_values, weights=self.prompt_weights))

    @property
    def mean_output(self) -> float:
        return float(np.average(self.output_values, weights=self.output_weights))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
        """``n`` requests' (prompt, output) lengths."""
        pw = self.prompt_weights / self.prompt_weights.sum()
        if self.paired:
            idx = rng.choice(len(self.prompt_values), size=n, p=pw)
            return self.prompt_values[idx], self.output_values[idx]
        ow = self.output_weights / self.output_weights.sum()
        return (
            rng.choice(self.prompt_values, size=n, p=pw),
            rng.choice(self.output_values, size=n, p=ow),
        )

    def context_quantile(self, q: float, *, samples: int = 200_000, seed: int = 0) -> float:
        """Quantile ``q`` of prompt+output tokens per request."""
        if self.paired:
            ctx = self.prompt_values + self.output_values
            order = np.argsort(ctx)
            cum = np.cumsum(self.prompt_weights[order])
            return float(ctx[order][int(np.searchsorted(cum, q * cum[-1]))])
        p, o = self.sample(samples, np.random.default_rng(seed))
        return float(np.quantile(p + o, q))


def _read_pdf(path: Path) -> tuple[FloatArray, FloatArray]:
    header = _header(path)
    _require(path, header, ("tokens", "weight"), "token pdf")
    data = pd.read_csv(path)
    if data.empty:
        raise TraceError(f"{path}: empty file (no rows)")
    values = _parse_tokens(data["tokens"], path, "tokens")
    weights = _parse_numbers(data["weight"], path, "weight")
    if not weights.sum() > 0:
        raise TraceError(f"{path}: weights sum to zero")
    return values, weights


def load_token_mix(path: str | Path) -> TokenMix:
    """A token mix from a per-request trace (``azure`` or ``requests`` columns) or a ServeGen
    ``*input_tokens_pdf*`` file (its ``*output_tokens_pdf*`` sibling is read too)."""
    p = _check_file(path)
    header = _header(p)
    if header[:2] == ["tokens", "weight"]:
        name = p.name
        if "input_tokens_pdf" in name:
            other = p.with_name(name.replace("input_tokens_pdf", "output_tokens_pdf"))
            in_path, out_path = p, other
        elif "output_tokens_pdf" in name:
            other = p.with_name(name.replace("output_tokens_pdf", "input_tokens_pdf"))
            in_path, out_path = other, p
        else:
            raise TraceError(
                f"{p}: a token pdf must be named *input_tokens_pdf* or *output_tokens_pdf*"
            )
        _check_file(other)
        pv, pw = _read_pdf(in_path)
        ov, ow = _read_pdf(out_path)
        return TokenMix(pv, pw, ov, ow, paired=False)
    if "ContextTokens" in header:
        cols = ("ContextTokens", "GeneratedTokens")
    elif "prompt_tokens" in header:
        cols = ("prompt_tokens", "output_tokens")
    else:
        raise TraceError(
            f"{p}: not a token mix: expected ContextTokens,GeneratedTokens or "
            "prompt_tokens,output_tokens or tokens,weight columns"
        )
    _require(p, header, cols, "token mix")
    prompts: list[FloatArray] = []
    outputs: list[FloatArray] = []
    for chunk in _chunks(p, cols):
        prompts.append(_parse_tokens(chunk[cols[0]], p, cols[0]))
        outputs.append(_parse_tokens(chunk[cols[1]], p, cols[1]))
    if not prompts or sum(len(a) for a in prompts) == 0:
        raise TraceError(f"{p}: empty file (no requests)")
    pv = np.concatenate(prompts)
    ov = np.concatenate(outputs)
    ones = np.ones_like(pv)
    return TokenMix(pv, ones, ov, ones.copy(), paired=True)


def with_token_mix(
    trace: Trace, mix: TokenMix, *, seed: int = 0, max_draws_per_bin: int = 2_000
) -> Trace:
    """Give a trace without token columns per-bin mean lengths drawn from ``mix``.

    Each bin draws ``k = min(n, max_draws_per_bin)`` requests, ``n`` being the requests in
    the bin. With ``n <= k`` the bin's mean lengths are the draws' means (small bins are
    noisy, as real ones are); with more requests the draws' deviation from the mix's mean is
    shrunk by ``sqrt(k / n)``, the spread of a mean of ``n`` draws (central limit theorem).
    Seeded: repeatable.
    """
    rng = np.random.default_rng(seed)
    rps = np.nan_to_num(np.asarray(trace.rps, dtype=float))
    requests = np.rint(rps * trace.step_seconds)
    n = np.clip(requests, 0, max_draws_per_bin).astype(np.int64)
    total = int(n.sum())
    prompt = np.full(len(rps), np.nan)
    output = np.full(len(rps), np.nan)
    if total > 0:
        p, o = mix.sample(total, rng)
        ends = np.cumsum(n)
        starts = ends - n
        cp = np.concatenate([[0.0], np.cumsum(p)])
        co = np.concatenate([[0.0], np.cumsum(o)])
        has = n > 0
        shrink = np.sqrt(n[has] / np.maximum(requests[has], 1.0))
        mp, mo = mix.mean_prompt, mix.mean_output
        prompt[has] = mp + ((cp[ends[has]] - cp[starts[has]]) / n[has] - mp) * shrink
        output[has] = mo + ((co[ends[has]] - co[starts[has]]) / n[has] - mo) * shrink
    empty = ~np.isfinite(prompt)
    prompt[empty] = mix.mean_prompt
    output[empty] = mix.mean_output
    return replace(
        trace,
        prompt_tokens=prompt,
        output_tokens=output,
        context_p95=mix.context_quantile(0.95),
    )
