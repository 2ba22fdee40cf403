"""Engine metric profiles: the PromQL each serving engine's metric names need.

A profile is a set of query templates; ``$sel`` becomes the pool's label matchers (or
nothing), ``$window`` the rate window and ``$quantile`` the context-length quantile. Any
query can be replaced by the user's own PromQL (``spec.forecast.queries``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from string import Template
from typing import Literal

QueryName = Literal[
    "requests_per_second",
    "prompt_tokens_per_second",
    "output_tokens_per_second",
    "running",
    "waiting",
    "context_tokens",
]


@dataclass(frozen=True, slots=True)
class Queries:
    """One PromQL expression per quantity the operator reads."""

    requests_per_second: str
    """Requests/s; the forecast is fit on its history."""
    prompt_tokens_per_second: str
    output_tokens_per_second: str
    running: str
    waiting: str
    context_tokens: str
    """Context length (prompt + output) at the planning quantile."""

    def items(self) -> list[tuple[QueryName, str]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]  # type: ignore[misc]


def _context(prompt_bucket: str, output_sum: str, count: str) -> str:
    # p-quantile of prompt length plus the mean output length.
    return (
        f"histogram_quantile($quantile, sum by (le) (rate({prompt_bucket}$sel[15m])))"
        f" + (sum(rate({output_sum}$sel[15m])) / sum(rate({count}$sel[15m])))"
    )


PROFILES: dict[str, Queries] = {
    "vllm": Queries(
        requests_per_second="sum(rate(vllm:request_success_total$sel[$window]))",
        prompt_tokens_per_second="sum(rate(vllm:prompt_tokens_total$sel[$window]))",
        output_tokens_per_second="sum(rate(vllm:generation_tokens_total$sel[$window]))",
        running="sum(vllm:num_requests_running$sel)",
        waiting="sum(vllm:num_requests_waiting$sel)",
        context_tokens=_context(
            "vllm:request_prompt_tokens_bucket",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
        ),
    ),
    "sglang": Queries(
        requests_per_second="sum(rate(sglang:num_requests_total$sel[$window]))",
        prompt_tokens_per_second="sum(rate(sglang:prompt_tokens_total$sel[$window]))",
        output_tokens_per_second="sum(rate(sglang:generation_tokens_total$sel[$window]))",
        running="sum(sglang:num_running_reqs$sel)",
        waiting="sum(sglang:num_queue_reqs$sel)",
        context_tokens=_context(
            "sglang:prompt_tokens_histogram_bucket",
            "sglang:generation_tokens_total",
            "sglang:num_requests_total",
        ),
    ),
    "tgi": Queries(
        requests_per_second="sum(rate(tgi_request_count$sel[$window]))",
        prompt_tokens_per_second="sum(rate(tgi_request_input_length_sum$sel[$window]))",
        output_tokens_per_second="sum(rate(tgi_request_generated_tokens_sum$sel[$window]))",
        running="sum(tgi_batch_current_size$sel)",
        waiting="sum(tgi_queue_size$sel)",
        context_tokens=_context(
            "tgi_request_input_length_bucket",
            "tgi_request_generated_tokens_sum",
            "tgi_request_count",
        ),
    ),
}


def render_queries(
    engine: str,
    *,
    selector: str = "",
    quantile: float = 0.95,
    window: str = "2m",
    overrides: dict[str, str] | None = None,
) -> Queries:
    """The engine's queries for one pool; ``overrides`` (by field name) replace them as given.

    Overrides are used verbatim except that ``$quantile`` is substituted, so a custom
    context-length query can follow the pool's quantile.
    """
    try:
        profile = PROFILES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(PROFILES)}") from None
    sel = "{" + selector.strip().strip("{}") + "}" if selector.strip().strip("{}") else ""
    values = {"sel": sel, "window": window, "quantile": f"{quantile:g}"}
    rendered = {name: Template(text).substitute(values) for name, text in profile.items()}
    for name, text in (overrides or {}).items():
        if name not in rendered:
            raise ValueError(f"unknown query {name!r}")
        rendered[name] = Template(text).safe_substitute(quantile=values["quantile"])
    return replace(profile, **rendered)
