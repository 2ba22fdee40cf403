"""Reference policies and sweeps: the smoothed oracle and the HPA's target."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from prescaler.backtest import (
    Demand,
    FleetConfig,
    ReactivePolicy,
    SmoothedOraclePolicy,
    oracle_replicas,
    reactive_policy,
    score,
    simulate,
    smoothed_demand,
    smoothed_oracle_replicas,
)
from prescaler.cli import backtest as cli_backtest
from prescaler.cli import main
from prescaler.cli._backtest_spec import replay_options

CAP = 1000.0  # tokens/s per replica


def _demand(tokens_per_minute: np.ndarray) -> Demand:
    tokens = np.asarray(tokens_per_minute, dtype=float)
    return Demand(
        start=1_700_000_000.0,
        tokens_per_s=tokens,
        observed_requests_per_s=tokens / 100.0,
        prompt_tokens=80.0,
        output_tokens=20.0,
    )


def _config(cold: float = 240.0, max_replicas: int = 50) -> FleetConfig:
    return FleetConfig(
        replica_tokens_per_second=CAP, cold_start_seconds=cold, max_replicas=max_replicas
    )


def _smoothed(
    tokens: np.ndarray, config: FleetConfig, k: float = 1.0, window: int = 31
) -> np.ndarray:
    return smoothed_oracle_replicas(
        tokens,
        config.steps_per_minute,
        CAP,
        config.lag_steps,
        config.min_replicas,
        config.max_replicas,
        k=k,
        window_minutes=window,
    )


# --------------------------------------------------------------------------- smoothed oracle


def test_smoothed_demand_is_the_centred_rolling_mean() -> None:
    np.testing.assert_allclose(smoothed_demand(np.array([0.0, 3, 6, 3]), 3), [1.5, 3, 4, 4.5])
    np.testing.assert_allclose(smoothed_demand(np.array([1.0, 5.0]), 1), [1.0, 5.0])
    with pytest.raises(ValueError, match="window"):
        smoothed_demand(np.array([1.0]), 0)


def test_with_k_1_on_noise_free_demand_it_is_the_oracle() -> None:
    config = _config()
    spm = config.steps_per_minute
    flat = np.full(120, 4321.0)
    oracle = oracle_replicas(np.repeat(flat, spm), CAP, config.lag_steps, 1, 50)
    np.testing.assert_array_equal(_smoothed(flat, config), oracle)
    # A straight ramp is its own centred mean away from the ends of the trace.
    ramp = np.linspace(1000.0, 20000.0, 240)
    oracle = oracle_replicas(np.repeat(ramp, spm), CAP, config.lag_steps, 1, 50)
    inner = slice(15 * spm, (240 - 15 - 5) * spm)
    np.testing.assert_array_equal(_smoothed(ramp, config)[inner], oracle[inner])


def test_it_never_exceeds_max_replicas_and_rejects_a_bad_k() -> None:
    rng = np.random.default_rng(3)
    tokens = rng.uniform(0, 30000, size=90)
    config = _config(max_replicas=12)
    assert _smoothed(tokens, config, k=5.0).max() == 12
    with pytest.raises(ValueError, match="factor k"):
        _smoothed(tokens, config, k=0.0)


def test_ready_capacity_covers_k_times_the_smoothed_mean() -> None:
    """Every replica it needs exists one cold start early, so at every step the ready
    capacity covers ``k ×`` the smoothed mean, while the noise above it goes short."""
    rng = np.random.default_rng(11)
    minutes = 180
    base = 8000 + 6000 * np.sin(np.arange(minutes) / 30.0)
    tokens = base * rng.lognormal(0.0, 0.2, size=minutes)
    demand = _demand(tokens)
    config = _config(cold=240.0)
    k = 1.2
    policy = SmoothedOraclePolicy(_smoothed(tokens, config, k=k), config.step_seconds)
    assert policy.name == "smoothed-oracle"
    run = simulate(demand, policy, config)
    target = np.repeat(k * smoothed_demand(tokens, 31), config.steps_per_minute)
    assert np.all(run.ready_per_step * CAP >= target)
    # It starts with what it needs and never holds more than the plan.
    np.testing.assert_array_equal(run.existing_per_step, policy.replicas_per_step)
    sc = score(run, demand, config)
    assert 0 < sc.shortfall_minutes < minutes  # the noise it does not know about


# --------------------------------------------------------------------------- the CLI


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_backtest.register(parser.add_subparsers())
    base = ["--trace", "x.csv", "--format", "nab", "--cold-start-seconds", "240"]
    return parser.parse_args(["backtest", *base, *extra])


def test_hpa_target_reaches_the_reactive_policy() -> None:
    config = _config()
    options = replay_options(_args(), windows=[], forecast_step=60)
    default = reactive_policy(config, options.hpa_target)
    assert default.target == 0.7 == ReactivePolicy(CAP, 1, 2).target
    swept_options = replay_options(_args("--hpa-target", "0.5"), windows=[], forecast_step=60)
    swept = reactive_policy(config, swept_options.hpa_target)
    assert (swept.target, swept.min_replicas, swept.max_replicas) == (0.5, 1, 50)
    with pytest.raises(SystemExit):
        _args("--hpa-target", "1.5")


def test_cli_runs_the_references_and_records_their_knobs(tmp_path: Path) -> None:
    minutes = 240
    t = np.arange(minutes)
    rps = 50 + 30 * np.sin(t / 20.0) + np.random.default_rng(5).normal(0, 3, size=minutes)
    trace = tmp_path / "rate.csv"
    trace.write_text(
        "timestamp,requests_per_second\n"
        + "".join(f"{1_700_000_000 + 60 * i},{max(r, 0.0):.3f}\n" for i, r in enumerate(rps))
    )
    bodies = {}
    span = "name=mid,start=2023-11-15T00:00:20,end=2023-11-15T01:00:20"  # minute-aligned
    for target in ("0.5", "0.9"):
        out = tmp_path / f"{target}.json"
        timeline = tmp_path / f"{target}.csv"
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
                "reactive,oracle,smoothed-oracle",
                "--hpa-target",
                target,
                "--smoothed-oracle-k",
                "1.3",
                "--smoothed-window-minutes",
                "15",
                "--json",
                str(out),
                "--timeline",
                str(timeline),
                "--quiet",
                "--score-span",
                span,
            ]
        )
        assert code == 0
        bodies[target] = json.loads(out.read_text())
        header = timeline.read_text().splitlines()[0]
        assert header.endswith("smoothed-oracle_ready,smoothed-oracle_desired")
    body = bodies["0.5"]
    assert body["hpa_target"] == 0.5
    assert body["smoothed_oracle"] == {"k": 1.3, "window_minutes": 15}
    assert "standby" not in body
    mid = body["spans"]["mid"]
    assert mid["start"] == "2023-11-15T00:00:20+00:00"
    assert mid["policies"]["oracle"]["minutes"] == 60
    assert mid["policies"]["oracle"]["shortfall_minutes"] == 0
    assert set(body["policies"]) == {"reactive", "oracle", "smoothed-oracle"}
    # A lower target keeps more headroom: more GPU-hours.
    assert (
        bodies["0.5"]["policies"]["reactive"]["gpu_hours"]
        > bodies["0.9"]["policies"]["reactive"]["gpu_hours"]
    )


# --------------------------------------------------------------------------- span scores


def test_span_scores_restrict_every_measure_to_the_span() -> None:
    from prescaler.backtest import run_backtest, span_score

    demand = _demand(np.array([1400.0] * 5 + [7000.0] * 15))
    config = _config(cold=240.0, max_replicas=20)
    hpa = ReactivePolicy(CAP, config.min_replicas, config.max_replicas)
    result = run_backtest(demand, [hpa], config)
    run, whole = result.runs[0], result.scores["reactive"]
    everything = span_score(run, demand, config, 0, 20)
    assert everything["shortfall_minutes"] == whole.shortfall_minutes == 5
    assert everything["gpu_hours"] == pytest.approx(whole.gpu_hours)
    assert everything["unserved_token_fraction"] == pytest.approx(whole.unserved_token_fraction)
    assert everything["scale_events"] == whole.scale_events
    before, during = span_score(run, demand, config, 0, 5), span_score(run, demand, config, 5, 10)
    assert (before["shortfall_minutes"], during["shortfall_minutes"]) == (0, 5)
    assert before["unserved_token_fraction"] == 0.0
    assert during["unserved_token_fraction"] > whole.unserved_token_fraction
    # By unix time, a partial minute at either end counts.
    spans = result.span_scores(demand.start + 5 * 60 + 10, demand.start + 9 * 60 + 1)
    assert spans["reactive"]["minutes"] == 5
    with pytest.raises(ValueError, match="no replayed minute"):
        span_score(run, demand, config, 20, 30)
