"""The extender's writes for quotas: each GpuQuota's status, and the nudge that makes
kube-scheduler try again the pods a raised quota lets through.

Both run on one thread, only while this replica leads, never under the state lock:

* **status** (every ``period_s``): per limit, what the namespace's pods (bound and
  reserved) and claims (allocated and admitted) hold, and which those are, written to
  the ``status`` subresource when it changed.
* **retry**: kube-scheduler keeps a pod the extender refused among its unschedulable
  pods until a cluster event moves it, or for minutes; a quota is not an object it
  watches, and a change of a Node's annotations alone moves nothing (no plugin of its
  own asks for that event). When a quota of a namespace goes up (or away), every pod of
  the namespace waiting unplaced gets the annotation ``tessera.io/quota-retry`` (a merge
  patch of that one key, allowed to the scheduler's service account by
  deploy/admission-policy.yaml and nothing else): an update to an unschedulable pod
  moves it back to the active queue. When cards come into service (healthy again,
  uncordoned, or a node's first inventory), every waiting pod that could use one of them
  gets it: some GPU container of it admits the card's model (and UUID, if pinned) and
  asks no more memory than the card has. Lowering a quota never evicts anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from tessera.kube.errors import ApiError, NotFound
from tessera.kube.kinds import GPUQUOTAS
from tessera.kube.port import KubeApi
from tessera.model.types import Card, PodRequest
from tessera.quota.claims import CLAIM_HOLDER
from tessera.scheduler.nudge import nudge
from tessera.scheduler.state import SchedulerState

__all__ = ["QuotaWriter", "quota_status"]

log = logging.getLogger(__name__)

MAX_HOLDERS = 50  # pods and claims named per limit in the status; the counts are exact
# Rounds that nudge for cards come into service are this far apart at least: when many
# nodes join at once, each would otherwise patch every pending pod.
# kube-scheduler's own backoff tops out at 10 s, so a pod waits no longer than that.
CARDS_BACK_EVERY_S = 10.0


def quota_status(state: SchedulerState, namespace: str, key: str) -> dict[str, Any] | None:
    """The status of quota ``key`` from the state (lock held); None if it is gone."""
    quota = state.quotas.book.get(namespace, key)
    if quota is None:
        return None
    limits = []
    for lim in quota.limits:
        used = state.quotas.usage.of(namespace, lim)
        names = [k.partition("/")[2] for k in state.quotas.usage.holders(namespace, lim)]
        limits.append(
            {
                "name": lim.name,
                "used": {
                    "memoryMiB": used.memory_mib,
                    "coresPercent": used.cores_percent,
                    "cards": used.cards,
                },
                "pods": sum(1 for k in names if not k.startswith(CLAIM_HOLDER)),
                "claims": sum(1 for k in names if k.startswith(CLAIM_HOLDER)),
                "holders": names[:MAX_HOLDERS],
            }
        )
    return {"limits": limits}


class _CardsBack:
    """Cards come into service, grouped so that a pod is weighed against each kind of
    card (model, memory) once, not against every card: thousands of waiting pods meet
    hundreds of cards when a rack comes back."""

    def __init__(self, cards: Iterable[Card]) -> None:
        self.by_uuid = {c.uuid: c for c in cards}
        self.kinds = {(c.model, c.memory_mib) for c in self.by_uuid.values()}

    def of_use_to(self, pod: PodRequest) -> bool:
        """Whether some GPU container of ``pod`` could take one of the cards, were it
        empty. Never False when the cards could help; a UUID exclusion is not weighed,
        which can only nudge a pod too many."""
        for c in pod.gpu_containers():
            gpu = c.gpu
            assert gpu is not None
            if gpu.uuids:
                pinned = [self.by_uuid[u] for u in gpu.uuids if u in self.by_uuid]
                if any(gpu.could_fit_on(card.model, card.memory_mib) for card in pinned):
                    return True
            elif any(gpu.could_fit_on(model, mib) for model, mib in self.kinds):
                return True
        return False


class QuotaWriter:
    def __init__(
        self,
        state: SchedulerState,
        api: KubeApi,
        leading: Callable[[], bool],
        period_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        on_nudge: Callable[[str], None] | None = None,
        before_round: Callable[[], None] | None = None,
    ) -> None:
        self.state = state
        self.api = api
        self.leading = leading
        self.period_s = period_s
        self.clock = clock
        self._raised: set[str] = set()
        self._back: dict[str, Card] = {}  # came into service since the last such round
        self._back_at = -CARDS_BACK_EVERY_S  # clock() of the last such round
        self._written: dict[str, dict[str, Any]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.nudged = 0  # pods annotated to be tried again (for tests and metrics)
        self.on_nudge = on_nudge
        self.before_round = before_round  # brings the counts up to date (claims' expiry)

    def raised(self, namespaces: set[str]) -> None:
        """Quotas of ``namespaces`` went up: nudge their waiting pods soon."""
        with self._lock:
            self._raised |= namespaces
        self._wake.set()

    def cards_back(self, cards: Iterable[Card]) -> None:
        """``cards`` came into service: nudge the waiting pods that could use them soon, in
        one round however many came meanwhile, and such rounds ``CARDS_BACK_EVERY_S``
        apart."""
        with self._lock:
            self._back.update((c.uuid, c) for c in cards)
        self._wake.set()

    def start(self) -> None:
        threading.Thread(target=self._run, name="tessera-quota", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.period_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception:  # a bug here must not end quota status for good
                log.exception("quota writer step failed")

    def step(self) -> None:
        """One round: nudges first (they unblock pods), then statuses. Leader only."""
        if not self.leading():
            return
        if self.before_round is not None:
            self.before_round()
        now = self.clock()
        back: dict[str, Card] = {}
        with self._lock:
            raised, self._raised = self._raised, set()
            if self._back and now - self._back_at >= CARDS_BACK_EVERY_S:
                back, self._back, self._back_at = self._back, {}, now  # else a later round
        done = self._nudge(None, _CardsBack(back.values())) if back else set()
        for ns in sorted(raised):
            self._nudge(ns, skip=done)  # a pod is nudged once a round
        self._write_statuses()

    def _nudge(
        self,
        namespace: str | None,
        back: _CardsBack | None = None,
        skip: Collection[str] = frozenset(),
    ) -> set[str]:
        """Annotate the pods of ``namespace`` (None: of every namespace) that wait, and
        could use one of ``back`` if given, but those in ``skip``; their keys."""
        with self.state.lock:
            waiting = [
                info.key
                for info in self.state.pods.values()
                if (namespace is None or info.key.startswith(f"{namespace}/"))
                and not info.node_name
                and info.request is not None
                and info.key not in self.state.reservations
                and info.key not in skip
                and (back is None or back.of_use_to(info.request))
            ]
        when = self.clock()
        reason = "quota-raised" if back is None else "cards-in-service"
        if back is not None:
            log.info("cards came into service: %d waiting pods that could use them to try "
                     "again", len(waiting))  # fmt: skip
        else:
            log.info("a quota of %s went up: %d waiting pods to try again", namespace, len(waiting))
        for key in waiting:
            if nudge(self.api, key, reason, when):
                self.nudged += 1
                if self.on_nudge is not None:
                    self.on_nudge(reason)
        return set(waiting)

    def _write_statuses(self) -> None:
        # The lock is taken per quota: all of a large cluster's at once held every verb
        # (50 quotas over 200,000 pods: 0.25 s, every period).
        with self.state.lock:
            in_force = list(self.state.quotas.book.in_force())
        current = {}
        for ns, key in in_force:
            with self.state.lock:
                current[key] = quota_status(self.state, ns, key)
        for key in [k for k in self._written if k not in current]:
            del self._written[key]
        for key, status in current.items():
            if status is None or self._written.get(key) == status:
                continue
            ns, _, name = key.partition("/")
            try:
                self.api.merge_patch(GPUQUOTAS, name, {"status": status}, ns, subresource="status")
                self._written[key] = status
            except NotFound:
                pass
            except ApiError as exc:
                log.warning("GpuQuota %s: cannot write its status: %s", key, exc)
