"""A renewed webhook certificate is served without a restart, on the real API server.

What cert-manager does with a self-signed issuer: a new certificate under a new CA lands
in the mounted files, and the webhook configurations' caBundle moves to the new CA. The
API server then refuses the old certificate, so GPU pods could not be created at all
until the extender presented the new one. The extender must pick it up by itself.
"""

from __future__ import annotations

import base64
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from tessera.kube import PODS, ApiError, Kind, NotFound
from tessera.scheduler.tls import RECHECK_S, generate_serving_cert
from tests.e2e.scheduler.harness import Harness
from tests.e2e.wait import wait_for

pytestmark = pytest.mark.e2e

HOOKS = [
    Kind("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration",
         "mutatingwebhookconfigurations", False),
    Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
         "validatingwebhookconfigurations", False),
]  # fmt: skip
LOADS = "tessera_scheduler_webhook_cert_loads_total"
EXPIRY = "tessera_scheduler_webhook_cert_expiry_timestamp_seconds"


def _put(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _trust(h: Harness, ca_pem: bytes) -> None:
    """Move every Tessera webhook's caBundle, as cert-manager's CA injector does."""
    bundle = base64.b64encode(ca_pem).decode()
    for kind in HOOKS:
        doc = h.admin.get(kind, "tessera-scheduler")
        for hook in doc["webhooks"]:
            hook["clientConfig"]["caBundle"] = bundle
        h.admin.replace(kind, doc)


def _gpu_pod_admitted(h: Harness, name: str) -> bool:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"tessera.io/gpu-memory": "1024"}}}]},
    }  # fmt: skip
    try:
        created = h.admin.create(PODS, pod, "default")
    except ApiError as exc:
        assert "x509" in exc.message or "certificate" in exc.message, exc.message
        return False
    # The mutating webhook ran: it routed the pod to Tessera's scheduler.
    assert created["spec"]["schedulerName"] == "tessera-scheduler", created["spec"]
    with contextlib.suppress(NotFound):
        h.admin.delete(PODS, name, "default")
    return True


def _renew(h: Harness, cert: bytes, key: bytes, ca: bytes, loads: float) -> None:
    ext = h.extender
    assert ext is not None
    _put(ext.cert, cert)
    _put(ext.key, key)
    _trust(h, ca)
    wait_for("the extender to load the renewed certificate",
             lambda: ext.metric(LOADS) == loads + 1, RECHECK_S + 20, 0.5)  # fmt: skip
    wait_for("a GPU pod admitted through the webhook",
             lambda: _gpu_pod_admitted(h, f"cert-probe-{int(loads)}"), 30, 0.5)  # fmt: skip


def test_a_renewed_certificate_under_a_new_ca_is_served(harness: Harness, tmp_path: Path) -> None:
    ext = harness.extender
    assert ext is not None
    original = (ext.cert.read_bytes(), ext.key.read_bytes(), harness.env.ca.pem)
    loads, expiry = ext.metric(LOADS), ext.metric(EXPIRY)
    assert loads >= 1 and expiry > 0
    renewed = generate_serving_cert(tmp_path / "renewed", ["127.0.0.1", "localhost"], days=10)
    try:
        _renew(harness, renewed.cert_file.read_bytes(), renewed.key_file.read_bytes(),
               renewed.ca_pem(), loads)  # fmt: skip
        # The 10-day certificate is what the metric reports now.
        assert ext.metric(EXPIRY) < expiry
    finally:
        # Back to the harness's own pair for the tests after this one.
        _renew(harness, *original, ext.metric(LOADS))
