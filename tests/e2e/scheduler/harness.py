"""The e2e harness of the scheduler: a real control plane, 100 kwok GPU nodes, and the
``tessera scheduler`` process running as its least-privilege service account, wired in
with the very files in deploy/ (kube-scheduler config, webhook config, RBAC)."""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import yaml

from tessera.kube import PODS, ApiError, Conflict, Kind, NotFound, Obj, Reflector, WatchEvent
from tessera.kube.client import KubeClient
from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.testenv import TestEnv
from tessera.testenv.chart import deployed, install_gpuquota_crd, kube_scheduler_config
from tests.e2e.wait import wait_for

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
MODELS = ("A100", "T4", "V100M32", "H100", "A10")
NAMESPACE = "tessera-system"

__all__ = ["DEPLOY", "Extender", "Harness", "PodView", "gpu_nodes"]


def gpu_nodes(count: int = 100, cards: int = 8) -> list[NodeInventory]:
    """``count`` nodes of ``cards`` cards, models cycling through MODELS."""
    out = []
    for i in range(count):
        name = f"gpu-{i:03d}"
        out.append(
            NodeInventory(
                name=name,
                cards=make_cards(name, cards, MODELS[i % len(MODELS)]),
                cpu_milli=96_000,
                memory_mib=384 * 1024,
            )
        )
    return out


def scheduler_config(extender_port: int) -> dict[str, Any]:
    """deploy/kube-scheduler-config.yaml with the test's extender URL."""
    cfg = kube_scheduler_config()
    cfg.pop("leaderElection", None)  # the env owns it
    cfg["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    return dict(cfg)


class PodView:
    """Every pod of one namespace, kept current by a Reflector (the real watch)."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self.pods: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.reflector = Reflector(api, PODS, self, namespace=namespace, watch_timeout_s=60)
        self.reflector.start()
        assert self.reflector.synced.wait(30)

    def replace(self, items: list[Obj]) -> None:
        with self.lock:
            self.pods = {o["metadata"]["name"]: o for o in items}

    def apply(self, event: WatchEvent) -> None:
        with self.lock:
            name = event.object["metadata"]["name"]
            if event.type == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = event.object

    def get(self, name: str) -> Obj | None:
        with self.lock:
            return self.pods.get(name)

    def all(self) -> list[Obj]:
        with self.lock:
            return list(self.pods.values())

    def stop(self) -> None:
        self.reflector.stop()


def unschedulable(pod: Obj) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return c.get("reason") == "Unschedulable"
    return False


class Extender:
    """``tessera scheduler`` as a child process, killed and restarted at will."""

    def __init__(self, workdir: Path, kubeconfig: Path, port: int, webhook_port: int,
                 cert: Path, key: Path, extra: list[str] | None = None) -> None:  # fmt: skip
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.port = port
        self.webhook_port = webhook_port
        self.cert, self.key = cert, key
        self.extra = list(extra or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "tessera.cli", "scheduler",
            f"--kubeconfig={self.kubeconfig}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--webhook-port={self.webhook_port}",
            f"--tls-cert={self.cert}",
            f"--tls-key={self.key}",
            f"--lease-namespace={NAMESPACE}",
            "--compat=hami,gpu-manager",
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until it is ready (synced and leading)."""
        self.start_standby()
        wait_for("the extender to be ready", lambda: self.get("/readyz")[0] == 200, timeout, 0.2)

    def start_standby(self) -> None:
        """Start without waiting for readiness (a standby is never ready)."""
        self.starts += 1
        self.log = (self.workdir / f"extender-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            self.argv(), stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL: no lease release, no clean shutdown, whatever was in flight is lost."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None
        self._close_log()

    def _close_log(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
        self._close_log()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def metric(self, name: str) -> float:
        status, body = self.get("/metrics")
        assert status == 200
        for line in body.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


class Harness:
    def __init__(self, env: TestEnv, workdir: Path, nodes: list[NodeInventory]) -> None:
        self.env = env
        self.workdir = workdir
        self.nodes = nodes
        self.admin = KubeClient.from_kubeconfig(str(env.kubeconfig))
        self.extender: Extender | None = None

    # --- setup from deploy/ ---------------------------------------------------------------

    def apply(self, doc: Obj) -> None:
        kind = doc["kind"]
        api_version = doc["apiVersion"]
        plural = {
            "Namespace": "namespaces", "ServiceAccount": "serviceaccounts",
            "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
            "Role": "roles", "RoleBinding": "rolebindings",
            "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
            "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
            "CustomResourceDefinition": "customresourcedefinitions",
        }[kind]  # fmt: skip
        namespaced = kind in ("ServiceAccount", "Role", "RoleBinding")
        k = Kind(api_version, kind, plural, namespaced)
        self.admin.create(k, doc, doc["metadata"].get("namespace") if namespaced else None)

    def install_rbac(self) -> Path:
        """deploy/rbac.yaml as is; returns a kubeconfig holding the service account's token."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for doc in deployed("rbac.yaml"):
            self.apply(doc)
        return self.token_kubeconfig("tessera-scheduler")

    def token_kubeconfig(
        self,
        account: str,
        namespace: str = NAMESPACE,
        *,
        bound_pod: Obj | None = None,
        context_namespace: str | None = None,
    ) -> Path:
        """A kubeconfig holding a token of service account ``account`` (bound to
        ``bound_pod`` when given: the API server then names the pod's node in it)."""
        spec: dict[str, Any] = {"expirationSeconds": 86400}
        if bound_pod is not None:
            meta = bound_pod["metadata"]
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod",
                                      "name": meta["name"], "uid": meta["uid"]}  # fmt: skip
        token_kind = Kind("v1", "TokenRequest", f"serviceaccounts/{account}/token", True)
        out = self.admin.create(
            token_kind,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
            namespace,
        )
        context: dict[str, str] = {"cluster": "e2e", "user": "sa"}
        if context_namespace is not None:
            context["namespace"] = context_namespace
        path = self.workdir / f"{account}-{namespace}.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1", "kind": "Config",
                    "clusters": [{"name": "e2e", "cluster": {
                        "server": self.env.server,
                        "certificate-authority": str(self.env.ca.cert_path)}}],
                    "users": [{"name": "sa", "user": {"token": out["status"]["token"]}}],
                    "contexts": [{"name": "e2e", "context": context}],
                    "current-context": "e2e",
                }
            )
        )  # fmt: skip
        return path

    def install_crds(self) -> None:
        """deploy/gpuquota-crd.yaml as is; returns once the API server serves it."""
        install_gpuquota_crd(self.admin)

    def install_webhooks(self, port: int) -> None:
        """deploy/webhook.yaml with clientConfig pointed at the test's port and CA."""
        bundle = base64.b64encode(self.env.ca.pem).decode()
        for doc in deployed("webhook.yaml"):
            doc = copy.deepcopy(doc)
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{port}{path}",
                    "caBundle": bundle,
                }
            self.apply(doc)

    def install_admission_policy(self) -> None:
        """deploy/admission-policy.yaml as is; returns once the API server enforces it."""
        for doc in deployed("admission-policy.yaml"):
            self.apply(doc)
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "policy-probe"},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
        self.admin.create(PODS, probe, "default")
        forged = {"metadata": {"annotations": {"tessera.io/assignment": "{}"}}}

        def enforced() -> bool:
            try:
                self.admin.merge_patch(PODS, "policy-probe", forged, "default")
            except ApiError as exc:
                return exc.status == 422 or "tessera.io/assignment" in exc.message
            # Not enforced yet: undo (removal is allowed until it is -- and if the policy
            # took effect in between, the undo is refused: enforced, then).
            undo = {"metadata": {"annotations": {"tessera.io/assignment": None}}}
            try:
                self.admin.merge_patch(PODS, "policy-probe", undo, "default")
            except ApiError:
                return True
            return False

        wait_for("the admission policy to be enforced", enforced, 60, 0.5)
        self.admin.delete(PODS, "policy-probe", "default")

    def ensure_default_service_account(self, namespace: str) -> None:
        sa = Kind("v1", "ServiceAccount", "serviceaccounts", True)
        try:
            self.admin.get(sa, "default", namespace)
        except NotFound:
            with contextlib.suppress(Conflict):
                self.admin.create(sa, {"metadata": {"name": "default"}}, namespace)

    def close(self) -> None:
        if self.extender is not None:
            self.extender.stop()
