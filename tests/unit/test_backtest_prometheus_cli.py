"""``prescaler backtest --prometheus``: the flags, the pool, its HPA, its cold start and the
credentials, checked without a Prometheus; and the library entry point on a spec alone."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from prescaler.api import parse_spec
from prescaler.backtest import (
    HPA_TARGET,
    backtest,
    check_policies,
    demand_from_trace,
    pool_capacity,
    pool_fleet,
)
from prescaler.backtest.traces import Trace
from prescaler.cli import backtest as cli_backtest
from prescaler.cli import main
from prescaler.cli._common import CliError
from prescaler.cli._prometheus_backtest import (
    _check_flags,
    _cold_start,
    _credentials,
    _Pool,
    _pool_from_file,
    _reactive_target,
    hpa_of,
    hpa_utilization,
)
from prescaler.sources import DemandHistory, secret_credentials
from prescaler.sources._prometheus import SERVICE_ACCOUNT_TOKEN as SA_TOKEN

SPEC = {
    "target": {"kind": "Deployment", "name": "llm"},
    "minReplicas": 2,
    "maxReplicas": 30,
    "model": {"tokensPerSecond": 20000},
    "coldStart": {"seconds": 240},
    "forecast": {"prometheus": {"url": "http://prometheus:9090"}},
}


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_backtest.register(parser.add_subparsers())
    return parser.parse_args(["backtest", "--prometheus", "http://p:9090", *extra])


def _hpa(name: str, metrics: list[dict[str, Any]], target: str = "llm") -> dict[str, Any]:
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}
    spec = {"scaleTargetRef": ref, "metrics": metrics}
    return {"kind": "HorizontalPodAutoscaler", "metadata": {"name": name}, "spec": spec}


def _resource(percent: int) -> dict[str, Any]:
    target = {"type": "Utilization", "averageUtilization": percent}
    return {"type": "Resource", "resource": {"name": "cpu", "target": target}}


def _pods(value: str) -> dict[str, Any]:
    target = {"type": "AverageValue", "averageValue": value}
    return {"type": "Pods", "pods": {"metric": {"name": "load"}, "target": target}}


# --------------------------------------------------------------------------- flags


def test_a_trace_or_a_prometheus_not_both_nor_neither() -> None:
    parser = argparse.ArgumentParser()
    cli_backtest.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["backtest", "--trace", "x.csv", "--prometheus", "http://p"])
    with pytest.raises(SystemExit):
        parser.parse_args(["backtest", "--format", "rate"])
    # --prometheus alone: the pool's own URL.
    assert _args().prometheus == "http://p:9090"
    assert parser.parse_args(["backtest", "--prometheus", "--pool", "a/b"]).prometheus == ""


def test_a_prometheus_replay_needs_a_pool_and_refuses_trace_flags() -> None:
    with pytest.raises(CliError, match="--pool NAMESPACE/NAME or --pool-file"):
        _check_flags(_args())
    with pytest.raises(CliError, match="--format, --prompt-tokens describe a trace"):
        _check_flags(_args("--pool", "a/b", "--format", "rate", "--prompt-tokens", "9"))
    with pytest.raises(CliError, match="--window"):
        _check_flags(_args("--pool", "a/b", "--window", "name=w,cron=0 9 * * *,duration=60"))
    _check_flags(_args("--pool", "a/b", "--days", "3", "--hpa-target", "0.5"))


def test_a_trace_replay_still_needs_its_format_and_cold_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,requests_per_second\n0,1\n60,2\n")
    assert main(["backtest", "--trace", str(trace), "--cold-start-seconds", "60"]) == 2
    assert "--trace: give its --format" in capsys.readouterr().err
    assert main(["backtest", "--trace", str(trace), "--format", "rate"]) == 2
    assert "--trace: give --cold-start-seconds" in capsys.readouterr().err


def test_the_pool_file_holds_one_pool_and_maybe_its_hpa(tmp_path: Path) -> None:
    pool = {"kind": "InferencePool", "metadata": {"name": "llm"}, "spec": SPEC}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump_all([pool, _hpa("llm", [_resource(60)])]))
    loaded = _pool_from_file(path)
    assert loaded.obj["spec"] == SPEC
    assert [h["metadata"]["name"] for h in loaded.hpas] == ["llm"]
    path.write_text(yaml.safe_dump_all([pool, pool]))
    with pytest.raises(CliError, match="expected one InferencePool"):
        _pool_from_file(path)
    path.write_text("kind: [")
    with pytest.raises(CliError, match="--pool-file"):
        _pool_from_file(path)


# --------------------------------------------------------------------------- the HPA


def test_the_hpa_target_as_a_share_of_a_replicas_capacity() -> None:
    assert hpa_utilization(_hpa("a", [_resource(60)]))[0] == pytest.approx(0.6)
    assert hpa_utilization(_hpa("a", [_pods("800m")]))[0] == pytest.approx(0.8)
    # Several metrics: the HPA follows the one asking for most replicas.
    assert hpa_utilization(_hpa("a", [_resource(80), _pods("0.5")]))[0] == pytest.approx(0.5)
    share, why = hpa_utilization(_hpa("a", [_pods("20")]))
    assert share is None
    assert "load target 20" in why
    assert hpa_utilization(_hpa("a", []))[0] is None


def test_the_pools_hpa_is_the_one_scaling_its_target() -> None:
    spec = parse_spec(SPEC)
    other, ours = _hpa("other", [_resource(50)], target="x"), _hpa("mine", [_resource(60)])
    assert hpa_of(spec, [other, ours]) is ours
    assert hpa_of(spec, [other]) is None
    floor = parse_spec(
        {**SPEC, "mode": "hpaFloor", "target": {"kind": "HorizontalPodAutoscaler", "name": "h"}}
    )
    target = _hpa("h", [_resource(70)])
    assert hpa_of(floor, [ours, target]) is target


def test_the_reactive_target_from_the_flag_the_hpa_or_the_default() -> None:
    spec = parse_spec(SPEC)
    pool = _Pool("ns/llm", {"spec": SPEC}, [_hpa("llm", [_resource(60)])])
    assert _reactive_target(_args(), spec, pool)["target"] == pytest.approx(0.6)
    assert _reactive_target(_args("--hpa-target", "0.9"), spec, pool)["target"] == 0.9
    bare = _Pool("ns/llm", {"spec": SPEC}, [])
    assert _reactive_target(_args(), spec, bare) == {
        "target": HPA_TARGET,
        "source": "default (the pool has no HPA)",
    }
    unusable = _Pool("ns/llm", {"spec": SPEC}, [_hpa("llm", [_pods("20")])])
    assert _reactive_target(_args(), spec, unusable)["target"] == HPA_TARGET


# --------------------------------------------------------------------------- cold start, auth


def test_the_cold_start_is_the_flag_then_the_measured_one_then_the_specs() -> None:
    spec = parse_spec(SPEC)
    measured = {"spec": SPEC, "status": {"coldStart": {"seconds": 312.5, "source": "measured"}}}
    assumed = {"spec": SPEC, "status": {"coldStart": {"seconds": 240, "source": "assumed"}}}
    assert _cold_start(_args(), spec, _Pool("p", measured, []))["seconds"] == 312.5
    assert _cold_start(_args(), spec, _Pool("p", assumed, []))["source"] == (
        "spec.coldStart.seconds"
    )
    flagged = _cold_start(_args("--cold-start-seconds", "90"), spec, _Pool("p", measured, []))
    assert flagged == {"seconds": 90.0, "source": "--cold-start-seconds"}


def test_credentials_come_from_one_flag_else_the_pools_secret() -> None:
    raw = {**SPEC, "forecast": {"prometheus": {"url": "http://p", "authSecretRef": {"name": "s"}}}}
    spec = parse_spec(raw)
    secrets = {"s": ({"username": "u", "password": "p:w"}, "Opaque")}
    pool = _Pool("ns/llm", {"spec": raw}, [], secrets=secrets.__getitem__)
    assert _credentials(_args(), spec, pool) == ({}, ("u", "p:w"), "Secret s")
    assert _credentials(_args("--token", " t "), spec, pool)[0] == {"Authorization": "Bearer t"}
    assert _credentials(_args("--basic-auth", "a:b:c"), spec, pool)[1] == ("a", "b:c")
    with pytest.raises(CliError, match="USER:PASSWORD"):
        _credentials(_args("--basic-auth", "nobody"), spec, pool)
    with pytest.raises(CliError, match="one of --token"):
        _credentials(_args("--token", "t", "--basic-auth", "a:b"), spec, pool)
    offline = _Pool("file", {"spec": raw}, [])
    assert _credentials(_args(), spec, offline) == ({}, None, "none")
    assert "Secret s" in (offline.notes or [""])[0]
    with pytest.raises(ValueError, match="needs key token"):
        secret_credentials("s", {"user": "x"})
    robot = _Pool("ns/llm", {"spec": raw}, [], secrets=lambda _: ({"token": "t"}, SA_TOKEN))
    with pytest.raises(CliError, match="ServiceAccount token"):
        _credentials(_args(), spec, robot)
    with pytest.raises(CliError, match="control character") as refused:
        _credentials(_args("--token", "abc\r\ndef"), spec, pool)
    assert "abc" not in str(refused.value)


# --------------------------------------------------------------------------- the history


def test_history_gaps_are_marked_not_zeros() -> None:
    nan = np.nan
    history = DemandHistory(
        start=600.0,
        step_seconds=60.0,
        requests_per_second=np.array([2.0, nan, nan, 4.0, 0.0, nan]),
        prompt_tokens_per_second=np.array([200.0, nan, nan, nan, 0.0, nan]),
        output_tokens_per_second=np.array([20.0, nan, nan, 40.0, 0.0, nan]),
    )
    assert history.gaps() == [(660.0, 780.0), (900.0, 960.0)]
    assert history.gap_steps == 3
    assert history.token_gap_steps == 1
    prompt, output = history.tokens_per_request()
    np.testing.assert_array_equal(prompt, [100.0, nan, nan, nan, nan, nan])
    np.testing.assert_array_equal(output, [10.0, nan, nan, 10.0, nan, nan])


# --------------------------------------------------------------------------- the library


def test_the_library_replays_a_pool_from_its_spec_alone() -> None:
    spec = parse_spec(SPEC)
    rps = 20 + 10 * np.sin(np.arange(240) / 30.0)
    trace = Trace(start=1_700_000_040.0, step_seconds=60.0, rps=rps)
    demand = demand_from_trace(trace, prompt_tokens=600, output_tokens=150)
    capacity = pool_capacity(spec, demand)
    config = pool_fleet(spec, capacity)
    assert (config.min_replicas, config.max_replicas, config.cold_start_seconds) == (2, 30, 240)
    assert config.replica_tokens_per_second == capacity.replica_tokens_per_second
    result = backtest(spec, demand, ["reactive", "oracle"])
    assert list(result.result.scores) == ["reactive", "oracle"]
    assert result.result.config == config
    assert result.result.scores["oracle"].shortfall_minutes == 0
    assert result.settings_json() == {"hpa_target": HPA_TARGET}
    with pytest.raises(ValueError, match="unknown policy"):
        check_policies(["reactive", "hpa"])
    with pytest.raises(ValueError, match="listed twice"):
        check_policies(["oracle", "oracle"])
