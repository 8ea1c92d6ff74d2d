"""Binds slower than kube-scheduler's httpTimeout, through the real kube-scheduler.

A validating webhook on pods/binding holds the Binding of the "slow-" pods for longer
than the extender's ``httpTimeout`` (5 s in deploy/), the way a saturated API server or
a slow admission chain would. kube-scheduler gives up on the bind and schedules the pod
again while its write is still in flight. The extender must keep that pod's cards
booked and refuse it until the write ends; pods created meanwhile must get other cards,
and the write that lands must be the only Binding of the pod.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tessera.kube import PODS, Kind, Obj
from tessera.kube.kinds import NAMESPACES
from tessera.testenv.process import free_port
from tests.e2e.scheduler.checks import book_all, events_by_pod
from tests.e2e.scheduler.harness import Harness, PodView
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOLD_S = 12.0  # > httpTimeout (5 s) + kube-scheduler's first backoff (1 s), with margin
WEBHOOKS = Kind(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    False,
)


class SlowBinding:
    """An HTTPS admission webhook that counts the Bindings it is asked about, per pod,
    and holds those of pods named "slow-*" for HOLD_S before allowing them."""

    def __init__(self, cert: str, key: str) -> None:
        self.seen: Counter[str] = Counter()
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                name = str(request.get("name") or "")
                seen[name] += 1
                if name.startswith("slow-"):
                    time.sleep(HOLD_S)
                body = json.dumps({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": request["uid"], "allowed": True},
                }).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(cert, key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def slow_binding_config(
    name: str, hook: SlowBinding, ca_pem: bytes, namespace: str, failure_policy: str
) -> Obj:
    """The ValidatingWebhookConfiguration that sends the Bindings of ``namespace``'s pods
    to ``hook`` (bench/chaos.py uses it too)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.e2e.tessera.io",
            "clientConfig": {"url": f"https://127.0.0.1:{hook.port}/",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods/binding"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 20,
        }],
    }  # fmt: skip


@pytest.fixture
def slow_binding(harness: Harness) -> Iterator[SlowBinding]:
    h = harness
    ns = "slowbind"
    h.admin.create(NAMESPACES, {"metadata": {"name": ns}})
    h.ensure_default_service_account(ns)
    pair = h.env.issue_serving_cert("slow-binding")
    hook = SlowBinding(str(pair.cert), str(pair.key))
    config = slow_binding_config("e2e-slow-binding", hook, h.env.ca.pem, ns, "Fail")
    h.apply(config)
    try:
        _wait_until_consulted(h, hook, ns)
        yield hook
    finally:
        h.admin.delete(WEBHOOKS, "e2e-slow-binding")
        hook.close()


def _wait_until_consulted(h: Harness, hook: SlowBinding, ns: str) -> None:
    """The API server picks a new webhook configuration up after a moment: bind probe
    pods (no GPU, no scheduler serves them) until the webhook sees one."""
    probes: list[str] = []

    def consulted() -> bool:
        name = f"probe-{len(probes)}"
        probes.append(name)
        pod = {
            "metadata": {"name": name},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
        }
        uid = h.admin.create(PODS, pod, ns)["metadata"]["uid"]
        h.admin.bind(ns, name, uid, "gpu-099")
        return hook.seen[name] > 0

    wait_for("the API server to consult the slow-binding webhook", consulted, 30, 0.5)
    for name in probes:
        h.admin.delete(PODS, name, ns)


def _gpu_pod(name: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "x",
                                 "resources": {"limits": {"tessera.io/gpu": "1"}}}]},
    }  # fmt: skip


def _in_flight_refusals(h: Harness, ns: str, name: str) -> int:
    events = events_by_pod(h.admin, ns).get(name, [])
    return sum(1 for e in events if "still in flight" in e.get("message", ""))


def test_bind_slower_than_http_timeout_is_not_placed_twice(
    harness: Harness, slow_binding: SlowBinding
) -> None:
    h = harness
    ns = "slowbind"
    view = PodView(h.admin, ns)
    try:
        slow = [f"slow-{i}" for i in range(2)]
        for name in slow:
            h.admin.create(PODS, _gpu_pod(name), ns)
        # kube-scheduler gives up after 5 s, backs off 1 s, and sends the pod to filter
        # again while the webhook still holds the first Binding.
        wait_for("kube-scheduler to retry a pod whose bind is in flight",
                 lambda: _in_flight_refusals(h, ns, slow[0]) > 0, HOLD_S + 5, 0.2)  # fmt: skip
        fast = [f"fast-{i:02d}" for i in range(16)]  # would take the slow pods' cards if freed
        for name in fast:
            h.admin.create(PODS, _gpu_pod(name), ns)

        ours = set(slow + fast)

        def gpu_pods() -> list[Obj]:
            return [p for p in view.all() if p["metadata"]["name"] in ours]

        wait_for("every pod to be bound", lambda: len(gpu_pods()) == len(ours) and all(
            p["spec"].get("nodeName") for p in gpu_pods()), 120, 0.5)  # fmt: skip
        pods = gpu_pods()
        _state, problems = book_all(h.admin, pods)
        assert problems == []  # no card booked twice, every bound pod has its assignment
        for name in slow:
            assert slow_binding.seen[name] == 1, name  # one Binding: no second bind raced it
        assert _in_flight_refusals(h, ns, slow[0]) > 0
    finally:
        for pod in view.all():
            h.admin.delete(PODS, pod["metadata"]["name"], ns)
        ext = h.extender
        assert ext is not None
        wait_for("the cards to come back",
                 lambda: ext.metric("tessera_scheduler_cards_allocated") == 0, 60, 0.5)  # fmt: skip
        view.stop()
