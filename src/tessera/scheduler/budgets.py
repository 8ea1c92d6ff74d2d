"""PodDisruptionBudgets as the Eviction API applies them, read ahead by GPU preemption.

The preemptor evicts through the Eviction API, which refuses (429) a pod whose budget
allows no disruption. Learning of a budget only from that refusal costs more than time:
of two victims, the first may be gone before the second is refused, and then it went for
nothing, since the preemptor still does not fit. So the preemptor reads the budgets
(list/watch) and chooses only victims the API would let go; a refusal then comes only
from a race (a budget changed between the read and the eviction).

The rules are the API server's (``pkg/registry/core/pod/storage/eviction.go``,
Kubernetes v1.36):

* a pod in phase ``Pending`` (bound, not started) is evicted whatever its budgets;
* a pod more than one budget covers is refused;
* a pod that is not Ready goes without counting against its budget if the budget says
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, or has the healthy pods it wants
  (``currentHealthy >= desiredHealthy > 0``);
* otherwise the budget's controller must have observed its generation, and the budget
  must allow a disruption; each eviction takes one.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.kube.port import Obj, WatchEvent
from tessera.kube.selectors import selects

__all__ = ["Budget", "BudgetBook", "Disruptee"]


@dataclass(frozen=True, slots=True)
class Budget:
    """One PodDisruptionBudget, as much of it as an eviction reads."""

    namespace: str
    name: str
    selector: Mapping[str, Any] | None  # None: selects no pod
    allowed: int  # status.disruptionsAllowed
    current_healthy: int
    desired_healthy: int
    expected: int  # status.expectedPods
    uncountable: str  # why its controller cannot count it (a SyncFailed condition), or ""
    always_allow_unhealthy: bool  # spec.unhealthyPodEvictionPolicy: AlwaysAllow
    observed: bool  # status.observedGeneration has caught up with metadata.generation

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def lets_unready_go(self) -> bool:
        """It has the healthy pods it wants: an unready pod it covers may go."""
        return self.always_allow_unhealthy or self.current_healthy >= self.desired_healthy > 0

    def loosened_from(self, old: Budget) -> bool:
        """Whether it may let go a pod ``old`` kept: more disruptions allowed, newly
        observed, unready pods newly free to go, or another selector."""
        return (
            self.selector != old.selector
            or (self.observed and not old.observed)
            or self.allowed > old.allowed
            or (self.lets_unready_go() and not old.lets_unready_go())
        )

    @classmethod
    def of(cls, obj: Obj) -> Budget:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}

        def number(raw: Any) -> int:
            return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0

        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            selector=spec.get("selector"),
            allowed=number(status.get("disruptionsAllowed")),
            current_healthy=number(status.get("currentHealthy")),
            desired_healthy=number(status.get("desiredHealthy")),
            expected=number(status.get("expectedPods")),
            uncountable=_sync_failure(status),
            always_allow_unhealthy=spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow",
            observed=number(status.get("observedGeneration")) >= number(meta.get("generation")),
        )


def _sync_failure(status: Mapping[str, Any]) -> str:
    """The message of a ``DisruptionAllowed`` condition the controller set False for a
    failed sync (the pods' controller has no scale, say: a Job under maxUnavailable),
    or "". The controller then allows no disruption whatever the counts."""
    for c in status.get("conditions") or []:
        if not isinstance(c, dict) or c.get("type") != "DisruptionAllowed":
            continue
        if c.get("status") == "False" and c.get("reason") == "SyncFailed":
            return str(c.get("message") or "SyncFailed")
    return ""


@dataclass(frozen=True, slots=True)
class Disruptee:
    """What the rules read of a pod to be evicted."""

    namespace: str
    labels: Mapping[str, str]
    ready: bool  # its Ready condition is True
    pending: bool  # status.phase is Pending

    @classmethod
    def of(cls, key: str, obj: Obj | None) -> Disruptee:
        """Labels, readiness and phase of the pod ``key`` (namespace/name). The labels'
        strings are interned: pods of one workload repeat them, and each watch event
        parses its own copies (at 50,000 pods of four labels, 15 MiB kept instead of 38)."""
        obj = obj or {}
        raw = (obj.get("metadata") or {}).get("labels")
        labels = (
            {sys.intern(k): sys.intern(v) for k, v in raw.items() if isinstance(v, str)}
            if isinstance(raw, dict)
            else {}
        )
        status = obj.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
            if isinstance(c, dict)
        )
        return cls(
            sys.intern(key.partition("/")[0]), labels, ready, status.get("phase") == "Pending"
        )


class BudgetBook:
    """The cluster's PodDisruptionBudgets by namespace; a reflector handler, safe to read
    from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_ns: dict[str, dict[str, Budget]] = {}
        # Told (outside the lock) the namespace/name of each budget that may now let go
        # a pod it kept: deleted, or loosened (Budget.loosened_from).
        self.on_loosened: Callable[[str], None] | None = None

    def replace(self, items: list[Obj]) -> None:
        by_ns: dict[str, dict[str, Budget]] = {}
        for obj in items:
            b = Budget.of(obj)
            by_ns.setdefault(b.namespace, {})[b.name] = b
        with self._lock:
            old, self._by_ns = self._by_ns, by_ns
        for ns, budgets in old.items():
            for name, before in budgets.items():
                after = by_ns.get(ns, {}).get(name)
                if after is None or after.loosened_from(before):
                    self._loosened(before.key)

    def apply(self, event: WatchEvent) -> None:
        b = Budget.of(event.object)
        with self._lock:
            mine = self._by_ns.setdefault(b.namespace, {})
            before = mine.pop(b.name, None)
            if event.type != "DELETED":
                mine[b.name] = b
        if before is not None and (event.type == "DELETED" or b.loosened_from(before)):
            self._loosened(b.key)

    def _loosened(self, key: str) -> None:
        if self.on_loosened is not None:
            self.on_loosened(key)

    def covering(self, pod: Disruptee) -> list[Budget]:
        """The budgets whose selector selects the pod, by name."""
        with self._lock:
            mine = list(self._by_ns.get(pod.namespace, {}).values())
        return sorted((b for b in mine if selects(b.selector, pod.labels)), key=lambda b: b.name)

    def refusal(self, pod: Disruptee, spent: Counter[str] | None = None) -> str:
        """Why the Eviction API would refuse to evict ``pod`` now ("": it would not).
        ``spent`` counts the disruptions the evictions chosen before this one take from
        each budget (by namespace/name); when the pod may go, its own is added."""
        if pod.pending:
            return ""
        covering = self.covering(pod)
        if not covering:
            return ""
        if len(covering) > 1:
            names = ", ".join(b.name for b in covering)
            return f"more than one PodDisruptionBudget covers it ({names}), which eviction refuses"
        b = covering[0]
        if not pod.ready and b.lets_unready_go():
            return ""  # an unready pod that does not count against the budget
        if b.uncountable:
            # Said before "not observed": a first failed sync leaves the generation unseen.
            return (
                f"PodDisruptionBudget {b.name} allows no disruption: its controller cannot "
                f"count it ({b.uncountable})"
            )
        if not b.observed:
            return f"PodDisruptionBudget {b.name} is not yet observed by its controller"
        key = b.key
        taken = 0 if spent is None else spent[key]
        if b.allowed - taken <= 0:
            if taken:
                return (
                    f"PodDisruptionBudget {b.name} allows {b.allowed} disruption(s), all "
                    "taken by the other victims"
                )
            if b.current_healthy <= b.desired_healthy:
                return (
                    f"PodDisruptionBudget {b.name} needs {b.desired_healthy} healthy pods "
                    f"and has {b.current_healthy}"
                )
            if b.expected == 0:
                # The controller allows none while it expects no pods; with
                # maxUnavailable or a percentage it leaves bare pods out (a Job's pods
                # fail its sync instead, above).
                return (
                    f"PodDisruptionBudget {b.name} counts no expected pods, so allows no "
                    "disruption (maxUnavailable and percentages count only pods whose "
                    "controller has a scale)"
                )
            return f"PodDisruptionBudget {b.name} allows no disruption now"
        if spent is not None:
            spent[key] += 1
        return ""
