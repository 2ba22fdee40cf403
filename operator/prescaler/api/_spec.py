"""The InferencePool spec, as pydantic models. The CRD's OpenAPI schema is generated from here.

Structural rules the API server checks itself (enums, bounds, CEL in
``x-kubernetes-validations``) live next to the fields they guard. Rules that need more
than the object (does the target exist, does the PromQL parse, does a time zone exist, is
a dated window's end after its start when the two are written in different forms) are
checked by the operator, which then reports condition ``Invalid``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue

from prescaler.api._base import WireModel, cel, validations
from prescaler.capacity import DTYPE_BYTES, PRESETS
from prescaler_forecast import AUTO, MODEL_NAMES

TargetKind = Literal["Deployment", "StatefulSet", "HorizontalPodAutoscaler", "ScaledObject"]
Mode = Literal["replicas", "hpaFloor", "kedaTrigger"]
ExternalChangePolicy = Literal["revert", "respect", "pause"]
Engine = Literal["vllm", "sglang", "tgi"]
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
Name = Annotated[str, Field(min_length=1, max_length=253)]
PromQL = Annotated[str, Field(min_length=1, max_length=4096)]

assert set(Dtype.__args__) == set(DTYPE_BYTES)  # type: ignore[attr-defined]

DAY = 86_400


def _cron_pattern() -> str:
    """A five-field cron expression (or an ``@hourly``-style macro), each field checked
    against its range, so the API server refuses ``61 * * * *`` at ``kubectl apply``."""

    def field(value: str, special: str = "") -> str:
        item = rf"({special}(\*|{value}(-{value})?)(/[1-9][0-9]?)?)"
        return rf"{item}(,{item})*"

    minute, hour = r"([0-5]?[0-9])", r"([01]?[0-9]|2[0-3])"
    day = r"(0?[1-9]|[12][0-9]|3[01])"
    month = r"(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))"
    weekday = r"([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat))"
    fields = [field(minute), field(hour), field(day, r"\?|L|"), field(month),
              field(weekday, r"\?|[0-7]#[1-5]|")]  # fmt: skip
    blanks = r"[ \t]+"
    return rf"^(@(yearly|annually|monthly|weekly|daily|hourly)|{blanks.join(fields)})$"


CRON_PATTERN = _cron_pattern()
HOURLY_AT_MOST_PATTERN = r"^(@|[0-5]?[0-9][ \t])"
"""A macro, or a first (minute) field of one number: the window fires at most once an hour
(:data:`prescaler.planning.MIN_RECURRENCE_SECONDS` says why)."""
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"
"""The shape of an IANA zone name (whether it exists is checked by the operator)."""
_NAIVE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}$"
_RFC3339 = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})$"
)
# The patterns go into CEL raw strings (r'...'), where a backslash is taken as written.
_PRESET_NAMES: list[JsonValue] = [*sorted(PRESETS)]
_FORECAST_MODELS: list[JsonValue] = [AUTO, *MODEL_NAMES]


class TargetRef(WireModel):
    """The object prescaler scales, in the pool's namespace."""

    kind: TargetKind = "Deployment"
    """``Deployment`` or ``StatefulSet`` (scaled through the scale subresource, mode
    ``replicas``), ``HorizontalPodAutoscaler`` (its ``minReplicas`` is raised and lowered,
    mode ``hpaFloor``; the HPA's own scale target is observed), or a KEDA ``ScaledObject``
    (``keda.sh/v1alpha1``, mode ``kedaTrigger``: KEDA scales its ``scaleTargetRef`` to the
    plan, served as the metric of the ScaledObject's ``external`` trigger; the workload is
    observed, never written)."""
    name: Name
    """Name of the target object."""


class InferencePoolRef(WireModel):
    """A Gateway API Inference Extension InferencePool that fronts this fleet (informational)."""

    name: Name
    """Name of the Gateway API Inference Extension InferencePool."""
    group: str = Field(default="inference.networking.k8s.io", max_length=253)
    """API group of the referenced pool."""


class Architecture(WireModel):
    """A model architecture given by its numbers, when no preset fits."""

    name: str = Field(default="custom", max_length=63)
    """Label for the architecture, shown in messages."""
    layers: int = Field(ge=1, le=1024)
    """Transformer layers."""
    kv_heads: int = Field(default=0, ge=0, le=1024)
    """KV heads per layer (GQA groups); required for attention ``gqa``."""
    head_dim: int = Field(default=0, ge=0, le=4096)
    """Dimension of one attention head; required for attention ``gqa``."""
    parameters_billions: float = Field(gt=0, le=100_000)
    """Total parameters in billions (all experts for MoE)."""
    max_context_tokens: int = Field(ge=1, le=16_777_216)
    """Longest context the model supports."""
    weight_dtype: Dtype = "bf16"
    """Data type of the weights."""
    kv_cache_dtype: Dtype = "bf16"
    """Data type of the KV cache."""
    attention: Literal["gqa", "mla"] = "gqa"
    """``gqa`` (standard and grouped-query attention) or ``mla`` (multi-head latent)."""
    kv_lora_rank: int = Field(default=0, ge=0, le=65_536)
    """MLA only: width of the compressed KV latent."""
    rope_head_dim: int = Field(default=0, ge=0, le=4096)
    """MLA only: width of the decoupled RoPE key."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.attention != 'gqa' || (self.kvHeads > 0 && self.headDim > 0)",
                "gqa attention needs kvHeads > 0 and headDim > 0",
            ),
            cel(
                "self.attention != 'mla' || self.kvLoraRank > 0",
                "mla attention needs kvLoraRank > 0",
            ),
        )
    )


class ModelSpec(WireModel):
    """What one replica serves and what it measured: the inputs of the capacity model."""

    preset: str | None = Field(default=None, json_schema_extra={"enum": _PRESET_NAMES})
    """A known model architecture. Give this or ``architecture`` (or neither, to plan on
    throughput alone)."""
    architecture: Architecture | None = None
    """A custom architecture, when no preset fits."""
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=4096, alias="gpuMemoryGiB")
    """Memory of one GPU in GiB; required with ``preset`` or ``architecture``."""
    gpus_per_replica: int = Field(default=1, ge=1, le=64)
    """GPUs one replica uses (tensor parallelism); placeholders request the same."""
    tokens_per_second: float | None = Field(default=None, gt=0, le=1e9)
    """Measured prompt+output tokens/s one replica sustains (the compute limit). Required
    for a unified pool; a disaggregated pool gives each role's instead
    (``roles.*.tokensPerSecond``)."""
    context_quantile: float = Field(default=0.95, ge=0.5, le=0.999)
    """Quantile of the context-length distribution the memory limit is planned on."""
    context_tokens: int | None = Field(default=None, ge=1, le=16_777_216)
    """Fixed context length at that quantile; overrides the measured one."""
    prompt_tokens: float = Field(default=1000, ge=0, le=16_777_216)
    """Mean prompt tokens per request, used while the metrics don't say."""
    output_tokens: float = Field(default=500, ge=0, le=16_777_216)
    """Mean generated tokens per request, used while the metrics don't say."""
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory the engine may use (vLLM's ``gpu_memory_utilization``)."""
    decode_tokens_per_second: float = Field(default=30, gt=0, le=100_000)
    """Per-request decode speed promised to users (1 / inter-token latency target)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!(has(self.preset) && has(self.architecture))",
                "give at most one of preset and architecture",
            ),
            cel(
                "!(has(self.preset) || has(self.architecture)) || has(self.gpuMemoryGiB)",
                "gpuMemoryGiB is required with a preset or an architecture",
            ),
            cel(
                "self.promptTokens + self.outputTokens > 0.0",
                "promptTokens + outputTokens must be > 0",
            ),
        )
    )


class ColdStartSpec(WireModel):
    """How long a new replica takes from creation to Ready."""

    mode: Literal["auto", "fixed"] = "auto"
    """``auto`` measures pods of the target (created -> Ready, rolling p90) and uses that;
    ``fixed`` always uses ``seconds``. A pod gated on its warm-up (``prewarm``) is Ready
    only after it, so the measured start includes the warm-up."""
    seconds: int = Field(default=300, ge=0, le=7200)
    """The cold start in ``fixed`` mode, and the assumption in ``auto`` mode until the
    first start has been observed."""
    margin_seconds: int = Field(default=60, ge=0, le=7200)
    """Added to the cold start: how much earlier than strictly needed capacity is ready."""
    samples: int = Field(default=20, ge=1, le=100)
    """How many recent starts the rolling p90 covers."""


class SecretRef(WireModel):
    """A Secret in the pool's namespace."""

    name: Name
    """Secret name. Key ``token`` means bearer auth; keys ``username`` and ``password``
    mean basic auth."""


class PrometheusSpec(WireModel):
    """Where demand metrics come from."""

    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    """Base URL of the Prometheus HTTP API, e.g. ``http://prometheus.monitoring:9090``."""
    auth_secret_ref: SecretRef | None = None
    """Credentials for Prometheus, from a Secret."""
    insecure_skip_verify: bool = False
    """Skip TLS certificate verification (test setups only)."""


class QueriesSpec(WireModel):
    """Custom PromQL, each replacing the engine profile's query of the same name. ``$sel``
    in a query becomes the label matchers in braces (``forecast.selector``, plus the role's
    ``selector`` in a disaggregated pool), e.g. ``sum(rate(my_prompt_tokens$sel[$window]))``."""

    requests_per_second: PromQL | None = None
    """Demand in requests/s, one series (it is forecast). ``$window`` in it is replaced by
    the rate window: the history step for the forecast's history (each step's own mean),
    the operator's rate window for the demand now. Without ``$window`` the query is used as
    written and each value is read as the step that ends at its time."""
    prompt_tokens_per_second: PromQL | None = None
    """Prompt tokens/s arriving."""
    output_tokens_per_second: PromQL | None = None
    """Generated tokens/s."""
    running: PromQL | None = None
    """Requests running now."""
    running_by_pod: PromQL | None = None
    """Requests running now on each pod, one series per pod labelled ``pod`` (use
    ``label_replace`` if your scrape names it otherwise). Read before a scale-down of a
    Deployment to set each pod's ``controller.kubernetes.io/pod-deletion-cost``, so the
    idlest pods go first."""
    waiting: PromQL | None = None
    """Requests queued now."""
    waiting_growth_per_second: PromQL | None = None
    """How fast the queue grows, requests/s (negative while it drains), e.g.
    ``deriv(sum(vllm:num_requests_waiting)[$window:$resolution])``; ``$window`` is the
    rate window and ``$resolution`` an eighth of it. A full fleet serves only its capacity,
    so arriving demand is the served rate plus this."""
    context_tokens: PromQL | None = None
    """Context length at the model's ``contextQuantile``; ``$quantile`` is substituted."""
    kv_cache_usage: PromQL | None = None
    """The fleet's mean KV-cache utilization, 0-1 (a degradation signal)."""
    ttft_p95_seconds: PromQL | None = None
    """Time to first token p95, seconds (a degradation signal with ``degradation.ttft``)."""
    ttft_p99_seconds: PromQL | None = None
    """Time to first token p99, seconds."""


class ForecastSpec(WireModel):
    """How demand is read and forecast."""

    prometheus: PrometheusSpec
    """The Prometheus to read from."""
    engine: Engine = "vllm"
    """Serving engine whose metric names the default queries use."""
    selector: str = Field(default="", max_length=1024)
    """Label matchers added to every profile query,
    e.g. ``namespace="serving",model_name="llama"``."""
    queries: QueriesSpec | None = None
    """Custom PromQL overriding the engine profile; ``$sel`` in a query becomes the label
    matchers (with a disaggregated role's ``selector``)."""
    lookback_seconds: int = Field(default=7 * DAY, ge=3600, le=90 * DAY)
    """History the forecast model is fit on."""
    step_seconds: int = Field(default=60, ge=10, le=3600)
    """Resolution of the history and of the forecast."""
    model: str = Field(default=AUTO, json_schema_extra={"enum": _FORECAST_MODELS})
    """Forecast model; ``auto`` picks the best by rolling-origin backtest score."""
    refit_seconds: int = Field(default=3600, ge=10, le=7 * DAY)
    """How often the model is refit; between fits the last forecast is reused."""
    horizon_seconds: int = Field(default=7200, ge=60, le=7 * DAY)
    """How far ahead the forecast reaches."""
    seasonality_periods: list[Annotated[int, Field(ge=60, le=366 * DAY)]] = Field(
        default_factory=lambda: [DAY, 7 * DAY], min_length=1, max_length=4
    )
    """The demand's cycles, in seconds: a day and a week, or a shift, a batch cycle, a day
    played faster. The seasonal-naive models repeat the shortest and the longest, the
    seasonal profile takes the median over the last cycles of the longest (once the history
    covers three) or of the shortest, Prophet fits a seasonality for each its history covers
    twice; a seasonal model takes part once the history covers its period (the profile: two
    of the shortest)."""
    quantile: float = Field(default=0.95, ge=0.5, le=0.999)
    """Upper quantile of the forecast's band (status, standby, and the plan until the
    pool's own lookaheads calibrate its margin)."""
    headroom: float = Field(default=1.0, ge=1, le=10)
    """Expert override: a multiplier on every requirement (capacity-model error, long-tail
    contexts). The margin is calibrated on the pool's own errors, so the default adds
    nothing on top of it."""
    observed_headroom: float = Field(default=1.0, ge=1, le=10)
    """Expert override: the nowcast guard. The plan never falls below the latest observed
    demand times this (and the headroom). The default protects the present only; the
    calibrated margin covers what comes next."""
    observed_trend_seconds: int = Field(default=120, ge=0, le=3600)
    """The nowcast follows a ramp. While the observed demand rises (measured over the last
    minute), the plan sizes for it as far up its rise as it climbs in this many seconds: a
    climb under way is covered by its first order, as a reactive HPA's proportional step
    covers it, and a burst that no forecast announced is met from its first minute. 0: the
    latest observation as it is. A fall is never extrapolated, nor a rise within a
    stabilization period after a release. Above 120 s noise that looks like a climb makes
    the fleet change direction twice in a stabilization period."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.horizonSeconds >= self.stepSeconds",
                "horizonSeconds must be at least stepSeconds",
            ),
            cel(
                "!has(self.seasonalityPeriods)"
                " || self.seasonalityPeriods.all(p, p >= 2 * self.stepSeconds)",
                "every seasonality period must be at least two stepSeconds",
            ),
        )
    )


class WindowSpec(WireModel):
    """A scheduled window: dated (``start``/``end``) or recurring (``cron``/``durationSeconds``)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Window name, unique in the pool."""
    start: str | None = Field(default=None, max_length=64)
    """Dated window start, ISO 8601; without an offset it is read in ``timeZone``."""
    end: str | None = Field(default=None, max_length=64)
    """Dated window end, ISO 8601; without an offset it is read in ``timeZone``."""
    cron: str | None = Field(default=None, max_length=128)
    """Recurring window: a five-field cron expression evaluated in ``timeZone``."""
    duration_seconds: int | None = Field(default=None, ge=1, le=31 * DAY)
    """Recurring window: how long each occurrence lasts."""
    time_zone: str = Field(default="UTC", min_length=1, max_length=64)
    """IANA time zone, e.g. ``Europe/Berlin``."""
    min_replicas: int | None = Field(default=None, ge=0, le=100_000)
    """Replicas the window needs at least."""
    expected_requests_per_second: float | None = Field(default=None, ge=0, le=1e9)
    """Load the window brings, in requests/s, sized through the capacity model."""
    lead_seconds: int = Field(default=600, ge=0, le=DAY)
    """Pre-warm lead: capacity is requested this long before the start (at least one cold
    start plus margin)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel("has(self.start) != has(self.cron)", "give exactly one of start and cron"),
            cel("has(self.start) == has(self.end)", "a dated window needs both start and end"),
            cel(
                "has(self.cron) == has(self.durationSeconds)",
                "a cron window needs durationSeconds (and only a cron window has one)",
            ),
            cel(
                "has(self.minReplicas) || has(self.expectedRequestsPerSecond)",
                "give minReplicas or expectedRequestsPerSecond",
            ),
            # Shapes the API server can check; the operator checks the rest (does the zone
            # exist, does the cron ever fire) and reports Invalid.
            cel(
                f"!has(self.cron) || self.cron.matches(r'{CRON_PATTERN}')",
                "cron must be five fields (minute hour day-of-month month day-of-week), "
                "each within its range, or a macro such as @hourly",
                ".cron",
            ),
            cel(
                f"!has(self.cron) || self.cron.matches(r'{HOURLY_AT_MOST_PATTERN}')",
                "cron must name one minute (a window recurs at most hourly; the forecast "
                "follows faster patterns)",
                ".cron",
            ),
            cel(
                f"self.timeZone.matches(r'{TIME_ZONE_PATTERN}')",
                "timeZone must be an IANA time zone name such as Europe/Berlin",
                ".timeZone",
            ),
            # end > start where both are written alike (other forms: the operator checks).
            cel(
                f"!has(self.start) || !has(self.end) || !self.start.matches(r'{_NAIVE}') "
                f"|| !self.end.matches(r'{_NAIVE}') || self.end > self.start",
                "end must be after start",
                ".end",
            ),
            cel(
                f"!has(self.start) || !has(self.end) || !self.start.matches(r'{_RFC3339}') "
                f"|| !self.end.matches(r'{_RFC3339}') "
                "|| timestamp(self.end) > timestamp(self.start)",
                "end must be after start",
                ".end",
            ),
        )
    )


class ImagePrePullSpec(WireModel):
    """A DaemonSet that keeps the serving image pulled on the target's nodes."""

    enabled: bool = False
    """Create the pre-pull DaemonSet."""
    image: str | None = Field(default=None, max_length=1024)
    """Image to pre-pull; defaults to the target's first container image."""
    command: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=lambda: ["sleep", "infinity"], max_length=16
    )
    """What the pre-pull container runs after the pull (must idle at negligible cost)."""


class PlaceholderSpec(WireModel):
    """Low-priority pods that hold GPU nodes so a new replica preempts instead of waiting."""

    enabled: bool = False
    """Create placeholder pods, as many as the planner's standby size."""
    max_replicas: int = Field(default=2, ge=0, le=1000)
    """Upper bound on placeholders."""
    priority_class_name: str = Field(default="prescaler-placeholder", min_length=1, max_length=253)
    """PriorityClass of placeholders; the default one is created (value -10) if missing.
    It must be one the operator allows (by default only this one) and below the priority of
    the target's pods; otherwise no placeholders are made (condition StandbyAllowed)."""
    image: str = Field(default="registry.k8s.io/pause:3.10", max_length=1024)
    """Image of the placeholder container."""


class HotStandbySpec(WireModel):
    """Replicas with the model loaded but outside the Service (labelled apart), promoted
    into it in seconds when the plan asks for more than is ready."""

    replicas: int = Field(default=0, ge=0, le=100)
    """Hot standby replicas (a Deployment ``<pool>-hot`` running the target's pod template
    under other labels, so no Service selects them); 0 disables it. When the plan wants
    more replicas than are ready, ready hot pods are promoted: relabelled with the
    target's pod labels (every Service of the target then routes to them) and handed to
    the pool, and the hot Deployment starts replacements. A promoted pod bridges the cold
    start of the replicas the target gained and is deleted (gracefully) once those are
    Ready."""


class StandbySpec(WireModel):
    """Warm standby: pre-pulled images, placeholder pods, hot replicas."""

    image_pre_pull: ImagePrePullSpec = Field(default_factory=ImagePrePullSpec)
    """Keep the serving image pulled on GPU nodes."""
    placeholders: PlaceholderSpec = Field(default_factory=PlaceholderSpec)
    """Hold GPU nodes with low-priority pods, sized by the planner."""
    hot: HotStandbySpec = Field(default_factory=HotStandbySpec)
    """Hot standby replicas."""


LaneName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


class QueueThresholds(WireModel):
    """Queue depth (waiting requests) per serving replica."""

    warning_per_replica: float = Field(default=10, ge=0, le=1e6)
    """Above this many waiting requests per serving replica: ``warning``."""
    critical_per_replica: float = Field(default=50, ge=0, le=1e6)
    """Above this many: ``critical``."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.warningPerReplica <= self.criticalPerReplica",
                "warningPerReplica must not exceed criticalPerReplica",
            )
        )
    )


class KvCacheThresholds(WireModel):
    """The fleet's mean KV-cache utilization (0-1)."""

    warning: float = Field(default=0.9, gt=0, le=1)
    """From this utilization: ``warning``."""
    critical: float = Field(default=0.97, gt=0, le=1)
    """From this utilization: ``critical`` (a full cache preempts running requests)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel("self.warning <= self.critical", "warning must not exceed critical")
        )
    )


class TtftSlo(WireModel):
    """Time-to-first-token SLO; a signal only where set."""

    p95_seconds: float | None = Field(default=None, gt=0, le=3600)
    """TTFT p95 above this: ``warning``."""
    p99_seconds: float | None = Field(default=None, gt=0, le=3600)
    """TTFT p99 above this: ``critical``."""


class ShortfallThresholds(WireModel):
    """The forecast shortfall: demand on the forecast's upper band over the next cold start,
    minus what will be ready by then, as a share of that demand."""

    warning_percent: float = Field(default=5, ge=0, le=100)
    """From this share: ``warning``."""
    critical_percent: float = Field(default=25, ge=0, le=100)
    """From this share: ``critical``."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.warningPercent <= self.criticalPercent",
                "warningPercent must not exceed criticalPercent",
            )
        )
    )


class SmallerModelRoute(WireModel):
    """Where a gateway may send short requests while the pool is ``critical``."""

    route: str = Field(min_length=1, max_length=253)
    """The gateway's name for the smaller model's backend (a Service, an InferenceModel)."""
    max_prompt_tokens: int = Field(default=1024, ge=1, le=16_777_216)
    """Only requests with at most this many prompt tokens are rerouted."""


class DegradationSpec(WireModel):
    """Degradation levels (``normal``, ``warning``, ``critical``) and the admission policy a
    gateway applies at each, published in ``status.degradation`` and the ConfigMap
    ``<pool>-degradation`` (contract: ``docs/degradation.md``)."""

    config_map: bool = True
    """Publish the ConfigMap ``<pool>-degradation`` for gateways (the status has it anyway)."""
    queue: QueueThresholds = Field(default_factory=QueueThresholds)
    """Queue-depth thresholds."""
    kv_cache: KvCacheThresholds = Field(default_factory=KvCacheThresholds)
    """KV-cache utilization thresholds."""
    ttft: TtftSlo = Field(default_factory=TtftSlo)
    """TTFT SLO."""
    forecast_shortfall: ShortfallThresholds = Field(default_factory=ShortfallThresholds)
    """Forecast-shortfall thresholds (pools with ``spec.forecast``)."""
    hold_seconds: int = Field(default=300, ge=0, le=DAY)
    """A level rises at once and falls only after every signal stayed below it this long."""
    lanes: list[LaneName] = Field(
        default_factory=lambda: ["batch", "interactive"], min_length=1, max_length=16
    )
    """Priority lanes, lowest first: ``warning`` sheds the lowest, ``critical`` every lane
    but the highest (never shed)."""
    min_context_tokens: int = Field(default=1024, ge=1, le=16_777_216)
    """The temporary context cap never goes below this."""
    smaller_model: SmallerModelRoute | None = None
    """Optional: a smaller model for short requests while ``critical``."""


class ScaleDownSpec(WireModel):
    """How capacity is released. Never on missing or garbage metrics, whatever the mode."""

    mode: Literal["forecast", "paced"] = "forecast"
    """``forecast`` releases at once what the forecast's upper band over the next cold
    start plus margin does not need (a released replica can be back, Ready, before the
    forecast needs it); ``paced`` removes at most ``maxPercent`` per
    ``stabilizationSeconds``."""
    stabilization_seconds: int = Field(default=120, ge=0, le=DAY)
    """No scale-down this soon after a scale-up; in ``paced`` mode also at most one
    scale-down per period."""
    max_percent: int = Field(default=50, ge=1, le=100)
    """``paced`` mode: a scale-down step removes at most this share of replicas (at least
    one)."""
    direction_changes: Literal["asHpa", "free"] = "asHpa"
    """``asHpa``: the fleet changes direction (a scale-down after a scale-up, or the
    reverse) no more often than its shadow HPA on the same demand: while its count over
    the trailing day has reached the shadow's (``status.againstHpa.last24Hours``), a
    release that would reverse a scale-up waits (a scale-up never does), unless it frees
    more than half the fleet and the trailing week's count (``last7Days``) is still below
    the shadow's. Planning on the
    forecast, every release also keeps what the forecast asks back within its horizon,
    and one that would reverse a scale-up frees more than the HPA's 10 % tolerance of the
    fleet or waits (``docs/scale-down.md``). ``free``: a
    release goes whenever the plan allows; on smooth daily traffic that spends fewer
    GPU-hours at two to three times the HPA's direction changes
    (``benchmarks/README.md``)."""


class ScaleUpSpec(WireModel):
    """How fast capacity is added."""

    max_step: int | None = Field(default=None, ge=1, le=100_000)
    """Replicas added per decision at most; unbounded when unset."""


class ObjectiveSpec(WireModel):
    """The service level the fleet is sized for: one knob.

    The plan sizes ready capacity to a quantile of the *peak* demand over the lookahead
    (the next cold start plus margin), predicted from what is known now (the forecast
    mean's peak, or the demand arriving now if larger, or, when demand runs above the
    forecast, the forecast's climb from the observed level; plus the pool's typical
    demand) times a margin calibrated on this pool's own lookaheads. The quantile's level adapts
    online so that the share of demand that waits for capacity tracks a target ``ε``
    (adaptive conformal inference):

    * by default, **relative to the HPA** it replaces: ``ε`` is ``relativeToHpa`` times
      the share of the recent demand that a reactive HPA (the pool's own shadow HPA,
      ``status.againstHpa``) would have left waiting (over all recent lookaheads, faded
      like the calibration: ``status.risk.hpaWaitedFraction``), and at least
      ``relativeFloor``. Every lookahead is held to it, the ramps that catch the HPA out
      too;
    * with ``budgetToHpa`` set as well, the cost holds both ways: a pool whose GPU-hours
      over the trailing day exceed that share of its shadow HPA's lets ``ε`` rise (past
      ``relativeToHpa``'s and past the HPA's own share if need be, to at most 0.2) until it
      is inside the budget, and a pool under it spends the difference on a tighter ``ε``
      (``status.risk.budget``: the budget, the trailing ratio, the ``ε`` in force and which
      side binds);
    * with ``servedFraction`` set, absolute: ``ε = 1 - servedFraction``. Set, it wins.

    ``adaptRate: 0`` keeps the level at ``startQuantile``; ``forecast.headroom`` and
    ``forecast.observedHeadroom`` are expert overrides that add margin on top."""

    served_fraction: float | None = Field(default=None, ge=0.5, le=0.99999)
    """Absolute objective: the share of demand to serve without waiting for capacity.
    Unset: the relative objective (``relativeToHpa``)."""
    relative_to_hpa: float = Field(default=0.1, gt=0, le=1)
    """Relative objective (the default): the share of the demand a reactive HPA would leave
    waiting on the same traffic that the plan may leave waiting. 0.1: a tenth of the HPA's
    (chosen on the first halves of the benchmark traces with the ramp nowcast on,
    ``benchmarks/README.md``, "A lower relativeToHpa with the ramp nowcast")."""
    relative_floor: float = Field(default=0.0001, ge=0, le=0.1)
    """Relative objective: the target share of demand left waiting is never below this,
    so a pool on which the HPA would leave nothing waiting is not sized for ever rarer
    peaks (its quantile level falls, and it gets cheaper). 0.0001: chosen on the first
    halves of the benchmark traces (``benchmarks/README.md``, "The floor of the relative
    objective"); a higher floor lets the plan leave more waiting than the HPA would where
    the HPA leaves little."""
    budget_to_hpa: float = Field(default=0.9, ge=0, le=2)
    """Relative objective: a cost budget, as a share of what the pool's shadow HPA would
    spend, binding both ways. The pool's GPU-hours over the trailing day
    (``status.againstHpa``'s last 24 hours) are held at this share of the shadow HPA's by a
    PI controller on the log of their ratio over the budget, whose output scales ``ε``:
    above the budget ``ε`` rises (past ``relativeToHpa`` times the HPA's share, and past
    the HPA's share itself if need be, to at most a fifth of demand), below it ``ε``
    tightens (``relativeToHpa`` to a tenth of itself at most, ``relativeFloor`` holding).
    The controller is as slow as the day it reads (integral 1 per day per unit of log
    error, proportional gain 2 for damping, no integration where the levels it steers are
    at their bounds): on a model of the loop it settles without oscillating
    (``tests/unit/test_risk.py``). ``status.risk.budget`` shows the budget, the trailing
    ratio, the ``ε`` in force and which side binds. 0: off, ``ε`` as the objective says.
    0.9, "at most nine tenths of the HPA's GPU-hours, then as little waiting as that
    buys": the promise's "cheaper" stated as a number (``benchmarks/README.md``, "A cost
    budget relative to the HPA")."""
    start_quantile: float = Field(default=0.99, ge=0.5, le=0.999)
    """Expert: the quantile level of the peak a new pool starts at, before its outcomes
    move it."""
    adapt_rate: float = Field(default=0.02, ge=0, le=1)
    """Expert: how far one lookahead's outcome moves the quantile level (times the share
    of its demand that waited, minus the objective's); 0 keeps it at ``startQuantile``."""
    memory_lookaheads: int = Field(default=1440, ge=10, le=1_000_000)
    """Expert: how many recent lookaheads the margin is calibrated on, in effect (older
    ones fade)."""


Prompt = Annotated[str, Field(min_length=1, max_length=32_768)]
ENGINE_PATH_PATTERN = r"^/[^\s?#]*$"


class ConfigMapKeyRef(WireModel):
    """One key of a ConfigMap in the pool's namespace."""

    name: Name
    """ConfigMap name."""
    key: str = Field(default="prompts", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key that holds the prompts: a YAML (or JSON) list of strings, such as
    ``["You are a helpful assistant.", "..."]``; a YAML block list (``- |``) keeps prompts
    of several lines as they are."""


class PrewarmSpec(WireModel):
    """Warm-up requests a new replica answers before it takes traffic: they fill its prefix
    cache with the pool's system prompts and run its first kernels (``docs/prewarm.md``).

    A pod whose template lists the readiness gate ``prescaler.io/prewarmed`` stays out of
    its Services until the operator has sent the requests and set that pod condition;
    warm-up that fails or times out still sets it, with the reason, so capacity is never
    held back. The measured cold start then includes the warm-up."""

    prompts: Annotated[list[Prompt], Field(min_length=1, max_length=64)] | None = None
    """The warm-up prompts, sent in this order (the most valuable first). Give these or
    ``configMapRef``."""
    config_map_ref: ConfigMapKeyRef | None = None
    """A ConfigMap key holding the prompts, read when pods are warmed (for prompts too long
    or too many for the pool object, or shared by several pools)."""
    max_requests: int = Field(default=8, ge=1, le=256)
    """Request budget: completions sent to one pod at most. Each prompt is sent once, in
    order, until the budget is spent; the model lookup (``GET modelsPath``) and the polls
    that wait for the engine to answer are not counted."""
    timeout_seconds: int = Field(default=120, ge=1, le=3600)
    """How long one pod's warm-up may take, from its containers turning ready: waiting for
    the engine to answer, the model lookup and the requests. Then the pod is released
    (reason ``PrewarmTimedOut``)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """The engine's HTTP port on the pod IP (vLLM's default 8000; SGLang 30000, TGI 80)."""
    path: str = Field(default="/v1/completions", max_length=1024, pattern=ENGINE_PATH_PATTERN)
    """The OpenAI-compatible completions endpoint; each request has ``max_tokens: 1``."""
    models_path: str = Field(default="/v1/models", max_length=1024, pattern=ENGINE_PATH_PATTERN)
    """The OpenAI-compatible model list: polled until the engine answers, and read for the
    served model's name when ``model`` is unset (its first id)."""
    model: str | None = Field(default=None, min_length=1, max_length=1024)
    """The served model name sent in each request (vLLM's ``--served-model-name``); unset,
    the first id from ``GET modelsPath`` is used."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.prompts) != has(self.configMapRef)",
                "give exactly one of prompts and configMapRef",
            ),
        )
    )


class RoleSpec(WireModel):
    """One role of a disaggregated pool: its workload, bounds and per-replica capacity."""

    target: TargetRef
    """The role's Deployment or StatefulSet (scaled through its scale subresource)."""
    tokens_per_second: float = Field(gt=0, le=1e9)
    """Measured throughput of one replica of this role: *prompt* tokens/s one prefill
    replica processes, or *output* tokens/s one decode replica generates at the pool's
    ``model.decodeTokensPerSecond`` per request (the role's compute or memory-bandwidth
    limit)."""
    min_replicas: int | None = Field(default=None, ge=0, le=100_000)
    """Fewest replicas of this role; the pool's ``minReplicas`` when unset."""
    max_replicas: int | None = Field(default=None, ge=1, le=100_000)
    """Most replicas of this role; the pool's ``maxReplicas`` when unset."""
    gpus_per_replica: int | None = Field(default=None, ge=1, le=64)
    """GPUs one replica of this role uses; ``model.gpusPerReplica`` when unset. A decode
    replica's KV-cache memory (its concurrency limit) follows from it."""
    selector: str = Field(default="", max_length=1024)
    """Label matchers that pick this role's series, added to ``forecast.selector`` in
    every query of the role, e.g. ``role="prefill"`` (the engine's pods of one role
    export the same metric names as the other's)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.target.kind == 'Deployment' || self.target.kind == 'StatefulSet'",
                "a role's target is a Deployment or a StatefulSet",
                ".target.kind",
            ),
            cel(
                "!has(self.minReplicas) || !has(self.maxReplicas) "
                "|| self.minReplicas <= self.maxReplicas",
                "minReplicas must not exceed maxReplicas",
            ),
        )
    )


class RolesSpec(WireModel):
    """A disaggregated deployment: prompts run on prefill replicas, outputs on decode
    replicas, each role its own workload, sized on its own bottleneck and forecast
    (``docs/disaggregated.md``)."""

    prefill: RoleSpec
    """The prefill role: compute-bound, sized on prompt tokens/s."""
    decode: RoleSpec
    """The decode role: bound by memory bandwidth (output tokens/s) and KV-cache memory
    (concurrency), sized on output tokens/s."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.prefill.target.name != self.decode.target.name "
                "|| self.prefill.target.kind != self.decode.target.kind",
                "prefill and decode need targets of their own",
            ),
        )
    )


_NO_ROLE_STANDBY = (
    "!has(self.roles) || !has(self.standby) || ("
    "(!has(self.standby.hot) || !has(self.standby.hot.replicas) "
    "|| self.standby.hot.replicas == 0) && "
    "(!has(self.standby.placeholders) || !has(self.standby.placeholders.enabled) "
    "|| !self.standby.placeholders.enabled) && "
    "(!has(self.standby.imagePrePull) || !has(self.standby.imagePrePull.enabled) "
    "|| !self.standby.imagePrePull.enabled))"
)


PlanningPolicy = Literal["auto", "forecast", "reactive", "leading"]
"""``spec.policy``: how a pool plans (:class:`InferencePoolSpec`)."""


class InferencePoolSpec(WireModel):
    """Desired behaviour of one inference fleet."""

    target: TargetRef | None = None
    """What to scale (a unified pool). Give this or ``roles``."""
    roles: RolesSpec | None = None
    """A disaggregated pool's prefill and decode roles, each with its own target, instead
    of ``target``. Mode ``replicas`` only; warm standby, ``prewarm`` and windows with
    ``minReplicas`` are for unified pools (a window gives ``expectedRequestsPerSecond``,
    which each role sizes on its own bottleneck)."""
    mode: Mode = "replicas"
    """``replicas`` patches the target's scale subresource; ``hpaFloor`` raises and lowers
    an HPA's ``minReplicas`` and never touches the workload's replicas; ``kedaTrigger``
    writes nothing: the plan is the metric of the target ScaledObject's ``external``
    trigger (prescaler's KEDA external scaler), and KEDA's HPA scales the workload to it."""
    inference_pool_ref: InferencePoolRef | None = None
    """Optional Gateway API Inference Extension InferencePool fronting this fleet."""
    min_replicas: int = Field(default=1, ge=0, le=100_000)
    """Fewest replicas the pool keeps. With 0, an idle pool may reach zero: only once its
    demand (``forecast`` requests/s) has been zero, or its series absent, for a whole
    ``scaleDown.stabilizationSeconds`` as this operator saw it (a restarted operator
    starts that clock anew), and nothing else (forecast, windows) asks for a replica.
    Missing data (Prometheus unreachable, garbage values) is never idleness."""
    max_replicas: int = Field(default=10, ge=1, le=100_000)
    """Most replicas the pool asks for."""
    model: ModelSpec
    """The served model, its GPUs and measured throughput."""
    cold_start: ColdStartSpec = Field(default_factory=ColdStartSpec)
    """Cold start of a replica: measured or fixed, plus a margin."""
    forecast: ForecastSpec | None = None
    """Demand metrics and forecasting; without it only schedules and bounds apply."""
    policy: PlanningPolicy = "auto"
    """How the pool plans its replicas: ``forecast`` (ahead of demand, on the forecast and
    the risk model), ``reactive`` (as its shadow HPA would, at the pool's HPA target,
    still honouring windows, standby, prewarm, degradation and ``minReplicas``),
    ``leading`` (as ``reactive``, with the forecast as the HPA's second metric: the
    forecast mean's peak over the lookahead at the HPA's target, so scale-ups come one
    lookahead early and releases as the HPA's), or ``auto``: the one that lies best
    against the HPA's curve on the pool's own history, replayed under each (the forecast
    or the led HPA only with a clear margin below the curve, the cheaper within it),
    re-checked daily with hysteresis. ``status.policy`` says which is in force, why and
    since when. A pool without ``forecast`` plans on its windows and floor alone, whatever
    this says."""
    schedules: list[WindowSpec] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    """Known windows of demand, dated or recurring."""
    standby: StandbySpec = Field(default_factory=StandbySpec)
    """Warm standby objects."""
    prewarm: PrewarmSpec | None = None
    """Warm-up requests each new replica answers before it takes traffic (off when unset;
    the pod template must list the readiness gate ``prescaler.io/prewarmed`` for the
    replica to wait for them)."""
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec)
    """Scale-down pacing."""
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec)
    """Scale-up pacing."""
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    """The service level the plan is sized for (the share of demand served without
    waiting for capacity); the margin that meets it is learned per pool."""
    degradation: DegradationSpec = Field(default_factory=DegradationSpec)
    """Degradation levels and the admission policy published for gateways."""
    dry_run: bool = False
    """Compute and report the plan in status, never patch anything."""
    external_changes: ExternalChangePolicy = "revert"
    """What to do when someone else (a person with ``kubectl scale``, another controller)
    changed the target's replicas (in ``hpaFloor`` mode: the HPA's ``minReplicas``) away
    from what the operator last set. It is always detected (from ``managedFields``: the
    writer is not this operator), reported in ``status.externalChange``, condition
    ``ExternalChange`` and a Warning Event naming the other field manager, and then:
    ``revert`` puts the plan back at once (the operator owns the replicas, as an HPA does);
    ``respect`` keeps the other value until the plan itself asks for something else than it
    did before the change; ``pause`` stops scaling the target until the pool's spec is
    edited or the replicas return to the operator's value. In ``hpaFloor`` mode the HPA
    changing the workload's replicas is its job, not an external change; in
    ``kedaTrigger`` mode KEDA owns the workload's replicas and its HPA, and nothing of
    theirs is an external change."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel("self.minReplicas <= self.maxReplicas", "minReplicas must not exceed maxReplicas"),
            cel("has(self.target) != has(self.roles)", "give exactly one of target and roles"),
            cel(
                "!has(self.target) "
                "|| (self.mode == 'hpaFloor') == (self.target.kind == 'HorizontalPodAutoscaler')",
                "mode hpaFloor goes with a HorizontalPodAutoscaler target, and only with it",
            ),
            cel(
                "!has(self.target) "
                "|| (self.mode == 'kedaTrigger') == (self.target.kind == 'ScaledObject')",
                "mode kedaTrigger goes with a ScaledObject target, and only with it",
            ),
            cel(
                "!has(self.roles) || self.mode == 'replicas'",
                "a disaggregated pool (roles) scales in mode replicas",
            ),
            cel(
                "has(self.roles) != has(self.model.tokensPerSecond)",
                "give model.tokensPerSecond for a unified pool (target), and tokensPerSecond "
                "per role, not in model, for a disaggregated one (roles)",
            ),
            cel(
                _NO_ROLE_STANDBY,
                "warm standby (hot, placeholders, imagePrePull) is for unified pools; "
                "a disaggregated pool (roles) has none",
            ),
            cel(
                "!has(self.roles) || !has(self.prewarm)",
                "prewarm is for unified pools; a disaggregated pool (roles) has none",
            ),
            cel(
                "!has(self.roles) || !has(self.schedules) "
                "|| self.schedules.all(w, !has(w.minReplicas))",
                "a disaggregated pool's windows give expectedRequestsPerSecond (each role "
                "sizes it on its own bottleneck), not minReplicas",
            ),
        )
    )
