"""Where the generated traces' unserved demand falls, and what a perfect forecast of
their day would add to the HPA.

Run from the project root::

    .venv/bin/python benchmarks/events.py               # about 25 minutes on 2 cores
    .venv/bin/python benchmarks/events.py --seeds 0     # the frontier's traces only
    .venv/bin/python benchmarks/events.py --from-points # tables from the stored results

For each generated trace (``benchmarks/synthetic_traces.py``) and cold start, on the
held-out half the frontier replays (the last 7 of 14 days), through the same code as
``benchmarks/frontier.py``:

* **Where the unserved tokens fall.** The share of the HPA's (target 0.7) and of the
  default's late tokens that arrived in an event (a web burst, a stream launch) or in the
  30 minutes after it, and how many minutes those are.
* **A perfect forecast of the day beside the HPA.** The generator's expected rate without
  noise or events, known for every future minute, as a trigger beside the HPA as KEDA
  runs two (each recommends, the larger wins, then the HPA's stabilization and rate
  limits): ``k`` x the day, planned one cold start ahead, with ``k`` and the HPA's target
  swept. Its lower envelope, read against the HPA's curve at the default's GPU-hours
  (the frontier ratio a perfect seasonal forecaster would reach this way), and at 0.9 x
  the HPA's GPU-hours (the daily-cycle target's cost), ÷ the HPA's unserved tokens.
* **The default on other weeks of the same traffic.** The default point (unserved and
  GPU-hours ÷ the HPA's, the frontier ratio) on the frontier's seed and on ``--seeds``
  more seeds of each generator: traffic of the same kind that no knob was chosen on,
  and the spread of a score that a few events decide.

It writes the results to ``benchmarks/frontier/events.json`` and the tables to
``benchmarks/README.md`` between the ``generated-events:begin``/``generated-events:end`` markers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import frontier as F  # the scripts run with benchmarks/ on sys.path
from _readme import replace_section
from synthetic_traces import GENERATORS, Generated, write_rate

RESULTS = F.PLOTS / "events.json"
BEGIN, END = "<!-- generated-events:begin -->", "<!-- generated-events:end -->"
FRONTIER_SEEDS = {"web": 11, "stream": 23}
"""The seeds the frontier's generated traces use (the generators' defaults)."""
TAIL_MINUTES = 30
"""Minutes after an event still counted as its own: the queue it left drains."""
DAY_K = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0)
DAY_TARGETS = (0.6, 0.7, 0.8, 0.9, 0.95)
DAILY_GPU = 0.9
"""The daily-cycle target's GPU-hours, ÷ the HPA's (its unserved target: 0.5 x)."""


@dataclass
class DayOracleBesideHpa:
    """``k`` x the day's expected demand, planned one cold start ahead (an oracle of the
    day, not of its noise or events), as a trigger beside the HPA: the larger wins."""

    plan: np.ndarray
    hpa: Any
    name: str = "day-oracle"

    @property
    def interval_seconds(self) -> float:
        return float(self.hpa.sync_seconds)

    def decide(self, obs: Any) -> int:
        planned = int(self.plan[min(obs.step, len(self.plan) - 1)])
        return int(self.hpa.decide(obs, external=planned))


@dataclass
class Cell:
    trace: str
    seed: int
    cold: int
    events: int
    event_minutes: int
    replay_minutes: int
    hpa_in_events: float | None
    default_in_events: float | None
    points: list[dict[str, Any]] = field(default_factory=list)


def late_tokens_per_minute(run: Any, demand: Any, config: Any) -> np.ndarray:
    """Tokens not served in the step they arrived, per replayed minute (the score's queue)."""
    from prescaler.backtest import fluid_queue

    spm = config.steps_per_minute
    minutes = len(run.ready_per_step) // spm
    arrivals = np.repeat(demand.replay_tokens_per_s[:minutes], spm) * config.step_seconds
    capacity = run.ready_per_step * config.replica_tokens_per_second * config.step_seconds
    _, late = fluid_queue(arrivals, capacity.astype(float))
    return np.asarray(late[: minutes * spm].reshape(minutes, spm).sum(axis=1))


def event_mask(generated: Generated, replay_from: int, minutes: int) -> np.ndarray:
    """Replayed minutes in an event or the :data:`TAIL_MINUTES` after it."""
    mask = np.zeros(minutes, dtype=bool)
    for e in generated.events:
        lo, hi = e.start - replay_from, e.end - replay_from + TAIL_MINUTES
        if hi > 0 and lo < minutes:
            mask[max(lo, 0) : min(hi, minutes)] = True
    return mask


def share_in(late: np.ndarray, mask: np.ndarray) -> float | None:
    total = float(late.sum())
    return float(late[mask].sum()) / total if total > 0 else None


def envelope(points: list[F.Point]) -> list[F.Point]:
    """The points no cheaper point beats on unserved tokens, cheapest first."""
    out: list[F.Point] = []
    for p in sorted(points, key=lambda p: (p.gpu_hours, p.unserved)):
        if not out or p.unserved < out[-1].unserved:
            out.append(p)
    return out


def replay_cell(job: tuple[str, int, int]) -> Cell:
    from prescaler.backtest import HPA_TARGET, oracle_replicas, reactive_policy, score, simulate

    name, seed, cold = job
    generated = GENERATORS[name](seed)
    path = write_rate(
        Path(tempfile.mkdtemp(prefix="prescaler-events-")) / f"{name}.csv", generated.rate
    )
    prep, one, replay = F.replayer(F.synthetic_args(path), cold)
    demand, config = prep.demand, prep.config
    points = F.reference_points(one, replay)

    def run(policy: Any) -> tuple[Any, F.Point]:
        r = simulate(demand, policy, config)
        s = score(r, demand, config)
        return r, F.Point(
            policy.name, "", 0.0, False, s.unserved_token_fraction, s.gpu_hours, s.shortfall_minutes
        )

    hpa_run, _ = run(reactive_policy(config, HPA_TARGET))
    default_run, d = run(one("predictive", []))
    points.append(
        F.Point("predictive", "relative", 0.0, True, d.unserved, d.gpu_hours, d.shortfall_minutes)
    )
    minutes = len(hpa_run.ready_per_step) // config.steps_per_minute
    mask = event_mask(generated, demand.replay_from, minutes)

    # The day's tokens per second on the replay's scale (the trace is scaled to its peak).
    seen = generated.rate[: len(demand)] > 0
    scale = float(np.median(demand.tokens_per_s[seen] / generated.rate[: len(demand)][seen]))
    day = np.repeat(generated.day[: len(demand)] * scale, config.steps_per_minute)
    day_points = []
    for k in DAY_K:
        plan = oracle_replicas(
            k * day, config.replica_tokens_per_second, config.lag_steps,
            config.min_replicas, config.max_replicas,
        )  # fmt: skip
        for t in DAY_TARGETS:
            _, p = run(DayOracleBesideHpa(plan, reactive_policy(config, t)))
            day_points.append(
                F.Point("day-oracle", "k", k, False, p.unserved, p.gpu_hours, p.shortfall_minutes)
            )
    # The envelope takes the HPA alone too (k 0): the day beside it can only add replicas.
    hpa_curve = [p for p in points if p.policy == "reactive"]
    points += envelope(
        day_points + [F.Point("day-oracle", "k", 0.0, False, *_ups(p)) for p in hpa_curve]
    )
    return Cell(
        trace=name,
        seed=seed,
        cold=cold,
        events=int(sum(1 for e in generated.events if 0 <= e.start - demand.replay_from < minutes)),
        event_minutes=int(mask.sum()),
        replay_minutes=minutes,
        hpa_in_events=share_in(late_tokens_per_minute(hpa_run, demand, config), mask),
        default_in_events=share_in(late_tokens_per_minute(default_run, demand, config), mask),
        points=[asdict(p) for p in points],
    )


def _ups(p: F.Point) -> tuple[float, float, int]:
    return p.unserved, p.gpu_hours, p.shortfall_minutes


def _short(x: float) -> str:
    return "∞" if x == math.inf else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def tables(cells: list[Cell]) -> str:
    own = [c for c in cells if c.seed == FRONTIER_SEEDS[c.trace]]
    lines = [
        "The frontier's traces (held out: the last 7 of 14 days):",
        "",
        "| trace | cold start | events | their minutes (+30 after each) "
        "| HPA's late tokens in them | default's late tokens in them "
        "| day oracle beside the HPA: frontier ratio at the default's GPU-hours "
        "| …: unserved ÷ HPA at 0.9 × its GPU-hours |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in own:
        pts = [F.Point(**p) for p in c.points]
        hpa = F.hpa_point(pts)
        d = F.default_point(pts)
        on_hpa = F.curve_at(pts, "reactive", d.gpu_hours)
        on_day = F.curve_at(pts, "day-oracle", d.gpu_hours)
        daily = F.curve_at(pts, "day-oracle", DAILY_GPU * hpa.gpu_hours)
        ratio = on_day / on_hpa if on_day is not None and on_hpa else None
        daily_share = daily / hpa.unserved if daily is not None and hpa.unserved > 0 else None
        lines.append(
            f"| {c.trace} | {c.cold} s | {c.events} | {c.event_minutes} of {c.replay_minutes} "
            f"| {_pct(c.hpa_in_events)} | {_pct(c.default_in_events)} | {F._fmt(ratio)} "
            f"| {F._fmt(daily_share)} |"
        )
    lines += [
        "",
        "The default on other seeds of the same generators (held out the same way; the "
        "frontier's seed in bold):",
        "",
        "| trace | cold start | seed | events | unserved ÷ HPA | GPU-h ÷ HPA | frontier ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in sorted(
        cells, key=lambda c: (c.trace, c.cold, c.seed != FRONTIER_SEEDS[c.trace], c.seed)
    ):
        pts = [F.Point(**p) for p in c.points]
        h = F.default_headline(pts)
        seed = f"**{c.seed}**" if c.seed == FRONTIER_SEEDS[c.trace] else str(c.seed)
        lines.append(
            f"| {c.trace} | {c.cold} s | {seed} | {c.events} | {F._fmt(h.unserved)} "
            f"| {h.gpu_hours:.3f} | {h.ratio_text} |"
        )
    lines += [
        "",
        "| trace | cold start | seeds | frontier ratio: median (min–max) | seeds at ≤ 0.8 "
        "| seeds worse than the HPA on both axes |",
        "|---|---|---:|---|---:|---:|",
    ]
    groups: dict[tuple[str, int], list[tuple[float, bool]]] = {}
    for c in cells:
        pts = [F.Point(**p) for p in c.points]
        h = F.default_headline(pts)
        if h.frontier_ratio is not None:
            groups.setdefault((c.trace, c.cold), []).append((h.frontier_ratio, h.worse_on_both))
    for (trace, cold), rows in sorted(groups.items()):
        ratios = [r for r, _ in rows]
        span = f"{_short(min(ratios))}–{_short(max(ratios))}"
        lines.append(
            f"| {trace} | {cold} s | {len(rows)} | {_short(statistics.median(ratios))} ({span}) "
            f"| {sum(r <= 0.8 for r in ratios)} | {sum(b for _, b in rows)} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4, help="more seeds of each generator")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--from-points", action="store_true", help=f"no replay: tables from {RESULTS}"
    )
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    if args.from_points:
        cells = [Cell(**c) for c in json.loads(RESULTS.read_text())]
    else:
        jobs = []
        for name, own in FRONTIER_SEEDS.items():
            others = [s for s in range(1, args.seeds + 2) if s != own][: args.seeds]
            jobs += [(name, seed, cold) for seed in (own, *others) for cold in F.COLD_STARTS]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            cells = list(pool.map(replay_cell, jobs))
        RESULTS.write_text(json.dumps([asdict(c) for c in cells], indent=1) + "\n")
    text = tables(cells)
    print(text)
    if not args.no_readme:
        replace_section(BEGIN, END, text, "Frontier", F.README)
    return 0


if __name__ == "__main__":
    sys.exit(main())
