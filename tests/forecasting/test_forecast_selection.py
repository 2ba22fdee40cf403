"""Auto-selection: pooled evidence and the significance rule for switching models."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from prescaler_forecast import (
    Evidence,
    ModelSpec,
    Selection,
    SelectionConfig,
    select_model,
    series_to_grid,
)
from prescaler_forecast._selection import _chunks, paired_t

DAY = 86_400.0
T0 = 1_704_067_200.0
STEP = 600.0
CANDIDATES = ("recent_trend", "seasonal_naive")


def _evidence(first: float, last: float, a: np.ndarray, b: np.ndarray) -> Evidence:
    """A chunk whose per-pair sMAPE terms are ``a`` (recent_trend) and ``b`` (seasonal)."""
    return Evidence(
        first=first,
        last=last,
        origins=len(a),
        pairs=len(a),
        sums={"recent_trend": float(a.sum()), "seasonal_naive": float(b.sum())},
        squares={"recent_trend": float((a**2).sum()), "seasonal_naive": float((b**2).sum())},
        cross={"recent_trend|seasonal_naive": float((a * b).sum())},
        lead_seconds=STEP,
    )


def _grid(days: float = 3.0) -> tuple[float, np.ndarray]:
    t = T0 + np.arange(round(days * DAY / STEP)) * STEP
    rate = 100.0 * (1 + 0.3 * np.sin(2 * np.pi * (t - T0) / DAY))
    return float(t[0]), rate


def _select(previous: Selection, start: float, values: np.ndarray, now: float) -> Selection:
    return select_model(
        start,
        values,
        now,
        candidates=CANDIDATES,
        spec=ModelSpec("recent_trend", STEP, STEP),
        refit_seconds=3600.0,
        config=SelectionConfig(),
        previous=previous,
    )


@pytest.mark.parametrize(
    ("gap", "noise", "expected"),
    [
        (0.01, 0.10, "recent_trend"),  # lower on average, but within the noise: keep
        (0.05, 0.02, "seasonal_naive"),  # clearly and consistently lower: switch
    ],
)
def test_incumbent_is_kept_unless_the_challenger_is_significantly_better(
    gap: float, noise: float, expected: str
) -> None:
    start, values = _grid()
    now = start + len(values) * STEP
    last = now - STEP  # the last origin whose horizon is observed
    n = 200
    incumbent_terms = np.random.default_rng(0).uniform(0.15, 0.25, n)
    # Differences alternate gap ± noise: mean exactly ``gap``, spread ``noise``.
    challenger_terms = incumbent_terms - gap + noise * np.resize([1.0, -1.0], n)
    evidence = _evidence(last - (n - 1) * STEP, last, incumbent_terms, challenger_terms)
    previous = Selection(
        "recent_trend", 10.0, at=now - 6 * 3600, candidates=CANDIDATES, evidence=(evidence,)
    )
    chosen = _select(previous, start, values, now)
    # Nothing new to backtest: the decision rests on the pooled evidence alone.
    assert chosen.evidence == (evidence,)
    assert chosen.scores["seasonal_naive"] < chosen.scores["recent_trend"]
    assert chosen.model == expected
    assert chosen.kept == (expected == "recent_trend")
    t = paired_t([evidence], "recent_trend", "seasonal_naive")
    assert (t >= SelectionConfig().switch_t) == (expected == "seasonal_naive")


def test_without_an_incumbent_the_lowest_score_wins() -> None:
    start, values = _grid()
    now = start + len(values) * STEP
    last = now - STEP
    a = np.full(50, 0.12)
    b = np.full(50, 0.11)
    evidence = _evidence(last - 49 * STEP, last, a, b)
    previous = Selection("recent_trend", None, at=now - 3600, evidence=(evidence,))
    chosen = _select(previous, start, values, now)
    assert chosen.model == "seasonal_naive"
    assert not chosen.kept
    assert chosen.score == pytest.approx(22.0)


def test_paired_t_matches_a_direct_computation() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.uniform(0, 0.3, 80), rng.uniform(0, 0.3, 80)
    halves = [_evidence(0, 1, a[:30], b[:30]), _evidence(2, 3, a[30:], b[30:])]
    d = a - b
    direct = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert paired_t(halves, "recent_trend", "seasonal_naive") == pytest.approx(direct)
    assert paired_t(halves, "seasonal_naive", "recent_trend") == pytest.approx(-direct)


def test_reselection_backtests_only_new_history_and_forgets_old(
    seasonal: Callable[..., pd.Series],
) -> None:
    s = seasonal(days=4, step=STEP, amplitude=0.8, level=1000.0, seed=2)
    start, values = series_to_grid(s, STEP)
    config = SelectionConfig()
    spec = ModelSpec("recent_trend", STEP, 1200.0)

    def select(now: float, previous: Selection | None) -> Selection:
        cut = round((now - start) / STEP)
        return select_model(
            start,
            values[:cut],
            now,
            candidates=CANDIDATES,
            spec=spec,
            refit_seconds=3600.0,
            config=config,
            previous=previous,
        )

    first = select(T0 + 3 * DAY, None)
    # Two days of seasonal history only: the span after seasonal-naive's one day (+ level).
    assert 1 <= len(first.evidence) <= math.ceil(config.memory_seconds / config.window_seconds)
    assert first.model == "seasonal_naive"
    second = select(T0 + 3 * DAY + 6 * 3600, first)
    new = [e for e in second.evidence if e not in first.evidence]
    assert len(new) == 1
    assert new[0].first > max(e.last for e in first.evidence)
    assert new[0].origins == round(6 * 3600 / STEP)  # every step of the new 6 hours
    assert min(e.first for e in second.evidence) >= second.at - config.memory_seconds - 1e-6
    assert second.origins == sum(e.origins for e in second.evidence)


def test_a_model_that_just_became_eligible_does_not_unseat_a_scored_selection() -> None:
    """A day of noisy, flat demand at 60 s steps: the seasonal naive becomes eligible
    after one day, with no history yet to backtest it. The selection among the models
    that can be scored stands (the noise-averaging recent mean), instead of an unscored
    fall-back to the first candidate (persistence, whose forecast jumps with the noise)."""
    step = 60.0
    rng = np.random.default_rng(3)
    n = round(DAY / step) + 30  # a day and half an hour
    values = 20.0 * (1.0 + rng.normal(0.0, 0.2, n))
    candidates = ("persistence", "recent_mean", "seasonal_naive")
    now = T0 + n * step
    spec = ModelSpec("persistence", step, 600.0)
    early = select_model(
        T0,
        values[: n - 60],
        now - 60 * step,
        candidates=candidates[:2],
        spec=spec,
        refit_seconds=600.0,
    )
    assert early.model == "recent_mean"
    assert early.score is not None
    later = select_model(
        T0, values, now, candidates=candidates, spec=spec, refit_seconds=600.0, previous=early
    )
    assert later.candidates == candidates
    assert later.model == "recent_mean"
    assert later.score is not None
    assert "seasonal_naive" not in later.scores  # joins once it has history to be scored


def _selections(
    values: np.ndarray, days: tuple[float, float], spec: ModelSpec, candidates: tuple[str, ...]
) -> dict[float, Selection]:
    """Select every 6 hours from ``days[0]`` to ``days[1]`` (as a service does), each
    selection pooling the previous one's evidence; keyed by the day it was made."""
    out: dict[float, Selection] = {}
    previous = None
    per = round(6 * 3600 / STEP)
    for k in range(round(days[0] * 4), round(days[1] * 4) + 1):
        now = T0 + k * per * STEP
        previous = select_model(
            T0,
            values[: k * per],
            now,
            candidates=candidates,
            spec=spec,
            refit_seconds=600.0,
            previous=previous,
        )
        out[k / 4] = previous
    return out


def test_where_the_series_stops_repeating_persistence_takes_over() -> None:
    """Four days of a clean daily cycle, then two of a random walk: the seasonal naive
    wins while the day repeats; once it does not, the baseline (persistence or the recent
    mean) is back within a day, although the seasonal model still has the lower score on
    the 48 hours of pooled evidence for most of that day. (Before, the seasonal incumbent
    was kept until persistence was *significantly* better over the whole memory: until
    day 5.25.)"""
    t = np.arange(round(6 * DAY / STEP)) * STEP
    daily = 1000.0 * (1 + 0.5 * np.sin(2 * np.pi * t / DAY))
    walk = 1000.0 * np.exp(np.cumsum(np.random.default_rng(1).normal(0.0, 0.03, len(t))))
    turn = round(4 * DAY / STEP)
    values = np.where(t < 4 * DAY, daily, np.maximum(1.0, walk - walk[turn] + daily[turn]))
    candidates = ("persistence", "recent_mean", "seasonal_naive")
    chosen = _selections(values, (3.0, 6.0), ModelSpec("persistence", STEP, 1800.0), candidates)
    assert all(s.model == "seasonal_naive" for day, s in chosen.items() if day <= 4.0)
    late = {day: s for day, s in chosen.items() if day >= 4.75}
    assert all(s.model in ("persistence", "recent_mean") for s in late.values()), {
        day: s.model for day, s in late.items()
    }


def test_a_clean_daily_cycle_keeps_the_seasonal_model() -> None:
    """A daily cycle with noise: the seasonal naive is significantly better than the
    baselines at the lookahead, so it wins every selection (the baselines are the
    incumbents, not a ceiling)."""
    t = np.arange(round(6 * DAY / STEP)) * STEP
    noise = np.exp(np.random.default_rng(4).normal(0.0, 0.01, len(t)))
    values = 1000.0 * (1 + 0.5 * np.sin(2 * np.pi * t / DAY)) * noise
    candidates = ("persistence", "recent_mean", "seasonal_naive")
    chosen = _selections(values, (2.0, 6.0), ModelSpec("persistence", STEP, 1800.0), candidates)
    assert {s.model for s in chosen.values()} == {"seasonal_naive"}
    assert all(not s.kept for s in chosen.values())


def test_candidates_are_scored_at_the_lookahead_not_the_whole_horizon() -> None:
    """A daily cycle on a level that wanders slowly (an AR(1) deviation): over two hours
    the day's shape matters most and the seasonal naive wins; over the next quarter hour
    (the plan's lookahead) the level does, and persistence wins. The service forecasts two
    hours; selection scores what the plan reads."""
    t = np.arange(round(5 * DAY / STEP)) * STEP
    rng = np.random.default_rng(2)
    deviation = np.zeros(len(t))
    for i in range(1, len(t)):
        deviation[i] = 0.98 * deviation[i - 1] + rng.normal(0.0, 0.03)
    values = 1000.0 * (1 + 0.5 * np.sin(2 * np.pi * t / DAY)) * np.exp(deviation)
    spec = ModelSpec("persistence", STEP, 7200.0)
    now = T0 + len(t) * STEP

    def pick(config: SelectionConfig) -> str:
        return select_model(
            T0,
            values,
            now,
            candidates=("persistence", "seasonal_naive"),
            spec=spec,
            refit_seconds=600.0,
            config=config,
        ).model

    assert SelectionConfig().lookahead_seconds == 900.0
    assert pick(SelectionConfig()) == "persistence"
    assert pick(SelectionConfig(lookahead_seconds=None)) == "seasonal_naive"


def test_weighted_paired_t_counts_recent_chunks_more() -> None:
    """With equal weights it is the plain paired t; a weight of zero drops a chunk."""
    rng = np.random.default_rng(5)
    a, b = rng.uniform(0, 0.3, 80), rng.uniform(0, 0.3, 80)
    halves = [_evidence(0, 1, a[:30], b[:30]), _evidence(2, 3, a[30:], b[30:])]
    assert paired_t(halves, "recent_trend", "seasonal_naive", [1.0, 1.0]) == pytest.approx(
        paired_t(halves, "recent_trend", "seasonal_naive")
    )
    d = a[30:] - b[30:]
    direct = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert paired_t(halves, "recent_trend", "seasonal_naive", [0.0, 0.7]) == pytest.approx(direct)


def test_a_remainder_of_a_few_steps_joins_the_chunk_before_it() -> None:
    """New history a little longer than one window is one chunk (one Prophet fit), not a
    window plus a chunk of a few origins with a fit of its own."""
    window = 6 * 3600.0
    step = 60.0
    lo = T0
    pieces = _chunks(lo, lo + window + 3 * step, step, window)
    assert pieces == [(lo, lo + window + 3 * step)]
    # A remainder of a quarter window or more stays a chunk of its own.
    pieces = _chunks(lo, lo + window + window / 4, step, window)
    assert pieces == [(lo, lo + window - step), (lo + window, lo + window + window / 4)]
    # The first selection's 48 hours: eight windows.
    assert len(_chunks(lo, lo + 8 * window - step, step, window)) == 8
