"""The admission webhook: route GPU pods to Tessera, normalise them, refuse bad ones."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tessera.model.names import ResourceNames
from tessera.model.podspec import Compat
from tessera.scheduler.webhook import Webhook
from tessera.scheduler.wire import WireError
from tests.unit._scheduler_world import pod_obj

HOOK = Webhook("tessera-scheduler")


def review(pod: dict[str, Any], operation: str = "CREATE") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "r1", "operation": operation, "object": pod},
        }
    ).encode()


def answer(body: bytes) -> dict[str, Any]:
    """The response, after what the API server checks of its envelope: the review's own
    apiVersion and uid, and a patch declared as a JSONPatch."""
    out = json.loads(body)
    assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert out["response"]["uid"] == "r1"
    assert ("patch" in out["response"]) == (out["response"].get("patchType") == "JSONPatch")
    return dict(out["response"])


def patched(pod: dict[str, Any], hook: Webhook = HOOK) -> dict[str, Any]:
    response = answer(hook.mutate(review(pod)).body)
    assert response["allowed"]
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    out = json.loads(json.dumps(pod))
    for op in ops:
        assert op["op"] == "add"
        parts = op["path"].strip("/").split("/")
        cur = out
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        cur[parts[-1]] = op["value"]
    return out


def test_gpu_pod_gets_scheduler_name_and_explicit_card_count() -> None:
    pod = pod_obj("p", gpu=None, memory=2048)
    pod["spec"]["schedulerName"] = "default-scheduler"
    out = patched(pod)
    assert out["spec"]["schedulerName"] == "tessera-scheduler"
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "2048"}


def test_a_memory_share_and_cores_are_written_in_canonical_form() -> None:
    pod = pod_obj("p", gpu=None, cores=30)
    pod["spec"]["containers"][0]["resources"]["limits"]["tessera.io/gpu-memory-percent"] = "25"
    limits = patched(pod)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "25",
                      "tessera.io/gpu-cores": "30"}  # fmt: skip


def test_a_pod_already_in_canonical_form_for_tessera_gets_no_patch() -> None:
    pod = pod_obj("p", gpu=1, memory=2048, cores=30)  # schedulerName: tessera-scheduler
    response = answer(HOOK.mutate(review(pod)).body)
    assert response["allowed"] and "patch" not in response


def test_a_gpu_container_after_one_without_is_rewritten_too() -> None:
    pod = pod_obj("p", gpu=None, memory=2048)
    pod["spec"]["containers"].insert(0, {"name": "log", "image": "busybox"})
    out = patched(pod)
    assert "resources" not in out["spec"]["containers"][0]
    limits = out["spec"]["containers"][1]["resources"]["limits"]
    assert limits == {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "2048"}


def test_pod_without_gpu_passes_untouched() -> None:
    pod = pod_obj("plain", gpu=None)
    pod["spec"]["schedulerName"] = "default-scheduler"
    response = answer(HOOK.mutate(review(pod)).body)
    assert response == {"uid": "r1", "allowed": True}
    assert answer(HOOK.validate(review(pod)).body)["allowed"]


def test_hami_pod_is_translated_in_compat_mode() -> None:
    hook = Webhook("tessera-scheduler", compat=Compat(hami=True))
    pod = pod_obj("h", gpu=None)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
    }
    pod["metadata"]["annotations"] = {"nvidia.com/use-gputype": "A100"}
    out = patched(pod, hook)
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert limits["tessera.io/gpu"] == "1" and limits["tessera.io/gpu-memory"] == "3000"
    assert "nvidia.com/gpu" not in limits
    assert out["metadata"]["annotations"] == {"nvidia.com/use-gputype": "A100"}
    assert answer(hook.validate(review(out)).body)["allowed"]
    # Without compat the same pod is not a GPU pod for Tessera.
    assert "patch" not in answer(HOOK.mutate(review(pod)).body)


@pytest.mark.parametrize(
    ("limits", "annotations", "field"),
    [
        ({"tessera.io/gpu-cores": "150"}, {}, "tessera.io/gpu-cores"),
        ({"tessera.io/gpu": "-1"}, {}, "tessera.io/gpu"),
        ({"tessera.io/gpu": "1.5"}, {}, "tessera.io/gpu"),
        ({"tessera.io/gpu-memory": "lots"}, {}, "tessera.io/gpu-memory"),
        ({"tessera.io/gpu-memory": "100", "tessera.io/gpu-memory-percent": "10"}, {}, "memory"),
        ({"tessera.io/gpu-memory-percent": "0"}, {}, "tessera.io/gpu-memory-percent"),
        ({"tessera.io/gpu": "1"}, {"tessera.io/compute-policy": "turbo"}, "compute-policy"),
        ({"tessera.io/gpu": "1"}, {"tessera.io/placement": "magic"}, "placement"),
        ({"tessera.io/gpu": "1"}, {"tessera.io/gpu-uuid": "not-a-uuid"}, "gpu-uuid"),
        (
            {"tessera.io/gpu": "1"},
            {"tessera.io/gpu-model": "A100", "tessera.io/gpu-model-exclude": "A100"},
            "gpu-model",
        ),
    ],
)
def test_impossible_specs_are_refused_naming_the_field(
    limits: dict[str, str], annotations: dict[str, str], field: str
) -> None:
    pod = pod_obj("bad", gpu=None, annotations=annotations)
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    for verdict in (HOOK.mutate(review(pod)), HOOK.validate(review(pod))):
        response = answer(verdict.body)
        assert not response["allowed"]
        assert field in response["status"]["message"]
        assert response["status"]["code"] == 422


def test_validate_refuses_a_hand_written_assignment_and_wrong_scheduler() -> None:
    pod = pod_obj("p", annotations={"tessera.io/assignment": "{}"})
    assert answer(HOOK.validate(review(pod)).body)["status"] == {
        "code": 422,
        "reason": "Invalid",
        "message": "metadata.annotations[tessera.io/assignment]: is written by the Tessera "
        "scheduler when it binds the pod; a new pod must not carry it",
    }
    pod = pod_obj("p")
    pod["spec"]["schedulerName"] = "default-scheduler"
    assert answer(HOOK.validate(review(pod)).body)["status"]["message"] == (
        "spec.schedulerName: a pod asking for GPU resources must use 'tessera-scheduler' "
        "(the mutating webhook sets it; is it installed?)"
    )


def test_validate_refuses_a_gpu_pod_that_names_its_node_itself() -> None:
    pod = pod_obj("p")
    pod["spec"]["nodeName"] = "gpu-007"  # would bypass scheduling: no cards assigned
    response = answer(HOOK.validate(review(pod)).body)
    assert not response["allowed"] and response["status"]["code"] == 422
    assert response["status"]["message"] == (
        "spec.nodeName: a pod asking for GPU resources must be placed by the scheduler, "
        "which picks its cards (got 'gpu-007'); to pin it to a node, use a nodeSelector on "
        "kubernetes.io/hostname"
    )
    plain = pod_obj("cpu-only", gpu=None)
    plain["spec"]["nodeName"] = "gpu-007"
    assert answer(HOOK.validate(review(plain)).body)["allowed"]  # not Tessera's to judge
    assert answer(HOOK.validate(review(pod, "UPDATE")).body)["allowed"]  # a bound pod


def test_updates_pass() -> None:
    pod = pod_obj("bad", gpu=None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"tessera.io/gpu-cores": "150"}}
    assert answer(HOOK.mutate(review(pod, "UPDATE")).body)["allowed"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "AdmissionReview: body is not valid JSON: Expecting property name enclosed in "
               "double quotes: line 1 column 2 (char 1)"),
        (b"[]", "AdmissionReview: a 'request' object is required"),
        (b'{"request": 3}', "AdmissionReview: a 'request' object is required"),
        (b'{"request": {}}', "AdmissionReview.request.uid: must be a non-empty string"),
        (b'{"request": {"uid": "u"}}', "AdmissionReview.request.object: must be an object"),
        (b'{"request": {"uid": "u", "object": 3}}',
         "AdmissionReview.request.object: must be an object"),
        (b'{"request": {"uid": "u", "object": {}, "oldObject": []}}',
         "AdmissionReview.request.oldObject: must be an object"),
    ],
)  # fmt: skip
def test_a_malformed_review_is_refused_naming_the_field(body: bytes, message: str) -> None:
    for verb in (HOOK.mutate, HOOK.validate):
        with pytest.raises(WireError) as err:
            verb(body)
        assert str(err.value) == message


def _with_resources(resources: dict[str, Any], **container: Any) -> dict[str, Any]:
    pod = pod_obj("p", gpu=None)
    pod["spec"]["containers"][0]["resources"] = resources
    pod["spec"]["containers"][0].update(container)
    return pod


@pytest.mark.parametrize("scheduler", ["tessera-scheduler", "default-scheduler", None])
def test_a_rewrite_that_would_change_the_pods_policy_keeps_its_resources(
    scheduler: str | None,
) -> None:
    # GPU-manager's vcuda-core without a core limit is a burst share; Tessera's gpu-cores
    # alone is a fixed share. Written in Tessera's names the pod would get another policy,
    # so only the scheduler name is set -- also when it was set already (the rewrite then
    # was the patch's only operation, and went unchecked).
    hook = Webhook("tessera-scheduler", compat=Compat(gpu_manager=True))
    resources = {"limits": {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "30"}}
    pod = _with_resources(json.loads(json.dumps(resources)))
    if scheduler is None:
        del pod["spec"]["schedulerName"]
    else:
        pod["spec"]["schedulerName"] = scheduler
    out = patched(pod, hook)
    assert out["spec"]["schedulerName"] == "tessera-scheduler"
    assert out["spec"]["containers"][0]["resources"] == resources
    assert answer(hook.validate(review(out)).body)["allowed"]


def test_requests_follow_the_rewritten_limits_and_are_not_added_where_absent() -> None:
    hook = Webhook("tessera-scheduler", compat=Compat(hami=True))
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
    pod = _with_resources({"limits": dict(hami), "requests": {**hami, "cpu": "1"}})
    pod["spec"]["containers"].append({"name": "second", "image": "x",
                                      "resources": {"limits": dict(hami)}})  # fmt: skip
    pod["spec"]["containers"].append({"name": "third", "image": "x", "resources": {
        "limits": {**hami, "cpu": "2"}, "requests": dict(hami)}})  # fmt: skip
    pod["spec"]["containers"].append({"name": "plain", "image": "x",
                                      "resources": {"limits": {"cpu": "1"}}})  # fmt: skip
    first, second, third, plain = patched(pod, hook)["spec"]["containers"]
    canonical = {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "3000"}
    assert first["resources"] == {"limits": canonical, "requests": {**canonical, "cpu": "1"}}
    assert second["resources"] == {"limits": canonical}
    assert third["resources"] == {"limits": {**canonical, "cpu": "2"}, "requests": canonical}
    assert plain["resources"] == {"limits": {"cpu": "1"}}  # no GPU: untouched


@pytest.mark.parametrize("restart", ["Always", None])  # a sidecar, a plain init container
def test_an_init_container_with_compat_names_is_rewritten_too(restart: str | None) -> None:
    hook = Webhook("tessera-scheduler", compat=Compat(hami=True))
    pod = pod_obj("p", gpu=1)
    pod["spec"]["initContainers"] = [{
        "name": "side", "image": "x",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
    }]  # fmt: skip
    if restart:
        pod["spec"]["initContainers"][0]["restartPolicy"] = restart
    side = patched(pod, hook)["spec"]["initContainers"][0]
    assert side["resources"]["limits"] == {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "1000"}


def test_what_each_answer_reports_for_the_metrics() -> None:
    gpu, plain, bad = (
        pod_obj("g", gpu=None, memory=100),
        pod_obj("c", gpu=None),
        pod_obj("b", gpu=None),
    )
    bad["spec"]["containers"][0]["resources"] = {"limits": {"tessera.io/gpu-cores": "150"}}
    gpu["spec"]["schedulerName"] = "tessera-scheduler"
    results = [HOOK.mutate(review(p)) for p in (gpu, plain, bad)]
    assert [(r.allowed, r.mutated) for r in results] == [
        (True, True),
        (True, False),
        (False, False),
    ]
    results = [HOOK.validate(review(p)) for p in (gpu, plain, bad)]
    assert [(r.allowed, r.mutated) for r in results] == [
        (True, False),
        (True, False),
        (False, False),
    ]


def test_the_namespace_comes_from_the_request_when_the_object_has_none() -> None:
    seen: list[str] = []
    hook = Webhook("tessera-scheduler", quota_check=lambda r: seen.append(r.namespace) or "")
    pod = pod_obj("p", gpu=1)
    pod["spec"]["schedulerName"] = "tessera-scheduler"
    del pod["metadata"]["namespace"]
    body = json.loads(review(pod))
    body["request"]["namespace"] = "team-a"
    assert answer(hook.validate(json.dumps(body).encode()).body)["allowed"]
    assert seen == ["team-a"]


def test_a_review_without_a_uid_is_malformed() -> None:
    body = json.loads(review(pod_obj("p")))
    body["request"]["uid"] = ""
    with pytest.raises(WireError, match=r"request\.uid: must be a non-empty string"):
        HOOK.mutate(json.dumps(body).encode())


def test_the_namespace_filled_in_keeps_the_objects_own_metadata() -> None:
    """A CREATE whose object carries no namespace is read with the request's, and with
    every other field of its metadata: a bad annotation is still refused."""
    pod = pod_obj("p", gpu=1, annotations={"tessera.io/gpu-uuid": "card-0"})
    del pod["metadata"]["namespace"]
    body = json.loads(review(pod))
    body["request"]["namespace"] = "team-a"
    response = answer(HOOK.mutate(json.dumps(body).encode()).body)
    assert not response["allowed"]
    assert "tessera.io/gpu-uuid" in response["status"]["message"]


def test_a_v1beta1_review_is_answered_in_v1beta1_and_a_refusal_says_invalid() -> None:
    pod = pod_obj("bad", gpu=None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"tessera.io/gpu-cores": "150"}}
    body = json.loads(review(pod))
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    out = json.loads(HOOK.mutate(json.dumps(body).encode()).body)
    assert out["apiVersion"] == "admission.k8s.io/v1beta1"
    status = out["response"]["status"]
    assert (status["code"], status["reason"]) == (422, "Invalid")


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_other_operations_are_allowed_untouched(operation: str) -> None:
    verdict = HOOK.mutate(review(pod_obj("g", gpu=1), operation))
    assert (verdict.allowed, verdict.mutated) == (True, False)
    assert "patch" not in answer(verdict.body)


def test_a_review_that_names_no_operation_is_read_as_a_create() -> None:
    pod = pod_obj("g", gpu=1)
    del pod["spec"]["schedulerName"]
    body = json.loads(review(pod))
    del body["request"]["operation"]
    verdict = HOOK.mutate(json.dumps(body).encode())
    assert (verdict.allowed, verdict.mutated) == (True, True)  # routed, as on CREATE


def test_the_webhook_reads_pods_with_its_resource_names() -> None:
    hook = Webhook("tessera-scheduler", ResourceNames(gpu="example.com/gpu"))
    pod = pod_obj("p", gpu=None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": "1"}}
    del pod["spec"]["schedulerName"]
    assert patched(pod, hook)["spec"]["schedulerName"] == "tessera-scheduler"
    assert "schedulerName" not in patched(pod)["spec"]  # not resources the default names know
