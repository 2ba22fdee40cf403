"""``prescaler backtest``: replay a real trace through a simulated GPU fleet, per policy.

Example (the 14-day ServeGen trace, played as 14 days, 240 s cold start)::

    SG=../shared/traces/servegen_m_small/language__m-small
    prescaler backtest --trace $SG_aggregate_rate_10min.csv --format servegen \\
        --token-mix $SG_input_tokens_pdf.csv.gz --cold-start-seconds 240 \\
        --policies reactive,predictive,oracle --replica-tokens-per-second 20000 \\
        --scale-to-peak-replicas 40 --json out.json --timeline out.csv --plot out.png

Reference policies and sweeps (beyond the brief's three policies):

* ``--policies ...,persistence`` with ``--persistence-k K``: ``K`` x the demand seen now.
* ``--policies ...,smoothed-oracle`` with ``--smoothed-oracle-k K`` (default 1.0) and
  ``--smoothed-window-minutes W`` (default 31): knows the future's centred W-minute rolling
  mean, none of its noise, and plans ``K`` x it over the cold start like the oracle. The
  bound on what a forecast of the predictable part can give; a sweep over ``K`` traces its
  frontier.
* ``--hpa-target X`` (default 0.7, the brief's): the reactive baseline's target
  utilization, to sweep the HPA's frontier (0.5 to 0.9).

Warm standby (the product's second lever; off by default, as in the spec):
``--standby-max-replicas N`` sets the pool's ``spec.standby.placeholders`` (enabled,
``maxReplicas: N``), so the predictive policy's plan sizes a standby (``standby_replicas``).
A replica started on a warm standby slot is ready after ``--warm-start-seconds S``
(default 60, at most the cold start) instead of the cold start; a slot consumed is replaced
one cold start later. Slots held cost ``--standby-cost-fraction F`` (default 1.0) of a
replica's GPU-hours, included in ``gpu_hours`` and reported alone as ``standby_gpu_hours``;
the timeline gains ``predictive_standby``. Only the predictive policy has standby. With
standby on, the forecaster looks as far ahead as the spec's ``forecast.horizonSeconds`` (as
the operator does: the standby covers the forecast's peak over that whole horizon), not
only over the cold start plus margin.

``--score-span name=N,start=ISO,end=ISO`` (repeatable) also scores a span of the replay on
its own, e.g. a known event's window and its pre-warm lead: the JSON's ``spans.N.policies``
has each policy's shortfall minutes, unserved token fraction, GPU-hours and scale events in
the span (the queue carries over from before it).

Degradation levels: every fleet is also assessed as the operator would assess its pool
(``prescaler.planning.assess`` at the spec's ``degradation`` thresholds, every
``--decision-seconds``, 30 s by default: the reconcile period), on that fleet's ready
replicas, its queue as the metrics show it and the predictive policy's forecasts (an HPA-run
fleet is assessed as prescaler watching it). KV-cache usage and TTFT are not simulated. Each
policy's JSON has ``degradation``: ``minutes`` at each level, ``queue_only_minutes`` (the
queue signal alone) and ``lead`` (how early the forecast-shortfall signal warned before the
queue-only level rose). The timeline's columns are unchanged.

Disaggregated prefill/decode (``--disaggregated``, traces with per-request token columns:
``azure`` and ``requests``): the trace's prompt tokens/s and output tokens/s are also
replayed apart, as a prefill fleet and a decode fleet, each under every ``--policies``
policy on its own tokens. Each role's predictive policy runs the planner and forecaster of
a disaggregated pool's role (``spec.roles``, at the spec's defaults), on its own forecast
of its own token rate and the role's capacity: a prefill replica processes
``--prefill-replica-tokens-per-second`` prompt tokens/s (compute); a decode replica
generates ``--decode-replica-tokens-per-second`` output tokens/s, or fewer when the KV
cache of ``--model`` holds fewer requests than that at ``--decode-tokens-per-second``
each (Little's law). Both default to ``--replica-tokens-per-second``: the capacity model
costs a prompt token and an output token alike, so a replica doing only one of them serves
that many. Both roles have the pool's cold start, ``--min-replicas``, ``--gpus-per-replica``
and ``--max-replicas`` (default: twice what the role's peak minute needs).

The unified pool (the top-level JSON and the timeline's first columns, exactly as without
the flag) is then the replica that time-shares the two: a request costs it
``prompt / P + output / D`` seconds, a compute limit of ``(prompt + output) / (prompt / P
+ output / D)`` tokens/s on the trace's mean mix (``P = D``: that value itself), and it
has the same KV-cache limit. The JSON gains ``disaggregated``:

* ``unified_tokens_per_second``: that unified compute limit;
* ``policies.<policy>``: both roles together: ``shortfall_minutes`` (minutes in which
  either role is short), ``unserved_token_fraction`` (prefill's unserved prompt tokens plus
  decode's unserved output tokens, over all prompt and output tokens), ``gpu_hours`` (both
  roles' replicas x GPUs x hours), ``scale_events`` (both roles') and
  ``gpu_hours_over_unified``;
* ``roles.<prefill|decode>``: the role's ``unit``, ``tokens_per_second`` (its throughput
  flag), ``replica_tokens_per_s`` (its effective capacity in its own tokens),
  ``capacity_constraint``, ``mean_tokens_per_request``, GPUs, bounds, peak demand, and
  ``policies`` with each policy's full scores on the role's own tokens;
* ``spans.<name>.<policy>``: both roles' scores in each ``--score-span``.

The timeline gains, per role, ``<role>_demand_tokens_per_s``, ``<role>_replica_tokens_per_s``
(in the role's own tokens), then ``<role>_<policy>_ready`` and ``<role>_<policy>_desired``.
Degradation levels, plots and warm standby are the unified pool's only.

A pool's own history (``--prometheus [URL]`` with ``--pool NAMESPACE/NAME`` or
``--pool-file FILE``, ``--days N``): the pool's spec, read from the cluster or the file,
is the predictive policy's and sizes the fleet; its demand is read per minute with the
operator's queries and credentials (:mod:`prescaler.cli._prometheus_backtest`); the fleet
starts in the pool's measured cold start and the reactive baseline runs at its HPA's
target. The outputs are the trace replay's, and the JSON adds ``pool``, ``days``,
``history`` (span, queries, gaps), ``cold_start`` and ``hpa``.

Every replay runs :func:`prescaler.backtest.backtest`; this module turns flags into its
inputs and writes what it returns. The reported numbers and the benchmark command are in
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, get_args

from prescaler.api import (
    ColdStartSpec,
    ForecastSpec,
    InferencePoolSpec,
    ObjectiveSpec,
    PlanningPolicy,
    ScaleDownSpec,
)
from prescaler.backtest._run import (
    HPA_TARGET,
    PERSISTENCE_K,
    POLICIES,
    SMOOTHED_ORACLE_K,
    SMOOTHED_WINDOW_MINUTES,
    WARM_START_SECONDS,
    check_policies,
)
from prescaler.cli._backtest_spec import (
    Prepared,
    _parse_span,
    _with_standby,
    key_values,
    pool_spec,
    replay_options,
)
from prescaler.cli._capacity_args import add_capacity_arguments, capacity_from_args
from prescaler.cli._common import (
    CliError,
    fraction,
    non_negative_float,
    positive_float,
    positive_int,
    print_json,
)
from prescaler.settings import ReconcileSettings

__all__ = ["POLICIES", "Prepared", "degradation_setup", "pool_spec", "prepare", "register", "run"]


def _policies(text: str) -> list[str]:
    try:
        return list(check_policies([p.strip() for p in text.split(",") if p.strip()]))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_int(text: str) -> int:
    value = non_negative_float(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text}")
    return int(value)


def _quantile(text: str) -> float:
    value = positive_float(text)
    if not 0.5 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0.5, 1), got {text}")
    return value


def _share(text: str) -> float:
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _at_least_one(text: str) -> float:
    value = positive_float(text)
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def register(subparsers: Any) -> None:
    from prescaler.backtest.traces import TRACE_FORMATS

    parser = subparsers.add_parser(
        "backtest",
        help="replay a trace: predictive vs reactive (HPA) vs oracle",
        description=(
            "Replay a real trace through a simulated GPU fleet and score each policy: "
            "shortfall minutes, unserved token fraction, GPU-hours and scale events."
        ),
    )
    src = parser.add_argument_group(
        "trace", "Replay a trace file (--trace), or a pool's own history (--prometheus, below)."
    )
    replayed = src.add_mutually_exclusive_group(required=True)
    replayed.add_argument("--trace", type=Path, metavar="FILE")
    replayed.add_argument(
        "--prometheus",
        nargs="?",
        const="",
        metavar="URL",
        help="replay a pool's own demand history from this Prometheus (no URL: the pool's "
        "spec.forecast.prometheus.url); give --pool or --pool-file",
    )
    src.add_argument(
        "--format", choices=TRACE_FORMATS, dest="trace_format", help="the trace's format"
    )
    src.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        metavar="X",
        help="stretch time by X (10: a 1-hour trace plays over 10 hours); rates keep values",
    )
    src.add_argument(
        "--token-mix",
        type=Path,
        metavar="FILE",
        help="draw per-request lengths from a per-request trace (azure/requests columns) or a "
        "ServeGen *_input_tokens_pdf file, for traces without token columns",
    )
    src.add_argument("--seed", type=int, default=0, help="seed of the token-mix draws")
    src.add_argument("--prompt-tokens", type=non_negative_float, help="mean per request")
    src.add_argument("--output-tokens", type=non_negative_float, help="mean per request")
    src.add_argument(
        "--scale-to-peak-replicas",
        type=positive_int,
        metavar="N",
        help="rescale demand so that the trace's peak minute needs exactly N replicas",
    )
    src.add_argument(
        "--trace-step-seconds",
        type=positive_float,
        help="bin width for per-request traces, in played (scaled) seconds; default 60",
    )
    src.add_argument("--max-minutes", type=positive_int, help="use only the first minutes")
    src.add_argument(
        "--replay-days",
        type=positive_float,
        help="replay only the last DAYS; earlier data is warm-up history for the forecaster",
    )

    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--cold-start-seconds",
        type=non_negative_float,
        help="required with --trace; with --prometheus the pool's measured cold start "
        "(status.coldStart), else its spec's",
    )
    fleet.add_argument(
        "--min-replicas",
        type=positive_int,
        help=f"default {InferencePoolSpec.default_of('min_replicas')} (with --prometheus: "
        "the pool's spec.minReplicas)",
    )
    fleet.add_argument(
        "--max-replicas",
        type=positive_int,
        help="default: twice the replicas the peak minute needs",
    )
    fleet.add_argument(
        "--warm-start-seconds",
        type=non_negative_float,
        help="start of a replica that takes a warm standby slot (node up, image pulled): "
        f"default {WARM_START_SECONDS:g} s, at most the cold start; used with "
        "--standby-max-replicas",
    )
    fleet.add_argument(
        "--standby-cost-fraction",
        type=_share,
        default=1.0,
        help="GPU cost of a held standby slot as a share of a replica's (default 1.0: a held "
        "GPU node costs what a busy one does)",
    )
    add_capacity_arguments(parser)

    pol = parser.add_argument_group(
        "policies",
        "The predictive policy runs at the InferencePool spec's defaults; each flag below "
        "overrides one of them (the spec model is the one place a default lives).",
    )
    pol.add_argument(
        "--policies",
        type=_policies,
        default=["reactive", "predictive", "oracle"],
        help=f"comma-separated, in timeline order: {', '.join(POLICIES)}",
    )
    pol.add_argument(
        "--forecast-model", help=f"spec.forecast.model (default {ForecastSpec.default_of('model')})"
    )
    pol.add_argument(
        "--quantile",
        type=_quantile,
        help="spec.forecast.quantile: forecast upper quantile "
        f"(default {ForecastSpec.default_of('quantile')})",
    )
    pol.add_argument(
        "--refit-minutes",
        type=positive_float,
        help="spec.forecast.refitSeconds / 60 "
        f"(default {ForecastSpec.default_of('refit_seconds') / 60:g})",
    )
    pol.add_argument(
        "--forecast-step-seconds",
        type=positive_float,
        default=None,
        help="forecaster resolution (default: the trace's own step, >= 60 s)",
    )
    pol.add_argument(
        "--decision-seconds",
        type=positive_float,
        default=ReconcileSettings().interval_seconds,
        help="how often the predictive policy plans: the operator's reconcile period "
        f"(default {ReconcileSettings().interval_seconds:g})",
    )
    pol.add_argument(
        "--lead-margin-seconds",
        type=non_negative_int,
        help=f"spec.coldStart.marginSeconds (default {ColdStartSpec.default_of('margin_seconds')})",
    )
    pol.add_argument(
        "--policy",
        choices=get_args(PlanningPolicy),
        help="spec.policy: how the predictive policy plans, on the forecast, as the HPA at "
        "--hpa-target, as that HPA led by the forecast, or the one the daily re-checks of "
        "each on the replayed demand choose "
        f"(default {InferencePoolSpec.default_of('policy')})",
    )
    pol.add_argument(
        "--served-fraction",
        type=_share,
        help="spec.objective.servedFraction: the absolute objective, the share of demand to "
        "serve without waiting for capacity (default: unset, the relative objective)",
    )
    pol.add_argument(
        "--relative-to-hpa",
        type=_share,
        help="spec.objective.relativeToHpa: the share of what a reactive HPA would leave "
        f"waiting that the plan may leave (default {ObjectiveSpec.default_of('relative_to_hpa')})",
    )
    pol.add_argument(
        "--relative-floor",
        type=non_negative_float,
        help="spec.objective.relativeFloor: the relative objective's least target share of "
        f"demand left waiting (default {ObjectiveSpec.default_of('relative_floor')})",
    )
    pol.add_argument(
        "--budget-to-hpa",
        type=non_negative_float,
        help="spec.objective.budgetToHpa: while the plan costs less than this share of "
        "a reactive HPA, it tightens its relative target (default "
        f"{ObjectiveSpec.default_of('budget_to_hpa')}; 0: off)",
    )
    pol.add_argument(
        "--adapt-rate",
        type=non_negative_float,
        help="spec.objective.adaptRate: how far one lookahead moves the quantile level "
        f"(default {ObjectiveSpec.default_of('adapt_rate')})",
    )
    pol.add_argument(
        "--observed-headroom",
        type=_at_least_one,
        help="spec.forecast.observedHeadroom: nowcast guard, plan at least the observed "
        f"demand times this (default {ForecastSpec.default_of('observed_headroom')})",
    )
    pol.add_argument(
        "--observed-trend-seconds",
        type=non_negative_int,
        help="spec.forecast.observedTrendSeconds: while the observed demand rises, plan for "
        "it as far up its rise as it climbs in this many seconds "
        f"(default {ForecastSpec.default_of('observed_trend_seconds')})",
    )
    pol.add_argument(
        "--scale-down-stabilization-seconds",
        type=non_negative_int,
        help="spec.scaleDown.stabilizationSeconds "
        f"(default {ScaleDownSpec.default_of('stabilization_seconds')})",
    )
    pol.add_argument(
        "--scale-down-mode",
        choices=("forecast", "paced"),
        help=f"spec.scaleDown.mode (default {ScaleDownSpec.default_of('mode')})",
    )
    pol.add_argument(
        "--scale-down-max-percent",
        type=positive_int,
        help=f"spec.scaleDown.maxPercent (default {ScaleDownSpec.default_of('max_percent')})",
    )
    pol.add_argument(
        "--direction-changes",
        choices=("asHpa", "free"),
        help="spec.scaleDown.directionChanges "
        f"(default {ScaleDownSpec.default_of('direction_changes')})",
    )
    pol.add_argument(
        "--scale-down-requires-observation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="no scale-down while the observed demand is missing, as the operator always "
        "does (default on)",
    )
    pol.add_argument(
        "--persistence-k",
        type=positive_float,
        default=PERSISTENCE_K,
        help="reference policy 'persistence': replicas for k x the demand seen now",
    )
    pol.add_argument(
        "--smoothed-oracle-k",
        type=positive_float,
        default=SMOOTHED_ORACLE_K,
        help="reference policy 'smoothed-oracle': replicas for k x the future's centred "
        "rolling mean of demand (default 1.0: the mean itself)",
    )
    pol.add_argument(
        "--smoothed-window-minutes",
        type=positive_int,
        default=SMOOTHED_WINDOW_MINUTES,
        help="the smoothed oracle's centred rolling-mean window "
        f"(default {SMOOTHED_WINDOW_MINUTES})",
    )
    pol.add_argument(
        "--hpa-target",
        type=fraction,
        help=f"the reactive (HPA) policy's target utilization (default {HPA_TARGET:g}, the "
        "brief's; with --prometheus: the target of the pool's HPA when it has one)",
    )
    pol.add_argument(
        "--standby-max-replicas",
        type=non_negative_int,
        help="spec.standby.placeholders: warm standby on with at most N slots, sized by the "
        "planner (default: the spec's, off; 0 turns it off)",
    )
    pol.add_argument(
        "--history-days",
        type=positive_float,
        default=None,
        help="history handed to the forecaster (default: spec.forecast.lookbackSeconds, "
        "as the operator reads it)",
    )
    pol.add_argument(
        "--window",
        action="append",
        default=[],
        metavar="SPEC",
        help="scheduled window for predictive and schedule-only, e.g. "
        "'name=peak,cron=0 9 * * *,duration=28800,replicas=10,lead=600,tz=UTC' or "
        "'name=launch,start=2024-01-03T12:00,end=2024-01-03T14:00,rps=900'",
    )

    roles = parser.add_argument_group(
        "disaggregated prefill/decode",
        "--disaggregated also replays the trace's prompt tokens/s and output tokens/s as a "
        "prefill and a decode fleet, each role planned as a disaggregated pool's role on its "
        "own forecast of its own tokens, under every --policies policy. The unified pool "
        "(top-level JSON, first timeline columns) is then the replica that time-shares both "
        "roles: a request costs it prompt/P + output/D seconds, with the same KV-cache limit. "
        "The JSON gains 'disaggregated': unified_tokens_per_second (that replica's compute "
        "limit); policies.<policy> over both roles: shortfall_minutes (either role short), "
        "unserved_token_fraction (prefill's unserved prompt tokens plus decode's unserved "
        "output tokens, over all tokens), gpu_hours, scale_events, gpu_hours_over_unified; "
        "roles.<prefill|decode>: the role's capacity and each policy's scores in its own "
        "tokens; spans.<name> for each --score-span. The timeline gains, per role, "
        "<role>_demand_tokens_per_s, <role>_replica_tokens_per_s, then <role>_<policy>_ready "
        "and <role>_<policy>_desired.",
    )
    roles.add_argument(
        "--disaggregated",
        action="store_true",
        help="also replay a disaggregated prefill/decode fleet (traces with per-request "
        "token columns: azure, requests)",
    )
    roles.add_argument(
        "--prefill-replica-tokens-per-second",
        type=positive_float,
        metavar="P",
        help="measured prompt tokens/s of one prefill replica (default: "
        "--replica-tokens-per-second, a prompt token costing what the unified model costs it)",
    )
    roles.add_argument(
        "--decode-replica-tokens-per-second",
        type=positive_float,
        metavar="D",
        help="measured output tokens/s of one decode replica at --decode-tokens-per-second per "
        "request; the KV-cache limit of --model applies on top (default: "
        "--replica-tokens-per-second)",
    )

    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="OUT.json", dest="json_out")
    out.add_argument(
        "--score-span",
        action="append",
        default=[],
        metavar="SPEC",
        help="also score a span of the replay on its own (JSON 'spans'), e.g. "
        "'name=event,start=2024-01-09T10:00,end=2024-01-10T10:00' (naive times are UTC)",
    )
    out.add_argument("--timeline", type=Path, metavar="OUT.csv")
    out.add_argument(
        "--plot", type=Path, metavar="OUT.png", help="writes OUT.png, OUT-zoom.png and OUT-bars.png"
    )
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    from prescaler.cli._prometheus_backtest import add_prometheus_arguments

    add_prometheus_arguments(parser)
    parser.set_defaults(func=run)


def _parse_window(spec: str) -> Any:
    from datetime import datetime

    from prescaler.planning import ScheduledWindow

    known = {"name", "cron", "duration", "start", "end", "replicas", "rps", "lead", "tz"}
    fields = key_values(spec, "--window", known)
    try:
        return ScheduledWindow(
            name=fields.get("name", "window"),
            lead_seconds=float(fields.get("lead", 600)),
            min_replicas=int(fields["replicas"]) if "replicas" in fields else None,
            expected_requests_per_second=float(fields["rps"]) if "rps" in fields else None,
            timezone=fields.get("tz", "UTC"),
            start=datetime.fromisoformat(fields["start"]) if "start" in fields else None,
            end=datetime.fromisoformat(fields["end"]) if "end" in fields else None,
            cron=fields.get("cron"),
            duration_seconds=float(fields["duration"]) if "duration" in fields else None,
        )
    except (ValueError, KeyError) as exc:
        raise CliError(f"--window: {exc}") from None


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last = -1.0
        self.t0 = time.perf_counter()

    def __call__(self, name: str, done: float) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < 1.0 and now - self.last < 2.0:
            return
        self.last = now
        end = "\n" if done >= 1.0 else "\r"
        sys.stderr.write(f"  {name:<14} {done * 100:5.1f} %  {now - self.t0:7.1f} s{end}")
        sys.stderr.flush()


def prepare(args: argparse.Namespace) -> Prepared:
    """Load the trace and build the demand, capacity model and simulated fleet."""
    from prescaler.backtest import (
        FleetConfig,
        demand_from_trace,
        peak_factor,
        peak_need,
        standby_max_replicas,
    )
    from prescaler.backtest.traces import TraceError, load_token_mix, load_trace, with_token_mix

    if args.trace_format is None:
        raise CliError("--trace: give its --format")
    if args.cold_start_seconds is None:
        raise CliError("--trace: give --cold-start-seconds")
    windows = [_parse_window(w) for w in args.window]
    if args.disaggregated:
        from prescaler.cli._disaggregated import check_args

        check_args(args, windows)
    try:
        step = args.trace_step_seconds if args.trace_format in ("azure", "requests") else None
        trace = load_trace(
            args.trace, args.trace_format, step_seconds=step, time_scale=args.time_scale
        )
        if args.token_mix is not None:
            if trace.has_tokens:
                raise CliError("--token-mix: this trace already has per-request token lengths")
            trace = with_token_mix(trace, load_token_mix(args.token_mix), seed=args.seed)
        elif not trace.has_tokens and (args.prompt_tokens is None or args.output_tokens is None):
            raise CliError(
                f"a {args.trace_format!r} trace has no token lengths: give --prompt-tokens and "
                "--output-tokens, or --token-mix"
            )
        demand = demand_from_trace(
            trace, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens
        )
    except TraceError as exc:
        raise CliError(f"--trace: {exc}") from None
    if args.max_minutes is not None:
        demand = demand.head(min(args.max_minutes, len(demand)))
    demand = demand.with_replay_days(args.replay_days)
    context = math.ceil(demand.context_p95) if demand.context_p95 else None
    tokens_per_second = None
    if args.disaggregated:
        from prescaler.cli._disaggregated import unified_tokens_per_second

        # The unified pool it is compared with: one replica doing both roles' work in turn.
        tokens_per_second = unified_tokens_per_second(args, demand)
    capacity = capacity_from_args(
        args,
        prompt_tokens=demand.prompt_tokens,
        output_tokens=demand.output_tokens,
        context_tokens=context,
        default_headroom=ForecastSpec.default_of("headroom"),
        tokens_per_second=tokens_per_second,
    )
    replica_tps = capacity.replica_tokens_per_second
    peak = float(demand.replay_tokens_per_s.max())
    if not peak > 0:
        raise CliError("--trace: the trace has no demand")
    scale = 1.0
    if args.scale_to_peak_replicas is not None:
        scale = peak_factor(peak, args.scale_to_peak_replicas, replica_tps)
        demand = demand.scaled(scale)
    min_replicas = args.min_replicas
    if min_replicas is None:
        min_replicas = int(InferencePoolSpec.default_of("min_replicas"))
    max_replicas = args.max_replicas
    if max_replicas is None:
        max_replicas = 2 * peak_need(demand, replica_tps)
    if max_replicas < min_replicas:
        raise CliError("--max-replicas must be >= --min-replicas")
    try:
        config = FleetConfig(
            replica_tokens_per_second=replica_tps,
            cold_start_seconds=args.cold_start_seconds,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            gpus_per_replica=args.gpus_per_replica,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    standby_max = standby_max_replicas(pool_spec(args, config), args.policies)
    if standby_max > 0:
        config = _with_standby(args, config)
    # The forecaster works at the trace's own resolution (no finer than a minute).
    args.forecast_step = args.forecast_step_seconds or max(60.0, trace.step_seconds)
    spans = [_parse_span(s) for s in args.score_span]
    if "schedule-only" in args.policies and not windows:
        raise CliError("--policies: schedule-only needs at least one --window")

    return Prepared(trace, demand, capacity, config, windows, spans, standby_max, scale)


def degradation_setup(
    args: argparse.Namespace, prep: Prepared, spec: InferencePoolSpec | None = None
) -> Any:
    """How the fleets' degradation levels are assessed: the spec's thresholds (default:
    :func:`pool_spec` of the prepared fleet), the run's capacity model, at every decision
    of the predictive policy (the reconcile period)."""
    from prescaler.backtest import degradation_setup as setup

    every = args.decision_seconds
    step = prep.config.step_seconds
    if abs(every / step - round(every / step)) > 1e-9:
        raise CliError(f"--decision-seconds must be a multiple of the {step:g} s simulation step")
    return setup(spec or pool_spec(args, prep.config), prep.capacity, prep.config, every)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from prescaler.backtest import backtest, backtest_roles

    started = time.perf_counter()
    if args.prometheus is not None:
        from prescaler.cli._prometheus_backtest import prepare_history

        history = prepare_history(args)
        prep, spec, source, head = history.prepared, history.spec, history.source, history.json
        options = replay_options(args, windows=None, forecast_step=history.forecast_step)
        title = history.title
    else:
        if args.trace is None:
            raise CliError("give --trace FILE --format F, or --prometheus with --pool")
        prep = prepare(args)
        spec = pool_spec(args, prep.config)
        options = replay_options(args, windows=prep.windows, forecast_step=args.forecast_step)
        source = {"trace": str(args.trace), "fmt": args.trace_format}
        head = {
            "time_scale": args.time_scale,
            "scale_to_peak_replicas": args.scale_to_peak_replicas,
        }
        title = args.trace.name
    progress = _Progress(not args.quiet)
    result = backtest(
        spec,
        prep.demand,
        args.policies,
        capacity=prep.capacity,
        config=prep.config,
        options=options,
        degradation=degradation_setup(args, prep, spec),
        progress=progress,
    )
    if args.disaggregated:
        from prescaler.cli._disaggregated import role_fleets

        roles_spec, fleets = role_fleets(args, prep)
        roles = backtest_roles(
            roles_spec, fleets, args.policies, options=options, progress=progress
        )
        result = replace(result, roles=roles)
    elapsed = time.perf_counter() - started
    write_report(args, result, prep, source, head, elapsed, title)
    return 0


def write_report(
    args: argparse.Namespace,
    result: Any,
    prep: Prepared,
    source: dict[str, str],
    head: dict[str, Any],
    elapsed: float,
    title: str,
) -> None:
    """The JSON (to ``--json`` or stdout), ``--timeline`` and ``--plot`` of a replay."""
    from prescaler.backtest import write_plots

    spans = prep.spans
    try:
        scored = {"spans": result.span_scores(spans)} if spans else {}
    except ValueError as exc:
        raise CliError(f"--score-span {str(exc).removeprefix('span ')}") from None
    body = result.result.to_json(
        trace=source["trace"],
        fmt=source["fmt"],
        extra={
            **head,
            "capacity_constraint": prep.capacity.binding_constraint,
            "wall_seconds": round(elapsed, 3),
            **result.settings_json(),
            **scored,
            "drivers": result.drivers(),
            **({"policy_choice": result.policy_json()} if result.policy_json() else {}),
            **({"disaggregated": result.roles_json(spans)} if result.roles else {}),
        },
    )
    if args.timeline is not None:
        result.timeline().to_csv(args.timeline, index=False)
    if args.plot is not None:
        write_plots(result.result, args.plot, title=title)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(body, indent=2) + "\n")
    else:
        print_json(body)
