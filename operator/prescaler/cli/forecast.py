"""``prescaler forecast``: forecast a trace's demand after time ``--at``, from the data before it.

Reads the trace (any format of ``prescaler backtest``), keeps only the data before
``--at``, runs the same :class:`prescaler_forecast.ForecastService` the operator runs and
prints the forecast: requests per second per step covering ``(at, at + horizon]``.

With ``--json`` it prints one JSON object::

    {"model": ..., "score": ..., "step_seconds": ..., "status": ..., "detail": ...,
     "quantile": ..., "generated_at": ...,
     "points": [{"t": unix_seconds, "mean": rps, "lower": rps, "upper": rps}, ...]}

``score`` is the sMAPE (percent) of the chosen model in the rolling-origin backtest that
chose it (``null`` for a fixed ``--model``). With too little history the answer is
explicit: ``"status": "insufficient_history"`` and a flat fallback from the last level.
"""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime
from typing import Annotated, Any

from prescaler.api import ForecastSpec
from prescaler.cli._common import CliError, positive_float, print_json
from prescaler_forecast import MODEL_NAMES

_MODELS = ", ".join(("auto", *MODEL_NAMES))
_SPEC_DEFAULTS = {
    name: ForecastSpec.default_of(name) for name in ("model", "quantile", "seasonality_periods")
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "forecast",
        help="forecast a trace's demand after a given time from the data before it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", required=True, metavar="FILE", help="trace file")
    parser.add_argument(
        "--format",
        required=True,
        dest="fmt",
        metavar="F",
        help="azure, servegen, nab, requests or rate",
    )
    parser.add_argument(
        "--at",
        required=True,
        type=parse_time,
        metavar="T",
        help="forecast time: unix seconds or ISO-8601 (naive = UTC); only data before it is used",
    )
    parser.add_argument("--horizon-minutes", required=True, type=positive_float, metavar="H")
    parser.add_argument(
        "--model",
        default=_SPEC_DEFAULTS["model"],
        help=f"one of: {_MODELS} (default: the InferencePool spec's, {_SPEC_DEFAULTS['model']})",
    )
    parser.add_argument(
        "--lookback-days",
        type=positive_float,
        metavar="D",
        help="use only this much history before --at (default: all of it)",
    )
    parser.add_argument(
        "--step-seconds",
        type=positive_float,
        metavar="S",
        help="forecast step (default: the trace's own step; 60 s for per-request formats)",
    )
    parser.add_argument(
        "--quantile",
        type=_upper_quantile,
        default=_SPEC_DEFAULTS["quantile"],
        help=f"upper quantile (default: the spec's, {_SPEC_DEFAULTS['quantile']})",
    )
    parser.add_argument(
        "--seasonality-periods",
        type=_periods,
        default=_SPEC_DEFAULTS["seasonality_periods"],
        metavar="S[,S...]",
        help="the demand's cycles in seconds, comma-separated (default: the spec's, "
        f"{','.join(map(str, _SPEC_DEFAULTS['seasonality_periods']))}: a day and a week)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO-8601 time (a naive one is read as UTC)."""
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not unix seconds or ISO-8601: {text!r}") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite time: {text!r}")
    return value


def _upper_quantile(text: str) -> float:
    value = positive_float(text)
    if not 0.5 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0.5, 1), got {text}")
    return value


def _periods(text: str) -> list[int]:
    """Seconds, comma-separated, checked as the spec checks ``seasonalityPeriods``."""
    from pydantic import TypeAdapter, ValidationError

    field = ForecastSpec.model_fields["seasonality_periods"]
    shape: Any = Annotated[(field.annotation, *field.metadata)]  # the spec field's own checks
    check: TypeAdapter[list[int]] = TypeAdapter(shape)
    try:
        return check.validate_python([int(part) for part in text.split(",") if part.strip()])
    except (ValueError, ValidationError) as exc:
        first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise argparse.ArgumentTypeError(f"bad seasonality periods {text!r}: {first}") from None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


def run(args: argparse.Namespace) -> int:
    from prescaler.backtest.traces import load_trace
    from prescaler_forecast import ForecastService

    trace = load_trace(args.trace, args.fmt, step_seconds=args.step_seconds)
    at: float = args.at
    if not trace.start < at <= trace.end:
        raise CliError(
            f"--at {_iso(at)} is outside the trace ({_iso(trace.start)} .. {_iso(trace.end)}]"
        )
    history = trace.rate_series()
    if args.lookback_days is not None:
        first = at - args.lookback_days * 86_400.0
        history = history[history.index >= datetime.fromtimestamp(first, tz=UTC)]
    service = ForecastService(
        model=args.model,
        horizon_seconds=args.horizon_minutes * 60.0,
        step_seconds=trace.step_seconds,
        quantile=args.quantile,
        lookback_seconds=None if args.lookback_days is None else args.lookback_days * 86_400.0,
        seasonality_periods=args.seasonality_periods,
    )
    forecast = service.forecast(history, at)
    if args.json:
        print_json(
            {
                "model": forecast.model,
                "score": None if forecast.score is None else round(forecast.score, 4),
                "step_seconds": forecast.step_seconds,
                "status": forecast.status,
                "detail": forecast.detail,
                "quantile": forecast.quantile,
                "generated_at": forecast.generated_at,
                "points": [
                    {
                        "t": p.t,
                        "mean": round(p.mean, 6),
                        "lower": round(p.lower, 6),
                        "upper": round(p.upper, 6),
                    }
                    for p in forecast.points
                ],
            }
        )
        return 0
    score = "-" if forecast.score is None else f"{forecast.score:.2f} % sMAPE"
    print(f"model {forecast.model}  score {score}  status {forecast.status}")
    if forecast.detail:
        print(f"  {forecast.detail}")
    print(f"{'step end (UTC)':<22} {'mean rps':>12} {f'p{forecast.quantile * 100:g} rps':>12}")
    for p in forecast.points:
        print(f"{_iso(p.t):<22} {p.mean:>12.3f} {p.upper:>12.3f}")
    return 0
