"""Which pods a GPU preemption would evict, and where: the decision alone, over the
scheduler's state, with no API call (docs/scheduler.md, "GPU preemption"). The
preemptor (``preemptor.py``) acts on it; ``kubectl tessera why`` shows it.

1. Nothing, at once, unless some pod on a node has a lower priority (the common case of
   pods of one priority costs nothing more).
2. Otherwise, taking the state lock per 200 nodes, a copy of the inventories and
   bookings of the first ``max_nodes`` offered nodes that hold a lower-priority pod
   (kube-scheduler caps its own search likewise), with each holder's priority, leaving
   out the nodes held for a pod at least as important.
3. Outside the lock, the placement core (``placement.preemption``) chooses the fewest,
   least important victims on the best node. Card models the pod's quota rules out are
   left out, so no pod is evicted for cards the preemptor could not take.
4. Victims are chosen within the PodDisruptionBudgets, read ahead (``budgets.py``): no
   pod the Eviction API would refuse, and no more pods under one budget than it allows.
5. When the namespace's GpuQuota, not the cards, keeps the pod out: pods of its own
   namespace, of lower priority, for quota room (``_quota_plan``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping

from tessera.errors import PlacementError, SpecError
from tessera.kube.port import Obj
from tessera.model.types import Assignment, NodeInventory, PodRequest
from tessera.placement.place import place
from tessera.placement.policies import make_policy
from tessera.placement.preemption import Holder, Preemption, choose_preemption
from tessera.scheduler.budgets import Budget, BudgetBook
from tessera.scheduler.filter import without_models
from tessera.scheduler.state import PodInfo, SchedulerState, pod_priority

__all__ = ["PreemptionPlanner", "shortest_run"]


def shortest_run(k: int, fits: Callable[[int], bool]) -> int | None:
    """The least n in 1..k with ``fits(n)``, for a ``fits`` that stays true once true
    (more pods gone never leave less room); None when not even k fits. Found by doubling
    n until it fits, then halving the gap: O(log m) calls for an answer m, the longest
    of them 2m, so a check of all k comes only when nothing shorter fits (adding one at a
    time was m calls, O(m^2) work when a call costs its n)."""
    short, n = 0, 1  # the longest run known not to fit, and the one tried
    while n <= k and not fits(n):
        if n == k:
            return None
        short, n = n, min(2 * n, k)
    if n > k:
        return None  # k is 0
    lo, hi = short + 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class PreemptionPlanner:
    def __init__(
        self,
        state: SchedulerState,
        budgets: BudgetBook,
        *,
        max_nodes: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.budgets = budgets
        self.max_nodes = max_nodes  # nodes weighed per preemption, as kube-scheduler caps it
        self.clock = clock
        self.policy = make_policy("binpack")  # its own: the placer is the filter's
        # The last plan within the budgets left out a candidate for one: only then can a
        # plan with the budgets set aside (blocked) find more, so only then is it worth
        # its cost.
        self.budgets_kept = False
        self._floor_value, self._floor_at = 0, float("-inf")

    def plan(
        self,
        pod: Obj,
        request: PodRequest,
        nodes: list[str],
        passed_over: frozenset[str] = frozenset(),
        within_budgets: bool = True,
    ) -> Preemption | None:
        """The victims a preemption for ``pod`` would evict among ``nodes``, and where;
        the pods ``passed_over`` (their eviction was refused lately) only if nothing else
        would make room. ``within_budgets``: no victim a disruption budget protects."""
        if within_budgets:
            self.budgets_kept = False
        priority = pod_priority(pod)
        if priority <= self._floor():
            return None  # no pod holding cards is less important: the common case, cheap
        with self.state.lock:
            excluded = self.state.quotas.exclusions(request, priority)
        wanted = without_models(request, excluded) if excluded else request
        found = self._choose(nodes, wanted, priority, passed_over, within_budgets)
        if found is None and passed_over:  # nothing else would make room: those again
            found = self._choose(nodes, wanted, priority, frozenset(), within_budgets)
        if found is None and excluded:  # the namespace's quota keeps it out
            found = self._quota_plan(
                request, priority, excluded, nodes, passed_over, within_budgets
            )
        return found

    def blocked(
        self,
        pod: Obj,
        request: PodRequest,
        nodes: list[str],
        passed_over: frozenset[str] = frozenset(),
    ) -> tuple[Preemption, dict[str, str]] | None:
        """The preemption for ``pod`` with the disruption budgets set aside, and why the
        Eviction API would refuse each of its victims it would refuse (victim key ->
        why; empty when it would refuse none). None: not even that would make room."""
        found = self.plan(pod, request, nodes, passed_over, within_budgets=False)
        return None if found is None else (found, self.over_budget(found.victims))

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
        if best is not None and within_budgets and self.over_budget(best.victims):
            self.budgets_kept = True
            return None
        return best

    def _models(self) -> list[str]:
        with self.state.lock:
            return self.state.quotas.models()

    def _quota_victims(
        self,
        request: PodRequest,
        priority: int,
        model: str,
        passed_over: frozenset[str],
        within_budgets: bool,
        chunk: int = 2000,
    ) -> list[Holder] | None:
        """The fewest, least important pods of ``request``'s namespace holding cards of
        ``model`` whose going lets it fit the namespace's quotas there; None when even
        all of them would not. The lock is taken per ``chunk`` pods, as in the node scan:
        one team may hold tens of thousands, and a scan of them all under the lock held
        every verb for ~0.1 s at 40,000."""
        with self.state.lock:
            keys = list(self.state.quotas.usage.holding_model(request.namespace, model))
            going = self.state.holds.victims()
        order: list[tuple[int, str]] = []  # (priority, key) of each that may go
        for start in range(0, len(keys), chunk):
            with self.state.lock:
                for key in keys[start : start + chunk]:
                    info = self.state.pods.get(key)
                    booked = self.state.cluster.booking(key) is not None
                    if info is None or key == request.key or not booked:
                        continue
                    if self._victim(key, info, priority, going, passed_over, within_budgets):
                        order.append((info.priority, key))
        # The least important first: lower priority, then the later key (the order
        # placement.preemption gives victims in).
        order.sort(key=lambda pk: pk[1], reverse=True)
        order.sort(key=lambda pk: pk[0])

        def fits(gone: list[str]) -> bool:
            with self.state.lock:
                return self.state.quotas.fits_without(request, priority, model, gone)

        run = shortest_run(len(order), lambda n: fits([k for _, k in order[:n]]))
        if run is None:
            return None
        chosen = order[:run]
        for pk in sorted(chosen, key=lambda pk: (-pk[0], pk[1])):  # give back
            rest = [c for c in chosen if c is not pk]
            if rest and fits([k for _, k in rest]):
                chosen = rest
        out = []
        with self.state.lock:
            for _, key in chosen:
                info, booking = self.state.pods.get(key), self.state.cluster.booking(key)
                if info is not None and booking is not None:  # else gone meanwhile: room
                    out.append(Holder(info.uid, info.priority, booking.pod, booking.assignment))
        return out

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
            over = self.over_budget(found.victims)
            if not over:
                return found
            self.budgets_kept = True
            passed_over = passed_over | frozenset(over)
        return None

    def over_budget(self, victims: tuple[Holder, ...]) -> dict[str, str]:
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

    def covering(self, key: str) -> list[Budget]:
        """The budgets over the pod ``key`` (none when it is not known)."""
        with self.state.lock:
            info = self.state.pods.get(key)
        if info is None or info.disruptee is None:
            return []
        return self.budgets.covering(info.disruptee)

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
        self.budgets_kept |= kept
        return kept
