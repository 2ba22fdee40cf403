"""Operator settings: environment variables, flags and their checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from prescaler.cli import run as run_cli
from prescaler.cli._common import CliError
from prescaler.controller.fits import FitProcesses
from prescaler.controller.runtime import Runtime
from prescaler.settings import (
    LeaderSettings,
    OperatorSettings,
    ReconcileSettings,
    ScalerSettings,
    from_env,
)


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


def test_forecast_timeouts_come_from_the_environment_or_flags_and_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = ReconcileSettings()
    unset = from_env({}).reconcile
    assert unset.forecast_model_timeout_seconds == defaults.forecast_model_timeout_seconds
    assert unset.forecast_fit_timeout_seconds == defaults.forecast_fit_timeout_seconds
    env = {
        "PRESCALER_RECONCILE_FORECAST_MODEL_TIMEOUT_SECONDS": "4",
        "PRESCALER_RECONCILE_FORECAST_FIT_TIMEOUT_SECONDS": "90",
    }
    read = from_env(env).reconcile
    assert (read.forecast_model_timeout_seconds, read.forecast_fit_timeout_seconds) == (4, 90)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    flags = run_cli.settings_from_args(
        _args("--forecast-model-timeout", "3", "--forecast-fit-timeout", "45")
    ).reconcile
    assert (flags.forecast_model_timeout_seconds, flags.forecast_fit_timeout_seconds) == (3, 45)
    with pytest.raises(ValueError, match="forecast fit timeout"):
        from_env({"PRESCALER_RECONCILE_FORECAST_FIT_TIMEOUT_SECONDS": "0"})
    with pytest.raises(ValueError, match="forecast model timeout"):
        from_env({"PRESCALER_RECONCILE_FORECAST_MODEL_TIMEOUT_SECONDS": "-1"})
    with pytest.raises(SystemExit):
        _args("--forecast-fit-timeout", "0")


KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_the_forecast_settings_reach_the_forecast_hub(tmp_path: Path, workers: int) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    reconcile = ReconcileSettings(
        kubeconfig=str(kubeconfig),
        forecast_workers=workers,
        forecast_wait_seconds=1.5,
        forecast_model_timeout_seconds=4.0,
        forecast_fit_timeout_seconds=90.0,
    )
    runtime = Runtime.build(OperatorSettings(reconcile=reconcile))
    try:
        hub = runtime.reconciler.forecasts
        assert (hub.wait_seconds, hub.model_timeout_seconds) == (1.5, 4.0)
        assert hub.fit_timeout_seconds == 90.0
        assert hub.fit_workers == max(1, workers)
        assert hub.fit_processes is runtime.fit_pool
        if workers:
            assert isinstance(runtime.fit_pool, FitProcesses)
            assert runtime.fit_pool.workers == workers
        else:
            assert runtime.fit_pool is None  # fits run in a thread
    finally:
        runtime.close()


def test_the_keda_scaler_is_off_unless_a_port_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli.settings_from_args(_args()).scaler.port == 0
    monkeypatch.setenv("PRESCALER_SCALER_STALE_PERIODS", "10")
    settings = run_cli.settings_from_args(
        _args(
            "--scaler-port",
            "9090",
            "--scaler-host",
            "127.0.0.1",
            "--scaler-tls-cert",
            "c.pem",
            "--scaler-tls-key",
            "k.pem",
            "--scaler-tls-ca",
            "ca.pem",
        )
    )
    scaler = settings.scaler
    assert (scaler.port, scaler.host, scaler.stale_periods) == (9090, "127.0.0.1", 10)
    assert (scaler.tls_cert, scaler.tls_key, scaler.tls_ca) == ("c.pem", "k.pem", "ca.pem")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--scaler-port", "70000"], "scaler port"),
        (["--scaler-port", "9090", "--scaler-tls-cert", "c.pem"], "certificate and its key"),
        (["--scaler-port", "9090", "--scaler-tls-ca", "ca.pem"], "needs a certificate"),
    ],
)
def test_bad_scaler_flags_are_cli_errors(argv: list[str], words: str) -> None:
    with pytest.raises(CliError, match=words):
        run_cli.settings_from_args(_args(*argv))


def test_the_scaler_limits_are_settings_with_their_checks() -> None:
    scaler = from_env(
        {
            "PRESCALER_SCALER_MAX_CONCURRENT_RPCS": "64",
            "PRESCALER_SCALER_MAX_STREAMS": "16",
            "PRESCALER_SCALER_STREAM_MAX_SECONDS": "120",
            "PRESCALER_SCALER_MAX_MESSAGE_BYTES": "8192",
            "PRESCALER_SCALER_NOT_FOUND_SECONDS": "30",
            "PRESCALER_SCALER_UNKNOWN_READS": "1",
            "PRESCALER_SCALER_UNKNOWN_QUEUE": "8",
            "PRESCALER_SCALER_REMEMBERED_POOLS": "100",
        }
    ).scaler
    assert (scaler.max_concurrent_rpcs, scaler.max_streams, scaler.stream_max_seconds) == (
        64,
        16,
        120.0,
    )
    assert (scaler.max_message_bytes, scaler.not_found_seconds) == (8192, 30.0)
    assert (scaler.unknown_reads, scaler.unknown_queue, scaler.remembered_pools) == (1, 8, 100)
    for wrong, message in (
        ({"max_streams": 512}, "exceed its max streams"),
        ({"unknown_queue": 0}, "unknown queue"),
        ({"max_message_bytes": 0}, "max message bytes"),
        ({"stream_max_seconds": 0}, "stream lifetime"),
    ):
        with pytest.raises(ValueError, match=message):
            OperatorSettings(scaler=ScalerSettings(**wrong))
