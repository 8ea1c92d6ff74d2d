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
   keyed by a fresh allocation ID, not by the pod, and the response mounts it. A slot
   set the ledger knows is reused only while its holder lives; otherwise the holder is
   retired and the new container gets its own folder.
3. **PreStartContainer** (kubelet calls it before every start of the container) confirms
   the match from pod-resources, which by then reports exactly which container holds the
   slots, corrects the limits file (atomic rename) if the match was wrong, and restores a
   limits file that went missing. The container's process reads its limits only after.

Who a call is for: ``matching.Matcher``; what the agent holds: ``ledger.Ledger``; what
is left behind by gone containers: ``cleanup.cleanup``. This module writes the files and
answers the calls.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from tessera.errors import FormatError
from tessera.model.types import Card, ContainerAssignment
from tessera.node.allocation.cleanup import cleanup
from tessera.node.allocation.errors import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    NOT_FOUND,
    AllocationError,
)
from tessera.node.allocation.ledger import Ledger
from tessera.node.allocation.matching import Matcher, Target
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.formats.limits import decode_limits, encode_limits, limits_for
from tessera.node.isolation import ContainerEdits, Isolation, Visibility, container_edits
from tessera.node.kubelet import slots as S
from tessera.node.ports import EventSink, PodResources, PodSource, warn_best_effort

__all__ = ["AllocationError", "Allocator"]

log = logging.getLogger(__name__)


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
        context_mib: int = 0,
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
        self.context_mib = context_mib  # written into every limits file
        self.matcher = Matcher(node, pods, podres)
        self.ledger = Ledger(layout.read_allocs())
        self._corrections = 0  # kubelet's PreStartContainer calls run on several threads
        self._corrections_mu = threading.Lock()
        # Library versions the claims path's prepared claims use (cleanup keeps them).
        self.claim_libs: Callable[[], set[str]] = set

    def allocations(self) -> list[AllocRecord]:
        return self.ledger.records()

    @property
    def corrections(self) -> int:
        """Allocate matches PreStartContainer corrected (the exporter's counter)."""
        return self._corrections

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
        t = self.matcher.choose(size, None, "GetPreferredAllocation", self.ledger.claimed())
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
                raise AllocationError(
                    FAILED_PRECONDITION,
                    f"container {t.container.name!r} of pod {t.pod.key} is assigned card "
                    f"{uuid}, which has no free slot ({why})",
                    t.pod,
                )
            chosen.append(options[0])
        self.ledger.reserve(frozenset(chosen), t.claim, self.clock())
        return chosen

    def allocate(self, ids: list[str]) -> tuple[AllocRecord, ContainerEdits]:
        """Allocate for one container: write its folder, return what kubelet must inject."""
        ids = self._check_ids(ids)
        if not ids:
            raise AllocationError(INVALID_ARGUMENT, "Allocate with no device IDs")
        key = frozenset(ids)
        cards = frozenset(S.cards_of(ids))
        existing = self.ledger.holder_of(key)
        reserved = self.ledger.take_reservation(key)
        follow: Target | None = None
        if existing is not None:
            # Either kubelet asks again for a container it already has (a restart race:
            # same answer), or an app container reuses the slots of its pod's init
            # container (kubelet hands init devices on): a new allocation; or the
            # container that had these slots is gone and kubelet gave them to a new one
            # before cleanup ran: retire the old record, never hand out its limits.
            follow = self.matcher.next_in_pod(existing, cards, len(ids), self.ledger.claimed())
            if follow is None:
                if self.matcher.alive(existing):
                    return self._again(existing)
                self.ledger.retire(existing.alloc_id, key)
                log.info(
                    "slots %s of gone container %s/%s go to a new container",
                    sorted(key),
                    existing.pod_key,
                    existing.container,
                )
        for _ in range(3):
            t: Target | None = follow
            follow = None
            if t is None and reserved is not None:
                t = self.matcher.find(reserved)
                reserved = None
                if t is not None and frozenset(t.cards) != cards:
                    t = None
            if t is None:
                t = self.matcher.choose(len(ids), cards, "Allocate", self.ledger.claimed())
            alloc_id = secrets.token_hex(8)
            if not self.ledger.claim(t.claim, alloc_id):
                continue  # taken by a concurrent call: choose again
            try:
                rec = self._write(alloc_id, ids, t, confirmed=False)
            except BaseException:
                self.ledger.release(t.claim, alloc_id)
                raise
            self.ledger.record(rec)
            return rec, self._edits(rec, t.assignment)
        raise AllocationError(FAILED_PRECONDITION, f"Allocate {sorted(ids)}: lost three races")

    def pre_start(self, ids: list[str]) -> AllocRecord:
        """Confirm (or correct) who holds ``ids`` from kubelet's pod-resources report."""
        ids = self._check_ids(ids)
        key = frozenset(ids)
        rec = self.ledger.holder_of(key)
        if rec is None:
            raise AllocationError(
                NOT_FOUND, f"PreStartContainer: no allocation holds device IDs {sorted(ids)}"
            )
        # Asked on every start, restarts included: a record confirmed once is checked
        # again, since only kubelet knows who holds the slots now.
        view = self.matcher.view()
        owner = view.owner_of(key) if view is not None else None
        if owner is None:
            if not rec.confirmed:
                log.warning("pod-resources cannot confirm %s; keeping the match", rec.alloc_id)
            return self._ensure_limits(rec)
        if owner != (rec.namespace, rec.pod, rec.container):
            return self._correct(rec, owner)
        rec = self._ensure_limits(rec)
        if not rec.confirmed:
            rec = replace(rec, confirmed=True)
            self.layout.write_alloc(rec, self._limits_text_from_disk(rec))
            self.ledger.update(rec)
        return rec

    def cleanup(self, grace_s: float = 60.0) -> list[str]:
        """Remove the folders of containers that are gone (``cleanup.cleanup``)."""
        return cleanup(
            self.node,
            self.ledger,
            self.layout,
            self.pods,
            self.podres,
            self.lib_version,
            self.clock(),
            grace_s,
            frozenset(self.claim_libs()),
        )

    # --- helpers ---------------------------------------------------------------------

    def _correct(self, rec: AllocRecord, owner: tuple[str, str, str]) -> AllocRecord:
        ns, name, cname = owner
        t = self.matcher.find_by_name(ns, name, cname)
        if t is None:
            raise AllocationError(
                FAILED_PRECONDITION,
                f"kubelet reports pod {ns}/{name} container {cname!r} holds {list(rec.slots)}, "
                f"but that pod has no usable assignment on node {self.node}",
            )
        if frozenset(t.cards) != frozenset(rec.cards):
            raise AllocationError(
                FAILED_PRECONDITION,
                f"kubelet gave container {cname!r} of pod {ns}/{name} slots on cards "
                f"{sorted(rec.cards)}, but it is assigned {sorted(t.cards)}",
                t.pod,
            )
        if self.isolation is Isolation.MPS and _slices(t.assignment) != self._slices_of(rec):
            raise AllocationError(
                FAILED_PRECONDITION,
                f"container {cname!r} of pod {ns}/{name} got the MPS settings of "
                f"{rec.pod_key}/{rec.container} at Allocate; MPS limits are environment "
                "variables and cannot be corrected before start",
                t.pod,
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
        self.ledger.move_claim((rec.pod_uid, rec.container), t.claim, rec.alloc_id)
        self.ledger.update(new)
        with self._corrections_mu:
            self._corrections += 1
        return new

    def _ensure_limits(self, rec: AllocRecord) -> AllocRecord:
        """Rewrite the limits file of ``rec`` from its assignment when it is missing or
        unreadable (deleted by hand under a running container); never start without it."""
        path = self.layout.alloc_dir(rec.alloc_id) / "etc" / "limits"
        try:
            decode_limits(path.read_text())
            return rec
        except (OSError, FormatError) as exc:
            problem = exc
        t = self.matcher.find((rec.pod_uid, rec.container))
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
        warn_best_effort(self.events, t.pod, "TesseraLimitsRestored", message)
        self.ledger.update(new)
        return new

    def _slices_of(self, rec: AllocRecord) -> tuple[tuple[str, int, int], ...]:
        t = self.matcher.find((rec.pod_uid, rec.container))
        return _slices(t.assignment) if t is not None else ()

    def _write(self, alloc_id: str, ids: list[str], t: Target, confirmed: bool) -> AllocRecord:
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
            limits = limits_for(t.assignment, card_order=order, context_mib=self.context_mib)
            text = encode_limits(limits)
        except FormatError as exc:
            raise AllocationError(FAILED_PRECONDITION, f"pod {t.pod.key}: {exc}", t.pod) from exc
        self.layout.write_alloc(rec, text)
        return rec

    def _limits_text_from_disk(self, rec: AllocRecord) -> str:
        return (self.layout.alloc_dir(rec.alloc_id) / "etc" / "limits").read_text()

    def _again(self, rec: AllocRecord) -> tuple[AllocRecord, ContainerEdits]:
        # kubelet re-issues Allocate for a container it already has (restart races): same
        # folder, same answer.
        t = self.matcher.find((rec.pod_uid, rec.container))
        if t is None:
            raise AllocationError(
                FAILED_PRECONDITION,
                f"Allocate {list(rec.slots)} again: pod {rec.pod_key} has no usable "
                f"assignment on node {self.node}",
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


def _slices(ca: ContainerAssignment) -> tuple[tuple[str, int, int], ...]:
    return tuple((s.uuid, s.memory_mib, s.cores_percent) for s in ca.slices)
