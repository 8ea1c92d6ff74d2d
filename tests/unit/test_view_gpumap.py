"""The GPU map from API objects: holders per card, pending pods, and every problem kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera.claims.devices import DRIVER, resource_slice
from tessera.model.annotations import ASSIGNMENT, INVENTORY, encode_assignment
from tessera.model.clusterspec import make_cards
from tessera.model.names import ResourceNames
from tessera.model.podspec import Compat
from tessera.model.types import Assignment, CardSlice, ComputePolicy, ContainerAssignment
from tessera.view.gpumap import build_map, map_json, unassigned
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


def _shape(value: Any) -> Any:
    """Keys in order and value types, the first item standing for a list's."""
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _documented_map() -> Any:
    text = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    section = text.split("## The GPU map", 1)[1]
    return json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])


def test_the_map_json_is_the_documented_document() -> None:
    """`/gpus.json` and `kubectl tessera top -o json` read these keys: compared with the
    example in docs/protocol.md, key by key and in order, and one card value by value."""
    [card] = make_cards("gpu-000", 1, "A100")
    train = bound("train", "gpu-000", [(card.uuid, 12000, 30)], ns="view")
    a = Assignment("gpu-000", (ContainerAssignment(
        "main", (CardSlice(card.uuid, 12000, 30),), ComputePolicy.FIXED_SHARE),))  # fmt: skip
    train["metadata"]["annotations"][ASSIGNMENT] = encode_assignment(a)
    waits = pod_obj("waits", gpu=1, memory=8000, cores=10, ns="view")
    stray = pod_obj("stray", gpu=1, memory=1000, ns="ns")
    stray["spec"]["nodeName"] = "gpu-000"
    broken = resource_slice("gpu-001", make_cards("gpu-001", 1, "T4"), generation=1)
    del broken["spec"]["devices"][0]["attributes"]["uuid"]
    m = build_map([node_obj("gpu-000", 1)], [train, waits, stray], slices=[broken])
    out = map_json(m)
    assert _shape(out) == _shape(_documented_map())
    assert out["nodes"][0]["cards"] == [{
        "node": "gpu-000", "index": 0, "uuid": card.uuid, "model": "A100", "healthy": True,
        "cordoned": False, "memoryMiB": card.memory_mib, "allocatedMiB": 12000,
        "allocatedCoresPercent": 30, "slots": card.slots,
        "holders": [{"namespace": "view", "pod": "train", "container": "main",
                     "memoryMiB": 12000, "coresPercent": 30, "policy": "fixed-share",
                     "exclusive": False, "claim": ""}]}]  # fmt: skip
    assert out["pending"] == [{"namespace": "view", "pod": "waits",
                               "asks": "main: 1 card 8000 MiB 10%"}]  # fmt: skip
    assert out["podProblems"] == [{"pod": "ns/stray", "problem": unassigned("gpu-000")}]
    [claim_problem] = out["claimProblems"]
    assert claim_problem["object"] == f"ResourceSlice {broken['metadata']['name']}"
    assert unassigned("n1", undecoded=True) == (
        "bound to n1, its tessera.io/assignment annotation does not decode (the scheduler's "
        "log says why): its cards are not known"
    )


def test_what_a_pod_asks_names_each_gpu_container() -> None:
    asks = pod_obj("asks")
    limits = {"a": {"tessera.io/gpu": "2", "tessera.io/gpu-memory": "1000",
                    "tessera.io/gpu-cores": "10"},
              "b": {"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "25",
                    "tessera.io/gpu-cores": "20"},
              "c": {"tessera.io/gpu": "1"}}  # fmt: skip
    asks["spec"]["containers"] = [{"name": "side", "image": "x"}] + [
        {"name": n, "image": "x", "resources": {"limits": lim}} for n, lim in limits.items()
    ]
    [pending] = build_map([node_obj("a")], [asks]).pending
    assert pending.summary == "a: 2 cards 1000 MiB 10%, b: 1 card memory share 20%, c: 1 card whole"


def test_the_map_reads_past_what_is_not_a_gpu_node_or_does_not_decode() -> None:
    nameless = node_obj("x")
    del nameless["metadata"]["name"]
    numbered = node_obj("n")
    numbered["metadata"]["annotations"][INVENTORY] = 5  # not text: not an inventory
    broken = node_obj("c")
    broken["metadata"]["annotations"][INVENTORY] = '{"v": 9}'
    m = build_map([{"metadata": {"name": "cpu-only"}}, nameless, numbered, node_obj("a", 1),
                   broken], [])  # fmt: skip
    assert [(n.name, n.problem) for n in m.nodes] == [
        ("a", ""),
        ("c", "inventory refused: node c: annotation tessera.io/inventory: unknown version 9; "
              "this Tessera reads v1"),
    ]  # fmt: skip
    garbled = pod_obj("garbled", annotations={ASSIGNMENT: "{oops"})
    garbled["spec"]["nodeName"] = "a"
    [(_, why)] = build_map([node_obj("a")], [garbled]).problems
    assert why.startswith("pod default/garbled: annotation tessera.io/assignment: not valid JSON")


def test_claims_path_slices_add_up_and_a_bad_slice_or_pool_does_not_hide_the_rest() -> None:
    d = make_cards("d", 2, "H100")
    broken = resource_slice("e", make_cards("e", 1, "T4"), generation=1)
    del broken["spec"]["devices"][0]["attributes"]["uuid"]
    # Node d publishes its cards in two slices; the broken one comes first.
    slices = [broken, resource_slice("d", d[:1], generation=1),
              resource_slice("d", d[1:], generation=1)]  # fmt: skip
    # A claim allocated on two pools: one whose slice is gone ("b" sorts first), and d.
    split = _claim("split", "d", "gpu-1", memory="1Gi")
    results = split["status"]["allocation"]["devices"]["results"]
    results.insert(0, {**results[0], "pool": "b", "device": "gpu-0"})
    m = build_map([], [], slices=slices, claims=[split])
    [node] = m.nodes
    assert [c.uuid for c in node.cards] == [d[0].uuid, d[1].uuid]
    assert [h.claim for h in node.cards[1].holders] == ["split"]
    assert {key for key, _ in m.claim_problems} == {
        f"ResourceSlice {broken['metadata']['name']}", "ResourceClaim team/split"}  # fmt: skip


def test_a_pending_pod_is_read_with_the_schedulers_names_and_compat() -> None:
    names = ResourceNames(gpu="example.com/gpu", memory="example.com/gpu-memory",
                          memory_percent="example.com/gpu-memory-percent",
                          cores="example.com/gpu-cores")  # fmt: skip
    renamed = pod_obj("renamed")
    renamed["spec"]["containers"][0]["resources"]["limits"] = {
        "example.com/gpu": "1", "example.com/gpu-memory": "1000"}  # fmt: skip
    hami = pod_obj("hami")
    hami["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}  # fmt: skip
    m = build_map([node_obj("a")], [renamed, hami], names=names, compat=Compat(hami=True))
    assert [(p.pod, p.summary) for p in m.pending] == [
        ("hami", "main: 1 card 2000 MiB 0%"), ("renamed", "main: 1 card 1000 MiB 0%")]  # fmt: skip
