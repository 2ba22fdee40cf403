"""Forecast accuracy at the plan's lookahead: ``model: auto`` against each single model.

    .venv/bin/python benchmarks/forecast_accuracy.py [--traces DIR] [--only LABEL]
        [--first-halves] [--no-readme] [--origins N] [--half-life S] [--switch-t T]
        [--memory S]

For each trace (``servegen_m_small`` at its 10-minute step, ``nab_nyc_taxi`` at its
30-minute step, the Azure 2023 code and conversation traces binned to 10 s, and the two
generated minute-level traces of ``benchmarks/synthetic_traces.py``, ``web`` and
``stream``, fixed seeds, and the real minute-level traces of ``benchmarks/fetch_traces.py``,
``flights`` and ``retail``) it runs :class:`prescaler_forecast.ForecastService`, built as the
operator and the backtest build it (``prescaler.api.forecast_service`` from the spec's
defaults, at the trace's step), at evenly spaced origins over the **second half** of the
trace (``--first-halves``: over the first half, after the first three days or the first
ten minutes, the span the selection's knobs were chosen on). At each origin the service
sees only the data before it.

The horizon is the **lookahead** the plan reads, computed as the backtest does: a cold
start (240 s or 600 s) plus the spec's margin plus one step, rounded up to the step (at
least two steps). A single model runs once at the longer lookahead (its shorter one is the
first steps of the same forecasts); ``auto`` runs its own service per lookahead, because
its selection scores at that horizon.

Scored per (trace, lookahead, model): sMAPE in percent over every (origin, step) pair
inside the lookahead (the points the plan takes its peak over; a step whose truth is
missing, a collection gap, is not scored), and the coverage of the upper band. The
**baselines** are persistence and the recent (10-minute) mean, which need no history
beyond the last minutes; the target is auto within 10 % of the better of them on every
trace, and at least 10 % below it on traces with a daily cycle. Every other model is
shown beside them. A model that lacked the history at some origins (it answered with the
last-level fallback) is marked. The result goes between this script's markers in
``benchmarks/README.md`` (second halves at the defaults and each case's origins only;
``--no-readme`` prints; ``--origins`` spreads fewer, for a trace whose every origin is
slow to fit).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from _readme import replace_section  # the scripts run with benchmarks/ on sys.path
from fetch_traces import ensure as fetch_trace
from prescaler.api import ColdStartSpec, ForecastSpec, forecast_service
from prescaler.backtest.traces import Trace, load_trace
from prescaler_forecast import MODEL_NAMES, ForecastService, SelectionConfig, accuracy
from synthetic_traces import write as write_synthetic

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT / ".." / "shared" / "traces"
BEGIN, END = "<!-- forecast-accuracy:begin -->", "<!-- forecast-accuracy:end -->"
COLD_STARTS = (240.0, 600.0)
BASELINES = ("persistence", "recent_mean")
GENERATED = "generated:"
"""A case path that names a generator of ``synthetic_traces.py`` instead of a file."""
FETCHED = "fetched:"
"""A case path that names a real trace of ``fetch_traces.py`` (fetched on first use)."""


@dataclass(frozen=True)
class Case:
    """One trace and how many origins to spread over the half that is scored."""

    label: str
    path: str
    fmt: str
    step: float | None
    origins: int
    daily: bool
    """Whether the trace has a daily cycle (auto must then beat the baselines by 10 %)."""
    warmup_seconds: float = 3 * 86_400.0
    """The first half's origins start this far into the trace (history for the models)."""


CASES = (
    Case(
        "servegen_m_small (10 min)",
        "servegen_m_small/language__m-small_aggregate_rate_10min.csv",
        "servegen",
        None,
        168,
        True,
    ),
    Case("nab_nyc_taxi (30 min)", "nab_nyc_taxi/nyc_taxi.csv", "nab", None, 240, True),
    Case(
        "azure_2023 code (10 s)",
        "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "azure",
        10.0,
        90,
        False,
        600.0,
    ),
    Case(
        "azure_2023 conv (10 s)",
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "azure",
        10.0,
        90,
        False,
        600.0,
    ),
    Case("generated web (1 min)", f"{GENERATED}web", "rate", None, 168, True),
    Case("generated stream (1 min)", f"{GENERATED}stream", "rate", None, 168, True),
    Case("flights (1 min)", f"{FETCHED}flights", "rate", None, 168, True),
    Case("retail (1 min)", f"{FETCHED}retail", "rate", None, 168, True),
)


@dataclass
class Result:
    trace: str
    lookahead: float
    model: str
    smape: float
    coverage: float
    pairs: int
    fallback: int
    """Origins where the model lacked the history and the last level answered."""
    picks: Counter[str] = field(default_factory=Counter)


def lookahead_seconds(cold_start: float, step: float) -> float:
    """The backtest's forecast horizon: cold start + margin + one step, on the grid."""
    margin = float(ColdStartSpec.default_of("margin_seconds"))
    return math.ceil(max(cold_start + margin + step, 2 * step) / step - 1e-9) * step


def _origins(trace: Trace, case: Case, horizon: float, first_half: bool) -> list[float]:
    step = trace.step_seconds
    middle = trace.start + (trace.end - trace.start) / 2
    lo, hi = (trace.start + case.warmup_seconds, middle) if first_half else (middle, trace.end)
    hi = min(hi, trace.end - horizon)
    k = np.unique(np.round(np.linspace(lo / step, hi / step, case.origins)))
    return [float(v) * step for v in k]


def _service(
    model: str, horizon: float, step: float, config: SelectionConfig | None
) -> ForecastService:
    """The service the backtest builds for a pool that sets only ``model`` (the spec's
    defaults; its Prometheus is not read here)."""
    svc = forecast_service(
        ForecastSpec.model_construct(model=model), horizon_seconds=horizon, step_seconds=step
    )
    if config is not None:
        svc.selection_config = config
    return svc


def _run(
    trace: Trace, svc: ForecastService, origins: list[float], horizons: dict[float, int]
) -> tuple[dict[float, tuple[list[float], list[float], list[float]]], Counter[str]]:
    """Forecast at every origin: per lookahead the (mean, upper, truth) lists, and which
    model answered (with its status when it was not ``ok``)."""
    series = trace.rate_series()
    step = trace.step_seconds
    out: dict[float, tuple[list[float], list[float], list[float]]] = {
        h: ([], [], []) for h in horizons
    }
    answered: Counter[str] = Counter()
    for origin in origins:
        f = svc.forecast(series, origin)
        answered[f.model if f.status == "ok" else f"{f.model} ({f.status})"] += 1
        for h, n in horizons.items():
            means, uppers, truths = out[h]
            for p in f.points[:n]:
                i = round((p.t - step - trace.start) / step)
                means.append(p.mean)
                uppers.append(p.upper)
                truths.append(float(trace.rps[i]) if 0 <= i < len(trace.rps) else math.nan)
    return out, answered


def _score(
    label: str,
    h: float,
    model: str,
    data: tuple[list[float], list[float], list[float]],
    answered: Counter[str],
) -> Result:
    means, uppers, truths = (np.asarray(v, dtype=float) for v in data)
    smape, _, _, coverage = accuracy(means, uppers, truths)
    fallback = sum(v for k, v in answered.items() if k != model) if model != "auto" else 0
    return Result(label, h, model, smape, coverage, int(np.isfinite(truths).sum()), fallback)


def load(case: Case, traces_dir: Path, generated_dir: Path) -> Trace:
    if case.path.startswith(GENERATED):
        path = generated_dir / f"{case.path.removeprefix(GENERATED)}.csv"
        return load_trace(path, case.fmt)
    if case.path.startswith(FETCHED):
        return load_trace(fetch_trace(case.path.removeprefix(FETCHED)), case.fmt)
    return load_trace(traces_dir / case.path, case.fmt, step_seconds=case.step)


def evaluate(
    case: Case, trace: Trace, first_half: bool, config: SelectionConfig | None
) -> list[Result]:
    step = trace.step_seconds
    horizons = {lookahead_seconds(c, step): 0 for c in COLD_STARTS}
    horizons = {h: round(h / step) for h in sorted(horizons)}
    longest = max(horizons)
    origins = _origins(trace, case, longest, first_half)
    results: list[Result] = []
    for model in MODEL_NAMES:
        svc = _service(model, longest, step, None)
        out, answered = _run(trace, svc, origins, horizons)
        results.extend(_score(case.label, h, model, out[h], answered) for h in horizons)
    for h, n in horizons.items():
        svc = _service("auto", h, step, config)
        out, answered = _run(trace, svc, origins, {h: n})
        result = _score(case.label, h, "auto", out[h], answered)
        result.picks = answered
        results.append(result)
    return results


def _fmt(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:.0f} s"


def markdown(results: list[Result], cases: tuple[Case, ...]) -> str:
    """The headline (auto against the baselines, per trace and lookahead) and the table of
    every model."""
    head = [
        "| trace | cold start | lookahead | auto sMAPE % | persistence | recent mean "
        "| auto ÷ best baseline | target | met | auto chose |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    full = [
        "| trace | lookahead | " + " | ".join(MODEL_NAMES) + " | auto | auto p-upper coverage |",
        "|---|---:|" + "---:|" * (len(MODEL_NAMES) + 2),
    ]
    met_all = True
    for case in cases:
        mine = [r for r in results if r.trace == case.label]
        if not mine:
            continue
        horizons = sorted({r.lookahead for r in mine})
        for cold, h in zip(
            COLD_STARTS, horizons if len(horizons) > 1 else horizons * 2, strict=True
        ):
            at = {r.model: r for r in mine if r.lookahead == h}
            auto = at["auto"]
            base = min(at[b].smape for b in BASELINES)
            ratio = auto.smape / base if base > 0 else math.inf
            bound = 0.9 if case.daily else 1.1
            met = ratio <= bound
            met_all &= met
            picks = ", ".join(f"{k} {v}" for k, v in auto.picks.most_common())
            head.append(
                f"| {case.label} | {cold:.0f} s | {_minutes(h)} | {_fmt(auto.smape)} "
                f"| {_fmt(at['persistence'].smape)} | {_fmt(at['recent_mean'].smape)} "
                f"| {ratio:.2f} | {'≤ 0.90 (daily)' if case.daily else '≤ 1.10'} "
                f"| {'yes' if met else '**no**'} | {picks} |"
            )
        for h in horizons:
            at = {r.model: r for r in mine if r.lookahead == h}
            cells = [
                _fmt(at[m].smape) + (f" ({at[m].fallback} fb)" if at[m].fallback else "")
                for m in MODEL_NAMES
            ]
            full.append(
                f"| {case.label} | {_minutes(h)} | {' | '.join(cells)} "
                f"| **{_fmt(at['auto'].smape)}** | {at['auto'].coverage:.2f} |"
            )
    verdict = "met on every trace" if met_all else "**not met on every trace**"
    return "\n".join([*head, "", f"Target {verdict}.", "", "Every model (sMAPE %):", "", *full])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces",
        type=Path,
        default=DEFAULT_TRACES,
        help="the shared traces folder (default ../shared/traces)",
    )
    parser.add_argument("--only", help="run only cases whose label contains this text")
    parser.add_argument(
        "--first-halves", action="store_true", help="score the first halves (fitting knobs)"
    )
    parser.add_argument("--no-readme", action="store_true", help="print only")
    parser.add_argument(
        "--origins", type=int, help="forecast origins per trace (default: each case's own)"
    )
    parser.add_argument("--half-life", type=float, help="SelectionConfig.half_life_seconds")
    parser.add_argument("--switch-t", type=float, help="SelectionConfig.switch_t")
    parser.add_argument("--memory", type=float, help="SelectionConfig.memory_seconds")
    args = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in (
            ("half_life_seconds", args.half_life),
            ("switch_t", args.switch_t),
            ("memory_seconds", args.memory),
        )
        if v is not None
    }
    config = replace(SelectionConfig(), **overrides) if overrides else None
    cases = tuple(c for c in CASES if not args.only or args.only in c.label)
    if args.origins is not None:
        cases = tuple(replace(c, origins=args.origins) for c in cases)
    generated = Path(tempfile.mkdtemp(prefix="prescaler-traces-"))
    write_synthetic(generated)
    results: list[Result] = []
    for case in cases:
        began = time.perf_counter()
        trace = load(case, args.traces, generated)
        results.extend(evaluate(case, trace, args.first_halves, config))
        print(f"# {case.label}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
    text = markdown(results, cases)
    print(text)
    partial = args.only or overrides or args.origins is not None
    if not (args.no_readme or args.first_halves or partial):
        replace_section(BEGIN, END, text, "Forecast accuracy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
