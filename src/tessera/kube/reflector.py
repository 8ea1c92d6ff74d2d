"""``Reflector``: keep a local view current by list + watch, listing again on 410 Gone.

The loop (client-go's reflector, minus the cache it would own: the handler owns the
view)::

    list, a page of 500 at a time -> handler.replace(items)    the whole current set;
                                                                marks synced
    watch from the list's resourceVersion -> handler.apply(event) for each change
      watch ends (server timeout)          -> watch again from the last version seen
      Gone (410: version no longer kept)    -> list again (replace, not merge)
      other ApiError                        -> back off (capped, doubling), watch again;
                                               after repeated failures list again

Bookmarks only advance the resourceVersion. The handler is called from the reflector's
thread, one call at a time; it must not block on the API.

A handler that can take a list a page at a time (``PagedHandler``: the pods', whose
list is the large one) gets the pages as they come, so that the decoded objects of one
page at a time are in memory, not the whole list's: 200,000 pods as the API serves them
are ~3.7 GB decoded, where the extender keeps ~0.5 GB of what it reads of them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from tessera.kube.errors import ApiError, Gone, NotFound
from tessera.kube.kinds import Kind
from tessera.kube.port import KubeApi, Obj, WatchEvent, resource_version

__all__ = [
    "PagedHandler",
    "Reflector",
    "ReflectorHandler",
    "follow_one",
    "let_go",
    "list_pages",
    "listed",
]

log = logging.getLogger(__name__)


class ReflectorHandler(Protocol):
    def replace(self, items: list[Obj]) -> None:
        """The complete current set (after a list); drop anything not in it. The list is
        the reflector's, emptied after the call: keep the objects, not the list."""

    def apply(self, event: WatchEvent) -> None:
        """One ADDED / MODIFIED / DELETED change."""


@runtime_checkable
class PagedHandler(ReflectorHandler, Protocol):
    def replace_pages(self, pages: Iterator[list[Obj]]) -> None:
        """``replace`` for a list that comes a page at a time: the complete current set is
        every page's items. Each page is emptied once the next one is asked for (or the
        call returns): keep the objects, not the pages."""


class Reflector:
    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        handler: ReflectorHandler,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: int = 300,
        backoff_s: tuple[float, float] = (0.2, 5.0),
        after_list: Callable[[], None] | None = None,
        absent_ok: bool = False,
        while_listing: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        page_size: int = 500,
    ) -> None:
        self._api = api
        self._kind = kind
        self._handler = handler
        self._namespace = namespace
        self._labels = label_selector
        self._fields = field_selector
        self._watch_timeout = watch_timeout_s
        self._backoff = backoff_s
        self._after_list = after_list  # called after each list, inside while_listing
        self._while_listing = while_listing  # what a list and its replace run inside
        self._page_size = page_size  # objects a list asks for at a time (client-go's too)
        # A resource the API server does not serve (a CRD not installed) lists as empty
        # and counts as synced; the list is tried again every backoff maximum.
        self._absent_ok = absent_ok
        self.absent = False
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.resource_version = ""
        self.lists = 0  # how many times it listed (1 + re-lists)

    def start(self) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, name=f"reflector-{self._kind.plural}", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _list(self) -> None:
        versions: list[str] = []
        with self._while_listing():
            pages = list_pages(
                self._api,
                self._kind,
                self._namespace,
                label_selector=self._labels,
                field_selector=self._fields,
                page_size=self._page_size,
                versions=versions,
            )
            if isinstance(self._handler, PagedHandler):
                self._handler.replace_pages(pages)
                pages.close()  # the handler may not have asked past the last page
            else:
                items = [o for page in pages for o in page]
                self.resource_version = versions[-1]  # a handler may ask what it was listed at
                self._handler.replace(items)
                let_go(items)  # the handler has what it keeps
            self.lists += 1
            if self._after_list is not None:
                self._after_list()
        if not versions:
            raise RuntimeError(f"{self._kind.plural}: the handler took no page of the list")
        self.absent = False
        self.resource_version = versions[-1]
        self.synced.set()

    def _absent(self, exc: ApiError) -> None:
        if not self.absent:
            log.warning("%s: not served by the API server (%s)", self._kind.plural, exc)
            self._handler.replace([])
        self.absent = True
        self.synced.set()
        self._stop.wait(self._backoff[1])

    def run(self) -> None:
        """Block until ``stop()``; never raises."""
        delay = self._backoff[0]
        failures = 0
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                for event in self._api.watch(
                    self._kind,
                    self.resource_version,
                    self._namespace,
                    label_selector=self._labels,
                    field_selector=self._fields,
                    timeout_s=self._watch_timeout,
                ):
                    if self._stop.is_set():
                        return
                    rv = event.object.get("metadata", {}).get("resourceVersion")
                    if event.type != "BOOKMARK":
                        self._handler.apply(event)
                    if rv:
                        self.resource_version = str(rv)
                delay, failures = self._backoff[0], 0
            except Gone:
                log.info("%s: watch expired (410); listing again", self._kind.plural)
                need_list = True
            except ApiError as exc:
                if isinstance(exc, NotFound) and self._absent_ok and need_list:
                    self._absent(exc)
                    continue
                failures += 1
                need_list = need_list or failures >= 3
                log.warning("%s: %s; retrying in %.1fs", self._kind.plural, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff[1])
            except Exception:  # a handler bug must not kill the view silently
                log.exception("%s: handler failed; listing again", self._kind.plural)
                need_list = True
                self._stop.wait(delay)


def list_pages(
    api: KubeApi,
    kind: Kind,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    page_size: int = 500,
    versions: list[str] | None = None,
) -> Generator[list[Obj], None, None]:
    """A list's pages of at most ``page_size`` objects, each emptied when the next is
    asked for; each page's resourceVersion (the list's, on every page) is appended to
    ``versions``. ``Gone`` when the list's version is compacted away before its end."""
    token: str | None = None
    while True:
        result = api.list(
            kind,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=page_size,
            continue_token=token,
        )
        if versions is not None:
            versions.append(result.resource_version)
        try:
            yield result.items
        finally:
            let_go(result.items)
        token = result.continue_token
        if not token:
            return


def listed(api: KubeApi, kind: Kind) -> Iterator[Obj]:
    """Every object of ``kind``, a page of them in memory at a time."""
    return (obj for page in list_pages(api, kind) for obj in page)


def let_go(items: list[Any], step: int = 500) -> None:
    """Empty ``items`` from its end, ``step`` at a time. 200,000 decoded pods freed at
    once are one call into C that holds the interpreter for 0.2 s; a step at a time lets
    the other threads in between."""
    while items:
        del items[-step:]


class _OneObject:
    """A handler for one object picked by name: ``seen`` gets it after every list and
    change, or None when it is gone, with the resourceVersion the server said so at (the
    object's own, the list's, or the deletion's)."""

    def __init__(self, seen: Callable[[Obj | None, str], None]) -> None:
        self._seen = seen
        self.reflector: Reflector | None = None

    def replace(self, items: list[Obj]) -> None:
        if items:
            self._seen(items[0], resource_version(items[0]))
        else:
            self._seen(None, self.reflector.resource_version if self.reflector else "")

    def apply(self, event: WatchEvent) -> None:
        gone = event.type == "DELETED"
        self._seen(None if gone else event.object, resource_version(event.object))


def follow_one(
    api: KubeApi, kind: Kind, name: str, seen: Callable[[Obj | None, str], None]
) -> Reflector:
    """Start following the cluster-scoped object ``name`` of ``kind`` (as kubelet follows
    its own Node); ``seen`` is called from the reflector's thread. The caller stops it."""
    handler = _OneObject(seen)
    reflector = Reflector(api, kind, handler, field_selector=f"metadata.name={name}")
    handler.reflector = reflector
    reflector.start()
    return reflector
