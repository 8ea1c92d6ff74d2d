"""The allocator on its own: what each device-plugin call refuses, with which gRPC status
and message, and what it leaves in the ledger and on disk.

The integration suite drives the same code over the real v1beta1 protocol; this one
reaches the paths a kubelet seldom takes (a card with no free slot, a limits file that
cannot be written, kubelet naming a pod the agent cannot use). Real Layout (a temporary
folder) and Ledger; pods and pod-resources are the small doubles of the matcher's tests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.model.clusterspec import make_cards
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.node.allocation.allocator import Allocator
from tessera.node.allocation.errors import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    NOT_FOUND,
    AllocationError,
)
from tessera.node.fakes import MemoryEvents
from tessera.node.formats.layout import Layout
from tessera.node.formats.limits import decode_limits
from tessera.node.isolation import Visibility
from tessera.node.kubelet.slots import slot_id
from tessera.node.pods import GpuContainer, PodInfo
from tests.unit._clock import Clock
from tests.unit._node_doubles import Kubelet, Pods

NODE = "gpu-1"
CARDS = make_cards(NODE, 2, "A100")
A, B = CARDS[0].uuid, CARDS[1].uuid
SLOTS = 16


def pod(
    uid: str, slices: dict[str, tuple[CardSlice, ...]], created: str = "2026-11-29T00:00:01Z"
) -> PodInfo:
    """Pod ``pod-UID`` on NODE whose containers (in order) hold ``slices``."""
    containers = tuple(GpuContainer(name, False, len(s)) for name, s in slices.items())
    assignment = Assignment(NODE, tuple(ContainerAssignment(name, s) for name, s in slices.items()))
    return PodInfo(uid, "ns", f"pod-{uid}", NODE, created, containers, assignment)


def one_card(uid: str, uuid: str = A, memory_mib: int = 4000) -> PodInfo:
    return pod(uid, {"main": (CardSlice(uuid, memory_mib, 20),)})


def allocator(
    tmp_path: Path,
    pods: Pods,
    kubelet: Kubelet | None = None,
    clock: Callable[[], float] | None = None,
    visibility: Visibility = Visibility.ENV,
) -> Allocator:
    layout = Layout(tmp_path)
    return Allocator(NODE, CARDS, SLOTS, layout, "v1", pods, kubelet, MemoryEvents(),
                     visibility=visibility, clock=clock or Clock())  # fmt: skip


def refused(call: object, *args: object) -> AllocationError:
    with pytest.raises(AllocationError) as err:
        call(*args)  # type: ignore[operator]
    return err.value


# --- what kubelet sends that no call accepts ---------------------------------------------


def test_two_slots_of_one_card_are_refused_naming_both(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, Pods([one_card("x")]))
    err = refused(alloc.allocate, [slot_id(A, 0), slot_id(A, 3)])
    assert err.code == INVALID_ARGUMENT
    assert err.message == (
        f"device IDs {A}::0 and {A}::3 are slots of the same card; "
        "a container gets at most one slot per card"
    )
    assert alloc.allocations() == []


def test_every_unknown_device_id_is_named_with_the_ids_the_node_advertises(
    tmp_path: Path,
) -> None:
    alloc = allocator(tmp_path, Pods([one_card("x")]))
    bad = ["junk", f"{A}::{SLOTS}", "GPU-00000000-0000-0000-0000-000000000000::0"]
    err = refused(alloc.allocate, [slot_id(B, 1), *bad])
    assert err.code == INVALID_ARGUMENT
    assert err.message == (
        f"unknown device ID(s) {bad}: node {NODE} advertises "
        f"<card-uuid>::<0..{SLOTS - 1}> for its 2 card(s)"
    )
    assert refused(alloc.pre_start, ["junk"]).code == INVALID_ARGUMENT
    assert refused(alloc.preferred, [slot_id(A, 0)], ["junk"], 1).code == INVALID_ARGUMENT


def test_allocate_with_no_device_ids_is_refused(tmp_path: Path) -> None:
    err = refused(allocator(tmp_path, Pods([one_card("x")])).allocate, [])
    assert (err.code, err.message) == (INVALID_ARGUMENT, "Allocate with no device IDs")


def test_a_preference_over_an_id_that_is_not_a_slot_is_refused(tmp_path: Path) -> None:
    err = refused(allocator(tmp_path, Pods([one_card("x")])).preferred, ["junk"], [], 1)
    assert (err.code, err.message) == (INVALID_ARGUMENT, "unknown device ID 'junk'")


def test_prestart_for_slots_no_allocation_holds_is_not_found(tmp_path: Path) -> None:
    ids = [slot_id(B, 2), slot_id(A, 1)]
    err = refused(allocator(tmp_path, Pods([])).pre_start, ids)
    assert err.code == NOT_FOUND
    assert err.message == f"PreStartContainer: no allocation holds device IDs {sorted(ids)}"


# --- GetPreferredAllocation --------------------------------------------------------------


def test_the_preference_is_the_lowest_numbered_free_slot(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, Pods([one_card("x")]))
    free = [slot_id(A, 10), slot_id(A, 2), slot_id(B, 0), slot_id(A, 11)]
    assert alloc.preferred(free, [], 1) == [slot_id(A, 2)]  # 2 before 10, as numbers


def test_an_assigned_card_without_a_free_slot_is_named_with_why(tmp_path: Path) -> None:
    x = one_card("x")
    err = refused(allocator(tmp_path, Pods([x])).preferred, [slot_id(B, 0)], [], 1)
    assert err.code == FAILED_PRECONDITION
    assert err.message == (
        f"container 'main' of pod ns/pod-x is assigned card {A}, which has no free slot "
        "(unhealthy or all its slots are in use)"
    )
    assert err.pod is x  # the pod gets the Warning Event
    # An assignment naming a card this node does not have says so instead.
    gone = one_card("y", uuid="GPU-99999999-0000-0000-0000-000000000000")
    err = refused(allocator(tmp_path, Pods([gone])).preferred, [slot_id(A, 0)], [], 1)
    assert err.message.endswith("which has no free slot (not on this node)")


def test_a_preference_kubelet_never_follows_is_forgotten_after_the_grace(
    tmp_path: Path,
) -> None:
    clock = Clock()
    alloc = allocator(tmp_path, Pods([one_card("x")]), clock=clock)
    chosen = alloc.preferred([slot_id(A, 0)], [], 1)
    key = frozenset(chosen)
    clock.now += 60.0
    alloc.cleanup(60.0)
    assert alloc.ledger.take_reservation(key) == ("x", "main")  # not older than the grace
    alloc.preferred([slot_id(A, 0)], [], 1)
    clock.now += 60.5
    alloc.cleanup(60.0)
    assert alloc.ledger.take_reservation(key) is None


# --- Allocate ----------------------------------------------------------------------------


def test_slots_of_a_gone_container_go_to_the_new_one_with_its_own_folder(
    tmp_path: Path,
) -> None:
    pods = Pods([one_card("old", memory_mib=1000)])
    alloc = allocator(tmp_path, pods, Kubelet(pods={("ns", "pod-old")}))
    first, _ = alloc.allocate([slot_id(A, 0)])
    # The pod ends and a new one is given its slot before cleanup runs.
    pods.cached = [one_card("new", memory_mib=3000)]
    alloc.podres = alloc.matcher.podres = Kubelet(pods={("ns", "pod-new")})
    second, edits = alloc.allocate([slot_id(A, 0)])
    assert (second.pod, second.alloc_id != first.alloc_id) == ("pod-new", True)
    assert alloc.ledger.holder_of(frozenset({slot_id(A, 0)})) == second
    limits = decode_limits(alloc.layout.limits_path(second.alloc_id).read_text())
    assert [c.memory_mib for c in limits.cards] == [3000]
    assert edits.envs["TESSERA_ALLOC_ID"] == second.alloc_id


def test_allocate_again_for_a_live_container_gets_the_same_folder(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, Pods([one_card("x")]))
    first, edits = alloc.allocate([slot_id(A, 0)])
    assert alloc.allocate([slot_id(A, 0)]) == (first, edits)
    assert len(alloc.allocations()) == 1


def test_allocate_again_for_a_pod_whose_assignment_went_bad_is_refused(
    tmp_path: Path,
) -> None:
    x = one_card("x")
    pods = Pods([x])
    alloc = allocator(tmp_path, pods)
    alloc.allocate([slot_id(A, 0)])
    pods.cached = [PodInfo(x.uid, x.namespace, x.name, NODE, x.created, x.containers, None,
                           problem="assignment removed")]  # fmt: skip
    err = refused(alloc.allocate, [slot_id(A, 0)])
    assert err.code == FAILED_PRECONDITION
    assert err.message == (
        f"Allocate {[slot_id(A, 0)]} again: pod ns/pod-x has no usable assignment on node {NODE}"
    )


def test_a_limits_file_that_cannot_be_written_refuses_and_frees_the_container(
    tmp_path: Path,
) -> None:
    bad = one_card("x", memory_mib=0)  # a slice the limits file cannot carry
    pods = Pods([bad])
    alloc = allocator(tmp_path, pods)
    err = refused(alloc.allocate, [slot_id(A, 0)])
    assert err.code == FAILED_PRECONDITION
    assert err.message.startswith("pod ns/pod-x: ") and "memory_mib: must be >= 1" in err.message
    assert err.pod is bad
    assert (alloc.allocations(), alloc.layout.alloc_ids()) == ([], [])
    # The container was not kept claimed: once its assignment is fixed it is matched.
    pods.cached = [one_card("x", memory_mib=2000)]
    rec, _ = alloc.allocate([slot_id(A, 0)])
    assert (rec.pod, rec.container) == ("pod-x", "main")


def test_cdi_visibility_names_the_cards_as_cdi_devices(tmp_path: Path) -> None:
    x = pod("x", {"main": (CardSlice(B, 1000, 10), CardSlice(A, 1000, 10))})
    alloc = allocator(tmp_path, Pods([x]), visibility=Visibility.CDI)
    rec, edits = alloc.allocate([slot_id(A, 4), slot_id(B, 5)])
    assert edits.cdi_devices == (f"nvidia.com/gpu={B}", f"nvidia.com/gpu={A}")
    assert "NVIDIA_VISIBLE_DEVICES" not in edits.envs
    assert edits.envs["TESSERA_ALLOC_ID"] == rec.alloc_id
    # The limits file's ordinals follow the assignment's order, as the devices do.
    limits = decode_limits(alloc.layout.limits_path(rec.alloc_id).read_text())
    assert [c.uuid for c in limits.cards] == [B, A]


# --- PreStartContainer -------------------------------------------------------------------


def two_pods_one_guess(tmp_path: Path) -> tuple[Allocator, Kubelet, str]:
    """Two pending pods asking one card each (A and B); the agent guessed pod ``first``
    for the slot on A, and kubelet's report will say who really holds it."""
    first = pod("first", {"main": (CardSlice(A, 1000, 10),)}, created="2026-11-29T00:00:00Z")
    second = pod("second", {"main": (CardSlice(A, 3000, 30),)})
    kubelet = Kubelet(pods={("ns", "pod-first"), ("ns", "pod-second")})
    alloc = allocator(tmp_path, Pods([first, second]), kubelet)
    rec, _ = alloc.allocate([slot_id(A, 0)])
    assert rec.pod == "pod-first"
    return alloc, kubelet, rec.alloc_id


def test_prestart_corrects_a_wrong_guess_and_frees_the_other_container(
    tmp_path: Path,
) -> None:
    alloc, kubelet, alloc_id = two_pods_one_guess(tmp_path)
    kubelet.held = {("ns", "pod-second", "main"): frozenset({slot_id(A, 0)})}
    rec = alloc.pre_start([slot_id(A, 0)])
    assert (rec.alloc_id, rec.pod, rec.confirmed) == (alloc_id, "pod-second", True)
    assert alloc.allocations() == [rec]
    limits = decode_limits(alloc.layout.limits_path(alloc_id).read_text())
    assert [c.memory_mib for c in limits.cards] == [3000]
    # pod-first's container is free again: its own Allocate is matched to it.
    kubelet.held = {}
    other, _ = alloc.allocate([slot_id(A, 1)])
    assert other.pod == "pod-first"
    # pod-second's container holds the corrected folder: it is not matched a second time.
    assert refused(alloc.allocate, [slot_id(A, 2)]).message.startswith(
        "Allocate: no pod bound to node gpu-1 has a container waiting for 1 card(s)"
    )
    assert alloc.corrections == 1


def test_every_correction_is_counted(tmp_path: Path) -> None:
    alloc, kubelet, _ = two_pods_one_guess(tmp_path)
    third = pod("third", {"main": (CardSlice(A, 500, 5),)}, created="2026-11-29T00:00:02Z")
    assert isinstance(alloc.pods, Pods)
    alloc.pods.cached.append(third)
    kubelet.pods = {("ns", "pod-first"), ("ns", "pod-second"), ("ns", "pod-third")}
    kubelet.held = {("ns", "pod-second", "main"): frozenset({slot_id(A, 0)})}
    alloc.pre_start([slot_id(A, 0)])
    assert alloc.allocate([slot_id(A, 1)])[0].pod == "pod-first"  # the guess, again
    kubelet.held[("ns", "pod-third", "main")] = frozenset({slot_id(A, 1)})
    assert alloc.pre_start([slot_id(A, 1)]).pod == "pod-third"
    assert alloc.corrections == 2


def test_prestart_refuses_a_holder_the_agent_cannot_use(tmp_path: Path) -> None:
    alloc, kubelet, _ = two_pods_one_guess(tmp_path)
    kubelet.held = {("ns", "pod-stranger", "main"): frozenset({slot_id(A, 0)})}
    err = refused(alloc.pre_start, [slot_id(A, 0)])
    assert err.code == FAILED_PRECONDITION
    assert err.message == (
        f"kubelet reports pod ns/pod-stranger container 'main' holds {[slot_id(A, 0)]}, "
        f"but that pod has no usable assignment on node {NODE}"
    )


def test_prestart_refuses_a_holder_assigned_other_cards(tmp_path: Path) -> None:
    first = pod("first", {"main": (CardSlice(A, 1000, 10),)}, created="2026-11-29T00:00:00Z")
    on_b = pod("onb", {"main": (CardSlice(B, 1000, 10),)})
    kubelet = Kubelet(pods={("ns", "pod-first")})
    alloc = allocator(tmp_path, Pods([first, on_b]), kubelet)
    alloc.allocate([slot_id(A, 0)])
    kubelet.held = {("ns", "pod-onb", "main"): frozenset({slot_id(A, 0)})}
    err = refused(alloc.pre_start, [slot_id(A, 0)])
    assert err.code == FAILED_PRECONDITION
    assert err.message == (
        f"kubelet gave container 'main' of pod ns/pod-onb slots on cards {[A]}, "
        f"but it is assigned {[B]}"
    )
    assert err.pod is on_b


# --- cleanup -----------------------------------------------------------------------------


def test_cleanup_keeps_the_running_and_the_claims_library_versions(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, Pods([]))
    alloc.claim_libs = lambda: {"claims"}
    for version in ("old", "v1", "claims"):
        alloc.layout.lib_dir(version).mkdir(parents=True)
    alloc.cleanup(60.0)
    assert alloc.layout.lib_versions() == ["claims", "v1"]


def test_cleanup_keeps_a_container_kubelet_still_lists(tmp_path: Path) -> None:
    clock = Clock()
    pods = Pods([one_card("x")])
    kubelet = Kubelet(pods={("ns", "pod-x")})
    alloc = allocator(tmp_path, pods, kubelet, clock=clock)
    rec, _ = alloc.allocate([slot_id(A, 0)])
    kubelet.held = {("ns", "pod-x", "main"): frozenset({slot_id(A, 0)})}
    pods.cached = []  # the API server no longer has the pod; kubelet still runs it
    clock.now += 3600
    assert alloc.cleanup(60.0) == []
    kubelet.held = {}
    assert alloc.cleanup(60.0) == [rec.alloc_id]
