"""Prewarmed replicas: warm-up requests a new pod answers before it takes traffic.

- :mod:`~prescaler.prewarm._model` (pure): which pods need a warm-up (:func:`pod_gate`,
  :func:`decide`), the prompts in a ConfigMap (:func:`parse_prompts`), the readiness gate
  in a pod template (:func:`has_gate`, :func:`with_gate`) and the pod condition
  (:func:`condition_patch`).
- :mod:`~prescaler.prewarm._client` (I/O, the engine only): :func:`warm_up` sends one
  pod's warm-up and returns a :class:`WarmupResult`; it never raises for the engine.

This package never talks to Kubernetes: the controller (``prescaler.controller.prewarm``)
watches the pods and writes their conditions through ``prescaler.kube``.
"""

from prescaler.prewarm._client import base_url, warm_up
from prescaler.prewarm._model import (
    FAILED,
    FORGET,
    NOT_CONFIGURED,
    PREWARMED,
    REASONS,
    TIMED_OUT,
    WAIT,
    Action,
    Claim,
    PodGate,
    Reason,
    WarmupConfig,
    WarmupResult,
    condition_patch,
    decide,
    has_gate,
    parse_prompts,
    pod_gate,
    pod_workload,
    warmup_config,
    with_gate,
)

__all__ = [
    "FAILED",
    "FORGET",
    "NOT_CONFIGURED",
    "PREWARMED",
    "REASONS",
    "TIMED_OUT",
    "WAIT",
    "Action",
    "Claim",
    "PodGate",
    "Reason",
    "WarmupConfig",
    "WarmupResult",
    "base_url",
    "condition_patch",
    "decide",
    "has_gate",
    "parse_prompts",
    "pod_gate",
    "pod_workload",
    "warm_up",
    "warmup_config",
    "with_gate",
]
