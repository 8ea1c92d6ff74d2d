"""Removing what containers that are gone left on the node: allocation folders, and
library versions no allocation refers to."""

from __future__ import annotations

from tessera.node.allocation.ledger import Ledger
from tessera.node.formats.layout import Layout
from tessera.node.pods import PodInfo
from tessera.node.ports import PodResources, PodSource

__all__ = ["cleanup"]


def cleanup(
    node: str,
    ledger: Ledger,
    layout: Layout,
    pods: PodSource,
    podres: PodResources | None,
    lib_version: str,
    now: float,
    grace_s: float,
    keep_libs: frozenset[str] = frozenset(),
) -> list[str]:
    """Remove the folders of containers that are gone; return their allocation IDs.

    Gone: the pod is no longer bound to this node (or is terminal), kubelet's
    pod-resources no longer lists the slots, and the folder is older than ``grace_s``
    (an allocation whose pod the watch has not shown yet is not gone). Library versions
    in ``keep_libs`` (prepared claims use them) stay.
    """

    def live_uids(items: list[PodInfo]) -> set[str]:
        return {p.uid for p in items if p.node == node and not p.terminal}

    # The watch cache first; a fresh list (one per node, not every 30 s) only to confirm
    # that something looks gone.
    live = live_uids(pods.pods())
    old = [r for r in ledger.records() if now - r.created >= grace_s]
    if any(r.pod_uid not in live for r in old):
        live = live_uids(pods.refresh())
    view = None
    if any(r.pod_uid not in live for r in old) and podres is not None:
        view = podres.view()
    removed: list[str] = []
    for rec in old:
        if rec.pod_uid in live:
            continue
        if view is not None and view.holds(rec.slots):
            continue
        layout.remove_alloc(rec.alloc_id)
        ledger.forget(rec)
        removed.append(rec.alloc_id)
    ledger.expire_reservations(now, grace_s)
    # Folders first, then the ledger: a folder listed was made after its ID was claimed,
    # so an Allocate still writing it is known here whatever the grace.
    folders = layout.alloc_ids()
    known = ledger.alloc_ids()
    for alloc_id in folders:
        if alloc_id in known or layout.has_record(alloc_id):
            continue  # a record the agent could not read: logged at start, kept
        try:
            age = now - layout.alloc_dir(alloc_id).stat().st_mtime
        except OSError:
            continue
        if age >= grace_s:  # a folder without a record: Allocate died half-way
            layout.remove_alloc(alloc_id)
            removed.append(alloc_id)
    used = ledger.lib_versions() | {lib_version} | keep_libs
    for version in layout.lib_versions():
        if version not in used:
            layout.remove_lib(version)
    return removed
