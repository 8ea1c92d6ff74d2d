"""Cordoning and draining cards: an operator takes single GPUs out of service, the node
stays in.

A card in the Node's ``tessera.io/cordoned-cards`` takes no new tenant, from the extender
(placement, preemption) or on the claims path (the node agent taints it in the node's
ResourceSlice); the pods on it keep running. ``kubectl tessera cordon`` and ``uncordon``
edit the annotation through these functions: the cards are named by UUID or by index on
the node, resolved against the node's inventory and its ResourceSlice (the claims
path's cards are not in the inventory), and the write carries the Node's
resourceVersion, so two operators editing the list at once do not lose each other's
change (the loser reads again and retries).

``kubectl tessera drain`` cordons, then empties the cards: every pod holding a slice of
them (a container's, or through a DRA claim reserved for it) is evicted through the
Eviction API, as ``kubectl drain`` does, so PodDisruptionBudgets and grace periods hold.
A refused eviction (a budget) is retried until the deadline; the drain ends when no
tenant is left on the cards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tessera.claims.devices import DRIVER, slice_cards, slice_name
from tessera.errors import FormatError, SpecError
from tessera.kube.errors import ApiError, Conflict, NotFound
from tessera.kube.kinds import NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.kube.port import KubeApi, Obj, object_name
from tessera.model import annotations as keys
from tessera.model.podspec import TERMINAL_PHASES
from tessera.model.types import Card
from tessera.view.gpumap import GpuMap, build_map

__all__ = [
    "CordonChange",
    "Tenant",
    "change_cordons",
    "describe",
    "drain",
    "node_map",
    "resolve_cards",
    "tenants",
]

ATTEMPTS = 5  # reads and writes before giving up on a Node others keep changing


class CordonError(Exception):
    """A card that cannot be named, or a node that is not a Tessera GPU node."""


@dataclass(frozen=True, slots=True)
class CordonChange:
    node: str
    changed: tuple[Card, ...]  # the cards whose state this call changed
    unchanged: tuple[Card, ...]  # the cards named that already were in the asked state
    cordoned: frozenset[str]  # the node's cordoned UUIDs after the write
    # UUIDs uncordoned that name no card the node shows: a card replaced, or left out of
    # the slice by an API server without device taints
    dropped: tuple[str, ...] = ()


def _cards(node: Obj, slice_obj: Obj | None) -> tuple[Card, ...]:
    """The node's cards on both paths: the extender's (its inventory annotation) and the
    claims path's (its ResourceSlice)."""
    name = object_name(node)
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.INVENTORY)
    cards: list[Card] = []
    if isinstance(text, str):
        try:
            cards += keys.decode_inventory(name, text, 0, 0).cards
        except (FormatError, SpecError) as exc:
            raise CordonError(str(exc)) from None  # it names the node
    if slice_obj is not None:
        try:
            cards += slice_cards(slice_obj)[1]
        except SpecError as exc:
            raise CordonError(
                f"node {name}: ResourceSlice {object_name(slice_obj)}: {exc}"
            ) from None
    if not isinstance(text, str) and slice_obj is None:
        raise CordonError(
            f"node {name} has no {keys.INVENTORY} annotation and no {DRIVER} ResourceSlice: "
            "not a Tessera GPU node"
        )
    return tuple(sorted(cards, key=lambda c: c.index))


def _slice(api: KubeApi, node: str) -> Obj | None:
    try:
        return api.get(RESOURCE_SLICES, slice_name(node))
    except NotFound:
        return None  # no claims path on this node (or no resource.k8s.io at all)


def resolve_cards(
    node: Obj, named: Sequence[str], slice_obj: Obj | None = None
) -> tuple[Card, ...]:
    """The node's cards that ``named`` gives, by UUID or by index; every name must match."""
    return _pick(object_name(node), _cards(node, slice_obj), named)


def _pick(node_name: str, cards: tuple[Card, ...], named: Sequence[str]) -> tuple[Card, ...]:
    by_uuid = {c.uuid: c for c in cards}
    by_index = {str(c.index): c for c in cards}
    out: list[Card] = []
    unknown: list[str] = []
    for name in named:
        card = by_uuid.get(name) or by_index.get(name)
        if card is None:
            unknown.append(name)
        elif card not in out:
            out.append(card)
    if unknown:
        known = ", ".join(f"{c.index} ({c.uuid})" for c in sorted(cards, key=lambda c: c.index))
        raise CordonError(
            f"node {node_name} has no card {', '.join(unknown)}: give a UUID or an index "
            f"of its cards: {known}"
        )
    return tuple(out)


def change_cordons(api: KubeApi, node: str, named: Sequence[str], cordon: bool) -> CordonChange:
    """Cordon (or uncordon) the cards ``named`` on ``node``; no names with ``cordon``
    False uncordons every card. Nothing is written when nothing changes."""
    slice_obj = _slice(api, node)
    for _ in range(ATTEMPTS):
        obj = api.get(NODES, node)
        meta = obj.get("metadata") or {}
        before = keys.parse_cordoned((meta.get("annotations") or {}).get(keys.CORDONED_CARDS))
        here = _cards(obj, slice_obj)
        on_node = {c.uuid for c in here}
        if not named and not cordon:  # every card, and the UUIDs no card shows any more
            cards, dropped = here, tuple(sorted(before - on_node))
            after: frozenset[str] = frozenset()
        else:
            # Uncordoning takes any UUID the list holds, whether or not a card shows it.
            dropped = () if cordon else tuple(sorted((set(named) & before) - on_node))
            cards = _pick(node, here, [n for n in named if n not in dropped])
            if cordon and not cards:
                raise CordonError("name at least one card to cordon")
            uuids = {c.uuid for c in cards} | set(dropped)
            after = before | uuids if cordon else before - uuids
        changed = tuple(c for c in cards if (c.uuid in before) != cordon)
        unchanged = tuple(c for c in cards if (c.uuid in before) == cordon)
        if after == before:
            return CordonChange(node, (), unchanged, before)
        value = keys.format_cordoned(after) if after else None  # None removes it
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {keys.CORDONED_CARDS: value},
            }
        }
        try:
            api.merge_patch(NODES, node, patch)
        except Conflict:
            continue  # someone else changed the Node meanwhile: read it again
        return CordonChange(node, changed, unchanged, frozenset(after), dropped)
    raise CordonError(f"node {node} kept changing under {ATTEMPTS} attempts; try again")


def describe(cards: Iterable[Card]) -> str:
    return ", ".join(f"card {c.index} ({c.uuid})" for c in sorted(cards, key=lambda c: c.index))


@dataclass(frozen=True, slots=True)
class Tenant:
    namespace: str
    pod: str
    uid: str
    terminating: bool


def node_map(api: KubeApi, node: str) -> tuple[GpuMap, list[Obj]]:
    """One node's GPU map (its cards on both paths and who holds them) and its pods."""
    obj = api.get(NODES, node)
    pods = list(api.list(PODS, field_selector=f"spec.nodeName={node}").items)
    slice_obj = _slice(api, node)
    claims = _claims_of(api, pods) if slice_obj is not None else []
    gmap = build_map([obj], pods, slices=[slice_obj] if slice_obj else [], claims=claims)
    return gmap, pods


def tenants(api: KubeApi, node: str, uuids: frozenset[str]) -> list[Tenant]:
    """The pods holding a slice of the cards ``uuids`` on ``node`` now: their own, or a
    claim's reserved for them."""
    gmap, pods = node_map(api, node)
    keys_held = {
        f"{h.namespace}/{pod}"
        for n in gmap.nodes
        for c in n.cards
        if c.uuid in uuids
        for h in c.holders
        for pod in h.pod.split(",")
        if pod
    }
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if key in keys_held and (p.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            out.append(Tenant(str(meta["namespace"]), str(meta["name"]), str(meta.get("uid", "")),
                              bool(meta.get("deletionTimestamp"))))  # fmt: skip
    return sorted(out, key=lambda t: (t.namespace, t.pod))


def _claims_of(api: KubeApi, pods: Iterable[Obj]) -> list[Obj]:
    """The ResourceClaims the pods use (named in the spec, or made from a template and
    named in the status): read one by one, not every claim of the cluster."""
    out = []
    for p in pods:
        ns = str((p.get("metadata") or {}).get("namespace", ""))
        named = {
            c.get("resourceClaimName") for c in (p.get("spec") or {}).get("resourceClaims") or []
        }
        named |= {c.get("resourceClaimName")
                  for c in (p.get("status") or {}).get("resourceClaimStatuses") or []}  # fmt: skip
        for name in sorted(n for n in named if n):
            try:
                out.append(api.get(RESOURCE_CLAIMS, str(name), ns))
            except NotFound:
                continue
    return out


def drain(
    api: KubeApi,
    node: str,
    uuids: frozenset[str],
    timeout_s: float,
    say: Callable[[str], None],
    *,
    poll_s: float = 2.0,
    retry_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Tenant]:
    """Evict every pod holding the cards until none is left or ``timeout_s`` passes;
    returns the tenants left (empty: drained). A refused eviction is tried again every
    ``retry_s``; ``say`` reports each eviction and each refusal once."""
    deadline = clock() + timeout_s
    tried: dict[str, float] = {}  # pod key -> when its eviction was last asked for
    refused: set[str] = set()
    while True:
        left = tenants(api, node, uuids)
        if not left:
            return []
        now = clock()
        for t in left:
            key = f"{t.namespace}/{t.pod}"
            if t.terminating or now - tried.get(key, -retry_s) < retry_s:
                continue
            tried[key] = now
            try:
                api.evict(t.namespace, t.pod, t.uid)
            except NotFound:
                continue  # gone meanwhile
            except ApiError as exc:
                if key not in refused:  # 429: a PodDisruptionBudget; said once
                    refused.add(key)
                    say(f"{key}: eviction refused ({exc.status} {exc.reason}: {exc.message}); "
                        f"trying again every {retry_s:.0f} s")  # fmt: skip
                continue
            say(f"{key} evicted")
        if clock() >= deadline:
            return left
        sleep(poll_s)
