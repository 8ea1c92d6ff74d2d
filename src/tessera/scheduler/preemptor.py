"""GPU preemption: a pod with a priority that finds no cards has lower-priority pods
evicted to make room (docs/scheduler.md, "GPU preemption").

kube-scheduler's own preemption never helps a Tessera pod (the GPU resources are
``ignoredByScheduler``, so its dry run finds no victim), so the extender does it. When
``filter`` places a pod nowhere, it hands the pod here (``consider``); this thread, on
the leader only:

1. skips a pod whose ``preemptionPolicy`` is ``Never``, one that is bound or being bound,
   and one whose earlier preemption is still under way (a victim still terminating, or
   evicted less than ``hold_s`` ago and not yet seen terminating);
2. asks the planner (``preemption_planner.py``) for the fewest, least important
   victims on the best node, within the PodDisruptionBudgets read ahead. When only
   budgets stand in the way, the pod is told (``TesseraPreemptionBlocked``) and the
   preemption is tried again as soon as one of those budgets loosens (the watch says
   so), and every ``budget_retry_s`` in any case while the pod waits: kube-scheduler
   would not try the pod again for a budget's change, and a decision at 5,000 nodes
   costs ~0.2 s, too much to repeat every few seconds for every pod a budget holds up;
3. writes the preemption on the pod (``tessera.io/preempting``) before the first
   eviction, so a leader that dies in the middle leaves the next one what to hold; a
   record the API server does not take means no eviction, tried again in ``retry_s``;
4. evicts them through the Eviction API (``pods/eviction``, the victim's UID a
   precondition), so budgets and graceful termination apply. An eviction with no answer
   (a timeout) may have been made: its victim is held as if it were, until it goes or
   ``hold_s`` passes without it seen going, and the rest wait. One never sent (no
   connection) stops the run as well, its victim neither held nor passed over. A
   refusal all the same (429: a budget changed since it was read) stops that
   preemption, and it is tried again every ``retry_s``. The refused pod is passed over
   for ``avoid_s``: the next tries weigh the other candidates first and come back to it
   only if nothing else would make room, so one budget does not hold up a preemption
   that pods elsewhere could make.
   A retry is made only while its pod waits; one whose pod the watch has not shown yet
   is put off until it shows, for at most ``unseen_s``.
   When not every victim went, the record is written again with those that did (or
   may have), or taken off when none did;
5. records a ``TesseraPreempting`` event on the pod and ``TesseraPreempted`` on each
   victim.

What the preemptor is to get on the node is held for it from the eviction on
(``scheduler/holds.py``): until it is placed, no pod of its priority or lower is placed
there in a way that would take it. Once its victims are gone, the preemptor annotates it
(``tessera.io/quota-retry``) so kube-scheduler tries it again at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from tessera.errors import FormatError
from tessera.kube.errors import (
    MANY_BUDGETS,
    ApiError,
    Conflict,
    NotFound,
    NotSent,
    outcome_unknown,
)
from tessera.kube.events import EventRecorder
from tessera.kube.kinds import PODS
from tessera.kube.port import KubeApi, Obj
from tessera.model.annotations import PREEMPTING, decode_preempting, encode_preempting
from tessera.model.types import PodRequest
from tessera.placement.preemption import Preemption
from tessera.scheduler.budgets import BudgetBook
from tessera.scheduler.holds import Hold
from tessera.scheduler.nudge import nudge
from tessera.scheduler.preemption_planner import PreemptionPlanner
from tessera.scheduler.state import SchedulerState, pod_priority

__all__ = ["Preemptor"]

log = logging.getLogger(__name__)


class Preemptor:
    def __init__(
        self,
        state: SchedulerState,
        api: KubeApi,
        events: EventRecorder,
        leading: Callable[[], bool],
        *,
        hold_s: float = 60.0,
        keep_s: float = 30.0,
        retry_s: float = 10.0,
        budget_retry_s: float = 60.0,
        avoid_s: float = 60.0,
        unseen_s: float = 60.0,
        max_nodes: int = 100,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[], None] | None = None,
        budgets: BudgetBook | None = None,
        on_blocked: Callable[[str], None] | None = None,
    ) -> None:
        self.state = state
        self.budgets = budgets if budgets is not None else BudgetBook()
        self.budgets.on_loosened = self.loosened
        self.planner = PreemptionPlanner(state, self.budgets, max_nodes=max_nodes, clock=clock)
        self.api = api
        self.events = events
        self.leading = leading
        self.hold_s = hold_s  # a victim not seen going by then: the eviction did not take
        self.keep_s = keep_s  # the node stays held this long after the victims went
        self.retry_s = retry_s
        self.budget_retry_s = budget_retry_s  # budgets may loosen unseen (a pod elsewhere)
        self.avoid_s = avoid_s  # a pod whose eviction was refused is passed over this long
        self._refused: dict[str, float] = {}  # victim key -> passed over until (clock)
        # A retry whose pod the watch has not shown yet (a lagging re-list) is put off
        # until it shows, for at most unseen_s: not shown by then, it was deleted.
        self.unseen_s = unseen_s
        self._unseen_since: dict[str, float] = {}  # pod key -> first due unseen (clock)
        self.clock = clock
        self.on_evict = on_evict
        self.on_blocked = on_blocked  # reason: "budget" (read ahead), "refused", "unanswered"
        self._lock = threading.Lock()
        self._queue: dict[str, tuple[Obj, PodRequest, list[str]]] = {}
        self._later: dict[str, tuple[float, Obj, PodRequest, list[str]]] = {}  # refused
        self._held_by: dict[str, frozenset[str]] = {}  # pod key -> the budgets in its way
        self._adopted = False  # the holds of the leader before taken over
        self._wake = threading.Event()
        self._stop = threading.Event()

    def consider(self, pod: Obj, request: PodRequest, nodes: list[str]) -> None:
        """A pod ``filter`` placed nowhere among ``nodes``: preempt for it, soon."""
        spec = pod.get("spec") or {}
        if spec.get("preemptionPolicy") == "Never" or not nodes:
            return
        with self._lock:
            self._queue[request.key] = (pod, request, list(nodes))
        self._wake.set()

    def loosened(self, budget: str) -> None:
        """A budget (namespace/name) may let go a pod it kept: the pods it held up are
        tried again now."""
        with self._lock:
            for key, budgets in self._held_by.items():
                if budget in budgets and key in self._later:
                    _, pod, request, nodes = self._later[key]
                    self._later[key] = (float("-inf"), pod, request, nodes)
                    self._wake.set()

    def start(self) -> None:
        threading.Thread(target=self._run, name="tessera-preempt", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception:  # a bug here must not end preemption for good
                log.exception("preemption step failed")

    def step(self) -> list[Preemption]:
        """Preempt for every pod handed over since the last step (leader only)."""
        now = self.clock()
        with self._lock:
            queue, self._queue = self._queue, {}
            due = {k: v for k, v in self._later.items() if v[0] <= now}
            for key in due:
                del self._later[key]
                self._held_by.pop(key, None)
        unseen = []
        with self.state.lock:  # a refused one is tried again only while its pod waits
            for key, (_, pod, request, nodes) in due.items():
                info = self.state.pods.get(key)
                if info is None:
                    unseen.append((pod, request, nodes))
                elif info.uid == request.uid and not info.node_name:
                    queue.setdefault(key, (pod, request, nodes))
        self._wait_unseen(unseen, now)
        if not self.leading():
            if self._adopted:
                with self.state.lock:
                    self.state.holds.clear()  # the new leader holds from the annotations
                self._adopted = False
            return []
        if not self._adopted:
            with self.state.lock:
                freed = self.adopt_holds()
            self._adopted = True
            self._nudge(freed)
        self._follow_holds()
        done = []
        for pod, request, nodes in queue.values():
            found = self._preempt(pod, request, nodes)
            if found is not None:
                done.append(found)
        return done

    def plan(self, pod: Obj, request: PodRequest, nodes: list[str]) -> Preemption | None:
        """The victims a preemption for ``pod`` would evict among ``nodes``, and where,
        within the disruption budgets, passing over the pods whose eviction was refused
        lately unless nothing else would make room."""
        return self.planner.plan(pod, request, nodes, self._passed_over())

    def _passed_over(self) -> frozenset[str]:
        now = self.clock()
        self._refused = {k: until for k, until in self._refused.items() if until > now}
        return frozenset(self._refused)

    def _preempt(self, pod: Obj, request: PodRequest, nodes: list[str]) -> Preemption | None:
        priority = pod_priority(pod)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        with self.state.lock:
            if self._waiting(request.key, uid) or self._placed(request.key, uid):
                return None
        found = self.plan(pod, request, nodes)
        if found is None:
            self._blocked(pod, request, nodes)
            return None
        if not self.leading():  # lost the lease while choosing: the new leader decides
            return None
        planned = [v.key for v in found.victims]
        # The record goes first: a leader that dies once an eviction is asked leaves it on
        # the pod, and the next one holds the node instead of evicting a second set.
        written = self._record(request.key, uid, found, planned)
        if written is not True:
            if written is None:  # not written: no eviction; tried again in retry_s
                self._retry_later(pod, request, nodes)
                self._count_blocked("unanswered")
            return None
        outcome = self._evict(pod, found, priority)
        if outcome.stopped:
            self._retry_later(pod, request, nodes)
        held = outcome.evicted + outcome.unknown
        if held != planned:  # the record names only what went, or may have
            self._record(request.key, uid, found, held)
        if held:
            with self.state.lock:
                until = self.clock() + self.hold_s
                hold = Hold(request.key, uid, priority, found.node, frozenset(held), until,
                            request=request, decision=found.decision)  # fmt: skip
                self.state.holds.put(hold)
        return found

    def _count_blocked(self, reason: str) -> None:
        if self.on_blocked is not None:
            self.on_blocked(reason)

    def _wait_unseen(self, unseen: list[tuple[Obj, PodRequest, list[str]]], now: float) -> None:
        """Put off the due retries whose pods the watch has not shown: a pod ``filter``
        saw may reach the extender's watch late (a large re-list). Nothing is evicted for
        a pod not seen; one not seen within ``unseen_s`` of its first due retry is taken
        as deleted and dropped."""
        with self._lock:
            for pod, request, nodes in unseen:
                since = self._unseen_since.setdefault(request.key, now)
                if now - since < self.unseen_s:
                    self._later.setdefault(request.key, (now + self.retry_s, pod, request, nodes))
            # Only a retry still put off keeps its first time (a pod seen since, or
            # given up on, does not).
            self._unseen_since = {k: t for k, t in self._unseen_since.items() if k in self._later}

    def _retry_later(self, pod: Obj, request: PodRequest, nodes: list[str]) -> None:
        with self._lock:
            self._later[request.key] = (self.clock() + self.retry_s, pod, request, nodes)

    def _blocked(self, pod: Obj, request: PodRequest, nodes: list[str]) -> None:
        """When only disruption budgets stand in the way, say so on the pod and try again
        when one of them loosens, or in ``budget_retry_s`` (a budget's change would not
        have kube-scheduler try the pod)."""
        if not self.planner.budgets_kept:
            return  # no budget left a candidate out: setting them aside finds nothing
        blocked = self.planner.blocked(pod, request, nodes, self._passed_over())
        if blocked is None or not blocked[1]:
            return
        found, why = blocked
        refusals = "; ".join(f"{key}: {reason}" for key, reason in why.items())
        self._count_blocked("budget")
        self.events.record(pod, "TesseraPreemptionBlocked",
                           f"evicting on {found.node} would make room, but the Eviction "
                           f"API would refuse {refusals}")  # fmt: skip
        in_way = frozenset(b.key for v in found.victims if v.key in why
                           for b in self.planner.covering(v.key))  # fmt: skip
        with self._lock:
            later = self.clock() + self.budget_retry_s
            self._later[request.key] = (later, pod, request, nodes)
            self._held_by[request.key] = in_way

    def _record(self, key: str, uid: str, found: Preemption, victims: list[str]) -> bool | None:
        """Write the preemption on its pod (``tessera.io/preempting``: the node, the
        victims and where the pod is to go), so a leader that takes over keeps holding
        it while the victims go; with no victims, take the record off. True when written;
        False when the pod is gone or another pod has its name (nothing to preempt for);
        None when the API server did not take it."""
        ns, _, name = key.partition("/")
        value = encode_preempting(found.node, victims, found.decision) if victims else None
        patch = {"metadata": {"uid": uid, "annotations": {PREEMPTING: value}}}
        try:
            self.api.merge_patch(PODS, name, patch, ns)
        except (NotFound, Conflict):
            return False
        except ApiError as exc:
            # A patch's UID is no precondition to the API server: another pod under the
            # name makes it a change of the immutable metadata.uid, refused as Invalid.
            if exc.status == 422 and "metadata.uid" in exc.message:
                return False
            log.warning("could not record %s's preemption on its pod: %s", key, exc)
            return None
        return True

    def adopt_holds(self) -> list[str]:
        """Hold again what the leader before evicted pods for (lock held); see
        ``adopt_holds`` below."""
        now = self.clock()
        return adopt_holds(self.state, now + self.hold_s, freed_at=now)

    def _follow_holds(self) -> None:
        """End the holds whose pod is placed or gone, or that were kept long enough; nudge
        the pods whose victims are all gone.

        The nudge: the victims' deletion may reach kube-scheduler while it is still
        failing the pod's last attempt, and then nothing moves the pod out of its
        unschedulable queue for minutes (seen on the real kube-scheduler). An update does:
        the same one-annotation nudge as a quota's rise (``tessera.io/quota-retry``).
        """
        now = self.clock()
        waiting = []
        with self.state.lock:
            for hold in self.state.holds:
                info = self.state.pods.get(hold.key)
                alive = [v for v in hold.victims if v in self.state.pods]
                if info is None or info.uid != hold.uid or info.node_name:
                    self.state.holds.drop(hold.key)  # gone, or placed
                elif hold.freed_at is not None:
                    if now >= hold.freed_at + self.keep_s:
                        self.state.holds.drop(hold.key)
                elif not alive:
                    hold.freed_at = now
                    waiting.append(hold.key)
                elif not self._going(hold, now):
                    self.state.holds.drop(hold.key)  # the eviction did not take
        self._nudge(waiting)

    def _nudge(self, keys: list[str]) -> None:
        for key in keys:
            nudge(self.api, key, "its preemption's victims are gone")

    def _going(self, hold: Hold, now: float) -> bool:
        """Whether the hold's victims are still on their way out (lock held): one is
        terminating (its grace period may be long), or the eviction was less than
        ``hold_s`` ago and the watch has not shown it terminating yet."""
        alive = [i for i in (self.state.pods.get(v) for v in hold.victims) if i is not None]
        return bool(alive) and (any(i.terminating for i in alive) or now < hold.until)

    def _waiting(self, key: str, uid: str) -> bool:
        """Whether an earlier preemption for this pod still waits for its victims (lock
        held); one whose eviction did not take ends here, to be weighed again."""
        hold = self.state.holds.get(key)
        if hold is None or hold.freed_at is not None:
            return False
        if hold.uid == uid and self._going(hold, self.clock()):
            return True
        self.state.holds.drop(key)
        return False

    def _placed(self, key: str, uid: str) -> bool:
        """Bound, or being bound: nothing to preempt for (lock held)."""
        res = self.state.reservations.get(key)
        return bool(self.state.bound_node(key, uid)) or (res is not None and res.uid == uid)

    def _evict(self, pod: Obj, found: Preemption, priority: int) -> _Evicted:
        """Evict the victims in turn, stopping at the first the API server refuses or does
        not answer for, and before any once this replica no longer leads (each eviction
        is fenced, as a bind's write is)."""
        meta = pod.get("metadata") or {}
        me = f"{meta.get('namespace')}/{meta.get('name')}"
        out = _Evicted()
        for v in found.victims:
            if not self.leading():  # the lease lapsed meanwhile: the new leader decides
                log.info("preemption for %s on %s stopped at %s: this replica no longer "
                         "leads", me, found.node, v.key)  # fmt: skip
                out.stopped = True
                break
            ns, _, name = v.key.partition("/")
            try:
                self.api.evict(ns, name, v.uid)
            except (NotFound, Conflict):
                out.evicted.append(v.key)  # gone already, or another pod of that name now
                continue
            except ApiError as exc:
                out.stopped = True
                if isinstance(exc, NotSent):  # nothing asked: the victim is as good as before
                    self._count_blocked("unanswered")
                    log.warning("preemption for %s on %s stopped at %s, whose eviction was "
                                "not sent: %s", me, found.node, v.key, exc)  # fmt: skip
                    break
                if outcome_unknown(exc):  # it may have been evicted: held as if it were,
                    out.unknown.append(v.key)  # until it goes or hold_s passes unseen
                    self._count_blocked("unanswered")
                    log.warning("preemption for %s on %s stopped at %s, whose eviction "
                                "may have been made: %s", me, found.node, v.key, exc)  # fmt: skip
                    break
                if exc.status == 429:
                    why = "a PodDisruptionBudget"
                elif exc.message == MANY_BUDGETS:  # a 500, but a definite refusal
                    why = "more than one PodDisruptionBudget covers it"
                else:
                    why = str(exc)
                log.info("preemption for %s on %s stopped at %s: %s", me, found.node, v.key, why)
                refused_msg = f"evicting {v.key} on {found.node} was refused: {why}"
                self.events.record(pod, "TesseraPreemptionBlocked", refused_msg)
                self._refused[v.key] = self.clock() + self.avoid_s
                self._count_blocked("refused")
                break
            out.evicted.append(v.key)
            if self.on_evict is not None:
                self.on_evict()
            victim = {"metadata": {"namespace": ns, "name": name, "uid": v.uid}}
            self.events.record(victim, "TesseraPreempted",
                               f"evicted for {me} (priority {priority}), which needs cards "
                               f"on {found.node}")  # fmt: skip
        if out.evicted:
            done = [v for v in found.victims if v.key in out.evicted]
            log.info("preempting on %s for %s: %s", found.node, me, ", ".join(map(str, done)))
            message = dataclasses.replace(found, victims=tuple(done)).describe()
            self.events.record(pod, "TesseraPreempting", message, "Normal")
        return out


@dataclasses.dataclass(slots=True)
class _Evicted:
    """What a run of evictions did: the victims evicted (or gone already), the one whose
    eviction had no answer (it may have been made), and whether it stopped short."""

    evicted: list[str] = dataclasses.field(default_factory=list)
    unknown: list[str] = dataclasses.field(default_factory=list)
    stopped: bool = False


def adopt_holds(state: SchedulerState, until: float, freed_at: float | None = None) -> list[str]:
    """Hold again, as a new leader, what an earlier one evicted pods for: from each
    pending pod's ``tessera.io/preempting`` whose victims are not all gone (lock held).
    Without it the new leader would see the preemptor still not fit while its victims
    terminate, and evict a second set for it. A preemption whose victims are all gone is
    held too, as freed at ``freed_at`` (kept ``keep_s`` from then, as the leader before
    would have kept it), so a less important pod does not take the freed cards in the
    moment before the preemptor is tried again; None leaves those out. Returns the
    pending pods whose victims are all gone: the leader before may have died before it
    nudged them. (``kubectl tessera why`` holds the same but those, to judge a pod as
    the leader does.)"""
    freed = []
    for info in list(state.pods.values()):
        if info.node_name or info.preempting is None or info.key in state.holds:
            continue
        try:
            record = decode_preempting(info.key, info.preempting)
        except FormatError as exc:
            log.warning("%s", exc)
            continue
        going = any(v in state.pods for v in record.victims)
        if not going:
            freed.append(info.key)
            if freed_at is None:
                continue
        hold = Hold(info.key, info.uid, info.priority, record.node, record.victims, until,
                    freed_at=None if going else freed_at, request=info.request,
                    decision=record.placement)  # fmt: skip
        state.holds.put(hold)
        log.info("holding %s for %s, as the leader before did", record.node, info.key)
    return freed
