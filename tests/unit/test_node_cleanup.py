"""cleanup: what a gone container leaves on the node goes, and nothing a live one uses.

Real Layout (a temporary folder) and Ledger; the pod source and kubelet's pod-resources
are small records of what each was asked, answering what the test sets."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tessera.node.allocation.cleanup import cleanup
from tessera.node.allocation.ledger import Ledger
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.pods import PodInfo
from tests.unit._node_doubles import Kubelet, Pods

NODE = "gpu-1"
GRACE = 30.0
NOW = 1_000.0


def pod(uid: str, node: str = NODE, terminal: bool = False) -> PodInfo:
    return PodInfo(uid, "ns", f"pod-{uid}", node, "2026-11-28T00:00:00Z", (), None,
                   terminal=terminal)  # fmt: skip


def allocate(layout: Layout, ledger: Ledger, alloc_id: str, uid: str, created: float) -> None:
    rec = AllocRecord(alloc_id, (f"slot-{alloc_id}",), uid, "ns", f"pod-{uid}", "main",
                      ("GPU-a",), True, "v1", created)  # fmt: skip
    layout.write_alloc(rec, "limits\n")
    ledger.record(rec)


def world(tmp_path: Path) -> tuple[Layout, Ledger]:
    layout = Layout(tmp_path)
    return layout, Ledger()


def test_a_container_of_a_pod_gone_from_the_node_is_removed(tmp_path: Path) -> None:
    layout, ledger = world(tmp_path)
    allocate(layout, ledger, "a1", "live", NOW - 100)
    allocate(layout, ledger, "a2", "gone", NOW - 100)
    allocate(layout, ledger, "a3", "moved", NOW - 100)
    allocate(layout, ledger, "a4", "done", NOW - 100)
    pods = Pods([pod("live"), pod("moved", node="gpu-2"), pod("done", terminal=True)])
    removed = cleanup(NODE, ledger, layout, pods, Kubelet(), "v1", NOW, GRACE)
    assert sorted(removed) == ["a2", "a3", "a4"]
    assert layout.alloc_ids() == ["a1"]
    assert [r.alloc_id for r in ledger.records()] == ["a1"]


def test_a_young_allocation_stays_though_its_pod_is_not_seen_yet(tmp_path: Path) -> None:
    layout, ledger = world(tmp_path)
    allocate(layout, ledger, "a1", "new", NOW - GRACE + 1)  # the watch may lag
    allocate(layout, ledger, "a2", "old", NOW - GRACE)  # exactly the grace: old enough
    pods = Pods([])
    assert cleanup(NODE, ledger, layout, pods, Kubelet(), "v1", NOW, GRACE) == ["a2"]
    assert layout.alloc_ids() == ["a1"]


def test_the_pods_are_listed_again_only_when_something_looks_gone(tmp_path: Path) -> None:
    layout, ledger = world(tmp_path)
    allocate(layout, ledger, "a1", "live", NOW - 100)
    pods = Pods([pod("live")])
    kubelet = Kubelet()
    assert cleanup(NODE, ledger, layout, pods, kubelet, "v1", NOW, GRACE) == []
    assert (pods.refreshes, kubelet.views) == (0, 0)
    # The cache has lost one pod, the fresh list has it: it stays, kubelet not asked.
    allocate(layout, ledger, "a2", "other", NOW - 100)
    pods = Pods([pod("other")], fresh=[pod("live"), pod("other")])
    assert cleanup(NODE, ledger, layout, pods, kubelet, "v1", NOW, GRACE) == []
    assert (pods.refreshes, kubelet.views) == (1, 0)
    assert layout.alloc_ids() == ["a1", "a2"]


def test_slots_kubelet_still_lists_are_kept(tmp_path: Path) -> None:
    """The pod looks gone, but kubelet still holds the slots (a container not yet
    stopped): the folder its container reads stays until kubelet lets go."""
    layout, ledger = world(tmp_path)
    allocate(layout, ledger, "a0", "live", NOW - 100)
    allocate(layout, ledger, "a1", "gone", NOW - 100)
    allocate(layout, ledger, "a2", "gone-too", NOW - 100)
    kubelet = Kubelet(held={("ns", "pod-gone", "main"): frozenset({"slot-a1"})})
    live = Pods([pod("live")])
    assert cleanup(NODE, ledger, layout, live, kubelet, "v1", NOW, GRACE) == ["a2"]
    assert layout.alloc_ids() == ["a0", "a1"]
    assert cleanup(NODE, ledger, layout, live, Kubelet(), "v1", NOW, GRACE) == ["a1"]
    # Without the pod-resources socket, what the pod lists say is enough.
    allocate(layout, ledger, "a3", "gone", NOW - 100)
    assert cleanup(NODE, ledger, layout, live, None, "v1", NOW, GRACE) == ["a3"]


def test_a_folder_without_a_record_goes_once_old_and_unused_libraries_go(
    tmp_path: Path,
) -> None:
    layout, ledger = world(tmp_path)
    allocate(layout, ledger, "a1", "live", NOW - 100)
    for orphan, age in (("half-old", 100), ("half-edge", GRACE), ("half-new", 1)):
        layout.alloc_dir(orphan).mkdir(parents=True)
        os.utime(layout.alloc_dir(orphan), (NOW - age, NOW - age))
    # A record the agent could not read (another version's): its container may run.
    unread = layout.alloc_dir("unread")
    unread.mkdir(parents=True)
    (unread / "meta.json").write_text('{"v": 2}')
    os.utime(unread, (NOW - 100, NOW - 100))
    for version in ("v0", "v1", "v2", "claims-v"):
        layout.lib_dir(version).mkdir(parents=True)
    removed = cleanup(NODE, ledger, layout, Pods([pod("live")]), Kubelet(), "v2", NOW, GRACE,
                      keep_libs=frozenset({"claims-v"}))  # fmt: skip
    assert sorted(removed) == ["half-edge", "half-old"]
    assert layout.alloc_ids() == ["a1", "half-new", "unread"]
    # v1: a live allocation's; v2: the agent's own; claims-v: a prepared claim's.
    assert sorted(layout.lib_versions()) == ["claims-v", "v1", "v2"]


def test_a_folder_allocate_is_still_writing_stays_at_any_grace(tmp_path: Path) -> None:
    """Allocate claims the container, makes the folder, then writes meta.json: between
    the two the folder has no record, but it is no orphan, even at a grace of 0."""
    layout, ledger = world(tmp_path)
    assert ledger.claim(("new", "main"), "a1")
    for alloc_id in ("a1", "dead"):  # dead: its Allocate died, nobody claims it
        layout.alloc_dir(alloc_id).mkdir(parents=True)
        os.utime(layout.alloc_dir(alloc_id), (NOW, NOW))  # made just now
    assert cleanup(NODE, ledger, layout, Pods([]), Kubelet(), "v1", NOW, 0.0) == ["dead"]
    assert layout.alloc_ids() == ["a1"]
    ledger.release(("new", "main"), "a1")  # the write failed: now it is an orphan
    assert cleanup(NODE, ledger, layout, Pods([]), Kubelet(), "v1", NOW, 0.0) == ["a1"]


def test_a_removal_that_stops_half_way_is_finished_by_the_next_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, ledger = world(tmp_path)
    allocate(layout, ledger, "a1", "gone", NOW - 100)
    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", lambda *_a, **_k: None)  # an I/O error, ignored
        assert cleanup(NODE, ledger, layout, Pods([]), Kubelet(), "v1", NOW, GRACE) == ["a1"]
    # What is left has no record: an orphan, not a record cleanup must keep.
    assert layout.alloc_ids() == ["a1"] and not layout.has_record("a1")
    later = time.time() + GRACE
    assert cleanup(NODE, ledger, layout, Pods([]), Kubelet(), "v1", later, GRACE) == ["a1"]
    assert layout.alloc_ids() == []


def test_a_folder_gone_between_the_listing_and_its_age_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another removal took a folder after it was listed: the orphans after it still go."""
    layout, ledger = world(tmp_path)
    layout.alloc_dir("b-orphan").mkdir(parents=True)
    os.utime(layout.alloc_dir("b-orphan"), (NOW - 100, NOW - 100))
    monkeypatch.setattr(layout, "alloc_ids", lambda: ["a-vanished", "b-orphan"])
    assert cleanup(NODE, ledger, layout, Pods([]), Kubelet(), "v1", NOW, GRACE) == ["b-orphan"]


def test_a_preferred_slot_set_is_forgotten_past_the_grace(tmp_path: Path) -> None:
    """GetPreferredAllocation's reservation for a container whose Allocate never came."""
    layout, ledger = world(tmp_path)
    ledger.reserve(frozenset({"s1"}), ("old", "main"), NOW - GRACE - 1)
    ledger.reserve(frozenset({"s2"}), ("new", "main"), NOW - GRACE)
    cleanup(NODE, ledger, layout, Pods([]), Kubelet(), "v1", NOW, GRACE)
    assert ledger.take_reservation(frozenset({"s1"})) is None
    assert ledger.take_reservation(frozenset({"s2"})) == ("new", "main")
