"""Each benchmark script rewrites its own part of a README between its own markers: two
scripts that claimed one pair would overwrite each other's tables."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- ([a-z-]+):begin -->")


def claims() -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        for name in set(MARKER.findall(script.read_text())):
            owners.setdefault(name, []).append(script.name)
    return owners


def test_no_two_benchmark_scripts_claim_the_same_readme_markers() -> None:
    owners = claims()
    assert owners, "the benchmark scripts name their README markers"
    shared = {name: scripts for name, scripts in owners.items() if len(scripts) > 1}
    assert not shared


def test_each_claimed_pair_stands_once_in_the_readmes() -> None:
    text = (ROOT / "README.md").read_text() + (ROOT / "benchmarks" / "README.md").read_text()
    for name in claims():
        assert text.count(f"<!-- {name}:begin -->") == 1, name
        assert text.count(f"<!-- {name}:end -->") == 1, name
