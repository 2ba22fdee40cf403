"""The Envoy and Istio configurations of docs/degradation.md (not run in these tests; NGINX
and Caddy run in tests/integration/test_admission_cluster.py): they parse and call the
check where the chart serves it, failing open."""

from __future__ import annotations

import re
from typing import Any

import yaml

from cluster.paths import PROJECT_ROOT

DOC = (PROJECT_ROOT / "docs" / "degradation.md").read_text()
VALUES = yaml.safe_load((PROJECT_ROOT / "charts" / "prescaler" / "values.yaml").read_text())


def section(title: str) -> str:
    return DOC.split(f"### {title}", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]


def yaml_docs(title: str) -> list[Any]:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", section(title), re.M | re.S)
    assert len(blocks) == 1, title
    return [d for d in yaml.safe_load_all(blocks[0]) if d is not None]


def test_the_chart_serves_the_check_on_the_documented_port() -> None:
    assert VALUES["admission"]["port"] == VALUES["admission"]["service"]["port"] == 8081


def test_envoy_ext_authz_calls_the_check_and_fails_open() -> None:
    (items,) = yaml_docs("Envoy (`ext_authz`, HTTP)")
    authz, cluster = items
    assert authz["name"] == "envoy.filters.http.ext_authz"
    config = authz["typed_config"]
    assert config["@type"].endswith("ext_authz.v3.ExtAuthz")
    assert config["failure_mode_allow"] is True
    service = config["http_service"]
    assert service["path_prefix"] == "/check"
    assert service["server_uri"]["uri"] == "http://prescaler-admission.prescaler.svc:8081"
    assert service["server_uri"]["cluster"] == cluster["name"]
    sent = {p["exact"] for p in service["authorization_request"]["allowed_headers"]["patterns"]}
    assert {"x-priority-lane", "x-context-tokens", "x-prompt-tokens"} <= sent
    (pool,) = service["authorization_request"]["headers_to_add"]
    assert pool == {"key": "x-prescaler-pool", "value": "llm/llama-chat"}
    response = service["authorization_response"]
    to_client = {p["exact"] for p in response["allowed_client_headers"]["patterns"]}
    assert "retry-after" in to_client
    assert [p["exact"] for p in response["allowed_upstream_headers"]["patterns"]] == [
        "x-prescaler-route"
    ]
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    assert address == {"address": "prescaler-admission.prescaler.svc", "port_value": 8081}


def test_istio_custom_authorization_calls_the_check_and_fails_open() -> None:
    mesh, policy = yaml_docs("Istio (`CUSTOM` authorization)")
    (provider,) = mesh["meshConfig"]["extensionProviders"]
    http = provider["envoyExtAuthzHttp"]
    assert http["service"] == "prescaler-admission.prescaler.svc.cluster.local"
    assert http["port"] == 8081
    assert http["pathPrefix"] == "/check"
    assert http["failOpen"] is True
    assert "retry-after" in http["headersToDownstreamOnDeny"]
    assert http["includeAdditionalHeadersInCheck"] == {"x-prescaler-pool": "llm/llama-chat"}
    assert (policy["apiVersion"], policy["kind"]) == (
        "security.istio.io/v1",
        "AuthorizationPolicy",
    )
    assert policy["spec"]["action"] == "CUSTOM"
    assert policy["spec"]["provider"]["name"] == provider["name"]


def test_the_lua_sketch_is_gone() -> None:
    assert "envoy.filters.http.lua" not in DOC
    assert "not run here" in section("Envoy (`ext_authz`, HTTP)")
    assert "not run here" in section("Istio (`CUSTOM` authorization)")
