"""Prepare and unprepare claims: the node side of the claims path.

kubelet calls the DRA plugin with a claim's namespace, name and UID before the first
container that references it starts, and again after a kubelet restart; it unprepares
once no pod on the node uses the claim. A node whose kubelet lost its state never hears
that unprepare, so the agent's cleanup loop also sweeps: a prepared claim the API server
no longer has, has made again under another UID, or has allocated off this node is
unprepared here (``ClaimPreparer.sweep``). Prepare reads the claim (its allocation is in
``status``), turns the results for this node into an assignment
(``tessera.claims.allocation``) and writes, under the state folder, the same limits file
and folders as the device plugin path, then one CDI spec naming them. Both writes are
atomic and both are the same bytes for the same claim, so a repeated prepare is harmless.

The node checks the scheduler's arithmetic: a claim that would take a card past its
memory, compute or slots together with the claims already prepared on it is refused
(a ResourceSlice edited by hand can make kube-scheduler believe in capacity the card
does not have). The prepared claims are read back from their folders at start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tessera.claims.allocation import ClaimGrant, GrantedDevice, allocated_pools, claim_grant
from tessera.claims.cdi import cdi_device_id, cdi_spec, spec_file_name
from tessera.claims.devices import device_name
from tessera.errors import FormatError, SpecError
from tessera.kube.errors import NotFound
from tessera.model.types import Card, CardSlice
from tessera.node.formats.layout import Layout, atomic_write
from tessera.node.formats.limits import encode_limits, limits_for
from tessera.node.isolation import Isolation, Visibility, container_edits

__all__ = ["ClaimPreparer", "ClaimSource", "PrepareError", "PreparedDevice"]

log = logging.getLogger(__name__)
CLAIM_META_VERSION = 1


def _meta_slices(text: str | None) -> tuple[CardSlice, ...] | None:
    if text is None:
        return None
    try:
        meta = json.loads(text)
        return tuple(
            CardSlice(str(s["uuid"]), int(s["memoryMiB"]), int(s["coresPercent"]))
            for s in meta["slices"]
        )
    except (ValueError, KeyError, TypeError):
        return None  # a folder half-written when the agent died: prepare writes it again


def _meta_claim(text: str | None) -> tuple[str, str] | None:
    """The namespace and name a claim folder's meta.json records."""
    if text is None:
        return None
    try:
        claim = json.loads(text)["claim"]
        return str(claim["namespace"]), str(claim["name"])
    except (ValueError, KeyError, TypeError):
        return None


class ClaimSource(Protocol):
    def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim as the API server has it now: raises NotFound when it has
        none, anything else when it cannot say."""
        ...


class PrepareError(Exception):
    """A claim this node cannot prepare; the message goes back to kubelet and the pod."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    granted: GrantedDevice
    cdi_ids: tuple[str, ...]


class ClaimPreparer:
    def __init__(
        self,
        node: str,
        cards: tuple[Card, ...],
        layout: Layout,
        lib_version: str,
        claims: ClaimSource,
        cdi_dir: Path,
        isolation: Isolation = Isolation.HOOK,
        visibility: Visibility = Visibility.ENV,
        context_mib: int = 0,
    ) -> None:
        self.node = node
        self.cards = {device_name(c): c for c in cards}
        self.by_uuid = {c.uuid: c for c in cards}
        self.layout = layout
        self.lib_version = lib_version
        self.claims = claims
        self.cdi_dir = cdi_dir
        self.isolation = isolation
        self.visibility = visibility
        self.context_mib = context_mib
        self._mu = threading.Lock()
        self._held: dict[str, tuple[CardSlice, ...]] = {}  # claim UID -> its slices
        self._names: dict[str, tuple[str, str]] = {}  # claim UID -> namespace, name
        for held_uid in layout.claim_uids():
            meta = layout.read_claim_meta(held_uid)
            slices, ref = _meta_slices(meta), _meta_claim(meta)
            if slices is not None and ref is not None:
                self._held[held_uid] = slices
                self._names[held_uid] = ref

    def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        try:
            claim = self.claims.claim(namespace, name)
        except Exception as exc:
            raise PrepareError(f"reading ResourceClaim {namespace}/{name}: {exc}") from exc
        got = str((claim.get("metadata") or {}).get("uid", ""))
        if got != uid:
            raise PrepareError(
                f"ResourceClaim {namespace}/{name} has UID {got}, kubelet asked for {uid}: "
                "the claim was deleted and made again"
            )
        try:
            grant = claim_grant(claim, pool=self.node, cards=self.cards)
            limits = limits_for(grant.assignment, context_mib=self.context_mib)
        except (SpecError, FormatError) as exc:
            raise PrepareError(f"ResourceClaim {namespace}/{name}: {exc}") from exc
        with self._mu:
            self._check_room(grant)
            nvidia_ids = self._write(grant, encode_limits(limits))
            self._held[uid] = grant.assignment.slices
            self._names[uid] = (grant.namespace, grant.name)
        ids = (cdi_device_id(uid), *nvidia_ids)
        log.info(
            "prepared claim %s/%s: %s",
            namespace,
            name,
            ", ".join(
                f"{s.uuid} {s.memory_mib} MiB {s.cores_percent} %" for s in grant.assignment.slices
            ),
        )
        return [PreparedDevice(d, ids) for d in grant.devices]

    def _check_room(self, grant: ClaimGrant) -> None:
        for new in grant.assignment.slices:
            card = self.by_uuid[new.uuid]
            others = [
                (uid, s)
                for uid, slices in self._held.items()
                if uid != grant.uid
                for s in slices
                if s.uuid == new.uuid
            ]
            mib = new.memory_mib + sum(s.memory_mib for _, s in others)
            cores = new.cores_percent + sum(s.cores_percent for _, s in others)
            if mib > card.memory_mib or cores > 100 or len(others) + 1 > card.slots:
                held = ", ".join(sorted(uid for uid, _ in others))
                raise PrepareError(
                    f"ResourceClaim {grant.namespace}/{grant.name} would take card {card.uuid} "
                    f"to {mib} of {card.memory_mib} MiB, {cores} of 100 % compute and "
                    f"{len(others) + 1} of {card.slots} slots with the claims already on it "
                    f"({held}): refused; is the node's ResourceSlice edited by hand?"
                )

    def _write(self, grant: ClaimGrant, limits_text: str) -> tuple[str, ...]:
        """Write the claim's folder and CDI spec; NVIDIA's CDI IDs to return beside ours."""
        meta = json.dumps(
            {
                "v": CLAIM_META_VERSION,
                "claim": {"uid": grant.uid, "namespace": grant.namespace, "name": grant.name},
                "cards": [s.uuid for s in grant.assignment.slices],
                "slices": [
                    {"uuid": s.uuid, "memoryMiB": s.memory_mib, "coresPercent": s.cores_percent}
                    for s in grant.assignment.slices
                ],
                "lib": self.lib_version,
            },
            sort_keys=True,
        )
        self.layout.write_claim(grant.uid, limits_text, meta)
        edits = container_edits(
            grant.assignment,
            self.layout.claim_dir(grant.uid),
            self.layout.lib_dir(self.lib_version),
            self.isolation,
            self.visibility,
            mps_pipe=self.layout.mps_pipe,
            alloc_id=f"claim-{grant.uid}",
        )
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.cdi_dir / spec_file_name(grant.uid), cdi_spec(grant.uid, edits))
        return edits.cdi_devices

    def unprepare(self, uid: str) -> None:
        """Remove the claim's CDI spec and folder (nothing to do when it has none)."""
        with self._mu:
            self._remove(uid)
        log.info("unprepared claim %s", uid)

    def _remove(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cdi_dir / spec_file_name(uid))
        self.layout.remove_claim(uid)
        self._held.pop(uid, None)
        self._names.pop(uid, None)

    def _remove_if_unfinished(self, uid: str) -> bool:
        """Remove a folder a prepare left half-written: no readable meta.json, no CDI
        spec. Decided under the lock prepare writes under, so a prepare in flight (its
        folder made, its meta.json not yet) has finished by then and is kept."""
        with self._mu:
            if _meta_claim(self.layout.read_claim_meta(uid)) is not None:
                return False
            if (self.cdi_dir / spec_file_name(uid)).exists():
                return False
            self._remove(uid)
        log.warning("claim %s: a prepare that never finished (no readable meta.json, "
                    "no CDI spec); removed", uid)  # fmt: skip
        return True

    def prepared_claims(self) -> list[tuple[str, str, str, tuple[str, ...]]]:
        """(UID, namespace, name, the UUID of each slice's card) of every prepared claim:
        the exporter's claims, whose slots count even when their limits file does not
        read."""
        with self._mu:
            return sorted(
                (uid, ns, name, tuple(s.uuid for s in self._held.get(uid, ())))
                for uid, (ns, name) in self._names.items()
            )

    def held_by_claim(self) -> dict[tuple[str, str], tuple[CardSlice, ...]]:
        """The slices of every prepared claim, by namespace and name (the backstop's caps)."""
        with self._mu:
            return {self._names[uid]: slices for uid, slices in self._held.items()}

    def sweep(
        self,
        now: float,
        grace_s: float,
        in_use: Callable[[], Collection[tuple[str, str]]] = lambda: (),
    ) -> list[str]:
        """Unprepare the claims kubelet will not, and return their UIDs: the API server no
        longer has the claim, has it under another UID (deleted and made again), or has
        it allocated off this node. Until then their slices count against the cards, and
        the node would refuse claims the scheduler rightly placed.

        Stay without a question to the API server: claims a live pod on this node uses
        (``in_use`` names them by namespace and name; asked again after the API server
        says a claim is gone, so a pod seen meanwhile counts), and folders younger than
        ``grace_s``. A claim the API server cannot answer for stays too. A folder with no
        readable meta.json goes only if it has no CDI spec either: a prepare that never
        finished (the spec is written last), which no container can be using."""
        removed: list[str] = []
        users = in_use()
        for uid in self.layout.claim_uids():
            ref = _meta_claim(self.layout.read_claim_meta(uid))
            try:
                age = now - self.layout.claim_dir(uid).stat().st_mtime
            except OSError:
                continue  # unprepared meanwhile
            if age < grace_s or ref in users:
                continue
            if ref is None:
                if self._remove_if_unfinished(uid):
                    removed.append(uid)
                continue
            namespace, name = ref
            try:
                claim = self.claims.claim(namespace, name)
            except NotFound:
                why = "the API server has no such claim"
            except Exception as exc:  # unknown: keep the folder, try again next sweep
                log.warning("claim %s/%s (%s): cannot tell if it is gone: %s",
                            namespace, name, uid, exc)  # fmt: skip
                continue
            else:
                got = str((claim.get("metadata") or {}).get("uid", ""))
                if got != uid:
                    why = f"the claim was made again (UID {got})"
                elif self.node not in allocated_pools(claim):
                    why = "the claim is no longer allocated on this node"
                else:
                    continue
            users = in_use()
            if ref in users:
                continue
            log.warning("claim %s/%s (%s) left prepared with no unprepare from kubelet: %s; "
                        "unpreparing it", namespace, name, uid, why)  # fmt: skip
            self.unprepare(uid)
            removed.append(uid)
        return removed

    def prepared(self) -> list[str]:
        """UIDs of the claims with a folder on this node."""
        return self.layout.claim_uids()

    def lib_versions(self) -> set[str]:
        """Library versions prepared claims use (the agent must not remove them)."""
        out = set()
        for uid in self.prepared():
            text = self.layout.read_claim_meta(uid)
            if text is None:
                continue
            try:
                out.add(str(json.loads(text)["lib"]))
            except (ValueError, KeyError, TypeError):
                continue
        return out
