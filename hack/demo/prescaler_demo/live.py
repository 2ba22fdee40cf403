"""The live run: cluster, Prometheus, history, Deployment, pool, operator, fleet, timeline.

Every process it starts (the control plane, kwok, Prometheus, the operator and the fleet) is
tracked by PID and stopped in ``finally``: on success, on an error and on Ctrl-C / SIGTERM.
They are also tied to this process (``PR_SET_PDEATHSIG``), so a killed demo leaves nothing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from cluster import procs
from cluster.launcher import (
    ClusterConfig,
    GpuNodePool,
    LocalCluster,
    wait_default_service_account,
)
from cluster.objects import gpu_deployment
from cluster.paths import PROJECT_ROOT, bin_dir
from cluster.prometheus import SCRAPE_JOB, Prometheus, VllmProfile, vllm_samples
from cluster.prometheus import Sample as PromSample
from prescaler.api import GROUP, PLURAL, VERSION
from prescaler_demo.fleet import FleetConfig, list_pods
from prescaler_demo.report import (
    HPA_CURVE_TARGETS,
    Comparison,
    Record,
    Sample,
    day_backtest,
    hpa_on_same_demand,
    matching_hpa,
    plot,
    prescaler_scores,
)
from prescaler_demo.scenario import HOLD_STEPS, STANDBY_PLACEHOLDERS, Scenario

CRD_FILE = PROJECT_ROOT / "crds" / f"{PLURAL}.{GROUP}.yaml"
OPERATOR_ENV = {
    # The operator's own settings (prescaler run reads PRESCALER_*), with why they differ.
    "PRESCALER_RECONCILE_RATE_WINDOW": (
        "1m",
        "2m",
        "demand moves 10x faster; the fleet is scraped every 5 s",
    ),
    "PRESCALER_RECONCILE_FIRST_FIT_SPREAD_SECONDS": (
        "0",
        "60",
        "one pool: no restart herd to spread, fit at once",
    ),
}
SCRAPE_SECONDS = 5.0


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say(f"\n\033[1m== {text}\033[0m")


@dataclass
class Outcome:
    """What the run saw; written to ``summary.json`` (the test reads it)."""

    live_start: float = 0.0
    live_end: float = 0.0
    window_start: float = 0.0
    window_end: float = 0.0
    window_replicas: int = 0
    initial_replicas: int = 0
    prewarm_at: float | None = None
    """First time before the window opened that the Deployment asked for the window's
    replicas (the operator scaled it up)."""
    prewarm_ready_at: float | None = None
    """First time the window's replicas were Ready."""
    first_scale_up_at: float | None = None
    max_replicas_seen: int = 0
    timeline_rows: int = 0
    ppool_output: str = ""
    measured_cold_start: float | None = None
    forecast_model: str | None = None
    risk_calibrated: str | None = None
    policy: str | None = None
    """The policy in force at the end, who chose it and why (``status.policy``)."""
    """The pool's RiskCalibrated condition at the end: reason and message."""
    prescaler_unserved: float | None = None
    prescaler_gpu_hours: float | None = None
    hpa_unserved: float | None = None
    hpa_gpu_hours: float | None = None
    oracle_unserved: float | None = None
    oracle_gpu_hours: float | None = None
    prescaler_standby_gpu_hours: float | None = None
    """The standby placeholders' share of ``prescaler_gpu_hours``."""
    hpa_curve: list[dict[str, float]] = field(default_factory=list)
    """The HPA at each swept target on the same demand (``report.HPA_CURVE_TARGETS``)."""
    hpa_matching_target: float | None = None
    """The cheapest swept HPA target that left no more waiting than prescaler did."""
    hpa_matching_gpu_hours: float | None = None
    day: dict[str, object] = field(default_factory=dict)
    """The tenant's last backfilled day replayed (``report.day_backtest``): prescaler at the
    pool's defaults, the HPA at 70 % and the HPA that served the live stretch as well."""
    png: str = ""
    pids: list[int] = field(default_factory=list)


class Stack:
    """The processes of one run, stopped newest first."""

    def __init__(self) -> None:
        self.cluster: LocalCluster | None = None
        self.prometheus: Prometheus | None = None
        self.procs: list[procs.Proc] = []

    def pids(self) -> list[int]:
        out = [p.pid for p in self.procs]
        if self.prometheus is not None and self.prometheus.proc is not None:
            out.append(self.prometheus.proc.pid)
        if self.cluster is not None:
            out.extend(p.pid for p in self.cluster.procs)
        return out

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.cluster is not None:
            self.cluster.stop()


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (and SIGHUP) end the run like Ctrl-C does, through ``finally``."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def kubectl(kubeconfig: Path, *args: str) -> str:
    res = subprocess.run(
        [str(bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    procs.wait_for(what, check, timeout_s, interval_s=1.0)


def _clock(t: float, start: float) -> str:
    d = t - start
    sign = "-" if d < 0 else " "
    d = abs(d)
    return f"{sign}{int(d // 60)}:{int(d % 60):02d}"


def install_crd(api: Any) -> None:
    from kubernetes import client

    ext: Any = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD_FILE.read_text())
    ext.create_custom_resource_definition(body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    wait_until("the InferencePool CRD to be Established", established, 60)


def run(sc: Scenario, out: Path) -> Outcome:
    out.mkdir(parents=True, exist_ok=True)
    # Every run starts from scratch: a previous run's TSDB would overlap the new history
    # (same series, other counter values: rate() would read resets as huge spikes).
    shutil.rmtree(out / "prometheus", ignore_errors=True)
    for stale in ("fleet.csv", "fleet.json", "summary.json", "timeline.csv", "demo.png"):
        (out / stale).unlink(missing_ok=True)
    result = Outcome()
    stack = Stack()
    samples: list[Sample] = []
    try:
        with terminate_as_interrupt():
            _run(sc, out, stack, result, samples)
    finally:
        heading("8. Cleaning up: operator, fleet, Prometheus, control plane, kwok")
        result.pids = stack.pids()
        stack.stop()
        left = [pid for pid in result.pids if _alive(pid)]
        say(f"   stopped {len(result.pids)} processes" + (f"; still alive: {left}" if left else ""))
        (out / "summary.json").write_text(json.dumps(asdict(result), indent=1))
    return result


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _run(sc: Scenario, out: Path, stack: Stack, result: Outcome, samples: list[Sample]) -> None:
    o = sc.options
    ns = o.namespace

    heading("2. Local cluster: real kube-apiserver, etcd, scheduler, controllers; kwok GPU nodes")
    t = time.monotonic()
    # GPU nodes for the pool at its maximum and its standby placeholders.
    node = GpuNodePool()
    nodes = math.ceil((o.max_replicas + STANDBY_PLACEHOLDERS) / node.gpus_per_node)
    config = ClusterConfig(
        gpu_ready_delay_s=o.cold_start_seconds,
        gpu_pools=(replace(node, count=max(node.count, nodes)),),
    )
    cluster = LocalCluster(out / "cluster", config, tie_to_parent=True)
    stack.cluster = cluster
    cluster.start()
    gpus = sum(p.count * p.gpus_per_node for p in cluster.config.gpu_pools)
    say(f"   up in {time.monotonic() - t:.0f} s: {cluster.server}, {gpus} fake H100 GPUs")
    say(f"   kubectl --kubeconfig {cluster.kubeconfig} get ppool -n {ns}")
    api = cluster.api_client()
    try:
        _with_api(sc, out, stack, result, samples, cluster, api)
    finally:
        api.close()


def _with_api(
    sc: Scenario,
    out: Path,
    stack: Stack,
    result: Outcome,
    samples: list[Sample],
    cluster: LocalCluster,
    api: Any,
) -> None:
    from kubernetes import client

    o = sc.options
    ns, name = o.namespace, o.name
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    install_crd(api)
    core.create_namespace({"metadata": {"name": ns}})
    wait_default_service_account(api, ns, 60)

    heading(f"3. GPU Deployment {ns}/{name}: pods take {o.cold_start_seconds:g} s to be Ready")
    initial = sc.initial_replicas()
    result.initial_replicas = initial
    apps.create_namespaced_deployment(
        ns, gpu_deployment(name, initial, ready_delay=f"{o.cold_start_seconds:g}s")
    )
    say(f"   {initial} replicas (what the first live step needs at 70 % load); waiting for Ready")

    def ready_replicas() -> int:
        return int(apps.read_namespaced_deployment(name, ns).status.ready_replicas or 0)

    wait_until(f"{initial} Ready replicas", lambda: ready_replicas() >= initial,
               o.cold_start_seconds * 3 + 120)  # fmt: skip

    heading("4. Prometheus with a week of history, shaped as vLLM metrics")
    fleet_port = procs.free_port()
    prom = Prometheus(
        out / "prometheus",
        scrape_targets=(f"127.0.0.1:{fleet_port}",),
        scrape_interval_s=SCRAPE_SECONDS,
    )
    stack.prometheus = prom
    start = time.time()
    sps = o.seconds_per_step
    hist = sc.history_rps
    times = [start - (len(hist) - i) * sps for i in range(len(hist))]
    profile = VllmProfile(sc.tokens.prompt, sc.tokens.output, sc.latency_seconds)
    # The history is the Ready pods' own: the live fleet continues these series (the same
    # labels, with the job and instance the scrape adds, and the counters going on from
    # the history's end), so no rate() sees a seam.
    pods = tuple(sorted(list_pods(core, ns, name)[1]))
    history = vllm_samples(
        times,
        [float(r) for r in hist],
        namespace=ns,
        model_name=name,
        pods=pods,
        profile=profile,
        extra_labels={"job": SCRAPE_JOB, "instance": f"127.0.0.1:{fleet_port}"},
    )
    counters = counters_at(history, start, float(hist[-1]) / len(pods), profile)
    prom.backfill(history)
    st = sc.stretch
    say(
        f"   {len(hist)} trace steps ({st.trace_time(st.start_index - len(hist))} to "
        f"{st.trace_time(st.start_index)}) backfilled as {len(hist) * sps / 3600:.1f} h of "
        f"compressed history ({len(history)} samples) into {prom.url}"
    )

    heading("5. The simulated vLLM fleet starts playing the trace; the pool; the operator")
    live = [float(r) for r in sc.live_rps]
    fleet_cfg = FleetConfig(
        kubeconfig=str(cluster.kubeconfig),
        namespace=ns,
        deployment=name,
        model_name=name,
        port=fleet_port,
        record=str(out / "fleet.csv"),
        start=start,
        seconds_per_step=sps,
        rates=live,
        replica_rps=sc.replica_rps,
        max_concurrency=sc.max_concurrency,
        latency_seconds=sc.latency_seconds,
        prompt_tokens=sc.tokens.prompt,
        output_tokens=sc.tokens.output,
        counters=counters,
    )
    fleet_cfg.save(out / "fleet.json")
    env = dict(os.environ)
    here = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(PROJECT_ROOT / "tests"), env.get("PYTHONPATH", "")]
    )
    stack.procs.append(
        procs.start(
            "fleet",
            [sys.executable, "-m", "prescaler_demo.fleet", str(out / "fleet.json")],
            out,
            tie_to_parent=True,
            env=env,
        )
    )
    result.live_start = start
    result.live_end = fleet_cfg.end
    result.window_start = start + o.window_in_seconds
    result.window_end = result.window_start + o.window_minutes * 60
    result.window_replicas = o.window_replicas
    pool_file = out / "inferencepool.yaml"
    pool_file.write_text(sc.pool_yaml(prom.url, start))
    say("   " + kubectl(cluster.kubeconfig, "apply", "-f", str(pool_file)).strip())
    op_env = dict(env, KUBECONFIG=str(cluster.kubeconfig))
    op_env.update({k: v[0] for k, v in OPERATOR_ENV.items()})
    operator = procs.start(
        "prescaler-operator",
        [
            sys.executable, "-m", "prescaler.cli", "run", "--namespace", ns,
            "--metrics-port", str(procs.free_port()),
        ],
        out,
        tie_to_parent=True,
        env=op_env,
    )  # fmt: skip
    stack.procs.append(operator)
    say(f"   prescaler run --namespace {ns}")
    say(f"   operator log: {operator.log}")
    say(
        f"   window 'launch' opens at {_clock(result.window_start, start)} for "
        f"{o.window_minutes:g} min with {o.window_replicas} replicas; pre-warm lead "
        f"{o.window_lead_seconds} s"
    )

    heading(f"6. Live timeline (trace played {sc.compression:g}x faster; one row every 20 s)")
    say(
        f"   {'clock':>6} {'trace':>9} {'demand':>7} {'fc.up':>7} {'desired':>7} "
        f"{'ready':>5} {'waiting':>7}  plan"
    )
    say(f"   {'m:ss':>6} {'time':>9} {'req/s':>7} {'req/s':>7} {'':>7} {'':>5} {'req':>7}")
    record_path = out / "fleet.csv"
    next_row = start
    mid_ppool = False
    while time.time() < fleet_cfg.end + 1:
        if not stack.procs[0].alive() and time.time() < fleet_cfg.end:  # it ends at `end`
            raise RuntimeError(f"the fleet exited early; log: {stack.procs[0].log}")
        if not operator.alive():
            raise RuntimeError(f"the operator exited; last lines:\n{operator.log_tail()}")
        now = time.time()
        sample = _look(apps, custom, ns, name, now)
        samples.append(sample)
        _track(result, sample)
        if now >= next_row:
            next_row += 20
            result.timeline_rows += 1
            last = _last_record(record_path)
            step = int(last.get("step", (now - start) // sps))
            step = min(max(step, 0), len(live) - 1)
            demand = last.get("demand_rps", live[step])
            waiting = last.get("waiting", 0.0)
            up = "-" if sample.forecast_upper is None else f"{sample.forecast_upper:.0f}"
            desired = "-" if sample.desired is None else str(sample.desired)
            say(
                f"   {_clock(now, start):>6} {st.trace_time(st.start_index + step):>9} "
                f"{demand:>7.0f} {up:>7} {desired:>7} {sample.ready:>5} {waiting:>7.0f}  "
                f"{sample.constraint}"
            )
        if not mid_ppool and now >= start + (fleet_cfg.end - start) / 2:
            mid_ppool = True
            say("   $ kubectl get ppool -n " + ns)
            for line in kubectl(cluster.kubeconfig, "get", "ppool", "-n", ns).splitlines():
                say("   " + line)
        time.sleep(2.0)

    heading("kubectl get ppool (at the end)")
    result.ppool_output = kubectl(cluster.kubeconfig, "get", "ppool", "-n", ns, "-o", "wide")
    for line in result.ppool_output.splitlines():
        say("   " + line)
    status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status", {})
    cold = status.get("coldStart") or {}
    result.measured_cold_start = cold.get("p90Seconds")
    result.forecast_model = (status.get("forecast") or {}).get("model")
    say(
        f"   cold start in use {cold.get('seconds', '-')} s ({cold.get('source', '-')}); "
        f"forecast model {result.forecast_model}"
    )
    calibrated = next(
        (c for c in status.get("conditions", []) if c.get("type") == "RiskCalibrated"), None
    )
    if calibrated is not None:
        result.risk_calibrated = f"{calibrated.get('reason')}: {calibrated.get('message')}"
        say(f"   risk margin: {result.risk_calibrated}")
    policy = status.get("policy") or {}
    if policy:
        chosen = f"{policy.get('inForce')} ({policy.get('chosenBy')})"
        result.policy = f"{chosen}: {policy.get('reason')}"
        say(f"   policy: {result.policy}")
    _report(sc, out, result, samples, start)


def counters_at(
    history: list[PromSample], at: float, pod_rps: float, profile: VllmProfile
) -> dict[str, list[float]]:
    """Each pod's request, prompt-token and generated-token counters at ``at`` (the end of
    the history): the last backfilled value plus the last step's rate since (none after
    a collection gap, where the counters stand still)."""
    names = ("vllm:request_success_total", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total")  # fmt: skip
    factors = (1.0, profile.prompt_tokens_per_request, profile.generation_tokens_per_request)
    last: dict[tuple[str, str], tuple[float, float]] = {}
    for s in history:
        key = (s.name, s.labels["pod"])
        if s.name in names and (key not in last or s.timestamp_s > last[key][0]):
            last[key] = (s.timestamp_s, s.value)
    rate = pod_rps if math.isfinite(pod_rps) else 0.0
    out: dict[str, list[float]] = {}
    for (metric, pod), (ts, value) in sorted(last.items()):
        values = out.setdefault(pod, [0.0, 0.0, 0.0])
        i = names.index(metric)
        values[i] = value + rate * factors[i] * max(0.0, at - ts)
    return out


def _look(apps: Any, custom: Any, ns: str, name: str, now: float) -> Sample:
    dep = apps.read_namespaced_deployment(name, ns)
    status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status", {})
    plan = status.get("plan") or {}
    lookahead = float(plan.get("lookaheadSeconds") or 0)
    upper: float | None = None
    points = (status.get("forecast") or {}).get("points") or []
    for p in points:
        pt = datetime.fromisoformat(p["t"].replace("Z", "+00:00")).timestamp()
        if pt <= now + max(lookahead, 60) and (upper is None or p["upper"] > upper):
            upper = float(p["upper"])
    if upper is None and points:
        upper = float(points[0]["upper"])
    placeholders = ((status.get("standby") or {}).get("placeholders") or {}).get("desired", 0)
    constraint = plan.get("constraint", "-")
    if plan.get("activeWindows"):
        constraint += " (" + ",".join(plan["activeWindows"]) + ")"
    elif ": queue:" in plan.get("reason", ""):
        constraint += " (queue)"  # the waiting requests drove the plan
    return Sample(
        t=now,
        replicas=int(dep.spec.replicas or 0),
        ready=int(dep.status.ready_replicas or 0),
        desired=status.get("desiredReplicas"),
        standby=int(placeholders or 0),
        forecast_upper=upper,
        constraint=constraint,
    )


def _track(result: Outcome, s: Sample) -> None:
    result.max_replicas_seen = max(result.max_replicas_seen, s.replicas)
    if result.first_scale_up_at is None and s.replicas > result.initial_replicas:
        result.first_scale_up_at = s.t
    if (
        result.prewarm_at is None
        and s.t < result.window_start
        and s.replicas >= result.window_replicas
    ):
        result.prewarm_at = s.t
    if result.prewarm_ready_at is None and s.ready >= result.window_replicas:
        result.prewarm_ready_at = s.t


def _last_record(path: Path) -> dict[str, float]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    if len(lines) < 2:
        return {}
    header = lines[0].split(",")
    try:
        return dict(zip(header, map(float, lines[-1].split(",")), strict=True))
    except ValueError:
        return {}


def _report(sc: Scenario, out: Path, result: Outcome, samples: list[Sample], start: float) -> None:
    heading("7. The same demand under the HPA (the backtest's reactive policy), and the plot")
    record = Record.read(out / "fleet.csv")
    hpa: Comparison = hpa_on_same_demand(sc, start)
    unserved, gpu_hours, standby = prescaler_scores(record, samples, hpa.step_seconds)
    result.prescaler_unserved, result.prescaler_gpu_hours = unserved, gpu_hours
    result.prescaler_standby_gpu_hours = standby
    result.hpa_unserved, result.hpa_gpu_hours = hpa.hpa_unserved, hpa.hpa_gpu_hours
    say(f"   {'':<28}{'unserved demand':>16}{'GPU-hours':>11}")
    say(f"   {'prescaler (measured live)':<28}{unserved:>16.1%}{gpu_hours:>11.2f}"
        f"   ({standby:.2f} of them standby placeholders)")  # fmt: skip
    say(f"   {'HPA at 70 % (simulated)':<28}{hpa.hpa_unserved:>16.1%}{hpa.hpa_gpu_hours:>11.2f}")
    result.oracle_unserved, result.oracle_gpu_hours = hpa.oracle_unserved, hpa.oracle_gpu_hours
    say(f"   {'oracle (knows the future)':<28}{hpa.oracle_unserved:>16.1%}"
        f"{hpa.oracle_gpu_hours:>11.2f}")  # fmt: skip
    say(f"   unserved: share of arriving requests not served in the {hpa.step_seconds:g} s step "
        "they arrived in (both sides);")  # fmt: skip
    say("   prescaler's GPU-hours include its standby placeholder pods.")
    result.hpa_curve = [asdict(p) for p in hpa.hpa_curve]
    say(
        "   the HPA's curve on the same demand (target utilization: unserved, GPU-hours): "
        + "; ".join(f"{p.target:.0%}: {p.unserved:.1%}, {p.gpu_hours:.2f}" for p in hpa.hpa_curve)
    )
    match = matching_hpa(hpa.hpa_curve, unserved)
    if match is None:
        say(f"   no HPA target down to {min(HPA_CURVE_TARGETS):.0%} leaves as little waiting "
            f"as prescaler did ({unserved:.1%})")  # fmt: skip
    else:
        result.hpa_matching_target, result.hpa_matching_gpu_hours = match.target, match.gpu_hours
        serving = gpu_hours - standby
        say(f"   the HPA as short as prescaler or less: at {match.target:.0%}, "
            f"{match.gpu_hours:.2f} GPU-hours ({match.unserved:.1%} unserved); prescaler "
            f"{gpu_hours / match.gpu_hours:.2f}x that, {serving / match.gpu_hours:.2f}x "
            "without its standby placeholders")  # fmt: skip
    day = day_backtest(sc, start, match.target if match is not None else None)
    result.day = asdict(day)
    say(f"   the tenant's last backfilled day (one trace day), replayed as the operator plans "
        f"it, at the pool's defaults (it ended on policy {day.policy}):")  # fmt: skip
    rows = [("prescaler (defaults)", day.prescaler), ("HPA at 70 %", day.hpa)]
    if day.matching is not None:
        rows.append((f"HPA at {day.matching.target:.0%} (as short live)", day.matching))
    for label, point in rows:
        say(f"   {label:<28}{point.unserved:>16.1%}{point.gpu_hours:>11.2f}")
    if result.prewarm_at is not None:
        lead = result.window_start - result.prewarm_at
        n = result.window_replicas
        say(f"   pre-warm: {n} replicas asked for {lead:.0f} s before the window opened")
    png = out / "demo.png"
    plot(png, sc, start, record, samples, hpa, (result.window_start, result.window_end))
    result.png = str(png)
    say(f"   plot: {png}")
    with (out / "timeline.csv").open("w") as f:
        f.write("t,replicas,ready,desired,standby,forecast_upper,constraint\n")
        for s in samples:
            up = "" if s.forecast_upper is None else f"{s.forecast_upper:.3f}"
            desired = "" if s.desired is None else str(s.desired)
            f.write(f"{s.t:.3f},{s.replicas},{s.ready},{desired},{s.standby},{up},{s.constraint}\n")


def describe(sc: Scenario) -> None:
    """What the run will do and every setting that is not the default, with why."""
    st, o = sc.stretch, sc.options
    heading("The live demo: the trace, the time compression, the settings")
    live_end = st.start_index + st.steps
    say(
        f"   trace {st.trace.name}, steps of {st.trace.step_seconds / 60:g} min; live stretch "
        f"{st.trace_time(st.start_index)}-{st.trace_time(live_end)} (steps "
        f"{st.start_index}-{live_end - 1})"
    )
    say(
        f"   rule: the strongest recurring ramp the history foretells: after a week of history, "
        f"the gap-free {st.steps}-step stretch, of the trace or of one of its tenants, whose "
        f"ramp (the highest level held for {HOLD_STEPS} steps after a {st.lead_steps}-step "
        f"lead-in, over the lead-in) is highest both here and, as the median, at the same time "
        f"of day on the {st.days} days before it: here {st.rise:.2f}x, foretold "
        f"{st.foretold:.2f}x"
    )
    say(
        f"   time: one trace step per {o.seconds_per_step:g} s of wall time, i.e. "
        f"{sc.compression:g}x faster; the week of history spans "
        f"{st.history_steps * o.seconds_per_step / 3600:.1f} h of wall time"
    )
    say(
        f"   demand x{sc.scale:.3g} so the stretch's peak needs {o.peak_replicas} replicas; one "
        f"replica serves {sc.replica_rps:.1f} req/s ({o.tokens_per_second:g} tokens/s, "
        f"{sc.tokens.prompt:.0f}+{sc.tokens.output:.0f} tokens per request)"
    )
    say("   non-default settings of the InferencePool (hack/demo/inferencepool.yaml):")
    rows = sc.non_default_settings()
    rows.append(("coldStart.seconds", f"{o.cold_start_seconds:g}", "300",
                 "the fake pods' cold start, until it is measured"))  # fmt: skip
    rows.append(("model.contextTokens", str(sc.tokens.context_p95), "measured",
                 "the simulated fleet exports no prompt-length histogram"))  # fmt: skip
    for key, value, default, why in rows:
        say(f"     {key:<28}{value:>14} (default {default}): {why}")
    say("   operator settings (prescaler run):")
    for key, (value, default, why) in OPERATOR_ENV.items():
        say(f"     {key:<28}{value:>14} (default {default}): {why}")
    day, week = sc.seasonality_periods()[0], sc.seasonality_periods()[-1]
    say(
        f"   seasonality: a trace day lasts {day / 3600:g} h here and a week {week / 3600:g} h; "
        "forecast.seasonalityPeriods says so, so the daily seasonal-naive model and Prophet's "
        "daily seasonality apply (the weekly ones need more than the backfilled week); "
        "`model: auto` picks by backtest."
    )
    say(f"   cold start: {math.ceil(o.cold_start_seconds)} s wall = "
        f"{o.cold_start_seconds * sc.compression / 60:g} min of trace time")  # fmt: skip
