"""The reflector lists, watches, and lists again (replacing its view) after 410 Gone."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tessera.kube import LEASES, NODES, ApiError, FakeKube, Reflector, WatchEvent
from tessera.kube.reflector import follow_one, let_go
from tests.unit._wait import eventually as _eventually


@contextmanager
def running(r: Reflector, kube: FakeKube) -> Iterator[None]:
    """The reflector running for the block; stopped, and the API closed, after it."""
    r.start()
    try:
        yield
    finally:
        r.stop()
        kube.close()


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


def test_list_then_watch_then_relist_on_gone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tessera.kube.reflector")
    kube = FakeKube(history=100)
    kube.create(NODES, {"metadata": {"name": "n0"}})
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
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
        assert "nodes: watch expired (410); listing again" in caplog.messages


def test_a_watch_that_ends_is_resumed_from_its_version_not_listed_again() -> None:
    # The API server ends every watch after its timeout: at 200,000 pods a list each
    # time would be minutes of work every few minutes.
    kube = FakeKube()
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
        assert r.synced.wait(5)
        time.sleep(1.5)  # the first watch has ended and a second one runs
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})
        assert r.lists == 1 and view.replaces == 1


def test_api_errors_back_off_and_recover() -> None:
    kube = FakeKube()
    kube.fail_next("list", ApiError(500, "InternalError", "boom"))
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
        assert r.synced.wait(5)
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})


def test_a_resource_not_served_counts_as_empty_until_it_is() -> None:
    # absent_ok: a CRD not installed lists as empty and synced; the list is tried again
    # every backoff maximum, and once the CRD is in, its objects come.
    kube = FakeKube()
    kube.unserved = {NODES.plural}
    view = View()
    view.names = {"stale"}
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05), absent_ok=True)
    with running(r, kube):
        assert r.synced.wait(5)
        assert r.absent and view.names == set()
        time.sleep(0.2)  # several tries while still absent: the view is emptied once
        assert view.replaces == 1 and r.lists == 0
        kube.unserved = set()
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})
        assert not r.absent and r.lists == 1


def test_a_resource_not_served_is_retried_not_taken_as_empty_without_absent_ok() -> None:
    kube = FakeKube()
    kube.unserved = {NODES.plural}
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
        assert not r.synced.wait(0.3)  # nodes every extender needs: never synced on a 404
        assert view.replaces == 0
        kube.unserved = set()
        assert r.synced.wait(5)


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
    with running(r, kube):
        assert r.synced.wait(5)
        _eventually(lambda: given and given[0] == [])
        assert kept[0]["metadata"]["name"] == "n7"  # what the handler kept stays whole
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
    with running(r, kube):
        assert r.synced.wait(5)
        assert view.sizes == [500, 500, 234] and view.emptied == [True, True]
        assert view.names == {f"n{i}" for i in range(1234)}
        assert r.resource_version == kube.list(NODES).resource_version
        kube.create(NODES, {"metadata": {"name": "late"}})  # then it watches from there
        _eventually(lambda: "late" in view.names)


def test_a_list_whose_version_expires_between_pages_is_listed_again() -> None:
    kube = FakeKube(history=100)
    for i in range(700):
        kube.create(NODES, {"metadata": {"name": f"n{i}"}})
    view = PagedView(kube, expire_once=True)
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
        assert r.synced.wait(5)
        assert view.sizes == [500, 500, 200]  # the first list's second page was Gone
        assert view.replaces == 1 and r.lists == 1
        assert view.names == {f"n{i}" for i in range(700)}


def test_listed_reads_the_next_page_only_when_it_is_reached() -> None:
    from tessera.kube.reflector import listed

    kube = FakeKube()
    for i in range(1234):
        kube.create(NODES, {"metadata": {"name": f"n{i}"}})
    kube.calls.clear()
    objects = listed(kube, NODES)
    names = [next(objects)["metadata"]["name"] for _ in range(500)]
    assert kube.calls == [("list", "nodes")]  # one page of 500 read so far
    names.append(next(objects)["metadata"]["name"])
    assert kube.calls == [("list", "nodes")] * 2  # the 501st is the next page's
    names += [o["metadata"]["name"] for o in objects]
    assert kube.calls == [("list", "nodes")] * 3
    assert names == [f"n{i}" for i in range(1234)]


def test_the_reflector_runs_on_a_daemon_thread_named_for_its_kind() -> None:
    # A reflector nobody stopped must not hold the process at exit; its name is what a
    # thread dump shows.
    kube = FakeKube()
    r = Reflector(kube, NODES, View(), watch_timeout_s=1)
    thread = r.start()
    try:
        assert thread.daemon and thread.name == "reflector-nodes"
    finally:
        r.stop()
        kube.close()


def test_a_resource_not_served_is_logged_once_with_its_kind_and_the_servers_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.kube.reflector")
    kube = FakeKube()
    kube.unserved = {NODES.plural}
    r = Reflector(kube, NODES, View(), watch_timeout_s=1, backoff_s=(0.01, 0.05), absent_ok=True)
    with running(r, kube):
        assert r.synced.wait(5)
        time.sleep(0.2)  # several tries while absent
    assert [rec.getMessage() for rec in caplog.records] == [
        "nodes: not served by the API server "
        "(404 NotFound: the server could not find the requested resource)"
    ]


def test_follow_one_tells_the_object_its_absence_and_its_deletion_each_with_its_version() -> None:
    kube = FakeKube()
    kube.create(NODES, {"metadata": {"name": "other"}})
    seen: list[tuple[str | None, str]] = []

    def record(obj: dict | None, version: str) -> None:
        seen.append((obj["metadata"]["name"] if obj is not None else None, version))

    r = follow_one(kube, NODES, "n1", record)
    try:
        assert r.synced.wait(5)
        # Not there yet: None, at the version of the list that said so.
        assert seen == [(None, kube.list(NODES).resource_version)]
        created = kube.create(NODES, {"metadata": {"name": "n1"}})
        kube.create(NODES, {"metadata": {"name": "another"}})  # not followed
        _eventually(lambda: len(seen) == 2)
        assert seen[1] == ("n1", created["metadata"]["resourceVersion"])
        kube.delete(NODES, "n1")
        deleted_at = kube.list(NODES).resource_version
        _eventually(lambda: len(seen) == 3)
        assert seen[2] == (None, deleted_at)
    finally:
        r.stop()
    again = kube.create(NODES, {"metadata": {"name": "n1"}})
    kube.create(NODES, {"metadata": {"name": "later"}})  # the list's version is past n1's
    seen.clear()
    r = follow_one(kube, NODES, "n1", record)  # there at the list: the object, its own version
    try:
        assert r.synced.wait(5)
        assert seen == [("n1", again["metadata"]["resourceVersion"])]
    finally:
        r.stop()
        kube.close()


class ScriptedWatches(FakeKube):
    """FakeKube whose watches can be told, one watch at a time, to fail (``outcomes``:
    an ApiError to raise, None to watch as usual) or to start with a BOOKMARK at a
    version (as the API server sends with allowWatchBookmarks: the object carries only
    its kind and resourceVersion). Each watch's arguments are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[ApiError | None] = []
        self.bookmark_at: str | None = None
        self.watched: list[dict[str, Any]] = []

    def watch(self, kind: Any, resource_version: str, *args: Any, **kwargs: Any) -> Any:
        self.watched.append({"resource_version": resource_version, **kwargs})
        if self.outcomes and (error := self.outcomes.pop(0)) is not None:
            raise error
        if self.bookmark_at is not None:
            at, self.bookmark_at = self.bookmark_at, None
            meta = {"resourceVersion": at}
            yield WatchEvent("BOOKMARK", {"kind": kind.kind, "apiVersion": "v1", "metadata": meta})
        yield from super().watch(kind, resource_version, *args, **kwargs)


def test_the_version_follows_each_event_and_a_bookmark_moves_it_without_the_handler() -> None:
    # The version is where the next watch starts: left at the list's, every watch after
    # the server ends one would replay the changes since (at 200,000 pods, a flood).
    kube = ScriptedWatches()
    applied: list[str] = []

    class Recording(View):
        def apply(self, event: WatchEvent) -> None:
            applied.append(event.type)
            super().apply(event)

    r = Reflector(kube, NODES, Recording(), watch_timeout_s=1)
    with running(r, kube):
        assert r.synced.wait(5)
        created = kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: r.resource_version == created["metadata"]["resourceVersion"])
        kube.create(LEASES, {"metadata": {"name": "l"}}, "ns")  # no node event
        later = kube.list(NODES).resource_version
        assert later != r.resource_version
        kube.bookmark_at = later  # the next watch (within a second) starts with it
        _eventually(lambda: r.resource_version == later)
        n2 = kube.create(NODES, {"metadata": {"name": "n2"}})
        _eventually(lambda: r.resource_version == n2["metadata"]["resourceVersion"])
        assert applied == ["ADDED", "ADDED"]  # the bookmark went to no handler
        assert {w["timeout_s"] for w in kube.watched} == {1}  # the server ends each


def test_watch_failures_back_off_doubling_to_the_cap_and_the_third_in_a_row_lists_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.kube.reflector")
    kube = ScriptedWatches()
    boom = ApiError(500, "InternalError", "boom")
    # Three failures (the third lists again), a watch that ends as the server ends it
    # (which starts the count and the delay over), two more failures.
    kube.outcomes = [boom, boom, boom, None, boom, boom]
    view = View()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.1, 0.4))
    with running(r, kube):
        assert r.synced.wait(5)
        _eventually(lambda: len(caplog.records) == 5, timeout=10)
        time.sleep(0.6)  # past the longest wait: a list that should not come would
        assert r.lists == 2
    said = "nodes: 500 InternalError: boom; retrying in %s"
    assert [rec.getMessage() for rec in caplog.records] == [
        said % "0.1s", said % "0.2s", said % "0.4s", said % "0.1s", said % "0.2s"
    ]  # fmt: skip


@pytest.mark.handler_fails
def test_a_handler_that_fails_is_logged_and_the_view_listed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    failed: list[str] = []

    class FailsOnce(View):
        def apply(self, event: WatchEvent) -> None:
            if not failed:
                failed.append(event.object["metadata"]["name"])
                raise KeyError("a bug")
            super().apply(event)

    view = FailsOnce()
    r = Reflector(kube, NODES, view, watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
        assert r.synced.wait(5)
        kube.create(NODES, {"metadata": {"name": "n1"}})
        _eventually(lambda: view.names == {"n1"})
        assert r.lists == 2 and view.replaces == 2  # from a list, not a replayed event
    (record,) = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert record.getMessage() == "nodes: handler failed; listing again"
    assert record.exc_info is not None and record.exc_info[1] is not None
    assert str(record.exc_info[1]) == "'a bug'"


def test_after_list_runs_after_the_handler_inside_while_listing_at_each_list() -> None:
    kube = FakeKube(history=100)
    kube.create(NODES, {"metadata": {"name": "n0"}})
    order: list[str] = []

    class Ordered(View):
        def replace(self, items: list[dict]) -> None:
            order.append("replace")
            super().replace(items)

    class Listing:
        def __enter__(self) -> None:
            order.append("enter")

        def __exit__(self, *exc: object) -> None:
            order.append("exit")

    r = Reflector(kube, NODES, Ordered(), watch_timeout_s=1, backoff_s=(0.01, 0.05),
                  after_list=lambda: order.append("after"), while_listing=Listing)  # fmt: skip
    with running(r, kube):
        assert r.synced.wait(5)
        kube.expire_history()
        kube.create(NODES, {"metadata": {"name": "n1"}})  # the watch is Gone: a list
        _eventually(lambda: len(order) == 8)
        assert order == ["enter", "replace", "after", "exit"] * 2


def test_a_namespace_and_a_label_selector_bound_the_list_and_the_watch() -> None:
    kube = FakeKube()

    def lease(ns: str, name: str, app: str) -> None:
        kube.create(LEASES, {"metadata": {"name": name, "labels": {"app": app}}}, ns)

    for i in range(5):
        lease("a", f"x{i}", "x")
    lease("a", "y0", "y")
    lease("b", "x9", "x")
    view = PagedView()
    r = Reflector(kube, LEASES, view, namespace="a", label_selector="app=x", page_size=2,
                  watch_timeout_s=1)  # fmt: skip
    with running(r, kube):
        assert r.synced.wait(5)
        assert view.sizes == [2, 2, 1]
        assert view.names == {f"x{i}" for i in range(5)}
        lease("b", "late-b", "x")
        lease("a", "late-y", "y")
        lease("a", "late-x", "x")
        _eventually(lambda: "late-x" in view.names)
        assert view.names == {f"x{i}" for i in range(5)} | {"late-x"}


@pytest.mark.handler_fails
def test_a_paged_handler_that_takes_no_page_is_an_error_named_for_the_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()

    class TakesNothing(View):
        def replace_pages(self, pages: Any) -> None:
            pass

    r = Reflector(kube, NODES, TakesNothing(), watch_timeout_s=1, backoff_s=(0.01, 0.05))
    with running(r, kube):
        assert not r.synced.wait(0.3)  # a view that took nothing is not synced
    errors = [rec.exc_info[1] for rec in caplog.records if rec.exc_info]
    assert errors and {str(e) for e in errors} == {"nodes: the handler took no page of the list"}
