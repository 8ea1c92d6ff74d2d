"""The node agent's ResourceSlice publisher against FakeKube, which stamps a device
taint's ``timeAdded`` as the real API server does."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

import pytest

from tessera.claims.devices import CORDONED_TAINT, UNHEALTHY_TAINT, slice_name
from tessera.kube import NODES, FakeKube
from tessera.kube.kinds import RESOURCE_SLICES
from tessera.model.clusterspec import make_cards
from tessera.node.dra.slices import SlicePublisher
from tests.unit._wait import eventually

OLD = "2026-01-02T03:04:05Z"


def _world() -> tuple[FakeKube, SlicePublisher]:
    kube = FakeKube()
    kube.create(NODES, {"metadata": {"name": "n1"}})
    return kube, SlicePublisher(kube, "n1", "")


def _taints(kube: FakeKube) -> dict[str, list[dict[str, str]]]:
    devices = kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"]
    return {d["name"]: d["taints"] for d in devices if "taints" in d}


def test_a_tainted_slice_as_the_server_stamped_it_is_not_written_again() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    cards[0] = replace(cards[0], healthy=False)
    assert pub.publish(cards)
    [taint] = next(iter(_taints(kube).values()))
    assert taint["key"] == UNHEALTHY_TAINT and taint["timeAdded"]  # the server's stamp
    for _ in range(5):  # health ticks
        assert not pub.publish(cards)
    assert pub.writes == 1


def test_a_taint_keeps_the_time_it_first_appeared_when_another_card_changes() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    cards[0] = replace(cards[0], healthy=False)
    pub.publish(cards)
    # Pretend the taint is old, as it would be after a day: its time must survive.
    obj = kube.get(RESOURCE_SLICES, slice_name("n1"))
    obj["spec"]["devices"][0]["taints"][0]["timeAdded"] = OLD
    pub.forget()  # read the slice again, as after a raced write
    kube.replace(RESOURCE_SLICES, obj)
    cards[1] = replace(cards[1], cordoned=True)
    assert pub.publish(cards)
    taints = _taints(kube)
    first, second = (taints[d] for d in sorted(taints))
    assert [(t["key"], t["timeAdded"]) for t in first] == [(UNHEALTHY_TAINT, OLD)]
    assert [t["key"] for t in second] == [CORDONED_TAINT] and second[0]["timeAdded"] != OLD


def test_a_taint_that_goes_and_comes_back_gets_a_new_time() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 1, "A100"))
    pub.publish([replace(cards[0], healthy=False)])
    obj = kube.get(RESOURCE_SLICES, slice_name("n1"))
    obj["spec"]["devices"][0]["taints"][0]["timeAdded"] = OLD
    pub.forget()
    kube.replace(RESOURCE_SLICES, obj)
    assert pub.publish(cards)  # healthy again: the taint goes
    assert _taints(kube) == {}
    assert pub.publish([replace(cards[0], healthy=False)])
    [[taint]] = _taints(kube).values()
    assert taint["timeAdded"] != OLD


def test_an_agent_restarted_with_the_same_cards_writes_nothing() -> None:
    # The server stores 40960Mi as 40Gi: the slice read at start is still the cards'.
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    assert pub.publish(cards)
    stored = kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"][0]["capacity"]
    assert stored["memory"]["value"] == f"{cards[0].memory_mib // 1024}Gi"
    again = SlicePublisher(kube, "n1", "")
    assert not again.publish(cards)
    assert again.writes == 0


def test_an_agent_restarted_with_a_card_changed_writes_once() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    assert pub.publish(cards)
    cards[0] = replace(cards[0], cordoned=True)  # cordoned while the agent was down
    again = SlicePublisher(kube, "n1", "")
    assert again.publish(cards) and not again.publish(cards)
    assert again.writes == 1 and _pool_generation(kube) == 2


def test_a_taint_removed_by_hand_is_written_back() -> None:
    # Without it kube-scheduler would place claims on the sick card again.
    kube, pub = _world()
    cards = [replace(make_cards("n1", 1, "A100")[0], healthy=False)]
    pub.publish(cards)
    for edit in ("key", "drop"):  # the taint renamed, then taken off
        obj = kube.get(RESOURCE_SLICES, slice_name("n1"))
        if edit == "key":
            obj["spec"]["devices"][0]["taints"][0]["key"] = "example.com/other"
        else:
            del obj["spec"]["devices"][0]["taints"]
        kube.replace(RESOURCE_SLICES, obj)
        pub.forget()
        assert pub.publish(cards), edit
        assert [t["key"] for t in next(iter(_taints(kube).values()))] == [UNHEALTHY_TAINT]


def test_the_node_owns_its_slice_and_each_is_read_once_not_every_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.node.dra.slices")
    kube, pub = _world()
    uid = kube.get(NODES, "n1")["metadata"]["uid"]
    kube.calls.clear()
    cards = list(make_cards("n1", 2, "A100"))
    assert pub.publish(cards)
    cards[1] = replace(cards[1], cordoned=True)
    assert pub.publish(cards)
    for _ in range(5):  # health ticks
        assert not pub.publish(cards)
    reads = [what for verb, what in kube.calls if verb == "get"]
    assert reads == [f"resourceslices/{slice_name('n1')}", "nodes/n1"]
    meta = kube.get(RESOURCE_SLICES, slice_name("n1"))["metadata"]
    # a deleted node takes its slice with it
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": uid}
    ]  # fmt: skip
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("INFO", "ResourceSlice n1-gpu.tessera.io written (2 devices)")] * 2


def test_the_driver_version_the_agent_read_is_in_every_device() -> None:
    kube = FakeKube()
    kube.create(NODES, {"metadata": {"name": "n1"}})
    SlicePublisher(kube, "n1", driver_version="550.54.15").publish(make_cards("n1", 2, "A100"))
    devices = kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"]
    assert [d["attributes"]["driverVersion"] for d in devices] == [{"version": "550.54.15"}] * 2


def test_a_capacity_edited_by_hand_is_written_back() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 1, "A100"))
    pub.publish(cards)
    obj = kube.get(RESOURCE_SLICES, slice_name("n1"))
    obj["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1000Gi"
    kube.replace(RESOURCE_SLICES, obj)
    pub.forget()
    assert pub.publish(cards)
    memory = kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"][0]["capacity"]
    assert memory["memory"]["value"] == f"{cards[0].memory_mib // 1024}Gi"


class _ServerThatAddsAField(FakeKube):
    """An API server of a later release that defaults a device field the agent does not
    write (as 1.36 added timeAdded to taints)."""

    @staticmethod
    def _default(kind: Any, obj: Any) -> None:
        FakeKube._default(kind, obj)
        for dev in (obj.get("spec") or {}).get("devices") or []:
            dev.setdefault("futureField", {"on": True})


def test_a_field_the_server_adds_does_not_make_the_agent_write_every_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = _ServerThatAddsAField()
    kube.create(NODES, {"metadata": {"name": "n1"}})
    pub = SlicePublisher(kube, "n1", "")
    cards = list(make_cards("n1", 2, "A100"))
    assert pub.publish(cards)
    for _ in range(5):
        assert not pub.publish(cards)  # the slice as stored is our write
    assert pub.writes == 1
    assert "changes ResourceSlice n1-gpu.tessera.io beyond what the agent compares" in caplog.text
    # A change of the cards is written, once; so is an edit by someone else, once.
    cards[0] = replace(cards[0], cordoned=True)
    assert pub.publish(cards) and not pub.publish(cards)
    obj = kube.get(RESOURCE_SLICES, slice_name("n1"))
    obj["spec"]["devices"][1]["capacity"]["memory"]["value"] = "1Gi"
    edited = kube.replace(RESOURCE_SLICES, obj)
    pub._seen(edited, edited["metadata"]["resourceVersion"])  # as the watch delivers it
    assert pub.publish(cards) and not pub.publish(cards)
    assert pub.writes == 3
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "the API server changes ResourceSlice n1-gpu.tessera.io beyond what the agent "
        "compares; the slice as stored counts as written"
    ]  # said once, not at every write


class _ServerWithoutDeviceTaints(FakeKube):
    """An API server with the DRADeviceTaints feature off: it drops a device's taints."""

    @staticmethod
    def _default(kind: Any, obj: Any) -> None:
        FakeKube._default(kind, obj)
        for dev in (obj.get("spec") or {}).get("devices") or []:
            dev.pop("taints", None)


def _pool_generation(kube: FakeKube) -> int:
    return int(kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["pool"]["generation"])


def test_each_write_bumps_the_pools_generation() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    assert pub.publish(cards) and _pool_generation(kube) == 1
    cards[1] = replace(cards[1], cordoned=True)
    assert pub.publish(cards) and _pool_generation(kube) == 2
    assert not pub.publish(cards) and _pool_generation(kube) == 2


def test_where_the_server_drops_taints_a_card_out_of_service_leaves_the_slice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tainted device the server stores untainted would be allocatable: once the agent
    sees its taint dropped, it writes out-of-service cards out of the slice instead, and
    keeps doing so without asking again."""
    kube = _ServerWithoutDeviceTaints()
    kube.create(NODES, {"metadata": {"name": "n1"}})
    pub = SlicePublisher(kube, "n1", "")
    cards = list(make_cards("n1", 3, "A100"))
    assert pub.publish(cards) and pub.taints_served is None  # no taint written yet
    cards[0] = replace(cards[0], healthy=False)
    assert pub.publish(cards)
    assert pub.taints_served is False
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["the API server drops device taints: sick cards leave the slice"]
    stored = kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]
    assert [d["attributes"]["index"]["int"] for d in stored["devices"]] == [1, 2]
    assert stored["pool"]["generation"] == 3  # the taint's write, then the one without it
    assert pub.writes == 3 and not pub.publish(cards)
    cards[2] = replace(cards[2], cordoned=True)
    assert pub.publish(cards) and pub.writes == 4  # one write: taints are known dropped
    assert len(kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"]) == 1
    cards[0] = replace(cards[0], healthy=True)
    assert pub.publish(cards)
    devices = kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"]
    assert [d["attributes"]["index"]["int"] for d in devices] == [0, 1]


def test_a_slice_made_again_after_a_deletion_is_taken_as_it_is() -> None:
    """Deleted by hand, then put back as it was (a restore): the watch tells both, and
    the agent, knowing the slice is there again, does not try to create it."""
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    assert pub.publish(cards)
    obj = kube.get(RESOURCE_SLICES, slice_name("n1"))
    kube.delete(RESOURCE_SLICES, slice_name("n1"))
    pub._seen(None, str(int(obj["metadata"]["resourceVersion"]) + 1))  # as the watch says
    del obj["metadata"]["resourceVersion"]
    back = kube.create(RESOURCE_SLICES, obj)
    pub._seen(back, back["metadata"]["resourceVersion"])
    assert not pub.publish(cards) and pub.writes == 1


def test_where_the_server_keeps_taints_a_sick_card_stays_tainted() -> None:
    kube, pub = _world()
    cards = list(make_cards("n1", 2, "A100"))
    cards[0] = replace(cards[0], healthy=False)
    assert pub.publish(cards) and pub.taints_served is True and pub.writes == 1
    assert len(kube.get(RESOURCE_SLICES, slice_name("n1"))["spec"]["devices"]) == 2


class _SlowWatch(FakeKube):
    """Holds the slice's list between reading and answering, and its watch until told:
    the window in which the agent's first write can fall."""

    def __init__(self) -> None:
        super().__init__()
        self.listed, self.answer, self.watch_on = (threading.Event() for _ in range(3))

    def list(self, kind: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().list(kind, *args, **kwargs)
        if kind == RESOURCE_SLICES:
            self.listed.set()
            self.answer.wait(5)
        return result

    def watch(self, kind: Any, *args: Any, **kwargs: Any) -> Any:
        if kind == RESOURCE_SLICES:
            self.watch_on.wait(5)
        return super().watch(kind, *args, **kwargs)


def test_a_list_from_before_the_first_write_does_not_make_the_agent_create_again() -> None:
    # The watch starts beside the first publish: its list may find no slice, yet arrive
    # after the create. That absence is older than the write and must not undo it (it
    # made the next tick create the slice again: AlreadyExists, an error in the log).
    kube = _SlowWatch()
    kube.create(NODES, {"metadata": {"name": "n1"}})
    pub = SlicePublisher(kube, "n1", "")
    cards = make_cards("n1", 2, "A100")
    reflector = pub.watch()
    try:
        assert kube.listed.wait(5)
        assert pub.publish(cards)
        kube.answer.set()
        eventually(lambda: reflector.lists == 1)
        assert not pub.publish(cards)  # raised AlreadyExists before
        kube.watch_on.set()
        # A deletion after the write is news: the next tick creates the slice again.
        kube.delete(RESOURCE_SLICES, slice_name("n1"))
        eventually(lambda: pub.publish(cards))
        assert pub.writes == 2
    finally:
        reflector.stop()
        kube.answer.set()
        kube.watch_on.set()
