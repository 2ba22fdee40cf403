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

The reported numbers and the benchmark command are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prescaler.api import (
    ColdStartSpec,
    ForecastSpec,
    InferencePoolSpec,
    ObjectiveSpec,
    ScaleDownSpec,
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

POLICIES = ("reactive", "predictive", "oracle", "schedule-only", "persistence", "smoothed-oracle")
WARM_START_SECONDS = 60.0
"""Default warm start: the weight load and runtime init left once a node is up and pulled."""


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one policy")
    for name in names:
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(
                f"unknown policy {name!r}; expected some of {', '.join(POLICIES)}"
            )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("a policy is listed twice")
    return names


def _default(name: str, model: type[Any] = ForecastSpec) -> Any:
    """A field's default in the spec model (the one place it lives)."""
    return model.model_fields[name].get_default(call_default_factory=True)


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
    src = parser.add_argument_group("trace")
    src.add_argument("--trace", required=True, type=Path, metavar="FILE")
    src.add_argument("--format", required=True, choices=TRACE_FORMATS, dest="trace_format")
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
    fleet.add_argument("--cold-start-seconds", required=True, type=non_negative_float)
    fleet.add_argument("--min-replicas", type=positive_int, default=1)
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
    pol.add_argument("--forecast-model", help=f"spec.forecast.model (default {_default('model')})")
    pol.add_argument(
        "--quantile",
        type=_quantile,
        help=f"spec.forecast.quantile: forecast upper quantile (default {_default('quantile')})",
    )
    pol.add_argument(
        "--refit-minutes",
        type=positive_float,
        help=f"spec.forecast.refitSeconds / 60 (default {_default('refit_seconds') / 60:g})",
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
        help=f"spec.coldStart.marginSeconds (default {_default('margin_seconds', ColdStartSpec)})",
    )
    pol.add_argument(
        "--served-fraction",
        type=_share,
        help="spec.objective.servedFraction: share of demand to serve without waiting for "
        f"capacity (default {_default('served_fraction', ObjectiveSpec)})",
    )
    pol.add_argument(
        "--adapt-rate",
        type=non_negative_float,
        help="spec.objective.adaptRate: how far one lookahead moves the quantile level "
        f"(default {_default('adapt_rate', ObjectiveSpec)})",
    )
    pol.add_argument(
        "--observed-headroom",
        type=_at_least_one,
        help="spec.forecast.observedHeadroom: nowcast guard, plan at least the observed "
        f"demand times this (default {_default('observed_headroom')})",
    )
    pol.add_argument(
        "--scale-down-stabilization-seconds",
        type=non_negative_int,
        help="spec.scaleDown.stabilizationSeconds "
        f"(default {_default('stabilization_seconds', ScaleDownSpec)})",
    )
    pol.add_argument(
        "--scale-down-mode",
        choices=("forecast", "paced"),
        help=f"spec.scaleDown.mode (default {_default('mode', ScaleDownSpec)})",
    )
    pol.add_argument(
        "--scale-down-max-percent",
        type=positive_int,
        help=f"spec.scaleDown.maxPercent (default {_default('max_percent', ScaleDownSpec)})",
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
        default=1.4,
        help="reference policy 'persistence': replicas for k x the demand seen now",
    )
    pol.add_argument(
        "--smoothed-oracle-k",
        type=positive_float,
        default=1.0,
        help="reference policy 'smoothed-oracle': replicas for k x the future's centred "
        "rolling mean of demand (default 1.0: the mean itself)",
    )
    pol.add_argument(
        "--smoothed-window-minutes",
        type=positive_int,
        default=31,
        help="the smoothed oracle's centred rolling-mean window (default 31)",
    )
    pol.add_argument(
        "--hpa-target",
        type=fraction,
        default=0.7,
        help="the reactive (HPA) policy's target utilization (default 0.7, the brief's)",
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
    parser.set_defaults(func=run)


def _parse_window(spec: str) -> Any:
    from datetime import datetime

    from prescaler.planning import ScheduledWindow

    fields: dict[str, str] = {}
    for part in spec.split(","):
        if "=" not in part:
            raise CliError(f"--window: expected key=value pairs, got {part!r}")
        key, value = part.split("=", 1)
        fields[key.strip()] = value.strip()
    known = {"name", "cron", "duration", "start", "end", "replicas", "rps", "lead", "tz"}
    unknown = set(fields) - known
    if unknown:
        raise CliError(f"--window: unknown key(s) {', '.join(sorted(unknown))}")
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


def _parse_span(spec: str) -> tuple[str, float, float]:
    """``name=...,start=ISO,end=ISO`` -> (name, start, end) in unix seconds (naive = UTC)."""
    import pandas as pd

    fields: dict[str, str] = {}
    for part in spec.split(","):
        if "=" not in part:
            raise CliError(f"--score-span: expected key=value pairs, got {part!r}")
        key, value = part.split("=", 1)
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"name", "start", "end"}
    if unknown:
        raise CliError(f"--score-span: unknown key(s) {', '.join(sorted(unknown))}")
    if "start" not in fields or "end" not in fields:
        raise CliError("--score-span: needs start= and end=")
    try:
        bounds = [pd.Timestamp(fields[k]) for k in ("start", "end")]
    except ValueError as exc:
        raise CliError(f"--score-span: {exc}") from None
    start, end = (b.tz_localize("UTC") if b.tzinfo is None else b for b in bounds)
    if not end > start:
        raise CliError("--score-span: end must be after start")
    return fields.get("name", f"span{start.isoformat()}"), start.timestamp(), end.timestamp()


def _span_scores(result: Any, spans: list[tuple[str, float, float]]) -> dict[str, Any]:
    import pandas as pd

    out: dict[str, Any] = {}
    for name, start, end in spans:
        try:
            policies = result.span_scores(start, end)
        except ValueError:
            raise CliError(f"--score-span {name}: outside the replayed minutes") from None
        out[name] = {
            "start": pd.Timestamp(start, unit="s", tz="UTC").isoformat(),
            "end": pd.Timestamp(end, unit="s", tz="UTC").isoformat(),
            "policies": policies,
        }
    return out


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


@dataclass(frozen=True)
class Prepared:
    """A trace turned into the simulation's inputs, as ``run`` uses them (and benchmarks
    that replay one trace under many policies)."""

    trace: Any
    demand: Any
    capacity: Any
    config: Any
    windows: list[Any]
    spans: list[Any]
    standby_max: int
    demand_scale: float = 1.0
    """The factor ``--scale-to-peak-replicas`` multiplied the trace's demand by."""


def prepare(args: argparse.Namespace) -> Prepared:
    """Load the trace and build the demand, capacity model and simulated fleet."""
    import numpy as np

    from prescaler.backtest import FleetConfig, demand_from_trace, replicas_needed
    from prescaler.backtest.traces import TraceError, load_token_mix, load_trace, with_token_mix

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
        default_headroom=_default("headroom"),
        tokens_per_second=tokens_per_second,
    )
    replica_tps = capacity.replica_tokens_per_second
    peak = float(demand.replay_tokens_per_s.max())
    if not peak > 0:
        raise CliError("--trace: the trace has no demand")
    scale = 1.0
    if args.scale_to_peak_replicas is not None:
        scale = _peak_factor(peak, args.scale_to_peak_replicas, replica_tps)
        demand = demand.scaled(scale)
        peak = float(demand.replay_tokens_per_s.max())
    peak_need = max(1, int(replicas_needed(np.array([peak]), replica_tps)[0]))
    max_replicas = args.max_replicas if args.max_replicas is not None else 2 * peak_need
    if max_replicas < args.min_replicas:
        raise CliError("--max-replicas must be >= --min-replicas")
    try:
        config = FleetConfig(
            replica_tokens_per_second=replica_tps,
            cold_start_seconds=args.cold_start_seconds,
            min_replicas=args.min_replicas,
            max_replicas=max_replicas,
            gpus_per_replica=args.gpus_per_replica,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    standby_max = _standby_max_replicas(args, config) if "predictive" in args.policies else 0
    if standby_max > 0:
        config = _with_standby(args, config)
    # The forecaster works at the trace's own resolution (no finer than a minute).
    args.forecast_step = args.forecast_step_seconds or max(60.0, trace.step_seconds)
    spans = [_parse_span(s) for s in args.score_span]
    if "schedule-only" in args.policies and not windows:
        raise CliError("--policies: schedule-only needs at least one --window")

    return Prepared(trace, demand, capacity, config, windows, spans, standby_max, scale)


def build_policies(
    args: argparse.Namespace, prep: Prepared, spec: InferencePoolSpec | None = None
) -> list[Any]:
    """The policies ``--policies`` names, in order, for this prepared trace; the predictive
    one runs ``spec`` (default: :func:`pool_spec` of the prepared fleet)."""
    import numpy as np

    from prescaler.backtest import (
        OraclePolicy,
        PersistencePolicy,
        Policy,
        PredictivePolicy,
        ReactivePolicy,
        ScheduleOnlyPolicy,
        oracle_replicas,
    )

    demand, capacity, config, windows = prep.demand, prep.capacity, prep.config, prep.windows
    replica_tps = config.replica_tokens_per_second
    policies: list[Policy] = []
    for name in args.policies:
        if name == "reactive":
            policies.append(_reactive(args, replica_tps, config, ReactivePolicy))
        elif name == "smoothed-oracle":
            policies.append(_smoothed_oracle(args, demand, config))
        elif name == "oracle":
            per_step = np.repeat(demand.tokens_per_s, config.steps_per_minute)
            policies.append(
                OraclePolicy(
                    oracle_replicas(
                        per_step,
                        replica_tps,
                        config.lag_steps,
                        config.min_replicas,
                        config.max_replicas,
                    ),
                    config.step_seconds,
                )
            )
        elif name == "persistence":
            policies.append(
                PersistencePolicy(
                    args.persistence_k, replica_tps, config.min_replicas, config.max_replicas
                )
            )
        elif name == "schedule-only":
            policies.append(
                ScheduleOnlyPolicy(windows, capacity, config.min_replicas, config.max_replicas)
            )
        else:
            policies.append(
                _predictive(args, demand, capacity, config, windows, PredictivePolicy, spec)
            )

    return policies


def degradation_setup(args: argparse.Namespace, prep: Prepared) -> Any:
    """How the fleets' degradation levels are assessed: the spec's thresholds, the run's
    capacity model, at every decision of the predictive policy (the reconcile period)."""
    from prescaler.api import SpecError, degradation_policy
    from prescaler.backtest import DegradationSetup

    every = args.decision_seconds
    step = prep.config.step_seconds
    if abs(every / step - round(every / step)) > 1e-9:
        raise CliError(f"--decision-seconds must be a multiple of the {step:g} s simulation step")
    try:
        policy = degradation_policy(pool_spec(args, prep.config))
    except SpecError as exc:
        raise CliError(str(exc)) from None
    return DegradationSetup(policy=policy, capacity=prep.capacity, every_seconds=every)


def run(args: argparse.Namespace) -> int:
    from prescaler.backtest import run_backtest, write_plots, write_timeline

    started = time.perf_counter()
    prep = prepare(args)
    demand, capacity, config = prep.demand, prep.capacity, prep.config
    spans, standby_max = prep.spans, prep.standby_max
    policies = build_policies(args, prep)
    progress = _Progress(not args.quiet)
    result = run_backtest(
        demand, policies, config, progress=progress, degradation=degradation_setup(args, prep)
    )
    roles = None
    if args.disaggregated:
        from prescaler.cli._disaggregated import run_roles

        roles = run_roles(args, prep, progress)
    elapsed = time.perf_counter() - started

    body = result.to_json(
        trace=str(args.trace),
        fmt=args.trace_format,
        extra={
            "time_scale": args.time_scale,
            "scale_to_peak_replicas": args.scale_to_peak_replicas,
            "capacity_constraint": capacity.binding_constraint,
            "wall_seconds": round(elapsed, 3),
            **_reference_settings(args, config, standby_max),
            **({"spans": _span_scores(result, spans)} if spans else {}),
            "drivers": _drivers_json(policies),
            **({"disaggregated": _roles_json(roles, result, capacity, spans)} if roles else {}),
        },
    )
    if args.timeline is not None and roles is not None:
        import pandas as pd

        pd.concat([result.timeline(), roles.timeline()], axis=1).to_csv(args.timeline, index=False)
    elif args.timeline is not None:
        write_timeline(result, args.timeline)
    if args.plot is not None:
        write_plots(result, args.plot, title=args.trace.name)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(body, indent=2) + "\n")
    else:
        print_json(body)
    return 0


def _drivers_json(policies: list[Any]) -> dict[str, Any]:
    """Per planning policy, what drove its decisions: for each rule
    (:data:`prescaler.planning.Driver`), its share of the decisions and of the replica time
    (GPU-hours) they asked for."""
    out: dict[str, Any] = {}
    for policy in policies:
        drivers = getattr(policy, "drivers", None)
        if not drivers:
            continue
        decisions = sum(n for n, _ in drivers.values()) or 1
        seconds = sum(t for _, t in drivers.values()) or 1.0
        out[policy.name] = {
            name: {
                "decisions": n,
                "decision_share": round(n / decisions, 4),
                "gpu_hour_share": round(t / seconds, 4),
            }
            for name, (n, t) in sorted(drivers.items(), key=lambda kv: -kv[1][1])
        }
    return out


def _roles_json(
    roles: Any, unified: Any, capacity: Any, spans: list[tuple[str, float, float]]
) -> dict[str, Any]:
    """The JSON's ``disaggregated`` section, with the unified replica it is compared with
    and both roles' scores in each ``--score-span``."""
    body: dict[str, Any] = {"unified_tokens_per_second": capacity.throughput}
    body.update(roles.to_json(unified))
    if spans:
        body["spans"] = {
            name: {n: sc.as_dict() for n, sc in roles.span_scores(start, end).items()}
            for name, start, end in spans
        }
    return body


def _peak_factor(peak: float, replicas: int, replica_tps: float) -> float:
    """The demand scale that makes the peak need exactly ``replicas`` replicas.

    ``replicas × capacity / peak`` can land the peak a float ulp above ``replicas``
    replicas' capacity, which the shortfall test (and so the oracle) takes for one more
    replica: step the factor down by ulps until it does not.
    """
    import numpy as np

    from prescaler.backtest import replicas_needed

    factor = replicas * replica_tps / peak
    while int(replicas_needed(np.array([peak * factor]), replica_tps)[0]) > replicas:
        factor = float(np.nextafter(factor, 0.0))
    return factor


def _reactive(
    args: argparse.Namespace, replica_tps: float, config: Any, reactive_policy: Any
) -> Any:
    """The HPA baseline at ``--hpa-target`` (the brief's 0.7 unless swept)."""
    return reactive_policy(
        replica_tps, config.min_replicas, config.max_replicas, target=args.hpa_target
    )


def _smoothed_oracle(args: argparse.Namespace, demand: Any, config: Any) -> Any:
    """The smoothed-oracle reference: ``k`` x the future's centred rolling mean."""
    from prescaler.backtest import SmoothedOraclePolicy, smoothed_oracle_replicas

    replicas = smoothed_oracle_replicas(
        demand.tokens_per_s,
        config.steps_per_minute,
        config.replica_tokens_per_second,
        config.lag_steps,
        config.min_replicas,
        config.max_replicas,
        k=args.smoothed_oracle_k,
        window_minutes=args.smoothed_window_minutes,
    )
    return SmoothedOraclePolicy(replicas, config.step_seconds)


def _standby_max_replicas(args: argparse.Namespace, config: Any) -> int:
    """The predictive policy's standby bound, as the spec's placeholders set it."""
    from prescaler.api import SpecError
    from prescaler.api import scaling_policy as policy_from_spec

    try:
        return policy_from_spec(pool_spec(args, config)).standby_max_replicas
    except SpecError as exc:
        raise CliError(str(exc)) from None


def _with_standby(args: argparse.Namespace, config: Any) -> Any:
    """The fleet with warm standby simulated: replicas on a warm slot start faster."""
    from dataclasses import replace

    warm = args.warm_start_seconds
    if warm is None:
        warm = min(WARM_START_SECONDS, config.cold_start_seconds)
    elif warm > config.cold_start_seconds:
        raise CliError("--warm-start-seconds must be at most --cold-start-seconds")
    try:
        return replace(
            config, warm_start_seconds=warm, standby_cost_fraction=args.standby_cost_fraction
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _reference_settings(args: argparse.Namespace, config: Any, standby_max: int) -> dict[str, Any]:
    """The JSON's record of the reference and standby knobs this run used."""
    out: dict[str, Any] = {}
    if "reactive" in args.policies:
        out["hpa_target"] = args.hpa_target
    if "smoothed-oracle" in args.policies:
        out["smoothed_oracle"] = {
            "k": args.smoothed_oracle_k,
            "window_minutes": args.smoothed_window_minutes,
        }
    if standby_max > 0:
        out["standby"] = {
            "max_replicas": standby_max,
            "warm_start_seconds": config.warm_start_seconds,
            "cost_fraction": config.standby_cost_fraction,
        }
    return out


def pool_spec(args: argparse.Namespace, config: Any) -> InferencePoolSpec:
    """The InferencePool a user would apply for this fleet, with only the flags given set:
    every other knob is the spec model's default, exactly as the operator would run it."""
    return parsed_spec(pool_raw(args, config))


def parsed_spec(raw: dict[str, Any]) -> InferencePoolSpec:
    from prescaler.api import SpecError, parse_spec

    try:
        return parse_spec(raw)
    except SpecError as exc:
        raise CliError(str(exc)) from None


def pool_raw(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """:func:`pool_spec` as the wire dict, before it is parsed."""
    forecast: dict[str, Any] = {"prometheus": {"url": "http://backtest.invalid"}}
    for flag, wire in (
        ("forecast_model", "model"),
        ("quantile", "quantile"),
        ("observed_headroom", "observedHeadroom"),
        ("headroom", "headroom"),
    ):
        if getattr(args, flag, None) is not None:
            forecast[wire] = getattr(args, flag)
    if args.refit_minutes is not None:
        forecast["refitSeconds"] = max(10, round(args.refit_minutes * 60.0))
    objective: dict[str, Any] = {}
    for flag, wire in (("served_fraction", "servedFraction"), ("adapt_rate", "adaptRate")):
        if getattr(args, flag, None) is not None:
            objective[wire] = getattr(args, flag)
    raw: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "backtest"},
        "minReplicas": config.min_replicas,
        "maxReplicas": config.max_replicas,
        "model": {"tokensPerSecond": config.replica_tokens_per_second},
        "coldStart": {"mode": "fixed", "seconds": min(7200, round(args.cold_start_seconds))},
        "forecast": forecast,
    }
    if objective:
        raw["objective"] = objective
    if args.lead_margin_seconds is not None:
        raw["coldStart"]["marginSeconds"] = args.lead_margin_seconds
    scale_down: dict[str, Any] = {}
    if args.scale_down_stabilization_seconds is not None:
        scale_down["stabilizationSeconds"] = args.scale_down_stabilization_seconds
    if args.scale_down_max_percent is not None:
        scale_down["maxPercent"] = args.scale_down_max_percent
    if args.scale_down_mode is not None:
        scale_down["mode"] = args.scale_down_mode
    if scale_down:
        raw["scaleDown"] = scale_down
    standby_max = getattr(args, "standby_max_replicas", None)
    if standby_max is not None:
        placeholders: dict[str, Any] = {"enabled": standby_max > 0}
        if standby_max > 0:
            placeholders["maxReplicas"] = standby_max
        raw["standby"] = {
            "imagePrePull": {"enabled": standby_max > 0},
            "placeholders": placeholders,
        }
    return raw


def _predictive(
    args: argparse.Namespace,
    demand: Any,
    capacity: Any,
    config: Any,
    windows: list[Any],
    predictive_policy: Any,
    spec: InferencePoolSpec | None = None,
) -> Any:
    from dataclasses import replace

    from prescaler.api import SpecError, forecast_service, risk_objective
    from prescaler.api import scaling_policy as policy_from_spec
    from prescaler.planning import event_windows

    if spec is None:
        spec = pool_spec(args, config)
    assert spec.forecast is not None
    step = args.forecast_step
    margin = spec.cold_start.margin_seconds
    horizon = max(args.cold_start_seconds + margin + step, 2 * step)
    horizon = math.ceil(horizon / step) * step
    placeholders = spec.standby.placeholders
    if placeholders.enabled and placeholders.max_replicas > 0:
        # As the operator: standby covers the forecast's upper peak over the spec's whole
        # horizon, so with standby on the forecaster looks that far ahead.
        horizon = max(horizon, math.ceil(spec.forecast.horizon_seconds / step) * step)
    try:
        service = forecast_service(
            spec.forecast,
            # As the operator does: the windows' occurrences are the forecaster's events.
            events=event_windows(windows, float(demand.start), float(demand.times()[-1]) + horizon),
            horizon_seconds=horizon,
            step_seconds=step,
        )
        policy = replace(
            policy_from_spec(spec),
            scale_down_requires_observation=args.scale_down_requires_observation,
        )
    except (SpecError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return predictive_policy(
        forecaster=service,
        capacity=capacity,
        policy=policy,
        cold_start_seconds=args.cold_start_seconds,
        windows=tuple(windows),
        interval=args.decision_seconds,
        objective=risk_objective(spec),
        # As the operator: it reads spec.forecast.lookbackSeconds of history.
        history_seconds=(
            spec.forecast.lookback_seconds
            if args.history_days is None
            else args.history_days * 86400.0
        ),
    )
