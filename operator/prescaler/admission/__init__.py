"""``prescaler admit``: the degradation policy enforced at the gateway.

A gateway asks, before it forwards a request, whether the request's pool admits it now
(NGINX ``auth_request``, Caddy ``forward_auth``, Envoy ``ext_authz``, Istio ``CUSTOM``).
The answer is a plain value (:mod:`prescaler.admission._decide`, pure), from the pools'
degradation ConfigMaps (contract ``prescaler.io/degradation/v1``), which the server
(:mod:`prescaler.admission._server`) list-and-watches and keeps in memory: a check never
waits on the API server.
"""

from prescaler.admission._decide import (
    BYTES_PER_TOKEN,
    CONFIG_MAP_KEYS,
    CONTEXT_HEADER,
    CONTRACT,
    LANE_HEADER,
    LENGTH_HEADER,
    OUTCOMES,
    POOL_HEADER,
    PROMPT_HEADER,
    ROUTE_HEADER,
    Answer,
    Check,
    Outcome,
    Policy,
    PolicyError,
    Routes,
    decide,
    read_check,
    read_policy,
)

__all__ = [
    "BYTES_PER_TOKEN",
    "CONFIG_MAP_KEYS",
    "CONTEXT_HEADER",
    "CONTRACT",
    "LANE_HEADER",
    "LENGTH_HEADER",
    "OUTCOMES",
    "POOL_HEADER",
    "PROMPT_HEADER",
    "ROUTE_HEADER",
    "Answer",
    "Check",
    "Outcome",
    "Policy",
    "PolicyError",
    "Routes",
    "decide",
    "read_check",
    "read_policy",
]
