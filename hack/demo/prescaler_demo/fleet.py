"""A simulated vLLM fleet: ``python -m prescaler_demo.fleet CONFIG.json``.

One process stands in for the pods of the demo's GPU Deployment. Every second it

* reads which of the Deployment's pods exist and which are Ready from the API server;
* takes the demand of the trace step that the second is in (requests/s), on a 1 s grid
  from the live start (a fleet that starts late catches up: no second goes unplayed);
* serves it with what the Ready pods can do (``replica_rps`` each, the pool's capacity
  model), queueing the rest in a FIFO fluid queue;
* exports, per Ready pod, vLLM's metric names on ``/metrics`` (prometheus_client):
  ``vllm:request_success_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total`` (counters of served requests and tokens),
  ``vllm:num_requests_running`` (Little's law, capped by the KV cache),
  ``vllm:num_requests_waiting`` (the queue) and ``vllm:gpu_cache_usage_perc`` /
  ``vllm:kv_cache_usage_perc``; labels ``namespace``, ``pod``, ``model_name``, as a
  Prometheus with Kubernetes service discovery would attach them. A pod's series exist
  (at zero) from when the pod does, before it serves, so ``rate()`` counts its first
  requests; the pods whose history was backfilled continue their counters from the
  history's end (``FleetConfig.counters``), so the live series join the history with no
  gap and no reset;
* appends one CSV row to ``record`` (what the demo's timeline and plot read).

It stops on SIGTERM or when the stretch ends.
"""

from __future__ import annotations

import csv
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

RECORD_COLUMNS = (
    "t",
    "step",
    "demand_rps",
    "ready",
    "capacity_rps",
    "served_rps",
    "waiting",
    "running",
    "kv_usage",
)


@dataclass(frozen=True)
class FleetConfig:
    """What the fleet plays (written as JSON by the demo)."""

    kubeconfig: str
    namespace: str
    deployment: str
    model_name: str
    port: int
    record: str
    start: float
    """Wall time of the first live step (unix seconds)."""
    seconds_per_step: float
    rates: list[float]
    """Requests/s of each live step."""
    replica_rps: float
    max_concurrency: int
    latency_seconds: float
    prompt_tokens: float
    output_tokens: float
    counters: dict[str, list[float]] = field(default_factory=dict)
    """Per pod, the backfilled history's request, prompt-token and generated-token counters
    at ``start``: the live counters continue from there."""

    @classmethod
    def load(cls, path: str | Path) -> FleetConfig:
        return cls(**json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.__dict__, indent=1))

    @property
    def end(self) -> float:
        return self.start + len(self.rates) * self.seconds_per_step

    def demand_at(self, t: float) -> tuple[int, float]:
        i = int((t - self.start) // self.seconds_per_step)
        i = min(max(i, 0), len(self.rates) - 1)
        return i, self.rates[i]


class Metrics:
    """vLLM's metric names, one label set per Ready pod."""

    LABELS = ("namespace", "pod", "model_name")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.success = Counter(
            "vllm:request_success", "Finished requests", self.LABELS, registry=registry
        )
        self.prompt = Counter(
            "vllm:prompt_tokens", "Prefill tokens", self.LABELS, registry=registry
        )
        self.generation = Counter(
            "vllm:generation_tokens", "Generated tokens", self.LABELS, registry=registry
        )
        self.running = Gauge("vllm:num_requests_running", "Running", self.LABELS, registry=registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Queued", self.LABELS, registry=registry)
        self.cache = Gauge(
            "vllm:gpu_cache_usage_perc", "KV cache usage (0-1)", self.LABELS, registry=registry
        )
        self.kv_cache = Gauge(
            "vllm:kv_cache_usage_perc", "KV cache usage (0-1)", self.LABELS, registry=registry
        )
        self._pods: set[str] = set()

    def _all(self) -> tuple[Counter | Gauge, ...]:
        return (
            self.success, self.prompt, self.generation,
            self.running, self.waiting, self.cache, self.kv_cache,
        )  # fmt: skip

    def track(
        self, pods: set[str], namespace: str, model: str, counters: dict[str, list[float]]
    ) -> None:
        """Series for every pod that exists (new ones at zero, or at their history's end);
        the series of pods that are gone are dropped (a scrape ends them)."""
        for pod in self._pods - pods:
            for metric in self._all():
                metric.remove(namespace, pod, model)
        for pod in pods - self._pods:
            start = counters.get(pod, [0.0, 0.0, 0.0])
            for counter, value in zip((self.success, self.prompt, self.generation), start,
                                      strict=True):  # fmt: skip
                counter.labels(namespace, pod, model).inc(value)
            for gauge in (self.running, self.waiting, self.cache, self.kv_cache):
                gauge.labels(namespace, pod, model).set(0)
        self._pods = set(pods)


def serve(registry: CollectorRegistry, port: int) -> tuple[ThreadingHTTPServer, Thread]:
    """``/metrics`` in the classic text format (0.0.4) whatever the scraper asks for: the
    OpenMetrics negotiation would escape the colons of vLLM's metric names."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


def list_pods(core: Any, namespace: str, deployment: str) -> tuple[set[str], set[str]]:
    """The Deployment's pods that exist (not terminating), and those of them Ready."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={deployment}").items
    existing: set[str] = set()
    ready: set[str] = set()
    for pod in pods:
        if pod.metadata.deletion_timestamp is not None:
            continue
        existing.add(pod.metadata.name)
        for cond in (pod.status.conditions if pod.status else None) or []:
            if cond.type == "Ready" and cond.status == "True":
                ready.add(pod.metadata.name)
    return existing, ready


def run(config: FleetConfig) -> None:
    from kubernetes import client
    from kubernetes import config as kube_config

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server, thread = serve(registry, config.port)
    api = kube_config.new_client_from_config(config_file=config.kubeconfig)  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(api)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    ns, model = config.namespace, config.model_name
    queue = 0.0
    existing: set[str] = set()
    ready: set[str] = set()
    # One tick per second of the live play, from its start: the demand of every second is
    # served or queued, also the seconds before this process came up (it catches up).
    dt = 1.0
    tick = config.start
    try:
        with open(config.record, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(RECORD_COLUMNS)
            while not stop and tick + dt <= config.end:
                tick += dt
                time.sleep(max(0.0, tick - time.time()))
                now = tick
                try:
                    existing, ready = list_pods(core, config.namespace, config.deployment)
                except Exception as exc:  # a busy API server: keep the last view
                    print(f"fleet: listing pods failed: {exc!r}", file=sys.stderr)
                step, demand = config.demand_at(now - dt / 2)
                n = len(ready)
                capacity = n * config.replica_rps
                # FIFO fluid queue over dt: serve the queue and the arrivals up to capacity.
                offered = queue + demand * dt
                served = min(offered, capacity * dt)
                queue = offered - served
                served_rps = served / dt
                limit = n * config.max_concurrency
                running = min(served_rps * config.latency_seconds, float(limit))
                kv = running / limit if limit else 0.0
                metrics.track(existing | ready, ns, model, config.counters)
                for pod in ready:
                    share = served / n
                    metrics.success.labels(ns, pod, model).inc(share)
                    metrics.prompt.labels(ns, pod, model).inc(share * config.prompt_tokens)
                    metrics.generation.labels(ns, pod, model).inc(share * config.output_tokens)
                    metrics.running.labels(ns, pod, model).set(running / n)
                    metrics.waiting.labels(ns, pod, model).set(queue / n)
                    metrics.cache.labels(ns, pod, model).set(kv)
                    metrics.kv_cache.labels(ns, pod, model).set(kv)
                out.writerow(
                    [
                        f"{now:.3f}", step, f"{demand:.3f}", n, f"{capacity:.3f}",
                        f"{served_rps:.3f}", f"{queue:.1f}", f"{running:.1f}", f"{kv:.3f}",
                    ]
                )  # fmt: skip
                f.flush()
    finally:
        api.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m prescaler_demo.fleet CONFIG.json", file=sys.stderr)
        return 2
    run(FleetConfig.load(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
