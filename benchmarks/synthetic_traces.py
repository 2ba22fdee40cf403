"""Synthetic minute-level traffic for the frontier benchmark, written as ``rate`` traces.

The shared traces are coarse (ServeGen 10 minutes, NAB 30 minutes) or short (Azure, one
hour). Traffic that serving teams see is per minute and has shapes the shared traces lack,
so the frontier also replays two generated 14-day traces (fixed seeds, so every run sees
the same traffic; none of the product's knobs were fitted on them):

* ``web``: a daytime plateau with a lunch dip and a weekend drop, multiplicative AR(1)
  noise (sigma 0.06, autocorrelation 0.8 per minute) and about one short burst a day
  (x1.3 to x2 for 5 to 30 minutes).
* ``stream``: an evening peak (x4 the night trough), noisier minutes (sigma 0.10), a
  slower weekly drift and, on some evenings, a sharp ramp into a launch-style spike.

Each generator also returns what made the trace (:class:`Generated`): its day, the
expected rate without noise or events, and its events (the bursts, the launches), which
``benchmarks/events.py`` reads to say where the unserved demand falls and what a perfect
forecast of the day would be worth.

Run ``.venv/bin/python benchmarks/synthetic_traces.py OUT_DIR`` to write both files.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DAY_MINUTES = 1440
START = 1_704_067_200  # 2024-01-01T00:00Z, a Monday


@dataclass(frozen=True)
class Event:
    """A burst or a launch: minutes ``[start, end)`` of the trace."""

    start: int
    end: int
    factor: float
    """The burst's multiplier, or the launch ramp's top."""


@dataclass(frozen=True)
class Generated:
    rate: np.ndarray
    """Requests per second, per minute (what the trace file holds)."""
    day: np.ndarray
    """The expected rate without noise or events: what a perfect forecast of the day knows."""
    events: tuple[Event, ...]


def _ar1(rng: np.random.Generator, n: int, sigma: float, rho: float) -> np.ndarray:
    shocks = rng.normal(0.0, sigma * math.sqrt(1 - rho * rho), n)
    out = np.empty(n)
    level = 0.0
    for i in range(n):
        level = rho * level + shocks[i]
        out[i] = level
    return out


def web_generated(seed: int = 11, days: int = 14) -> Generated:
    rng = np.random.default_rng(seed)
    n = days * DAY_MINUTES
    hour = (np.arange(n) % DAY_MINUTES) / 60.0
    day = np.arange(n) // DAY_MINUTES
    daytime = 0.25 + 0.75 / (1 + np.exp(-(hour - 8.0))) / (1 + np.exp(hour - 20.0))
    lunch = 1 - 0.12 * np.exp(-0.5 * ((hour - 12.5) / 0.6) ** 2)
    weekend = np.where(day % 7 >= 5, 0.65, 1.0)
    weekend = np.convolve(weekend, np.ones(180) / 180, mode="same")
    sigma = 0.06
    profile = 400.0 * daytime * lunch * weekend
    rate = profile * np.exp(_ar1(rng, n, sigma, 0.8))
    events = []
    for _ in range(rng.poisson(days)):
        at, length = int(rng.integers(0, n)), int(rng.integers(5, 31))
        factor = rng.uniform(1.3, 2.0)
        rate[at : at + length] *= factor
        events.append(Event(at, min(at + length, n), float(factor)))
    expected = profile * math.exp(sigma * sigma / 2)  # the mean of the log-normal noise
    return Generated(rng.poisson(rate * 60) / 60.0, expected, tuple(events))


def stream_generated(seed: int = 23, days: int = 14) -> Generated:
    rng = np.random.default_rng(seed)
    n = days * DAY_MINUTES
    hour = (np.arange(n) % DAY_MINUTES) / 60.0
    evening = 0.25 + 0.75 * np.exp(-0.5 * ((hour - 20.5) / 2.2) ** 2)
    afternoon = 0.2 * np.exp(-0.5 * ((hour - 14.0) / 2.0) ** 2)
    drift = 1 + 0.15 * np.sin(2 * np.pi * np.arange(n) / (7 * DAY_MINUTES))
    sigma = 0.10
    profile = 300.0 * (evening + afternoon) * drift
    rate = profile * np.exp(_ar1(rng, n, sigma, 0.7))
    events = []
    for d in range(days):
        if rng.random() < 0.3:  # a launch-style spike: a 15-minute ramp, then an hour high
            at = d * DAY_MINUTES + int(rng.integers(19 * 60, 21 * 60))
            ramp = np.linspace(1.0, rng.uniform(1.8, 2.6), 15)
            rate[at : at + 15] *= ramp
            rate[at + 15 : at + 75] *= ramp[-1] * np.linspace(1.0, 0.6, 60)
            events.append(Event(at, min(at + 75, n), float(ramp[-1])))
    expected = profile * math.exp(sigma * sigma / 2)
    return Generated(rng.poisson(rate * 60) / 60.0, expected, tuple(events))


GENERATORS: dict[str, Callable[..., Generated]] = {"web": web_generated, "stream": stream_generated}


def write_rate(path: Path, rps: np.ndarray) -> Path:
    """One trace as ``timestamp,requests_per_second``, minute by minute from :data:`START`."""
    stamps = START + 60 * np.arange(len(rps))
    lines = ["timestamp,requests_per_second"]
    lines += [f"{t},{r:.4f}" for t, r in zip(stamps, rps, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write(out: Path) -> dict[str, Path]:
    """Write every synthetic trace as ``<name>.csv`` (``timestamp,requests_per_second``)."""
    out.mkdir(parents=True, exist_ok=True)
    return {name: write_rate(out / f"{name}.csv", make().rate) for name, make in GENERATORS.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out_dir", nargs="?", type=Path, default=Path("out/traces"), help="default out/traces"
    )
    for name, path in write(parser.parse_args().out_dir).items():
        print(f"{name}: {path}")
