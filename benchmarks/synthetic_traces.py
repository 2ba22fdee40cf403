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

Run ``.venv/bin/python benchmarks/synthetic_traces.py OUT_DIR`` to write both files.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

DAY_MINUTES = 1440
START = 1_704_067_200  # 2024-01-01T00:00Z, a Monday


def _ar1(rng: np.random.Generator, n: int, sigma: float, rho: float) -> np.ndarray:
    shocks = rng.normal(0.0, sigma * math.sqrt(1 - rho * rho), n)
    out = np.empty(n)
    level = 0.0
    for i in range(n):
        level = rho * level + shocks[i]
        out[i] = level
    return out


def web(seed: int = 11, days: int = 14) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = days * DAY_MINUTES
    hour = (np.arange(n) % DAY_MINUTES) / 60.0
    day = np.arange(n) // DAY_MINUTES
    daytime = 0.25 + 0.75 / (1 + np.exp(-(hour - 8.0))) / (1 + np.exp(hour - 20.0))
    lunch = 1 - 0.12 * np.exp(-0.5 * ((hour - 12.5) / 0.6) ** 2)
    weekend = np.where(day % 7 >= 5, 0.65, 1.0)
    weekend = np.convolve(weekend, np.ones(180) / 180, mode="same")
    rate = 400.0 * daytime * lunch * weekend * np.exp(_ar1(rng, n, 0.06, 0.8))
    for _ in range(rng.poisson(days)):
        at, length = int(rng.integers(0, n)), int(rng.integers(5, 31))
        rate[at : at + length] *= rng.uniform(1.3, 2.0)
    return rng.poisson(rate * 60) / 60.0


def stream(seed: int = 23, days: int = 14) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = days * DAY_MINUTES
    hour = (np.arange(n) % DAY_MINUTES) / 60.0
    evening = 0.25 + 0.75 * np.exp(-0.5 * ((hour - 20.5) / 2.2) ** 2)
    afternoon = 0.2 * np.exp(-0.5 * ((hour - 14.0) / 2.0) ** 2)
    drift = 1 + 0.15 * np.sin(2 * np.pi * np.arange(n) / (7 * DAY_MINUTES))
    rate = 300.0 * (evening + afternoon) * drift * np.exp(_ar1(rng, n, 0.10, 0.7))
    for d in range(days):
        if rng.random() < 0.3:  # a launch-style spike: a 15-minute ramp, then an hour high
            at = d * DAY_MINUTES + int(rng.integers(19 * 60, 21 * 60))
            ramp = np.linspace(1.0, rng.uniform(1.8, 2.6), 15)
            rate[at : at + 15] *= ramp
            rate[at + 15 : at + 75] *= ramp[-1] * np.linspace(1.0, 0.6, 60)
    return rng.poisson(rate * 60) / 60.0


TRACES = {"web": web, "stream": stream}


def write(out: Path) -> dict[str, Path]:
    """Write every synthetic trace as ``<name>.csv`` (``timestamp,requests_per_second``)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, make in TRACES.items():
        rps = make()
        path = out / f"{name}.csv"
        stamps = START + 60 * np.arange(len(rps))
        lines = ["timestamp,requests_per_second"]
        lines += [f"{t},{r:.4f}" for t, r in zip(stamps, rps, strict=True)]
        path.write_text("\n".join(lines) + "\n")
        paths[name] = path
    return paths


if __name__ == "__main__":
    for name, path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "out/traces")).items():
        print(f"{name}: {path}")
