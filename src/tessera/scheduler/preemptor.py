"""GPU preemption: a pod with a priority that finds no cards has lower-priority pods
evicted to make room (docs/scheduler.md, "GPU preemption").

kube-scheduler's own preemption never helps a Tessera pod (the GPU resources are
``ignoredByScheduler``, so its dry run finds no victim), so the extender does it. When
``filter`` places a pod nowhere, it hands the pod here (``consider``); this thread, on
the leader only:

1. skips a pod whose ``preemptionPolicy`` is ``Never``, one that is bound or being bound,
   and one whose earlier preemption is still under way (a victim still terminating, or
   evicted less than ``hold_s`` ago and not yet seen terminating);
2. skips it at once unless some pod on a node has a lower priority (the common case of
   pods of one priority costs nothing more); otherwise copies, taking the state lock
   per 200 nodes, the inventories and bookings of the first 100 offered nodes that hold
   a lower-priority pod (kube-scheduler caps its own search likewise), with each
   holder's priority;
3. outside the lock, asks the placement core (``placement.preemption``) for the fewest,
   least important victims on the best node. Card models the pod's quota rules out are
   left out, so no pod is evicted for cards the preemptor could not take.
   Victims are chosen within the PodDisruptionBudgets, read ahead (``budgets.py``): no
   pod the Eviction API would refuse, and no more pods under one budget than it allows,
   so no victim goes for a preemption a later refusal would stop. When only budgets
   stand in the way, the pod is told (``TesseraPreemptionBlocked``) and the preemption
   is tried again as soon as one of those budgets loosens (the watch says so), and
   every ``budget_retry_s`` in any case while the pod waits: kube-scheduler would not
   try the pod again for a budget's change, and a decision at 5,000 nodes costs ~0.2 s,
   too much to repeat every few seconds for every pod a budget holds up;
4. evicts them through the Eviction API (``pods/eviction``, the victim's UID a
   precondition), so budgets and graceful termination apply. A refusal all the same
   (429: a budget changed since it was read) stops that preemption, and it is tried
   again every ``retry_s``. The refused pod is passed over for ``avoid_s``: the next tries
   weigh the other candidates first and come back to it only if nothing else would make
   room, so one budget does not hold up a preemption that pods elsewhere could make;
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
from collections import Counter
from collections.abc import Callable, Mapping

from tessera.errors import FormatError, PlacementError, SpecError
from tessera.kube.errors import ApiError, Conflict, NotFound
from tessera.kube.events import EventRecorder
from tessera.kube.kinds import PODS
from tessera.kube.port import KubeApi, Obj
from tessera.model.annotations import PREEMPTING, decode_preempting, encode_preempting
from tessera.model.types import Assignment, NodeInventory, PodRequest
from tessera.placement.place import place
from tessera.placement.policies import make_policy
from tessera.placement.preemption import Holder, Preemption, choose_preemption
from tessera.scheduler.budgets import Budget, BudgetBook
from tessera.scheduler.filter import without_models
from tessera.scheduler.holds import Hold
from tessera.scheduler.nudge import nudge
from tessera.scheduler.state import PodInfo, SchedulerState, pod_priority

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
        max_nodes: int = 100,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[], None] | None = None,
        budgets: BudgetBook | None = None,
        on_blocked: Callable[[str], None] | None = None,
    ) -> None:
        self.state = state
        self.budgets = budgets if budgets is not None else BudgetBook()
        self.budgets.on_loosened = self.loosened
        self.api = api
        self.events = events
        self.leading = leading
        self.hold_s = hold_s  # a victim not seen going by then: the eviction did not take
        self.keep_s = keep_s  # the node stays held this long after the victims went
        self.retry_s = retry_s
        self.budget_retry_s = budget_retry_s  # budgets may loosen unseen (a pod elsewhere)
        self.avoid_s = avoid_s  # a pod whose eviction was refused is passed over this long
        self._refused: dict[str, float] = {}  # victim key -> passed over until (clock)
        self.max_nodes = max_nodes  # nodes weighed per preemption, as kube-scheduler caps it
        self.clock = clock
        self.on_evict = on_evict
        self.on_blocked = on_blocked  # reason: "budget" (read ahead) or "refused" (the API)
        self.policy = make_policy("binpack")  # its own: the placer is the filter's
        self._lock = threading.Lock()
        self._queue: dict[str, tuple[Obj, PodRequest, list[str]]] = {}
        self._later: dict[str, tuple[float, Obj, PodRequest, list[str]]] = {}  # refused
        self._held_by: dict[str, frozenset[str]] = {}  # pod key -> the budgets in its way
        # The last plan() left out a candidate for a budget: only then can a plan with
        # the budgets set aside (blocked) find more, so only then is it worth its cost.
        self._budgets_kept = False
        self._floor_value, self._floor_at = 0, float("-inf")
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
        with self.state.lock:  # a refused one is tried again only while its pod waits
            for key, (_, pod, request, nodes) in due.items():
                info = self.state.pods.get(key)
                if info is not None and info.uid == request.uid and not info.node_name:
                    queue.setdefault(key, (pod, request, nodes))
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
        within the disruption budgets: the decision alone (``kubectl tessera why`` shows
        it; nothing is evicted)."""
        self._budgets_kept = False
        return self._plan(pod, request, nodes, within_budgets=True)

    def blocked(
        self, pod: Obj, request: PodRequest, nodes: list[str]
    ) -> tuple[Preemption, dict[str, str]] | None:
        """The preemption for ``pod`` with the disruption budgets set aside, and why the
        Eviction API would refuse each of its victims it would refuse (victim key ->
        why; empty when it would refuse none). None: not even that would make room."""
        found = self._plan(pod, request, nodes, within_budgets=False)
        return None if found is None else (found, self._over_budget(found.victims))

    def _plan(
        self, pod: Obj, request: PodRequest, nodes: list[str], within_budgets: bool
    ) -> Preemption | None:
        priority = pod_priority(pod)
        if priority <= self._floor():
            return None  # no pod holding cards is less important: the common case, cheap
        with self.state.lock:
            excluded = self.state.quota_exclusions(request, priority)
        wanted = without_models(request, excluded) if excluded else request
        now = self.clock()
        self._refused = {k: until for k, until in self._refused.items() if until > now}
        refused = frozenset(self._refused)
        found = self._choose(nodes, wanted, priority, refused, within_budgets)
        if found is None and refused:  # nothing else would make room: those again
            found = self._choose(nodes, wanted, priority, frozenset(), within_budgets)
        if found is None and excluded:  # the namespace's quota keeps it out
            found = self._quota_plan(request, priority, excluded, nodes, refused, within_budgets)
        return found

    def _quota_plan(
        self,
        request: PodRequest,
        priority: int,
        excluded: Mapping[str, str],
        nodes: list[str],
        passed_over: frozenset[str],
        within_budgets: bool,
    ) -> Preemption | None:
        """When the namespace's GpuQuota keeps the pod off a card model: the fewest,
        least important pods of its own namespace on cards of that model, of lower
        priority, whose going makes room in the quota; then where the pod fits with them
        gone -- on any card in service, on the cards they free, or with pods evicted for
        cards as well. The best over the models the pod may use."""
        best: Preemption | None = None
        for model in sorted(excluded):
            if not all(c.gpu is None or c.gpu.allows_model(model) for c in request.containers):
                continue
            gone = self._quota_victims(request, priority, model, passed_over, within_budgets)
            if gone is None:
                continue
            only = without_models(request, [m for m in self._models() if m != model])
            found = self._place_after(only, priority, gone, nodes, passed_over, within_budgets)
            if found is not None and (best is None or found.rank() < best.rank()):
                best = found
        if best is not None and within_budgets and self._over_budget(best.victims):
            self._budgets_kept = True
            return None
        return best

    def _models(self) -> list[str]:
        with self.state.lock:
            return self.state.card_models()

    def _quota_victims(
        self,
        request: PodRequest,
        priority: int,
        model: str,
        passed_over: frozenset[str],
        within_budgets: bool,
    ) -> list[Holder] | None:
        """The fewest, least important pods of ``request``'s namespace holding cards of
        ``model`` whose going lets it fit the namespace's quotas there; None when even
        all of them would not."""
        with self.state.lock:
            going = self.state.holds.victims()
            candidates = []
            for key in self.state.quota_usage.holding_model(request.namespace, model):
                info, booking = self.state.pods.get(key), self.state.cluster.booking(key)
                if info is None or booking is None or key == request.key:
                    continue
                if self._victim(key, info, priority, going, passed_over, within_budgets):
                    h = Holder(info.uid, info.priority, booking.pod, booking.assignment)
                    candidates.append(h)
            # The least important first: lower priority, then the later key (the order
            # placement.preemption gives victims in).
            candidates.sort(key=lambda h: h.key, reverse=True)
            candidates.sort(key=lambda h: h.priority)

            def fits(victims: list[Holder]) -> bool:
                keys = [v.key for v in victims]
                return self.state.quota_fits_without(request, priority, model, keys)

            if not candidates or not fits(candidates):
                return None
            # The shortest prefix that fits: more pods gone never leaves less room, so a
            # bisection finds it in log k checks (each O(k)) where adding one at a time
            # made k.
            lo, hi = 1, len(candidates)
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(candidates[:mid]):
                    hi = mid
                else:
                    lo = mid + 1
            chosen = candidates[:lo]
            for h in sorted(chosen, key=lambda h: (-h.priority, h.key)):  # give back
                rest = [c for c in chosen if c is not h]
                if rest and fits(rest):
                    chosen = rest
        return chosen

    def _place_after(
        self,
        pod: PodRequest,
        priority: int,
        gone: list[Holder],
        nodes: list[str],
        passed_over: frozenset[str],
        within_budgets: bool,
    ) -> Preemption | None:
        """Where ``pod`` goes once the pods ``gone`` (evicted for quota room) are gone,
        and who else must go for cards: none where it fits as things are, none where it
        fits on what they free, else the node-level choice without them."""
        gone_keys = frozenset(h.key for h in gone)

        def plan(node: str, decision: Assignment, more: tuple[Holder, ...] = ()) -> Preemption:
            victims = tuple(sorted((*gone, *more), key=lambda h: (h.priority, h.key)))
            return Preemption(node, victims, decision, for_quota=gone_keys)

        with self.state.lock:
            held = self.state.holds.against(pod.key, priority)
            snap = self.state.cluster.snapshot()
            names = [n for n in nodes if n not in held]
            try:
                now = place(snap, pod, self.policy, names)
                return plan(now.node, now.assignment)
            except PlacementError:
                pass
            freed = {h.assignment.node for h in gone} - held.keys()
            for node in sorted(freed):
                try:
                    scratch = self.state.cluster.node_without(node, gone_keys)
                    on = place(scratch.snapshot(), pod, self.policy)
                except (PlacementError, SpecError):
                    continue
                return plan(node, on.assignment)
        candidates = [
            (inv, [h for h in holders if h.key not in gone_keys])
            for inv, holders in self._candidates(
                nodes, pod.key, priority, passed_over | gone_keys, within_budgets=within_budgets
            )
        ]
        found = choose_preemption(candidates, pod, priority, self.policy)
        return None if found is None else plan(found.node, found.decision, found.victims)

    def _choose(
        self,
        nodes: list[str],
        wanted: PodRequest,
        priority: int,
        passed_over: frozenset[str],
        within_budgets: bool,
        tries: int = 8,
    ) -> Preemption | None:
        """The best preemption among ``nodes``. Within budgets, a victim the Eviction API
        would refuse only beside the others (two pods under a budget that allows one) is
        passed over in turn and the choice made again, ``tries`` times at most."""
        for _ in range(tries):
            candidates = self._candidates(
                nodes, wanted.key, priority, passed_over, within_budgets=within_budgets
            )
            found = choose_preemption(candidates, wanted, priority, self.policy)
            if found is None or not within_budgets:
                return found
            over = self._over_budget(found.victims)
            if not over:
                return found
            self._budgets_kept = True
            passed_over = passed_over | frozenset(over)
        return None

    def _over_budget(self, victims: tuple[Holder, ...]) -> dict[str, str]:
        """The victims the Eviction API would refuse if all were evicted in this order,
        and why."""
        spent: Counter[str] = Counter()
        out = {}
        with self.state.lock:
            infos = [(v.key, self.state.pods.get(v.key)) for v in victims]
        for key, info in infos:
            if info is not None and info.disruptee is not None:
                why = self.budgets.refusal(info.disruptee, spent)
                if why:
                    out[key] = why
        return out

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
        evicted, refused = self._evict(pod, found, priority)
        if refused:
            with self._lock:
                self._later[request.key] = (self.clock() + self.retry_s, pod, request, nodes)
        if evicted:
            with self.state.lock:
                until = self.clock() + self.hold_s
                hold = Hold(request.key, uid, priority, found.node, frozenset(evicted), until,
                            request=request, decision=found.decision)  # fmt: skip
                self.state.holds.put(hold)
            self._record(request.key, uid, found, evicted)
        return found

    def _blocked(self, pod: Obj, request: PodRequest, nodes: list[str]) -> None:
        """When only disruption budgets stand in the way, say so on the pod and try again
        when one of them loosens, or in ``budget_retry_s`` (a budget's change would not
        have kube-scheduler try the pod)."""
        if not self._budgets_kept:
            return  # no budget left a candidate out: setting them aside finds nothing
        blocked = self.blocked(pod, request, nodes)
        if blocked is None or not blocked[1]:
            return
        found, why = blocked
        refusals = "; ".join(f"{key}: {reason}" for key, reason in why.items())
        if self.on_blocked is not None:
            self.on_blocked("budget")
        self.events.record(pod, "TesseraPreemptionBlocked",
                           f"evicting on {found.node} would make room, but the Eviction "
                           f"API would refuse {refusals}")  # fmt: skip
        in_way = frozenset(b.key for v in found.victims if v.key in why
                           for b in self._covering(v.key))  # fmt: skip
        with self._lock:
            later = self.clock() + self.budget_retry_s
            self._later[request.key] = (later, pod, request, nodes)
            self._held_by[request.key] = in_way

    def _covering(self, key: str) -> list[Budget]:
        """The budgets over the pod ``key`` (none when it is not known)."""
        with self.state.lock:
            info = self.state.pods.get(key)
        if info is None or info.disruptee is None:
            return []
        return self.budgets.covering(info.disruptee)

    def _record(self, key: str, uid: str, found: Preemption, evicted: list[str]) -> None:
        """Write the preemption on its pod (``tessera.io/preempting``: the node, the
        victims and where the pod is to go), so a leader that takes over keeps holding
        it while the victims go."""
        ns, _, name = key.partition("/")
        patch = {"metadata": {"uid": uid, "annotations": {PREEMPTING: encode_preempting(
            found.node, evicted, found.decision)}}}  # fmt: skip
        try:
            self.api.merge_patch(PODS, name, patch, ns)
        except NotFound:
            pass  # gone meanwhile
        except ApiError as exc:  # the hold holds here; only a takeover would lose it
            log.warning("could not record %s's preemption on its pod: %s", key, exc)

    def adopt_holds(self) -> list[str]:
        """Hold again, as a new leader, what an earlier one evicted pods for: from each
        pending pod's ``tessera.io/preempting`` whose victims are not all gone (lock held).
        Without it the new leader would see the preemptor still not fit while its victims
        terminate, and evict a second set for it. Returns the pending pods whose victims
        are all gone: the leader before may have died before it nudged them. (``kubectl
        tessera why`` holds the same, to judge a pod as the leader does.)"""
        until = self.clock() + self.hold_s
        freed = []
        for info in list(self.state.pods.values()):
            if info.node_name or info.preempting is None or info.key in self.state.holds:
                continue
            try:
                record = decode_preempting(info.key, info.preempting)
            except FormatError as exc:
                log.warning("%s", exc)
                continue
            if any(v in self.state.pods for v in record.victims):
                hold = Hold(info.key, info.uid, info.priority, record.node, record.victims, until,
                            request=info.request, decision=record.placement)  # fmt: skip
                self.state.holds.put(hold)
                log.info("holding %s for %s, as the leader before did", record.node, info.key)
            else:
                freed.append(info.key)
        return freed

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

    def _floor(self) -> int:
        """The lowest priority of a pod on a node, recomputed at most once a second."""
        now = self.clock()
        if now - self._floor_at >= 1.0:
            with self.state.lock:
                placed = [i.priority for i in self.state.pods.values() if i.node_name]
            self._floor_value = min(placed, default=2**31)
            self._floor_at = now
        return self._floor_value

    def _candidates(
        self,
        nodes: list[str],
        key: str,
        priority: int,
        passed_over: frozenset[str] = frozenset(),
        chunk: int = 200,
        within_budgets: bool = True,
    ) -> list[tuple[NodeInventory, list[Holder]]]:
        """Up to ``max_nodes`` of the offered nodes that hold a lower-priority pod, in the
        order offered, with their holders; not those held for a pod at least as important
        as ``key``. The lock is taken per ``chunk`` nodes, so a scan of 5,000 nodes never
        holds the verbs for long. A holder being bound, being evicted or already
        terminating is no victim, nor one ``passed_over`` (its eviction was refused), nor,
        ``within_budgets``, one a disruption budget protects."""
        out: list[tuple[NodeInventory, list[Holder]]] = []
        for start in range(0, len(nodes), chunk):
            with self.state.lock:
                held = self.state.holds.against(key, priority)
                some = [n for n in nodes[start : start + chunk] if n not in held]
                room = self.max_nodes - len(out)
                out += self._scan(some, priority, room, passed_over, within_budgets)
            if len(out) >= self.max_nodes:
                break
        return out

    def _scan(
        self,
        nodes: list[str],
        priority: int,
        room: int,
        passed_over: frozenset[str],
        within_budgets: bool,
    ) -> list[tuple[NodeInventory, list[Holder]]]:
        going = self.state.holds.victims()
        cluster = self.state.cluster
        out = []
        for node in nodes:
            if node not in cluster:
                continue
            holders = []
            for key in cluster.pods_on(node):
                booking = cluster.booking(key)
                if booking is None:
                    continue
                info = self.state.pods.get(key)
                evictable = self._victim(key, info, priority, going, passed_over, within_budgets)
                prio = info.priority if info is not None else priority  # unknown: no victim
                uid = info.uid if info is not None else ""
                holders.append(Holder(uid, prio, booking.pod, booking.assignment, evictable))
            if any(h.evictable and h.priority < priority for h in holders):
                out.append((cluster.node(node), holders))
                if len(out) >= room:
                    break
        return out

    def _victim(
        self,
        key: str,
        info: PodInfo | None,
        priority: int,
        going: set[str],
        passed_over: frozenset[str],
        within_budgets: bool,
    ) -> bool:
        """Whether pod ``key`` may be evicted for a pod of ``priority`` (lock held): known
        and less important; not terminating, being bound or being evicted already; not
        passed over (its eviction was refused); and, ``within_budgets``, let go by its
        disruption budget."""
        return (
            info is not None
            and info.priority < priority
            and not info.terminating
            and key not in self.state.reservations
            and key not in going
            and key not in passed_over
            and not (within_budgets and self._protected(info))
        )

    def _protected(self, info: PodInfo) -> bool:
        """Whether a disruption budget keeps the Eviction API from evicting the pod."""
        kept = info.disruptee is not None and bool(self.budgets.refusal(info.disruptee))
        self._budgets_kept |= kept
        return kept

    def _evict(self, pod: Obj, found: Preemption, priority: int) -> tuple[list[str], bool]:
        """The victims evicted (or gone already), and whether the API refused one."""
        meta = pod.get("metadata") or {}
        me = f"{meta.get('namespace')}/{meta.get('name')}"
        evicted: list[str] = []
        refused = False
        for v in found.victims:
            ns, _, name = v.key.partition("/")
            try:
                self.api.evict(ns, name, v.uid)
            except (NotFound, Conflict):
                evicted.append(v.key)  # gone already, or another pod of that name now
                continue
            except ApiError as exc:
                why = "a PodDisruptionBudget" if exc.status == 429 else str(exc)
                log.info("preemption for %s on %s stopped at %s: %s", me, found.node, v.key, why)
                refused_msg = f"evicting {v.key} on {found.node} was refused: {why}"
                self.events.record(pod, "TesseraPreemptionBlocked", refused_msg)
                self._refused[v.key] = self.clock() + self.avoid_s
                if self.on_blocked is not None:
                    self.on_blocked("refused")
                refused = True
                break
            evicted.append(v.key)
            if self.on_evict is not None:
                self.on_evict()
            victim = {"metadata": {"namespace": ns, "name": name, "uid": v.uid}}
            self.events.record(victim, "TesseraPreempted",
                               f"evicted for {me} (priority {priority}), which needs cards "
                               f"on {found.node}")  # fmt: skip
        if evicted:
            gone = [str(v) for v in found.victims if v.key in evicted]
            log.info("preempting on %s for %s: %s", found.node, me, ", ".join(gone))
            done = [v for v in found.victims if v.key in evicted]
            message = dataclasses.replace(found, victims=tuple(done)).describe()
            self.events.record(pod, "TesseraPreempting", message, "Normal")
        return evicted, refused
