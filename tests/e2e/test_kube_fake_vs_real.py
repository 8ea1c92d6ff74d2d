"""FakeKube answers as the real API server does: the same writes, sent to both, are
taken or refused alike, refusals with the same status, reason and words (a UID that is
not the stored object's; a create with no name or a taken one; a PUT without a
resourceVersion; a PUT of a missing object; a stale write). The unit suite's fakes
stand in for the API server only as far as these hold."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tessera.kube import LEASES, NODES, PODS, ApiError, FakeKube
from tessera.kube.client import KubeClient
from tessera.kube.errors import MANY_BUDGETS
from tessera.kube.kinds import POD_DISRUPTION_BUDGETS
from tessera.model.clusterspec import synthetic_nodes
from tessera.testenv import TestEnv
from tests.e2e.wait import wait_for

pytestmark = pytest.mark.e2e

NAME = "fake-refusals"


@pytest.fixture
def api(testenv: TestEnv) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    yield client
    client.delete(PODS, NAME, "default")


def _pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod no scheduler places (kube-scheduler leaves ``schedulerName: nobody`` alone)."""
    meta: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
    containers = [{"name": "c", "image": "x"}]
    return {"metadata": meta, "spec": {"schedulerName": "nobody", "containers": containers,
                                       **spec}}  # fmt: skip


def _refusal(write: Callable[[Any], Any], kube: Any) -> tuple[int, str, str]:
    """The refusal, with the stored pod's UID (the server's own, on each) as ``<uid>``."""
    uid = kube.get(PODS, NAME, "default")["metadata"]["uid"]
    with pytest.raises(ApiError) as refused:
        write(kube)
    return refused.value.status, refused.value.reason, refused.value.message.replace(uid, "<uid>")


def test_a_write_with_another_uid_is_refused_alike(api: KubeClient) -> None:
    body = _pod(NAME)
    api.create(PODS, body, "default")
    fake = FakeKube()
    fake.create(PODS, body, "default")
    other = "0123abcd-0000-4000-8000-000000000000"  # neither's
    writes: list[Callable[[Any], Any]] = [
        # The preemptor's record: a patch's UID is a change of an immutable field (422).
        lambda kube: kube.merge_patch(PODS, NAME, {"metadata": {"uid": other}}, "default"),
        lambda kube: kube.evict("default", NAME, other),  # a victim replaced
        lambda kube: kube.bind("default", NAME, other, "node-a", {}),  # a pod replaced
    ]
    said = [_refusal(write, api) for write in writes]
    assert [_refusal(write, fake) for write in writes] == said
    assert [status for status, _, _ in said] == [422, 409, 409]


SEQUENCE = "fake-sequence"


def _outcome(write: Callable[[Any], Any], kube: Any) -> tuple[Any, ...]:
    try:
        write(kube)
    except ApiError as exc:
        return exc.status, exc.reason, exc.message
    return ("written",)


def test_writes_tessera_makes_are_answered_alike(testenv: TestEnv) -> None:
    """The same writes, in order, to the real API server and to the fake: each is taken or
    refused alike, refusals in the same words (leases named with their group, a PUT
    without a resourceVersion taken for a Pod and refused for a Lease, a PUT of a missing
    Lease creating it, a create with no name refused)."""
    api = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    pod = _pod(SEQUENCE)
    lease = {"metadata": {"name": SEQUENCE}, "spec": {"holderIdentity": "a"}}

    def unversioned(kind: Any, labels: dict[str, str]) -> Callable[[Any], Any]:
        def write(kube: Any) -> Any:
            stored = kube.get(kind, SEQUENCE, "default")
            del stored["metadata"]["resourceVersion"]
            stored["metadata"]["labels"] = labels
            return kube.replace(kind, stored, "default")

        return write

    def stale(kind: Any) -> Callable[[Any], Any]:
        def write(kube: Any) -> Any:
            stored = kube.get(kind, SEQUENCE, "default")
            kube.merge_patch(kind, SEQUENCE, {"metadata": {"labels": {"moved": "1"}}}, "default")
            return kube.replace(kind, stored, "default")

        return write

    missing = {**lease, "metadata": {"name": f"{SEQUENCE}-put", "resourceVersion": "7"}}
    writes: list[Callable[[Any], Any]] = [
        lambda kube: kube.create(PODS, pod, "default"),
        lambda kube: kube.create(PODS, pod, "default"),  # AlreadyExists
        lambda kube: kube.create(PODS, {**pod, "metadata": {}}, "default"),  # no name
        unversioned(PODS, {"a": "1"}),  # taken: a Pod updates unconditionally
        stale(PODS),
        lambda kube: kube.get(LEASES, SEQUENCE, "default"),
        lambda kube: kube.create(LEASES, lease, "default"),
        lambda kube: kube.create(LEASES, lease, "default"),
        lambda kube: kube.create(LEASES, {"spec": {}}, "default"),
        unversioned(LEASES, {"a": "1"}),  # refused: a Lease's update is conditional
        stale(LEASES),
        lambda kube: kube.replace(LEASES, missing, "default"),  # created
        lambda kube: kube.replace(PODS, {**pod, "metadata": missing["metadata"]}, "default"),
        lambda kube: kube.delete(LEASES, "nothing", "default"),
    ]
    try:
        said = [_outcome(write, api) for write in writes]
        fake = FakeKube()
        assert [_outcome(write, fake) for write in writes] == said
    finally:
        for kind, name in ((PODS, SEQUENCE), (LEASES, SEQUENCE), (LEASES, f"{SEQUENCE}-put")):
            with contextlib.suppress(ApiError):
                api.delete(kind, name, "default")
    assert [s[0] for s in said] == [
        "written", 409, 422, "written", 409, 404, "written", 409, 422, 422, 409, "written",
        404, 404,
    ]  # fmt: skip


WATCHED = "fake-watched"


def _watched(kube: Any) -> list[tuple[str, str, Any]]:
    """A pod comes into a label selection, changes, leaves it, comes back and is
    deleted; another is bound: what a label-selected and a node-selected watch see."""
    start = kube.list(PODS, "default").resource_version
    pod = _pod(WATCHED)
    kube.create(PODS, pod, "default")
    for patch in ({"labels": {"k": "v"}}, {"annotations": {"n": "1"}}, {"labels": {"k": "w"}},
                  {"annotations": {"n": "2"}}, {"labels": {"k": "v"}}):  # fmt: skip
        kube.merge_patch(PODS, WATCHED, {"metadata": patch}, "default")
    kube.delete(PODS, WATCHED, "default")  # unbound: gone at once
    kube.create(PODS, _pod(f"{WATCHED}-b"), "default")
    kube.bind("default", f"{WATCHED}-b", "", f"{WATCHED}-node", {})

    def seen(**selector: str) -> list[tuple[str, str, Any]]:
        events = kube.watch(PODS, start, "default", timeout_s=3, **selector)
        return [(e.type, e.object["metadata"]["name"], e.object["metadata"].get("labels"))
                for e in events if e.type != "BOOKMARK"]  # fmt: skip

    return seen(label_selector="k=v") + seen(field_selector=f"spec.nodeName={WATCHED}-node")


def test_a_watch_with_a_selector_sees_what_the_api_server_sends(testenv: TestEnv) -> None:
    """An object coming into a selection is ADDED, leaving it DELETED, on both; a pod's
    deletion is a MODIFIED (terminating) before its DELETED."""
    api = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    try:
        said = _watched(api)
    finally:
        for name in (WATCHED, f"{WATCHED}-b"):  # the bound one: podgc ends it (no node)
            with contextlib.suppress(ApiError):
                api.delete(PODS, name, "default")
    assert _watched(FakeKube()) == said
    assert [(t, n) for t, n, _ in said] == [
        ("ADDED", WATCHED), ("MODIFIED", WATCHED), ("DELETED", WATCHED), ("ADDED", WATCHED),
        ("MODIFIED", WATCHED), ("DELETED", WATCHED), ("ADDED", f"{WATCHED}-b"),
    ]  # fmt: skip


def test_evictions_under_budgets_are_answered_alike(testenv: TestEnv) -> None:
    """Pods kwok runs, a budget its controller counted: the fake, given the same pods and
    budget status, lets the same eviction go and refuses the next two in the same words
    (the budget spent: 429; a second budget over the pod: the 500 the preemptor must
    read as a refusal, not as a write that may have landed)."""
    api = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    (inv,) = synthetic_nodes(1, 0, "A100", prefix="budgets")
    testenv.create_gpu_nodes([inv])
    names = [f"budgeted-{i}" for i in range(3)]
    budget = {
        "metadata": {"name": "budgeted"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "budgeted"}}},
    }
    second = {
        "metadata": {"name": "budgeted-too"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "budgeted"}}},
    }

    def evict(name: str) -> Callable[[Any], Any]:
        return lambda kube: kube.evict("default", name, kube.get(PODS, name, "default")
                                       ["metadata"]["uid"])  # fmt: skip

    writes = [evict(names[0]), evict(names[1]),
              lambda kube: kube.create(POD_DISRUPTION_BUDGETS, second, "default"),
              evict(names[2])]  # fmt: skip
    try:
        for name in names:
            on_node = _pod(name, {"app": "budgeted"}, nodeName=inv.name,
                           tolerations=[{"operator": "Exists"}])  # fmt: skip
            api.create(PODS, on_node, "default")
        wait_for("kwok runs the pods",
                 lambda: all(_ready(api.get(PODS, n, "default")) for n in names))  # fmt: skip
        api.create(POD_DISRUPTION_BUDGETS, budget, "default")
        counted = wait_for("the disruption controller counts the budget",
                           lambda: _counted(api.get(POD_DISRUPTION_BUDGETS, "budgeted",
                                                    "default")))  # fmt: skip
        fake = FakeKube()
        for name in names:
            fake.seed(PODS, api.get(PODS, name, "default"), "default")
        fake.seed(POD_DISRUPTION_BUDGETS, counted, "default")
        said = [_outcome(write, api) for write in writes]
    finally:
        for kind, name in [(POD_DISRUPTION_BUDGETS, "budgeted"),
                           (POD_DISRUPTION_BUDGETS, "budgeted-too"),
                           *[(PODS, n) for n in names], (NODES, inv.name)]:  # fmt: skip
            with contextlib.suppress(ApiError):
                api.delete(kind, name, "default" if kind.namespaced else None)
    assert [_outcome(write, fake) for write in writes] == said
    assert said == [("written",), (429, "TooManyRequests", "Cannot evict pod as it would "
                    "violate the pod's disruption budget."), ("written",),
                    (500, "ApiError", MANY_BUDGETS)]  # fmt: skip


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _counted(budget: dict[str, Any]) -> dict[str, Any] | None:
    status = budget.get("status") or {}
    ok = status.get("observedGeneration") == 1 and status.get("disruptionsAllowed") == 1
    return budget if ok else None
