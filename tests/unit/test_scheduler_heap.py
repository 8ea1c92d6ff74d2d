"""The heap around each list: garbage collected before it, the collector paused during it,
what it made frozen out of later passes after it."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.kube import NODES, FakeKube
from tessera.scheduler import app as app_module
from tessera.scheduler.app import SchedulerApp
from tessera.scheduler.config import SchedulerConfig
from tessera.scheduler.heap import collector_paused, freeze_listed, listing
from tessera.scheduler.state import SchedulerState
from tests.unit._scheduler_world import node_obj, pod_obj


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


@pytest.fixture
def clean_heap() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session keeps a plain heap


def test_a_list_collects_first_and_freezes_what_it_made_with_no_pass(clean_heap: None) -> None:
    garbage = _Node()
    garbage.peer = _Node()
    garbage.peer.peer = garbage  # a cycle: only the collector can free it
    gone = weakref.ref(garbage)
    del garbage
    passes: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    with listing():
        assert gone() is None  # collected before the list, not frozen for ever
        assert not gc.isenabled()
        gc.callbacks.append(counted)
        try:
            state = [_Node() for _ in range(100)]  # what the list makes
            freeze_listed()
        finally:
            gc.callbacks.remove(counted)
    assert gc.isenabled()
    assert passes == []  # the freeze walked nothing
    assert gc.get_freeze_count() >= len(state)
    tracked = {id(o) for o in gc.get_objects()}  # the three generations, not the frozen
    assert not any(id(n) in tracked for n in state)


def test_app_freezes_after_each_list_inside_its_pause(
    clean_heap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    freezes: list[float] = []
    collecting: list[bool] = []

    def freeze() -> None:
        freezes.append(time.monotonic())
        collecting.append(gc.isenabled())

    monkeypatch.setattr(app_module, "freeze_listed", freeze)
    kube = FakeKube()
    kube.create(NODES, node_obj("n1"))
    app = SchedulerApp(
        SchedulerConfig(leader_elect=False, watch_timeout_s=1, freeze_heap=True), kube
    )
    app.start()
    try:
        assert app.wait_synced(5)
        # After the first list of nodes, pods, slices and claims (quotas are not frozen).
        assert len(freezes) == 4
        kube.expire_history()  # the watches get Gone and list again
        wait = time.monotonic() + 10
        while len(freezes) < 8 and time.monotonic() < wait:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(freezes) == 8  # once more per re-list
        assert collecting == [False] * 8  # each before the list's pause ends
    finally:
        app.stop()
        kube.close()


def test_app_leaves_the_heap_alone_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    freezes: list[float] = []
    monkeypatch.setattr(app_module, "freeze_listed", lambda: freezes.append(time.monotonic()))
    kube = FakeKube()
    app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), kube)
    app.start()
    try:
        assert app.wait_synced(5)
        kube.expire_history()
        time.sleep(1.5)
        assert freezes == []
    finally:
        app.stop()
        kube.close()


def test_freezing_after_each_relist_keeps_only_the_current_state(clean_heap: None) -> None:
    # A frozen object that is dropped inside a reference cycle is never collected: if the
    # state held cycles, every re-list would leave the previous state frozen for ever
    # (one state of this size is ~4,000 objects; a little slack for the interpreter's own).
    state = SchedulerState()
    counts = []
    for generation in range(4):
        state.replace_nodes([node_obj(f"n{i}", 8) for i in range(200)])
        pods = [pod_obj(f"p{generation}-{i}", gpu=1) for i in range(100)]
        for i, p in enumerate(pods):
            p["metadata"]["uid"] = f"uid-{generation}-{i}"
        with listing():
            state.replace_pods(pods)
            freeze_listed()  # no pass: a cycle the booking made would be frozen here
        counts.append(gc.get_freeze_count())
    assert counts[-1] - counts[0] < 500, counts


def test_pauses_of_the_collector_from_two_threads_end_with_the_last() -> None:
    assert gc.isenabled()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with collector_paused():
        second_in.set()
        first_out.wait(5)
        seen.append(gc.isenabled())  # the first pause ended, this one has not
    thread.join(5)
    assert seen == [False]
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_that_was_off_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_app_lists_with_the_collector_paused_whether_or_not_it_freezes(
    clean_heap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "freeze_listed", lambda: None)
    kube = FakeKube()
    kube.create(NODES, node_obj("n1"))
    collecting: dict[bool, list[bool]] = {}
    for manage in (True, False):
        app = SchedulerApp(
            SchedulerConfig(leader_elect=False, watch_timeout_s=1, freeze_heap=manage), kube
        )
        seen = collecting.setdefault(manage, [])
        booked = app.state.pods_handler.replace_pages

        def replace(pages: Any, booked: Any = booked, seen: list[bool] = seen) -> None:
            seen.append(gc.isenabled())
            booked(pages)

        monkeypatch.setattr(app.state.pods_handler, "replace_pages", replace)
        app.start()
        try:
            assert app.wait_synced(5)
        finally:
            app.stop()
    kube.close()
    assert collecting == {True: [False], False: [False]}
    assert gc.isenabled()  # resumed after the list


def test_a_list_beside_another_does_not_walk_what_that_one_is_making() -> None:
    passes: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(counted)
    gc.disable()  # no pass of the collector's own in between: only the ones asked for
    try:
        with listing():
            pass
        assert passes == [2]  # alone: one full pass before the list
        with collector_paused(), listing():  # another list under way
            pass
        assert passes == [2]
    finally:
        gc.enable()
        gc.callbacks.remove(counted)
