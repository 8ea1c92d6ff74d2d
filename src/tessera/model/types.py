"""The data Tessera reasons about: cards, nodes, requests and assignments.

Everything here is a frozen value; nothing does I/O. Units: memory in MiB, compute in
percent of one card (0..100), CPU in millicores.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_SLOTS",
    "Assignment",
    "Card",
    "CardSlice",
    "ComputePolicy",
    "ContainerAssignment",
    "ContainerRequest",
    "GpuRequest",
    "NodeInventory",
    "PodRequest",
]


# The node agent's default ``--slots-per-card``: kubelet gives a card to at most this many
# containers at once (each container takes one of the card's slot devices).
DEFAULT_SLOTS = 16


class ComputePolicy(enum.StrEnum):
    """How a container's compute share is enforced on each of its cards."""

    FIXED_SHARE = "fixed-share"  # hard cap, even when the card is idle
    BURST_SHARE = "burst-share"  # guaranteed floor; may borrow idle compute, gives it back
    BEST_EFFORT = "best-effort"  # no cap, no floor


@dataclass(frozen=True, slots=True)
class Card:
    """One physical GPU as the node agent sees it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    sm_count: int = 0
    numa_node: int = -1  # -1: unknown
    nvlink_peers: tuple[int, ...] = ()  # indices of cards on the same node joined by NVLink
    healthy: bool = True
    slots: int = DEFAULT_SLOTS  # containers the node agent can give this card to, at most
    # Taken out of service by an operator (the Node's tessera.io/cordoned-cards): no new
    # tenant, the ones on it keep running. Not part of the inventory the agent writes.
    cordoned: bool = False

    @property
    def in_service(self) -> bool:
        """Whether new tenants may be placed on it."""
        return self.healthy and not self.cordoned


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's cards plus the CPU and memory the kubelet allocates to pods."""

    name: str
    cards: tuple[Card, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """One container's GPU need, normalised.

    ``count`` distinct cards, each with the same slice. Exactly one of ``memory_mib`` and
    ``memory_percent`` is set unless ``exclusive`` (whole cards: all memory, all compute,
    nobody else on the card). ``cores_percent`` 0 means no compute reserved (best-effort).
    Empty include sets mean "any".
    """

    count: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores_percent: int = 0
    exclusive: bool = False
    models: frozenset[str] = frozenset()
    models_exclude: frozenset[str] = frozenset()
    uuids: frozenset[str] = frozenset()
    uuids_exclude: frozenset[str] = frozenset()
    policy: ComputePolicy = ComputePolicy.FIXED_SHARE

    def memory_on(self, card: Card) -> int:
        """MiB this request takes on ``card``."""
        return self.memory_for(card.memory_mib)

    def memory_for(self, card_memory_mib: int) -> int:
        """MiB this request takes on a card of ``card_memory_mib``."""
        if self.exclusive:
            return card_memory_mib
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.memory_percent is not None
        return card_memory_mib * self.memory_percent // 100

    def cores(self) -> int:
        """Percent of compute this request reserves on each card."""
        return 100 if self.exclusive else self.cores_percent

    def allows_model(self, model: str) -> bool:
        """Whether the model constraints admit cards of ``model``."""
        return (not self.models or model in self.models) and model not in self.models_exclude

    def could_fit_on(self, model: str, card_memory_mib: int) -> bool:
        """Whether an empty card of ``model`` and ``card_memory_mib`` could hold this
        request's slice, its UUID constraints aside."""
        return self.allows_model(model) and (
            self.memory_mib is None or self.memory_mib <= card_memory_mib
        )

    def allows(self, card: Card) -> bool:
        """Whether the model and UUID constraints admit ``card``."""
        if not self.allows_model(card.model):
            return False
        if self.uuids and card.uuid not in self.uuids:
            return False
        return card.uuid not in self.uuids_exclude


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """A container's name, whether it is an init container, and its GPU need (if any)."""

    name: str
    gpu: GpuRequest | None = None
    init: bool = False


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What a pod needs from a node.

    ``cpu_milli`` and ``memory_mib`` are already the pod's effective need as kubelet counts
    it: max(largest init container, sum of app containers). ``placement`` is the per-pod
    policy override (``tessera.io/placement``), None for the scheduler's default.
    """

    namespace: str
    name: str
    containers: tuple[ContainerRequest, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    placement: str | None = None
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def gpu_containers(self) -> tuple[ContainerRequest, ...]:
        return tuple(c for c in self.containers if c.gpu is not None)


@dataclass(frozen=True, slots=True)
class CardSlice:
    """What one container holds on one card."""

    uuid: str
    memory_mib: int
    cores_percent: int


@dataclass(frozen=True, slots=True)
class ContainerAssignment:
    """The cards a container was given, and how its compute is enforced on them."""

    name: str
    slices: tuple[CardSlice, ...]
    policy: ComputePolicy = ComputePolicy.FIXED_SHARE
    exclusive: bool = False
    init: bool = False


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a pod was placed: its node and, per GPU container, the concrete cards."""

    node: str
    containers: tuple[ContainerAssignment, ...] = field(default=())

    def footprint(self) -> dict[str, tuple[int, int, bool]]:
        """Per card UUID: (memory MiB, cores percent, exclusive) the pod holds.

        Init containers run one at a time before the app containers, so per card the pod
        holds the larger of any one init container's slice and the sum of the app slices,
        the way kubelet counts a pod's resources.
        """
        app: dict[str, list[int]] = {}
        init: dict[str, list[int]] = {}
        exclusive: set[str] = set()
        for c in self.containers:
            for s in c.slices:
                if c.exclusive:
                    exclusive.add(s.uuid)
                if c.init:
                    cur = init.setdefault(s.uuid, [0, 0])
                    cur[0] = max(cur[0], s.memory_mib)
                    cur[1] = max(cur[1], s.cores_percent)
                else:
                    cur = app.setdefault(s.uuid, [0, 0])
                    cur[0] += s.memory_mib
                    cur[1] += s.cores_percent
        out: dict[str, tuple[int, int, bool]] = {}
        for uuid in app.keys() | init.keys():
            a = app.get(uuid, [0, 0])
            i = init.get(uuid, [0, 0])
            out[uuid] = (max(a[0], i[0]), max(a[1], i[1]), uuid in exclusive)
        return out

    def slots(self) -> dict[str, int]:
        """Per card UUID: the slots (containers) the pod takes there.

        Conservative, like the footprint: max(init containers, app containers) on the card.
        kubelet may hand an init container's slot on to an app container, never more.
        """
        app: dict[str, int] = {}
        init: dict[str, int] = {}
        for c in self.containers:
            count = init if c.init else app
            for s in c.slices:
                count[s.uuid] = count.get(s.uuid, 0) + 1
        return {u: max(app.get(u, 0), init.get(u, 0)) for u in app.keys() | init.keys()}
