"""``EventRecorder``: core/v1 Events on an object, off the caller's path, deduplicated.

``record`` only enqueues; a background thread creates the Events, so a scheduling verb
never waits on the API server for an Event. The same (object UID, reason, message) is
sent at most once per ``interval_s``. Events are best effort: a failure is logged and
dropped, never raised, and the queue is bounded (oldest kept, newest dropped when full).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import UTC, datetime

from tessera.kube.errors import ApiError
from tessera.kube.kinds import EVENTS
from tessera.kube.port import KubeApi, Obj

__all__ = ["EventRecorder"]

log = logging.getLogger(__name__)

_REMEMBER = 50_000  # messages remembered before the old ones are looked for


class EventRecorder:
    def __init__(
        self,
        api: KubeApi,
        component: str,
        instance: str = "",
        interval_s: float = 60.0,
        max_queue: int = 10_000,
    ) -> None:
        self._api = api
        self._component = component
        self._instance = instance
        self._interval = interval_s
        self._queue: queue.Queue[Obj | None] = queue.Queue(max_queue)
        self._sent: dict[tuple[str, str, str], float] = {}
        self._prune_above = _REMEMBER
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)

    def record(self, obj: Obj, reason: str, message: str, type_: str = "Warning") -> bool:
        """Queue an Event about ``obj`` (a Pod or Node dict). False for a duplicate within
        the interval, or a drop (the queue full: ``dropped`` counts it; a retry may go)."""
        meta = obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        now = time.monotonic()
        key = (uid or f"{meta.get('namespace')}/{meta.get('name')}", reason, message)
        with self._lock:
            last = self._sent.get(key)
            if last is not None and now - last < self._interval:
                return False
            self._sent[key] = now
            if len(self._sent) > self._prune_above:  # forget those past their interval
                cutoff = now - self._interval
                self._sent = {k: t for k, t in self._sent.items() if t >= cutoff}
                # A burst of distinct messages all inside the interval prunes nothing:
                # the next prune waits for twice as many, not the next record (each
                # prune copies the map; 50,000 pending pods told once each would copy
                # it on every record, on the caller's thread).
                self._prune_above = max(_REMEMBER, 2 * len(self._sent))
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = meta.get("namespace") or "default"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "namespace": meta.get("namespace"),
                "name": meta.get("name"),
                "uid": uid,
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            with self._lock:
                self.dropped += 1
                if self._sent.get(key) == now:  # not sent: the next try may go out
                    del self._sent[key]
            return False
        return True

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until the queue is empty (tests)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None:
                    return
                self._api.create(EVENTS, event, event["metadata"]["namespace"])
            except ApiError as exc:
                assert event is not None
                log.warning(
                    "event %s on %s not recorded: %s",
                    event["reason"],
                    event["involvedObject"]["name"],
                    exc,
                )
            except Exception:  # the thread must outlive any one Event
                assert event is not None
                log.exception(
                    "event %s on %s not recorded", event["reason"], event["involvedObject"]["name"]
                )
            finally:
                self._queue.task_done()
