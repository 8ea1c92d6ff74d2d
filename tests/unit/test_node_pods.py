from __future__ import annotations

from typing import Any

from tessera.model import annotations
from tessera.model.annotations import encode_assignment
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.node.pods import GpuContainer, pod_info

RES = "tessera.io/gpu"
A, B = "GPU-a", "GPU-b"
CARDS = frozenset({A, B})


def pod(annotation: str | None, node: str = "n1", phase: str = "Pending") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "p",
        "namespace": "ns",
        "uid": "u1",
        "creationTimestamp": "2026-11-21T10:00:00Z",
    }
    if annotation is not None:
        meta["annotations"] = {annotations.ASSIGNMENT: annotation}
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": "init", "resources": {"limits": {RES: "1"}}}],
            "containers": [
                {"name": "cpu-only", "resources": {"limits": {"cpu": "1"}}},
                {"name": "main", "resources": {"requests": {RES: "2"}, "limits": {RES: "2"}}},
            ],
        },
        "status": {"phase": phase},
    }


def assignment(node: str = "n1", main: tuple[str, ...] = (A, B)) -> str:
    return encode_assignment(
        Assignment(
            node=node,
            containers=(
                ContainerAssignment("init", (CardSlice(A, 100, 10),), init=True),
                ContainerAssignment("main", tuple(CardSlice(u, 200, 20) for u in main)),
            ),
        )
    )


def test_gpu_containers_in_kubelet_order_and_a_usable_assignment() -> None:
    p = pod_info(pod(assignment()), RES, CARDS)
    assert p.containers == (GpuContainer("init", True, 1), GpuContainer("main", False, 2))
    assert p.problem == "" and p.key == "ns/p" and not p.terminal
    main = p.container("main")
    assert main is not None and [s.uuid for s in main.slices] == [A, B]


def test_problems_name_the_pod_and_the_rule() -> None:
    assert pod_info(pod(None), RES, CARDS).problem == (
        "pod ns/p asks for tessera.io/gpu but has no tessera.io/assignment annotation: "
        "it was not placed by the Tessera scheduler"
    )
    assert pod_info(pod("{"), RES, CARDS).problem.startswith(
        "pod ns/p: annotation tessera.io/assignment: not valid JSON: "
    )
    what = "pod ns/p: annotation tessera.io/assignment"
    assert pod_info(pod(assignment(node="n2")), RES, CARDS).problem == (
        f"{what} is stale: it places the pod on node n2, but it is bound to n1"
    )
    assert pod_info(pod(assignment(main=(A, "GPU-c"))), RES, CARDS).problem == (
        f"{what} is stale: container 'main' is assigned card(s) ['GPU-c'] that are not on this node"
    )
    assert pod_info(pod(assignment(main=(A,))), RES, CARDS).problem == (
        f"{what} gives container 'main' 1 card(s), but it asks for 2"
    )


def test_a_pod_asking_no_card_and_carrying_no_assignment_has_no_problem() -> None:
    obj = pod(None)
    obj["spec"]["initContainers"] = []
    obj["spec"]["containers"] = [{"name": "cpu-only", "resources": {"limits": {"cpu": "1"}}}]
    info = pod_info(obj, RES, CARDS)
    assert (info.containers, info.assignment, info.problem) == ((), None, "")


def test_what_the_pod_says_of_itself_is_kept_and_what_it_leaves_out_reads_as_empty() -> None:
    info = pod_info(pod(assignment()), RES, CARDS)
    assert (info.uid, info.created, info.node) == ("u1", "2026-11-21T10:00:00Z", "n1")
    bare = pod_info({"spec": {"containers": [{"resources": {"limits": {RES: "1"}}}]}}, RES, CARDS)
    assert (bare.uid, bare.namespace, bare.name, bare.node, bare.created) == (
        "", "default", "", "", ""
    )  # fmt: skip
    assert bare.containers == (GpuContainer("", False, 1),)
    assert bare.problem.startswith("pod default/ asks for tessera.io/gpu but has no ")


def test_an_unbound_pod_is_not_called_stale_for_its_node() -> None:
    info = pod_info(pod(assignment(node="n2"), node=""), RES, CARDS)
    assert (info.node, info.problem) == ("", "")


def test_a_card_count_in_requests_alone_counts_and_one_that_is_not_a_number_does_not() -> None:
    obj = pod(None)
    obj["spec"]["initContainers"] = []
    obj["spec"]["containers"] = [
        {"name": "asks", "resources": {"requests": {RES: "3"}}},
        {"name": "garbled", "resources": {"limits": {RES: "one"}}},
        {"name": "half", "resources": {"limits": {RES: "1.5"}}},
    ]
    assert pod_info(obj, RES, CARDS).containers == (GpuContainer("asks", False, 3),)


def test_terminal_pods_are_marked() -> None:
    assert pod_info(pod(assignment(), phase="Succeeded"), RES, CARDS).terminal
    assert pod_info(pod(assignment(), phase="Failed"), RES, CARDS).terminal
    assert not pod_info(pod(assignment(), phase="Running"), RES, CARDS).terminal


def test_the_claims_each_container_uses_are_resolved_to_resource_claim_names() -> None:
    obj = pod(None)
    obj["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "tmpl"},  # its claim is in the status
        {"name": "shared", "resourceClaimName": "team-gpu"},
        {"name": "pending", "resourceClaimTemplateName": "tmpl"},  # not made yet
    ]
    obj["spec"]["initContainers"][0]["resources"]["claims"] = [{"name": "shared"}]
    obj["spec"]["containers"][0]["resources"]["claims"] = [
        {"name": "gpu"}, {"name": "shared"}, {"name": "pending"}
    ]  # fmt: skip
    obj["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-7x"}]}
    info = pod_info(obj, RES, CARDS)
    assert info.claims == ("p-gpu-7x", "team-gpu")
    assert info.container_claims == (
        ("init", ("team-gpu",)),
        ("cpu-only", ("p-gpu-7x", "team-gpu")),
    )
    assert pod_info(pod(None), RES, CARDS).container_claims == ()
    del obj["spec"]["initContainers"][0]["name"]
    assert pod_info(obj, RES, CARDS).container_claims[0] == ("", ("team-gpu",))


def test_a_container_without_resources_is_not_a_gpu_container() -> None:
    obj = pod(assignment())
    obj["spec"]["containers"].insert(0, {"name": "sidecar", "image": "x"})
    p = pod_info(obj, RES, CARDS)
    assert [c.name for c in p.containers] == ["init", "main"]
    assert p.problem == ""


def test_started_containers_are_known_by_their_runtime_id() -> None:
    # What the backstop maps a process's container to; a container not started yet has
    # no ID, and a status without a name is not one kubelet writes.
    obj = pod(assignment())
    obj["status"] = {
        "phase": "Running",
        "initContainerStatuses": [{"name": "init", "containerID": "containerd://i0"}],
        "containerStatuses": [
            {"name": "main", "containerID": "containerd://m1"},
            {"name": "cpu-only", "containerID": ""},
            {"containerID": "containerd://x9"},
        ],
    }
    assert pod_info(obj, RES, CARDS).container_ids == (("i0", "init"), ("m1", "main"))
