"""Forecast accuracy on real traces: every model and auto, rolling origin, several horizons.

    .venv/bin/python benchmarks/forecast_accuracy.py [--traces DIR] [--only LABEL]

For each trace (``servegen_m_small`` at its 10-minute step, ``nab_nyc_taxi`` at its 30-minute
step, the Azure 2023 code and conversation traces binned to 10 s) and each horizon (5, 10
and 20 minutes) it runs :class:`prescaler_forecast.ForecastService`, exactly as the operator
does, at evenly spaced origins over the last part of the trace; at each origin the service
sees only the data before it. A single model's forecasts for the shorter horizons are the
first steps of its 20-minute forecast (the same points a shorter-horizon service would give);
``auto`` runs its own service per horizon, because selection backtests at that horizon.

Printed per (trace, horizon, model): MAPE and sMAPE (percent; sMAPE is the selection metric),
the coverage of the 90 % upper bound (share of steps with demand <= upper), the fit time
(Prophet's when it ran, else the cheap models': total over the run and per fit) and the
median wall time of one forecast call (the typical call: a cached fit plus nowcast, a
Prophet refit when one is due, or a cheap refit; calls that re-ran auto-selection are
left out and the selections timed apart). A step
whose truth is missing (a collection gap) is not scored. Numbers are printed, not asserted.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prescaler.backtest.traces import Trace, load_trace
from prescaler_forecast import MODEL_NAMES, ForecastService, SelectionConfig, accuracy

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT / ".." / "shared" / "traces"
HORIZONS_MIN = (5, 10, 20)
QUANTILE = 0.9


@dataclass(frozen=True)
class Case:
    """One trace and how to sample origins on it."""

    label: str
    path: str
    fmt: str
    step: float | None
    eval_seconds: float
    """Origins are spread over the last this-many seconds (minus the longest horizon)."""
    origins: int
    refit_seconds: float


CASES = (
    Case(
        "servegen_m_small (10 min)",
        "servegen_m_small/language__m-small_aggregate_rate_10min.csv",
        "servegen",
        None,
        4 * 86_400.0,
        96,
        3600.0,
    ),
    Case(
        "nab_nyc_taxi (30 min)",
        "nab_nyc_taxi/nyc_taxi.csv",
        "nab",
        None,
        28 * 86_400.0,
        224,
        3 * 3600.0,
    ),
    Case(
        "azure_2023 code (10 s)",
        "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "azure",
        10.0,
        25 * 60.0,
        75,
        600.0,
    ),
    Case(
        "azure_2023 conv (10 s)",
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "azure",
        10.0,
        25 * 60.0,
        75,
        600.0,
    ),
)


@dataclass
class Row:
    trace: str
    horizon_min: int
    model: str
    smape: float
    mape: float
    coverage: float
    pairs: int
    fit_total: float
    fits: int
    predict_ms: float
    note: str = ""


def _origins(trace: Trace, case: Case, horizon: float) -> list[float]:
    step = trace.step_seconds
    last = trace.end - horizon
    first = max(trace.start + step, last - case.eval_seconds)
    k = np.unique(np.round(np.linspace(first / step, last / step, case.origins)))
    return [float(v) * step for v in k]


def _truth(trace: Trace, t_end: float) -> float:
    i = round((t_end - trace.step_seconds - trace.start) / trace.step_seconds)
    return float(trace.rps[i]) if 0 <= i < len(trace.rps) else math.nan


def _run(
    trace: Trace,
    case: Case,
    model: str,
    horizon: float,
    origins: list[float],
    lead_steps: dict[int, int],
) -> tuple[
    dict[int, tuple[list[float], list[float], list[float]]],
    float,
    int,
    float,
    Counter[str],
    list[float],
]:
    """Forecast at every origin; return per-horizon (mean, upper, truth) lists and timings."""
    series = trace.rate_series()
    svc = ForecastService(
        model=model,
        horizon_seconds=horizon,
        step_seconds=trace.step_seconds,
        quantile=QUANTILE,
        refit_seconds=case.refit_seconds,
        selection=SelectionConfig(),
    )
    out: dict[int, tuple[list[float], list[float], list[float]]] = {
        h: ([], [], []) for h in lead_steps
    }
    chosen: Counter[str] = Counter()
    call_seconds: list[float] = []
    selection_seconds: list[float] = []
    for origin in origins:
        before_sel = svc.selection
        t0 = time.perf_counter()
        f = svc.forecast(series, origin)
        elapsed = time.perf_counter() - t0
        if svc.selection is not None and svc.selection is not before_sel:
            selection_seconds.append(svc.selection.seconds)
        else:  # the typical call: selections are reported apart
            call_seconds.append(elapsed)
        chosen[f.model if f.status == "ok" else f"{f.model} ({f.status})"] += 1
        for h, n in lead_steps.items():
            means, uppers, truths = out[h]
            for p in f.points[:n]:
                means.append(p.mean)
                uppers.append(p.upper)
                truths.append(_truth(trace, p.t))
    fit_total = sum(r.fit_seconds for r in svc._runners.values())
    fits = sum(r.fit_count for r in svc._runners.values())
    expensive_fits = sum(r.fit_count for r in svc._runners.values() if not r.cheap)
    expensive_fit_total = sum(r.fit_seconds for r in svc._runners.values() if not r.cheap)
    predict_ms = 1000 * float(np.median(call_seconds)) if call_seconds else math.nan
    if expensive_fits:
        fits, fit_total = expensive_fits, expensive_fit_total
    return out, fit_total, fits, predict_ms, chosen, selection_seconds


def evaluate(case: Case, traces_dir: Path) -> list[Row]:
    trace = load_trace(traces_dir / case.path, case.fmt, step_seconds=case.step)
    step = trace.step_seconds
    longest = max(HORIZONS_MIN) * 60.0
    origins = _origins(trace, case, longest)
    steps = {h: math.ceil(h * 60.0 / step - 1e-9) for h in HORIZONS_MIN}
    rows: list[Row] = []
    for model in MODEL_NAMES:
        out, fit_total, fits, predict_ms, chosen, _ = _run(
            trace, case, model, longest, origins, steps
        )
        fallback = sum(v for k, v in chosen.items() if k != model)
        note = (
            f"too little history: fallback at {fallback}/{len(origins)} origins" if fallback else ""
        )
        for h in HORIZONS_MIN:
            means, uppers, truths = out[h]
            smape, mape, _, coverage = accuracy(np.array(means), np.array(uppers), np.array(truths))
            pairs = int(np.isfinite(truths).sum())
            rows.append(
                Row(
                    case.label,
                    h,
                    model,
                    smape,
                    mape,
                    coverage,
                    pairs,
                    fit_total,
                    fits,
                    predict_ms,
                    note,
                )
            )
    for h in HORIZONS_MIN:
        out, fit_total, fits, predict_ms, chosen, selections = _run(
            trace, case, "auto", h * 60.0, origins, {h: steps[h]}
        )
        means, uppers, truths = out[h]
        smape, mape, _, coverage = accuracy(np.array(means), np.array(uppers), np.array(truths))
        sel = (
            f"{len(selections)} selections: first {selections[0]:.1f} s (backtests up to 48 h), "
            f"then median {float(np.median(selections[1:])):.1f} s"
            if len(selections) > 1
            else f"{len(selections)} selection: {sum(selections):.1f} s"
        )
        picks = ", ".join(f"{k} {v}" for k, v in chosen.most_common())
        rows.append(
            Row(
                case.label,
                h,
                "auto",
                smape,
                mape,
                coverage,
                int(np.isfinite(truths).sum()),
                fit_total,
                fits,
                predict_ms,
                f"chose: {picks}; {sel}",
            )
        )
    return rows


def _fmt(v: float, spec: str) -> str:
    return "n/a" if not math.isfinite(v) else format(v, spec)


def markdown(rows: list[Row], cases: tuple[Case, ...]) -> str:
    lines = [
        "| trace | horizon | model | MAPE % | sMAPE % | p90 coverage | fit s (total / per fit) "
        "| forecast ms | note |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        per_fit = row.fit_total / row.fits if row.fits else math.nan
        lines.append(
            f"| {row.trace} | {row.horizon_min} min | {row.model} | {_fmt(row.mape, '.1f')} "
            f"| {_fmt(row.smape, '.1f')} | {_fmt(row.coverage, '.2f')} "
            f"| {row.fit_total:.1f} / {_fmt(per_fit, '.3f')} | {row.predict_ms:.1f} | {row.note} |"
        )
    lines.append("")
    lines.append("Auto against the best single model (by sMAPE):")
    lines.append("")
    for case in cases:
        for h in HORIZONS_MIN:
            sub = [r for r in rows if r.trace == case.label and r.horizon_min == h]
            auto = next(r for r in sub if r.model == "auto")
            singles = [
                r for r in sub if r.model != "auto" and math.isfinite(r.smape) and not r.note
            ]  # models that ran at every origin
            best = min(singles, key=lambda r: r.smape)
            verdict = (
                "no worse"
                if auto.smape <= best.smape + 1e-9
                else (f"WORSE by {auto.smape - best.smape:.1f} points")
            )
            lines.append(
                f"- {case.label}, {h} min: auto {auto.smape:.1f} vs best "
                f"{best.model} {best.smape:.1f}: {verdict}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces",
        type=Path,
        default=DEFAULT_TRACES,
        help="the shared traces folder (default ../shared/traces)",
    )
    parser.add_argument("--only", help="run only cases whose label contains this text")
    args = parser.parse_args(argv)
    cases = tuple(c for c in CASES if not args.only or args.only in c.label)
    rows: list[Row] = []
    for case in cases:
        began = time.perf_counter()
        rows.extend(evaluate(case, args.traces))
        print(f"# {case.label}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
    print(markdown(rows, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
