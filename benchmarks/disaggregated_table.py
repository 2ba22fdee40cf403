"""Disaggregated benchmark: prefill and decode pools against a unified pool on the Azure traces.

Run from the project root (the traces live in ``../shared/traces``)::

    .venv/bin/python benchmarks/disaggregated_table.py            # all runs, updates README.md
    .venv/bin/python benchmarks/disaggregated_table.py --only conv --no-readme

For each Azure 2023 trace (code, conversation), capacity setup and cold start it runs
``prescaler backtest --disaggregated`` at the defaults, and then matches the two pools'
unserved token fractions. The replay is cut into blocks of five real minutes (50 played
minutes), scored apart (``--score-span``): the predictive policy of whichever pool leaves
more tokens unserved in the even blocks gets the smallest ``--headroom`` on a fixed grid
that brings its unserved fraction there down to the other's, and both are reported on the
odd blocks only. (The first and second halves do not work as the two parts: on both traces
nearly every unserved token is in the first half.) It rewrites the part of
``benchmarks/README.md`` between the ``disaggregated:begin``/``disaggregated:end`` markers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from _readme import replace_section  # the scripts run with benchmarks/ on sys.path

ROOT = Path(__file__).resolve().parents[1]
AZURE = Path("../shared/traces") / "azure_llm_2023"
README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- disaggregated:begin -->", "<!-- disaggregated:end -->"
COLD_STARTS = (240, 480)
POLICIES = ("reactive", "predictive", "oracle")

# The backtest table's setup: a 20,000 tokens/s replica, the peak minute scaled to need 40
# (unified) replicas, the 1-hour traces played at 10x on one-real-minute bins.
COMMON = ["--format", "azure", "--time-scale", "10", "--trace-step-seconds", "600",
          "--replica-tokens-per-second", "20000", "--scale-to-peak-replicas", "40",
          "--disaggregated", "--quiet"]  # fmt: skip
TRACES = {
    "azure code": AZURE / "AzureLLMInferenceTrace_code.csv",
    "azure conv": AZURE / "AzureLLMInferenceTrace_conv.csv",
}
LLAMA_8B = ["--model", "llama-3.1-8b", "--gpu-memory-gib", "80"]
SETUPS: dict[str, list[str]] = {
    # The defaults: each role's replica as fast in its own tokens as the unified one.
    "compute only": [],
    "Llama-3.1-8B, 1 x 80 GiB": LLAMA_8B,
    # A labelled what-if, not a measurement: decode 8x slower per token than prefill.
    "what-if P 20k / D 2.5k, Llama-3.1-8B": [
        *LLAMA_8B, "--prefill-replica-tokens-per-second", "20000",
        "--decode-replica-tokens-per-second", "2500",
    ],
}  # fmt: skip
HEADROOMS = (
    *(round(1 + 0.02 * i, 2) for i in range(1, 26)),
    *(round(1.5 + 0.1 * i, 1) for i in range(1, 16)),
)
"""The grid the matched pool's ``--headroom`` is fitted on (even blocks), smallest first."""
BLOCK_MINUTES = 50
"""Played minutes per block: five real minutes at 10x, longer than either cold start."""


@dataclass(frozen=True)
class Job:
    trace: str
    setup: str
    cold: int

    @property
    def args(self) -> list[str]:
        return ["--trace", str(TRACES[self.trace]), *COMMON, *SETUPS[self.setup],
                "--cold-start-seconds", str(self.cold)]  # fmt: skip


def _backtest(job: Job, out: Path, tag: str, *extra: str) -> dict[str, Any]:
    path = out / f"{job.trace.replace(' ', '-')}-{list(SETUPS).index(job.setup)}-{job.cold}-{tag}"
    cmd = [sys.executable, "-m", "prescaler.cli", "backtest", *job.args, *extra,
           "--json", f"{path}.json", "--timeline", f"{path}.csv"]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)
    body: dict[str, Any] = json.loads(Path(f"{path}.json").read_text())
    body["_timeline"] = pd.read_csv(f"{path}.csv")
    return body


def _blocks(body: dict[str, Any]) -> list[str]:
    """``--score-span`` flags for the replay's blocks of :data:`BLOCK_MINUTES`."""
    start = pd.Timestamp(body["start"])
    flags = []
    for k, first in enumerate(range(0, body["minutes"], BLOCK_MINUTES)):
        a = start + pd.Timedelta(minutes=first)
        b = start + pd.Timedelta(minutes=min(first + BLOCK_MINUTES, body["minutes"]))
        flags += ["--score-span", f"name=b{k},start={a.isoformat()},end={b.isoformat()}"]
    return flags


def _part(body: dict[str, Any], pool: str, part: int) -> dict[str, float]:
    """The predictive policy's scores of ``pool`` (unified or disaggregated) over the even
    (``part`` 0) or odd (1) blocks: their unserved tokens over their tokens, GPU-hours."""
    demand = body["_timeline"]["demand_tokens_per_s"].to_numpy()
    unserved = tokens = gpu_hours = 0.0
    for k, first in enumerate(range(0, body["minutes"], BLOCK_MINUTES)):
        if k % 2 != part:
            continue
        if pool == "unified":
            scores = body["spans"][f"b{k}"]["policies"]["predictive"]
        else:
            scores = body["disaggregated"]["spans"][f"b{k}"]["predictive"]
        # Both pools serve the same tokens: the roles' demands add up to the unified one.
        block = float(demand[first : first + BLOCK_MINUTES].sum()) * 60.0
        unserved += scores["unserved_token_fraction"] * block
        tokens += block
        gpu_hours += scores["gpu_hours"]
    return {"unserved_token_fraction": unserved / tokens, "gpu_hours": gpu_hours}


def _one(job: Job, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    spans = _blocks(_backtest(job, out, "probe", "--policies", "oracle"))
    default = _backtest(job, out, "default", "--policies", ",".join(POLICIES), *spans)
    fit = {pool: _part(default, pool, 0)["unserved_token_fraction"]
           for pool in ("unified", "disaggregated")}  # fmt: skip
    held = {pool: _part(default, pool, 1) for pool in ("unified", "disaggregated")}
    raised = max(fit, key=lambda pool: fit[pool])
    other = "unified" if raised == "disaggregated" else "disaggregated"
    match: dict[str, Any] = {"raised": None, "headroom": None, "held": dict(held)}
    if fit[raised] > fit[other]:
        match["raised"] = raised
        for headroom in HEADROOMS:
            body = _backtest(job, out, f"h{headroom}", "--policies", "predictive",
                             "--headroom", str(headroom), *spans)  # fmt: skip
            if _part(body, raised, 0)["unserved_token_fraction"] <= fit[other]:
                match["headroom"] = headroom
                match["held"][raised] = _part(body, raised, 1)
                break
    wall = time.perf_counter() - t0
    print(f"done: {job.trace}, {job.setup}, cold {job.cold}s in {wall:.0f}s", file=sys.stderr)
    return {"job": job, "default": default, "fit": fit, "held": held, "match": match,
            "wall": wall}  # fmt: skip


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def defaults_table(results: list[dict[str, Any]]) -> str:
    """Both pools at the defaults over the whole replay, per policy."""
    lines = [
        "| trace | capacity | cold start | policy | unified GPU-h | unified unserved "
        "| disaggregated GPU-h (prefill + decode) | disaggregated unserved "
        "| decode's own unserved | GPU-h disaggregated / unified |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        job, body = r["job"], r["default"]
        d = body["disaggregated"]
        for i, name in enumerate(POLICIES):
            u, p = body["policies"][name], d["policies"][name]
            roles = {role: d["roles"][role]["policies"][name] for role in ("prefill", "decode")}
            lead = f"| {job.trace} | {job.setup} " if i == 0 else "| | "
            lines.append(
                f"{lead}| {job.cold} s | {name} | {u['gpu_hours']:.1f} "
                f"| {u['unserved_token_fraction']:.4f} "
                f"| {p['gpu_hours']:.1f} ({roles['prefill']['gpu_hours']:.1f} + "
                f"{roles['decode']['gpu_hours']:.1f}) | {p['unserved_token_fraction']:.4f} "
                f"| {roles['decode']['unserved_token_fraction']:.4f} "
                f"| {_ratio(p['gpu_hours'], u['gpu_hours'])} |"
            )
    return "\n".join(lines)


def matched_table(results: list[dict[str, Any]]) -> str:
    """The predictive pools at a matched unserved fraction: fitted on the even blocks,
    scored on the odd ones."""
    lines = [
        "| trace | capacity | cold start | fit blocks: unified / disaggregated unserved "
        "| headroom fitted | held-out blocks at the defaults: unified / disaggregated unserved "
        "| held-out, matched: unified GPU-h, unserved | disaggregated GPU-h, unserved "
        "| GPU-h disaggregated / unified: matched (defaults) |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        job, fit, held, match = r["job"], r["fit"], r["held"], r["match"]
        defaults_ratio = _ratio(held["disaggregated"]["gpu_hours"], held["unified"]["gpu_hours"])
        if match["raised"] is None:
            fitted = "none (equal)"
        elif match["headroom"] is None:
            fitted = f"{match['raised']}: not matched up to {HEADROOMS[-1]}"
        else:
            fitted = f"{match['raised']} {match['headroom']:.2f}"
        u, p = match["held"]["unified"], match["held"]["disaggregated"]
        lines.append(
            f"| {job.trace} | {job.setup} | {job.cold} s "
            f"| {fit['unified']:.4f} / {fit['disaggregated']:.4f} | {fitted} "
            f"| {held['unified']['unserved_token_fraction']:.4f} / "
            f"{held['disaggregated']['unserved_token_fraction']:.4f} "
            f"| {u['gpu_hours']:.1f}, {u['unserved_token_fraction']:.4f} "
            f"| {p['gpu_hours']:.1f}, {p['unserved_token_fraction']:.4f} "
            f"| {_ratio(p['gpu_hours'], u['gpu_hours'])} ({defaults_ratio}) |"
        )
    return "\n".join(lines)


def capacities(results: list[dict[str, Any]]) -> str:
    """Each setup's replicas, as the runs report them (one line per trace and setup)."""
    lines = ["| trace | capacity | unified replica | prefill replica | decode replica |",
             "|---|---|---|---|---|"]  # fmt: skip
    seen = set()
    for r in results:
        job, body = r["job"], r["default"]
        if (job.trace, job.setup) in seen:
            continue
        seen.add((job.trace, job.setup))
        d = body["disaggregated"]
        cells = [f"{body['replica_tokens_per_s']:,.0f} tok/s ({body['capacity_constraint']})"]
        for role in ("prefill", "decode"):
            own = d["roles"][role]
            cells.append(
                f"{own['replica_tokens_per_s']:,.0f} {own['unit']} ({own['capacity_constraint']})"
            )
        lines.append(f"| {job.trace} | {job.setup} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the JSON here")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", help="substring of the trace or setup names to run")
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="prescaler-disaggregated-"))
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(t, s, c) for t in TRACES for s in SETUPS for c in COLD_STARTS
            if args.only is None or args.only in t or args.only in s]  # fmt: skip
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda j: _one(j, out), jobs))
    section = (
        f"{capacities(results)}\n\nAt the defaults, whole replay:\n\n{defaults_table(results)}"
        f"\n\nAt a matched unserved fraction (predictive; headroom fitted on the even blocks, "
        f"scored on the odd ones):\n\n{matched_table(results)}\n\n"
        f"Run time: {sum(r['wall'] for r in results) / 60:.0f} min for "
        f"{len(results)} configurations, one run at a time on 2 shared cores."
    )
    print(section)
    if not args.no_readme and args.only is None:
        replace_section(BEGIN, END, section, "Disaggregated prefill/decode", README)
    print(f"outputs in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
