"""The extender's view of the cluster, kept current by the node and pod reflectors.

``SchedulerState`` keeps two records apart, as kube-scheduler keeps its assumed pods
apart from its cache:

1. ``observed``: what each pod's ``tessera.io/assignment`` annotation says (what a bind
   wrote; survives restarts), changed only by the watch and the lists;
2. ``reservations``: the decisions this process took and has not yet seen come back
   (in flight), changed only by the verbs.

The ``ClusterState`` (cards and bookings, the placement core's input) books one of the
two per pod -- the reservation if there is one, else the observed assignment -- and
``_settle`` is the one place that keeps it so. Beside them it keeps what ``bind`` needs
of each Tessera pod (UID, node, parsed request).

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
import hashlib
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tessera.cluster import ClusterState
from tessera.errors import FormatError, PlacementError, SpecError
from tessera.kube.port import Obj, WatchEvent
from tessera.model import annotations as keys
from tessera.model.names import ResourceNames
from tessera.model.podspec import TERMINAL_PHASES, Compat, parse_pod
from tessera.model.quantity import cpu_milli, memory_mib
from tessera.model.types import (
    Assignment,
    Card,
    ContainerRequest,
    GpuRequest,
    NodeInventory,
    PodRequest,
)
from tessera.scheduler.budgets import Disruptee
from tessera.scheduler.holds import HoldBook
from tessera.scheduler.quota_gate import QuotaGate
from tessera.scheduler.reservations import Reservation, ReservationBook

__all__ = ["PodInfo", "PodUpdate", "SchedulerState", "pod_priority"]

log = logging.getLogger(__name__)

RELIST_CHUNK = 500  # pods booked per hold of the lock during a re-list
RELIST_PAUSE_S = 0.001  # between two chunks


@dataclass(slots=True)
class PodInfo:
    """What the extender keeps of one Tessera pod."""

    key: str
    uid: str
    node_name: str
    request: PodRequest | None
    assignment: Assignment | None  # as its annotation says
    assignment_digest: bytes | None = None  # of the annotation's bytes (see _digest)
    priority: int = 0  # spec.priority (GPU preemption picks lower ones)
    terminating: bool = False  # deletionTimestamp set: going already, no victim
    preempting: str | None = None  # tessera.io/preempting's bytes (read at a takeover)
    disruptee: Disruptee | None = None  # what a PodDisruptionBudget reads of it


@dataclass(frozen=True, slots=True)
class _Held:
    """A booking the state should hold (from an annotation or a reservation)."""

    uid: str
    request: PodRequest
    assignment: Assignment


def pod_priority(obj: Obj | None) -> int:
    """``spec.priority`` (the API server sets it from the PriorityClass); 0 when absent."""
    raw = ((obj or {}).get("spec") or {}).get("priority")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def _terminating(obj: Obj | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def _digest(text: str | None) -> bytes | None:
    """What tells an unchanged assignment annotation from a changed one: 16 bytes of
    BLAKE2b of its text, kept in place of the text (~350 bytes a bound pod)."""
    if text is None:
        return None
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _preempting(obj: Obj | None) -> str | None:
    raw = _annotations(obj or {}).get(keys.PREEMPTING)
    return raw if isinstance(raw, str) else None


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
        self.holds = HoldBook()  # nodes held for preempting pods (the preemptor's)
        self.doubt_s = doubt_s  # how long a bind of unknown outcome keeps its cards
        self.clock = clock
        self.pods: dict[str, PodInfo] = {}
        self.observed: dict[str, _Held] = {}  # what each pod's annotation says
        self._node_raw: dict[str, tuple[str, str, str, str]] = {}
        self.bad_nodes: dict[str, str] = {}  # node -> why its inventory was refused
        # Called (state lock held) when a node's card comes back into service: healthy
        # again or uncordoned. kube-scheduler sees no event of its own for that.
        self.on_cards_back: Callable[[list[Card]], None] | None = None
        self.cordoned_cards: dict[str, int] = {}  # node -> its cards cordoned, when any
        self.problems: Counter[str] = Counter()  # kind -> count, for metrics
        # The GpuQuotas and what each namespace's pods hold per card model (bound and
        # reserved alike: _settle counts each booking it makes).
        self.quotas = QuotaGate(self.holds, self.problems)
        self.quotas_handler = _QuotaHandler(self)
        self.nodes = _NodeHandler(self)
        self.pods_handler = _PodHandler(self)

    # --- parsing ----------------------------------------------------------------------

    def parse(self, pod: Obj) -> PodRequest | None:
        """``parse_pod`` with this scheduler's names; raises SpecError."""
        return parse_pod(pod, names=self.names, compat=self.compat)

    # --- bookings (lock held) -----------------------------------------------------------
    #
    # Two records per pod, kept apart: ``observed`` (what its annotation says, from the
    # watch) and ``reservations`` (what this process assumed and has not seen come back).
    # The cluster state books exactly one of them -- the reservation if there is one (it
    # is the newer decision), else the observed one -- and ``_settle`` keeps it so.

    def _wanted(self, key: str) -> _Held | None:
        res = self.reservations.get(key)
        if res is not None:
            return _Held(res.uid, res.request, res.assignment)
        return self.observed.get(key)

    def _count(self, key: str, want: _Held | None) -> None:
        """Count what ``key`` holds per card model against its namespace's quotas."""
        self.quotas.count(key, want.assignment if want is not None else None)

    def _settle(self, key: str) -> str:
        """Make the cluster state book what ``key`` should hold. Returns "" or why not."""
        want = self._wanted(key)
        self._count(key, want)
        have = self.cluster.booking(key)
        if have is not None:
            if want is not None and (have.pod.uid, have.assignment) == (want.uid, want.assignment):
                return ""
            self.cluster.release(key)
        if want is None:
            return ""
        if want.assignment.node not in self.cluster:
            return "node not in the cluster state"  # booked when the node comes
        # A pod seen bound holds its cards whether or not they are still in service.
        placing = key in self.reservations
        try:
            self.cluster.assign(want.request, want.assignment, placing=placing)
            return ""
        except (PlacementError, SpecError) as first:
            if placing:
                return str(first)  # the caller's decision no longer fits: it says so
            # An annotation whose pod spec no longer parses to it: book the assignment.
            fallback = request_from_assignment(key, want.assignment, want.request)
            try:
                self.cluster.assign(fallback, want.assignment, placing=False)
                return ""
            except (PlacementError, SpecError):
                self.problems["conflicting-assignment"] += 1
                log.error("pod %s: its assignment cannot be booked: %s", key, first)
                return str(first)

    def release(self, key: str, uid: str | None = None) -> bool:
        """Forget what ``key`` holds, observed and assumed (only ``uid``'s, if given)."""
        dropped = False
        obs = self.observed.get(key)
        if obs is not None and uid in (None, obs.uid):
            del self.observed[key]
            dropped = True
        res = self.reservations.get(key)
        if res is not None and uid in (None, res.uid):
            self.reservations.pop(key)
            dropped = True
        if dropped:
            self._settle(key)
        return dropped

    def unreserve(self, key: str, assignment: Assignment | None = None) -> bool:
        """Drop ``key``'s reservation (only if it is for ``assignment``, if given): the
        pod falls back to what its annotation says, if anything."""
        res = self.reservations.get(key)
        if res is None or assignment not in (None, res.assignment):
            return False
        self.reservations.pop(key)
        self._settle(key)
        return True

    def reserve(self, request: PodRequest, uid: str, assignment: Assignment) -> Reservation:
        """Book a tentative decision; raises PlacementError if it does not fit."""
        previous = self.reservations.pop(request.key)
        res = self.reservations.add(request, uid, assignment, self.clock())
        problem = self._settle(request.key)
        if problem:
            self.reservations.pop(request.key)
            if previous is not None:
                self.reservations.put(previous)
            self._settle(request.key)
            raise PlacementError(problem, {assignment.node: problem})
        return res

    def expire_reservations(self) -> int:
        gone = self.reservations.expired(self.clock())
        for r in gone:
            self.unreserve(r.pod_key, r.assignment)
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
        """What ``key`` holds: its reservation, else its observed assignment."""
        want = self._wanted(key)
        return want.assignment if want else None

    def held_count(self) -> int:
        return len(self.observed.keys() | {r.pod_key for r in self.reservations.all()})

    # --- nodes ------------------------------------------------------------------------

    def apply_node(self, obj: Obj, deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str):
            return
        if deleted:
            self._remove_node(name)
            return
        annotations = _annotations(obj)
        text = annotations.get(keys.INVENTORY)
        cordons = annotations.get(keys.CORDONED_CARDS)
        alloc = (obj.get("status") or {}).get("allocatable") or {}
        raw = (str(text), str(alloc.get("cpu", "0")), str(alloc.get("memory", "0")), str(cordons))
        if self._node_raw.get(name) == raw and (name in self.cluster or name in self.bad_nodes):
            return  # a heartbeat: nothing Tessera reads changed
        seen = name in self._node_raw  # known before: with or without a usable inventory
        self._node_raw[name] = raw
        if not isinstance(text, str):
            self._remove_node(name)
            self._node_raw[name] = raw
            return
        try:
            inv = keys.with_cordons(_inventory(name, text, alloc), keys.parse_cordoned(cordons))
        except (FormatError, SpecError) as exc:
            self.problems["bad-inventory"] += 1
            log.warning("node %s: inventory refused: %s", name, exc)
            self._remove_node(name)
            self._node_raw[name] = raw
            self.bad_nodes[name] = str(exc)
            return
        self.bad_nodes.pop(name, None)
        was = self.cluster.node(name) if name in self.cluster else None
        try:
            if was is not None:
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
        cordoned = sum(c.cordoned for c in inv.cards)
        if cordoned:
            self.cordoned_cards[name] = cordoned
        else:
            self.cordoned_cards.pop(name, None)
        # Cards that came into service on a node seen before: healthy again, uncordoned,
        # or an inventory at last (the agent starts after kubelet registers the Node, and
        # kube-scheduler moves no pod on the annotation). Not at the first list.
        before = {c.uuid for c in was.cards if c.in_service} if was is not None else set()
        back = [c for c in inv.cards if c.in_service and c.uuid not in before] if seen else []
        if back and self.on_cards_back is not None:
            self.on_cards_back(back)  # pods refused for want of them may fit now
        self.quotas.learn_cards(inv.cards)
        waiting = {k for k, h in self.observed.items() if h.assignment.node == name}
        waiting |= {r.pod_key for r in self.reservations.all() if r.node == name}
        for key in sorted(waiting):
            if self.cluster.booking(key) is None:
                self._settle(key)
            else:  # booked before its cards' models were known: count them now
                self._count(key, self._wanted(key))

    def _remove_node(self, name: str) -> None:
        self._node_raw.pop(name, None)
        self.cordoned_cards.pop(name, None)
        self.bad_nodes.pop(name, None)
        if name in self.cluster:
            self.cluster.remove_node(name)  # its bookings go; observed keeps them

    def replace_nodes(self, items: list[Obj]) -> None:
        names = {(o.get("metadata") or {}).get("name") for o in items}
        for name in [n for n in self.cluster.node_names() if n not in names]:
            self._remove_node(name)
        for name in [n for n in list(self.bad_nodes) if n not in names]:
            self._remove_node(name)
        for obj in items:
            self.apply_node(obj)

    # --- pods ---------------------------------------------------------------------------

    def prepare_pod(self, obj: Obj, deleted: bool = False) -> PodUpdate:
        """What ``apply_pod`` needs of a Pod, decoded: safe without the lock, and where
        the work is (parsing the spec, decoding the annotation), so that the lock is held
        only for the bookings. A pod that looks unchanged (same uid, node and annotation
        bytes; a racy read of ``pods``) is not parsed: it takes the request and assignment
        already decoded from those bytes. A status update of every pod, or a re-list of
        100,000 unchanged ones, then parses nothing."""
        meta = obj.get("metadata") or {}
        key = _pod_key(obj)
        uid = str(meta.get("uid") or "")
        phase = (obj.get("status") or {}).get("phase")
        if deleted or phase in TERMINAL_PHASES:
            return PodUpdate(key, uid, "", None, None, gone=True)
        # Interned: every pod on a node repeats its name.
        node_name = sys.intern(str((obj.get("spec") or {}).get("nodeName") or ""))
        raw = _annotations(obj).get(keys.ASSIGNMENT)
        text = raw if isinstance(raw, str) else None
        upd = PodUpdate(
            key, uid, node_name, text, _digest(text), obj=obj, disruptee=Disruptee.of(key, obj),
            priority=pod_priority(obj), terminating=_terminating(obj), preempting=_preempting(obj),
        )  # fmt: skip
        known = self.pods.get(key)
        if known is not None and upd.unchanged_for(known):
            # An annotation that did not decode is left to decode again, to be reported.
            if text is None or known.assignment is not None:
                upd.request, upd.assignment, upd.decoded = known.request, known.assignment, True
            return upd
        self._decode(upd)
        return upd

    def prepare_listed(self, obj: Obj) -> PodUpdate:
        """``prepare_pod`` for an item of a list: always decoded, and holding nothing of
        the object, so a list's objects can go as soon as each page is read."""
        upd = self.prepare_pod(obj)
        if not upd.decoded and not upd.gone:
            self._decode(upd)
        upd.obj = None
        return upd

    def _decode(self, upd: PodUpdate) -> None:
        try:
            upd.request = self.parse(upd.obj) if upd.obj is not None else None
        except SpecError:
            upd.request = None
        if upd.text is not None:
            try:
                upd.assignment = keys.decode_assignment(upd.key, upd.text)
            except FormatError as exc:
                upd.bad_assignment = str(exc)
        upd.decoded = True

    def apply_pod(self, obj: Obj, deleted: bool = False) -> None:
        """A pod as the watch delivers it (lock held)."""
        self.apply_update(self.prepare_pod(obj, deleted))

    def apply_update(self, upd: PodUpdate) -> None:
        """Book what a prepared pod update says (lock held)."""
        key, uid, node_name = upd.key, upd.uid, upd.node_name
        if upd.gone:
            # A terminating pod (deletionTimestamp set) keeps its cards until it is gone
            # or terminal: its containers may still run.
            info = self.pods.get(key)
            if info is not None and info.uid == uid:
                del self.pods[key]
            self.release(key, uid)
            return
        known = self.pods.get(key)
        if known is not None and upd.unchanged_for(known) and key not in self.reservations:
            # A status update (kwok, kubelet) or a label: nothing Tessera reads changed.
            known.terminating = upd.terminating
            known.preempting = upd.preempting
            known.disruptee = upd.disruptee
            return
        if not upd.decoded:
            self._decode(upd)  # left for here: an unchanged annotation that did not decode
        if upd.bad_assignment:
            self.problems["bad-assignment"] += 1
            log.warning("%s", upd.bad_assignment)
        self.pods[key] = PodInfo(
            key, uid, node_name, upd.request, upd.assignment, upd.digest,
            priority=upd.priority, terminating=upd.terminating,
            preempting=upd.preempting, disruptee=upd.disruptee,
        )  # fmt: skip
        self._observe(upd)
        self._confirm(upd)
        self._settle(key)

    def _observe(self, upd: PodUpdate) -> None:
        """Record what the pod's annotation says (lock held)."""
        key, assignment = upd.key, upd.assignment
        obs = self.observed.get(key)
        if assignment is not None:
            if obs is not None and (obs.uid, obs.assignment) == (upd.uid, assignment):
                return
            base = upd.request or request_from_assignment(key, assignment, None)
            if base.uid != upd.uid:  # a request parsed from this update has its uid
                base = dataclasses.replace(base, uid=upd.uid)
            self.observed[key] = _Held(upd.uid, base, assignment)
        elif obs is None:
            return
        elif obs.uid != upd.uid:
            del self.observed[key]  # the name now belongs to another pod
        elif not upd.node_name:
            del self.observed[key]  # the annotation was taken off an unbound pod
        # else: a bound pod lost its annotation; its containers still hold the cards

    def _confirm(self, upd: PodUpdate) -> None:
        """What the pod's update says of this process's reservation (lock held): the
        watch showing the pod bound -- with this assignment or another -- ends it."""
        res = self.reservations.get(upd.key)
        if res is None or res.uid != upd.uid:
            return
        if upd.assignment == res.assignment or upd.node_name:
            self.reservations.pop(upd.key)
        # else: unbound with a stale annotation; the bind in flight overwrites it

    def replace_pods(self, items: list[Obj], chunk: int = RELIST_CHUNK) -> None:
        """The complete set of pods (after a list), ``chunk`` pods to a page of
        ``replace_pod_pages``."""
        self.replace_pod_pages(items[i : i + chunk] for i in range(0, len(items), chunk))

    def replace_pod_pages(
        self, pages: Iterable[list[Obj]], pause_s: float = RELIST_PAUSE_S
    ) -> None:
        """The complete set of pods, a page at a time (a paged list). Decodes each page
        outside the lock as it comes, keeping nothing of its objects; then takes the lock
        once to drop what is gone and once per page to book the rest: a re-list of 50,000
        pods never holds the verbs for more than one page.

        Between pages the verbs see the pods not yet applied as they were before the
        list (still booked as they were), never fewer bookings than either view has.
        """
        batches = [[self.prepare_listed(o) for o in page] for page in pages]
        present = {(u.key, u.uid) for batch in batches for u in batch}
        with self.lock:
            for key, obs in list(self.observed.items()):
                if (key, obs.uid) not in present:
                    del self.observed[key]
                    self._settle(key)
            for res in self.reservations.all():
                if (res.pod_key, res.uid) not in present:
                    # Reserved after the list was taken (the scheduler offered us the pod,
                    # so it existed): keep it; the watch confirms it, and if the pod is gone
                    # after all, the reservation expires instead of holding the cards.
                    res.binding = False
            for key in [k for k, info in self.pods.items() if (k, info.uid) not in present]:
                del self.pods[key]
        batches.reverse()
        while batches:
            batch = batches.pop()
            with self.lock:
                for upd in batch:
                    self.apply_update(upd)
            # Freed a chunk at a time: 200,000 updates dropped at once hold the interpreter.
            del batch
            # A released lock is not handed to a waiting verb: this thread would take it
            # straight back. Sleeping lets the waiter in (100 chunks: ~0.1 s in all).
            time.sleep(pause_s)


@dataclass(slots=True)
class PodUpdate:
    """One pod as ``prepare_pod`` decoded it, for ``apply_update``."""

    key: str
    uid: str
    node_name: str
    text: str | None  # the assignment annotation's bytes
    digest: bytes | None  # _digest(text)
    obj: Obj | None = None  # to parse later if not ``decoded``
    gone: bool = False  # deleted, or terminal: its cards go
    decoded: bool = False  # request and assignment below are filled in
    request: PodRequest | None = None
    assignment: Assignment | None = None
    bad_assignment: str = ""  # why the annotation does not decode
    disruptee: Disruptee | None = None  # labels, readiness, phase (parsed outside the lock)
    priority: int = 0  # spec.priority
    terminating: bool = False  # deletionTimestamp set
    preempting: str | None = None  # tessera.io/preempting's bytes

    def unchanged_for(self, known: PodInfo | None) -> bool:
        """Whether nothing Tessera reads differs from ``known`` (same pod, node and
        assignment bytes): a status update or a label."""
        return known is not None and (known.uid, known.node_name, known.assignment_digest) == (
            self.uid,
            self.node_name,
            self.digest,
        )


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


class _QuotaHandler:
    """Reflector handler for GpuQuotas; ``on_raise(namespaces)`` is told where pods that
    waited for quota may fit now (outside the lock)."""

    def __init__(self, state: SchedulerState) -> None:
        self._s = state
        self.on_raise: Callable[[set[str]], None] | None = None

    def replace(self, items: list[Obj]) -> None:
        with self._s.lock:
            raised = self._s.quotas.replace(items)
        if raised and self.on_raise is not None:
            self.on_raise(raised)

    def apply(self, event: WatchEvent) -> None:
        with self._s.lock:
            raised = self._s.quotas.apply(event.object, deleted=event.type == "DELETED")
        ns = str((event.object.get("metadata") or {}).get("namespace") or "")
        if raised and self.on_raise is not None:
            self.on_raise({ns})


class _PodHandler:
    """Reflector handler for Pods."""

    def __init__(self, state: SchedulerState) -> None:
        self._s = state

    def replace(self, items: list[Obj]) -> None:
        self._s.replace_pods(items)  # takes the lock in steps

    def replace_pages(self, pages: Iterator[list[Obj]]) -> None:
        self._s.replace_pod_pages(pages)  # takes the lock in steps

    def apply(self, event: WatchEvent) -> None:
        upd = self._s.prepare_pod(event.object, deleted=event.type == "DELETED")
        with self._s.lock:
            self._s.apply_update(upd)
