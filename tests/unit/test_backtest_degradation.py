"""Degradation levels in the backtest: every fleet assessed by the operator's ``assess`` on
what its metrics show, and the forecast's lead over the queue, on tiny synthetic demand."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from prescaler.backtest import (
    DegradationSetup,
    Demand,
    FleetConfig,
    OraclePolicy,
    PredictivePolicy,
    ReactivePolicy,
    lead_times,
    oracle_replicas,
    run_backtest,
    simulate,
)
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.cli import main
from prescaler.planning import DegradationPolicy, ScalingPolicy
from prescaler.settings import ReconcileSettings

CAP = 1000.0  # tokens/s per replica; requests of 100 tokens: 10 requests/s per replica
CAPACITY = CapacityModel(TokenProfile(80.0, 20.0), tokens_per_second=CAP)
SPEC_DEFAULTS = DegradationPolicy()


def _setup(every: float = 30.0, policy: DegradationPolicy = SPEC_DEFAULTS) -> DegradationSetup:
    return DegradationSetup(policy=policy, capacity=CAPACITY, every_seconds=every)


def _demand(tokens_per_minute: list[float] | np.ndarray) -> Demand:
    tokens = np.asarray(tokens_per_minute, dtype=float)
    return Demand(
        start=1_700_000_000.0,
        tokens_per_s=tokens,
        observed_requests_per_s=tokens / 100.0,
        prompt_tokens=80.0,
        output_tokens=20.0,
    )


def _config(cold: float = 240.0, max_replicas: int = 80) -> FleetConfig:
    return FleetConfig(
        replica_tokens_per_second=CAP, cold_start_seconds=cold, max_replicas=max_replicas
    )


def _hpa(config: FleetConfig) -> ReactivePolicy:
    return ReactivePolicy(CAP, config.min_replicas, config.max_replicas)


def _oracle(demand: Demand, config: FleetConfig) -> OraclePolicy:
    per_step = np.repeat(demand.tokens_per_s, config.steps_per_minute)
    return OraclePolicy(
        oracle_replicas(per_step, CAP, config.lag_steps, config.min_replicas, config.max_replicas),
        config.step_seconds,
    )


@dataclass(frozen=True)
class _Point:
    t: float
    mean: float
    upper: float


@dataclass(frozen=True)
class _Forecast:
    points: tuple[_Point, ...]
    generated_at: float
    step_seconds: float = 60.0


class _TrendForecaster:
    """Extrapolates the last 5 minutes' slope 10 minutes ahead: it sees a steady ramp."""

    def forecast(self, history: pd.Series, now: float) -> _Forecast:
        values = history.to_numpy(dtype=float)[-5:]
        slope = (values[-1] - values[0]) / (len(values) - 1) if len(values) > 1 else 0.0
        last_end = history.index[-1].timestamp() + 60.0
        points = []
        for k in range(1, 11):
            t = now + 60.0 * k
            level = max(0.0, values[-1] + slope * (t - last_end) / 60.0)
            points.append(_Point(t, level, 1.05 * level))
        return _Forecast(tuple(points), now)


class _LastValueForecaster:
    """The last minute, flat: it cannot see a ramp coming."""

    def forecast(self, history: pd.Series, now: float) -> _Forecast:
        level = float(history.iloc[-1])
        return _Forecast(
            tuple(_Point(now + 60.0 * k, level, 1.05 * level) for k in range(1, 11)), now
        )


def _predictive(forecaster: object, config: FleetConfig) -> PredictivePolicy:
    return PredictivePolicy(
        forecaster=forecaster,  # type: ignore[arg-type]
        capacity=CAPACITY,
        policy=ScalingPolicy(
            min_replicas=1, max_replicas=config.max_replicas, observed_headroom=1.4
        ),
        cold_start_seconds=config.cold_start_seconds,
        interval=30.0,
    )


# --------------------------------------------------------------------------- minutes


@pytest.mark.parametrize("every", [15.0, 30.0, 45.0])
def test_minutes_at_each_level_add_up_to_the_simulated_span(every: float) -> None:
    # 20 minutes with a burst: every level is visited, and 45 s does not divide the span.
    demand = _demand([1400.0] * 5 + [7000.0] * 15)
    config = _config()
    result = run_backtest(
        demand,
        [_hpa(config), _predictive(_TrendForecaster(), config)],
        config,
        degradation=_setup(every),
    )
    assert set(result.degradation) == {"reactive", "predictive"}
    for run in result.degradation.values():
        for which in ("levels", "queue_levels"):
            assert sum(run.minutes(which).values()) == pytest.approx(20.0)
        assert len(run.levels) == -(-20 * 60 // every)  # one assessment per cadence step
    body = result.to_json(trace="t", fmt="rate")
    assert body["degradation"]["assess_every_seconds"] == every
    minutes = body["policies"]["reactive"]["degradation"]["minutes"]
    assert list(minutes) == ["normal", "warning", "critical"]
    assert sum(minutes.values()) == pytest.approx(body["minutes"])


def test_no_assessment_without_a_setup() -> None:
    demand = _demand([1400.0] * 10)
    config = _config()
    result = run_backtest(demand, [_hpa(config)], config)
    assert result.degradation == {}
    assert result.runs[0].signals is None
    body = result.to_json(trace="t", fmt="rate")
    assert "degradation" not in body
    assert "degradation" not in body["policies"]["reactive"]


# --------------------------------------------------------------------------- a burst


def test_a_step_burst_beyond_capacity_puts_the_hpa_at_warning_or_critical() -> None:
    """Demand steps from 1.4 to 7 replicas' worth at minute 5 (cold start 240 s): the HPA
    has 2 replicas until 570 s, so 5000 tokens/s queue (50 requests per step per replica,
    above the critical 50 per replica within a step of the metric's lag) and drain only
    from 570 s on; the oracle, ready in time, never queues."""
    demand = _demand([1400.0] * 5 + [7000.0] * 15)
    config = _config()
    result = run_backtest(
        demand, [_hpa(config), _oracle(demand, config)], config, degradation=_setup()
    )
    hpa = result.degradation["reactive"]
    minutes = hpa.minutes()
    assert minutes["critical"] >= 8.0
    assert minutes["warning"] + minutes["critical"] >= 10.0
    # Before the burst is visible (5 min + the 30 s metric lag) it is normal.
    first = hpa.levels[: 2 * 5 + 1]
    assert (first == 0).all()
    assert (hpa.levels[2 * 6 :][:8] == 2).all()  # critical through the cold start
    # No forecaster in this run: the queue alone, the same with and without forecast.
    assert (hpa.queue_levels == hpa.levels).all()
    assert hpa.lead is None
    assert result.degradation["oracle"].minutes()["normal"] == pytest.approx(20.0)


def test_the_thresholds_are_the_setups() -> None:
    demand = _demand([1400.0] * 5 + [7000.0] * 15)
    config = _config()
    deaf = DegradationPolicy(queue_warning_per_replica=1e9, queue_critical_per_replica=1e9)
    result = run_backtest(demand, [_hpa(config)], config, degradation=_setup(policy=deaf))
    assert result.degradation["reactive"].minutes()["normal"] == pytest.approx(20.0)


def test_the_signals_are_what_the_fleet_shows_with_the_metric_lag() -> None:
    demand = _demand([1400.0] * 5 + [7000.0] * 15)
    config = _config()
    run = simulate(demand, _hpa(config), config, signals_every_seconds=30.0)
    sig = run.signals
    assert sig is not None
    assert sig.forecasts is None  # the HPA has no forecaster
    assert len(sig) == 40
    start = demand.start
    # The HPA sees the step at 330 s and starts 4 more (its rate limit), 4 again at 345 s;
    # each is expected one cold start (240 s) after its start.
    j = 11  # 330 s
    assert sig.times[j] == start + 330.0
    assert sig.ready[j] == 2
    assert sig.arrivals[j] == (start + 570.0,) * 4
    assert sig.arrivals[j + 1] == (start + 570.0,) * 4 + (start + 585.0,) * 4
    assert sig.metric_tokens_per_s[j] == 7000.0  # 30 s old: already after the step
    # The queue shown is the one 30 s before: none at 330 s (the queue at 300 s), at 360 s
    # the two steps from 300 s to 330 s, 5000 tokens/s short for 15 s each.
    assert sig.queue_tokens[j] == 0.0
    assert sig.queue_tokens[j + 1] == pytest.approx(2 * 5000.0 * 15.0)
    with pytest.raises(ValueError, match="multiple"):
        simulate(demand, _hpa(config), config, signals_every_seconds=20.0)


# --------------------------------------------------------------------------- the lead


def _ramp() -> np.ndarray:
    # 30 flat minutes at 5000 tokens/s, then +1000 tokens/s per minute (20 % of the start
    # per minute: faster than the HPA's 43 % headroom lasts through a cold start) to 30000.
    return np.concatenate(
        [np.full(30, 5000.0), np.linspace(6000.0, 30000.0, 25), np.full(30, 30000.0)]
    )


def test_forecast_shortfall_leads_the_queue_on_a_ramp_the_forecaster_sees() -> None:
    demand = _demand(_ramp())
    config = _config()
    result = run_backtest(
        demand,
        [_hpa(config), _predictive(_TrendForecaster(), config)],
        config,
        degradation=_setup(),
    )
    assert result.forecasts_from == "predictive"
    hpa = result.degradation["reactive"]
    assert hpa.lead is not None
    assert hpa.lead.episodes >= 1
    assert hpa.lead.forecast_first >= 1
    lead = hpa.lead.as_dict()
    # The trend is visible after two ramp minutes; the HPA's headroom runs out at about 3.
    assert lead["median_seconds"] >= 60.0
    assert lead["p90_seconds"] >= lead["median_seconds"]
    assert 0 < lead["forecast_first_share"] <= 1
    # The forecast signal rose before the queue's: the published level is up no later.
    first_queue = int(np.flatnonzero(hpa.queue_levels >= 1)[0])
    first_level = int(np.flatnonzero(hpa.levels >= 1)[0])
    assert first_level < first_queue


def test_a_forecaster_blind_to_the_ramp_gives_no_lead() -> None:
    demand = _demand(_ramp())
    config = _config()
    result = run_backtest(
        demand,
        [_hpa(config), _predictive(_LastValueForecaster(), config)],
        config,
        degradation=_setup(),
    )
    hpa = result.degradation["reactive"]
    assert hpa.lead is not None
    assert hpa.lead.episodes >= 1
    assert hpa.lead.forecast_first == 0
    assert hpa.lead.as_dict()["median_seconds"] == 0.0


class _StaleForecaster(_TrendForecaster):
    """The trend, but made two hours ago: no plan may use it."""

    def forecast(self, history: pd.Series, now: float) -> _Forecast:
        fc = super().forecast(history, now)
        return _Forecast(fc.points, now - 7200.0)


def test_only_a_forecast_the_plan_could_use_is_assessed_as_the_operator_does() -> None:
    demand = _demand(_ramp())
    config = _config()
    result = run_backtest(
        demand,
        [_hpa(config), _predictive(_StaleForecaster(), config)],
        config,
        degradation=_setup(),
    )
    predictive = next(r for r in result.runs if r.name == "predictive")
    assert predictive.signals is not None
    assert predictive.signals.forecasts is not None
    assert all(f is None for f in predictive.signals.forecasts)
    hpa = result.degradation["reactive"]
    assert (hpa.shortfall_levels == -1).all()  # never measured
    assert hpa.lead is not None
    assert hpa.lead.forecast_first == 0


def test_lead_times_count_an_unbroken_warning_up_to_the_episode_within_the_window() -> None:
    #         0  1  2  3  4  5  6  7  8  9 10 11
    queue = [0, 0, 0, 1, 1, 0, 0, 0, 2, 0, 0, 1]
    short = [0, 1, 1, 2, 0, 1, -1, 1, 1, 0, 0, 1]
    stats = lead_times(np.array(queue), np.array(short), 30.0)
    # Episode at 3: steps 1-2 warned (60 s). At 8: 7 warned, 6 not measured (30 s). At 11:
    # 10 was normal (0 s; the shortfall rising at the same step is not earlier).
    assert stats.leads_seconds == (60.0, 30.0, 0.0)
    assert stats.as_dict() == {
        "episodes": 3,
        "forecast_first": 2,
        "forecast_first_share": 2 / 3,
        "median_seconds": 30.0,
        "p90_seconds": pytest.approx(54.0),
        "window_seconds": 3600.0,
    }
    # A warning up for longer than the window counts as the window.
    long = lead_times(np.array([0] * 300 + [1]), np.array([1] * 301), 30.0)
    assert long.leads_seconds == (3600.0,)
    # An episode at the first step has nothing before it.
    assert lead_times(np.array([1, 1]), np.array([1, 1]), 30.0).leads_seconds == (0.0,)
    empty = lead_times(np.array([0, 0]), np.array([1, 1]), 30.0).as_dict()
    assert empty["episodes"] == 0
    assert empty["median_seconds"] is None


# --------------------------------------------------------------------------- the CLI


def test_cli_reports_levels_per_policy_and_keeps_the_contract(tmp_path: Path) -> None:
    minutes = 180
    t = np.arange(minutes)
    rps = 40 + 20 * np.sin(t / 25.0) + np.where((t > 120) & (t < 135), 50, 0)
    trace = tmp_path / "rate.csv"
    trace.write_text(
        "timestamp,requests_per_second\n"
        + "".join(f"{1_700_000_000 + 60 * i},{r:.3f}\n" for i, r in enumerate(rps))
    )
    out, timeline = tmp_path / "out.json", tmp_path / "out.csv"
    code = main(
        [
            "backtest",
            "--trace",
            str(trace),
            "--format",
            "rate",
            "--prompt-tokens",
            "80",
            "--output-tokens",
            "20",
            "--cold-start-seconds",
            "120",
            "--replica-tokens-per-second",
            "1000",
            "--scale-to-peak-replicas",
            "10",
            "--policies",
            "reactive,predictive",
            "--forecast-model",
            "recent_trend",
            "--json",
            str(out),
            "--timeline",
            str(timeline),
            "--quiet",
        ]
    )
    assert code == 0
    body = json.loads(out.read_text())
    # The predictive policy's decisions: the operator's reconcile period.
    assert body["degradation"]["assess_every_seconds"] == ReconcileSettings().interval_seconds
    assert body["degradation"]["forecasts_from"] == "predictive"
    for name in ("reactive", "predictive"):
        policy = body["policies"][name]
        assert {"shortfall_minutes", "unserved_token_fraction", "gpu_hours", "scale_events"} <= set(
            policy
        )
        levels = policy["degradation"]
        assert sum(levels["minutes"].values()) == pytest.approx(body["minutes"])
        assert sum(levels["queue_only_minutes"].values()) == pytest.approx(body["minutes"])
        assert set(levels["lead"]) >= {
            "episodes",
            "median_seconds",
            "p90_seconds",
            "forecast_first_share",
        }
    # The burst beyond the HPA's headroom queues.
    reactive = body["policies"]["reactive"]["degradation"]
    assert reactive["queue_only_minutes"]["normal"] < body["minutes"]
    assert timeline.read_text().splitlines()[0] == (
        "minute,demand_tokens_per_s,replica_tokens_per_s,"
        "reactive_ready,reactive_desired,predictive_ready,predictive_desired"
    )
