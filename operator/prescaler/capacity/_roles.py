"""Disaggregated serving: prefill and decode replicas, each sized on its own bottleneck.

A disaggregated stack (vLLM's disaggregated prefill, SGLang PD, llm-d, NVIDIA Dynamo) runs
a request's prompt on a *prefill* replica, hands its KV cache over, and generates the
output on a *decode* replica. The two saturate on different things:

* **Prefill** processes a prompt's tokens in parallel: it is compute-bound, and one
  replica sustains a measured number of *prompt* tokens/s. It holds a request's KV cache
  only while it computes it, so its memory is not the limit. Demand: prompt tokens/s.
* **Decode** produces one token per request per step: it is bound by memory bandwidth
  (a measured number of *output* tokens/s per replica) and by KV-cache memory, which caps
  how many requests it holds at once. By Little's law the requests decoding at once are
  ``output tokens/s / decode speed per request``, whatever the output length, and each
  holds the KV cache of its whole context (prompt plus output). So one replica's memory
  limit is ``max concurrent requests x decode speed`` output tokens/s. Demand: output
  tokens/s.

Each role's demand is a token rate, so its capacity model counts in tokens: one "request"
of the model is one token of the role's kind (:func:`role_capacity`). A request-based
quantity (a window's expected requests/s, a queue of waiting requests) converts through
the role's :class:`DemandUnit`: the mean tokens of that kind per request.
"""

from __future__ import annotations

from typing import Literal

from prescaler.capacity._model import CapacityModel, DemandUnit, ReplicaSpec, TokenProfile

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


def role_unit(role: Role, tokens: TokenProfile) -> DemandUnit:
    """A role's demand unit on the traffic's token mix."""
    if role == "prefill":
        return DemandUnit("prompt tok/s", tokens.prompt_tokens)
    return DemandUnit("output tok/s", tokens.output_tokens)


def role_capacity(
    role: Role,
    tokens: TokenProfile,
    *,
    tokens_per_second: float,
    replica: ReplicaSpec | None = None,
    headroom: float = 1.0,
) -> CapacityModel:
    """The capacity model of one role, counting the role's tokens.

    ``tokens_per_second`` is what one replica of the role sustains: prompt tokens/s for
    prefill, output tokens/s for decode. ``replica`` (decode only; prefill's memory is not
    its limit) adds the KV-cache limit at the traffic's planning context.
    """
    unit = role_unit(role, tokens)
    if role == "prefill":
        return CapacityModel(
            TokenProfile(1.0, 0.0), tokens_per_second=tokens_per_second, headroom=headroom,
            unit=unit,
        )  # fmt: skip
    per_token = TokenProfile(0.0, 1.0, tokens.planning_context_tokens)
    return CapacityModel(
        per_token, replica, tokens_per_second=tokens_per_second, headroom=headroom, unit=unit
    )
