"""The live demo, shortened (two minutes of live play), on the real local cluster.

It runs ``python -m prescaler_demo`` as ``make demo`` does (a subprocess with ``hack/demo``
and ``tests`` on ``PYTHONPATH``) and checks what it did from its summary, its output and
the process table. No timing assertions: the demo's own waits have generous deadlines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.paths import PROJECT_ROOT, TRACES_DIR

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

TRACE = TRACES_DIR / "servegen_m_small" / "language__m-small_aggregate_rate_10min.csv"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.mark.skipif(not TRACE.exists(), reason="the shared traces are not available")
def test_short_demo_prewarms_for_the_window_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT_ROOT / "hack" / "demo"), str(PROJECT_ROOT / "tests")]
    )
    # The window opens after the play ends; its pre-warm (lead 150 s) falls inside it.
    cmd = [
        sys.executable, "-m", "prescaler_demo", "--out", str(out),
        "--minutes", "2", "--window-in", "180", "--window-lead", "150",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]

    summary = json.loads((out / "summary.json").read_text())
    # The operator scaled the Deployment to the window's replicas before the window opened.
    assert summary["prewarm_at"] is not None, output[-4000:]
    assert summary["prewarm_at"] < summary["window_start"]
    assert summary["max_replicas_seen"] >= summary["window_replicas"] > summary["initial_replicas"]
    # kubectl get ppool showed the pool.
    assert "llama-chat" in summary["ppool_output"]
    assert "NAME" in summary["ppool_output"]
    # The live timeline printed rows, and the plot exists.
    assert summary["timeline_rows"] >= 2
    assert "6. Live timeline" in output
    png = Path(summary["png"])
    assert png.exists()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The HPA ran on the same demand through the backtest library.
    assert summary["hpa_gpu_hours"] > 0
    # ...and the oracle beside it, which knows the demand: never shorter than the HPA.
    assert summary["oracle_gpu_hours"] > 0
    assert summary["oracle_unserved"] <= summary["hpa_unserved"]
    # The HPA's curve on the same demand starts at its default target, the row above.
    curve = summary["hpa_curve"]
    assert [p["target"] for p in curve][:1] == [0.7]
    assert curve[0]["gpu_hours"] == summary["hpa_gpu_hours"]
    # The HPA read as short as prescaler or less is the cheapest such point of that curve.
    fits = [p for p in curve if p["unserved"] <= summary["prescaler_unserved"] + 1e-4]
    cheapest = min(fits, key=lambda p: p["gpu_hours"], default={"target": None})
    assert summary["hpa_matching_target"] == cheapest["target"]
    # The tenant's last backfilled day, replayed at the defaults beside the HPA at 70 %.
    day = summary["day"]
    assert day["hpa"]["gpu_hours"] > 0
    assert day["prescaler"]["gpu_hours"] > 0
    assert day["policy"] in ("forecast", "reactive", "leading")
    # Prescaler's GPU-hours count its standby placeholders, and say how much of them.
    assert 0 <= summary["prescaler_standby_gpu_hours"] <= summary["prescaler_gpu_hours"]
    # Nothing the demo started is left running.
    assert summary["pids"], "the demo recorded no processes"
    assert [pid for pid in summary["pids"] if _alive(pid)] == []
    assert _processes_mentioning(str(out)) == []


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line mentions ``text`` (the demo's run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found
