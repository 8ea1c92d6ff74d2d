"""Keeps the node's ResourceSlice equal to the cards it offers to claims.

Written only on change (a new pool generation each time, as DRA asks of a driver that
changes its pool), and read once at start so an agent restart with the same cards writes
nothing. A watch on the slice (``watch``) takes in what others write: a slice edited or
deleted by hand differs from the cards, so the next publish (every health tick) writes
the cards' slice back.

"Differs" is meant as the API server means it: it stores quantities in canonical form
(``40960Mi`` comes back as ``40Gi``) and stamps each device taint's ``timeAdded``, so the
comparison reads quantities as numbers and leaves that time out, and a taint that stays
keeps the time it first appeared. Comparing the text once made every agent write its
slice, with a new pool generation, on every health tick. Whatever else a later server
changes in what it stores, a slice still at the version of the agent's last write, of
the same devices, counts as written (and the change is logged once), so no server
default can start such a loop again.

A card that turns unhealthy gets a NoSchedule device taint; an API server that does not
serve device taints drops the field silently, so the publisher checks what it got back
and, if the taints are gone, leaves the sick cards out of the slice instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from tessera.claims.devices import resource_slice, slice_name
from tessera.errors import SpecError
from tessera.kube.errors import NotFound
from tessera.kube.kinds import NODES, RESOURCE_SLICES
from tessera.kube.port import KubeApi, Obj, resource_version
from tessera.kube.reflector import Reflector, follow_one
from tessera.model.quantity import parse_quantity
from tessera.model.types import Card

__all__ = ["SlicePublisher"]

log = logging.getLogger(__name__)


def _devices(obj: dict[str, Any] | None) -> list[Any]:
    return list(((obj or {}).get("spec") or {}).get("devices") or [])


def _canonical(devices: list[Any]) -> list[Any]:
    """``devices`` as the API server means them: capacity quantities as exact numbers
    (it stores ``40960Mi`` as ``40Gi``) and taints without the ``timeAdded`` it stamps."""

    def numbers(value: Any, field: str) -> Any:
        if isinstance(value, dict):
            return {k: numbers(v, f"{field}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [numbers(v, field) for v in value]
        try:
            return parse_quantity(value, field).value
        except SpecError:
            return value  # not a quantity: compared as it is

    out = []
    for dev in devices:
        dev = dict(dev)
        if "capacity" in dev:
            dev["capacity"] = numbers(dev["capacity"], "capacity")
        if "taints" in dev:
            dev["taints"] = [
                {k: v for k, v in t.items() if k != "timeAdded"} for t in dev["taints"]
            ]
        out.append(dev)
    return out


def _same_devices(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return _canonical(_devices(a)) == _canonical(_devices(b))


def _keep_taint_times(want: list[Any], current: list[Any]) -> None:
    """Give each taint in ``want`` the ``timeAdded`` the API server stamped on the same
    taint in ``current`` (same device, key and effect).

    The server sets it when a taint arrives without one; a taint that stays keeps the
    time it first appeared, and the slice as written compares equal to the cards again.
    """
    stamped: dict[tuple[str, str, str], Any] = {}
    for dev in current:
        for taint in dev.get("taints") or []:
            if "timeAdded" in taint:
                stamped[(dev.get("name"), taint.get("key"), taint.get("effect"))] = taint[
                    "timeAdded"
                ]
    for dev in want:
        for taint in dev.get("taints") or []:
            when = stamped.get((dev.get("name"), taint.get("key"), taint.get("effect")))
            if when is not None:
                taint["timeAdded"] = when


def _older(version: str, than: Obj | None) -> bool:
    """Whether ``version`` is older than ``than``'s (resourceVersions are opaque;
    compared only when both are the integers every API server today writes)."""
    if than is None:
        return False
    b = resource_version(than)
    return version.isdigit() and b.isdigit() and int(version) < int(b)


class SlicePublisher:
    def __init__(self, api: KubeApi, node: str, driver_version: str) -> None:
        self.api = api
        self.node = node
        self.driver_version = driver_version
        self.name = slice_name(node)
        self.writes = 0
        self.taints_served: bool | None = None  # None until a tainted device was written
        self._mu = threading.Lock()
        self._current: dict[str, Any] | None = None
        self._loaded = False
        self._node_uid: str | None = None  # the owner reference's; read once
        # Our last write: the version the server gave it, and the devices we sent. A slice
        # still at that version is ours, whatever else the server changed in it.
        self._sent: tuple[str, list[Any]] | None = None
        self._warned_changed = False

    def _desired(
        self, cards: list[Card], generation: int, current: dict[str, Any] | None
    ) -> dict[str, Any]:
        if self.taints_served is False:
            cards = [c for c in cards if c.in_service]
        uid = self._node_uid or ""
        want = resource_slice(self.node, cards, generation, self.driver_version, uid)
        _keep_taint_times(_devices(want), _devices(current))
        return want

    def publish(self, cards: Iterable[Card]) -> bool:
        """Write the slice if it differs from ``cards``; True when written."""
        cards = list(cards)
        with self._mu:
            if not self._loaded:
                try:
                    self._current = self.api.get(RESOURCE_SLICES, self.name)
                except NotFound:
                    self._current = None
                self._loaded = True
            current = self._current
            desired = self._desired(cards, 0, current)
            if current is not None and (
                _same_devices(current, desired) or self._ours(current, desired)
            ):
                return False  # every health tick comes here: no API call
            if self._node_uid is None:
                self._node_uid = str(self.api.get(NODES, self.node)["metadata"]["uid"])
            pool = ((current or {}).get("spec") or {}).get("pool") or {}
            generation = int(pool.get("generation", 0))
            want = self._desired(cards, generation + 1, current)
            written = self._write(want, current)
            if self.taints_served is None and any("taints" in d for d in _devices(want)):
                self.taints_served = any("taints" in d for d in _devices(written))
                if not self.taints_served:
                    log.warning("the API server drops device taints: sick cards leave the slice")
                    want = self._desired(cards, generation + 2, written)
                    written = self._write(want, written)
            self._current = written
            self._sent = (resource_version(written), _canonical(_devices(want)))
            if not _same_devices(written, want) and not self._warned_changed:
                # Taken as our own from now on, so that it is not written again each tick.
                what = "beyond what the agent compares; the slice as stored counts as written"
                log.warning("the API server changes ResourceSlice %s %s", self.name, what)
                self._warned_changed = True
        log.info("ResourceSlice %s written (%d devices)", self.name, len(_devices(written)))
        return True

    def _ours(self, current: dict[str, Any], desired: dict[str, Any]) -> bool:
        """Whether ``current`` is our last write, of these devices."""
        return (
            self._sent is not None
            and resource_version(current) == self._sent[0]
            and _canonical(_devices(desired)) == self._sent[1]
        )

    def _write(self, want: dict[str, Any], current: dict[str, Any] | None) -> dict[str, Any]:
        self.writes += 1
        if current is None:
            return self.api.create(RESOURCE_SLICES, want)
        want["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.api.replace(RESOURCE_SLICES, want)

    # --- the watch on our own slice ------------------------------------------------------

    def watch(self) -> Reflector:
        """Start following the slice; the caller stops the returned reflector."""
        return follow_one(self.api, RESOURCE_SLICES, self.name, self._seen)

    def _seen(self, obj: Obj | None, version: str) -> None:
        with self._mu:
            if not self._loaded:
                return  # publish reads the slice itself first
            if _older(version, self._current):
                # From before our last write: the event of a write since replaced, or a
                # list that found no slice because it ran before we created it.
                return
            self._current = obj

    def forget(self) -> None:
        """Read the slice again before the next publish (after a failed or raced write)."""
        with self._mu:
            self._loaded = False
