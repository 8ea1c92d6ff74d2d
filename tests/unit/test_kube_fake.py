"""The in-memory fake keeps the API server's contract (port.py) that Tessera relies on."""

from __future__ import annotations

import calendar
import re
import threading
import time
from collections.abc import Callable

import pytest

from tessera.kube import NODES, PODS, ApiError, Conflict, FakeKube, Gone, NotFound
from tessera.kube.binder import bind_once, bound_so
from tessera.kube.errors import MANY_BUDGETS
from tessera.kube.fake import canonical_quantity
from tessera.kube.kinds import GPUQUOTAS, LEASES, POD_DISRUPTION_BUDGETS, RESOURCE_SLICES


def _pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {}}


def test_a_namespaced_object_is_written_to_the_namespace_of_the_path_only() -> None:
    kube = FakeKube()
    with pytest.raises(ApiError, match="does not match the namespace sent") as other:
        kube.create(PODS, _pod("a"), "elsewhere")  # the body says ns
    with pytest.raises(ApiError, match="does not allow this method") as bare:
        kube.create(PODS, _pod("a"))
    assert (other.value.status, bare.value.status) == (400, 405)
    unnamed = {"metadata": {"name": "b"}}
    assert kube.create(PODS, unnamed, "ns")["metadata"]["namespace"] == "ns"
    assert kube.create(NODES, {"metadata": {"name": "n"}})["metadata"].get("namespace") is None


def test_a_body_naming_another_type_than_the_resources_is_refused_and_nothing_written() -> None:
    kube = FakeKube()
    with pytest.raises(
        ApiError,
        match=r"the API version in the data \(v1\) does not match"
        r" the expected API version \(coordination.k8s.io/v1\)",
    ) as version:
        kube.create(LEASES, {"apiVersion": "v1", "kind": "Lease", "metadata": {"name": "l"}},
                    "ns")  # fmt: skip
    with pytest.raises(ApiError, match=r"lease in version .* cannot be handled as a Lease") as kind:
        kube.create(LEASES, {"kind": "lease", "metadata": {"name": "l"}}, "ns")
    assert (version.value.status, kind.value.status) == (400, 400)
    assert (version.value.reason, kind.value.reason) == ("BadRequest", "BadRequest")
    with pytest.raises(NotFound):
        kube.get(LEASES, "l", "ns")
    # Neither named: the resource's own, as the server takes the path's.
    lease = kube.create(LEASES, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}, "ns")
    lease.update(apiVersion="coordination.k8s.io/v1", kind="Node")
    with pytest.raises(ApiError, match="Node in version") as replaced:
        kube.replace(LEASES, lease, "ns")
    assert replaced.value.status == 400
    assert kube.get(LEASES, "l", "ns")["spec"] == {"holderIdentity": "a"}


def test_create_stamps_uid_and_resource_version() -> None:
    kube = FakeKube()
    a = kube.create(PODS, _pod("a"), "ns")
    b = kube.create(PODS, _pod("b"), "ns")
    assert a["metadata"]["uid"] != b["metadata"]["uid"]
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a["metadata"]["creationTimestamp"])
    with pytest.raises(Conflict) as taken:
        kube.create(PODS, _pod("a"), "ns")
    assert (taken.value.status, taken.value.reason, taken.value.message) == (
        409, "AlreadyExists", 'pods "a" already exists'
    )  # fmt: skip
    made = kube.create(PODS, {"metadata": {"generateName": "job-"}, "spec": {}}, "ns")
    assert re.fullmatch(r"job-[0-9a-f]{5}", made["metadata"]["name"])
    # A UID and a creation time the body names are the server's to set, not the writer's.
    told = {"name": "c", "uid": "chosen", "creationTimestamp": "2020-01-01T00:00:00Z"}
    c = kube.create(PODS, {"metadata": told, "spec": {}}, "ns")["metadata"]
    assert c["uid"] != "chosen" and c["creationTimestamp"] != told["creationTimestamp"]


def _refused(write: Callable[[], object]) -> tuple[int, str, str]:
    with pytest.raises(ApiError) as refused:
        write()
    return refused.value.status, refused.value.reason, refused.value.message


def test_a_create_names_the_object_or_is_refused_and_nothing_written() -> None:
    kube = FakeKube()
    assert _refused(lambda: kube.create(PODS, {"metadata": {}, "spec": {}}, "ns")) == (
        422, "Invalid",
        'Pod "" is invalid: metadata.name: Required value: name or generateName is required',
    )  # fmt: skip
    assert _refused(lambda: kube.create(LEASES, {"spec": {}}, "ns"))[2].startswith(
        'Lease.coordination.k8s.io "" is invalid: metadata.name: Required value'
    )
    assert kube.list(PODS).items == [] and kube.list(LEASES).items == []


def test_messages_name_a_grouped_resource_with_its_group() -> None:
    kube = FakeKube()
    assert _refused(lambda: kube.get(LEASES, "l", "ns")) == (
        404, "NotFound", 'leases.coordination.k8s.io "l" not found'
    )  # fmt: skip
    assert _refused(lambda: kube.delete(RESOURCE_SLICES, "s"))[2] == (
        'resourceslices.resource.k8s.io "s" not found'
    )
    budget = kube.create(POD_DISRUPTION_BUDGETS, _budget("b", 1), "default")
    assert _refused(lambda: kube.create(POD_DISRUPTION_BUDGETS, _budget("b", 1), "default"))[2] == (
        'poddisruptionbudgets.policy "b" already exists'
    )
    kube.merge_patch(POD_DISRUPTION_BUDGETS, "b", {"metadata": {"labels": {"a": "b"}}}, "default")
    assert _refused(lambda: kube.replace(POD_DISRUPTION_BUDGETS, budget, "default")) == (
        409, "Conflict", 'Operation cannot be fulfilled on poddisruptionbudgets.policy "b": '
        "the object has been modified; please apply your changes to the latest version and "
        "try again",
    )  # fmt: skip
    assert _refused(lambda: kube.get(PODS, "p", "ns"))[2] == 'pods "p" not found'  # core: bare


def test_a_put_without_a_resource_version_is_taken_or_refused_per_kind() -> None:
    """Pods, Nodes, Events, ResourceSlices and ResourceClaims take a PUT without a
    resourceVersion as "over whatever is stored"; Leases, PodDisruptionBudgets and custom
    resources refuse it."""
    kube = FakeKube()
    kube.create(PODS, _pod("a"), "ns")
    unversioned = {**_pod("a"), "metadata": {"name": "a", "labels": {"x": "1"}}}
    assert kube.replace(PODS, unversioned, "ns")["metadata"]["labels"] == {"x": "1"}
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    kube.create(LEASES, lease, "ns")
    assert _refused(lambda: kube.replace(LEASES, {**lease, "spec": {}}, "ns")) == (
        422, "Invalid", 'leases.coordination.k8s.io "l" is invalid: metadata.resourceVersion: '
        "Invalid value: 0: must be specified for an update",
    )  # fmt: skip
    quota = {"apiVersion": GPUQUOTAS.api_version, "kind": "GpuQuota",
             "metadata": {"name": "q"}, "spec": {"limits": []}}  # fmt: skip
    kube.create(GPUQUOTAS, quota, "ns")
    assert _refused(lambda: kube.replace(GPUQUOTAS, quota, "ns"))[:2] == (422, "Invalid")
    assert kube.get(LEASES, "l", "ns")["spec"] == {"holderIdentity": "a"}


def test_a_put_of_a_missing_lease_creates_it_and_of_a_missing_pod_is_refused() -> None:
    kube = FakeKube()
    rv = kube.list(LEASES).resource_version
    lease = {"metadata": {"name": "l", "resourceVersion": "7", "uid": "mine"},
             "spec": {"holderIdentity": "a"}}  # fmt: skip
    made = kube.replace(LEASES, lease, "ns")
    assert made["spec"] == {"holderIdentity": "a"} and made["metadata"]["uid"] != "mine"
    assert made["metadata"]["namespace"] == "ns"
    [added] = list(kube.watch(LEASES, rv, timeout_s=0))
    assert added.type == "ADDED" and added.object == made == kube.get(LEASES, "l", "ns")
    lease["spec"]["holderIdentity"] = "b"  # the body sent is not what was stored
    assert kube.get(LEASES, "l", "ns")["spec"] == {"holderIdentity": "a"}
    pod = {**_pod("p"), "metadata": {"name": "p", "resourceVersion": "7"}}
    assert _refused(lambda: kube.replace(PODS, pod, "ns"))[:2] == (404, "NotFound")


def test_a_custom_resources_body_must_name_its_type() -> None:
    kube = FakeKube()
    quota = {"metadata": {"name": "q"}, "spec": {"limits": []}}
    assert _refused(lambda: kube.create(GPUQUOTAS, quota, "ns")) == (
        400, "BadRequest", "the object provided is unrecognized (must be of type GpuQuota): "
        "Object 'Kind' is missing",
    )  # fmt: skip
    assert (
        "'apiVersion' is missing"
        in _refused(lambda: kube.create(GPUQUOTAS, {**quota, "kind": "GpuQuota"}, "ns"))[2]
    )
    assert kube.list(GPUQUOTAS).items == []


def test_a_nodes_allocatable_defaults_to_its_capacity() -> None:
    kube = FakeKube()
    capacity = {"cpu": "8", "tessera.io/vgpu": "16"}
    made = kube.create(NODES, {"metadata": {"name": "a"}, "status": {"capacity": capacity}})
    assert made["status"]["allocatable"] == capacity
    kept = {"metadata": {"name": "b"}, "status": {"capacity": capacity, "allocatable": {}}}
    assert kube.create(NODES, kept)["status"]["allocatable"] == {}
    patched = kube.merge_patch(NODES, "a", {"status": {"capacity": {"cpu": "4"},
                                                       "allocatable": None}},
                               subresource="status")  # fmt: skip
    assert patched["status"]["allocatable"] == {"cpu": "4", "tessera.io/vgpu": "16"}


def test_what_a_write_returns_and_what_it_was_given_are_not_what_is_stored() -> None:
    """The API server answers with a copy: changing the body sent, or the object
    returned, changes nothing stored."""
    kube = FakeKube()
    body = _pod("a")
    body["metadata"]["labels"] = {"app": "x"}
    made = kube.create(PODS, body, "ns")
    body["metadata"]["labels"]["app"] = "changed-body"
    made["metadata"]["labels"]["app"] = "changed-answer"
    got = kube.get(PODS, "a", "ns")
    assert got["metadata"]["labels"] == {"app": "x"}
    got["metadata"]["labels"]["app"] = "changed-get"
    replaced = kube.replace(PODS, kube.get(PODS, "a", "ns"), "ns")
    replaced["metadata"]["labels"]["app"] = "changed-replace"
    patched = kube.merge_patch(PODS, "a", {"metadata": {"annotations": {"k": "v"}}}, "ns")
    patched["metadata"]["labels"]["app"] = "changed-patch"
    [listed] = kube.list(PODS, "ns").items
    listed["metadata"]["labels"]["app"] = "changed-list"
    assert kube.get(PODS, "a", "ns")["metadata"]["labels"] == {"app": "x"}


def test_merge_patch_with_stale_resource_version_conflicts() -> None:
    kube = FakeKube()
    pod = kube.create(PODS, _pod("a"), "ns")
    rv = pod["metadata"]["resourceVersion"]
    patched = kube.merge_patch(
        PODS, "a", {"metadata": {"resourceVersion": rv, "annotations": {"k": "v"}}}, "ns"
    )
    assert patched["metadata"]["annotations"] == {"k": "v"}
    with pytest.raises(Conflict) as stale:
        kube.merge_patch(PODS, "a", {"metadata": {"resourceVersion": rv}}, "ns")
    assert (stale.value.status, stale.value.reason, stale.value.message) == (
        409, "Conflict", 'Operation cannot be fulfilled on pods "a": the object has been '
        "modified; please apply your changes to the latest version and try again",
    )  # fmt: skip
    # A patch's UID is no precondition to the API server: a change of an immutable field.
    with pytest.raises(ApiError) as other:
        kube.merge_patch(PODS, "a", {"metadata": {"uid": "other"}}, "ns")
    assert (other.value.status, other.value.reason, other.value.message) == (
        422, "Invalid",
        'Pod "a" is invalid: metadata.uid: Invalid value: "other": field is immutable',
    )  # fmt: skip
    # A PUT's is (the words are the real API server's, tests/e2e/test_kube_binder.py).
    stored = kube.get(PODS, "a", "ns")
    uid = stored["metadata"]["uid"]
    stored["metadata"]["uid"] = "other"
    with pytest.raises(Conflict) as put:
        kube.replace(PODS, stored, "ns")
    assert put.value.message == (
        'Operation cannot be fulfilled on pods "a": StorageError: invalid object, Code: 4, '
        "Key: /registry/pods/ns/a, ResourceVersion: 0, AdditionalErrorMsg: Precondition "
        f"failed: UID in precondition: other, UID in object meta: {uid}"
    )
    removed = kube.merge_patch(PODS, "a", {"metadata": {"annotations": {"k": None}}}, "ns")
    assert removed["metadata"]["annotations"] == {}


def test_bind_refuses_a_bound_pod_and_a_wrong_uid() -> None:
    kube = FakeKube()
    uid = kube.create(PODS, _pod("a"), "ns")["metadata"]["uid"]
    with pytest.raises(Conflict):
        kube.bind("ns", "a", "not-the-uid", "n1")
    kube.bind("ns", "a", uid, "n1")
    assert kube.get(PODS, "a", "ns")["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict):
        kube.bind("ns", "a", uid, "n2")
    with pytest.raises(NotFound):
        kube.bind("ns", "missing", "", "n1")


def test_bind_refuses_a_terminating_or_gated_pod_and_marks_the_pod_scheduled() -> None:
    """As the API server's binding storage: 409 for a pod being deleted or still gated,
    and a bound pod's PodScheduled condition turns True (the scheduler's reason goes)."""
    kube = FakeKube()
    kube.graceful_evictions = True
    pending = _pod("a")
    waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pending["status"] = {"conditions": [waiting]}
    uid = kube.create(PODS, pending, "ns")["metadata"]["uid"]
    kube.bind("ns", "a", uid, "n1")
    (scheduled,) = kube.get(PODS, "a", "ns")["status"]["conditions"]
    assert (scheduled["type"], scheduled["status"]) == ("PodScheduled", "True")
    assert "reason" not in scheduled and scheduled["lastTransitionTime"].endswith("Z")
    with pytest.raises(Conflict, match=r'pods/binding "a": pod a is already assigned to node "n1"'):
        kube.bind("ns", "a", uid, "n2")
    gated = {**_pod("g"), "spec": {"schedulingGates": [{"name": "example.com/wait"}]}}
    gated_uid = kube.create(PODS, gated, "ns")["metadata"]["uid"]
    with pytest.raises(Conflict, match=r"pod g has non-empty \.spec\.schedulingGates"):
        kube.bind("ns", "g", gated_uid, "n1")
    going = kube.create(PODS, _pod("t"), "ns")["metadata"]["uid"]
    kube.evict("ns", "t", going)  # a pending pod: no budget weighed; now terminating
    with pytest.raises(Conflict, match="pod t is being deleted, cannot be assigned to a host"):
        kube.bind("ns", "t", going, "n1")
    assert "nodeName" not in kube.get(PODS, "t", "ns")["spec"]
    assert kube.get(PODS, "t", "ns")["metadata"]["deletionGracePeriodSeconds"] == 30  # default


def test_watch_delivers_changes_in_order_then_gone_after_expiry() -> None:
    kube = FakeKube()
    start = kube.list(NODES).resource_version
    kube.create(NODES, {"metadata": {"name": "n1"}})
    kube.merge_patch(NODES, "n1", {"metadata": {"labels": {"a": "b"}}})
    kube.delete(NODES, "n1")
    events = list(kube.watch(NODES, start, timeout_s=0))
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    kube.expire_history()
    with pytest.raises(Gone):
        list(kube.watch(NODES, start, timeout_s=0))


def test_a_watch_without_a_version_starts_with_what_there_is_not_the_history() -> None:
    kube = FakeKube()
    for name in ("a", "b", "c"):
        kube.create(PODS, _pod(name), "ns")
    kube.create(PODS, {"metadata": {"name": "x"}, "spec": {}}, "other")
    kube.merge_patch(PODS, "a", {"metadata": {"labels": {"k": "v"}}}, "ns")
    kube.delete(PODS, "b", "ns")
    for version in ("", "0"):
        events = [
            (e.type, e.object["metadata"]["name"])
            for e in kube.watch(PODS, version, "ns", timeout_s=0)
        ]
        assert events == [("ADDED", "c"), ("ADDED", "a")]  # in the order they were last written
    labelled = kube.watch(PODS, "", "ns", label_selector="k=v", timeout_s=5)
    assert next(labelled).object["metadata"]["name"] == "a"
    kube.merge_patch(PODS, "c", {"metadata": {"labels": {"k": "v"}}}, "ns")
    following = next(labelled)  # then the changes made after it started: c comes in
    assert (following.type, following.object["metadata"]["name"]) == ("ADDED", "c")
    assert kube.list(NODES).resource_version != "0"  # "0" would read as "any" to a watch


def test_a_watch_with_a_selector_sees_objects_come_into_it_and_leave_it() -> None:
    """As the API server's watch cache sends them: ADDED when a change brings an object
    into the selection, DELETED (its state before, at the change's version) when one
    takes it out, MODIFIED while it stays in, nothing while it stays out."""
    kube = FakeKube()
    rv = kube.list(PODS).resource_version
    kube.create(PODS, _pod("a"), "ns")  # out
    kube.merge_patch(PODS, "a", {"metadata": {"labels": {"k": "v"}}}, "ns")  # comes in
    kube.merge_patch(PODS, "a", {"metadata": {"annotations": {"n": "1"}}}, "ns")  # stays
    left = kube.merge_patch(PODS, "a", {"metadata": {"labels": {"k": "w"}}}, "ns")  # leaves
    kube.merge_patch(PODS, "a", {"metadata": {"annotations": {"n": "2"}}}, "ns")  # stays out
    kube.merge_patch(PODS, "a", {"metadata": {"labels": {"k": "v"}}}, "ns")
    kube.delete(PODS, "a", "ns")
    kube.create(PODS, {**_pod("b"), "metadata": {"name": "b", "labels": {"k": "v"}}}, "ns")
    kube.bind("ns", "b", "", "node-a")
    seen = [(e.type, e.object["metadata"]["name"], e.object["metadata"].get("labels"),
             e.object["metadata"]["resourceVersion"])
            for e in kube.watch(PODS, rv, "ns", label_selector="k=v", timeout_s=0)]  # fmt: skip
    assert [s[:3] for s in seen] == [
        ("ADDED", "a", {"k": "v"}),
        ("MODIFIED", "a", {"k": "v"}),
        ("DELETED", "a", {"k": "v"}),  # as it was in the selection...
        ("ADDED", "a", {"k": "v"}),
        ("MODIFIED", "a", {"k": "v"}),  # a pod's deletion: terminating first...
        ("DELETED", "a", {"k": "v"}),  # ...then gone
        ("ADDED", "b", {"k": "v"}),
        ("MODIFIED", "b", {"k": "v"}),
    ]
    assert seen[2][3] == left["metadata"]["resourceVersion"]  # ...at the change's version
    [deleted] = [e for e in kube.watch(PODS, rv, "ns", timeout_s=0) if e.type == "DELETED"]
    assert deleted.object["metadata"]["deletionGracePeriodSeconds"] == 0
    bound = kube.watch(PODS, rv, field_selector="spec.nodeName=node-a", timeout_s=0)
    assert [(e.type, e.object["metadata"]["name"]) for e in bound] == [("ADDED", "b")]


def test_lists_and_watches_read_every_form_of_a_selector_and_refuse_what_they_cannot() -> None:
    kube = FakeKube()
    for name, labels in [("a", {"app": "t", "gen": "2"}), ("b", {"app": "u", "gen": "9"}),
                         ("c", {})]:  # fmt: skip
        kube.create(PODS, {**_pod(name), "metadata": {"name": name, "labels": labels}}, "ns")
    assert _names(kube.list(PODS, "ns", label_selector="app!=t").items) == ["b", "c"]
    assert _names(kube.list(PODS, "ns", label_selector="gen>3").items) == ["b"]
    assert _names(kube.list(PODS, "ns", label_selector="app in (t,u)").items) == ["a", "b"]
    assert _names(kube.list(PODS, "ns", label_selector="!app").items) == ["c"]
    assert _names(kube.list(PODS, "ns", field_selector="metadata.name==b").items) == ["b"]
    with pytest.raises(ApiError) as bad:
        kube.list(PODS, "ns", label_selector="app in t")
    assert bad.value.status == 400 and "unable to parse requirement" in bad.value.message
    with pytest.raises(ApiError, match="unable to parse requirement"):
        next(kube.watch(PODS, "", "ns", label_selector="a!b", timeout_s=0))


def test_a_watch_waits_for_a_change_made_after_it_started() -> None:
    kube = FakeKube()
    start = kube.list(NODES).resource_version
    events = kube.watch(NODES, start, timeout_s=5)
    threading.Timer(0.3, lambda: kube.create(NODES, {"metadata": {"name": "n1"}})).start()
    first = next(events)
    assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "n1")


def test_lists_and_watches_keep_to_a_namespace_and_labels() -> None:
    kube = FakeKube()
    start = kube.list(PODS).resource_version
    for name, ns, labels in [("a", "x", {"app": "t"}), ("b", "y", {"app": "t"}),
                             ("c", "x", {"app": "u"}), ("d", "x", None)]:  # fmt: skip
        kube.create(PODS, {"metadata": {"name": name, "labels": labels}}, ns)
    assert _names(kube.list(PODS, "x").items) == ["a", "c", "d"]
    assert _names(kube.list(PODS, "x", label_selector="app=t").items) == ["a"]
    assert _names(kube.list(PODS, label_selector="app=t").items) == ["a", "b"]
    watched = kube.watch(PODS, start, "x", label_selector="app=u", timeout_s=0)
    assert [e.object["metadata"]["name"] for e in watched] == ["c"]


def test_held_watches_deliver_later_in_order() -> None:
    kube = FakeKube()
    start = kube.list(NODES).resource_version
    with kube.hold_watches():
        kube.create(NODES, {"metadata": {"name": "n1"}})
        assert list(kube.watch(NODES, start, timeout_s=0)) == []
        kube.delete(NODES, "n1")
    events = list(kube.watch(NODES, start, timeout_s=0))
    assert [e.type for e in events] == ["ADDED", "DELETED"]


def test_bind_once_treats_its_own_landed_write_as_bound() -> None:
    kube = FakeKube()
    uid = kube.create(PODS, _pod("a"), "ns")["metadata"]["uid"]
    kube.bind("ns", "a", uid, "n1", {"k": "v"})
    bind_once(kube, "ns", "a", uid, "n1", {"k": "v"})  # the same bind again: done
    others = [("not-the-uid", "n1", {"k": "v"}), (uid, "n2", {"k": "v"}), (uid, "n1", {"k": "w"})]
    for other in others:  # replaced pod, other node, other annotation
        with pytest.raises(Conflict, match=r"already assigned|Precondition"):
            bind_once(kube, "ns", "a", *other)
    kube.fail_next("get", ApiError(500, "InternalError", "etcd timeout"))
    with pytest.raises(Conflict):  # the pod cannot be read: the Conflict stands
        bind_once(kube, "ns", "a", uid, "n1", {"k": "v"})


def test_field_selector_filters_lists() -> None:
    kube = FakeKube()
    kube.create(PODS, {"metadata": {"name": "a"}, "spec": {"schedulerName": "x"}}, "ns")
    kube.create(PODS, {"metadata": {"name": "b"}, "spec": {"schedulerName": "y"}}, "ns")
    names = [
        p["metadata"]["name"] for p in kube.list(PODS, field_selector="spec.schedulerName=x").items
    ]
    assert names == ["a"]
    names = [
        p["metadata"]["name"] for p in kube.list(PODS, field_selector="spec.schedulerName!=x").items
    ]
    assert names == ["b"]


def test_field_labels_the_api_server_does_not_index_are_refused() -> None:
    """A list or watch selecting on a field the real server does not index fails there
    with 400; so it does here, rather than filtering in a way no cluster would."""
    kube = FakeKube()
    kube.list(RESOURCE_SLICES, field_selector="spec.driver=gpu.tessera.io,spec.nodeName=n")
    kube.list(GPUQUOTAS, field_selector="metadata.name=q")
    refused = [
        (PODS, "spec.nodeName=n,spec.containers=x", "spec.containers"),
        (NODES, "metadata.namespace=x", "metadata.namespace"),
        (GPUQUOTAS, "spec.limits!=x", "spec.limits"),
    ]
    for kind, selector, label in refused:
        with pytest.raises(ApiError, match=f"field label not supported: {label}$") as err:
            kube.list(kind, field_selector=selector)
        assert err.value.status == 400
        with pytest.raises(ApiError, match=f"field label not supported: {label}$"):
            next(iter(kube.watch(kind, "0", field_selector=selector, timeout_s=0)))


def test_a_resource_slice_is_stored_as_the_api_server_stores_it() -> None:
    kube = FakeKube()
    capacity = {"memory": {"value": "40960Mi"}, "slots": {"value": "16"}}
    taint = {"key": "k", "value": "true", "effect": "NoSchedule"}
    device = {"name": "gpu-0", "capacity": capacity, "taints": [taint]}
    out = kube.create(RESOURCE_SLICES, {"metadata": {"name": "s"}, "spec": {"devices": [device]}})
    [stored] = out["spec"]["devices"]
    assert stored["capacity"] == {"memory": {"value": "40Gi"}, "slots": {"value": "16"}}
    assert stored["taints"][0]["timeAdded"].endswith("Z")
    out["spec"]["devices"][0]["capacity"]["memory"] = {"value": "24576Mi"}  # a PUT: the same
    [replaced] = kube.replace(RESOURCE_SLICES, out)["spec"]["devices"]
    assert replaced["capacity"]["memory"] == {"value": "24Gi"}


@pytest.mark.parametrize(
    ("written", "stored"),
    [("40960Mi", "40Gi"), ("1536Mi", "1536Mi"), ("1Mi", "1Mi"), ("1024Ki", "1Mi"),
     ("1Ki", "1Ki"), ("1024Pi", "1Ei"), ("100", "100"), ("0", "0"), ("1000", "1k"),
     ("2048", "2048"), ("0.5", "500m")],
)  # fmt: skip
def test_quantities_take_their_canonical_form(written: str, stored: str) -> None:
    assert canonical_quantity(written) == stored


def _running(name: str, labels: dict[str, str], ready: bool = True) -> dict:
    pod = _pod(name)
    pod["metadata"].update(namespace="default", labels=labels)
    pod["status"] = {"phase": "Running",
                     "conditions": [{"type": "PodScheduled", "status": "True"},
                                    {"type": "Ready", "status": str(ready)}]}  # fmt: skip
    return pod


def _budget(name: str, allowed: int, selector: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"selector": selector or {"matchLabels": {"app": "train"}}},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": 2,
            "desiredHealthy": 1,
            "observedGeneration": 1,
        },
    }


def test_evict_keeps_pod_disruption_budgets_as_the_api_server() -> None:
    kube = FakeKube()
    a = kube.seed(PODS, _running("a", {"app": "train"}), "default")
    b = kube.seed(PODS, _running("b", {"app": "train"}), "default")
    kube.seed(POD_DISRUPTION_BUDGETS, _budget("keep", 1), "default")
    kube.evict("default", "a", a["metadata"]["uid"])  # the budget allows one: taken
    stored = kube.get(POD_DISRUPTION_BUDGETS, "keep", "default")["status"]
    assert stored["disruptionsAllowed"] == 0 and "a" in stored["disruptedPods"]
    with pytest.raises(ApiError) as refused:
        kube.evict("default", "b", b["metadata"]["uid"])
    assert refused.value.status == 429
    assert kube.get(PODS, "b", "default")  # still there
    # Bound but not started (Pending): the budget does not apply.
    kube.merge_patch(PODS, "b", {"status": {"phase": "Pending"}}, "default", subresource="status")
    kube.evict("default", "b", b["metadata"]["uid"])


def test_evict_weighs_an_unready_pod_and_a_stale_budget_as_the_api_server() -> None:
    """Eviction storage (v1.36): an unready pod goes without taking a disruption when
    the budget is met (healthy >= desired > 0) or its policy is AlwaysAllow; otherwise
    it is weighed like any pod. A budget its controller has not seen since its last
    change answers 429, and a negative allowance 403."""
    spent = (429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
             "disruption budget.")  # fmt: skip
    stale = (429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
             "disruption budget keep.")  # fmt: skip
    cases = [
        # (budget status and spec changes, the pod ready?, the refusal or None: evicted)
        ({"currentHealthy": 2, "desiredHealthy": 1}, False, None),
        ({"currentHealthy": 1, "desiredHealthy": 1}, False, None),
        ({"currentHealthy": 0, "desiredHealthy": 1}, False, spent),
        ({"currentHealthy": 0, "desiredHealthy": 0}, False, spent),
        ({"currentHealthy": 1, "desiredHealthy": None}, False, spent),  # not counted: 0
        ({"currentHealthy": None}, False, spent),  # none counted healthy: 0 of 1
        ({"currentHealthy": 0, "desiredHealthy": 1, "policy": "AlwaysAllow"}, False, None),
        ({"currentHealthy": 2, "desiredHealthy": 1, "policy": "AlwaysAllow"}, True, spent),
        ({"disruptionsAllowed": 3, "observedGeneration": 0}, True, stale),
        ({"disruptionsAllowed": 3, "observedGeneration": None}, True, stale),  # never seen
        (
            {"disruptionsAllowed": -1},
            True,
            (403, "Forbidden", "pdb disruptions allowed is negative"),
        ),
        ({"disruptionsAllowed": None}, True, spent),  # not counted yet: none allowed
    ]
    for change, ready, answer in cases:
        kube = FakeKube()
        pod = kube.seed(PODS, _running("a", {"app": "train"}, ready=ready), "default")
        budget = _budget("keep", 0)
        if "policy" in change:
            budget["spec"]["unhealthyPodEvictionPolicy"] = change.pop("policy")
        budget["status"].update(change)
        budget["status"] = {k: v for k, v in budget["status"].items() if v is not None}
        kube.seed(POD_DISRUPTION_BUDGETS, budget, "default")
        if answer:
            with pytest.raises(ApiError) as refused:
                kube.evict("default", "a", pod["metadata"]["uid"])
            said = (refused.value.status, refused.value.reason, refused.value.message)
            assert said == answer, (change, ready)
            continue
        kube.evict("default", "a", pod["metadata"]["uid"])
        with pytest.raises(NotFound):
            kube.get(PODS, "a", "default")
        status = kube.get(POD_DISRUPTION_BUDGETS, "keep", "default")["status"]
        assert status["disruptionsAllowed"] == 0 and "disruptedPods" not in status, change


def test_a_pod_that_is_not_running_or_already_going_is_evicted_whatever_its_budget() -> None:
    """Pending, Succeeded, Failed or terminating: the budget is not weighed or charged."""
    for phase, terminating in (("Pending", False), ("Succeeded", False), ("Failed", False),
                               ("Running", True)):  # fmt: skip
        kube = FakeKube()
        kube.graceful_evictions = True  # the terminating one stays terminating
        pod = _running("a", {"app": "train"})
        pod["status"]["phase"] = phase
        made = kube.seed(PODS, pod, "default")
        if terminating:
            kube.evict("default", "a", made["metadata"]["uid"])  # it turns terminating...
        kube.seed(POD_DISRUPTION_BUDGETS, _budget("keep", 0), "default")
        kube.evict("default", "a", made["metadata"]["uid"])  # ...and is not weighed again
        status = kube.get(POD_DISRUPTION_BUDGETS, "keep", "default")["status"]
        assert status["disruptionsAllowed"] == 0 and "disruptedPods" not in status, phase


def test_an_eviction_takes_a_disruption_and_marks_the_pod_in_the_budget() -> None:
    kube = FakeKube()
    a = kube.seed(PODS, _running("a", {"app": "train"}), "default")
    start = kube.list(POD_DISRUPTION_BUDGETS).resource_version
    kube.seed(POD_DISRUPTION_BUDGETS, _budget("keep", 2), "default")
    kube.evict("default", "a", a["metadata"]["uid"])
    status = kube.get(POD_DISRUPTION_BUDGETS, "keep", "default")["status"]
    assert status["disruptionsAllowed"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status["disruptedPods"]["a"])
    seen = [(e.type, e.object.get("status", {}).get("disruptionsAllowed"))
            for e in kube.watch(POD_DISRUPTION_BUDGETS, start, timeout_s=0)]  # fmt: skip
    assert seen == [("ADDED", None), ("MODIFIED", 2), ("MODIFIED", 1)]  # seeded, then taken


def test_an_eviction_is_refused_in_the_api_servers_words_and_goes_as_a_deletion() -> None:
    kube = FakeKube()
    assert _refused(lambda: kube.evict("default", "a", "u")) == (
        404, "NotFound", 'pods "a" not found'
    )  # fmt: skip
    uid = kube.seed(PODS, _running("a", {}), "default")["metadata"]["uid"]
    assert _refused(lambda: kube.evict("default", "a", "other")) == (
        409, "Conflict", 'Operation cannot be fulfilled on Pod "a": the UID in the '
        f"precondition (other) does not match the UID in record ({uid}). The object might "
        "have been deleted and then recreated",
    )  # fmt: skip
    start = kube.list(PODS).resource_version
    kube.evict("default", "a", uid)
    seen = [(e.type, e.object["metadata"].get("deletionGracePeriodSeconds"))
            for e in kube.watch(PODS, start, timeout_s=0)]  # fmt: skip
    assert seen == [("MODIFIED", 0), ("DELETED", 0)]  # terminating, then gone at once


def test_a_graceful_eviction_waits_the_pods_own_grace_period() -> None:
    kube = FakeKube()
    kube.graceful_evictions = True
    pod = _running("a", {})
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    uid = kube.seed(PODS, pod, "default")["metadata"]["uid"]
    before = time.time()
    kube.evict("default", "a", uid)
    meta = kube.get(PODS, "a", "default")["metadata"]
    when = calendar.timegm(time.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
    assert meta["deletionGracePeriodSeconds"] == 5
    assert before + 4 <= when <= time.time() + 5
    kube.evict("default", "a", uid)  # again: still the first deletion's time and period
    assert kube.get(PODS, "a", "default")["metadata"] == meta


def test_a_binding_adds_its_annotations_to_the_pods_and_is_refused_in_the_servers_words() -> None:
    kube = FakeKube()
    assert _refused(lambda: kube.bind("ns", "a", "", "n1")) == (
        404,
        "NotFound",
        'pods "a" not found',
    )
    pod = {**_pod("a"), "metadata": {"name": "a", "annotations": {"mine": "1"}}}
    uid = kube.create(PODS, pod, "ns")["metadata"]["uid"]
    assert _refused(lambda: kube.bind("ns", "a", "other", "n1")) == (
        409, "Conflict", 'Operation cannot be fulfilled on pods "a": StorageError: invalid '
        "object, Code: 4, Key: /registry/pods/ns/a, ResourceVersion: 0, AdditionalErrorMsg: "
        f"Precondition failed: UID in precondition: other, UID in object meta: {uid}",
    )  # fmt: skip
    kube.bind("ns", "a", uid, "n1", {"tessera.io/assignment": "x"})
    stored = kube.get(PODS, "a", "ns")
    assert stored["metadata"]["annotations"] == {"mine": "1", "tessera.io/assignment": "x"}
    assert _refused(lambda: kube.bind("ns", "a", uid, "n2")) == (
        409, "Conflict", 'Operation cannot be fulfilled on pods/binding "a": pod a is already '
        'assigned to node "n1"',
    )  # fmt: skip
    bare = kube.create(PODS, {"metadata": {"name": "bare"}}, "ns")  # no spec at all
    kube.bind("ns", "bare", bare["metadata"]["uid"], "n1")
    assert kube.get(PODS, "bare", "ns")["spec"] == {"nodeName": "n1"}


def test_a_watch_tells_objects_of_one_name_in_two_namespaces_and_a_name_reused_apart() -> None:
    kube = FakeKube()
    start = kube.list(PODS).resource_version
    labelled = {"name": "a", "labels": {"k": "v"}}
    kube.create(PODS, {"metadata": labelled, "spec": {}}, "one")
    kube.create(PODS, {"metadata": {"name": "a"}, "spec": {}}, "two")  # same name, not selected
    kube.merge_patch(PODS, "a", {"metadata": {"annotations": {"n": "1"}}}, "one")
    kube.delete(PODS, "a", "one")
    kube.create(PODS, {"metadata": labelled, "spec": {}}, "one")  # the name again: new
    seen = [(e.type, e.object["metadata"]["namespace"])
            for e in kube.watch(PODS, start, label_selector="k=v", timeout_s=0)]  # fmt: skip
    assert seen == [("ADDED", "one"), ("MODIFIED", "one"), ("MODIFIED", "one"),
                    ("DELETED", "one"), ("ADDED", "one")]  # fmt: skip


def test_a_replace_keeps_the_stored_uid_and_namespace_and_refuses_a_missing_name() -> None:
    kube = FakeKube()
    made = kube.create(PODS, _pod("a"), "ns")
    body = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {}}  # no uid, no ns
    replaced = kube.replace(PODS, body, "ns")
    assert replaced["metadata"]["uid"] == made["metadata"]["uid"]
    assert replaced["metadata"]["namespace"] == "ns" and body["metadata"] == {
        "name": "a", "labels": {"x": "1"}}  # fmt: skip
    assert _refused(lambda: kube.replace(PODS, {"metadata": {"name": "b"}}, "ns"))[2] == (
        'pods "b" not found'
    )
    assert kube.calls[-1] == ("replace", "pods")


def test_a_budgets_generation_is_the_servers_and_counts_its_spec_changes() -> None:
    """Its controller reports the generation it has seen: an eviction right after a
    change of the spec meets a budget not yet observed (429, its name in the words)."""
    kube = FakeKube()
    uid = kube.seed(PODS, _running("a", {"app": "train"}), "default")["metadata"]["uid"]
    told = _budget("keep", 1)
    told["metadata"]["generation"] = 7  # not the writer's to set
    made = kube.seed(POD_DISRUPTION_BUDGETS, told, "default")
    assert made["metadata"]["generation"] == 1  # the status write did not count
    kube.merge_patch(POD_DISRUPTION_BUDGETS, "keep", {"metadata": {"labels": {"x": "1"}}},
                     "default")  # fmt: skip
    moved = {"spec": {"selector": {"matchLabels": {"app": "train"}}, "maxUnavailable": 1}}
    changed = kube.merge_patch(POD_DISRUPTION_BUDGETS, "keep", moved, "default")
    assert changed["metadata"]["generation"] == 2
    assert _refused(lambda: kube.evict("default", "a", uid))[2].endswith("budget keep.")
    kube.merge_patch(POD_DISRUPTION_BUDGETS, "keep", {"status": {"observedGeneration": 2}},
                     "default", subresource="status")  # fmt: skip
    kube.evict("default", "a", uid)
    replaced = kube.replace(POD_DISRUPTION_BUDGETS, kube.get(POD_DISRUPTION_BUDGETS, "keep",
                                                              "default"), "default")  # fmt: skip
    assert replaced["metadata"]["generation"] == 2  # the same spec: no change
    quota = {"apiVersion": GPUQUOTAS.api_version, "kind": "GpuQuota",
             "metadata": {"name": "q"}, "spec": {"limits": []}}  # fmt: skip
    assert kube.create(GPUQUOTAS, quota, "ns")["metadata"]["generation"] == 1
    assert "generation" not in kube.create(PODS, _pod("p"), "ns")["metadata"]


def test_a_budget_its_controller_has_not_counted_yet_allows_nothing() -> None:
    kube = FakeKube()
    uid = kube.seed(PODS, _running("a", {"app": "train"}), "default")["metadata"]["uid"]
    bare = {"metadata": {"name": "new"}, "spec": {"selector": {"matchLabels": {"app": "train"}}}}
    kube.create(POD_DISRUPTION_BUDGETS, bare, "default")  # no status yet
    assert _refused(lambda: kube.evict("default", "a", uid))[:2] == (429, "TooManyRequests")


def test_injected_failures_and_unserved_kinds_reach_a_replace() -> None:
    kube = FakeKube()
    kube.create(PODS, _pod("a"), "ns")
    kube.fail_next("replace", ApiError(503, "ServiceUnavailable", "later"))
    assert _refused(lambda: kube.replace(PODS, kube.get(PODS, "a", "ns"), "ns"))[0] == 503
    kube.unserved.add("pods")
    assert _refused(lambda: kube.replace(PODS, _pod("a"), "ns"))[0] == 404
    kube.unserved.clear()
    elsewhere = {**_pod("a"), "metadata": {"name": "a", "namespace": "other"}}
    assert _refused(lambda: kube.replace(PODS, elsewhere, "ns"))[0] == 400
    assert _refused(lambda: kube.replace(PODS, _pod("a"), None))[0] == 405
    kube.create(NODES, {"metadata": {"name": "n"}})  # no status yet
    told = {"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}}}
    assert "status" not in kube.replace(NODES, told)  # a status goes through its subresource


def test_what_a_watch_hands_out_is_not_what_it_keeps() -> None:
    kube = FakeKube()
    start = kube.list(PODS).resource_version
    kube.create(PODS, {"metadata": {"name": "a", "labels": {"k": "v"}}, "spec": {}}, "ns")
    kube.merge_patch(PODS, "a", {"metadata": {"labels": {"k": "w"}}}, "ns")  # leaves
    kube.delete(PODS, "a", "ns")
    for event in kube.watch(PODS, start, label_selector="k=v", timeout_s=0):
        event.object["metadata"]["labels"]["k"] = "changed"
    again = [e.object["metadata"]["labels"]
             for e in kube.watch(PODS, start, label_selector="k=v", timeout_s=0)]  # fmt: skip
    assert again == [{"k": "v"}, {"k": "v"}]
    for event in kube.watch(PODS, start, timeout_s=0):
        event.object["metadata"]["labels"]["k"] = "changed"
    assert [e.object["metadata"]["labels"]["k"] for e in kube.watch(PODS, start, timeout_s=0)] == [
        "v",
        "w",
        "w",
        "w",
    ]


def test_a_status_patch_changes_the_status_only() -> None:
    kube = FakeKube()
    kube.create(PODS, _pod("a"), "ns")
    patch = {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}}
    out = kube.merge_patch(PODS, "a", patch, "ns", subresource="status")
    assert out["status"] == {"phase": "Running"} and "labels" not in out["metadata"]
    out = kube.merge_patch(PODS, "a", {"metadata": {"labels": {"x": "y"}}}, "ns", "status")
    assert "labels" not in out["metadata"]


def test_a_write_to_the_object_keeps_the_status_a_subresource_holds() -> None:
    """As the API server: for a kind with a status subresource, a patch or an update of
    the object itself leaves the stored status."""
    kube = FakeKube()
    kube.create(PODS, _pod("a"), "ns")
    kube.merge_patch(PODS, "a", {"status": {"phase": "Running"}}, "ns", subresource="status")
    out = kube.merge_patch(PODS, "a", {"metadata": {"labels": {"x": "y"}},
                                       "status": {"phase": "Failed"}}, "ns")  # fmt: skip
    assert out["status"] == {"phase": "Running"} and out["metadata"]["labels"] == {"x": "y"}
    stored = kube.get(PODS, "a", "ns")
    stored["status"] = {"phase": "Succeeded"}
    assert kube.replace(PODS, stored, "ns")["status"] == {"phase": "Running"}
    quota = {"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
             "metadata": {"name": "q"}, "spec": {"limits": []}}  # fmt: skip
    kube.create(GPUQUOTAS, quota, "ns")
    out = kube.merge_patch(GPUQUOTAS, "q", {"status": {"used": []}}, "ns")
    assert "status" not in out  # its CRD declares subresources.status


def test_a_created_object_gets_the_servers_status_and_seed_writes_the_bodys() -> None:
    """As the API server's create strategies: a Pod starts Pending and a budget with no
    status whatever the body says; a Node keeps the status kubelet creates it with.
    ``seed`` is the create and then the status write a controller would make."""
    kube = FakeKube()
    running = {**_pod("a"), "status": {"phase": "Running", "podIP": "10.0.0.1"}}
    assert kube.create(PODS, running, "ns")["status"] == {"phase": "Pending"}
    assert "status" not in kube.create(POD_DISRUPTION_BUDGETS, _budget("b", 1), "default")
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8"}}}
    assert kube.create(NODES, node)["status"] == {"allocatable": {"cpu": "8"}}
    since = kube.get(PODS, "a", "ns")["metadata"]["resourceVersion"]
    seeded = kube.seed(PODS, {**running, "metadata": {"name": "s"}}, "ns")
    assert seeded["status"] == {"phase": "Running", "podIP": "10.0.0.1"}
    events = [(e.type, e.object["status"]["phase"])
              for e in kube.watch(PODS, since, "ns", timeout_s=0)]  # fmt: skip
    assert events == [("ADDED", "Pending"), ("MODIFIED", "Running")]


def test_evict_refuses_a_pod_two_budgets_cover() -> None:
    kube = FakeKube()
    a = kube.seed(PODS, _running("a", {"app": "train"}), "default")
    kube.seed(POD_DISRUPTION_BUDGETS, _budget("one", 5), "default")
    kube.seed(POD_DISRUPTION_BUDGETS, _budget("two", 5, selector={}), "default")
    with pytest.raises(ApiError) as refused:
        kube.evict("default", "a", a["metadata"]["uid"])
    assert (refused.value.status, refused.value.reason, refused.value.message) == (
        500, "ApiError", MANY_BUDGETS  # no reason in the Status: the client's default
    )  # fmt: skip
    assert kube.get(PODS, "a", "default")["metadata"]["uid"] == a["metadata"]["uid"]


def _names(items: list[dict]) -> list[str]:
    return [o["metadata"]["name"] for o in items]


def test_a_paged_list_reads_one_snapshot_until_its_version_is_compacted() -> None:
    kube = FakeKube(history=3)
    for i in range(5):
        kube.create(PODS, _pod(f"p{i}"), "ns")
    first = kube.list(PODS, limit=2)
    kube.create(PODS, _pod("late"), "ns")  # after the snapshot: not in its pages
    second = kube.list(PODS, limit=2, continue_token=first.continue_token)
    again = kube.list(PODS, limit=2, continue_token=first.continue_token)  # tokens keep
    last = kube.list(PODS, limit=2, continue_token=second.continue_token)
    assert [_names(r.items) for r in (first, second, again, last)] == [
        ["p0", "p1"], ["p2", "p3"], ["p2", "p3"], ["p4"]]  # fmt: skip
    assert last.continue_token == "" and first.continue_token and second.continue_token
    assert {r.resource_version for r in (first, second, last)} == {first.resource_version}
    assert _names(kube.list(PODS).items) == ["p0", "p1", "p2", "p3", "p4", "late"]
    assert kube.list(PODS, limit=10).continue_token == ""  # one page: no token
    # Pages that end with the items: no token for an empty page after them.
    exact = kube.list(PODS, limit=3)
    tail = kube.list(PODS, limit=3, continue_token=exact.continue_token)
    assert (_names(tail.items), tail.continue_token) == (["p3", "p4", "late"], "")
    assert kube.list(PODS, limit=6).continue_token == ""
    for token in ("not-a-token", "x.2", "1.x", "999.0"):
        with pytest.raises(ApiError) as bad:
            kube.list(PODS, limit=2, continue_token=token)
        assert bad.value.status == 400 and "continue key is not valid" in str(bad.value)
    stale = kube.list(PODS, limit=2)
    for i in range(4):  # more changes than the history keeps
        kube.create(PODS, _pod(f"q{i}"), "ns")
    with pytest.raises(Gone):
        kube.list(PODS, limit=2, continue_token=stale.continue_token)


def test_bound_so_is_the_same_pod_on_the_same_node_with_every_annotation() -> None:
    pod = {"metadata": {"uid": "u1", "annotations": {"a": "1", "b": "2"}},
           "spec": {"nodeName": "n1"}}  # fmt: skip
    assert bound_so(pod, "u1", "n1", {"a": "1", "b": "2"})
    assert bound_so(pod, "", "n1", {"a": "1"})  # no UID given: any pod of the name
    assert not bound_so(pod, "u1", "n1", {"a": "1", "b": "3"})  # one annotation differs
    assert not bound_so(pod, "u1", "n1", {"c": "1"})
    assert not bound_so(pod, "u2", "n1", {"a": "1"})
    assert not bound_so(pod, "u1", "n2", {"a": "1"})
