"""The extender's view of the cluster, kept current by the node and pod reflectors.

``SchedulerState`` owns a ``ClusterState`` (cards and bookings, the placement core's
input) and the ``ReservationBook`` (which bookings are still tentative), and keeps what
it needs of each Tessera pod (UID, resourceVersion, node, parsed request) for ``bind``.

Sources of truth, in order:

1. a pod's ``tessera.io/assignment`` annotation (what a bind wrote; survives restarts);
2. the reservations this process took and has not yet seen come back (in flight).

A restarted extender lists the nodes and the pods and books every annotation again:
nothing else is needed to know which card holds what, so it comes back with no double
booking. (``bind`` writes the annotation in the Binding itself, so a bound pod always has
one.) A pod with an annotation but no node -- written by hand or by another tool -- is
booked too, conservatively, until the scheduler schedules it, when ``filter`` releases
it first.

Thread safety: every read or write of the state holds ``lock`` (an in-memory mutex held
for the microseconds of a booking, never across an API call). Binds therefore run their
API writes in parallel; there is no per-node lock and no lock around I/O.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.cluster import ClusterState
from tessera.errors import FormatError, PlacementError, SpecError
from tessera.kube.port import Obj, WatchEvent
from tessera.model import annotations as keys
from tessera.model.names import ResourceNames
from tessera.model.podspec import Compat, parse_pod
from tessera.model.quantity import cpu_milli, memory_mib
from tessera.model.types import (
    Assignment,
    ContainerRequest,
    GpuRequest,
    NodeInventory,
    PodRequest,
)
from tessera.scheduler.reservations import Reservation, ReservationBook

__all__ = ["PodInfo", "SchedulerState"]

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(slots=True)
class PodInfo:
    """What the extender keeps of one Tessera pod."""

    key: str
    uid: str
    resource_version: str
    node_name: str
    request: PodRequest | None
    assignment: Assignment | None  # as its annotation says
    assignment_text: str | None = None  # the annotation's bytes, to skip unchanged updates


@dataclass(frozen=True, slots=True)
class _Held:
    """A booking the state should hold (from an annotation or a reservation)."""

    uid: str
    request: PodRequest
    assignment: Assignment


def _annotations(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    value = meta.get("annotations") or {}
    return value if isinstance(value, dict) else {}


def _pod_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def request_from_assignment(
    key: str, assignment: Assignment, base: PodRequest | None
) -> PodRequest:
    """A request that the assignment satisfies exactly, for booking an annotation whose
    pod spec no longer parses (or parses to other containers)."""
    ns, _, name = key.partition("/")
    containers = []
    for c in assignment.containers:
        mem = max((s.memory_mib for s in c.slices), default=0)
        cores = max((s.cores_percent for s in c.slices), default=0)
        gpu = GpuRequest(
            count=len(c.slices),
            memory_mib=None if c.exclusive else mem,
            cores_percent=0 if c.exclusive else cores,
            exclusive=c.exclusive,
            policy=c.policy,
        )
        containers.append(ContainerRequest(name=c.name, gpu=gpu, init=c.init))
    return PodRequest(
        namespace=ns,
        name=name,
        containers=tuple(containers),
        cpu_milli=base.cpu_milli if base else 0,
        memory_mib=base.memory_mib if base else 0,
        uid=base.uid if base else "",
    )


class SchedulerState:
    def __init__(
        self,
        names: ResourceNames | None = None,
        compat: Compat | None = None,
        *,
        reservation_ttl_s: float = 30.0,
        doubt_s: float = 90.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.names = names or ResourceNames()
        self.compat = compat or Compat()
        self.lock = threading.RLock()
        self.cluster = ClusterState()
        self.reservations = ReservationBook(reservation_ttl_s)
        self.doubt_s = doubt_s  # how long a bind of unknown outcome keeps its cards
        self.clock = clock
        self.pods: dict[str, PodInfo] = {}
        self._held: dict[str, _Held] = {}
        self._node_raw: dict[str, tuple[str, str, str]] = {}
        self.bad_nodes: dict[str, str] = {}  # node -> why its inventory was refused
        self.problems: Counter[str] = Counter()  # kind -> count, for metrics
        self.nodes = _NodeHandler(self)
        self.pods_handler = _PodHandler(self)

    # --- parsing ----------------------------------------------------------------------

    def parse(self, pod: Obj) -> PodRequest | None:
        """``parse_pod`` with this scheduler's names; raises SpecError."""
        return parse_pod(pod, names=self.names, compat=self.compat)

    # --- bookings (lock held) -----------------------------------------------------------

    def hold(self, key: str, uid: str, request: PodRequest, assignment: Assignment) -> str:
        """Book ``assignment`` for ``key``, replacing what it held. Returns "" or why not."""
        self._unbook(key)
        self._held[key] = _Held(uid, request, assignment)
        return self._book(key)

    def _book(self, key: str) -> str:
        held = self._held[key]
        if held.assignment.node not in self.cluster:
            return "node not in the cluster state"  # booked when the node comes
        try:
            self.cluster.assign(held.request, held.assignment)
            return ""
        except (PlacementError, SpecError) as first:
            fallback = request_from_assignment(key, held.assignment, held.request)
            try:
                self.cluster.assign(fallback, held.assignment)
                self._held[key] = _Held(held.uid, fallback, held.assignment)
                return ""
            except (PlacementError, SpecError):
                self.problems["conflicting-assignment"] += 1
                log.error("pod %s: its assignment cannot be booked: %s", key, first)
                return str(first)

    def _unbook(self, key: str) -> None:
        self._held.pop(key, None)
        self.cluster.release(key)

    def release(self, key: str, uid: str | None = None) -> bool:
        """Drop what ``key`` holds (only if it is ``uid``'s) and its reservation."""
        held = self._held.get(key)
        if held is None or (uid is not None and held.uid != uid):
            return False
        self._unbook(key)
        self.reservations.pop(key)
        return True

    def reserve(self, request: PodRequest, uid: str, assignment: Assignment) -> Reservation:
        """Book a tentative decision; raises PlacementError if it does not fit."""
        problem = self.hold(request.key, uid, request, assignment)
        if problem:
            self._held.pop(request.key, None)
            raise PlacementError(problem, {assignment.node: problem})
        return self.reservations.add(request.key, uid, assignment, self.clock())

    def expire_reservations(self) -> int:
        now = self.clock()
        gone = self.reservations.expired(now)
        for r in gone:
            self.release(r.pod_key, r.uid)
        return len(gone)

    def doubt(self, key: str, assignment: Assignment) -> bool:
        """The bind of ``key`` with ``assignment`` may have landed: keep its cards until the
        watch shows the pod, or ``doubt_s`` passes. False when it holds nothing of this."""
        res = self.reservations.get(key)
        if res is None or res.assignment != assignment:
            return False
        res.binding = True
        res.doubt_until = self.clock() + self.doubt_s
        return True

    def bound_node(self, key: str, uid: str) -> str:
        """The node the watch shows pod ``key`` (this UID) bound to, or ""."""
        info = self.pods.get(key)
        return info.node_name if info is not None and info.uid == uid else ""

    def held(self, key: str) -> Assignment | None:
        h = self._held.get(key)
        return h.assignment if h else None

    def held_count(self) -> int:
        return len(self._held)

    # --- nodes ------------------------------------------------------------------------

    def apply_node(self, obj: Obj, deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str):
            return
        if deleted:
            self._remove_node(name)
            return
        text = _annotations(obj).get(keys.INVENTORY)
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        raw = (str(text), str(alloc.get("cpu", "0")), str(alloc.get("memory", "0")))
        if self._node_raw.get(name) == raw and (name in self.cluster or name in self.bad_nodes):
            return  # a heartbeat: nothing Tessera reads changed
        self._node_raw[name] = raw
        if not isinstance(text, str):
            self._remove_node(name)
            self._node_raw[name] = raw
            return
        try:
            inv = _inventory(name, text, alloc)
        except (FormatError, SpecError) as exc:
            self.problems["bad-inventory"] += 1
            log.warning("node %s: inventory refused: %s", name, exc)
            self._remove_node(name)
            self._node_raw[name] = raw
            self.bad_nodes[name] = str(exc)
            return
        self.bad_nodes.pop(name, None)
        try:
            if name in self.cluster:
                self.cluster.update_node(inv)
            else:
                self.cluster.add_node(inv)
        except SpecError as exc:  # e.g. a card UUID already on another node
            self.problems["bad-inventory"] += 1
            log.warning("node %s: inventory refused: %s", name, exc)
            self._remove_node(name)
            self._node_raw[name] = raw
            self.bad_nodes[name] = str(exc)
            return
        for key, held in sorted(self._held.items()):
            if held.assignment.node == name and self.cluster.booking(key) is None:
                self._book(key)

    def _remove_node(self, name: str) -> None:
        self._node_raw.pop(name, None)
        self.bad_nodes.pop(name, None)
        if name in self.cluster:
            self.cluster.remove_node(name)  # its bookings go; _held keeps them

    def replace_nodes(self, items: list[Obj]) -> None:
        names = {(o.get("metadata") or {}).get("name") for o in items}
        for name in [n for n in self.cluster.node_names() if n not in names]:
            self._remove_node(name)
        for name in [n for n in list(self.bad_nodes) if n not in names]:
            self._remove_node(name)
        for obj in items:
            self.apply_node(obj)

    # --- pods ---------------------------------------------------------------------------

    def apply_pod(self, obj: Obj, deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        key = _pod_key(obj)
        uid = str(meta.get("uid") or "")
        spec = obj.get("spec") or {}
        phase = (obj.get("status") or {}).get("phase")
        if deleted or phase in TERMINAL_PHASES:
            # A terminating pod (deletionTimestamp set) keeps its cards until it is gone
            # or terminal: its containers may still run.
            info = self.pods.get(key)
            if info is not None and info.uid == uid:
                del self.pods[key]
            self.release(key, uid)
            return
        node_name = str(spec.get("nodeName") or "")
        text = _annotations(obj).get(keys.ASSIGNMENT)
        known = self.pods.get(key)
        if (
            known is not None
            and known.uid == uid
            and known.node_name == node_name
            and known.assignment_text == text
            and key not in self.reservations
        ):
            # A status update (kwok, kubelet) or a label: nothing Tessera reads changed.
            known.resource_version = str(meta.get("resourceVersion") or "")
            return
        try:
            request = self.parse(obj)
        except SpecError:
            request = None
        assignment: Assignment | None = None
        if isinstance(text, str):
            try:
                assignment = keys.decode_assignment(key, text)
            except FormatError as exc:
                self.problems["bad-assignment"] += 1
                log.warning("%s", exc)
        self.pods[key] = PodInfo(
            key,
            uid,
            str(meta.get("resourceVersion") or ""),
            node_name,
            request,
            assignment,
            text if isinstance(text, str) else None,
        )
        res = self.reservations.get(key)
        if res is not None and res.uid == uid:
            if assignment == res.assignment:
                self.reservations.pop(key)  # confirmed: the booking stays
                return
            if not node_name:
                return  # a stale annotation; the bind in flight overwrites it
            self.reservations.pop(key)
        held = self._held.get(key)
        if assignment is not None:
            if held is not None and held.uid == uid and held.assignment == assignment:
                return
            base = request or request_from_assignment(key, assignment, None)
            base = dataclasses.replace(base, uid=uid)
            self.hold(key, uid, base, assignment)
        elif (
            held is not None and held.uid == uid and not node_name and key not in self.reservations
        ):
            self.release(key, uid)  # the annotation was taken off an unbound pod
        elif held is not None and held.uid != uid:
            self.release(key)  # the name now belongs to another pod

    def replace_pods(self, items: list[Obj]) -> None:
        present = {(_pod_key(o), str((o.get("metadata") or {}).get("uid") or "")) for o in items}
        for key, held in list(self._held.items()):
            if (key, held.uid) in present:
                continue
            res = self.reservations.get(key)
            if res is not None and res.uid == held.uid:
                # Reserved after the list was taken (the scheduler offered us the pod, so it
                # existed): keep it; the watch confirms it, and if the pod is gone after all,
                # the reservation expires instead of holding the cards for ever.
                res.binding = False
                continue
            self.release(key)
        for key in [k for k, info in self.pods.items() if (k, info.uid) not in present]:
            del self.pods[key]
        for obj in items:
            self.apply_pod(obj)


def _inventory(name: str, text: str, alloc: dict[str, Any]) -> NodeInventory:
    cpu = cpu_milli(alloc.get("cpu", "0"), f"node {name}: status.allocatable.cpu")
    mem = memory_mib(alloc.get("memory", "0"), f"node {name}: status.allocatable.memory")
    return keys.decode_inventory(name, text, cpu, mem)


class _NodeHandler:
    """Reflector handler for Nodes."""

    def __init__(self, state: SchedulerState) -> None:
        self._s = state

    def replace(self, items: list[Obj]) -> None:
        with self._s.lock:
            self._s.replace_nodes(items)

    def apply(self, event: WatchEvent) -> None:
        with self._s.lock:
            self._s.apply_node(event.object, deleted=event.type == "DELETED")


class _PodHandler:
    """Reflector handler for Pods."""

    def __init__(self, state: SchedulerState) -> None:
        self._s = state

    def replace(self, items: list[Obj]) -> None:
        with self._s.lock:
            self._s.replace_pods(items)

    def apply(self, event: WatchEvent) -> None:
        with self._s.lock:
            self._s.apply_pod(event.object, deleted=event.type == "DELETED")
