from __future__ import annotations

import time

from tessera.kube.events import EventRecorder
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import EVENTS, NODES, PODS
from tessera.node.kube_source import KubeEvents, KubeNode, KubePods

RES = "tessera.io/gpu"


def pod(name: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {RES: "1"}}}],
        },
    }


def wait(pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_watches_only_this_nodes_pods_and_refreshes_on_demand() -> None:
    api = FakeKube()
    api.create(PODS, pod("a", "n1"), "default")
    api.create(PODS, pod("b", "n2"), "default")
    src = KubePods(api, "n1", RES, frozenset())
    assert src.start(5)
    try:
        assert [p.name for p in src.pods()] == ["a"]
        api.create(PODS, pod("c", "n1"), "default")
        assert wait(lambda: sorted(p.name for p in src.pods()) == ["a", "c"])
        api.delete(PODS, "a", "default")
        assert wait(lambda: [p.name for p in src.pods()] == ["c"])
        assert [p.name for p in src.refresh()] == ["c"]
    finally:
        src.stop()
        api.close()


def test_events_land_on_the_pod() -> None:
    api = FakeKube()
    created = api.create(PODS, pod("a", "n1"), "default")
    src = KubePods(api, "n1", RES, frozenset())
    info = src.refresh()[0]
    rec = EventRecorder(api, "tessera-node-agent")
    rec.start()
    KubeEvents(rec).warn(info, "TesseraAllocateFailed", "no assignment")
    rec.flush()
    rec.stop()
    (event,) = api.list(EVENTS, "default").items
    involved = event["involvedObject"]
    assert involved["uid"] == created["metadata"]["uid"]
    assert (involved["apiVersion"], involved["kind"]) == ("v1", "Pod")
    assert (involved["namespace"], involved["name"]) == ("default", "a")
    assert event["reason"] == "TesseraAllocateFailed" and event["message"] == "no assignment"


def test_the_inventory_annotation_is_read_back_as_written() -> None:
    kube = FakeKube()
    kube.create(NODES, {"metadata": {"name": "n1"}})
    node = KubeNode(kube)
    assert node.inventory_text("n1") is None  # a node the agent has not written yet
    kube.merge_patch(NODES, "n1", {"metadata": {"annotations": {"other": "x"}}})
    assert node.inventory_text("n1") is None
    node.set_inventory("n1", '{"v":1}')
    assert node.inventory_text("n1") == '{"v":1}'
    assert kube.get(NODES, "n1")["metadata"]["annotations"]["other"] == "x"


def test_pods_are_read_with_the_agents_resource_and_this_nodes_cards() -> None:
    from tessera.model import annotations as ann
    from tessera.model.types import Assignment, CardSlice, ContainerAssignment

    api = FakeKube()
    placed = pod("placed", "n1")

    def assigned(uuid: str) -> str:
        slices = (CardSlice(uuid, 1000, 10),)
        return ann.encode_assignment(Assignment("n1", (ContainerAssignment("c", slices),)))

    placed["metadata"]["annotations"] = {ann.ASSIGNMENT: assigned("GPU-here")}  # type: ignore[index]
    elsewhere = pod("elsewhere", "n1")
    elsewhere["metadata"]["annotations"] = {ann.ASSIGNMENT: assigned("GPU-gone")}  # type: ignore[index]
    for p in (placed, elsewhere, pod("unplaced", "n1")):
        api.create(PODS, p, "default")
    src = KubePods(api, "n1", RES, frozenset({"GPU-here"}))
    infos = {i.name: i for i in src.refresh()}
    assert [(c.name, c.count) for c in infos["placed"].containers] == [("c", 1)]
    assert infos["placed"].problem == ""
    assert "card(s) ['GPU-gone'] that are not on this node" in infos["elsewhere"].problem
    assert f"asks for {RES} but has no" in infos["unplaced"].problem
    other = KubePods(api, "n1", "example.com/other", frozenset({"GPU-here"}))
    assert all(i.containers == () for i in other.refresh())  # not this agent's resource
    api.close()


def test_a_deletion_of_a_pod_it_never_saw_changes_nothing() -> None:
    # After a re-list, the watch may still deliver the deletion of a pod the list missed.
    from tessera.kube.port import WatchEvent

    api = FakeKube()
    src = KubePods(api, "n1", RES, frozenset())
    src.replace([api.create(PODS, pod("a", "n1"), "default")])
    ghost = pod("ghost", "n1")
    ghost["metadata"]["uid"] = "uid-ghost"  # type: ignore[index]
    src.apply(WatchEvent("DELETED", ghost))
    assert [p.name for p in src.pods()] == ["a"]
    api.close()
