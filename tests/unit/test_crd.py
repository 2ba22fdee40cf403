"""The CRD is generated from the pydantic models: no drift, structural, described."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from prescaler.api import crd as crd_module

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / crd_module.CRD_FILE
CHART_CRDS = ROOT / "charts" / "prescaler" / "crds"


def _schema() -> dict[str, Any]:
    version = crd_module.crd()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED.is_file(), "crds/ has no CRD: run `make crds`"
    assert COMMITTED.read_text() == crd_module.render(), "crds/ drifted: run `make crds`"


def test_chart_crds_are_the_generated_ones() -> None:
    """The chart ships exactly crds/, byte for byte (make crds writes both)."""
    chart_copy = CHART_CRDS / crd_module.CRD_FILE
    assert chart_copy.is_file(), "charts/prescaler/crds/ has no CRD: run `make crds`"
    assert chart_copy.read_bytes() == COMMITTED.read_bytes(), (
        "charts/prescaler/crds/ drifted from crds/: run `make crds`"
    )
    assert chart_copy.read_text() == crd_module.render(), "the chart's CRD drifted: `make crds`"
    names = sorted(p.name for p in COMMITTED.parent.iterdir())
    assert sorted(p.name for p in CHART_CRDS.iterdir()) == names


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    assert crd_module.main(["--check", str(COMMITTED.parent)]) == 0
    (tmp_path / crd_module.CRD_FILE).write_text(crd_module.render().replace("ppool", "pp"))
    assert crd_module.main(["--check", str(tmp_path)]) == 1


def test_schema_is_structural() -> None:
    text = crd_module.render()
    assert "$ref" not in text
    assert "$defs" not in text
    for path, node in _walk(_schema()):
        assert "type" in node, f"{path or '<root>'} has no type"
        for key in ("anyOf", "oneOf", "allOf", "not"):
            assert key not in node, f"{path} uses {key}"
        assert "title" not in node
        if node.get("exclusiveMinimum") is not None:
            assert node["exclusiveMinimum"] is True


def test_every_spec_and_status_field_is_described() -> None:
    for path, node in _walk(_schema()):
        if path.startswith((".spec", ".status")) and not path.endswith("[]"):
            if path.endswith("{}"):
                continue
            assert node.get("description"), f"{path} has no description"


def test_identity_and_printer_columns() -> None:
    crd = yaml.safe_load(COMMITTED.read_text())
    assert crd["metadata"]["name"] == "inferencepools.prescaler.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "InferencePool",
        "inferencepools",
        ["ppool"],
    )
    assert "infpool" not in COMMITTED.read_text()
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Desired",
        "Ready",
        "Peak req/s",
        "Next window",
        "Bottleneck",
        "Policy",
        "Roles",
        "Saved vs HPA",
        "Age",
    ]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) > 0]
    assert wide == ["Saved vs HPA"]  # kubectl get -o wide


def test_validation_rules_reach_the_schema() -> None:
    spec = _schema()["properties"]["spec"]
    rules = [v["rule"] for v in spec["x-kubernetes-validations"]]
    assert "self.minReplicas <= self.maxReplicas" in rules
    window = spec["properties"]["schedules"]["items"]
    window_rules = " ".join(v["rule"] for v in window["x-kubernetes-validations"])
    assert "has(self.start) != has(self.cron)" in window_rules
    assert spec["properties"]["schedules"]["x-kubernetes-list-map-keys"] == ["name"]
    assert spec["properties"]["mode"]["enum"] == ["replicas", "hpaFloor", "kedaTrigger"]
    assert "llama-3.1-8b" in spec["properties"]["model"]["properties"]["preset"]["enum"]
    cold = spec["properties"]["coldStart"]["properties"]
    assert cold["mode"]["default"] == "auto"
    assert cold["seconds"]["minimum"] == 0
    conditions = _schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
