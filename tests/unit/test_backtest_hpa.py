"""The backtest's HPA against Kubernetes' own cases.

Each test follows a case of Kubernetes' ``pkg/controller/podautoscaler`` tests
(``replica_calculator_test.go`` or ``horizontal_test.go``), named in a comment. Kubernetes
states a Pods metric as per-pod levels and a target; here a pod's level is its offered load
as a share of one replica's capacity (``CAP``), so a case's ``levels / targetUsage`` become
``load / (ready × CAP × target)``: only the mean of the levels enters the calculation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prescaler.backtest import Demand, FleetConfig, Observation, ReactivePolicy, simulate

CAP = 1000.0  # tokens/s per replica
TARGET = 0.7


def _load(ready: int, ratio: float) -> float:
    """Tokens/s that ``ready`` pods report at ``ratio`` × the target."""
    return ready * CAP * TARGET * ratio


def _obs(
    now: float, ready: int, existing: int, tokens: float, ready_at_metric: int | None = None
) -> Observation:
    return Observation(
        now=now,
        step=0,
        ready=ready,
        existing=existing,
        metric_tokens_per_s=tokens,
        observed=pd.Series(dtype=float),
        ready_at_metric=ready_at_metric,
    )


def _settled(existing: int) -> ReactivePolicy:
    """An HPA that has run for a while at ``existing`` replicas on target; its first
    recommendations are older than the 300 s scale-down window from ``now = 400`` on."""
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100, target=TARGET)
    assert hpa.decide(_obs(0.0, existing, existing, _load(existing, 1.0))) == existing
    return hpa


# ------------------------------------------------------------------ missing metrics at 1.0


def test_pods_without_metrics_at_exactly_the_target_keep_the_count() -> None:
    # TestPlainMetricReplicaCalcMissingMetricsNoChangeEq: 5 replicas, 3 pods report
    # 20000/19000/21000 (mean 20000) against a target of 20000, 2 report nothing -> 5.
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100, target=TARGET)
    assert hpa.recommend(5, 3, _load(3, 1.0), missing=2) == 5
    # TestReplicaCalcMissingMetricsNoChangeEq: 2 replicas, one at 100 % of its request
    # against a 100 % target, the other without metrics -> 2.
    assert hpa.recommend(2, 1, _load(1, 1.0), missing=1) == 2
    # In the replay: two replicas still starting (no metrics) while the three ready ones
    # sit exactly on target. Kubernetes keeps 5; filling the two with 0 scaled to 3.
    settled = _settled(5)
    assert settled.decide(_obs(400.0, 3, 5, _load(3, 1.0))) == 5


# ------------------------------------------------------------------ unready on a scale-down


def test_scale_down_leaves_pending_pods_out() -> None:
    # replica_calculator_test.go, TestReplicaCalcResourceScale "scale down: exclude
    # unscheduled pods": 5 replicas, one running pod at 100m of 1 CPU against a 50 % target
    # (0.2 x the target), four Pending -> 1. groupPods puts a Pending pod in the unready
    # group before it looks for a metric, for a Pods metric as for CPU; on a scale-down
    # calcPlainMetricReplicas leaves the unready group out.
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100, target=TARGET)
    assert hpa.recommend(5, 1, _load(1, 0.2), unready=4) == 1
    # In the replay the four are starting replicas: counted on target they held 5.
    settled = _settled(5)
    assert settled.decide(_obs(400.0, 1, 5, _load(1, 0.2))) == 1


def test_scale_down_counts_running_pods_without_metrics_at_the_target() -> None:
    # TestReplicaCalcDuringRollingUpdateWithMaxSurgeCM: 2 replicas, 3 running pods, two
    # report 10000 against a 17000 target, one reports nothing. The missing pod counts at
    # the target, so ceil(0.725 x 3) = 3 would scale *up* on a scale-down: keep 2.
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100, target=TARGET)
    assert hpa.recommend(2, 2, _load(2, 10000 / 17000), missing=1) == 2
    # The pods of TestReplicaCalcMissingMetricsUnreadyScaleDown under a Pods metric, where
    # readiness is not read (only CPU reads it): 4 replicas, 3 pods at 0.2 x the target,
    # one without metrics at the target -> ceil(0.4 x 4) = 2 (Kubernetes' CPU answer is 3).
    assert hpa.recommend(4, 3, _load(3, 0.2), missing=1) == 2


def test_scale_up_counts_pending_and_missing_pods_at_zero() -> None:
    # TestReplicaCalcResourceScale "scale up: unready pod scales less": 3 replicas, two
    # pods at 500m and 700m of 1 CPU against a 30 % target (2 x the target), the third left
    # out as unready and rebalanced at 0 on a scale-up: ceil(4 / 3 x 3) = 4.
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100, target=TARGET)
    assert hpa.recommend(3, 2, _load(2, 2.0), unready=1) == 4
    # TestReplicaCalcMissingMetricsUnreadyScaleUp: 3 replicas, one pod at 2000m against a
    # 50 % target (4 x the target), one unready, one without metrics: both at 0 -> 4.
    assert hpa.recommend(3, 1, _load(1, 4.0), missing=1, unready=1) == 4
    # Eight starting pods at 0: 2 x 6 / 10 = 1.2 -> 12; 2 x 5 / 10 = 1.0 is inside: keep.
    assert hpa.recommend(10, 2, _load(2, 6.0)) == 12
    assert hpa.recommend(10, 2, _load(2, 5.0)) == 10


def test_no_pod_with_a_metric_keeps_the_count_and_records_nothing() -> None:
    # replica_calculator.go: no metrics for any targeted pod is an error ("did not receive
    # metrics for targeted pods"); the controller then neither scales nor records a
    # recommendation (horizontal.go, reconcileAutoscaler).
    hpa = ReactivePolicy(CAP, min_replicas=0, max_replicas=100, target=TARGET)
    assert hpa.recommend(3, 0, 0.0, unready=3) is None
    assert hpa.decide(_obs(0.0, 0, 3, 5000.0)) == 3


# ------------------------------------------------------------------ tolerance


def test_tolerance_is_inclusive_at_one_plus_the_scale_up_tolerance() -> None:
    # Tolerances.isWithin (Kubernetes 1.33): (1 - down) <= ratio <= (1 + up). A ratio of
    # exactly 1.1 is inside, though |1 - 1.1| = 0.10000000000000009 > 0.1.
    hpa = ReactivePolicy(CAP, min_replicas=1, max_replicas=100, target=TARGET)
    assert hpa.recommend(10, 10, 10 * CAP * 0.77) == 10  # 0.77 / 0.7 == 1.1
    assert hpa.recommend(10, 10, 10 * CAP * 0.63) == 10  # 0.63 / 0.7 == 0.9
    assert hpa.recommend(10, 10, 10 * CAP * 0.78) == 12
    # TestReplicaCalcToleranceCM: 20000/21000/21000 against 20000 (1.033) -> 3.
    assert hpa.recommend(3, 3, _load(3, 62000 / 60000)) == 3


@pytest.mark.parametrize(
    ("case", "down", "up", "ratio", "expected"),
    [
        # TestReplicaCalcConfigurableTolerance
        ("Outside of a 0% tolerance", 0.0, 0.0, 1.01, 4),
        ("Within a 200% scale-up tolerance", 0.1, 2.0, 1.9, 3),
        ("Outside 8% scale-up tolerance (and superfuous scale-down tolerance)", 2.0, 0.08, 1.09, 4),
        ("Within a 36% scale-down tolerance", 0.36, 0.1, 0.65, 3),
        ("Outside a 34% scale-down tolerance", 0.34, 0.1, 0.65, 2),
        # TestReplicaCalcConfigurableToleranceCM: 20000/21000/21000 against 20000.
        ("ConfigurableToleranceCM", 0.1, 0.01, 62000 / 60000, 4),
    ],
)
def test_configurable_tolerances(
    case: str, down: float, up: float, ratio: float, expected: int
) -> None:
    hpa = ReactivePolicy(
        CAP,
        min_replicas=1,
        max_replicas=100,
        target=TARGET,
        scale_up_tolerance=up,
        scale_down_tolerance=down,
    )
    assert hpa.recommend(3, 3, _load(3, ratio)) == expected, case


# ------------------------------------------------------------------ stabilization seed


def test_a_new_hpa_seeds_the_scale_down_window_with_the_current_count() -> None:
    # horizontal_test.go, TestScaleDownStabilizeInitialSize: 5 replicas at 100/300/500/250/
    # 250 m of 1 CPU against 50 % (0.56 x the target) and no recommendation yet -> 5; the
    # first sight of an HPA records the current count (recordInitialRecommendation).
    tokens = _load(5, 0.56)
    hpa = ReactivePolicy(CAP, min_replicas=2, max_replicas=6, target=TARGET)
    assert hpa.recommend(5, 5, tokens) == 3
    assert hpa.decide(_obs(0.0, 5, 5, tokens)) == 5
    assert hpa.decide(_obs(285.0, 5, 5, tokens)) == 5
    # TestScaleDown: the same fleet with a history and no recent higher recommendation -> 3.
    assert hpa.decide(_obs(300.0, 5, 5, tokens)) == 3


# ------------------------------------------------------------------ what the metrics show


def test_pods_ready_after_the_metric_was_taken_have_no_metric() -> None:
    # The metric is 30 s old: pods that became ready since then report nothing yet (a
    # missing metric), and the ones that did report the load they had then. Two pods ready
    # 30 s ago at 0.5 x the target, three more ready since: the three count at the target
    # on a scale-down, ceil((2 x 0.5 + 3) / 5 x 5) = 4.
    settled = _settled(5)
    tokens = _load(2, 0.5)
    assert settled.decide(_obs(400.0, 5, 5, tokens, ready_at_metric=2)) == 4
    # On a scale-up they count as 0: two pods at 3 x the target -> ceil(6) = 6.
    settled = _settled(5)
    assert settled.decide(_obs(400.0, 5, 5, _load(2, 3.0), ready_at_metric=2)) == 6
    # Pods removed since the metric was taken: the remaining ones show their old share.
    settled = _settled(5)
    assert settled.decide(_obs(400.0, 3, 3, _load(6, 0.5), ready_at_metric=6)) == 2


def test_the_replay_shows_the_hpa_the_pods_ready_one_metric_lag_ago() -> None:
    # 2 replicas serve 1400 tokens/s (on target); demand doubles at minute 5. The HPA sees
    # it at 330 s and scales to 4 (cold start 60 s: ready at 390 s). Until 420 s the 30 s
    # old metric comes from the two pods that served then; the two new ones have none.
    tokens = [1400.0] * 5 + [2800.0] * 2 + [1400.0] * 20
    start = 1_700_000_000.0
    demand = Demand(
        start=start,
        tokens_per_s=np.asarray(tokens),
        observed_requests_per_s=np.asarray(tokens) / 100.0,
        prompt_tokens=80.0,
        output_tokens=20.0,
    )
    config = FleetConfig(replica_tokens_per_second=CAP, cold_start_seconds=60.0)
    seen: list[tuple[float, int, int, int | None]] = []

    class Recording(ReactivePolicy):
        def decide(self, obs: Observation) -> int:
            seen.append((obs.now - start, obs.ready, obs.existing, obs.ready_at_metric))
            return super().decide(obs)

    hpa = Recording(CAP, config.min_replicas, config.max_replicas, target=TARGET)
    run = simulate(demand, hpa, config)
    by_time = {t: (ready, existing, then) for t, ready, existing, then in seen}
    assert by_time[330.0] == (2, 2, 2)
    assert by_time[345.0][:2] == (2, 4)
    assert by_time[390.0] == (4, 4, 2)  # ready now, no metric until 420 s
    assert by_time[420.0] == (4, 4, 4)
    # The scale-down waits out the 300 s window after the last 4, then goes to 2.
    assert math.isclose(run.existing_per_step.max(), 4)
    assert run.existing_per_step[-1] == 2
