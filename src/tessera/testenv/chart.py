"""The Helm chart (charts/tessera) rendered with the testenv's helm, and deploy/ from it.

deploy/ is the chart's output with its defaults (the webhook certificate left to the
user: ``webhook.certificate=secret``), one file per template, for people who apply
plain manifests and for the e2e tests, which load those files. ``python -m
tessera.testenv.chart`` writes it; tests/integration/test_chart.py fails when it
differs from the chart.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tessera.kube.kinds import Kind
from tessera.kube.port import KubeApi
from tessera.testenv.build import ensure_binaries

__all__ = [
    "CHART",
    "DEPLOY",
    "DEPLOY_VALUES",
    "KUBE_VERSION",
    "deployed",
    "helm",
    "helm_on",
    "kube_scheduler_config",
    "render",
    "write_deploy",
]

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "tessera"
DEPLOY = REPO / "deploy"
KUBE_VERSION = "v1.36.3"  # the testenv's Kubernetes (testenv/kubernetes/go.mod)
RELEASE, NAMESPACE = "tessera", "tessera-system"
DEPLOY_VALUES = {"webhook.certificate": "secret"}
HEADER = "# Rendered from charts/tessera by `make deploy`; edit the chart, not this file.\n"


def helm() -> Path:
    """The helm binary, built from its Go module on first use (testenv cache)."""
    return ensure_binaries(["helm"])["helm"]


def render(
    values: Mapping[str, str] | None = None,
    *,
    show_only: str | None = None,
    namespace: str = NAMESPACE,
    extra: Sequence[str] = (),
) -> str:
    """``helm template`` of the chart; raises CalledProcessError with helm's message."""
    argv = [str(helm()), "template", RELEASE, str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION, *extra]  # fmt: skip
    for k, v in (values or {}).items():
        argv += ["--set", f"{k}={v}"]
    if show_only:
        argv += ["--show-only", show_only]
    return _run(argv)


def helm_on(kubeconfig: Path, *args: str, timeout: float = 330.0) -> str:
    """``helm ARGS`` against the cluster of ``kubeconfig`` (install, upgrade, status...):
    its output; CalledProcessError with helm's message."""
    return _run([str(helm()), *args, "--kubeconfig", str(kubeconfig)], timeout)


def _run(argv: list[str], timeout: float = 120.0) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def _deploy_files() -> dict[str, str]:
    """deploy/ file name -> its text, as the chart renders it now."""
    out = {}
    for template in sorted((CHART / "templates").glob("*.yaml")):
        text = render(DEPLOY_VALUES, show_only=f"templates/{template.name}")
        out[template.name] = HEADER + text.lstrip("-\n")
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        out[crd.name] = HEADER + crd.read_text()
    return out


def write_deploy() -> list[str]:
    """Rewrite deploy/ from the chart; the names written."""
    files = _deploy_files()
    if DEPLOY.exists():
        shutil.rmtree(DEPLOY)
    DEPLOY.mkdir()
    for name, text in files.items():
        (DEPLOY / name).write_text(text)
    return sorted(files)


def deploy_drift() -> list[str]:
    """The deploy/ files that differ from the chart's rendering (missing, extra, changed)."""
    want = _deploy_files()
    have = {p.name: p.read_text() for p in DEPLOY.glob("*.yaml")} if DEPLOY.exists() else {}
    return sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))


def deployed(name: str) -> list[dict[str, Any]]:
    """The objects of deploy/``name`` (e.g. ``rbac.yaml``)."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


CRDS = Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions",
            namespaced=False)  # fmt: skip


def install_gpuquota_crd(api: KubeApi, timeout_s: float = 60.0) -> None:
    """deploy/gpuquota-crd.yaml as is; returns once the API server serves the type."""
    [crd] = deployed("gpuquota-crd.yaml")
    api.create(CRDS, crd)
    deadline = time.monotonic() + timeout_s
    while True:
        status = api.get(CRDS, crd["metadata"]["name"]).get("status") or {}
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in status.get("conditions") or []):  # fmt: skip
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the GpuQuota CRD was not served within {timeout_s:.0f} s")
        time.sleep(0.2)


def kube_scheduler_config() -> dict[str, Any]:
    """The KubeSchedulerConfiguration inside deploy/kube-scheduler-config.yaml's ConfigMap."""
    [cm] = deployed("kube-scheduler-config.yaml")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def main(argv: list[str] | None = None) -> int:
    """``python -m tessera.testenv.chart``: rewrite deploy/ from the chart."""
    del argv
    for name in write_deploy():
        print(f"deploy/{name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
