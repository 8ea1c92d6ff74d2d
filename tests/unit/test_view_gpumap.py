"""The GPU map from API objects: holders per card, pending pods, and every problem kept."""

from __future__ import annotations

from typing import Any

from tessera.claims.devices import DRIVER, resource_slice
from tessera.model.annotations import ASSIGNMENT, INVENTORY, encode_assignment
from tessera.model.clusterspec import make_cards
from tessera.model.types import Assignment, CardSlice, ComputePolicy, ContainerAssignment
from tessera.view.gpumap import build_map
from tests.unit._scheduler_world import node_obj, pod_obj

A = make_cards("a", 2, "A100")
B = make_cards("b", 1, "T4")


def bound(name: str, node: str, slices: list[tuple[str, int, int]], ns: str = "team",
          phase: str = "Running", exclusive: bool = False) -> dict[str, Any]:  # fmt: skip
    a = Assignment(node, (ContainerAssignment(
        "main", tuple(CardSlice(u, m, c) for u, m, c in slices),
        ComputePolicy.BURST_SHARE, exclusive=exclusive),))  # fmt: skip
    p = pod_obj(name, gpu=1, memory=1000, ns=ns, annotations={ASSIGNMENT: encode_assignment(a)})
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": phase}
    return p


def test_holders_pending_and_problems_each_in_their_place() -> None:
    broken = node_obj("c")
    broken["metadata"]["annotations"][INVENTORY] = '{"v": 9}'
    plain = {"metadata": {"name": "cpu-only"}}  # no inventory: not a GPU node, not a problem
    pods = [
        bound("p1", "a", [(A[0].uuid, 8000, 30)]),
        bound("p2", "a", [(A[0].uuid, 4000, 20)], ns="other"),
        bound("whole", "b", [(B[0].uuid, 16384, 100)], exclusive=True),
        bound("done", "a", [(A[1].uuid, 1000, 10)], phase="Succeeded"),  # holds nothing now
        bound("moved", "b", [(A[1].uuid, 1000, 10)]),  # names node a's card, bound to b
        bound("elsewhere", "b", [(B[0].uuid, 1000, 10)]) | {"spec": {"nodeName": "a"}},
        pod_obj("waiting", gpu=1, memory=2000, cores=10),
        pod_obj("cpu", gpu=None),  # asks nothing of Tessera: not listed as pending
    ]
    garbled = pod_obj("garbled", annotations={ASSIGNMENT: "{oops"})
    garbled["spec"]["nodeName"] = "a"
    pods.append(garbled)
    stray = pod_obj("stray", gpu=1, memory=1000, ns="ops")  # nodeName set by hand
    stray["spec"]["nodeName"] = "a"
    unsound = pod_obj("unsound", gpu=1, memory=2000, cores=150, ns="ops")  # invalid, bound
    unsound["spec"]["nodeName"] = "b"
    placed_cpu = pod_obj("placed-cpu", gpu=None)
    placed_cpu["spec"]["nodeName"] = "a"  # bound, asks nothing of Tessera: no problem
    pods += [stray, unsound, placed_cpu]
    m = build_map([node_obj("a", 2), node_obj("b", 1, "T4"), broken, plain], pods)

    assert [n.name for n in m.nodes] == ["a", "b", "c"]
    assert m.nodes[2].cards == () and "inventory refused" in m.nodes[2].problem
    card0 = m.nodes[0].cards[0]
    assert [(h.pod_key, h.memory_mib, h.cores_percent) for h in card0.holders] == [
        ("other/p2", 4000, 20), ("team/p1", 8000, 30)]  # fmt: skip
    assert card0.allocated_mib == 12000 and card0.allocated_cores == 50
    assert card0.holders[0].policy == "burst-share"
    assert m.nodes[0].cards[1].holders == ()  # the finished pod's card is free
    [whole] = m.nodes[1].cards[0].holders
    assert whole.exclusive and whole.pod_key == "team/whole"
    problems = dict(m.problems)
    assert set(problems) == {
        "team/moved", "team/elsewhere", "default/garbled", "ops/stray", "ops/unsound"}  # fmt: skip
    assert problems["ops/stray"] == (
        "bound to a without a tessera.io/assignment annotation: its cards are not known"
    )
    assert problems["ops/unsound"].startswith("bound to b without a tessera.io/assignment")
    assert "does not have" in problems["team/moved"] and A[1].uuid in problems["team/moved"]
    assert "names node b, the pod is bound to a" in problems["team/elsewhere"]
    assert "not valid JSON" in problems["default/garbled"]
    assert [(p.namespace, p.pod, p.summary) for p in m.pending] == [
        ("default", "waiting", "main: 1 card 2000 MiB 10%")]  # fmt: skip
    assert set(m.assignments) == {"team/p1", "other/p2", "team/whole"}
    assert m.card(B[0].uuid) is not None and m.card("GPU-nope") is None


def test_a_pending_pod_with_an_invalid_spec_says_so() -> None:
    bad = pod_obj("bad", gpu=1, memory=2000, cores=150)
    m = build_map([node_obj("a")], [bad])
    [p] = m.pending
    assert p.summary.startswith("invalid: ") and "gpu-cores" in p.summary


def _claim(name: str, node: str, device: str, reserved: list[str] | None = None,
           **consumed: str) -> dict[str, Any]:  # fmt: skip
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    if consumed:
        result["consumedCapacity"] = consumed
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]}}}
    if reserved is not None:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in reserved]
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "status": status}  # fmt: skip


def test_cards_on_the_claims_path_are_drawn_with_their_claims() -> None:
    # Node a: card 0 on the extender path (inventory), card 1 on claims (its slice).
    extender = node_obj("a", 2)
    extender["metadata"]["annotations"][INVENTORY] = node_obj("a", 1)["metadata"]["annotations"][
        INVENTORY
    ]
    slices = [
        resource_slice("a", [A[1]], generation=1),
        resource_slice("d", make_cards("d", 1, "H100"), generation=1),  # claims only
        {"spec": {"driver": "other.example.com", "nodeName": "a", "devices": [{}]}},  # not ours
    ]
    broken = resource_slice("e", make_cards("e", 1, "T4"), generation=1)
    del broken["spec"]["devices"][0]["attributes"]["uuid"]
    broken["metadata"]["name"] = "gpu.tessera.io-e"
    slices.append(broken)
    shared = _claim("shared", "a", "gpu-1", reserved=["p1", "p2"], memory="8Gi", compute="30")
    # Another kind of consumer beside the pods is not a pod of the claim.
    shared["status"]["reservedFor"].append({"resource": "jobs", "name": "j1", "uid": "u-j1"})
    claims = [
        shared,
        _claim("idle", "a", "gpu-1", memory="2Gi"),  # allocated, no pod yet
        _claim("whole", "d", "gpu-0"),  # no capacity: the whole card
        {"metadata": {"name": "pending", "namespace": "team"}, "status": {}},  # not allocated
        _claim("lost", "a", "gpu-7", memory="1Gi"),  # a device the slice does not have
    ]
    pods = [bound("p0", "a", [(A[0].uuid, 1000, 10)])]
    m = build_map([extender], pods, slices=slices, claims=claims)

    assert [n.name for n in m.nodes] == ["a", "d"]
    a0, a1 = m.nodes[0].cards
    assert (a0.uuid, [h.pod_key for h in a0.holders]) == (A[0].uuid, ["team/p0"])
    assert a1.uuid == A[1].uuid
    holders = [(h.claim, h.pod, h.container, h.memory_mib, h.cores_percent, h.policy)
               for h in a1.holders]  # fmt: skip
    assert holders == [
        ("idle", "", "", 2048, 0, "fixed-share"),
        ("shared", "p1,p2", "", 8192, 30, "fixed-share"),
    ]
    assert a1.allocated_mib == 10240
    [whole] = m.nodes[1].cards[0].holders
    assert whole.claim == "whole" and whole.exclusive and whole.memory_mib == 81920
    problems = dict(m.claim_problems)
    assert set(problems) == {"ResourceSlice gpu.tessera.io-e", "ResourceClaim team/lost"}
    assert "attributes.uuid: is missing" in problems["ResourceSlice gpu.tessera.io-e"]
    assert "must be a card this node offers (gpu-1)" in problems["ResourceClaim team/lost"]
