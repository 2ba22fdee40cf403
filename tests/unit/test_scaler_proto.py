"""The committed gRPC modules are what ``make proto`` makes from the vendored proto, and
the proto is KEDA's external-scaler API at its pinned version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "operator" / "prescaler" / "scaler" / "_proto"
GENERATED = (
    "externalscaler_pb2.py",
    "externalscaler_pb2.pyi",
    "externalscaler_pb2_grpc.py",
    "externalscaler_pb2_grpc.pyi",
)


def test_generated_modules_match_the_vendored_proto(tmp_path: Path) -> None:
    env = {**os.environ, "BIN": str(Path(sys.executable).parent)}
    subprocess.run(
        ["bash", str(ROOT / "hack" / "gen-externalscaler.sh"), str(tmp_path)],
        check=True,
        env=env,
        capture_output=True,
    )
    made = tmp_path / "prescaler" / "scaler" / "_proto"
    for name in GENERATED:
        assert (made / name).read_text() == (PROTO_DIR / name).read_text(), (
            f"{name} differs from what the proto makes: run make proto"
        )


def test_the_proto_is_keda_s_service_at_the_pinned_version() -> None:
    text = (PROTO_DIR / "externalscaler.proto").read_text()
    assert "github.com/kedacore/keda/v2@v2.21.1" in text
    assert "Licensed under the Apache License, Version 2.0" in text
    assert "package externalscaler;" in text
    for rpc in ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics"):
        assert f"rpc {rpc}(" in text
