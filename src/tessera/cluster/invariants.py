"""The invariants a ClusterState must keep, checked from scratch.

The arrays are recomputed from the inventories and the bookings and compared with what
the state holds, so a drift in the incremental bookkeeping shows up as well as an
over-committed card.
"""

from __future__ import annotations

from collections.abc import Mapping

from tessera.cluster.booking import Booking
from tessera.cluster.snapshot import Snapshot

__all__ = ["check"]


def check(snap: Snapshot, bookings: Mapping[str, Booking]) -> list[str]:
    """Every broken invariant as a sentence; empty when sound."""
    problems: list[str] = []
    t = snap.tables
    # uuid -> (row, col)
    where: dict[str, tuple[int, int]] = {}
    slots: dict[tuple[int, int], int] = {}
    for row, inv in enumerate(snap.inventories):
        if inv is None:
            continue
        for col, card in enumerate(inv.cards):
            where[card.uuid] = (row, col)
            slots[row, col] = card.slots
    used_slots: dict[tuple[int, int], int] = {}
    used_mem: dict[tuple[int, int], int] = {}
    used_cores: dict[tuple[int, int], int] = {}
    tenants: dict[tuple[int, int], list[str]] = {}
    whole: dict[tuple[int, int], list[str]] = {}
    cpu: dict[int, int] = {}
    mem: dict[int, int] = {}
    for key, b in sorted(bookings.items()):
        node = b.assignment.node
        if node not in snap.rows:
            problems.append(f"pod {key} is booked on unknown node {node}")
            continue
        row = snap.rows[node]
        cpu[row] = cpu.get(row, 0) + b.pod.cpu_milli
        mem[row] = mem.get(row, 0) + b.pod.memory_mib
        requests = {c.name: c.gpu for c in b.pod.gpu_containers()}
        inv = snap.inventories[row]
        assert inv is not None
        for ca in b.assignment.containers:
            gpu = requests.get(ca.name)
            for s in ca.slices:
                rc = where.get(s.uuid)
                if rc is None or rc[0] != row:
                    problems.append(f"pod {key} holds card {s.uuid}, which is not on {node}")
                    continue
                card = inv.cards[rc[1]]
                if gpu is not None and not gpu.allows(card):
                    problems.append(
                        f"pod {key} container {ca.name} holds card {s.uuid} of model "
                        f"{card.model}, which its request does not allow"
                    )
        for uuid, (m, c, excl) in b.footprint.items():
            rc = where.get(uuid)
            if rc is None or rc[0] != row:
                continue
            if excl:
                m, c = int(t.card_mem[rc]), 100
                whole.setdefault(rc, []).append(key)
            used_mem[rc] = used_mem.get(rc, 0) + m
            used_cores[rc] = used_cores.get(rc, 0) + c
            used_slots[rc] = used_slots.get(rc, 0) + b.slots.get(uuid, 0)
            tenants.setdefault(rc, []).append(key)
    for uuid, rc in sorted(where.items()):
        node = snap.names[rc[0]]
        label = f"card {uuid} on {node}"
        um, uc = used_mem.get(rc, 0), used_cores.get(rc, 0)
        if um > t.card_mem[rc]:
            problems.append(f"{label}: {um} MiB booked, only {t.card_mem[rc]} MiB exist")
        if uc > 100:
            problems.append(f"{label}: {uc}% cores booked, over 100%")
        holders = tenants.get(rc, [])
        if rc in whole and len(holders) > 1:
            problems.append(f"{label}: held whole by {whole[rc][0]} but shared with {holders}")
        if t.free_mem[rc] != t.card_mem[rc] - um or t.free_cores[rc] != 100 - uc:
            problems.append(
                f"{label}: state says {t.free_mem[rc]} MiB / {t.free_cores[rc]}% free, "
                f"bookings say {t.card_mem[rc] - um} MiB / {100 - uc}%"
            )
        us, ns = used_slots.get(rc, 0), slots[rc]
        if us > ns:
            problems.append(f"{label}: {us} containers booked, only {ns} slots exist")
        if t.free_slots[rc] != ns - us:
            problems.append(
                f"{label}: state says {t.free_slots[rc]} slots free, bookings say {ns - us}"
            )
        if t.tenants[rc] != len(holders) or bool(t.exclusive[rc]) != (rc in whole):
            problems.append(f"{label}: tenant count or exclusivity flag out of step")
    for name, row in sorted(snap.rows.items()):
        inv = snap.inventories[row]
        assert inv is not None
        uc, um = cpu.get(row, 0), mem.get(row, 0)
        if uc > inv.cpu_milli:
            problems.append(f"node {name}: {uc} millicores booked, only {inv.cpu_milli} exist")
        if um > inv.memory_mib:
            problems.append(f"node {name}: {um} MiB memory booked, only {inv.memory_mib} exist")
        if t.cpu_free[row] != inv.cpu_milli - uc or t.mem_free[row] != inv.memory_mib - um:
            problems.append(f"node {name}: free cpu/memory out of step with the bookings")
    return problems
