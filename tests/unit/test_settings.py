"""Operator settings: environment variables, flags and their checks."""

from __future__ import annotations

import argparse

import pytest

from prescaler.cli import run as run_cli
from prescaler.cli._common import CliError
from prescaler.settings import LeaderSettings, OperatorSettings, from_env


def test_leader_election_is_off_by_default_and_read_from_the_environment() -> None:
    assert not from_env({}).leader.enabled
    settings = from_env(
        {
            "PRESCALER_LEADER_ENABLED": "true",
            "PRESCALER_LEADER_LEASE_NAME": "prescaler-ops",
            "PRESCALER_LEADER_NAMESPACE": "ops",
            "PRESCALER_LEADER_IDENTITY": "prescaler-7d9-x2",
            "PRESCALER_LEADER_LEASE_DURATION_SECONDS": "20",
        }
    )
    assert settings.leader == LeaderSettings(
        enabled=True,
        lease_name="prescaler-ops",
        namespace="ops",
        identity="prescaler-7d9-x2",
        lease_duration_seconds=20.0,
    )
    assert not from_env({"PRESCALER_LEADER_ENABLED": "false"}).leader.enabled


def test_a_garbage_boolean_names_its_variable() -> None:
    with pytest.raises(ValueError, match="PRESCALER_LEADER_ENABLED"):
        from_env({"PRESCALER_LEADER_ENABLED": "maybe"})


@pytest.mark.parametrize(
    ("leader", "message"),
    [
        (LeaderSettings(lease_duration_seconds=10, renew_deadline_seconds=10), "lease duration"),
        (LeaderSettings(renew_deadline_seconds=2, retry_period_seconds=2), "renew deadline"),
        (LeaderSettings(retry_period_seconds=0), "retry period"),
        (LeaderSettings(enabled=True, lease_name=""), "lease name"),
    ],
)
def test_lease_timings_that_could_let_two_leaders_act_are_refused(
    leader: LeaderSettings, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorSettings(leader=leader)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_run_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESCALER_LEADER_LEASE_NAME", "from-env")
    settings = run_cli.settings_from_args(
        _args("--leader-election", "--leader-namespace", "ops", "--leader-identity", "a")
    )
    assert settings.leader.enabled
    assert settings.leader.lease_name == "from-env"
    assert (settings.leader.namespace, settings.leader.identity) == ("ops", "a")
    assert not run_cli.settings_from_args(_args()).leader.enabled


def test_bad_settings_are_a_cli_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRESCALER_LEADER_RETRY_PERIOD_SECONDS", "9")
    with pytest.raises(CliError, match="renew deadline"):
        run_cli.settings_from_args(_args("--leader-election"))


def test_prewarm_settings_come_from_the_environment_and_are_checked() -> None:
    settings = from_env(
        {"PRESCALER_PREWARM_ENABLED": "false", "PRESCALER_PREWARM_CONCURRENCY": "4"}
    )
    assert (settings.prewarm.enabled, settings.prewarm.concurrency) == (False, 4)
    assert from_env({}).prewarm.enabled
    with pytest.raises(ValueError, match="prewarm concurrency"):
        from_env({"PRESCALER_PREWARM_CONCURRENCY": "0"})
