"""A local Prometheus (Debian's package) with history backfilled by promtool.

History is written as OpenMetrics text and turned into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics --max-block-duration=24h``; Prometheus
only reads blocks at start, so ``backfill`` restarts the server (about a second).

The traps this module handles for its callers:

* OpenMetrics timestamps are in **seconds** (floats), not milliseconds.
* promtool silently drops a sample older than the previous one of the same series, so
  samples are grouped by series and sorted by time before writing.
* Retention is counted back from the newest block, so history far in the past would be
  deleted at start; the server runs with a 10-year retention.
* A range query is capped at 11,000 points per series; ``query_range`` refuses a larger
  one up front with a clear error instead of Prometheus' 400.

The server keeps Prometheus' query log (``global.query_log_file``): ``instant_queries``
says at which evaluation times a client asked an instant query, so a test can replay
exactly what an operator read, whenever its reconciles ran.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import procs
from .paths import TRACES_DIR, system_binary

MAX_POINTS_PER_SERIES = 11_000
PROMETHEUS_HINT = "run `make prometheus-bin` (apt-get install prometheus)"


@dataclass(frozen=True)
class Sample:
    """One point of one series. ``timestamp_s`` is unix time in seconds."""

    name: str
    labels: Mapping[str, str]
    timestamp_s: float
    value: float


# ------------------------------------------------------------------ OpenMetrics


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def to_openmetrics(samples: Iterable[Sample]) -> str:
    """OpenMetrics text for promtool: families contiguous, each series sorted by time.

    Names ending in ``_total`` are typed as counters, others as gauges.
    """
    by_name: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]]
    by_name = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_name[s.name][tuple(sorted(s.labels.items()))].append((s.timestamp_s, s.value))
    out: list[str] = []
    for name in sorted(by_name):
        if name.endswith("_total"):
            out.append(f"# TYPE {name.removesuffix('_total')} counter")
        else:
            out.append(f"# TYPE {name} gauge")
        for labels, points in sorted(by_name[name].items()):
            lbl = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            prefix = f"{name}{{{lbl}}}" if lbl else name
            last_ts = -math.inf
            for ts, value in sorted(points):
                if ts == last_ts:  # a duplicate timestamp would be dropped anyway
                    continue
                last_ts = ts
                out.append(f"{prefix} {_fmt(value)} {ts:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------- series builders


def counter_from_rate(
    times_s: Sequence[float],
    rate_per_s: Sequence[float],
    *,
    step_s: float = 15.0,
    start_value: float = 0.0,
) -> list[tuple[float, float]]:
    """Sample a counter every ``step_s`` seconds from a piecewise-constant rate.

    ``rate_per_s[i]`` holds from ``times_s[i]`` to ``times_s[i + 1]`` (the last one for
    one more interval of the same length). A NaN rate is a collection gap: no samples are
    emitted there and the counter does not move. ``rate(counter[5m])`` over the result
    gives back the input rate.
    """
    if len(times_s) != len(rate_per_s):
        raise ValueError("times_s and rate_per_s differ in length")
    if not times_s:
        return []
    last_width = times_s[-1] - times_s[-2] if len(times_s) > 1 else step_s
    ends = [*times_s[1:], times_s[-1] + last_width]
    out: list[tuple[float, float]] = []
    value = start_value
    t = float(times_s[0])
    i = 0
    while i < len(times_s):
        seg_end = ends[i]
        rate = rate_per_s[i]
        gap = rate is None or math.isnan(rate)
        while t < seg_end - 1e-9:
            if not gap:
                out.append((t, value))
                value += max(rate, 0.0) * step_s
            t += step_s
        i += 1
    return out


def gauge_from_values(
    times_s: Sequence[float], values: Sequence[float], *, step_s: float = 15.0
) -> list[tuple[float, float]]:
    """Sample a piecewise-constant gauge every ``step_s`` (NaN = gap, no samples)."""
    if not times_s:
        return []
    width = times_s[-1] - times_s[-2] if len(times_s) > 1 else step_s
    ends = [*times_s[1:], times_s[-1] + width]
    out: list[tuple[float, float]] = []
    t = float(times_s[0])
    for seg_end, v in zip(ends, values, strict=True):
        while t < seg_end - 1e-9:
            if not math.isnan(v):
                out.append((t, v))
            t += step_s
    return out


@dataclass(frozen=True)
class VllmProfile:
    """Per-request shape used to derive token counters and concurrency from a rate."""

    prompt_tokens_per_request: float = 600.0
    generation_tokens_per_request: float = 150.0
    mean_latency_s: float = 4.0
    """Little's law: running requests = rate x latency."""


def vllm_samples(
    times_s: Sequence[float],
    rate_rps: Sequence[float],
    *,
    namespace: str,
    model_name: str,
    pods: Sequence[str] = ("vllm-0",),
    step_s: float = 15.0,
    profile: VllmProfile | None = None,
    extra_labels: Mapping[str, str] | None = None,
) -> list[Sample]:
    """vLLM-named series for a fleet serving ``rate_rps`` (split evenly over ``pods``).

    Emits ``vllm:request_success_total``, ``vllm:prompt_tokens_total``,
    ``vllm:generation_tokens_total`` (counters) and ``vllm:num_requests_running``
    (gauge), labelled ``namespace``, ``pod``, ``model_name``. Summing
    ``rate(vllm:request_success_total[5m])`` over pods gives back ``rate_rps``.
    """
    prof = profile or VllmProfile()
    n = len(pods)
    per_pod = [r / n if not math.isnan(r) else math.nan for r in rate_rps]
    out: list[Sample] = []
    for pod in pods:
        labels = {"namespace": namespace, "pod": pod, "model_name": model_name}
        labels.update(extra_labels or {})
        for name, factor in (
            ("vllm:request_success_total", 1.0),
            ("vllm:prompt_tokens_total", prof.prompt_tokens_per_request),
            ("vllm:generation_tokens_total", prof.generation_tokens_per_request),
        ):
            rates = [r * factor for r in per_pod]
            for ts, v in counter_from_rate(times_s, rates, step_s=step_s):
                out.append(Sample(name, labels, ts, v))
        running = [r * prof.mean_latency_s for r in per_pod]
        for ts, v in gauge_from_values(times_s, running, step_s=step_s):
            out.append(Sample("vllm:num_requests_running", labels, ts, v))
    return out


def servegen_rate(
    *, days: float | None = None, end_at_s: float | None = None, scale: float = 1.0
) -> tuple[list[float], list[float]]:
    """The ServeGen 10-minute request rate from ``../shared/traces``, as unix timestamps.

    ``days`` keeps the first N days; ``end_at_s`` shifts the series so that its last
    window ends at that time (default: keep ``t_sec`` as is); ``scale`` multiplies the
    rate. Zero windows (collection gaps) come back as NaN.
    """
    path = TRACES_DIR / "servegen_m_small" / "language__m-small_aggregate_rate_10min.csv"
    times: list[float] = []
    rates: list[float] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            t = float(row["t_sec"])
            if days is not None and t >= days * 86400:
                break
            r = float(row["rate_rps"])
            times.append(t)
            rates.append(r * scale if r > 0 else math.nan)
    if end_at_s is not None and times:
        width = times[1] - times[0] if len(times) > 1 else 600.0
        shift = end_at_s - (times[-1] + width)
        times = [t + shift for t in times]
    return times, rates


# ---------------------------------------------------------------------- server


SCRAPE_JOB = "targets"
"""The scrape job of ``scrape_targets``: scraped series carry ``job`` (this) and
``instance`` (the target); history that a live series continues must carry them too."""


@dataclass
class Prometheus:
    """One Prometheus server with its own TSDB directory, on a free loopback port.

    ``backfill`` adds history (and restarts the server if it runs); ``query`` and
    ``query_range`` return the ``data`` part of Prometheus' JSON answer.
    """

    data_dir: Path
    tie_to_parent: bool = True
    port: int = field(default_factory=procs.free_port)
    proc: procs.Proc | None = None
    scrape_targets: tuple[str, ...] = ()
    """``host:port`` endpoints scraped (``/metrics``, every ``scrape_interval_s``) as job
    ``targets``; none by default (history comes from ``backfill``)."""
    scrape_interval_s: float = 15.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        binary = system_binary("prometheus", PROMETHEUS_HINT)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tsdb = self.data_dir / "tsdb"
        tsdb.mkdir(exist_ok=True)
        config = self.data_dir / "prometheus.yml"
        config.write_text(self._config())
        self.proc = procs.start(
            "prometheus",
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=3650d",
                "--log.level=warn",
            ],
            self.data_dir,
            tie_to_parent=self.tie_to_parent,
        )
        proc = self.proc
        procs.wait_for(
            "prometheus /-/ready",
            lambda: _get_status(f"{self.url}/-/ready") == 200,
            timeout_s,
            [proc],
        )

    @property
    def query_log(self) -> Path:
        """Prometheus' query log: one JSON line per query the server answered."""
        return self.data_dir / "queries.log"

    def instant_queries(self, promql: str) -> list[float]:
        """The evaluation times (unix s, in the order asked) of the instant queries of
        exactly ``promql`` that the server answered, from its query log."""
        times: list[float] = []
        if not self.query_log.exists():
            return times
        for line in self.query_log.read_text().splitlines():
            params = json.loads(line).get("params", {})
            if params.get("query") == promql and params.get("step") == 0:
                end = str(params["end"]).replace("Z", "+00:00")
                times.append(datetime.fromisoformat(end).timestamp())
        return times

    def _config(self) -> str:
        interval = f"{self.scrape_interval_s:g}s"
        head = f"global:\n  scrape_interval: {interval}\n  query_log_file: {self.query_log}\n"
        if not self.scrape_targets:
            return f"{head}scrape_configs: []\n"
        targets = ", ".join(f'"{t}"' for t in self.scrape_targets)
        return (
            head + "scrape_configs:\n"
            f"  - job_name: {SCRAPE_JOB}\n"
            "    honor_labels: true\n"
            f"    static_configs:\n      - targets: [{targets}]\n"
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def backfill(self, series: str | Iterable[Sample]) -> None:
        """Write history (OpenMetrics text or samples) into the TSDB, then (re)start.

        Samples may come in any order; text must already be valid OpenMetrics with each
        series sorted by time and end with ``# EOF``.
        """
        text = series if isinstance(series, str) else to_openmetrics(series)
        promtool = system_binary("promtool", PROMETHEUS_HINT)
        was_running = self.proc is not None
        self.stop()
        tsdb = self.data_dir / "tsdb"
        tsdb.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".om", dir=self.data_dir, delete=False) as f:
            f.write(text)
            src = Path(f.name)
        try:
            res = subprocess.run(
                [
                    str(promtool), "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=24h", str(src), str(tsdb),
                ],
                capture_output=True,
                text=True,
            )  # fmt: skip
        finally:
            src.unlink()
        if res.returncode != 0:
            raise RuntimeError(f"promtool backfill failed:\n{res.stdout}\n{res.stderr}")
        if was_running or self.proc is None:
            self.start()

    def query(self, promql: str, at_s: float | None = None) -> Any:
        params = {"query": promql}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        return self._api("query", params)

    def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> Any:
        points = math.floor((end_s - start_s) / step_s) + 1
        if points > MAX_POINTS_PER_SERIES:
            raise ValueError(
                f"{points} points per series: Prometheus caps a range query at "
                f"{MAX_POINTS_PER_SERIES}; use a larger step or split the range"
            )
        params = {
            "query": promql,
            "start": f"{start_s:.3f}",
            "end": f"{end_s:.3f}",
            "step": f"{step_s:g}",
        }
        return self._api("query_range", params)

    def _api(self, endpoint: str, params: dict[str, str]) -> Any:
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {endpoint} failed: {body}")
        return body["data"]


def _get_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return int(resp.status)
