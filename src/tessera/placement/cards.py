"""Concrete cards on one node, per GPU container.

App containers are placed first, larger requests first, each on ``count`` distinct cards;
two containers of the pod may share a card when it holds both. Init containers come
after: they run one at a time before the app containers, so on each card the pod holds
max(largest init slice, sum of app slices) and an init container may reuse the pod's
own app slices (kubelet counts CPU and memory the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.cluster.snapshot import Snapshot
from tessera.errors import PlacementError
from tessera.model.types import (
    Assignment,
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    PodRequest,
)
from tessera.placement.base import CardPicker, CardView

__all__ = ["assign_cards", "fits_exactly"]


@dataclass(slots=True)
class _Held:
    """What the pod has taken so far on one card."""

    app_mem: int = 0
    app_cores: int = 0
    init_mem: int = 0
    init_cores: int = 0
    whole: bool = False  # an exclusive container of the pod sits here
    app_users: int = 0
    init_users: int = 0


def _order(c: ContainerRequest) -> tuple[int, int, int, int]:
    gpu = c.gpu
    assert gpu is not None
    return (int(c.init), -int(gpu.exclusive), -gpu.count, -(gpu.memory_mib or 0))


def assign_cards(snap: Snapshot, pod: PodRequest, node: str, picker: CardPicker) -> Assignment:
    """Cards for every GPU container of ``pod`` on ``node``; PlacementError if they do not fit."""
    cards_free = snap.cards_free(node)
    cards = tuple(cf.card for cf in cards_free)
    held = [_Held() for _ in cards]
    chosen: dict[str, list[int]] = {}
    for c in sorted(pod.gpu_containers(), key=_order):
        gpu = c.gpu
        assert gpu is not None
        free_mem: list[int] = []
        free_cores: list[int] = []
        candidates: list[int] = []
        for col, (cf, h) in enumerate(zip(cards_free, held, strict=True)):
            card = cf.card
            base_mem, base_cores = max(h.app_mem, h.init_mem), max(h.app_cores, h.init_cores)
            free_mem.append(cf.memory_mib - base_mem)
            free_cores.append(cf.cores_percent - base_cores)
            if not card.in_service or cf.exclusive or not gpu.allows(card) or h.whole:
                continue
            # Slots the pod takes on the card, as Assignment.slots counts them.
            users = max(h.app_users + (not c.init), h.init_users + c.init)
            if users > cf.slots:
                continue
            if gpu.exclusive:
                if cf.tenants or (not c.init and (h.app_users or h.init_mem)):
                    continue
            else:
                # An init slice runs before the app slices, so it may use all that was free
                # before the pod came; an app slice adds to the pod's other app slices.
                room_mem = cf.memory_mib - (0 if c.init else h.app_mem)
                room_cores = cf.cores_percent - (0 if c.init else h.app_cores)
                if gpu.memory_on(card) > room_mem or gpu.cores() > room_cores:
                    continue
            candidates.append(col)
        if len(candidates) < gpu.count:
            raise PlacementError(
                f"container {c.name} does not fit on {node}",
                {node: "cards cannot hold all GPU containers together"},
            )
        view = CardView(
            snapshot=snap,
            node=node,
            cards=cards,
            free_mem=tuple(free_mem),
            free_cores=tuple(free_cores),
        )
        picked = picker.pick(view, gpu, candidates, gpu.count)
        assert len(set(picked)) == gpu.count and set(picked) <= set(candidates), picked
        for col in picked:
            h = held[col]
            mem, cores = _slice(gpu, cards[col].memory_mib)
            if c.init:
                h.init_mem, h.init_cores = max(h.init_mem, mem), max(h.init_cores, cores)
                h.init_users += 1
            else:
                h.app_mem += mem
                h.app_cores += cores
                h.app_users += 1
            h.whole = h.whole or gpu.exclusive
        chosen[c.name] = sorted(picked)
    out = []
    for c in pod.gpu_containers():
        gpu = c.gpu
        assert gpu is not None
        slices = tuple(
            CardSlice(uuid=cards[col].uuid, memory_mib=m, cores_percent=k)
            for col in chosen[c.name]
            for m, k in [_slice(gpu, cards[col].memory_mib)]
        )
        out.append(
            ContainerAssignment(
                name=c.name, slices=slices, policy=gpu.policy, exclusive=gpu.exclusive, init=c.init
            )
        )
    return Assignment(node=node, containers=tuple(out))


def _slice(gpu: GpuRequest, card_memory: int) -> tuple[int, int]:
    if gpu.exclusive:
        return card_memory, 100
    mem = (
        gpu.memory_mib
        if gpu.memory_mib is not None
        else card_memory * (gpu.memory_percent or 0) // 100
    )
    return mem, gpu.cores()


def fits_exactly(snap: Snapshot, pod: PodRequest, node: str) -> bool:
    """Whether the cards of ``node`` hold every GPU container of ``pod`` (tightest-first)."""
    from tessera.placement.binpack import BinpackCards

    try:
        assign_cards(snap, pod, node, BinpackCards())
    except PlacementError:
        return False
    return True
