"""The reflector lists, watches, and lists again (replacing its view) after 410 Gone."""

from __future__ import annotations

import threading
import time
from typing import Any

from tessera.kube import NODES, ApiError, FakeKube, Reflector, WatchEvent
from tessera.kube.reflector import let_go
from tests.unit._wait import eventually as _eventually


class View:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.replaces = 0
        self.lock = threading.Lock()

    def replace(self, items: list[dict]) -> None:
        with self.lock:
            self.names = {o["metadata"]["name"] for o in items}
            self.replaces += 1

    def apply(self, event: WatchEvent) -> None:
        with self.lock:
            name = event.object["metadata"]["name"]
            if event.type == "DELETED":
                self.names.discard(name)
            else:
                self.names.add(name)


def test_list_then_watch_then_relist_on_gone() -> None:
    kube = FakeKube(history=100)
    kube.create(NODES, {"metadata": {"name": "n0"}})
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    r.start()
    try:
        assert r.synced.wait(5)
        assert view.names == {"n0"}
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n0", "n1"})
        # While the watch has expired, n0 goes away: only a re-list can tell.
        kube.expire_history()
        kube.delete(NODES, "n0")
        kube.expire_history()
        kube.create(NODES, {"metadata": {"name": "n2"}})
        _eventually(lambda: view.names == {"n1", "n2"})
        assert view.replaces >= 2
        assert r.lists >= 2
    finally:
        r.stop()
        kube.close()


def test_a_watch_that_ends_is_resumed_from_its_version_not_listed_again() -> None:
    # The API server ends every watch after its timeout: at 200,000 pods a list each
    # time would be minutes of work every few minutes.
    kube = FakeKube()
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    r.start()
    try:
        assert r.synced.wait(5)
        time.sleep(1.5)  # the first watch has ended and a second one runs
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})
        assert r.lists == 1 and view.replaces == 1
    finally:
        r.stop()
        kube.close()


def test_api_errors_back_off_and_recover() -> None:
    kube = FakeKube()
    kube.fail_next("list", ApiError(500, "InternalError", "boom"))
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    r.start()
    try:
        assert r.synced.wait(5)
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})
    finally:
        r.stop()
        kube.close()


def test_a_resource_not_served_counts_as_empty_until_it_is() -> None:
    # absent_ok: a CRD not installed lists as empty and synced; the list is tried again
    # every backoff maximum, and once the CRD is in, its objects come.
    kube = FakeKube()
    kube.unserved = {NODES.plural}
    view = View()
    view.names = {"stale"}
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05), absent_ok=True)
    r.start()
    try:
        assert r.synced.wait(5)
        assert r.absent and view.names == set()
        time.sleep(0.2)  # several tries while still absent: the view is emptied once
        assert view.replaces == 1 and r.lists == 0
        kube.unserved = set()
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})
        assert not r.absent and r.lists == 1
    finally:
        r.stop()
        kube.close()


def test_a_resource_not_served_is_retried_not_taken_as_empty_without_absent_ok() -> None:
    kube = FakeKube()
    kube.unserved = {NODES.plural}
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    r.start()
    try:
        assert not r.synced.wait(0.3)  # nodes every extender needs: never synced on a 404
        assert view.replaces == 0
        kube.unserved = set()
        assert r.synced.wait(5)
    finally:
        r.stop()
        kube.close()


def test_after_a_list_the_objects_are_let_go_a_step_at_a_time() -> None:
    """The handler keeps what it needs; the reflector empties the list it gave, so the
    decoded objects are freed a few at a time rather than in one long call into C."""
    kube = FakeKube()
    for i in range(1234):
        kube.create(NODES, {"metadata": {"name": f"n{i}"}})
    given: list[list[dict]] = []
    kept: list[dict] = []

    class Keeper(View):
        def replace(self, items: list[dict]) -> None:
            super().replace(items)
            given.append(items)
            kept.append(items[7])

    r = Reflector(kube, NODES, Keeper(), watch_timeout_s=1)
    r.start()
    try:
        assert r.synced.wait(5)
        _eventually(lambda: given and given[0] == [])
        assert kept[0]["metadata"]["name"] == "n7"  # what the handler kept stays whole
    finally:
        r.stop()
        kube.close()
    sizes: list[int] = []

    class Steps(list[int]):
        def __delitem__(self, key: Any) -> None:
            sizes.append(len(self[key]))
            super().__delitem__(key)

    steps = Steps(range(1234))
    let_go(steps)
    assert steps == [] and sizes == [500, 500, 234]


class PagedView(View):
    """Takes a list a page at a time, checking each page is emptied once the next one
    is asked for."""

    def __init__(self, kube: FakeKube | None = None, expire_once: bool = False) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.emptied: list[bool] = []
        self._kube, self._expire_once = kube, expire_once

    def replace_pages(self, pages: Any) -> None:
        names: set[str] = set()
        before: list[dict] | None = None
        for page in pages:
            if before is not None:
                self.emptied.append(before == [])
            self.sizes.append(len(page))
            names |= {o["metadata"]["name"] for o in page}
            before = page
            if self._kube is not None and self._expire_once:
                self._expire_once = False
                self._kube.expire_history()  # the list's version is compacted away
        with self.lock:
            self.names = names
            self.replaces += 1


def test_a_paged_handler_gets_the_list_a_page_at_a_time() -> None:
    kube = FakeKube()
    for i in range(1234):
        kube.create(NODES, {"metadata": {"name": f"n{i}"}})
    view = PagedView()
    r = Reflector(kube, NODES, view, watch_timeout_s=1)
    r.start()
    try:
        assert r.synced.wait(5)
        assert view.sizes == [500, 500, 234] and view.emptied == [True, True]
        assert view.names == {f"n{i}" for i in range(1234)}
        assert r.resource_version == kube.list(NODES).resource_version
        kube.create(NODES, {"metadata": {"name": "late"}})  # then it watches from there
        _eventually(lambda: "late" in view.names)
    finally:
        r.stop()
        kube.close()


def test_a_list_whose_version_expires_between_pages_is_listed_again() -> None:
    kube = FakeKube(history=100)
    for i in range(700):
        kube.create(NODES, {"metadata": {"name": f"n{i}"}})
    view = PagedView(kube, expire_once=True)
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    r.start()
    try:
        assert r.synced.wait(5)
        assert view.sizes == [500, 500, 200]  # the first list's second page was Gone
        assert view.replaces == 1 and r.lists == 1
        assert view.names == {f"n{i}" for i in range(700)}
    finally:
        r.stop()
        kube.close()


def test_listed_reads_the_next_page_only_when_it_is_reached() -> None:
    from tessera.kube.reflector import listed

    kube = FakeKube()
    for i in range(1234):
        kube.create(NODES, {"metadata": {"name": f"n{i}"}})
    kube.calls.clear()
    objects = listed(kube, NODES)
    names = [next(objects)["metadata"]["name"] for _ in range(500)]
    assert kube.calls == [("list", "nodes")]  # one page of 500 read so far
    names += [o["metadata"]["name"] for o in objects]
    assert kube.calls == [("list", "nodes")] * 3
    assert names == [f"n{i}" for i in range(1234)]
