"""Which container a kubelet call is for: device IDs in, pod and container out.

kubelet's calls carry slot IDs only. The matcher answers from kubelet's own
pod-resources report and the pods bound to this node (their ``tessera.io/assignment``),
as docs/node-agent.md argues step by step; it reads, it never writes. The ledger's
claimed containers come in as an argument, so one snapshot decides a call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tessera.model.types import ContainerAssignment
from tessera.node.allocation.errors import FAILED_PRECONDITION, AllocationError
from tessera.node.formats.layout import AllocRecord
from tessera.node.pods import GpuContainer, PodInfo
from tessera.node.ports import PodResources, PodResourcesView, PodSource

__all__ = ["Matcher", "Target"]


@dataclass(frozen=True, slots=True)
class Target:
    """A container and the assignment it runs with."""

    pod: PodInfo
    container: GpuContainer
    assignment: ContainerAssignment

    @property
    def claim(self) -> tuple[str, str]:
        return (self.pod.uid, self.container.name)

    @property
    def cards(self) -> tuple[str, ...]:
        return tuple(s.uuid for s in self.assignment.slices)


class Matcher:
    def __init__(self, node: str, pods: PodSource, podres: PodResources | None) -> None:
        self.node = node
        self.pods = pods
        self.podres = podres

    def view(self) -> PodResourcesView | None:
        return self.podres.view() if self.podres is not None else None

    def candidates(
        self,
        pods: list[PodInfo],
        view: PodResourcesView | None,
        claimed: set[tuple[str, str]],
    ) -> list[tuple[PodInfo, GpuContainer]]:
        """Per pod kubelet may be admitting, its first GPU container still to allocate."""
        out: list[tuple[PodInfo, GpuContainer]] = []
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

    def choose(
        self, size: int, cards: frozenset[str] | None, what: str, claimed: set[tuple[str, str]]
    ) -> Target:
        """The container a call with ``size`` slots (on ``cards``, if known) is for."""
        view = self.view()
        pods = self.pods.pods()
        if view is not None and len(self.candidates(pods, view, claimed)) > 1:
            # Normally one pod is listed without slots: the one kubelet is admitting.
            # More means a pod kubelet rejected is still listed; a fresh read may show
            # it Failed.
            pods = self.pods.refresh()
        target = self.match(pods, view, size, cards, claimed)
        if target is None:
            # The agent's watch may lag kubelet's: read the pods again, once.
            target = self.match(self.pods.refresh(), view, size, cards, claimed)
        if target is None:
            on = f" on cards {sorted(cards)}" if cards is not None else ""
            raise AllocationError(
                FAILED_PRECONDITION,
                f"{what}: no pod bound to node {self.node} has a container waiting for "
                f"{size} card(s){on} in its tessera.io/assignment",
            )
        return target

    def match(
        self,
        pods: list[PodInfo],
        view: PodResourcesView | None,
        size: int,
        cards: frozenset[str] | None,
        claimed: set[tuple[str, str]],
    ) -> Target | None:
        problem: tuple[PodInfo, str] | None = None
        for pod, c in self.candidates(pods, view, claimed):
            if pod.problem:
                if view is not None:
                    # pod-resources says kubelet is admitting exactly this pod.
                    raise AllocationError(FAILED_PRECONDITION, pod.problem, pod)
                problem = problem or (pod, pod.problem)
                continue
            ca = pod.container(c.name)
            if ca is None or c.count != size:
                continue
            t = Target(pod, c, ca)
            if cards is not None and frozenset(t.cards) != cards:
                continue
            return t
        if problem is not None:
            raise AllocationError(FAILED_PRECONDITION, problem[1], problem[0])
        return None

    def find(self, claim: tuple[str, str]) -> Target | None:
        """The container ``claim`` names, with its assignment (None: gone or unusable)."""
        return _target_in(self.pods.pods(), lambda p, c: (p.uid, c.name) == claim)

    def find_by_name(self, ns: str, name: str, cname: str) -> Target | None:
        """Container ``cname`` of pod ``ns/name`` on this node, the cache then a fresh read."""
        for pods in (self.pods.pods(), self.pods.refresh()):
            for pod in pods:
                if (pod.namespace, pod.name) == (ns, name) and pod.node == self.node:
                    if pod.problem:
                        raise AllocationError(FAILED_PRECONDITION, pod.problem, pod)
                    t = _target_in([pod], lambda _, c: c.name == cname)
                    if t is not None:
                        return t
        return None

    def next_in_pod(
        self,
        rec: AllocRecord,
        cards: frozenset[str],
        size: int,
        claimed: set[tuple[str, str]],
    ) -> Target | None:
        """The app container of ``rec``'s pod that takes ``rec``'s slots next (kubelet hands
        init containers' devices on); None when every container of a live pod has its own."""
        for pod in self.pods.pods():
            if pod.uid != rec.pod_uid or pod.problem or pod.terminal:
                continue
            for c in pod.containers:
                if (pod.uid, c.name) in claimed:
                    continue
                ca = pod.container(c.name)
                t = Target(pod, c, ca) if ca is not None else None
                if t is None or c.count != size or frozenset(t.cards) != cards:
                    have = sorted(t.cards) if t is not None else []
                    raise AllocationError(
                        FAILED_PRECONDITION,
                        f"container {c.name!r} of pod {pod.key} was given the slots of "
                        f"container {rec.container!r} on cards {sorted(cards)} (kubelet hands "
                        f"init containers' devices on), but it is assigned {have}",
                        pod,
                    )
                return t
        return None

    def alive(self, rec: AllocRecord) -> bool:
        """Whether the container of ``rec`` may still hold its slots.

        Asked only when kubelet offers a known slot set again, so a fresh read of the
        pods is affordable: the watch may not show yet that the old pod ended.
        """
        view = self.view()
        if view is not None and (rec.namespace, rec.pod) not in view.pods:
            return False
        for pod in self.pods.refresh():
            if pod.uid == rec.pod_uid:
                return pod.node == self.node and not pod.terminal
        return False


def _target_in(
    pods: Iterable[PodInfo], wanted: Callable[[PodInfo, GpuContainer], bool]
) -> Target | None:
    for pod in pods:
        if pod.problem:
            continue
        for c in pod.containers:
            ca = pod.container(c.name)
            if ca is not None and wanted(pod, c):
                return Target(pod, c, ca)
    return None
