"""The README's KEDA example is the file a cluster test applies, and it works: a valid
pool in mode kedaTrigger, a ScaledObject whose trigger names it in metadata the scaler
accepts, at the address of the chart's scaler Service, with a fallback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from prescaler.api import check_spec, parse_spec
from prescaler.scaler import KEDA_KEYS, parse_query

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "keda-scaledobject.yaml"
README = ROOT / "README.md"


def _section() -> str:
    return README.read_text().split("\n## With KEDA\n", 1)[1].split("\n## ", 1)[0]


def _objects() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text())}


def test_the_readme_shows_the_example_file_verbatim() -> None:
    section = _section()
    assert "docs/examples/keda-scaledobject.yaml" in section
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    assert blocks[0] == EXAMPLE.read_text()


def test_the_pool_is_valid_and_scales_through_the_scaled_object() -> None:
    objects = _objects()
    assert set(objects) == {"InferencePool", "ScaledObject"}
    pool, scaled = objects["InferencePool"], objects["ScaledObject"]
    spec = parse_spec(pool["spec"])
    check_spec(spec)
    assert spec.mode == "kedaTrigger"
    assert spec.target is not None
    assert (spec.target.kind, spec.target.name) == ("ScaledObject", scaled["metadata"]["name"])
    assert "namespace" not in pool["metadata"]
    assert "namespace" not in scaled["metadata"]  # applied to the reader's namespace


def test_the_trigger_names_the_pool_at_the_chart_s_scaler_service() -> None:
    objects = _objects()
    scaled = objects["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"]
    assert scaled["spec"]["fallback"]["replicas"] >= 1
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] in ("external", "external-push")
    assert trigger.get("metricType", "AverageValue") == "AverageValue"  # fallback needs it
    query = parse_query(scaled["metadata"]["name"], "serving", trigger["metadata"])
    assert query.pool == objects["InferencePool"]["metadata"]["name"]
    assert query.namespace == "serving"
    values = yaml.safe_load((ROOT / "charts" / "prescaler" / "values.yaml").read_text())
    port = values["keda"]["service"]["port"]
    # helm install prescaler charts/prescaler --namespace prescaler-system (README).
    assert trigger["metadata"]["scalerAddress"] == f"prescaler-scaler.prescaler-system.svc:{port}"


def test_the_trigger_authentication_gives_what_keda_s_external_scaler_reads() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", _section(), flags=re.DOTALL)
    auth = yaml.safe_load(blocks[1])
    assert auth["kind"] == "TriggerAuthentication"
    parameters = {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]}
    assert parameters == {"caCert", "tlsClientCert", "tlsClientKey"}
    assert parameters <= KEDA_KEYS
