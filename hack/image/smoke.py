"""Smoke check of an installed prescaler: run it with the installed environment's Python.

    python hack/image/smoke.py

The Dockerfile runs it in the final stage (as the image's user, with the image's
environment) and tests/image/test_image_install.py runs it in a fresh virtualenv built by
hack/image/install.sh. It needs nothing but the installed packages and fails (exit 1) if:

- a C/C++ compiler or ``make`` is on ``PATH`` (the image has none; nothing may need one);
- the ``prescaler`` console script does not start (``--help``, ``run --help``);
- Prophet cannot fit and forecast with its bundled Stan model: three days of hourly
  synthetic demand with a daily cycle, forecast for the next day, which must follow the
  cycle;
- ``prescaler forecast --model prophet`` (the operator's forecaster) does not answer with a
  Prophet forecast.

Temporary files go to ``tempfile.gettempdir()`` (``/tmp`` in the image) and are removed.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "make")
HOUR = 3600


def fail(message: str) -> None:
    print(f"smoke: FAIL: {message}", file=sys.stderr)
    raise SystemExit(1)


def demand(t: float) -> float:
    """Requests per second with a daily cycle: 10 at 04:00 UTC, 30 at 16:00 UTC."""
    return 20.0 + 10.0 * math.sin(2 * math.pi * ((t / HOUR) % 24 - 10) / 24)


def check_no_compiler() -> None:
    found = {name: shutil.which(name) for name in COMPILERS}
    present = {name: path for name, path in found.items() if path}
    if present:
        fail(f"compilers on PATH: {present}")
    print("smoke: no compiler or make on PATH")


def check_cli(prescaler: Path) -> None:
    for args in (["--help"], ["run", "--help"]):
        done = subprocess.run(
            [str(prescaler), *args], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0 or "usage" not in done.stdout:
            fail(f"prescaler {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    print("smoke: prescaler --help and run --help")


def check_prophet() -> None:
    import pandas as pd
    from prophet import Prophet

    start = pd.Timestamp("2026-01-05T00:00:00")
    history = pd.DataFrame({"ds": pd.date_range(start, periods=72, freq="h")})
    history["y"] = [demand(ts.timestamp()) for ts in history["ds"]]
    model = Prophet(daily_seasonality=True, weekly_seasonality=False, yearly_seasonality=False)
    model.fit(history)
    future = model.make_future_dataframe(periods=24, freq="h", include_history=False)
    forecast = model.predict(future)
    yhat = forecast["yhat"].to_numpy(dtype=float)
    truth = [demand(ts.timestamp()) for ts in future["ds"]]
    if len(yhat) != 24 or not all(math.isfinite(v) for v in yhat):
        fail(f"Prophet forecast is not 24 finite points: {yhat!r}")
    worst = max(abs(a - b) for a, b in zip(yhat, truth, strict=True))
    if worst > 2.0:
        fail(f"Prophet's forecast misses the daily cycle by up to {worst:.2f} rps")
    print(f"smoke: Prophet fitted 72 hourly points, forecast 24 (worst error {worst:.3f} rps)")


def check_operator_forecaster(prescaler: Path, workdir: Path) -> None:
    trace = workdir / "rate.csv"
    t0 = 1_767_571_200  # 2026-01-05T00:00:00Z
    with trace.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["timestamp", "requests_per_second"])
        for minute in range(3 * 24 * 60):
            t = t0 + minute * 60
            writer.writerow([t, round(demand(t), 4)])
    at = t0 + 3 * 24 * HOUR
    args = ["--trace", str(trace), "--format", "rate", "--at", str(at)]
    args += ["--horizon-minutes", "60", "--model", "prophet", "--json"]
    done = subprocess.run(
        [str(prescaler), "forecast", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        fail(f"prescaler forecast exited {done.returncode}: {done.stderr[-2000:]}")
    answer = json.loads(done.stdout)
    points = answer.get("points", [])
    if answer.get("model") != "prophet" or not points:
        fail(f"prescaler forecast did not answer with Prophet: {done.stdout[:2000]}")
    worst = max(abs(p["mean"] - demand(p["t"])) for p in points)
    if worst > 2.0:
        fail(f"prescaler forecast misses the daily cycle by up to {worst:.2f} rps")
    print(f"smoke: prescaler forecast --model prophet, {len(points)} points")


def main() -> None:
    prescaler = Path(sysconfig.get_path("scripts")) / "prescaler"
    check_no_compiler()
    check_cli(prescaler)
    check_prophet()
    with tempfile.TemporaryDirectory(prefix="prescaler-smoke-") as tmp:
        check_operator_forecaster(prescaler, Path(tmp))
    print("smoke: ok")


if __name__ == "__main__":
    main()
