"""The Helm chart with the real helm (built from its Go module): lint, deploy/ in step,
values refused with the field named, each mode rendered as it should be, and every
flag the chart passes known to the command it runs."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding

from tessera.testenv.chart import CHART, deploy_drift, helm, render

Docs = list[dict[str, Any]]


def docs(values: dict[str, str] | None = None) -> Docs:
    return [d for d in yaml.safe_load_all(render(values)) if d]


def kinds(rendered: Docs) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in rendered)


def one(rendered: Docs, kind: str, name: str) -> dict[str, Any]:
    [d] = [d for d in rendered if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    return d


def test_lint_is_clean() -> None:
    done = subprocess.run([str(helm()), "lint", "--strict", str(CHART)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_deploy_is_the_charts_output() -> None:
    assert deploy_drift() == [], "deploy/ differs from the chart: run `make deploy`"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scheduler.policy": "fastest"}, "/scheduler/policy"),
        ({"scheduler.compat": "{hami,volcano}"}, "/scheduler/compat/1"),
        ({"nodeAgent.backstop": "maybe"}, "/nodeAgent/backstop"),
        ({"nodeAgent.slotsPerCard": "0"}, "/nodeAgent/slotsPerCard"),
        ({"nodeAgent.stateDir": "var/lib/tessera"}, "/nodeAgent/stateDir"),
        ({"webhook.certificate": "self"}, "/webhook/certificate"),
        ({"claims.quota": "sometimes"}, "/claims/quota"),
        (
            {"kubeScheduler.percentageOfNodesToScore": "101"},
            "/kubeScheduler/percentageOfNodesToScore': maximum: got 101, want 100",
        ),
        ({"scheduler.polcy": "binpack"}, "polcy"),  # a typo is not silently ignored
    ],
)
def test_bad_values_are_refused_naming_the_field(values: dict[str, str], message: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as info:
        render(values)
    assert message in info.value.stderr, info.value.stderr


def test_defaults_render_every_part_with_a_working_generated_certificate() -> None:
    d = docs()
    got = kinds(d)
    for want in [("DaemonSet", "tessera-node-agent"), ("Deployment", "tessera-scheduler"),
                 ("Deployment", "tessera-kube-scheduler"), ("Service", "tessera-webhook"),
                 ("ValidatingAdmissionPolicy", "tessera-assignment-immutable"),
                 ("ClusterRole", "tessera-gpu-viewer"), ("Secret", "tessera-webhook-tls"),
                 ("ConfigMap", "tessera-cluster-dashboard")]:  # fmt: skip
        assert want in got, want
    assert not [k for k in got if k[0] in ("ServiceMonitor", "Certificate")]
    secret = one(d, "Secret", "tessera-webhook-tls")["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "tessera-webhook.tessera-system.svc" in sans.get_values_for_type(x509.DNSName)
    ca.public_key().verify(  # type: ignore[union-attr, call-arg]
        cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
        cert.signature_hash_algorithm,
    )  # fmt: skip
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(d, kind, "tessera-scheduler")["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == secret["ca.crt"]
    policy = one(d, "ValidatingAdmissionPolicy", "tessera-scheduler-pod-updates")
    assert "system:serviceaccount:tessera-system:tessera-scheduler" in json.dumps(policy)


def test_claims_are_counted_by_a_webhook_that_reaches_only_the_leader() -> None:
    d = docs()
    pods, claims = one(d, "ValidatingWebhookConfiguration", "tessera-scheduler")["webhooks"]
    assert pods["name"] == "validate.pods.tessera.io" and claims["name"] == "claims.tessera.io"
    assert claims["clientConfig"]["service"] == {"name": "tessera-claims-webhook",
        "namespace": "tessera-system", "path": "/validate-claims", "port": 8443}  # fmt: skip
    assert claims["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
        "operations": ["UPDATE"], "resources": ["resourceclaims/status"],
        "scope": "Namespaced"}]  # fmt: skip
    assert "gpu.tessera.io" in claims["matchConditions"][0]["expression"]
    # The pod webhook's Service reaches every replica, the claims webhook's only the Ready
    # one (the leader), since only the leader holds the count.
    assert one(d, "Service", "tessera-webhook")["spec"]["publishNotReadyAddresses"] is True
    assert "publishNotReadyAddresses" not in one(d, "Service", "tessera-claims-webhook")["spec"]
    secret = one(d, "Secret", "tessera-webhook-tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "tessera-claims-webhook.tessera-system.svc" in sans.get_values_for_type(x509.DNSName)
    names = "tessera-webhook,tessera-claims-webhook"
    assert secret["metadata"]["annotations"]["tessera.io/serving-names"] == names
    pod = one(d, "Deployment", "tessera-scheduler")["spec"]["template"]["metadata"]
    assert pod["annotations"]["tessera.io/serving-names"] == names
    cm = one(docs({"webhook.certificate": "cert-manager"}), "Certificate", "tessera-webhook")
    assert "tessera-claims-webhook.tessera-system.svc" in cm["spec"]["dnsNames"]
    for off in ({"claims.quota": "false"}, {"claims.enabled": "false"}):
        d = docs(off)
        assert len(one(d, "ValidatingWebhookConfiguration", "tessera-scheduler")["webhooks"]) == 1
        assert ("Service", "tessera-claims-webhook") not in kinds(d)
        secret = one(d, "Secret", "tessera-webhook-tls")
        assert secret["metadata"]["annotations"]["tessera.io/serving-names"] == "tessera-webhook"


def test_preemption_is_on_with_its_eviction_right_and_can_be_turned_off() -> None:
    def evicts(d: Docs) -> bool:
        rules = one(d, "ClusterRole", "tessera-scheduler")["rules"]
        evict = any("pods/eviction" in r["resources"] for r in rules)
        budgets = [r["verbs"] for r in rules if "poddisruptionbudgets" in r["resources"]]
        assert budgets == ([["list", "watch"]] if evict else [])  # read with the right
        return evict

    def args(d: Docs) -> list[str]:
        spec = one(d, "Deployment", "tessera-scheduler")["spec"]["template"]["spec"]
        return list(spec["containers"][0]["args"])

    on, off = docs(), docs({"scheduler.preemption": "false"})
    assert evicts(on) and "--no-preemption" not in args(on)
    assert not evicts(off) and "--no-preemption" in args(off)


def test_each_mode_renders_what_it_names() -> None:
    cm = docs({"webhook.certificate": "cert-manager"})
    assert ("Certificate", "tessera-webhook") in kinds(cm)
    assert ("Issuer", "tessera-webhook-selfsigned") in kinds(cm)
    assert not [k for k in kinds(cm) if k[0] == "Secret"]
    hook = one(cm, "MutatingWebhookConfiguration", "tessera-scheduler")
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "tessera-system/tessera-webhook"
    )
    direct = docs({"webhook.url": "https://10.0.0.7:8443", "kubeScheduler.extenderURL":
                   "http://10.0.0.7:8888", "scheduler.hostNetwork": "true"})  # fmt: skip
    hook = one(direct, "ValidatingWebhookConfiguration", "tessera-scheduler")["webhooks"][0]
    assert hook["clientConfig"]["url"] == "https://10.0.0.7:8443/validate"
    assert "service" not in hook["clientConfig"]
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(one(direct, "Secret", "tessera-webhook-tls")["data"]["tls.crt"])
    )
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    cfg = one(direct, "ConfigMap", "tessera-kube-scheduler")["data"]["config.yaml"]
    assert yaml.safe_load(cfg)["extenders"][0]["urlPrefix"] == "http://10.0.0.7:8888"
    spec = one(direct, "Deployment", "tessera-scheduler")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    mon = docs({"metrics.serviceMonitor.enabled": "true", "nodeAgent.enabled": "false"})
    assert ("ServiceMonitor", "tessera-scheduler") in kinds(mon)
    assert ("PodMonitor", "tessera-node-agent") in kinds(mon)
    assert not [k for k in kinds(mon) if "node-agent" in k[1] and k[0] != "PodMonitor"]
    assert not [k for k in kinds(docs()) if k[0] == "PrometheusRule"]  # off by default
    rule = one(docs({"metrics.prometheusRule.enabled": "true"}), "PrometheusRule", "tessera")
    assert rule["spec"] == yaml.safe_load((CHART / "rules" / "tessera.rules.yaml").read_text())
    compat = docs({"scheduler.compat": "{hami,gpu-manager}", "scheduler.policy": "spread/binpack"})
    cfg = yaml.safe_load(one(compat, "ConfigMap", "tessera-kube-scheduler")["data"]["config.yaml"])
    assert cfg["percentageOfNodesToScore"] == 100  # the default: the extender sees every node
    sampled = docs({"kubeScheduler.percentageOfNodesToScore": "0"})
    sampled_cfg = one(sampled, "ConfigMap", "tessera-kube-scheduler")["data"]["config.yaml"]
    assert yaml.safe_load(sampled_cfg)["percentageOfNodesToScore"] == 0  # adaptive
    managed = [m["name"] for m in cfg["extenders"][0]["managedResources"]]
    assert managed[:4] == ["tessera.io/gpu", "tessera.io/gpu-memory",
                           "tessera.io/gpu-memory-percent", "tessera.io/gpu-cores"]  # fmt: skip
    assert "nvidia.com/gpu" in managed and "tencent.com/vcuda-core" in managed
    args = one(compat, "Deployment", "tessera-scheduler")["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip
    assert "--compat=hami,gpu-manager" in args and "--policy=spread/binpack" in args
    for cm_doc in [x for x in docs() if x["metadata"]["name"].endswith("-dashboard")]:
        [(name, text)] = cm_doc["data"].items()
        assert json.loads(text)["uid"] == name.removesuffix(".json")
    # The agent's probes are on its metrics port, and go with it.
    for port, paths in (("9500", ["/readyz", "/healthz"]), ("0", [None, None])):
        ds = one(docs({"nodeAgent.metricsPort": port}), "DaemonSet", "tessera-node-agent")
        [agent] = ds["spec"]["template"]["spec"]["containers"]
        probes = [agent.get(p, {}).get("httpGet") for p in ("readinessProbe", "livenessProbe")]
        assert [p and (p["path"], str(p["port"])) for p in probes] == [
            p and (p, port) for p in paths]  # fmt: skip


def _flags(command: str) -> set[str]:
    tessera = Path(sys.executable).parent / "tessera"
    done = subprocess.run([str(tessera), command, "--help"], capture_output=True, text=True,
                          check=True, env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", done.stdout))


@pytest.mark.parametrize(("workload", "command"), [
    (("DaemonSet", "tessera-node-agent"), "node-agent"),
    (("Deployment", "tessera-scheduler"), "scheduler"),
])  # fmt: skip
def test_every_flag_the_chart_passes_exists(workload: tuple[str, str], command: str) -> None:
    d = one(docs(), *workload)
    args = d["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == command
    known = _flags(command)
    passed = {a.split("=", 1)[0] for a in args[1:]}
    assert passed <= known, passed - known
