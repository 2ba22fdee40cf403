"""`prescaler plan` keeps the brief's contract, and bad input gets one line naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from prescaler.cli import main

WORKED_EXAMPLE = [
    "plan",
    "--concurrent-users", "500",
    "--prompt-tokens", "1000",
    "--output-tokens", "500",
    "--window-minutes", "15",
    "--fleet-tokens-per-second", "20000",
    "--json",
]  # fmt: skip
LLAMA_70B = [
    "plan",
    "--model", "llama-3.1-70b",
    "--gpu-memory-gib", "80",
    "--gpus-per-replica", "4",
    "--context-tokens", "4096",
    "--json",
]  # fmt: skip


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(argv) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(WORKED_EXAMPLE, capsys)
    assert out["total_tokens"] == 750000
    assert out["generation_seconds"] == 37.5
    assert out["fleet_tokens_per_second"] == {"min": 60000, "max": 90000}


def test_memory_limit_for_llama_70b(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(LLAMA_70B, capsys)
    assert out["kv_bytes_per_token"] == 327680
    assumptions = out["assumptions"]
    assert isinstance(assumptions, dict)
    usable = int(80 * 2**30 * 4 * assumptions["memory_utilization"])
    free = usable - assumptions["weight_bytes"] - assumptions["overhead_bytes"]
    assert out["max_concurrent_requests_per_replica"] == free // (327680 * 4096)
    assert assumptions["memory_utilization"] == 0.9
    assert assumptions["weight_bytes"] == 141_200_000_000


def test_demand_sizing_reports_the_binding_constraint(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*LLAMA_70B, "--prompt-tokens", "1000", "--output-tokens", "500",
            "--replica-tokens-per-second", "3000", "--requests-per-second", "9"]  # fmt: skip
    out = run_json(argv, capsys)
    demand = out["demand"]
    assert isinstance(demand, dict)
    assert demand["replicas"] == 5  # 9 req/s / (3000 / 1500) req/s per replica = 4.5
    assert demand["constraint"] == "compute"


def test_table_output_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(WORKED_EXAMPLE[:-1]) == 0
    out = capsys.readouterr().out
    assert "total_tokens" in out
    assert "750,000" in out


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--gpu-memory-gib", "-80"], "--gpu-memory-gib"),
        (["--model", "llama-9b"], "--model"),
        (["--context-tokens", "500000"], "--context-tokens"),
        (["--gpus-per-replica", "zero"], "--gpus-per-replica"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(extra: list[str], flag: str) -> None:
    argv = [a for a in LLAMA_70B if a != "--json"]
    # The later occurrence of a flag wins in argparse, so appending overrides the good value.
    proc = subprocess.run(
        [sys.executable, "-m", "prescaler.cli", *argv, *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert flag in lines[0]
    assert "Traceback" not in proc.stderr


def test_incomplete_window_names_the_missing_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--concurrent-users", "500"]) == 2
    err = capsys.readouterr().err
    assert "--window-minutes" in err
    assert "--fleet-tokens-per-second" in err
