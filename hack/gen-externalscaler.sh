#!/usr/bin/env bash
# Regenerate the Python modules of KEDA's external-scaler API from the vendored proto
# (operator/prescaler/scaler/_proto/externalscaler.proto): messages, their type stubs
# (mypy-protobuf) and the gRPC service. The output is committed; a unit test fails when it
# differs from what this script makes (tests/unit/test_scaler_proto.py).
#
#   hack/gen-externalscaler.sh [OUT_DIR]    # default: next to the proto
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${1:-operator}
proto=prescaler/scaler/_proto/externalscaler.proto
"$BIN/python" -m grpc_tools.protoc \
  --proto_path=operator \
  --plugin=protoc-gen-mypy="$BIN/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$BIN/protoc-gen-mypy_grpc" \
  --python_out="$OUT" --mypy_out="$OUT" \
  --grpc_python_out="$OUT" --mypy_grpc_out="$OUT" \
  "$proto"
