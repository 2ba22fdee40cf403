"""Run the real helm binary (built by ``make cluster-bin``) on ``charts/prescaler``.

helm keeps its cache, config and data under a directory the caller gives, never in the
user's home, so tests leave nothing behind.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster.paths import PROJECT_ROOT, bin_dir, require_binaries

CHART = PROJECT_ROOT / "charts" / "prescaler"
KUBE_VERSION = "1.37.0"
"""Kubernetes version for ``helm template`` and kubernetes-validate: the local cluster's
minor, given explicitly so the rendering is checked against the schemas it is validated
with. (helm alone assumes the minor of the client-go it is built with.)"""


class HelmError(RuntimeError):
    """helm exited non-zero; the message carries its stderr."""

    def __init__(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"helm {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
        )
        self.stderr = proc.stderr


@dataclass(frozen=True)
class Helm:
    """helm with its own state directory and, optionally, a kubeconfig."""

    home: Path
    kubeconfig: Path | None = None

    def run(self, *args: str, timeout_s: float = 300.0) -> str:
        require_binaries(["helm"])
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        argv = list(args)
        proc = subprocess.run(
            [str(bin_dir() / "helm"), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise HelmError(argv, proc)
        return proc.stdout

    def values_file(self, values: dict[str, Any], name: str = "values.yaml") -> Path:
        path = self.home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    def template(
        self,
        values: dict[str, Any] | None = None,
        *,
        release: str = "prescaler",
        namespace: str = "prescaler-system",
        include_crds: bool = False,
        show_only: str | None = None,
    ) -> list[dict[str, Any]]:
        """The rendered objects (empty documents dropped)."""
        args = ["template", release, str(CHART), "--namespace", namespace]
        args += ["--kube-version", KUBE_VERSION]
        if values is not None:
            args += ["--values", str(self.values_file(values))]
        if include_crds:
            args.append("--include-crds")
        if show_only is not None:
            args += ["--show-only", show_only]
        return [doc for doc in yaml.safe_load_all(self.run(*args)) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    containers: list[dict[str, Any]] = pod["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """The container's env by name: the literal value, or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
