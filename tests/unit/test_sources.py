"""Engine profiles render to the PromQL we expect; garbage reads as unavailable, not zero."""

from __future__ import annotations

import math

import pytest

from prescaler.sources import PROFILES, Snapshot, render_queries
from prescaler.sources._prometheus import _classify, _instant_value


def test_vllm_profile_with_a_selector() -> None:
    q = render_queries("vllm", selector='namespace="serving",model_name="llama"', quantile=0.95)
    assert q.requests_per_second == (
        'sum(rate(vllm:request_success_total{namespace="serving",model_name="llama"}[2m]))'
    )
    assert q.waiting == 'sum(vllm:num_requests_waiting{namespace="serving",model_name="llama"})'
    assert q.context_tokens.startswith("histogram_quantile(0.95, sum by (le) (rate(")
    assert "$" not in "".join(text for _, text in q.items())


def test_empty_selector_renders_without_braces() -> None:
    q = render_queries("vllm")
    assert q.running == "sum(vllm:num_requests_running)"


@pytest.mark.parametrize("engine", sorted(PROFILES))
def test_every_engine_renders_every_query(engine: str) -> None:
    q = render_queries(engine, selector='a="b"', window="5m", quantile=0.9)
    for name, text in q.items():
        assert text, name
        assert "$" not in text
        assert text.count("(") == text.count(")")


def test_overrides_replace_profile_queries_and_follow_the_quantile() -> None:
    q = render_queries(
        "tgi",
        quantile=0.99,
        overrides={
            "requests_per_second": "sum(rate(my_requests[1m]))",
            "context_tokens": "q($quantile)",
        },
    )
    assert q.requests_per_second == "sum(rate(my_requests[1m]))"
    assert q.context_tokens == "q(0.99)"
    assert q.waiting == "sum(tgi_queue_size)"


def test_unknown_engine_and_query_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        render_queries("llamacpp")
    with pytest.raises(ValueError, match="unknown query"):
        render_queries("vllm", overrides={"latency": "x"})


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ([{"metric": {}, "value": [1, "2.5"]}], 2.5),
        (
            [{"metric": {"a": "1"}, "value": [1, "1"]}, {"metric": {"a": "2"}, "value": [1, "2"]}],
            3.0,
        ),
        ([], None),
        ([{"metric": {}, "value": [1, "NaN"]}], None),
        ([{"metric": {}, "value": [1, "+Inf"]}], None),
        ([{"metric": {}, "value": [1, "-1"]}], None),
        ([1, "4"], 4.0),
    ],
)
def test_instant_values(result: list[object], expected: float | None) -> None:
    assert _instant_value(result) == expected  # type: ignore[arg-type]


def test_bad_promql_is_told_apart_from_an_outage() -> None:
    from prometheus_api_client.exceptions import PrometheusApiClientException

    bad = PrometheusApiClientException(
        'HTTP Status Code 400 (b\'{"status":"error","errorType":"bad_data",'
        '"error":"parse error"}\')'
    )
    assert type(_classify("requests_per_second", "sum(", bad)).__name__ == "PromQLError"
    down = PrometheusApiClientException("HTTP Status Code 503 (b'unavailable')")
    assert type(_classify("requests_per_second", "x", down)).__name__ == "MetricsUnavailable"


def test_snapshot_mean_tokens_need_traffic() -> None:
    s = Snapshot(
        at=0, requests_per_second=2, prompt_tokens_per_second=1200, output_tokens_per_second=300
    )
    assert s.mean_tokens() == (600, 150)
    assert s.tokens_per_second == 1500
    idle = Snapshot(
        at=0, requests_per_second=0, prompt_tokens_per_second=0, output_tokens_per_second=0
    )
    assert idle.mean_tokens() == (None, None)
    assert not Snapshot(at=0).available
    assert math.isclose(s.requests_per_second or 0, 2)


def test_a_role_plans_on_its_token_rate_and_reads_its_own_series() -> None:
    q = render_queries(
        "vllm",
        selector='namespace="serving",role="prefill"',
        demand="prompt_tokens_per_second",
        overrides={"waiting": "sum(my_queue$sel)"},
    )
    assert q.demand_query == q.prompt_tokens_per_second
    assert q.demand_at(60) == (
        'sum(rate(vllm:prompt_tokens_total{namespace="serving",role="prefill"}[60s]))'
    )
    assert q.waiting == 'sum(my_queue{namespace="serving",role="prefill"})'
    snapshot = Snapshot(
        at=0, requests_per_second=2.0, prompt_tokens_per_second=9000.0,
        output_tokens_per_second=300.0, demand_name=q.demand,
    )  # fmt: skip
    assert snapshot.demand == 9000.0
    assert snapshot.available
    assert snapshot.mean_tokens() == (4500.0, 150.0)
    assert not Snapshot(at=0, requests_per_second=2.0, demand_name=q.demand).available
