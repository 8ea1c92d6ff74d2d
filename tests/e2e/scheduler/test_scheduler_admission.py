"""Bad input on the real control plane: the webhook refuses malformed pods with a
message naming the field and the rule; the extender answers garbage with 4xx."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.kube import PODS, ApiError
from tests.e2e.scheduler.harness import Harness
from tests.e2e.wait import wait_for

pytestmark = pytest.mark.e2e


def _pod(name: str, limits: dict[str, Any], annotations: dict[str, str] | None = None,
         **spec: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": limits}}], **spec},
    }  # fmt: skip


G = "tessera.io/gpu"
MEM = "tessera.io/gpu-memory"
PCT = "tessera.io/gpu-memory-percent"
CORES = "tessera.io/gpu-cores"

REFUSED = [
    ("cores-over-100", {CORES: "150"}, {}, CORES),
    ("cores-zero", {G: "1", CORES: "0"}, {}, CORES),
    ("negative-count", {G: "-1"}, {}, G),
    ("fractional-count", {G: "500m"}, {}, G),
    ("zero-count-with-memory", {G: "0", MEM: "1000"}, {}, G),
    ("memory-fraction-of-a-mib", {MEM: "1500m"}, {}, MEM),
    ("memory-and-percent", {MEM: "1000", PCT: "10"}, {}, "memory"),
    ("percent-over-100", {PCT: "101"}, {}, PCT),
    ("unknown-policy", {G: "1"}, {"tessera.io/compute-policy": "turbo"}, "compute-policy"),
    ("unknown-placement", {G: "1"}, {"tessera.io/placement": "magic"}, "placement"),
    ("malformed-uuid", {G: "1"}, {"tessera.io/gpu-uuid": "not-a-uuid"}, "gpu-uuid"),
    ("model-both-ways", {G: "1"}, {"tessera.io/gpu-model": "A100",
                                   "tessera.io/gpu-model-exclude": "A100"}, "gpu-model"),
    ("hand-written-assignment", {G: "1"}, {"tessera.io/assignment": '{"v":1}'}, "assignment"),
    ("tessera-and-hami-names", {G: "1", "nvidia.com/gpu": "1"}, {}, "nvidia.com/gpu"),
    ("hami-cores-over-100", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "120"}, {},
     "nvidia.com/gpucores"),
    ("gpu-manager-bad-core", {"tencent.com/vcuda-core": "150"}, {}, "tencent.com/vcuda-core"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "limits", "annotations", "field"), REFUSED,
                         ids=[r[0] for r in REFUSED])  # fmt: skip
def test_webhook_refuses_malformed_pods(
    harness: Harness, name: str, limits: dict[str, str], annotations: dict[str, str], field: str
) -> None:
    with pytest.raises(ApiError) as info:
        harness.admin.create(PODS, _pod(name, limits, annotations), "default")
    message = info.value.message
    assert "denied the request" in message, message
    assert field in message, message


def test_a_gpu_pod_that_names_its_node_is_refused(harness: Harness) -> None:
    with pytest.raises(ApiError) as info:
        harness.admin.create(PODS, _pod("pinned", {G: "1"}, nodeName="gpu-000"), "default")
    message = info.value.message
    assert "denied the request" in message and "spec.nodeName" in message, message


def test_pods_without_gpus_are_untouched_and_gpu_pods_routed(harness: Harness) -> None:
    plain = harness.admin.create(PODS, _pod("plain", {"cpu": "100m"}), "default")
    assert plain["spec"]["schedulerName"] == "default-scheduler"
    gpu = harness.admin.create(PODS, _pod("routed", {MEM: "1024"}), "default")
    assert gpu["spec"]["schedulerName"] == "tessera-scheduler"
    assert gpu["spec"]["containers"][0]["resources"]["limits"][G] == "1"

    def bound() -> bool:
        return bool(harness.admin.get(PODS, "routed", "default")["spec"].get("nodeName"))

    wait_for("the GPU pod to be bound", bound, 60)
    for n in ("plain", "routed"):
        harness.admin.delete(PODS, n, "default")


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
@pytest.mark.parametrize("body", [b"{", b"[]", b"\x00\xff", b'{"Pod": 1}', b'{"PodName": 3}'])
def test_extender_answers_garbage_with_4xx(harness: Harness, verb: str, body: bytes) -> None:
    assert harness.extender is not None
    status, _ = harness.extender.request(
        "POST", f"/{verb}", body, {"Content-Type": "application/json"}
    )
    assert 400 <= status < 500
    assert harness.extender.get("/healthz")[0] == 200  # still serving


def test_assignment_cannot_be_forged_or_edited_after_bind(harness: Harness) -> None:
    pod = harness.admin.create(PODS, _pod("sealed", {G: "1"}), "default")
    assert pod["spec"]["schedulerName"] == "tessera-scheduler"

    def bound() -> bool:
        return bool(harness.admin.get(PODS, "sealed", "default")["spec"].get("nodeName"))

    wait_for("the pod to be bound", bound, 60)
    live = harness.admin.get(PODS, "sealed", "default")
    assert "tessera.io/assignment" in live["metadata"]["annotations"]  # set by the Binding
    for value in ('{"v":1,"node":"elsewhere","containers":[]}', None):
        with pytest.raises(ApiError) as info:
            harness.admin.merge_patch(
                PODS, "sealed", {"metadata": {"annotations": {"tessera.io/assignment": value}}},
                "default",
            )  # fmt: skip
        assert "tessera.io/assignment" in info.value.message
    # Other edits still go through.
    harness.admin.merge_patch(PODS, "sealed", {"metadata": {"labels": {"team": "a"}}}, "default")
    harness.admin.delete(PODS, "sealed", "default")
