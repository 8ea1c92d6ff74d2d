"""Why a pod on the claims path waits: its ResourceClaims, and the room the claims path's
cards have for each request (pure; ``kubectl tessera why``).

kube-scheduler's own allocator places these pods, not Tessera's extender, so this is a
reading in the allocator's terms, on the nodes kube-scheduler's other filters offer the
pod. A request of one of this driver's DeviceClasses needs ``count`` cards of one node,
each in service (healthy and not cordoned, or its taints tolerated by the request) with a
free slot, the memory asked (the whole card when none is) and the compute asked, that
pass the CEL selectors of the request and of its DeviceClass (``claim_cel.py``), and,
under the claim's constraints that name it, share one value of each ``matchAttribute``
and hold distinct values of each ``distinctAttribute``.

``allocationMode: All`` is read as k8s.io/dynamic-resource-allocation's allocator reads
it: on a node, every card that passes the selectors and is large enough for the request
is the request's, out of service or not, and each of them must be given -- so one
cordoned or full card among them refuses the node -- with the constraints holding over
all of them.

A selector that does not evaluate is not weighed, nor is what a constraint asks across
several requests (each is weighed within one): they can only narrow what is counted, and
the lines say which were left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.claims.devices import DRIVER, card_taints, slice_cards
from tessera.errors import SpecError
from tessera.model.quantity import memory_mib, parse_quantity
from tessera.model.types import Card
from tessera.view.claim_cel import Selector, device_variable
from tessera.view.gpumap import GpuMap

__all__ = ["Ask", "Constraint", "Toleration", "claim_asks", "explain", "pod_claims"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Constraint:
    """A claim's constraint as it bears on one request: the devices given for it share
    one value of ``attribute`` (``distinct``: no two share one)."""

    attribute: str  # fully qualified: DOMAIN/NAME
    distinct: bool = False
    across: bool = False  # it names other requests too: only weighed within this one


@dataclass(frozen=True, slots=True)
class Ask:
    """One request of a claim, in the terms that decide where it fits."""

    request: str
    device_class: str
    count: int  # 0: allocationMode All
    memory_mib: int | None  # None: the whole card's (the slice's default)
    compute: int
    selectors: tuple[str, ...] = ()  # the request's CEL expressions
    constraints: tuple[Constraint, ...] = ()  # the claim's that name this request
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    """A request's device toleration (resource.k8s.io DeviceToleration)."""

    key: str = ""  # empty: every key (with Exists)
    operator: str = "Equal"
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """As the allocator's ToleratesTaint decides it."""
        if (self.effect and self.effect != effect) or (self.key and self.key != key):
            return False
        if self.operator in ("", "Equal"):
            return self.value == value
        return self.operator == "Exists"


def _ours(device_class: str) -> bool:
    return device_class == DRIVER or device_class.endswith("." + DRIVER)


def pod_claims(pod: Obj) -> list[tuple[str, str | None]]:
    """(the pod's name for each claim, the ResourceClaim's name or None when the
    resourceclaim controller has not made it from its template yet)."""
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in ((pod.get("status") or {}).get("resourceClaimStatuses") or [])
    }
    out = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = str(ref.get("name") or "")
        out.append((name, ref.get("resourceClaimName") or made.get(name)))
    return out


def claim_asks(claim: Obj) -> list[Ask]:
    """The requests of ``claim`` for this driver's classes. Raises SpecError naming the
    field for a capacity that is not a quantity."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    constraints = devices.get("constraints") or []
    requests = {str(r.get("name") or "") for r in devices.get("requests") or []}
    out = []
    for i, req in enumerate(devices.get("requests") or []):
        # One request, or a list of alternatives (firstAvailable), each read alike.
        name, where = str(req.get("name") or ""), f"spec.devices.requests[{i}]"
        if "firstAvailable" in req:
            subs = [(f"{name}/{sub.get('name')}", sub, f"{where}.firstAvailable[{j}]")
                    for j, sub in enumerate(req["firstAvailable"] or [])]  # fmt: skip
        else:
            subs = [(name, req.get("exactly") or {}, f"{where}.exactly")]
        for sub_name, spec, sub_where in subs:
            ask = _ask(sub_name, spec, sub_where, _bearing(sub_name, constraints, requests))
            if ask is not None:
                out.append(ask)
    return out


def _bearing(name: str, constraints: list[Obj], requests: set[str]) -> tuple[Constraint, ...]:
    """The constraints that name request ``name`` (``main`` or ``main/sub``), or name no
    request at all, which binds every one of the claim's ``requests``."""
    main = name.partition("/")[0]
    out = []
    for c in constraints:
        named = [str(r) for r in c.get("requests") or []]
        if named and name not in named and main not in named:
            continue
        bound = {r.partition("/")[0] for r in named} if named else requests
        across = bool(bound - {main})
        for key, distinct in (("matchAttribute", False), ("distinctAttribute", True)):
            if c.get(key):
                out.append(Constraint(str(c[key]), distinct, across))
    return tuple(out)


def _ask(name: str, spec: Obj, where: str, constraints: tuple[Constraint, ...]) -> Ask | None:
    """One request (or alternative) of this driver's classes, else None."""
    device_class = str(spec.get("deviceClassName") or "")
    if not _ours(device_class):
        return None
    asked = (spec.get("capacity") or {}).get("requests") or {}
    where = f"{where}.capacity.requests"
    mib = memory_mib(asked["memory"], f"{where}.memory") if "memory" in asked else None
    compute = parse_quantity(asked.get("compute", "0"), f"{where}.compute").ceil()
    count = 0 if spec.get("allocationMode") == "All" else int(spec.get("count") or 1)
    tolerations = tuple(
        Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                   str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("tolerations") or []
    )  # fmt: skip
    return Ask(
        name, device_class, count, mib, compute, _expressions(spec), constraints, tolerations
    )


def _expressions(spec: Obj) -> tuple[str, ...]:
    """The CEL expressions of ``spec.selectors`` (a request's, or a DeviceClass's spec)."""
    return tuple(
        str((s.get("cel") or {}).get("expression") or "") for s in spec.get("selectors") or []
    )


@dataclass(frozen=True, slots=True)
class _Free:
    node: str
    card: Card
    mib: int
    cores: int
    slots: int
    device: Mapping[str, Any]  # the card as a CEL selector sees it

    def usable(self, ask: Ask) -> bool:
        """In service, or every taint the agent gave it tolerated by ``ask``."""
        return all(
            any(t.tolerates(taint["key"], taint["value"], taint["effect"]) for t in ask.tolerations)
            for taint in card_taints(self.card)
        )

    def has_room(self, ask: Ask) -> bool:
        whole = self.card.memory_mib
        return (
            self.usable(ask)
            and self.slots > 0
            and self.cores >= ask.compute
            and self.mib >= (ask.memory_mib if ask.memory_mib is not None else whole)
        )


def _claims_cards(slices: Iterable[Obj], gmap: GpuMap, offered: set[str] | None) -> list[_Free]:
    """Every card of the claims path on the ``offered`` nodes (None: every node), in
    service or not, with what its claims leave free."""
    views = {c.uuid: c for n in gmap.nodes for c in n.cards}
    out = []
    for obj in slices:
        if (obj.get("spec") or {}).get("driver") != DRIVER:
            continue
        try:
            node, cards = slice_cards(obj)
        except SpecError:
            continue  # `top` names it among the claim problems
        if offered is not None and node not in offered:
            continue
        devices = {}
        for dev in (obj.get("spec") or {}).get("devices") or []:
            variable = device_variable(dev, DRIVER)
            devices[variable["attributes"].get(DRIVER, {}).get("uuid")] = variable
        for card in cards:
            view = views.get(card.uuid)
            if view is None:
                continue
            mib, cores = card.memory_mib - view.allocated_mib, 100 - view.allocated_cores
            out.append(_Free(node, card, mib, cores, card.slots - len(view.holders),
                             devices.get(card.uuid, {})))  # fmt: skip
    return out


def _selected(selectors: list[Selector], free: list[_Free]) -> tuple[list[_Free], list[Selector]]:
    """The cards every selector that evaluates on all of them lets through, and the
    selectors that do not evaluate (not weighed)."""
    passed, unweighed = list(free), []
    for sel in selectors:
        verdicts = [sel.test(f.device) for f in free]
        if any(v is None for v in verdicts):
            unweighed.append(sel)
            continue
        kept = {f.card.uuid for f, v in zip(free, verdicts, strict=True) if v}
        passed = [f for f in passed if f.card.uuid in kept]
    return passed, unweighed


def _value(f: _Free, attribute: str) -> Any:
    """The card's value of a fully qualified attribute (None: it has none)."""
    domain, _, name = attribute.rpartition("/")
    value = (f.device.get("attributes") or {}).get(domain, {}).get(name)
    return None if value is None else (type(value).__name__, str(value))  # type is value


def _room(ask: Ask, free: list[_Free]) -> str:
    fits = [f for f in free if f.has_room(ask)]
    # The cards one allocation may take together: one node's, and under each
    # matchAttribute one value's; a card without a constrained attribute is never taken.
    matched = [c.attribute for c in ask.constraints if not c.distinct]
    distinct = [c.attribute for c in ask.constraints if c.distinct]
    groups: dict[tuple[Any, ...], list[_Free]] = {}
    for f in fits:
        values = [_value(f, a) for a in (*matched, *distinct)]
        if all(v is not None for v in values):
            groups.setdefault((f.node, *values[: len(matched)]), []).append(f)

    def takes(cards: list[_Free]) -> int:  # how many of them one allocation may take
        return min((len({_value(f, a) for f in cards}) for a in distinct), default=len(cards))

    enough = [g for g in groups.values() if takes(g) >= max(ask.count, 1)]
    if not enough:
        return "no node has room for it now"
    nodes = {g[0].node for g in enough}
    best = max((f for g in enough for f in g), key=lambda f: (f.mib, f.node))
    cards = len({f.card.uuid for g in enough for f in g})
    return (
        f"room on {cards} card(s) of {len(nodes)} node(s) now (most free: {best.mib} MiB on "
        f"{best.node} card {best.card.index})"
    )


def _room_all(ask: Ask, passed: list[_Free]) -> str:
    """allocationMode All: a node whose every card that passes the selectors, and is large
    enough, has room now, under the constraints over all of them."""
    by_node: dict[str, list[_Free]] = {}
    for f in passed:
        if ask.memory_mib is None or f.card.memory_mib >= ask.memory_mib:
            by_node.setdefault(f.node, []).append(f)
    if not by_node:
        return "no card passes its CEL selectors and is large enough"
    blocked = {"out of service": 0, "without room": 0, "against a constraint": 0}
    ready = []
    for node, cards in sorted(by_node.items()):
        if not all(f.usable(ask) for f in cards):
            blocked["out of service"] += 1
        elif not all(f.has_room(ask) for f in cards):
            blocked["without room"] += 1
        elif not _constrained_together(ask, cards):
            blocked["against a constraint"] += 1
        else:
            ready.append(node)
    if ready:
        most = max(ready, key=lambda n: (len(by_node[n]), n))
        return (f"room on {len(ready)} node(s) now, all of their matching cards (most: "
                f"{len(by_node[most])} on {most})")  # fmt: skip
    why = ", ".join(f"{n} with one {reason}" for reason, n in blocked.items() if n)
    return f"no node has every matching card free now ({why})"


def _constrained_together(ask: Ask, cards: list[_Free]) -> bool:
    """Whether ``cards`` all have each constrained attribute, one value of each matched
    one, and distinct values of each distinct one."""
    for c in ask.constraints:
        values = [_value(f, c.attribute) for f in cards]
        if any(v is None for v in values):
            return False
        if len(set(values)) != (len(values) if c.distinct else 1):
            return False
    return True


def _describe(ask: Ask) -> str:
    many = "every card" if ask.count == 0 else f"{ask.count} card(s)"
    memory = "the whole card" if ask.memory_mib is None else f"{ask.memory_mib} MiB"
    return f"{many} of {ask.device_class} with {memory} and {ask.compute} % compute"


def _class_selectors(device_class: str, classes: Mapping[str, Obj] | None) -> tuple[str, ...]:
    return _expressions(((classes or {}).get(device_class) or {}).get("spec") or {})


def _weigh(ask: Ask, free: list[_Free], classes: Mapping[str, Obj] | None) -> str:
    """The request's room, and what of it was not weighed (nothing is said of selectors
    when there was nothing to weigh them on)."""
    if not free:
        return "no card of the claims path on the nodes it may use"
    if not any(f.usable(ask) for f in free):
        return "no card of the claims path is in service"
    every = (*_class_selectors(ask.device_class, classes), *ask.selectors)
    passed, selectors = _selected([Selector(e) for e in every], free)
    if ask.count == 0:
        room = _room_all(ask, passed)
    else:
        passed = [f for f in passed if f.usable(ask)]
        room = _room(ask, passed) if passed else "no card in service passes its CEL selectors"
    left = []
    across = sum(1 for c in ask.constraints if c.across)
    if selectors or across:
        left.append(f"{len(selectors) + across} selector(s) or constraint(s) not weighed"
                    + (" (constraints only within this request)" if across else ""))  # fmt: skip
        left += [f"`{s.expression}`: {s.problem}" for s in selectors if s.problem][:1]
    if classes is None:
        left.append(f"the selectors of DeviceClass {ask.device_class} not read")
    return room + "".join(f"; {part}" for part in left)


def explain(
    pod: Obj,
    claims: Mapping[str, Obj],
    slices: Iterable[Obj],
    gmap: GpuMap,
    classes: Mapping[str, Obj] | None = None,
    offered: set[str] | None = None,
) -> list[str]:
    """Lines saying where each of ``pod``'s claims stands; ``claims`` by name, in the
    pod's namespace; ``classes``: the DeviceClasses by name (None: not read);
    ``offered``: the nodes kube-scheduler's other filters offer the pod (None: all)."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    free = _claims_cards(slices, gmap, offered)
    lines = []
    for name, claim_name in pod_claims(pod):
        if claim_name is None:
            lines.append(f"  claim {name}: not made yet from its template (the resourceclaim "
                         "controller makes it)")  # fmt: skip
            continue
        claim = claims.get(claim_name)
        where = f"{namespace}/{claim_name}"
        if claim is None:
            lines.append(f"  claim {name} ({where}): no such ResourceClaim")
            continue
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            results = (allocation.get("devices") or {}).get("results") or []
            got = ", ".join(sorted({f"{r.get('pool')} {r.get('device')}" for r in results}))
            lines.append(f"  claim {name} ({where}): allocated ({got})")
            continue
        try:
            asks = claim_asks(claim)
        except SpecError as exc:
            lines.append(f"  claim {name} ({where}): {exc}")
            continue
        if not asks:
            lines.append(f"  claim {name} ({where}): not allocated; it asks no class of "
                         f"{DRIVER}")  # fmt: skip
            continue
        lines.append(f"  claim {name} ({where}): not allocated")
        for ask in asks:
            lines.append(
                f"    request {ask.request}: {_describe(ask)}: {_weigh(ask, free, classes)}"
            )
    return lines
