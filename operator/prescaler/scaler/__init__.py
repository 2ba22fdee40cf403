"""prescaler as a KEDA external scaler: KEDA's ``externalscaler.ExternalScaler`` gRPC API,
answering a ScaledObject's ``external`` / ``external-push`` trigger with a pool's plan.

The answers are plain values (:mod:`prescaler.scaler._answers`, pure); the pools are read
from the API server through a short cache (:mod:`prescaler.scaler._plans`); the gRPC
plumbing is in :mod:`prescaler.scaler._server`. The Python modules of KEDA's proto, vendored
at a pinned KEDA version, are generated into :mod:`prescaler.scaler._proto` (``make proto``).
"""

from prescaler.scaler._answers import (
    KEDA_KEYS,
    KEDA_MODE,
    METRIC_PREFIX,
    TARGET_SIZE,
    ErrorCode,
    Plan,
    Query,
    ScalerError,
    answer,
    check_namespace,
    parse_query,
)
from prescaler.scaler._plans import CustomObjectReader, PoolReader
from prescaler.scaler._server import (
    METHODS,
    CallCounter,
    ExternalScaler,
    TlsFiles,
    external_scaler,
    start_server,
)

__all__ = [
    "KEDA_KEYS",
    "KEDA_MODE",
    "METHODS",
    "METRIC_PREFIX",
    "TARGET_SIZE",
    "CallCounter",
    "CustomObjectReader",
    "ErrorCode",
    "ExternalScaler",
    "Plan",
    "PoolReader",
    "Query",
    "ScalerError",
    "TlsFiles",
    "answer",
    "check_namespace",
    "external_scaler",
    "parse_query",
    "start_server",
]
