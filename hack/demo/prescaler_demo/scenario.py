"""What the live demo plays: a stretch of a real trace, its history, and the pool for it.

Pure code: nothing here starts a process or talks to a server.

Time compression. The demo plays one trace step every ``seconds_per_step`` of wall time
(60 s by default: 10x for ServeGen's 10-minute steps). The pool's settings that describe the
demand's time structure are scaled by the same factor, so they mean in compressed time what
their defaults mean in real time: the history step is one trace step, the lookback is the
backfilled week, the refit period one trace hour, the horizon two trace hours, and the risk
model's memory (``objective.memoryLookaheads``, a count of the decisions made every
reconcile period) spans the same hours of trace time as its default does of real time.
What runs in real time stays at its default: cold start and margin (pods), scrape and
reconcile periods.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel

from prescaler.api import (
    ForecastSpec,
    InferencePoolSpec,
    ObjectiveSpec,
    capacity_model,
    parse_spec,
)
from prescaler.backtest.traces import Trace, load_token_mix, load_trace

DAY = 86_400.0
WEEK = 7 * DAY
HOUR = 3_600.0
POOL_TEMPLATE = Path(__file__).resolve().parents[1] / "inferencepool.yaml"


@dataclass(frozen=True)
class Options:
    """The demo's knobs (``python -m prescaler_demo --help`` documents each)."""

    trace: Path
    fmt: str = "servegen"
    minutes: float = 7.0
    seconds_per_step: float = 60.0
    peak_replicas: int = 10
    max_replicas: int = 0
    """The pool's maximum; 0: what the backfilled week's peak needs (at full load, and at
    least the window's), as a platform team sizes a pool from its traffic. A maximum below
    that caps the history's replay too: every policy then leaves the same peaks waiting,
    and what the forecast buys below the cap cannot pay."""
    min_replicas: int = 2
    cold_start_seconds: float = 60.0
    window_in_seconds: float = 360.0
    window_minutes: float = 1.0
    window_replicas: int = 12
    window_lead_seconds: int = 150
    tokens_per_second: float = 6000.0
    namespace: str = "prescaler-demo"
    name: str = "llama-chat"
    tenants: bool = True
    """Let the rule consider each tenant's series too (a per-client file next to the
    trace), as a pool that serves one tenant would see it."""


@dataclass(frozen=True)
class Stretch:
    """The trace stretch played live and the week before it, in trace time."""

    trace: Trace
    start_index: int
    """Index of the first live step in the trace."""
    steps: int
    """Live steps."""
    history_steps: int
    """Steps of history before ``start_index`` (one week)."""
    rise: float
    """How far the live stretch ramps: its peak after the lead-in over the lead-in's mean."""
    foretold: float = math.nan
    """The median of the same ramp at the same time of day over the week before."""
    lead_steps: int = 1
    """The lead-in: steps before the ramp is measured (time for the forecast to act)."""
    days: int = 0
    """Past days (without a collection gap there) behind ``foretold``."""

    @property
    def score(self) -> float:
        """The rule's score: the ramp both foretold and played, ``min(rise, foretold)``."""
        return min(self.rise, self.foretold)

    @property
    def live_rps(self) -> np.ndarray:
        return np.asarray(self.trace.rps[self.start_index : self.start_index + self.steps])

    @property
    def history_rps(self) -> np.ndarray:
        lo = self.start_index - self.history_steps
        return np.asarray(self.trace.rps[lo : self.start_index])

    def trace_time(self, index: int) -> str:
        """A trace step's start as ``d<day> HH:MM``, days counted from the trace's first."""
        t = index * self.trace.step_seconds
        clock = datetime.fromtimestamp(self.trace.start + t, UTC).strftime("%H:%M")
        return f"d{int(t // 86_400) + 1} {clock}"


STANDBY_PLACEHOLDERS = 2
"""The pool's standby placeholders at most (``spec.standby.placeholders.maxReplicas``): low
priority pods that hold GPUs for the next replicas."""
HOLD_STEPS = 2
"""A ramp is a level that lasts: the highest level held for this many consecutive steps.
A lone step is a blip, not a ramp (the forecasters' smoothing rightly treats it as noise,
and capacity for it would be Ready when it is gone)."""


def ramp(segment: np.ndarray, lead_steps: int, hold: int = HOLD_STEPS) -> float:
    """How far a stretch ramps: the highest level held for ``hold`` consecutive steps after
    the first ``lead_steps``, over their mean; NaN when the stretch has a collection gap (a
    NaN or a zero) or fewer than ``hold`` steps after the lead-in."""
    seg = np.asarray(segment, dtype=float)
    if len(seg) < lead_steps + max(1, hold) or lead_steps < 1:
        return math.nan
    if not (np.isfinite(seg).all() and (seg > 0).all()):
        return math.nan
    after = seg[lead_steps:]
    held = np.lib.stride_tricks.sliding_window_view(after, max(1, hold)).min(axis=1).max()
    return float(held / seg[:lead_steps].mean())


def foretold_ramp(
    rps: np.ndarray,
    start: int,
    steps: int,
    lead_steps: int,
    period_steps: int,
    days: int,
    hold: int = HOLD_STEPS,
) -> tuple[float, int]:
    """The ramp the seasonal history foretells for the stretch at ``start``: the median of
    :func:`ramp` at the same time of day on each of the ``days`` days before it that has
    no gap there; with the number of such days."""
    past = [
        ramp(rps[start - d * period_steps : start - d * period_steps + steps], lead_steps, hold)
        for d in range(1, days + 1)
        if start - d * period_steps >= 0
    ]
    seen = [r for r in past if math.isfinite(r)]
    return (float(np.median(seen)) if seen else math.nan), len(seen)


def choose_stretch(
    trace: Trace,
    steps: int,
    *,
    lead_steps: int = 2,
    period_seconds: float = DAY,
    days: int = 7,
    min_days: int = 4,
) -> Stretch:
    """The rule: the strongest *recurring* ramp that the seasonal history foretells.

    Among the stretches of ``steps`` trace steps that follow at least a week of history and
    have no collection gap, score each by ``min(rise, foretold)``: ``rise`` is how far the
    stretch ramps after a lead-in of ``lead_steps`` (:func:`ramp`), ``foretold`` the median
    of the same ramp at the same time of day (one ``period_seconds`` apart) over the
    ``days`` days before it, of which at least ``min_days`` must be gap-free there. The
    highest score wins: a ramp that recurs and that happens this time too, not the
    largest surprise (a burst that no earlier day had scores its ordinary days' median).
    """
    if steps < 2:
        raise ValueError("the live play needs at least 2 trace steps")
    lead = max(1, min(lead_steps, steps - 1))
    hold = max(1, min(HOLD_STEPS, steps - lead))  # a short play holds what it can
    history = math.ceil(WEEK / trace.step_seconds)
    period = max(1, round(period_seconds / trace.step_seconds))
    rps = np.asarray(trace.rps, dtype=float)
    best: Stretch | None = None
    for s in range(history, len(rps) - steps + 1):
        rise = ramp(rps[s : s + steps], lead, hold)
        if not math.isfinite(rise):
            continue
        foretold, seen = foretold_ramp(rps, s, steps, lead, period, days, hold)
        if seen < min_days:
            continue
        candidate = Stretch(trace, s, steps, history, rise, foretold, lead, seen)
        if best is None or candidate.score > best.score:
            best = candidate
    if best is None:
        raise ValueError(
            f"{trace.name}: no gap-free stretch of {steps} steps after a week of history "
            f"with {min_days} gap-free days before it at the same time of day "
            f"(the trace has {len(rps)} steps of {trace.step_seconds:g} s)"
        )
    return best


def choose_among(traces: list[Trace], steps: int, *, lead_steps: int = 2) -> Stretch:
    """:func:`choose_stretch` over several series (the first is the trace itself): the
    highest score wins, the earlier series on a tie. Series without a qualifying stretch
    are skipped; if none has one, the first one's error is raised."""
    best: Stretch | None = None
    first_error: ValueError | None = None
    for trace in traces:
        try:
            candidate = choose_stretch(trace, steps, lead_steps=lead_steps)
        except ValueError as exc:
            first_error = first_error or exc
            continue
        if best is None or candidate.score > best.score:
            best = candidate
    if best is None:
        raise first_error or ValueError("no series to choose a stretch from")
    return best


MIN_TENANT_RPS = 1.0
"""A tenant series takes part when its median rate is at least this many requests/s: below
it, a tenant is a trickle, not a pool of its own, and its ramps are ratios of a trickle
(0.1 to 30 req/s reads as x300)."""


def tenant_traces(trace_path: Path, trace: Trace) -> list[Trace]:
    """Each tenant's series, from a per-client rate file next to the trace (ServeGen's
    ``*_per_client_rate_*``: ``t_sec`` and one column of requests/s per client, on the
    aggregate's grid), for tenants with a median rate of at least :data:`MIN_TENANT_RPS`.
    A tenant's rate is missing where the aggregate has a collection gap; none when there is
    no such file or its grid differs from the trace's."""
    files = sorted(trace_path.parent.glob("*per_client_rate*"))
    if not files:
        return []
    frame = pd.read_csv(files[0])
    if "t_sec" not in frame.columns or len(frame) != len(trace.rps):
        return []
    gap = ~np.isfinite(np.asarray(trace.rps, dtype=float))
    out = []
    for column in frame.columns:
        if column == "t_sec":
            continue
        rps = frame[column].to_numpy(dtype=float, copy=True)
        rps[gap] = math.nan
        if not np.nanmedian(rps) >= MIN_TENANT_RPS:
            continue
        out.append(replace(trace, rps=rps, name=f"{trace.name}, tenant {column}"))
    return out


@dataclass(frozen=True)
class TokenMeans:
    prompt: float
    output: float
    context_p95: int


def token_means(trace_path: Path, trace: Trace) -> TokenMeans:
    """The trace's token mix: its own columns, else ServeGen's pdf files next to it, else
    the spec's defaults."""
    siblings = sorted(trace_path.parent.glob("*input_tokens_pdf*"))
    if siblings:
        mix = load_token_mix(siblings[0])
        return TokenMeans(mix.mean_prompt, mix.mean_output, round(mix.context_quantile(0.95)))
    if trace.has_tokens:
        prompt, output = trace.tokens_per_request()
        w = np.nan_to_num(np.asarray(trace.rps, dtype=float))
        p = float(np.average(prompt, weights=w))
        o = float(np.average(output, weights=w))
        p95 = trace.context_p95 or (p + o) * 2
        return TokenMeans(p, o, round(p95))
    model = InferencePoolSpec.model_fields["model"].annotation
    assert model is not None
    defaults = {k: f.default for k, f in model.model_fields.items()}
    p, o = float(defaults["prompt_tokens"]), float(defaults["output_tokens"])
    return TokenMeans(p, o, round(p + o))


@dataclass(frozen=True)
class Scenario:
    """Everything the live run needs, derived from the options and the trace."""

    options: Options
    stretch: Stretch
    tokens: TokenMeans
    scale: float
    """Requests/s multiplier that makes the stretch's peak need ``peak_replicas``."""
    replica_rps: float
    """Requests/s one ready replica serves (the pool's capacity model, binding limit)."""
    max_concurrency: int
    latency_seconds: float

    @property
    def compression(self) -> float:
        """Trace seconds per wall second."""
        return self.stretch.trace.step_seconds / self.options.seconds_per_step

    @property
    def live_rps(self) -> np.ndarray:
        return self.stretch.live_rps * self.scale

    @property
    def history_rps(self) -> np.ndarray:
        return self.stretch.history_rps * self.scale

    @property
    def tokens_per_request(self) -> float:
        return self.tokens.prompt + self.tokens.output

    def initial_replicas(self) -> int:
        """What the first live step needs at 70 % load (also the HPA's start)."""
        first = float(self.live_rps[0])
        want = math.ceil(first / (0.7 * self.replica_rps))
        return min(max(want, self.options.min_replicas), self.options.max_replicas)

    def forecast_settings(self) -> dict[str, int]:
        """The compressed forecast settings (see the module docstring)."""
        c = self.compression
        step = round(self.options.seconds_per_step)
        return {
            "step_seconds": step,
            "lookback_seconds": round(WEEK / c),
            "refit_seconds": max(10, round(HOUR / c)),
            "horizon_seconds": max(step, round(2 * HOUR / c)),
        }

    def objective_settings(self) -> dict[str, int]:
        """The risk model's memory in compressed time: its default counts decisions, one a
        reconcile period, which run in real time; a tenth as many then span the same trace
        hours at 10x (else the pool's typical demand and its calibration would be the mean
        of days of trace, not hours)."""
        default = ObjectiveSpec.default_of("memory_lookaheads")
        return {"memory_lookaheads": max(10, round(default / self.compression))}

    def seasonality_periods(self) -> list[int]:
        """The spec's default seasonal periods (a day, a week) in compressed time."""
        return [round(p / self.compression) for p in _default_periods()]

    def pool_yaml(self, prometheus_url: str, live_start: float) -> str:
        o = self.options
        start = live_start + o.window_in_seconds
        end = start + o.window_minutes * 60
        values: dict[str, Any] = {
            "name": o.name,
            "namespace": o.namespace,
            "min_replicas": o.min_replicas,
            "max_replicas": o.max_replicas,
            "tokens_per_second": f"{o.tokens_per_second:g}",
            "prompt_tokens": f"{self.tokens.prompt:.0f}",
            "output_tokens": f"{self.tokens.output:.0f}",
            "context_tokens": self.tokens.context_p95,
            "cold_start_seconds": round(o.cold_start_seconds),
            "prometheus_url": prometheus_url,
            "window_start": _iso(start),
            "window_end": _iso(end),
            "window_replicas": o.window_replicas,
            "window_lead_seconds": o.window_lead_seconds,
            "standby_placeholders": STANDBY_PLACEHOLDERS,
            "seasonality_periods": ", ".join(str(p) for p in self.seasonality_periods()),
            **self.forecast_settings(),
            **self.objective_settings(),
        }
        return string.Template(POOL_TEMPLATE.read_text()).substitute(values)

    def non_default_settings(self) -> list[tuple[str, str, str, str]]:
        """(setting, value, default, why) for the forecast settings the demo changes."""
        c = self.compression
        why = f"the default / {c:g} (compressed time)"
        out: list[tuple[str, str, str, str]] = []
        sections: tuple[tuple[str, type[BaseModel], dict[str, int]], ...] = (
            ("forecast", ForecastSpec, self.forecast_settings()),
            ("objective", ObjectiveSpec, self.objective_settings()),
        )
        for prefix, model, settings in sections:
            for key, value in settings.items():
                default = model.model_fields[key].default
                if value != default:
                    out.append((f"{prefix}.{_camel(key)}", str(value), str(default), why))
        periods = self.seasonality_periods()
        default_periods = [round(p) for p in _default_periods()]
        if periods != default_periods:
            out.append((
                "forecast.seasonalityPeriods",
                ",".join(str(p) for p in periods),
                ",".join(str(p) for p in default_periods),
                f"a day and a week / {c:g}: the seasonal models see the trace's daily cycle",
            ))  # fmt: skip
        return out


def _default_periods() -> list[float]:
    """``forecast.seasonalityPeriods`` at the spec's default (the one place it lives)."""
    field = ForecastSpec.model_fields["seasonality_periods"]
    assert field.default_factory is not None
    return [float(p) for p in field.default_factory()]  # type: ignore[call-arg]


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(round(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(options: Options) -> Scenario:
    """Load the trace, pick the stretch by the rule and size it through the pool's model."""
    trace = load_trace(options.trace, options.fmt)
    steps = max(2, math.ceil(options.minutes * 60 / options.seconds_per_step))
    # The ramp is measured after a lead-in of two cold starts: time for the operator's
    # first forecast and for the replicas it asks for to be Ready.
    lead = max(1, math.ceil(2 * options.cold_start_seconds / options.seconds_per_step))
    series = [trace, *(tenant_traces(options.trace, trace) if options.tenants else [])]
    stretch = choose_among(series, steps, lead_steps=lead)
    tokens = token_means(options.trace, trace)
    # Size through the very pool the demo applies (same capacity model as the operator).
    bound = max(options.max_replicas, options.min_replicas, options.window_replicas)
    draft = Scenario(replace(options, max_replicas=bound), stretch, tokens, 1.0, 1.0, 1, 1.0)
    spec = parse_spec(yaml.safe_load(draft.pool_yaml("http://prometheus:9090", 0.0))["spec"])
    model = capacity_model(spec)
    replica_rps = model.replica_requests_per_second
    peak = float(np.nanmax(stretch.live_rps))
    scale = options.peak_replicas * replica_rps / peak
    if options.max_replicas <= 0:
        needs = math.ceil(float(np.nanmax(stretch.history_rps)) * scale / replica_rps)
        options = replace(options, max_replicas=max(needs, bound, options.peak_replicas))
    return Scenario(
        options,
        stretch,
        tokens,
        scale,
        replica_rps,
        model.max_concurrent_requests_per_replica or 1,
        model.request_latency_seconds,
    )
