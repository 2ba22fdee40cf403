"""Warm standby in the simulated fleet: slots, warm starts, replacement and cost."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pytest

from prescaler.api import scaling_policy
from prescaler.backtest import (
    Demand,
    Fleet,
    FleetConfig,
    Observation,
    ReactivePolicy,
    run_backtest,
    score,
    simulate,
)
from prescaler.cli import backtest as cli_backtest

CAP = 1000.0  # tokens/s per replica


def _demand(tokens_per_minute: list[float]) -> Demand:
    tokens = np.asarray(tokens_per_minute, dtype=float)
    return Demand(
        start=1_700_000_000.0,
        tokens_per_s=tokens,
        observed_requests_per_s=tokens / 100.0,
        prompt_tokens=80.0,
        output_tokens=20.0,
    )


# --------------------------------------------------------------------------- the fleet


def test_a_slot_is_warm_one_cold_start_after_it_is_asked_for() -> None:
    fleet = Fleet(initial_ready=2, lag_steps=16, warm_lag_steps=4)
    fleet.set_standby(3, step=0)
    assert (fleet.standby, fleet.standby_warm) == (3, 0)
    fleet.advance(15)
    assert fleet.standby_warm == 0
    fleet.advance(16)
    assert (fleet.standby, fleet.standby_warm) == (3, 3)


def test_replicas_take_warm_slots_first_and_start_faster() -> None:
    fleet = Fleet(initial_ready=2, lag_steps=16, warm_lag_steps=4)
    fleet.set_standby(2, step=0)
    fleet.advance(16)
    fleet.scale_to(5, step=20)  # two on warm slots (ready at 24), one cold (ready at 36)
    assert (fleet.existing, fleet.warm_starts, fleet.standby) == (5, 2, 0)
    fleet.advance(23)
    assert fleet.ready == 2
    fleet.advance(24)
    assert fleet.ready == 4
    fleet.advance(35)
    assert fleet.ready == 4
    fleet.advance(36)
    assert fleet.ready == 5
    assert fleet.scale_events == 1


def test_a_consumed_slot_is_replaced_only_one_cold_start_later() -> None:
    fleet = Fleet(initial_ready=1, lag_steps=16, warm_lag_steps=4)
    fleet.set_standby(1, step=0)
    fleet.advance(16)
    fleet.scale_to(2, step=16)  # takes the only warm slot
    fleet.set_standby(1, step=16)  # the planner still wants one: a new placeholder
    assert (fleet.standby, fleet.standby_warm) == (1, 0)
    fleet.scale_to(3, step=17)  # no warm slot free: a cold start
    assert fleet.warm_starts == 1
    fleet.advance(31)
    assert fleet.standby_warm == 0
    fleet.advance(32)
    assert fleet.standby_warm == 1
    assert fleet.ready == 2  # the warm one (ready at 20); the cold one is ready at 33
    fleet.advance(33)
    assert fleet.ready == 3


def test_fewer_slots_drop_pending_ones_first() -> None:
    fleet = Fleet(initial_ready=1, lag_steps=8, warm_lag_steps=2)
    fleet.set_standby(2, step=0)
    fleet.advance(8)
    fleet.set_standby(4, step=8)  # two warm, two pending
    fleet.set_standby(3, step=9)
    assert (fleet.standby, fleet.standby_warm) == (3, 2)
    fleet.set_standby(1, step=9)
    assert (fleet.standby, fleet.standby_warm) == (1, 1)
    fleet.set_standby(0, step=9)
    assert fleet.standby == 0
    with pytest.raises(ValueError, match="standby slots"):
        fleet.set_standby(-1, step=9)


def test_a_removed_ready_replica_hands_its_node_to_a_pending_slot() -> None:
    fleet = Fleet(initial_ready=5, lag_steps=16, warm_lag_steps=4)
    fleet.set_standby(2, step=0)
    fleet.scale_to(4, step=1)
    assert (fleet.ready, fleet.standby, fleet.standby_warm) == (4, 2, 1)
    fleet.advance(16)
    assert fleet.standby_warm == 2


def test_scale_down_removes_the_least_advanced_replica_first() -> None:
    """A warm start asked for later can be ready before a cold one asked for earlier:
    the scale-down removes the one that would be ready last."""
    fleet = Fleet(initial_ready=1, lag_steps=16, warm_lag_steps=4)
    fleet.scale_to(2, step=0)  # cold: ready at 16
    fleet.set_standby(1, step=0)
    fleet.advance(16)
    fleet.scale_to(3, step=16)  # warm: ready at 20
    fleet.scale_to(4, step=16)  # cold: ready at 32
    fleet.scale_to(3, step=17)  # drops the cold one
    fleet.advance(20)
    assert (fleet.ready, fleet.existing) == (3, 3)


def test_without_a_warm_start_slots_change_nothing() -> None:
    fleet = Fleet(initial_ready=1, lag_steps=8)
    fleet.set_standby(1, step=0)
    fleet.advance(8)
    fleet.scale_to(2, step=8)
    assert (fleet.warm_starts, fleet.standby_warm) == (0, 1)
    fleet.advance(15)
    assert fleet.ready == 1
    fleet.advance(16)
    assert fleet.ready == 2
    with pytest.raises(ValueError, match="warm start"):
        Fleet(initial_ready=1, lag_steps=4, warm_lag_steps=5)


# --------------------------------------------------------------------------- the simulation


@dataclass
class _Scripted:
    """Asks for ``replicas[minute]`` and holds ``standby_slots`` of standby."""

    replicas: list[int]
    standby_slots: int
    name: str = "scripted"
    standby: int = 0

    @property
    def interval_seconds(self) -> float:
        return 60.0

    def decide(self, obs: Observation) -> int:
        self.standby = self.standby_slots
        return self.replicas[obs.step // 4]


def test_simulation_warm_starts_cost_and_timeline() -> None:
    """Standby of 2 from minute 0 (warm at minute 4); 1 -> 4 replicas at minute 6: two
    start warm (60 s) and one cold (240 s); the two slots are replaced, warm at minute 10."""
    demand = _demand([500.0] * 12)
    config = FleetConfig(
        replica_tokens_per_second=CAP,
        cold_start_seconds=240.0,
        max_replicas=10,
        initial_replicas=1,
        warm_start_seconds=60.0,
        standby_cost_fraction=0.5,
    )
    policy = _Scripted([1] * 6 + [4] * 6, standby_slots=2)
    run = simulate(demand, policy, config)
    ready = run.ready_per_minute(config.steps_per_minute)
    assert list(ready) == [1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 4, 4]
    assert run.warm_starts == 2
    assert run.standby_per_step is not None
    assert run.standby_per_step.min() == run.standby_per_step.max() == 2
    sc = score(run, demand, config)
    assert sc.standby_gpu_hours == pytest.approx(0.5 * 2 * 12 / 60)
    assert sc.gpu_hours == pytest.approx((1 * 6 + 4 * 6) / 60 + sc.standby_gpu_hours)
    assert sc.as_dict()["standby_gpu_hours"] == sc.standby_gpu_hours
    assert sc.warm_starts == 2
    # The brief's columns first, then the standby of the policies that hold it.
    hpa = ReactivePolicy(CAP, 1, 10)
    result = run_backtest(demand, [_Scripted([1] * 6 + [4] * 6, 2), hpa], config)
    assert list(result.timeline().columns) == [
        "minute",
        "demand_tokens_per_s",
        "replica_tokens_per_s",
        "scripted_ready",
        "scripted_desired",
        "reactive_ready",
        "reactive_desired",
        "scripted_standby",
    ]
    assert result.scores["reactive"].standby_gpu_hours == 0.0


def test_no_standby_without_a_warm_start_in_the_config() -> None:
    demand = _demand([500.0] * 12)
    config = FleetConfig(
        replica_tokens_per_second=CAP, cold_start_seconds=240.0, max_replicas=10, initial_replicas=1
    )
    run = simulate(demand, _Scripted([1] * 6 + [4] * 6, 2), config)
    assert run.standby_per_step is None
    assert run.warm_starts == 0
    assert list(run.ready_per_minute(config.steps_per_minute))[6:] == [1, 1, 1, 1, 4, 4]
    with pytest.raises(ValueError, match="warm start"):
        FleetConfig(
            replica_tokens_per_second=CAP, cold_start_seconds=60.0, warm_start_seconds=120.0
        )


# --------------------------------------------------------------------------- the CLI


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_backtest.register(parser.add_subparsers())
    base = ["--trace", "x.csv", "--format", "nab", "--cold-start-seconds", "240"]
    return parser.parse_args(["backtest", *base, *extra])


CONFIG = FleetConfig(replica_tokens_per_second=20000, cold_start_seconds=240, max_replicas=80)


def test_standby_flag_maps_onto_the_specs_placeholders() -> None:
    assert scaling_policy(cli_backtest.pool_spec(_args(), CONFIG)).standby_max_replicas == 0
    spec = cli_backtest.pool_spec(_args("--standby-max-replicas", "6"), CONFIG)
    assert spec.standby.placeholders.enabled
    assert spec.standby.placeholders.max_replicas == 6
    assert scaling_policy(spec).standby_max_replicas == 6
    off = cli_backtest.pool_spec(_args("--standby-max-replicas", "0"), CONFIG)
    assert scaling_policy(off).standby_max_replicas == 0


def test_standby_fleet_defaults_and_bounds() -> None:
    config = cli_backtest._with_standby(_args(), CONFIG)
    assert (config.warm_start_seconds, config.standby_cost_fraction) == (60.0, 1.0)
    short = FleetConfig(replica_tokens_per_second=20000, cold_start_seconds=30)
    assert cli_backtest._with_standby(_args(), short).warm_start_seconds == 30.0
    with pytest.raises(cli_backtest.CliError, match="warm-start"):
        cli_backtest._with_standby(_args("--warm-start-seconds", "300"), CONFIG)
