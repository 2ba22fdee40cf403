"""End-to-end backtests: the CLI on pieces of the real traces, and the no-peeking guarantee."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from prescaler.backtest import Demand, FleetConfig, PredictivePolicy, simulate
from prescaler.capacity import CapacityModel, TokenProfile
from prescaler.cli import main
from prescaler.planning import ScalingPolicy

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
SERVEGEN = TRACES / "servegen_m_small" / "language__m-small_aggregate_rate_10min.csv"
SERVEGEN_PDF = TRACES / "servegen_m_small" / "language__m-small_input_tokens_pdf.csv.gz"
AZURE_CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
NAB = TRACES / "nab_nyc_taxi" / "nyc_taxi.csv"

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")

KEYS = {"shortfall_minutes", "unserved_token_fraction", "gpu_hours", "scale_events"}


def _head(src: Path, dst: Path, lines: int) -> Path:
    with src.open() as fh:
        dst.write_text("".join(itertools.islice(fh, lines)))
    return dst


def _run(tmp_path: Path, *args: str) -> tuple[dict[str, object], pd.DataFrame]:
    out_json, out_csv = tmp_path / "out.json", tmp_path / "out.csv"
    code = main(
        [
            "backtest",
            *args,
            "--json",
            str(out_json),
            "--timeline",
            str(out_csv),
            "--replica-tokens-per-second",
            "20000",
            "--quiet",
        ]
    )
    assert code == 0
    return json.loads(out_json.read_text()), pd.read_csv(out_csv)


def _check_contract(body: dict[str, object], tl: pd.DataFrame, policies: list[str]) -> None:
    assert list(tl.columns[:3]) == ["minute", "demand_tokens_per_s", "replica_tokens_per_s"]
    assert list(tl.columns[3:]) == [f"{p}_{c}" for p in policies for c in ("ready", "desired")]
    per_policy = body["policies"]
    assert isinstance(per_policy, dict)
    assert list(per_policy) == policies
    for name in policies:
        assert set(per_policy[name]) >= KEYS
        short = (tl[f"{name}_ready"] * tl["replica_tokens_per_s"] < tl["demand_tokens_per_s"]).sum()
        assert per_policy[name]["shortfall_minutes"] == short
        assert (tl[f"{name}_ready"] <= tl[f"{name}_desired"]).all()
    if "predictive" in per_policy:
        # What drove its decisions: each rule's share of the decisions and the GPU-hours.
        drivers = body["drivers"]["predictive"]  # type: ignore[index]
        assert sum(d["decision_share"] for d in drivers.values()) == pytest.approx(1, abs=1e-3)
        assert sum(d["gpu_hour_share"] for d in drivers.values()) == pytest.approx(1, abs=1e-3)
        assert "forecast" in drivers
    if "oracle" in per_policy:
        assert per_policy["oracle"]["shortfall_minutes"] == 0
        for name in policies:
            assert per_policy[name]["gpu_hours"] >= per_policy["oracle"]["gpu_hours"] - 1e-9


@needs_traces
def test_cli_servegen_two_days_with_plots(tmp_path: Path) -> None:
    piece = _head(SERVEGEN, tmp_path / "sg.csv", 1 + 2 * 144)
    plot = tmp_path / "plot.png"
    body, tl = _run(
        tmp_path,
        "--trace",
        str(piece),
        "--format",
        "servegen",
        "--cold-start-seconds",
        "240",
        "--token-mix",
        str(SERVEGEN_PDF),
        "--scale-to-peak-replicas",
        "20",
        "--policies",
        "reactive,predictive,oracle",
        "--forecast-model",
        "seasonal_naive",
        "--plot",
        str(plot),
    )
    assert len(tl) == 2 * 1440
    _check_contract(body, tl, ["reactive", "predictive", "oracle"])
    # Scaled so the peak minute needs exactly 20 replicas.
    assert np.ceil(tl["demand_tokens_per_s"].max() / 20000 - 1e-9) == 20
    for p in (plot, tmp_path / "plot-zoom.png", tmp_path / "plot-bars.png"):
        assert p.stat().st_size > 10_000


@needs_traces
def test_cli_azure_and_nab_pieces(tmp_path: Path) -> None:
    piece = _head(AZURE_CONV, tmp_path / "az.csv", 3001)
    body, tl = _run(
        tmp_path,
        "--trace",
        str(piece),
        "--format",
        "azure",
        "--cold-start-seconds",
        "480",
        "--policies",
        "oracle,reactive",
        "--scale-to-peak-replicas",
        "10",
    )
    _check_contract(body, tl, ["oracle", "reactive"])
    piece = _head(NAB, tmp_path / "nab.csv", 1 + 48 * 3)
    body, tl = _run(
        tmp_path,
        "--trace",
        str(piece),
        "--format",
        "nab",
        "--cold-start-seconds",
        "240",
        "--prompt-tokens",
        "500",
        "--output-tokens",
        "100",
        "--policies",
        "reactive,oracle",
        "--scale-to-peak-replicas",
        "8",
    )
    _check_contract(body, tl, ["reactive", "oracle"])
    assert len(tl) == 3 * 1440


def test_cli_schedule_only_and_rate(tmp_path: Path) -> None:
    times = 1_704_067_200 + 60 * np.arange(240)
    rps = np.where((times // 3600) % 2 == 0, 10.0, 50.0)
    pd.DataFrame({"timestamp": times, "requests_per_second": rps}).to_csv(
        tmp_path / "rate.csv", index=False
    )
    body, tl = _run(
        tmp_path,
        "--trace",
        str(tmp_path / "rate.csv"),
        "--format",
        "rate",
        "--cold-start-seconds",
        "240",
        "--prompt-tokens",
        "900",
        "--output-tokens",
        "100",
        "--policies",
        "schedule-only,oracle",
        "--window",
        "name=odd,cron=0 1-23/2 * * *,duration=3600,replicas=3,lead=300",
    )
    _check_contract(body, tl, ["schedule-only", "oracle"])
    # Odd hours need 50 * 1000 / 20000 = 2.5 -> 3 replicas; the window gives exactly 3.
    odd = tl["minute"].between(60, 119)
    assert (tl.loc[odd, "schedule-only_ready"] == 3).all()
    assert body["policies"]["schedule-only"]["shortfall_minutes"] == 0  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "parquet"], "invalid choice"),
        (["--policies", "reactive,magic"], "unknown policy"),
    ],
)
def test_cli_argument_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    base = {"--trace": str(tmp_path / "x.csv"), "--format": "rate", "--cold-start-seconds": "1"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["backtest", *itertools.chain.from_iterable(base.items())]
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_cli_trace_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.csv").write_text("timestamp,requests_per_second\n60,1\n0,2\n")
    code = main(
        [
            "backtest",
            "--trace",
            str(tmp_path / "x.csv"),
            "--format",
            "rate",
            "--cold-start-seconds",
            "240",
            "--prompt-tokens",
            "1",
            "--output-tokens",
            "1",
            "--replica-tokens-per-second",
            "100",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "not sorted" in err
    assert err.count("\n") == 1


# --------------------------------------------------------------------------- no peeking


def _daily(days: int, seed: int) -> np.ndarray:
    minutes = np.arange(days * 1440)
    rng = np.random.default_rng(seed)
    base = 20_000 + 12_000 * np.sin(2 * np.pi * minutes / 1440)
    return np.asarray(base * rng.lognormal(0, 0.05, size=len(minutes)), dtype=float)


@pytest.mark.parametrize("model", ["seasonal_naive", "prophet"])
def test_predictive_cannot_see_the_future(model: str) -> None:
    """Two traces equal up to minute T and different after: decisions up to T are equal."""
    from prescaler_forecast import ForecastService

    cut = 2 * 1440 + 600
    a = _daily(3, seed=1)
    b = a.copy()
    b[cut:] *= 3.0  # a surge right after T
    cfg = FleetConfig(replica_tokens_per_second=2000.0, cold_start_seconds=240.0, max_replicas=100)
    runs = []
    for tokens in (a, b):
        demand = Demand(
            start=1_704_067_200.0,
            tokens_per_s=tokens,
            observed_requests_per_s=tokens / 100.0,
            prompt_tokens=90.0,
            output_tokens=10.0,
        )
        policy = PredictivePolicy(
            forecaster=ForecastService(
                model=model, refit_seconds=3600.0, horizon_seconds=1800.0, step_seconds=600.0
            ),
            capacity=CapacityModel(TokenProfile(90.0, 10.0), tokens_per_second=2000.0),
            policy=ScalingPolicy(min_replicas=1, max_replicas=100),
            cold_start_seconds=240.0,
        )
        runs.append(simulate(demand, policy, cfg, until_minute=cut + 30))
    spm = cfg.steps_per_minute
    # Decisions up to T (and 30 s past it, the metric lag) are identical ...
    upto = cut * spm + 2
    np.testing.assert_array_equal(
        runs[0].existing_per_step[:upto], runs[1].existing_per_step[:upto]
    )
    # ... and the surge is visible soon after: the runs do diverge.
    assert runs[1].existing_per_step[-1] > runs[0].existing_per_step[-1]


@needs_traces
def test_cli_azure_disaggregated_against_the_unified_pool(tmp_path: Path) -> None:
    """Both roles of the conversation trace's first ~3000 requests (10x slower), decode on
    the KV cache of Llama-3.1-8B, next to the unified pool that time-shares them."""
    piece = _head(AZURE_CONV, tmp_path / "az.csv", 3001)
    args = [
        "--trace", str(piece), "--format", "azure", "--time-scale", "10",
        "--cold-start-seconds", "240", "--policies", "reactive,predictive,oracle",
        "--scale-to-peak-replicas", "10", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80",
        "--score-span", "name=late,start=2023-11-16T19:00,end=2023-11-17T00:00",
    ]  # fmt: skip
    policies = ["reactive", "predictive", "oracle"]
    plain, plain_tl = _run(tmp_path, *args)
    body, tl = _run(tmp_path, *args, "--disaggregated")

    # The unified pool is the run without the flag: the brief's JSON and columns, unchanged
    # (with equal role throughputs the time-shared replica is the unified one).
    unified_columns = list(plain_tl.columns)
    _check_contract(plain, plain_tl, policies)
    pd.testing.assert_frame_equal(tl[unified_columns], plain_tl)
    for key in ("policies", "spans", "replica_tokens_per_s", "max_replicas", "ratios"):
        assert body[key] == plain[key]
    d: dict[str, Any] = body["disaggregated"]  # type: ignore[assignment]
    assert d["unified_tokens_per_second"] == 20000

    # Each role replays its own tokens: together, the unified demand.
    np.testing.assert_allclose(
        tl["prefill_demand_tokens_per_s"] + tl["decode_demand_tokens_per_s"],
        tl["demand_tokens_per_s"],
    )
    roles = d["roles"]
    assert (roles["prefill"]["unit"], roles["decode"]["unit"]) == ("prompt tok/s", "output tok/s")
    assert roles["prefill"]["capacity_constraint"] == "compute"
    assert roles["decode"]["capacity_constraint"] == "memory"  # the KV cache, not 20000 tok/s
    assert roles["decode"]["replica_tokens_per_s"] < 20000
    for role in ("prefill", "decode"):
        own = roles[role]["policies"]
        cap = tl[f"{role}_replica_tokens_per_s"]
        for name in policies:
            ready = tl[f"{role}_{name}_ready"]
            short = ready * cap < tl[f"{role}_demand_tokens_per_s"]
            assert own[name]["shortfall_minutes"] == short.sum()
            assert (ready <= tl[f"{role}_{name}_desired"]).all()
        assert own["oracle"]["shortfall_minutes"] == 0

    # Both roles as one fleet, against the unified pool.
    for name in policies:
        both = d["policies"][name]
        per_role = [roles[r]["policies"][name] for r in ("prefill", "decode")]
        assert both["gpu_hours"] == pytest.approx(sum(p["gpu_hours"] for p in per_role))
        assert max(p["shortfall_minutes"] for p in per_role) <= both["shortfall_minutes"]
        assert both["shortfall_minutes"] <= sum(p["shortfall_minutes"] for p in per_role)
        fractions = [p["unserved_token_fraction"] for p in per_role]
        assert min(fractions) <= both["unserved_token_fraction"] <= max(fractions)
        unified = body["policies"][name]  # type: ignore[index]
        assert both["gpu_hours_over_unified"] == pytest.approx(
            both["gpu_hours"] / unified["gpu_hours"]
        )
        assert set(d["spans"]["late"][name]) == KEYS
    # Decode is bound by its KV cache: even with perfect foresight the pair needs more GPUs
    # than unified replicas, which compute prompts beside their decodes.
    assert d["policies"]["oracle"]["gpu_hours_over_unified"] > 1
