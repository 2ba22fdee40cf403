"""Engine metric profiles: the PromQL each serving engine's metric names need.

A profile is a set of query templates; ``$sel`` becomes the pool's label matchers (or
nothing), ``$window`` the rate window, ``$resolution`` a subquery step (an eighth of the
rate window) and ``$quantile`` the context-length quantile. Any query can be replaced by
the user's own PromQL (``spec.forecast.queries``).

``$window`` is the operator's rate window (``2m``) for the instant reads of "demand now".
The demand *history* picks its own window (one history step, see
:meth:`prescaler.sources.PrometheusSource.history`), so the demand query (requests/s, or a
disaggregated role's token rate) is also kept with ``$window`` open
(:attr:`Queries.demand_template`). A custom demand query may use ``$window`` too; one
without it is used verbatim everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from string import Template
from typing import Literal, get_args

QueryName = Literal[
    "requests_per_second",
    "prompt_tokens_per_second",
    "output_tokens_per_second",
    "running",
    "waiting",
    "waiting_growth_per_second",
    "context_tokens",
    "kv_cache_usage",
    "ttft_p95_seconds",
    "ttft_p99_seconds",
]
QUERY_NAMES: tuple[QueryName, ...] = get_args(QueryName)
ROLE_DEMAND: dict[str, QueryName] = {
    "prefill": "prompt_tokens_per_second",
    "decode": "output_tokens_per_second",
}
"""The demand a disaggregated pool's role is forecast and planned on: prompt tokens/s for
prefill (compute-bound), output tokens/s for decode (memory-bound)."""


@dataclass(frozen=True, slots=True)
class Queries:
    """One PromQL expression per quantity the operator reads."""

    requests_per_second: str
    """Requests/s; the forecast is fit on its history."""
    prompt_tokens_per_second: str
    output_tokens_per_second: str
    running: str
    waiting: str
    waiting_growth_per_second: str
    """How fast the queue grows (requests/s, negative while it drains): the derivative
    of the fleet's summed queue over the rate window. The counters of served requests
    stop at capacity when the fleet is full; arrivals are what is served plus this."""
    context_tokens: str
    """Context length (prompt + output) at the planning quantile."""
    kv_cache_usage: str = ""
    """The fleet's mean KV-cache utilization, 0-1 (empty: the engine exports none)."""
    ttft_p95_seconds: str = ""
    """Time to first token, p95 over the rate window, seconds."""
    ttft_p99_seconds: str = ""
    """Time to first token, p99 over the rate window, seconds."""
    running_by_pod: str = ""
    """Requests running now per pod: one series per pod, labelled ``pod``. Read only
    before a scale-down, to set pod deletion costs (not part of a snapshot)."""
    rate_window_seconds: float = 120.0
    """The rate window ``$window`` was rendered with, in seconds."""
    demand: QueryName = "requests_per_second"
    """The query that is the pool's demand: forecast on its history and planned on. A
    unified pool's is requests/s; a disaggregated pool's prefill role plans on prompt
    tokens/s and its decode role on output tokens/s."""
    demand_template: str | None = None
    """The demand query with ``$window`` left open, for a history read at its own window;
    ``None`` when the query has no ``$window`` (it is then used as is)."""

    def items(self) -> list[tuple[QueryName, str]]:
        """The queries by name (what a snapshot reads); an empty query is not read."""
        return [(name, getattr(self, name)) for name in QUERY_NAMES if getattr(self, name)]

    @property
    def demand_query(self) -> str:
        """The demand query at the operator's rate window."""
        query: str = getattr(self, self.demand)
        return query

    def demand_at(self, window_seconds: float) -> str:
        """The demand query with a rate window of ``window_seconds`` (verbatim when it has
        no ``$window``)."""
        if self.demand_template is None:
            return self.demand_query
        return Template(self.demand_template).substitute(window=format_duration(window_seconds))


_DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_UNIT_SECONDS["y"] = 365 * 86_400


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration such as ``2m``, ``90s`` or ``1h30m``."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Prometheus duration: {text!r}")
    seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"duration must be > 0: {text!r}")
    return float(seconds)


def format_duration(seconds: float) -> str:
    """A Prometheus duration for ``seconds`` (whole seconds, else milliseconds)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be > 0, got {seconds!r}")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _context(prompt_bucket: str, output_sum: str, count: str) -> str:
    # p-quantile of prompt length plus the mean output length.
    return (
        f"histogram_quantile($quantile, sum by (le) (rate({prompt_bucket}$sel[15m])))"
        f" + (sum(rate({output_sum}$sel[15m])) / sum(rate({count}$sel[15m])))"
    )


def _ttft(bucket: str, quantile: str) -> str:
    return f"histogram_quantile({quantile}, sum by (le) (rate({bucket}$sel[$window])))"


def _growth(waiting: str) -> str:
    # Summed over pods first, then derived (a subquery): the fleet's queue, so pods that
    # come and go (a new pod's series starts at 0) are no growth or drain of their own.
    return f"deriv(sum({waiting}$sel)[$window:$resolution])"


PROFILES: dict[str, Queries] = {
    "vllm": Queries(
        requests_per_second="sum(rate(vllm:request_success_total$sel[$window]))",
        prompt_tokens_per_second="sum(rate(vllm:prompt_tokens_total$sel[$window]))",
        output_tokens_per_second="sum(rate(vllm:generation_tokens_total$sel[$window]))",
        running="sum(vllm:num_requests_running$sel)",
        running_by_pod="sum by (pod) (vllm:num_requests_running$sel)",
        waiting="sum(vllm:num_requests_waiting$sel)",
        waiting_growth_per_second=_growth("vllm:num_requests_waiting"),
        context_tokens=_context(
            "vllm:request_prompt_tokens_bucket",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
        ),
        # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (both 0-1); either one.
        kv_cache_usage="avg(vllm:kv_cache_usage_perc$sel) or avg(vllm:gpu_cache_usage_perc$sel)",
        ttft_p95_seconds=_ttft("vllm:time_to_first_token_seconds_bucket", "0.95"),
        ttft_p99_seconds=_ttft("vllm:time_to_first_token_seconds_bucket", "0.99"),
    ),
    "sglang": Queries(
        requests_per_second="sum(rate(sglang:num_requests_total$sel[$window]))",
        prompt_tokens_per_second="sum(rate(sglang:prompt_tokens_total$sel[$window]))",
        output_tokens_per_second="sum(rate(sglang:generation_tokens_total$sel[$window]))",
        running="sum(sglang:num_running_reqs$sel)",
        running_by_pod="sum by (pod) (sglang:num_running_reqs$sel)",
        waiting="sum(sglang:num_queue_reqs$sel)",
        waiting_growth_per_second=_growth("sglang:num_queue_reqs"),
        context_tokens=_context(
            "sglang:prompt_tokens_histogram_bucket",
            "sglang:generation_tokens_total",
            "sglang:num_requests_total",
        ),
        kv_cache_usage="avg(sglang:token_usage$sel)",
        ttft_p95_seconds=_ttft("sglang:time_to_first_token_seconds_bucket", "0.95"),
        ttft_p99_seconds=_ttft("sglang:time_to_first_token_seconds_bucket", "0.99"),
    ),
    "tgi": Queries(
        requests_per_second="sum(rate(tgi_request_count$sel[$window]))",
        prompt_tokens_per_second="sum(rate(tgi_request_input_length_sum$sel[$window]))",
        output_tokens_per_second="sum(rate(tgi_request_generated_tokens_sum$sel[$window]))",
        running="sum(tgi_batch_current_size$sel)",
        running_by_pod="sum by (pod) (tgi_batch_current_size$sel)",
        waiting="sum(tgi_queue_size$sel)",
        waiting_growth_per_second=_growth("tgi_queue_size"),
        context_tokens=_context(
            "tgi_request_input_length_bucket",
            "tgi_request_generated_tokens_sum",
            "tgi_request_count",
        ),
        # TGI exports no KV-cache utilization; its queue time is the nearest to TTFT.
        ttft_p95_seconds=_ttft("tgi_request_queue_duration_bucket", "0.95"),
        ttft_p99_seconds=_ttft("tgi_request_queue_duration_bucket", "0.99"),
    ),
}


def render_queries(
    engine: str,
    *,
    selector: str = "",
    quantile: float = 0.95,
    window: str = "2m",
    overrides: dict[str, str] | None = None,
    demand: QueryName = "requests_per_second",
) -> Queries:
    """The engine's queries for one pool; ``overrides`` (by field name) replace them as given.
    ``demand`` names the query the pool forecasts and plans on (see :attr:`Queries.demand`).

    Overrides are used verbatim except that ``$sel`` (the pool's label matchers, with a
    disaggregated role's), ``$quantile``, ``$window`` and ``$resolution`` are substituted,
    so a custom context-length query can follow the pool's quantile and a custom rate
    query the rate window (the history's own, for requests/s).
    """
    try:
        profile = PROFILES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(PROFILES)}") from None
    window_seconds = parse_duration(window)
    sel = "{" + selector.strip().strip("{}") + "}" if selector.strip().strip("{}") else ""
    resolution = format_duration(max(1.0, window_seconds / 8))
    values = {"sel": sel, "window": window, "quantile": f"{quantile:g}", "resolution": resolution}
    rendered: dict[str, str] = {
        name: Template(text).substitute(values) for name, text in profile.items()
    }
    rendered["running_by_pod"] = Template(profile.running_by_pod).substitute(values)
    if demand not in QUERY_NAMES:
        raise ValueError(f"unknown demand query {demand!r}")
    rps_template: str | None = Template(getattr(profile, demand)).safe_substitute(
        sel=sel, quantile=values["quantile"]
    )
    for name, text in (overrides or {}).items():
        if name not in QUERY_NAMES and name != "running_by_pod":
            raise ValueError(f"unknown query {name!r}")
        rendered[name] = Template(text).safe_substitute(
            sel=sel, quantile=values["quantile"], window=window, resolution=resolution
        )
        if name == demand:
            open_window = "window" in Template(text).get_identifiers()
            rps_template = (
                Template(text).safe_substitute(sel=sel, quantile=values["quantile"])
                if open_window
                else None
            )
    return replace(
        profile,
        **rendered,
        rate_window_seconds=window_seconds,
        demand=demand,
        demand_template=rps_template,
    )
