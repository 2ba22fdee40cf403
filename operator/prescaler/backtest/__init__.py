"""Backtest: replay real traces through a simulated GPU fleet under several policies (pure).

Module map:

* ``_demand``   - trace -> per-minute demand (tokens/s truth, observed requests/s), for a
  unified fleet or one role of a disaggregated one (its prompt or output tokens/s)
* ``_fleet``    - replicas that become ready one cold start after they are requested, and
  warm standby slots that shorten it
* ``_policies`` - reactive (HPA v2), predictive (the operator's planner), oracle, schedule-only,
  persistence and smoothed-oracle (references)
* ``_simulate`` - the replay loop, the fluid queue, the scores and the timeline
* ``_levels``   - each fleet's degradation levels (the operator's assessment) and how early
  the forecast warned before the queue
* ``_report``   - several policies at once, JSON, CSV and plots
* ``_shadow``   - the operator's shadow HPA: the reactive policy driven step by step by
  live observations, and its hourly comparison with prescaler's fleet
* ``_roles``    - a disaggregated fleet: both roles' replays scored as one, and the
  time-shared unified replica it is compared with
* ``_calibrate`` - a new pool's risk model calibrated by replaying its own history, and
  its first comparison with the HPA (what the operator seeds a pool with)
* ``_run``      - the entry point: a pool's spec, a demand and policy names to a result
  (:func:`backtest`), which every replay shares (trace files, a pool's Prometheus history,
  the demo's HPA comparison, the benchmarks)
"""

from prescaler.backtest._auto import CHECK_SECONDS, HPA_SWEEP
from prescaler.backtest._calibrate import (
    REPLAY_SECONDS,
    HistoryCalibration,
    calibrate_from_history,
    history_demand,
    replay_span,
)
from prescaler.backtest._demand import Demand, demand_from_trace, role_demand
from prescaler.backtest._fleet import Fleet, cold_start_steps, replicas_needed, short_of
from prescaler.backtest._levels import (
    DegradationRun,
    DegradationSetup,
    LeadStats,
    assess_fleet,
    lead_times,
)
from prescaler.backtest._policies import (
    Forecaster,
    Observation,
    OraclePolicy,
    PersistencePolicy,
    Policy,
    PredictivePolicy,
    ReactivePolicy,
    ScheduleOnlyPolicy,
    SmoothedOraclePolicy,
    oracle_replicas,
    smoothed_demand,
    smoothed_oracle_replicas,
)
from prescaler.backtest._report import (
    BacktestResult,
    plot_paths,
    run_backtest,
    worst_ramp,
    write_plots,
    write_timeline,
)
from prescaler.backtest._roles import (
    DisaggregatedResult,
    DisaggregatedScore,
    time_shared_tokens_per_second,
)
from prescaler.backtest._run import (
    DEFAULT_POLICIES,
    HPA_TARGET,
    PERSISTENCE_K,
    POLICIES,
    SMOOTHED_ORACLE_K,
    SMOOTHED_WINDOW_MINUTES,
    WARM_START_SECONDS,
    Backtest,
    Replay,
    ReplayOptions,
    backtest,
    backtest_roles,
    build_policies,
    check_policies,
    degradation_setup,
    peak_factor,
    peak_need,
    pool_capacity,
    pool_fleet,
    predictive_policy,
    reactive_policy,
    standby_max_replicas,
    with_standby,
)
from prescaler.backtest._shadow import (
    WINDOWS,
    Comparison,
    Hour,
    Observed,
    ShadowFleet,
    ShadowHpa,
    ShadowSetup,
    ShadowState,
    compare,
    direction_budget,
    hpa_ready_capacity,
    shadow_step,
    trailing_spend,
)
from prescaler.backtest._simulate import (
    FleetConfig,
    FleetSignals,
    PolicyRun,
    Score,
    direction_changes,
    fluid_queue,
    score,
    simulate,
    span_score,
    timeline,
)

__all__ = [
    "CHECK_SECONDS",
    "DEFAULT_POLICIES",
    "HPA_SWEEP",
    "HPA_TARGET",
    "PERSISTENCE_K",
    "POLICIES",
    "REPLAY_SECONDS",
    "SMOOTHED_ORACLE_K",
    "SMOOTHED_WINDOW_MINUTES",
    "WARM_START_SECONDS",
    "WINDOWS",
    "Backtest",
    "BacktestResult",
    "Comparison",
    "DegradationRun",
    "DegradationSetup",
    "Demand",
    "DisaggregatedResult",
    "DisaggregatedScore",
    "Fleet",
    "FleetConfig",
    "FleetSignals",
    "Forecaster",
    "HistoryCalibration",
    "Hour",
    "LeadStats",
    "Observation",
    "Observed",
    "OraclePolicy",
    "PersistencePolicy",
    "Policy",
    "PolicyRun",
    "PredictivePolicy",
    "ReactivePolicy",
    "Replay",
    "ReplayOptions",
    "ScheduleOnlyPolicy",
    "Score",
    "ShadowFleet",
    "ShadowHpa",
    "ShadowSetup",
    "ShadowState",
    "SmoothedOraclePolicy",
    "assess_fleet",
    "backtest",
    "backtest_roles",
    "build_policies",
    "calibrate_from_history",
    "check_policies",
    "cold_start_steps",
    "compare",
    "degradation_setup",
    "demand_from_trace",
    "direction_budget",
    "direction_changes",
    "fluid_queue",
    "history_demand",
    "hpa_ready_capacity",
    "lead_times",
    "oracle_replicas",
    "peak_factor",
    "peak_need",
    "plot_paths",
    "pool_capacity",
    "pool_fleet",
    "predictive_policy",
    "reactive_policy",
    "replay_span",
    "replicas_needed",
    "role_demand",
    "run_backtest",
    "score",
    "shadow_step",
    "short_of",
    "simulate",
    "smoothed_demand",
    "smoothed_oracle_replicas",
    "span_score",
    "standby_max_replicas",
    "time_shared_tokens_per_second",
    "timeline",
    "trailing_spend",
    "with_standby",
    "worst_ramp",
    "write_plots",
    "write_timeline",
]
