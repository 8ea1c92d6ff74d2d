"""``Reflector``: keep a local view current by list + watch, listing again on 410 Gone.

The loop (client-go's reflector, minus the cache it would own: the handler owns the
view)::

    list  -> handler.replace(items)        the whole current set; marks synced
    watch from the list's resourceVersion -> handler.apply(event) for each change
      watch ends (server timeout)          -> watch again from the last version seen
      Gone (410: version no longer kept)    -> list again (replace, not merge)
      other ApiError                        -> back off (capped, doubling), watch again;
                                               after repeated failures list again

Bookmarks only advance the resourceVersion. The handler is called from the reflector's
thread, one call at a time; it must not block on the API.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from tessera.kube.errors import ApiError, Gone, NotFound
from tessera.kube.kinds import Kind
from tessera.kube.port import KubeApi, Obj, WatchEvent

__all__ = ["Reflector", "ReflectorHandler", "follow_one", "let_go"]

log = logging.getLogger(__name__)


class ReflectorHandler(Protocol):
    def replace(self, items: list[Obj]) -> None:
        """The complete current set (after a list); drop anything not in it. The list is
        the reflector's, emptied after the call: keep the objects, not the list."""

    def apply(self, event: WatchEvent) -> None:
        """One ADDED / MODIFIED / DELETED change."""


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
        # A resource the API server does not serve (a CRD not installed) lists as empty
        # and counts as synced; the list is tried again every backoff maximum.
        self._absent_ok = absent_ok
        self.absent = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.resource_version = ""
        self.lists = 0  # how many times it listed (1 + re-lists)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(
            target=self.run, name=f"reflector-{self._kind.plural}", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()

    def _list(self) -> None:
        with self._while_listing():
            result = self._api.list(
                self._kind,
                self._namespace,
                label_selector=self._labels,
                field_selector=self._fields,
            )
            self._handler.replace(result.items)
            self.lists += 1
            if self._after_list is not None:
                self._after_list()
        let_go(result.items)  # the handler has what it keeps
        self.absent = False
        self.resource_version = result.resource_version
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


def let_go(items: list[Any], step: int = 500) -> None:
    """Empty ``items`` from its end, ``step`` at a time. 200,000 decoded pods freed at
    once are one call into C that holds the interpreter for 0.2 s; a step at a time lets
    the other threads in between."""
    while items:
        del items[-step:]


class _OneObject:
    """A handler for one object picked by name: ``seen`` gets it after every list and
    change, None when it is gone."""

    def __init__(self, seen: Callable[[Obj | None], None]) -> None:
        self._seen = seen

    def replace(self, items: list[Obj]) -> None:
        self._seen(items[0] if items else None)

    def apply(self, event: WatchEvent) -> None:
        self._seen(None if event.type == "DELETED" else event.object)


def follow_one(
    api: KubeApi, kind: Kind, name: str, seen: Callable[[Obj | None], None]
) -> Reflector:
    """Start following the cluster-scoped object ``name`` of ``kind`` (as kubelet follows
    its own Node); ``seen`` is called from the reflector's thread. The caller stops it."""
    reflector = Reflector(api, kind, _OneObject(seen), field_selector=f"metadata.name={name}")
    reflector.start()
    return reflector
