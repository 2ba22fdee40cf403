"""Where the harness finds its binaries, the project and the shared traces."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TRACES_DIR = PROJECT_ROOT / ".." / "shared" / "traces"


def cache_dir() -> Path:
    """``$PRESCALER_CACHE``, else ``~/.cache/prescaler``."""
    raw = os.environ.get("PRESCALER_CACHE")
    return Path(raw) if raw else Path.home() / ".cache" / "prescaler"


def bin_dir() -> Path:
    """The binaries built by ``make cluster-bin``."""
    return cache_dir() / "bin"


def keda_crds_dir() -> Path:
    """KEDA's CRDs, copied from the pinned KEDA module by ``make cluster-bin``."""
    return cache_dir() / "keda" / "crds"


def gie_crds_dir() -> Path:
    """The Gateway API Inference Extension's CRDs, copied from its pinned module by
    ``make cluster-bin``."""
    return cache_dir() / "gie" / "crds"


class MissingBinaryError(RuntimeError):
    """A harness binary is not built or installed."""


def require_binaries(names: Iterable[str]) -> None:
    missing = [n for n in names if not os.access(bin_dir() / n, os.X_OK)]
    if missing:
        raise MissingBinaryError(
            f"missing {', '.join(missing)} in {bin_dir()}: run `make cluster-bin` "
            "(make test does this first)"
        )


def system_binary(name: str, hint: str) -> Path:
    found = shutil.which(name)
    if found is None:
        raise MissingBinaryError(f"{name} not found on PATH: {hint}")
    return Path(found)
