"""What a namespace's pods hold per card model, and whether a pod would pass a quota.

Pure: the scheduler's state feeds ``QuotaUsage`` with every pod's holding (bound pods from
their annotations and this process's reservations alike, so a reservation counts from the
moment it is taken), and ``filter``/``bind``/the webhook ask ``why_over``. Usage is kept
per card model, so a limit covering several models sums them, and a change of quota
needs no recount.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tessera.model.types import Assignment, PodRequest
from tessera.quota.spec import Limit, Quota

__all__ = ["QuotaUsage", "Usage", "demand_on", "holding", "why_over"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Device memory (MiB), compute (percent-points) and whole cards."""

    memory_mib: int = 0
    cores_percent: int = 0
    cards: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.memory_mib + other.memory_mib,
            self.cores_percent + other.cores_percent,
            self.cards + other.cards,
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.memory_mib - other.memory_mib,
            self.cores_percent - other.cores_percent,
            self.cards - other.cards,
        )

    def __bool__(self) -> bool:
        return bool(self.memory_mib or self.cores_percent or self.cards)


def holding(assignment: Assignment, model_of: Callable[[str], str]) -> dict[str, Usage]:
    """Per card model, what a pod with ``assignment`` holds (its footprint: an exclusive
    card is its memory, 100 percent-points and one card)."""
    out: dict[str, Usage] = {}
    for uuid, (memory, cores, exclusive) in assignment.footprint().items():
        model = model_of(uuid)
        out[model] = out.get(model, Usage()) + Usage(memory, cores, 1 if exclusive else 0)
    return out


def demand_on(request: PodRequest, card_memory_mib: int) -> Usage:
    """What ``request`` would hold if all its cards were of a model whose cards have
    ``card_memory_mib`` (init containers run before the app containers: the larger)."""
    app, init = Usage(), Usage()
    for c in request.containers:
        g = c.gpu
        if g is None:
            continue
        whole = 1 if g.exclusive else 0
        total = Usage(g.memory_for(card_memory_mib) * g.count, g.cores() * g.count, whole * g.count)
        if c.init:
            init = Usage(
                max(init.memory_mib, total.memory_mib),
                max(init.cores_percent, total.cores_percent),
                max(init.cards, total.cards),
            )
        else:
            app = app + total
    return Usage(
        max(app.memory_mib, init.memory_mib),
        max(app.cores_percent, init.cores_percent),
        max(app.cards, init.cards),
    )


class QuotaUsage:
    """Per namespace and card model, the sum of what its pods hold."""

    def __init__(self) -> None:
        self._by_ns: dict[str, dict[str, Usage]] = {}
        # ns -> key -> per model, and key -> ns: a namespace's holders are read without a
        # pass over every pod of the cluster (200,000 of them, for each limit of each
        # quota, every status round)
        self._ns_pods: dict[str, dict[str, dict[str, Usage]]] = {}
        self._ns_of: dict[str, str] = {}

    def set_pod(self, key: str, namespace: str, per_model: dict[str, Usage] | None) -> None:
        """Replace what pod ``key`` holds (None or empty: nothing)."""
        old_ns = self._ns_of.pop(key, None)
        if old_ns is not None:
            in_ns = self._ns_pods[old_ns]
            totals = self._by_ns[old_ns]
            for model, u in in_ns.pop(key).items():
                totals[model] = totals[model] - u
                if not totals[model]:
                    del totals[model]
            if not in_ns:
                del self._ns_pods[old_ns]
        if per_model:
            self._ns_of[key] = namespace
            self._ns_pods.setdefault(namespace, {})[key] = dict(per_model)
            totals = self._by_ns.setdefault(namespace, {})
            for model, u in per_model.items():
                totals[model] = totals.get(model, Usage()) + u

    def of(self, namespace: str, limit: Limit) -> Usage:
        total = Usage()
        for model, u in self._by_ns.get(namespace, {}).items():
            if limit.covers(model):
                total = total + u
        return total

    def held_by(self, key: str) -> dict[str, Usage]:
        """What pod ``key`` holds, per model (empty: nothing)."""
        ns = self._ns_of.get(key)
        return dict(self._ns_pods[ns][key]) if ns is not None else {}

    def holding_model(self, namespace: str, model: str) -> list[str]:
        """The pods of ``namespace`` that hold cards of ``model``, by key."""
        in_ns = self._ns_pods.get(namespace, {})
        return sorted(key for key, per_model in in_ns.items() if model in per_model)

    def holders(self, namespace: str, limit: Limit) -> list[str]:
        """The pods of ``namespace`` that hold cards ``limit`` covers, by key."""
        in_ns = self._ns_pods.get(namespace, {})
        return sorted(
            key for key, per_model in in_ns.items() if any(limit.covers(m) for m in per_model)
        )


def why_over(
    quotas: Iterable[Quota],
    used: QuotaUsage | None,
    model: str,
    demand: Usage,
    asker: str = "the pod",
    held: Mapping[str, Usage] | None = None,
) -> str:
    """Why ``demand`` on cards of ``model`` would pass one of the namespace's quotas, or
    "" when it fits all of them. ``used`` None: against empty quotas (``asker`` alone).
    ``held``: per model, what is held in the namespace for pods not yet placed (GPU
    preemption's holds), counted as used."""
    for q in quotas:
        for lim in q.limits:
            if not lim.covers(model):
                continue
            u = used.of(q.namespace, lim) if used is not None else Usage()
            kept = Usage()
            for m, h in (held or {}).items():
                if lim.covers(m):
                    kept = kept + h
            u = u + kept
            for cap, have, asked, what, unit in (
                (lim.memory_mib, u.memory_mib, demand.memory_mib, "memory", " MiB"),
                (lim.cores_percent, u.cores_percent, demand.cores_percent, "cores", "%"),
                (lim.cards, u.cards, demand.cards, "whole cards", ""),
            ):
                if cap is None or not asked or have + asked <= cap:
                    continue
                where = f"quota: {q.namespace}/{q.name} {lim.name} ({model})"
                if used is None:
                    return f"{where} allows {cap}{unit} of {what}, {asker} alone asks {asked}"
                of_it = {"memory": kept.memory_mib, "cores": kept.cores_percent,
                         "whole cards": kept.cards}[what]  # fmt: skip
                for_preemption = f" ({of_it} of it held for a preempting pod)" if of_it else ""
                return (
                    f"{where} {what} {have} of {cap}{unit} used{for_preemption}, "
                    f"{asker} asks {asked}"
                )
    return ""
