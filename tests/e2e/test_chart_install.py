"""The Helm chart on the real control plane: every object it renders passes a server-side
dry-run apply; ``helm install --wait`` brings every workload up (on kwok nodes, one of them
labelled a GPU node); an upgrade keeps the generated webhook certificate and changes what
it should, and makes a new certificate when the names it serves change; ``helm
uninstall`` leaves nothing of Tessera but the GpuQuota CRD (Helm never deletes CRDs;
docs/operations.md)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient

from tessera.kube import Kind, NotFound
from tessera.kube.client import KubeClient
from tessera.kube.kinds import NAMESPACES
from tessera.model.clusterspec import synthetic_nodes
from tessera.testenv import TestEnv
from tessera.testenv.chart import CHART, CRDS, helm_on, render
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "tessera-system"
SECRETS = Kind("v1", "Secret", "secrets", True)
DEPLOYMENTS = Kind("apps/v1", "Deployment", "deployments", True)
DAEMONSETS = Kind("apps/v1", "DaemonSet", "daemonsets", True)
MUTATING = Kind("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations", False)  # fmt: skip
VALIDATING = Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
                  "validatingwebhookconfigurations", False)  # fmt: skip
CLUSTERROLES = Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False)
POLICIES = Kind("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy",
                "validatingadmissionpolicies", False)  # fmt: skip


def _helm(env: TestEnv, *args: str) -> str:
    try:
        return helm_on(env.kubeconfig, *args)
    except subprocess.CalledProcessError as exc:
        raise AssertionError(f"helm {' '.join(args)}:\n{exc.stdout}\n{exc.stderr}") from exc


def _dry_run_apply(dyn: DynamicClient, doc: dict[str, Any]) -> None:
    """Server-side apply with dryRun=All: admission, schema and CEL rules, nothing stored."""
    resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    resource.server_side_apply(
        body=doc,
        namespace=doc["metadata"].get("namespace"),
        field_manager="chart-test",
        dry_run="All",
        force_conflicts=True,
    )


def test_install_upgrade_and_uninstall(start_testenv: Any) -> None:
    env: TestEnv = start_testenv()
    api = KubeClient.from_kubeconfig(str(env.kubeconfig))
    nodes = synthetic_nodes(3, 0, "A100", prefix="chart")
    env.create_gpu_nodes(nodes)
    gpu_node = nodes[0].name
    api.merge_patch(Kind("v1", "Node", "nodes", False), gpu_node,
                    {"metadata": {"labels": {"tessera.io/gpu-node": "true"}}})  # fmt: skip
    api.create(NAMESPACES, {"metadata": {"name": NS}})

    # Every object the chart renders, as the API server would take it (CRD first).
    rendered = [d for d in yaml.safe_load_all(render(extra=["--include-crds"])) if d]
    rendered.sort(key=lambda d: d["kind"] != "CustomResourceDefinition")
    dyn = DynamicClient(env.api_client())
    for doc in rendered:
        if doc["kind"] == "CustomResourceDefinition":
            dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).server_side_apply(
                body=doc, field_manager="chart-test", force_conflicts=True
            )  # the GpuQuota objects' dry-runs need the type served; helm keeps it anyway
            continue
        try:
            _dry_run_apply(dyn, doc)
        except Exception as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc}") from exc

    _helm(env, "install", "tessera", str(CHART), "-n", NS, "--wait", "--timeout", "3m")
    status = json.loads(_helm(env, "status", "tessera", "-n", NS, "-o", "json"))
    assert status["info"]["status"] == "deployed"
    for kind, name in ((DEPLOYMENTS, "tessera-scheduler"), (DEPLOYMENTS, "tessera-kube-scheduler")):
        d = api.get(kind, name, NS)
        assert d["status"].get("readyReplicas") == 2, d["status"]
    ds = api.get(DAEMONSETS, "tessera-node-agent", NS)
    assert ds["status"]["numberReady"] == 1, ds["status"]  # the one labelled GPU node
    secret = api.get(SECRETS, "tessera-webhook-tls", NS)
    hook = api.get(MUTATING, "tessera-scheduler")
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]

    _helm(env, "upgrade", "tessera", str(CHART), "-n", NS, "--reuse-values", "--wait",
          "--set", "scheduler.policy=spread/binpack")  # fmt: skip
    again = api.get(SECRETS, "tessera-webhook-tls", NS)
    assert again["data"] == secret["data"], "the upgrade must keep the webhook certificate"
    args = api.get(DEPLOYMENTS, "tessera-scheduler", NS)["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip
    assert "--policy=spread/binpack" in args

    # Dropping the claims webhook changes the names the certificate serves: a new one is
    # made, and the scheduler's pods (which read it at start) roll with it.
    pod_meta = api.get(DEPLOYMENTS, "tessera-scheduler", NS)["spec"]["template"]["metadata"]
    _helm(env, "upgrade", "tessera", str(CHART), "-n", NS, "--reuse-values", "--wait",
          "--set", "claims.quota=false")  # fmt: skip
    third = api.get(SECRETS, "tessera-webhook-tls", NS)
    assert third["data"]["tls.crt"] != secret["data"]["tls.crt"]
    assert third["metadata"]["annotations"]["tessera.io/serving-names"] == "tessera-webhook"
    rolled = api.get(DEPLOYMENTS, "tessera-scheduler", NS)["spec"]["template"]["metadata"]
    assert rolled["annotations"] != pod_meta["annotations"]
    validating = api.get(VALIDATING, "tessera-scheduler")
    assert [w["name"] for w in validating["webhooks"]] == ["validate.pods.tessera.io"]
    assert validating["webhooks"][0]["clientConfig"]["caBundle"] == third["data"]["ca.crt"]

    _helm(env, "uninstall", "tessera", "-n", NS, "--wait")

    def gone() -> bool:
        for kind, name, ns in ((CLUSTERROLES, "tessera-scheduler", None),
                               (POLICIES, "tessera-assignment-immutable", None),
                               (MUTATING, "tessera-scheduler", None),
                               (DEPLOYMENTS, "tessera-scheduler", NS)):  # fmt: skip
            try:
                api.get(kind, name, ns)
                return False
            except NotFound:
                pass
        return True

    wait_for("the release's objects to be gone", gone, 60, 0.5)
    assert api.get(CRDS, "gpuquotas.tessera.io")  # Helm keeps CRDs: quotas survive
