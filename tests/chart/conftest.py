"""Fixtures of the chart tests: helm with its own state directory.

The cluster fixtures (``cluster``, ``kube``, ``namespace``) come from ``tests/conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_tools import Helm


@pytest.fixture
def helm(tmp_path: Path) -> Helm:
    """helm for rendering only (no cluster)."""
    return Helm(tmp_path / "helm")
