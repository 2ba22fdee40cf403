"""``prescaler backtest --prometheus``: a pool's own history, read from a real Prometheus.

Two days of a vLLM fleet's counters are backfilled (scrapes every 15 s, 7 s into each
minute, as a real scrape is not aligned with the minute). The same per-minute request rate
is also written as a ``rate`` trace. The Prometheus replay of the pool must agree with the
trace replay of that series within the resampling error. Reading ``rate(x[60s])`` at the
end of each minute sees four scrapes of that minute only, so for a rate that is constant
within each minute the resampling error is float rounding: every per-minute demand agrees
to 1e-9 (relative), and so every policy's scores (the same replica counts, GPU-hours and
unserved tokens to 1e-9). A Prometheus that has gaps, answers garbage or has nothing gives
marked gaps or a clear error, never zeros.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from cluster.faultproxy import FaultProxy, Mode
from cluster.prometheus import Prometheus, VllmProfile, vllm_samples
from integration.operator_fixtures import crd_fixture  # noqa: F401 (fixtures)
from prescaler.cli import main

pytestmark = [pytest.mark.prometheus]

MINUTE = 60.0
SCRAPE, OFFSET = 15.0, 7.0
NAMESPACE = "serving"
PROFILE = VllmProfile(prompt_tokens_per_request=600.0, generation_tokens_per_request=150.0)
TOKENS_PER_SECOND = 20_000
COLD_START = 300.0
"""The pool's measured cold start (status.coldStart); its spec says 240."""
HPA_UTILIZATION = 60
COMMON = ["--forecast-model", "seasonal_naive", "--history-days", "1", "--quiet"]
TOLERANCE = 1e-9


def minute_rates(minutes: int, seed: int = 3) -> np.ndarray:
    """A daily cycle with a morning ramp and noise, in requests/s per minute."""
    t = np.arange(minutes, dtype=float)
    day = 1440.0
    base = 120 + 90 * np.sin(2 * np.pi * (t / day - 0.3))
    ramp = np.where((t % day > 540) & (t % day < 600), 150.0, 0.0)
    noise = np.random.default_rng(seed).normal(0, 6, size=minutes)
    return np.asarray(np.clip(base + ramp + noise, 1.0, None), dtype=float)


def backfill(
    prometheus: Prometheus, start: float, rates: np.ndarray, *, nan_from: int | None = None
) -> None:
    """Counters for ``rates[m]`` requests/s over minute ``start + 60 m`` (NaN: no scrape),
    scraped every 15 s from 7 s into the first minute; with ``nan_from``, the 20 minutes
    from that one export NaN (a broken exporter) instead of counts."""
    scrapes = int(len(rates) * MINUTE // SCRAPE)
    times = [start + OFFSET + SCRAPE * i for i in range(scrapes)]
    per_scrape = [float(rates[int((t - start) // MINUTE)]) for t in times]
    samples = vllm_samples(
        times, per_scrape, namespace=NAMESPACE, model_name="llm", profile=PROFILE
    )
    if nan_from is not None:
        lo, hi = start + nan_from * MINUTE, start + (nan_from + 20) * MINUTE
        samples = [replace(s, value=math.nan) if lo <= s.timestamp_s < hi else s for s in samples]
    prometheus.backfill(samples)


def pool_file(path: Path, url: str) -> Path:
    pool = {
        "apiVersion": "prescaler.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "llm", "namespace": NAMESPACE},
        "spec": {
            "target": {"kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 60,
            "model": {"tokensPerSecond": TOKENS_PER_SECOND},
            "coldStart": {"seconds": 240},
            "forecast": {
                "prometheus": {"url": url},
                "selector": f'namespace="{NAMESPACE}"',
            },
        },
        "status": {"coldStart": {"seconds": COLD_START, "source": "measured"}},
    }
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 60,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": HPA_UTILIZATION},
                    },
                }
            ],
        },
    }
    path.write_text(yaml.safe_dump_all([pool, hpa]))
    return path


def replay(tmp_path: Path, tag: str, *args: str) -> tuple[dict[str, Any], pd.DataFrame]:
    out, timeline = tmp_path / f"{tag}.json", tmp_path / f"{tag}.csv"
    code = main(["backtest", *args, *COMMON, "--json", str(out), "--timeline", str(timeline)])
    assert code == 0
    return json.loads(out.read_text()), pd.read_csv(timeline)


@pytest.fixture
def span() -> tuple[float, float]:
    """Two days of minutes, ending on a minute an hour ago."""
    end = math.floor((time.time() - 3600) / MINUTE) * MINUTE
    return end - 2 * 86_400, end


def iso(t: float) -> str:
    return pd.Timestamp(t, unit="s", tz="UTC").isoformat()


def test_prometheus_replay_agrees_with_the_trace_replay_of_the_same_series(
    prometheus: Prometheus, span: tuple[float, float], tmp_path: Path
) -> None:
    start, end = span
    rates = minute_rates(round((end - start) / MINUTE))
    backfill(prometheus, start, rates)
    trace = tmp_path / "rate.csv"
    times = start + MINUTE * np.arange(len(rates))
    pd.DataFrame({"timestamp": times.astype(int), "requests_per_second": rates}).to_csv(
        trace, index=False
    )
    pool = pool_file(tmp_path / "pool.yaml", prometheus.url)

    from_prometheus, prom_tl = replay(
        tmp_path, "prom", "--prometheus", prometheus.url, "--pool-file", str(pool),
        "--days", "1", "--end", iso(end), "--plot", str(tmp_path / "prom.png"),
    )  # fmt: skip
    from_trace, trace_tl = replay(
        tmp_path, "trace", "--trace", str(trace), "--format", "rate",
        "--prompt-tokens", "600", "--output-tokens", "150",
        "--cold-start-seconds", str(COLD_START), "--replica-tokens-per-second",
        str(TOKENS_PER_SECOND), "--min-replicas", "1", "--max-replicas", "60",
        "--hpa-target", str(HPA_UTILIZATION / 100), "--replay-days", "1",
    )  # fmt: skip

    # What the replay stood on: the pool's measured cold start, its HPA's target, no gaps.
    assert from_prometheus["format"] == "prometheus"
    assert from_prometheus["cold_start"]["seconds"] == COLD_START
    assert from_prometheus["cold_start_seconds"] == COLD_START
    assert from_prometheus["hpa"]["target"] == pytest.approx(HPA_UTILIZATION / 100)
    assert from_prometheus["hpa_target"] == pytest.approx(HPA_UTILIZATION / 100)
    history = from_prometheus["history"]
    assert history["gap_minutes"] == 0
    assert history["token_gap_minutes"] == 0
    assert history["start"] == iso(start)
    assert history["end"] == iso(end)
    assert (tmp_path / "prom.png").is_file()
    assert (tmp_path / "prom-bars.png").is_file()

    # The same minutes, the same demand, the same fleet.
    assert from_prometheus["start"] == from_trace["start"]
    assert from_prometheus["minutes"] == from_trace["minutes"] == 1440
    assert list(prom_tl.columns) == list(trace_tl.columns)
    np.testing.assert_allclose(
        prom_tl["demand_tokens_per_s"], trace_tl["demand_tokens_per_s"], rtol=TOLERANCE
    )
    for key in ("mean_prompt_tokens", "mean_output_tokens", "replica_tokens_per_s"):
        assert from_prometheus[key] == pytest.approx(from_trace[key], rel=TOLERANCE), key
    for name in ("reactive", "predictive", "oracle"):
        ours, theirs = from_prometheus["policies"][name], from_trace["policies"][name]
        assert ours["shortfall_minutes"] == theirs["shortfall_minutes"], name
        assert ours["scale_events"] == theirs["scale_events"], name
        assert ours["gpu_hours"] == pytest.approx(theirs["gpu_hours"], rel=TOLERANCE), name
        assert ours["unserved_token_fraction"] == pytest.approx(
            theirs["unserved_token_fraction"], rel=TOLERANCE, abs=TOLERANCE
        ), name
        np.testing.assert_array_equal(prom_tl[f"{name}_ready"], trace_tl[f"{name}_ready"])


def test_gaps_and_garbage_values_are_marked_gaps_never_zeros(
    prometheus: Prometheus, span: tuple[float, float], tmp_path: Path
) -> None:
    start, end = span
    rates = minute_rates(round((end - start) / MINUTE))
    gap_from = len(rates) - 600  # in the replayed day
    rates[gap_from : gap_from + 30] = np.nan  # no scrapes for 30 minutes
    backfill(prometheus, start, rates, nan_from=len(rates) - 300)
    pool = pool_file(tmp_path / "pool.yaml", prometheus.url)

    body, tl = replay(
        tmp_path, "gaps", "--prometheus", prometheus.url, "--pool-file", str(pool),
        "--days", "1", "--end", iso(end), "--policies", "reactive,oracle",
    )  # fmt: skip

    history = body["history"]
    # 30 minutes without scrapes and 20 of NaN counts; the minute at each edge whose rate
    # window holds fewer than two good scrapes is missing too.
    assert 50 <= history["gap_minutes"] <= 54, history
    assert len(history["gaps"]) == 2
    first = pd.Timestamp(history["gaps"][0][0]).timestamp()
    assert abs(first - (start + gap_from * MINUTE)) <= MINUTE
    # The replay's truth is interpolated over the gaps: never a zero demand.
    assert (tl["demand_tokens_per_s"] > 0).all()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "malformed answer from Prometheus"),
        ("http500", "HTTP 500: internal: injected fault"),
        ("vanish", "has no sample of the pool's demand"),
        ("nan", "has no sample of the pool's demand"),
    ],
)
def test_a_prometheus_answering_garbage_is_a_clear_error(
    prometheus: Prometheus,
    span: tuple[float, float],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mode: Mode,
    message: str,
) -> None:
    _start, end = span
    backfill(prometheus, end - 3 * 3600, minute_rates(180))
    pool = pool_file(tmp_path / "pool.yaml", prometheus.url)
    with FaultProxy(prometheus.url) as proxy:
        proxy.set(mode)
        code = main(
            ["backtest", "--prometheus", proxy.url, "--pool-file", str(pool), "--days", "0.1",
             "--end", iso(end), *COMMON]
        )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prescaler backtest: error: --prometheus {proxy.url}: "), err
    assert message in err, err
    assert "Traceback" not in err


def test_a_span_without_history_is_a_clear_error(
    prometheus: Prometheus, span: tuple[float, float], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _, end = span
    pool = pool_file(tmp_path / "pool.yaml", prometheus.url)
    code = main(
        ["backtest", "--prometheus", "--pool-file", str(pool), "--days", "1",
         "--end", iso(end), *COMMON]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "has no sample of the pool's demand" in err
    assert 'vllm:request_success_total{namespace="serving"}' in err


@pytest.mark.cluster
def test_a_pool_read_from_the_cluster_brings_its_cold_start_hpa_and_credentials(
    prometheus: Prometheus,
    span: tuple[float, float],
    tmp_path: Path,
    cluster: Any,
    crd: None,
    kube: Any,
    namespace: str,
) -> None:
    from kubernetes import client

    from prescaler.api import GROUP, PLURAL, VERSION

    _, end = span
    backfill(prometheus, end - 6 * 3600, minute_rates(360))
    manifests = list(
        yaml.safe_load_all(pool_file(tmp_path / "pool.yaml", prometheus.url).read_text())
    )
    pool, hpa = manifests
    pool["metadata"]["namespace"] = hpa["metadata"]["namespace"] = namespace
    pool["spec"]["forecast"]["prometheus"]["authSecretRef"] = {"name": "prom-auth"}
    status = pool.pop("status")
    core: Any = client.CoreV1Api(kube)
    custom: Any = client.CustomObjectsApi(kube)
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "prom-auth"}, "stringData": {"token": "s3cret"}}
    )
    client.AutoscalingV2Api(kube).create_namespaced_horizontal_pod_autoscaler(namespace, hpa)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pool)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "llm", {"status": status}
    )
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump_all([{**pool, "status": status}, hpa]))

    flags = ["--prometheus", prometheus.url, "--days", "0.1", "--end", iso(end)]
    from_cluster, cluster_tl = replay(
        tmp_path, "cluster", *flags, "--pool", f"{namespace}/llm",
        "--kubeconfig", str(cluster.kubeconfig),
    )  # fmt: skip
    from_file, file_tl = replay(
        tmp_path, "file", *flags, "--pool-file", str(tmp_path / "pool.yaml"), "--token", "s3cret"
    )

    assert from_cluster["pool"] == f"{namespace}/llm"
    assert from_cluster["history"]["credentials"] == "Secret prom-auth"
    assert from_cluster["cold_start"]["seconds"] == COLD_START
    assert from_cluster["hpa"]["target"] == pytest.approx(HPA_UTILIZATION / 100)
    assert from_cluster["hpa"]["source"].startswith("HPA llm")
    assert from_cluster["policies"] == from_file["policies"]
    pd.testing.assert_frame_equal(cluster_tl, file_tl)
