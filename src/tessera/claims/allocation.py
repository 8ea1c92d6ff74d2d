"""What an allocated ResourceClaim gives on this node, as a Tessera assignment (pure).

kube-scheduler writes ``status.allocation``: per request a device of a pool, and, for a
device that allows multiple allocations, the capacity the request consumed. The node
agent turns the results for its driver and its pool into one ``ContainerAssignment``
(every container that references the claim shares it), which the same limits file and
libvgpu enforce as on the extender path.

The compute policy comes from opaque configuration for the driver, the class's first and
the claim's after it (a later entry wins, as DRA orders them)::

    {"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuConfig", "computePolicy": "burst-share"}

Every rule broken is a ``SpecError`` naming the field, which kubelet shows on the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.claims.devices import CAPACITY_COMPUTE, CAPACITY_MEMORY, DRIVER
from tessera.errors import SpecError
from tessera.model.quantity import memory_mib, parse_quantity
from tessera.model.types import Card, CardSlice, ComputePolicy, ContainerAssignment

__all__ = [
    "CONFIG_API_VERSION",
    "CONFIG_KIND",
    "ClaimGrant",
    "GrantedDevice",
    "allocated_pools",
    "claim_grant",
    "config_policy",
]

CONFIG_API_VERSION = f"{DRIVER}/v1alpha1"
CONFIG_KIND = "GpuConfig"
_CONFIG_KEYS = {"apiVersion", "kind", "computePolicy"}


@dataclass(frozen=True, slots=True)
class GrantedDevice:
    """One allocation result of the claim on this node (kubelet wants them back)."""

    request: str
    device: str
    share_id: str | None


@dataclass(frozen=True, slots=True)
class ClaimGrant:
    uid: str
    namespace: str
    name: str
    devices: tuple[GrantedDevice, ...]
    assignment: ContainerAssignment


def _dict(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(field, "must be an object", value)
    return value


def config_policy(parameters: object, field: str) -> ComputePolicy:
    """The compute policy of one opaque ``GpuConfig``; every other shape is refused."""
    params = _dict(parameters, field)
    if params.get("apiVersion") != CONFIG_API_VERSION or params.get("kind") != CONFIG_KIND:
        raise SpecError(
            field,
            f"must be apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND}",
            f"{params.get('apiVersion')}/{params.get('kind')}",
        )
    unknown = sorted(set(params) - _CONFIG_KEYS)
    if unknown:
        raise SpecError(f"{field}.{unknown[0]}", "is not a field of GpuConfig")
    raw = params.get("computePolicy", ComputePolicy.FIXED_SHARE.value)
    try:
        return ComputePolicy(raw)
    except ValueError:
        allowed = ", ".join(p.value for p in ComputePolicy)
        raise SpecError(f"{field}.computePolicy", f"must be one of {allowed}", raw) from None


def _policies(allocation: Mapping[str, Any]) -> dict[str | None, ComputePolicy]:
    """Request name (None: every request) -> policy, later configuration entries winning."""
    out: dict[str | None, ComputePolicy] = {}
    configs = allocation.get("config") or []
    for i, entry in enumerate(configs):
        field = f"status.allocation.devices.config[{i}]"
        opaque = _dict(entry, field).get("opaque")
        if opaque is None or _dict(opaque, f"{field}.opaque").get("driver") != DRIVER:
            continue  # another driver's, or not opaque: not ours to read
        policy = config_policy(opaque.get("parameters"), f"{field}.opaque.parameters")
        requests = entry.get("requests") or [None]
        for request in requests:
            if request is None:
                out = {k: policy for k in out} | {None: policy}
            else:
                out[str(request)] = policy
    return out


def _consumed_mib(raw: object, field: str, card: Card) -> int:
    if raw is None:  # no consumable capacity recorded: the device was given whole
        return card.memory_mib
    mib = memory_mib(raw, field)  # rounded up to a whole MiB, as on the extender path
    if not 0 < mib <= card.memory_mib:
        raise SpecError(field, f"must be within 1..{card.memory_mib} MiB of the card", raw)
    return mib


def _consumed_cores(raw: object, field: str) -> int:
    if raw is None:
        return 0
    q = parse_quantity(raw, field)
    if not q.is_integer or not 0 <= q.value <= 100:
        raise SpecError(field, "must be a whole percent within 0..100", raw)
    return int(q.value)


def allocated_pools(claim: Mapping[str, Any]) -> set[str]:
    """The pools (nodes) where the claim's allocation holds a device of this driver; none
    while it is not allocated. Reads leniently: ``claim_grant`` is the strict reader."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {str(r.get("pool")) for r in results
            if isinstance(r, Mapping) and r.get("driver") == DRIVER}  # fmt: skip


def claim_grant(claim: Mapping[str, Any], pool: str, cards: Mapping[str, Card]) -> ClaimGrant:
    """The claim's grant on ``pool`` (this node), its devices named as in ``cards``.

    Results of other drivers or pools are skipped; a claim with none of this node's is
    refused, as is a device the node does not offer for claims.
    """
    meta = _dict(claim.get("metadata"), "metadata")
    allocation = _dict(claim.get("status") or {}, "status").get("allocation")
    if allocation is None:
        raise SpecError("status.allocation", "the claim is not allocated")
    devices = _dict(_dict(allocation, "status.allocation").get("devices") or {}, "devices")
    policies = _policies(devices)
    granted: list[GrantedDevice] = []
    per_card: dict[str, list[int]] = {}  # uuid -> [memory MiB, cores]
    by_uuid = {c.uuid: c for c in cards.values()}
    whole = True
    chosen: set[ComputePolicy] = set()
    for i, raw in enumerate(devices.get("results") or []):
        field = f"status.allocation.devices.results[{i}]"
        result = _dict(raw, field)
        if result.get("driver") != DRIVER or result.get("pool") != pool:
            continue
        name = str(result.get("device"))
        card = cards.get(name)
        if card is None:
            offered = ", ".join(sorted(cards)) or "none"
            raise SpecError(f"{field}.device", f"must be a card this node offers ({offered})", name)
        consumed = _dict(result.get("consumedCapacity") or {}, f"{field}.consumedCapacity")
        mib = _consumed_mib(consumed.get(CAPACITY_MEMORY), f"{field}.consumedCapacity.memory", card)
        cores = _consumed_cores(consumed.get(CAPACITY_COMPUTE), f"{field}.consumedCapacity.compute")
        whole &= mib == card.memory_mib  # no one else can hold any of this card
        request = str(result.get("request", ""))
        chosen.add(policies.get(request, policies.get(None, ComputePolicy.FIXED_SHARE)))
        share = result.get("shareID")
        granted.append(GrantedDevice(request, name, None if share is None else str(share)))
        slot = per_card.setdefault(card.uuid, [0, 0])
        slot[0] += mib
        slot[1] += cores
    if not granted:
        raise SpecError("status.allocation.devices.results", f"has no device of pool {pool}")
    if len(chosen) > 1:
        raise SpecError(
            "status.allocation.devices.config",
            "must give every request of a claim on one node the same computePolicy",
            sorted(p.value for p in chosen),
        )
    slices = []
    for uuid, (mib, cores) in per_card.items():
        card = by_uuid[uuid]
        if mib > card.memory_mib or cores > 100:
            raise SpecError(
                "status.allocation.devices.results",
                f"must not take more than card {uuid} has ({card.memory_mib} MiB, 100 %)",
                f"{mib} MiB, {cores} %",
            )
        slices.append(CardSlice(uuid, mib, cores))
    assignment = ContainerAssignment(
        name=str(meta.get("name", "")),
        slices=tuple(slices),
        policy=chosen.pop(),
        exclusive=whole,
    )
    return ClaimGrant(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        devices=tuple(granted),
        assignment=assignment,
    )
