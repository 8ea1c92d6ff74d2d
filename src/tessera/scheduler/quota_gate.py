"""What the extender weighs against the namespaces' GpuQuotas: the quotas in force, what
each namespace's pods hold per card model, and the card models the nodes have.

``SchedulerState`` keeps it current (each booking it settles, each node's cards, the
GpuQuota watch); filter, bind, GPU preemption and the webhook ask it. Every call is made
with the state's lock held: the counts must move with the bookings they count.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from tessera.kube.port import Obj
from tessera.model.types import Assignment, Card, PodRequest
from tessera.quota.book import QuotaBook
from tessera.quota.usage import QuotaUsage, Usage, demand_on, holding, why_over
from tessera.scheduler.holds import HoldBook

__all__ = ["QuotaGate"]

log = logging.getLogger(__name__)


class QuotaGate:
    """The namespaces' GpuQuotas and their use (lock held: the scheduler state's)."""

    def __init__(self, holds: HoldBook, problems: Counter[str]) -> None:
        self.book = QuotaBook()
        self.usage = QuotaUsage()  # bound and reserved alike (SchedulerState._settle)
        self._holds = holds  # GPU preemption's: what they keep counts as used
        self._problems = problems  # the state's counters, for metrics
        self._model_of: dict[str, str] = {}  # card UUID -> model (kept after a node goes)
        self._card_memory: dict[str, int] = {}  # model -> its largest card's memory, MiB

    # --- what the state tells it --------------------------------------------------------

    def learn_cards(self, cards: Iterable[Card]) -> None:
        """A node's cards: their models, and each model's largest memory."""
        for card in cards:
            self._model_of[card.uuid] = card.model
            known = self._card_memory.get(card.model, 0)
            self._card_memory[card.model] = max(known, card.memory_mib)

    def count(self, key: str, assignment: Assignment | None) -> None:
        """Count what pod ``key`` holds per card model against its namespace's quotas
        (None: nothing)."""
        per_model = holding(assignment, self.model) if assignment is not None else None
        self.usage.set_pod(key, key.partition("/")[0], per_model)

    def apply(self, obj: Obj, deleted: bool = False) -> bool:
        """A GpuQuota as the watch delivers it; whether it loosened its namespace's limits
        (then pods waiting there may fit now)."""
        loosened, why = self.book.apply(obj, deleted)
        if why:
            self._refused(obj, why)
        return loosened

    def replace(self, items: list[Obj]) -> set[str]:
        """The complete set of GpuQuotas (after a list); the namespaces loosened."""
        loosened, refusals = self.book.replace(items)
        for key, why in refusals.items():
            self._refused(key, why)
        return loosened

    # --- what the verbs ask -------------------------------------------------------------

    def model(self, uuid: str) -> str:
        return self._model_of.get(uuid, "")

    def models(self) -> list[str]:
        """The card models of the cluster's nodes."""
        return sorted(self._card_memory)

    def exclusions(self, request: PodRequest, priority: int | None = None) -> dict[str, str]:
        """Card models ``request`` may not take for its namespace's quotas: model -> why.
        The pod's own holding must be released first (filter does). With ``priority``,
        what GPU preemption holds in the namespace for pods as important or more counts as
        used: a less important pod does not take the quota a preemption made room in."""
        quotas = self.book.of(request.namespace)
        if not quotas:
            return {}
        held = self._held(request, priority)
        out = {}
        for model, memory in self._card_memory.items():
            why = why_over(quotas, self.usage, model, demand_on(request, memory), held=held)
            if why:
                out[model] = why
        return out

    def fits_without(
        self, request: PodRequest, priority: int, model: str, gone: Iterable[str]
    ) -> bool:
        """Whether ``request`` on cards of ``model`` would fit its namespace's quotas once
        the pods ``gone`` no longer hold anything (holds counted as in ``exclusions``)."""
        quotas = self.book.of(request.namespace)
        held = self._held(request, priority)
        for key in gone:
            for m, u in self.usage.held_by(key).items():
                held[m] = held.get(m, Usage()) - u
        demand = demand_on(request, self._card_memory.get(model, 0))
        return not why_over(quotas, self.usage, model, demand, held=held)

    def never_fits(self, request: PodRequest) -> str:
        """Why ``request`` alone is larger than its namespace's quotas allow on every card
        model of the cluster it could use, or "" (it could fit some day, or no quota)."""
        quotas = self.book.of(request.namespace)
        if not quotas:
            return ""
        first = ""
        for model, memory in sorted(self._card_memory.items()):
            if not _may_use(request, model):
                continue
            why = why_over(quotas, None, model, demand_on(request, memory))
            if not why:
                return ""
            first = first or why
        return first

    def refusal(
        self, request: PodRequest, assignment: Assignment, priority: int | None = None
    ) -> str:
        """Why holding ``assignment`` would pass a quota of the pod's namespace, or ""
        (``priority``: as in ``exclusions``)."""
        quotas = self.book.of(request.namespace)
        if not quotas:
            return ""
        held = self._held(request, priority)
        for model, u in holding(assignment, self.model).items():
            why = why_over(quotas, self.usage, model, u, held=held)
            if why:
                return why
        return ""

    # --- internals ----------------------------------------------------------------------

    def _held(self, request: PodRequest, priority: int | None) -> dict[str, Usage]:
        """Per model, what the holds of GPU preemption keep in ``request``'s namespace for
        other pods at least as important (None: no priority given, nothing counted)."""
        out: dict[str, Usage] = {}
        if priority is None or not len(self._holds):
            return out
        for h in self._holds:
            same_ns = h.key.partition("/")[0] == request.namespace
            if same_ns and h.key != request.key and h.priority >= priority and h.decision:
                for model, u in holding(h.decision, self.model).items():
                    out[model] = out.get(model, Usage()) + u
        return out

    def _refused(self, what: Obj | str, why: str) -> None:
        if not isinstance(what, str):
            meta = what.get("metadata") or {}
            what = f"{meta.get('namespace')}/{meta.get('name')}"
        self._problems["bad-quota"] += 1
        log.warning("GpuQuota %s refused, its last good version stays: %s", what, why)


def _may_use(request: PodRequest, model: str) -> bool:
    """Whether every GPU container of ``request`` may take cards of ``model``."""
    return all(c.gpu is None or c.gpu.allows_model(model) for c in request.containers)
