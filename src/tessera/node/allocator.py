"""Allocate -> the right pod and container, without a node-wide lock.

kubelet's device plugin calls carry only device IDs. How the agent knows whose they are
(the full argument is in docs/node-agent.md):

1. **GetPreferredAllocation** names the container. kubelet admits one pod at a time, and
   adds a pod to its pod manager *before* admitting it, so kubelet's own pod-resources
   API (v1 ``List``) shows the pod being admitted with no devices on the container being
   allocated, while every pod admitted before holds its slots. The pending container is
   the first container, in kubelet's order (init, then app), of a pod that pod-resources
   lists, that holds no slots and that the agent has not allocated. The agent answers with
   one free slot on each card of that container's assignment, and remembers the set.
2. **Allocate** gets those slots back (kubelet honours the preference when it can). A set
   the agent did not propose (topology alignment overrode it, or the agent restarted in
   between) is matched the same way as in (1), restricted to containers assigned exactly
   the cards of the slots. The container's folder (limits file, usage, allowance) is
   keyed by a fresh allocation ID, not by the pod, and the response mounts it.
3. **PreStartContainer** (kubelet calls it before the container starts) confirms the match
   from pod-resources, which by then reports exactly which container holds the slots, and
   corrects the limits file (atomic rename) if the match was wrong. The container's
   process reads its limits only after this.

No lock spans a call: a short mutex guards the in-memory ledger (dict updates), never
I/O. Claiming a container is atomic, so two concurrent calls never take the same one.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tessera.errors import FormatError
from tessera.model.types import Card, ContainerAssignment
from tessera.node import slots as S
from tessera.node.isolation import ContainerEdits, Isolation, Visibility, container_edits
from tessera.node.layout import AllocRecord, Layout
from tessera.node.limits import decode_limits, encode_limits, limits_for
from tessera.node.pods import EventSink, GpuContainer, PodInfo, PodSource

__all__ = [
    "AllocationError",
    "Allocator",
    "PodResources",
    "PodResourcesView",
]

log = logging.getLogger(__name__)

INVALID_ARGUMENT = "INVALID_ARGUMENT"
FAILED_PRECONDITION = "FAILED_PRECONDITION"
NOT_FOUND = "NOT_FOUND"


class AllocationError(Exception):
    """A call kubelet made cannot be answered; ``code`` is the gRPC status to return."""

    def __init__(self, code: str, message: str, pod: PodInfo | None = None) -> None:
        self.code = code
        self.message = message
        self.pod = pod
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class PodResourcesView:
    """kubelet's pod-resources ``List``: pods it has admitted (or is admitting) and slots."""

    pods: frozenset[tuple[str, str]]  # (namespace, name)
    held: dict[tuple[str, str, str], frozenset[str]] = field(default_factory=dict)

    def owner_of(self, slots: frozenset[str]) -> tuple[str, str, str] | None:
        for key, ids in self.held.items():
            if ids == slots:
                return key
        return None

    def holds(self, slots: Iterable[str]) -> bool:
        want = set(slots)
        return any(want & ids for ids in self.held.values())


class PodResources(Protocol):
    def view(self) -> PodResourcesView | None:
        """A fresh List; None when kubelet's pod-resources socket does not answer."""
        ...


@dataclass(frozen=True, slots=True)
class _Target:
    pod: PodInfo
    container: GpuContainer
    assignment: ContainerAssignment

    @property
    def claim(self) -> tuple[str, str]:
        return (self.pod.uid, self.container.name)

    @property
    def cards(self) -> tuple[str, ...]:
        return tuple(s.uuid for s in self.assignment.slices)


class Allocator:
    def __init__(
        self,
        node: str,
        cards: tuple[Card, ...],
        slots_per_card: int,
        layout: Layout,
        lib_version: str,
        pods: PodSource,
        podres: PodResources | None,
        events: EventSink,
        isolation: Isolation = Isolation.HOOK,
        visibility: Visibility = Visibility.ENV,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.cards = {c.uuid: c for c in cards}
        self.slots_per_card = slots_per_card
        self.layout = layout
        self.lib_version = lib_version
        self.pods = pods
        self.podres = podres
        self.events = events
        self.isolation = isolation
        self.visibility = visibility
        self.clock = clock
        self._mu = threading.Lock()  # guards the four dicts below; never held across I/O
        self._ledger: dict[str, AllocRecord] = {}
        self._by_slots: dict[frozenset[str], str] = {}
        self._claimed: dict[tuple[str, str], str] = {}  # (pod uid, container) -> alloc id
        self._reserved: dict[frozenset[str], tuple[tuple[str, str], float]] = {}
        self.corrections = 0
        for rec in layout.read_allocs():
            self._remember(rec)

    # --- ledger ----------------------------------------------------------------------

    def _remember(self, rec: AllocRecord) -> None:
        self._ledger[rec.alloc_id] = rec
        self._by_slots[frozenset(rec.slots)] = rec.alloc_id
        self._claimed[(rec.pod_uid, rec.container)] = rec.alloc_id

    def allocations(self) -> list[AllocRecord]:
        with self._mu:
            return list(self._ledger.values())

    # --- validation ------------------------------------------------------------------

    def _check_ids(self, ids: Iterable[str]) -> list[str]:
        ids = list(ids)
        bad: list[str] = []
        seen_cards: dict[str, str] = {}
        for sid in ids:
            try:
                uuid, k = S.parse_slot(sid)
            except FormatError:
                bad.append(sid)
                continue
            if uuid not in self.cards or k >= self.slots_per_card:
                bad.append(sid)
                continue
            if uuid in seen_cards:
                raise AllocationError(
                    INVALID_ARGUMENT,
                    f"device IDs {seen_cards[uuid]} and {sid} are slots of the same card; "
                    "a container gets at most one slot per card",
                )
            seen_cards[uuid] = sid
        if bad:
            raise AllocationError(
                INVALID_ARGUMENT,
                f"unknown device ID(s) {bad}: node {self.node} advertises "
                f"<card-uuid>::<0..{self.slots_per_card - 1}> for its {len(self.cards)} card(s)",
            )
        return ids

    # --- matching --------------------------------------------------------------------

    def _candidates(
        self, pods: list[PodInfo], view: PodResourcesView | None
    ) -> list[tuple[PodInfo, GpuContainer]]:
        """Per pod kubelet may be admitting, its first GPU container still to allocate."""
        out: list[tuple[PodInfo, GpuContainer]] = []
        with self._mu:
            claimed = set(self._claimed)
        for pod in sorted(pods, key=lambda p: (p.created, p.namespace, p.name)):
            if pod.node != self.node or pod.terminal or not pod.containers:
                continue
            if view is not None and (pod.namespace, pod.name) not in view.pods:
                continue  # kubelet has not reached this pod yet
            for c in pod.containers:
                if (pod.uid, c.name) in claimed:
                    continue
                if view is not None and view.held.get((pod.namespace, pod.name, c.name)):
                    continue  # kubelet already gave it slots (before an agent restart)
                out.append((pod, c))
                break
        return out

    def _choose(self, size: int, cards: frozenset[str] | None, what: str) -> _Target:
        """The container a call with ``size`` slots (on ``cards``, if known) is for."""
        view = self.podres.view() if self.podres is not None else None
        pods = self.pods.pods()
        if view is not None and len(self._candidates(pods, view)) > 1:
            # Normally one pod is listed without slots: the one kubelet is admitting.
            # More means a pod kubelet rejected is still listed; a fresh read may show
            # it Failed.
            pods = self.pods.refresh()
        target = self._match(pods, view, size, cards)
        if target is None:
            # The agent's watch may lag kubelet's: read the pods again, once.
            target = self._match(self.pods.refresh(), view, size, cards)
        if target is None:
            on = f" on cards {sorted(cards)}" if cards is not None else ""
            raise AllocationError(
                FAILED_PRECONDITION,
                f"{what}: no pod bound to node {self.node} has a container waiting for "
                f"{size} card(s){on} in its tessera.io/assignment",
            )
        return target

    def _match(
        self,
        pods: list[PodInfo],
        view: PodResourcesView | None,
        size: int,
        cards: frozenset[str] | None,
    ) -> _Target | None:
        problem: tuple[PodInfo, str] | None = None
        for pod, c in self._candidates(pods, view):
            if pod.problem:
                if view is not None:
                    # pod-resources says kubelet is admitting exactly this pod.
                    raise AllocationError(FAILED_PRECONDITION, pod.problem, pod)
                problem = problem or (pod, pod.problem)
                continue
            ca = pod.container(c.name)
            if ca is None or c.count != size:
                continue
            t = _Target(pod, c, ca)
            if cards is not None and frozenset(t.cards) != cards:
                continue
            return t
        if problem is not None:
            raise AllocationError(FAILED_PRECONDITION, problem[1], problem[0])
        return None

    # --- the three calls -------------------------------------------------------------

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        """GetPreferredAllocation for one container: one free slot on each assigned card."""
        self._check_ids(must_include)
        free: dict[str, list[str]] = {}
        for sid in available:
            try:
                uuid, _ = S.parse_slot(sid)
            except FormatError:
                raise AllocationError(INVALID_ARGUMENT, f"unknown device ID {sid!r}") from None
            free.setdefault(uuid, []).append(sid)
        t = self._choose(size, None, "GetPreferredAllocation")
        chosen: list[str] = []
        must = {S.parse_slot(s)[0]: s for s in must_include}
        for uuid in t.cards:
            if uuid in must:
                chosen.append(must[uuid])
                continue
            options = sorted(free.get(uuid, []), key=lambda s: S.parse_slot(s)[1])
            if not options:
                card = self.cards.get(uuid)
                why = "unhealthy or all its slots are in use" if card else "not on this node"
                raise self._fail(
                    t.pod,
                    FAILED_PRECONDITION,
                    f"container {t.container.name!r} of pod {t.pod.key} is assigned card "
                    f"{uuid}, which has no free slot ({why})",
                )
            chosen.append(options[0])
        with self._mu:
            self._reserved[frozenset(chosen)] = (t.claim, self.clock())
        return chosen

    def allocate(self, ids: list[str]) -> tuple[AllocRecord, ContainerEdits]:
        """Allocate for one container: write its folder, return what kubelet must inject."""
        ids = self._check_ids(ids)
        if not ids:
            raise AllocationError(INVALID_ARGUMENT, "Allocate with no device IDs")
        key = frozenset(ids)
        cards = frozenset(S.cards_of(ids))
        with self._mu:
            existing = self._by_slots.get(key)
            reserved = self._reserved.pop(key, None)
        follow: _Target | None = None
        if existing is not None:
            # Either kubelet asks again for a container it already has (a restart race:
            # same answer), or an app container reuses the slots of its pod's init
            # container (kubelet hands init devices on): a new allocation; or the
            # container that had these slots is gone and kubelet gave them to a new one
            # before cleanup ran: retire the old record, never hand out its limits.
            follow = self._next_in_pod(existing, cards, len(ids))
            if follow is None:
                if self._owner_alive(existing):
                    return self._again(existing)
                self._retire(existing, key)
        for _ in range(3):
            t: _Target | None = follow
            follow = None
            if t is None and reserved is not None:
                t = self._find(reserved[0])
                reserved = None
                if t is not None and frozenset(t.cards) != cards:
                    t = None
            if t is None:
                t = self._choose(len(ids), cards, "Allocate")
            alloc_id = secrets.token_hex(8)
            with self._mu:
                if t.claim in self._claimed:
                    continue  # taken by a concurrent call: choose again
                self._claimed[t.claim] = alloc_id
            try:
                rec = self._write(alloc_id, ids, t, confirmed=False)
            except BaseException:
                with self._mu:
                    self._claimed.pop(t.claim, None)
                raise
            with self._mu:
                self._ledger[alloc_id] = rec
                self._by_slots[key] = alloc_id
            return rec, self._edits(rec, t.assignment)
        raise AllocationError(FAILED_PRECONDITION, f"Allocate {sorted(ids)}: lost three races")

    def pre_start(self, ids: list[str]) -> AllocRecord:
        """Confirm (or correct) who holds ``ids`` from kubelet's pod-resources report."""
        ids = self._check_ids(ids)
        key = frozenset(ids)
        with self._mu:
            alloc_id = self._by_slots.get(key)
            rec = self._ledger.get(alloc_id) if alloc_id else None
        if rec is None:
            raise AllocationError(
                NOT_FOUND, f"PreStartContainer: no allocation holds device IDs {sorted(ids)}"
            )
        # Asked on every start, restarts included: a record confirmed once is checked
        # again, since only kubelet knows who holds the slots now.
        view = self.podres.view() if self.podres is not None else None
        owner = view.owner_of(key) if view is not None else None
        if owner is None:
            if not rec.confirmed:
                log.warning("pod-resources cannot confirm %s; keeping the match", rec.alloc_id)
            return self._ensure_limits(rec)
        if owner != (rec.namespace, rec.pod, rec.container):
            return self._correct(rec, owner)
        rec = self._ensure_limits(rec)
        if not rec.confirmed:
            rec = _replace(rec, confirmed=True)
            self.layout.write_alloc(rec, self._limits_text_from_disk(rec))
            with self._mu:
                self._ledger[rec.alloc_id] = rec
        return rec

    # --- helpers ---------------------------------------------------------------------

    def _find(self, claim: tuple[str, str]) -> _Target | None:
        for pod in self.pods.pods():
            if pod.uid == claim[0] and not pod.problem:
                for c in pod.containers:
                    ca = pod.container(c.name)
                    if c.name == claim[1] and ca is not None:
                        return _Target(pod, c, ca)
        return None

    def _next_in_pod(self, alloc_id: str, cards: frozenset[str], size: int) -> _Target | None:
        with self._mu:
            rec = self._ledger[alloc_id]
            claimed = set(self._claimed)
        for pod in self.pods.pods():
            if pod.uid != rec.pod_uid or pod.problem or pod.terminal:
                continue
            for c in pod.containers:
                if (pod.uid, c.name) in claimed:
                    continue
                ca = pod.container(c.name)
                t = _Target(pod, c, ca) if ca is not None else None
                if t is None or c.count != size or frozenset(t.cards) != cards:
                    have = sorted(t.cards) if t is not None else []
                    raise self._fail(
                        pod,
                        FAILED_PRECONDITION,
                        f"container {c.name!r} of pod {pod.key} was given the slots of "
                        f"container {rec.container!r} on cards {sorted(cards)} (kubelet hands "
                        f"init containers' devices on), but it is assigned {have}",
                    )
                return t
        return None

    def _find_by_name(self, ns: str, name: str, cname: str) -> _Target | None:
        for pods in (self.pods.pods(), self.pods.refresh()):
            for pod in pods:
                if (pod.namespace, pod.name) == (ns, name) and pod.node == self.node:
                    if pod.problem:
                        raise self._fail(pod, FAILED_PRECONDITION, pod.problem)
                    for c in pod.containers:
                        ca = pod.container(c.name)
                        if c.name == cname and ca is not None:
                            return _Target(pod, c, ca)
        return None

    def _correct(self, rec: AllocRecord, owner: tuple[str, str, str]) -> AllocRecord:
        ns, name, cname = owner
        t = self._find_by_name(ns, name, cname)
        if t is None:
            raise AllocationError(
                FAILED_PRECONDITION,
                f"kubelet reports pod {ns}/{name} container {cname!r} holds {list(rec.slots)}, "
                f"but that pod has no usable assignment on node {self.node}",
            )
        if frozenset(t.cards) != frozenset(rec.cards):
            raise self._fail(
                t.pod,
                FAILED_PRECONDITION,
                f"kubelet gave container {cname!r} of pod {ns}/{name} slots on cards "
                f"{sorted(rec.cards)}, but it is assigned {sorted(t.cards)}",
            )
        if self.isolation is Isolation.MPS and _slices(t.assignment) != self._slices_of(rec):
            raise self._fail(
                t.pod,
                FAILED_PRECONDITION,
                f"container {cname!r} of pod {ns}/{name} got the MPS settings of "
                f"{rec.pod_key}/{rec.container} at Allocate; MPS limits are environment "
                "variables and cannot be corrected before start",
            )
        log.warning(
            "pod-resources corrects %s: %s/%s -> %s/%s",
            rec.alloc_id,
            rec.pod_key,
            rec.container,
            t.pod.key,
            cname,
        )
        new = self._write(rec.alloc_id, list(rec.slots), t, confirmed=True)
        with self._mu:
            if self._claimed.get((rec.pod_uid, rec.container)) == rec.alloc_id:
                del self._claimed[(rec.pod_uid, rec.container)]
            self._claimed[t.claim] = rec.alloc_id
            self._ledger[rec.alloc_id] = new
            self.corrections += 1
        return new

    def _owner_alive(self, alloc_id: str) -> bool:
        """Whether the container of ``alloc_id`` may still hold its slots.

        Asked only when kubelet offers a known slot set again, so a fresh read of the
        pods is affordable: the watch may not show yet that the old pod ended.
        """
        with self._mu:
            rec = self._ledger[alloc_id]
        view = self.podres.view() if self.podres is not None else None
        if view is not None and (rec.namespace, rec.pod) not in view.pods:
            return False
        for pod in self.pods.refresh():
            if pod.uid == rec.pod_uid:
                return pod.node == self.node and not pod.terminal
        return False

    def _retire(self, alloc_id: str, key: frozenset[str]) -> None:
        """The slots of ``alloc_id`` belong to a new container; cleanup removes its folder."""
        with self._mu:
            if self._by_slots.get(key) == alloc_id:
                del self._by_slots[key]
            rec = self._ledger[alloc_id]
        log.info(
            "slots %s of gone container %s/%s go to a new container",
            sorted(key),
            rec.pod_key,
            rec.container,
        )

    def _ensure_limits(self, rec: AllocRecord) -> AllocRecord:
        """Rewrite the limits file of ``rec`` from its assignment when it is missing or
        unreadable (deleted by hand under a running container); never start without it."""
        path = self.layout.alloc_dir(rec.alloc_id) / "etc" / "limits"
        try:
            decode_limits(path.read_text())
            return rec
        except (OSError, FormatError) as exc:
            problem = exc
        t = self._find((rec.pod_uid, rec.container))
        if t is None:
            raise AllocationError(
                FAILED_PRECONDITION,
                f"the limits file of container {rec.container!r} of pod {rec.pod_key} "
                f"({problem}) cannot be restored: the pod has no usable assignment",
            )
        new = self._write(rec.alloc_id, list(rec.slots), t, confirmed=rec.confirmed)
        message = (
            f"the limits file of container {rec.container!r} was missing or unreadable "
            f"({problem}); restored from {t.pod.key}'s assignment before the container starts"
        )
        log.warning("%s: %s", t.pod.key, message)
        try:
            self.events.warn(t.pod, "TesseraLimitsRestored", message)
        except Exception:  # an Event is best effort
            log.exception("could not post an Event on %s", t.pod.key)
        with self._mu:
            self._ledger[rec.alloc_id] = new
        return new

    def _slices_of(self, rec: AllocRecord) -> tuple[tuple[str, int, int], ...]:
        t = self._find((rec.pod_uid, rec.container))
        return _slices(t.assignment) if t is not None else ()

    def _write(self, alloc_id: str, ids: list[str], t: _Target, confirmed: bool) -> AllocRecord:
        order = list(t.cards)
        rec = AllocRecord(
            alloc_id=alloc_id,
            slots=tuple(sorted(ids)),
            pod_uid=t.pod.uid,
            namespace=t.pod.namespace,
            pod=t.pod.name,
            container=t.container.name,
            cards=tuple(order),
            confirmed=confirmed,
            lib_version=self.lib_version,
            created=self.clock(),
        )
        try:
            text = encode_limits(limits_for(t.assignment, card_order=order))
        except FormatError as exc:
            raise self._fail(t.pod, FAILED_PRECONDITION, f"pod {t.pod.key}: {exc}") from exc
        self.layout.write_alloc(rec, text)
        return rec

    def _limits_text_from_disk(self, rec: AllocRecord) -> str:
        return (self.layout.alloc_dir(rec.alloc_id) / "etc" / "limits").read_text()

    def _again(self, alloc_id: str) -> tuple[AllocRecord, ContainerEdits]:
        # kubelet re-issues Allocate for a container it already has (restart races): same
        # folder, same answer.
        with self._mu:
            rec = self._ledger[alloc_id]
        t = self._find((rec.pod_uid, rec.container))
        if t is None:
            raise AllocationError(
                FAILED_PRECONDITION,
                f"Allocate {list(rec.slots)} again: pod {rec.pod_key} is no longer on this node",
            )
        return rec, self._edits(rec, t.assignment)

    def _edits(self, rec: AllocRecord, ca: ContainerAssignment) -> ContainerEdits:
        return container_edits(
            ca,
            alloc_dir=self.layout.alloc_dir(rec.alloc_id),
            lib_dir=self.layout.lib_dir(rec.lib_version),
            isolation=self.isolation,
            visibility=self.visibility,
            mps_pipe=self.layout.mps_pipe,
            alloc_id=rec.alloc_id,
        )

    def _fail(self, pod: PodInfo, code: str, message: str) -> AllocationError:
        return AllocationError(code, message, pod)

    # --- cleanup ---------------------------------------------------------------------

    def cleanup(self, grace_s: float = 60.0) -> list[str]:
        """Remove the folders of containers that are gone; return their allocation IDs.

        Gone: the pod is no longer bound to this node (or is terminal), kubelet's
        pod-resources no longer lists the slots, and the folder is older than ``grace_s``
        (an allocation whose pod the watch has not shown yet is not gone).
        """
        now = self.clock()

        def live_uids(pods: list[PodInfo]) -> set[str]:
            return {p.uid for p in pods if p.node == self.node and not p.terminal}

        # The watch cache first; a fresh list (one per node, not every 30 s) only to
        # confirm that something looks gone.
        live = live_uids(self.pods.pods())
        old = [r for r in self.allocations() if now - r.created >= grace_s]
        if any(r.pod_uid not in live for r in old):
            live = live_uids(self.pods.refresh())
        view = None
        if any(r.pod_uid not in live for r in old) and self.podres is not None:
            view = self.podres.view()
        removed: list[str] = []
        for rec in old:
            if rec.pod_uid in live:
                continue
            if view is not None and view.holds(rec.slots):
                continue
            self.layout.remove_alloc(rec.alloc_id)
            with self._mu:
                self._ledger.pop(rec.alloc_id, None)
                if self._by_slots.get(frozenset(rec.slots)) == rec.alloc_id:
                    del self._by_slots[frozenset(rec.slots)]
                if self._claimed.get((rec.pod_uid, rec.container)) == rec.alloc_id:
                    del self._claimed[(rec.pod_uid, rec.container)]
            removed.append(rec.alloc_id)
        with self._mu:
            known = set(self._ledger)
            for k, (_, at) in list(self._reserved.items()):
                if now - at > grace_s:
                    del self._reserved[k]
            used = {r.lib_version for r in self._ledger.values()} | {self.lib_version}
        for alloc_id in self.layout.alloc_ids():
            if alloc_id not in known:
                d = self.layout.alloc_dir(alloc_id)
                try:
                    age = now - d.stat().st_mtime
                except OSError:
                    continue
                if age >= grace_s:  # a folder without a record: Allocate died half-way
                    self.layout.remove_alloc(alloc_id)
                    removed.append(alloc_id)
        for version in self.layout.lib_versions():
            if version not in used:
                self.layout.remove_lib(version)
        return removed


def _slices(ca: ContainerAssignment) -> tuple[tuple[str, int, int], ...]:
    return tuple((s.uuid, s.memory_mib, s.cores_percent) for s in ca.slices)


def _replace(rec: AllocRecord, **kw: object) -> AllocRecord:
    from dataclasses import replace

    return replace(rec, **kw)  # type: ignore[arg-type]
